-- Who paused a broadcast (store/rules/broadcast.rs, PausedBy): Meta's approval of a template
-- resumes only what its pause paused.
ALTER TABLE broadcasts ADD COLUMN paused_by TEXT;
