-- Who paused a broadcast (store/rules/broadcast.rs, PausedBy): Meta's approval of a template
-- resumes only what its pause paused. And the template's body as Meta approved it, with its
-- {{1}}... placeholders: what each recipient read, once filled in.
ALTER TABLE broadcasts ADD COLUMN paused_by TEXT;
ALTER TABLE broadcasts ADD COLUMN body TEXT;
