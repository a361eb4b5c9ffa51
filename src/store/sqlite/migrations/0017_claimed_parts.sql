-- A claimed reply part (store/rules/part.rs) waits for its pacing slot and has not left: it
-- holds its recipient's queue like the other unsettled states, and its claim lapses by time.
DROP INDEX outbox_active;
CREATE INDEX outbox_active ON outbox (conversation_id, id)
    WHERE state IN ('queued', 'claimed', 'sending', 'unknown', 'window_closed');
CREATE INDEX outbox_claimed ON outbox (send_until) WHERE state = 'claimed';
