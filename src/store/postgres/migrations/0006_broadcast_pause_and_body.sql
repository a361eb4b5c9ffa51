-- Who paused a broadcast (store/rules/broadcast.rs, PausedBy): Meta's approval of a template
-- resumes only what its pause paused. And the template's body as Meta approved it, with its
-- {{1}}... placeholders: what each recipient read, once filled in.
ALTER TABLE broadcasts ADD COLUMN paused_by TEXT;
ALTER TABLE broadcasts ADD COLUMN body TEXT;
-- Hours of the day it sends nothing (HH:MM-HH:MM), in its IANA time zone.
ALTER TABLE broadcasts ADD COLUMN quiet_hours TEXT;
ALTER TABLE broadcasts ADD COLUMN tz TEXT;
-- When the customer first wrote after their broadcast: its report's replies.
ALTER TABLE broadcast_recipients ADD COLUMN replied_at BIGINT;
-- A claim asks who was sent a broadcast lately (the cooldown, per customer; Meta's messaging
-- limit, unique customers in 24 hours) and which sends are under way.
CREATE INDEX broadcast_recipients_sent ON broadcast_recipients (sent_at, recipient)
    WHERE sent_at IS NOT NULL;
CREATE INDEX broadcast_recipients_customer ON broadcast_recipients (recipient, sent_at);
CREATE INDEX broadcast_recipients_by_state ON broadcast_recipients (state, lease_until);
