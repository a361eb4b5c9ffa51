-- The sender: every reply part is sent at most once, in order per recipient, paced, and
-- reconciled with Meta's status webhooks.

-- state: sandbox | served (web chat) | queued | sending (a sender holds it) | unknown (the
-- request may have left; waiting for a status webhook) | window_closed (must go as a template)
-- | accepted | failed | review. `delivery` is Meta's latest status, never downgraded.
ALTER TABLE outbox ADD COLUMN conversation_id INTEGER REFERENCES conversations (id);
ALTER TABLE outbox ADD COLUMN options TEXT;
ALTER TABLE outbox ADD COLUMN reply_to TEXT;
ALTER TABLE outbox ADD COLUMN kind TEXT NOT NULL DEFAULT 'text';
ALTER TABLE outbox ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
-- Failed tries (throttling answers are not failures: Meta asked to wait, nothing was wrong).
ALTER TABLE outbox ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN next_attempt_at INTEGER;
-- Set once Meta said the window had closed for it: from then on only a template may go.
ALTER TABLE outbox ADD COLUMN window_closed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN send_until INTEGER;
ALTER TABLE outbox ADD COLUMN wamid TEXT;
ALTER TABLE outbox ADD COLUMN delivery TEXT;
ALTER TABLE outbox ADD COLUMN error_code INTEGER;
ALTER TABLE outbox ADD COLUMN error TEXT;
ALTER TABLE outbox ADD COLUMN sent_at INTEGER;
ALTER TABLE outbox ADD COLUMN updated_at INTEGER;

UPDATE outbox SET conversation_id = (
    SELECT c.id FROM conversations c
    WHERE c.channel = outbox.channel AND c.business = outbox.business AND c.customer = outbox.customer);
UPDATE outbox SET state = 'served' WHERE channel = 'webchat';

CREATE INDEX outbox_active ON outbox (conversation_id, id)
    WHERE state IN ('queued', 'sending', 'unknown', 'window_closed');
CREATE INDEX outbox_due ON outbox (id) WHERE state IN ('queued', 'window_closed');
CREATE INDEX outbox_sending ON outbox (send_until) WHERE state = 'sending';
CREATE INDEX outbox_unknown ON outbox (send_until) WHERE state = 'unknown';
CREATE UNIQUE INDEX outbox_wamid ON outbox (wamid) WHERE wamid IS NOT NULL;

-- Pacing per recipient, and the customer service window.
ALTER TABLE conversations ADD COLUMN send_after INTEGER;
ALTER TABLE conversations ADD COLUMN last_inbound_at INTEGER;
UPDATE conversations SET last_inbound_at = (
    SELECT max(min(coalesce(i.provider_ts * 1000, i.received_at), i.received_at))
    FROM inbox i WHERE i.conversation_id = conversations.id AND i.kind = 'message');

-- Review items may now also name one reply part (a send that failed, or whose outcome is
-- unknown), so a batch can have several: the table is rebuilt without the unique batch.
CREATE TABLE review_v2 (
    id         INTEGER PRIMARY KEY,
    batch_id   INTEGER NOT NULL REFERENCES batches (id),
    outbox_id  INTEGER REFERENCES outbox (id),
    reason     TEXT    NOT NULL,
    error      TEXT,
    state      TEXT    NOT NULL,
    created_at INTEGER NOT NULL
);
INSERT INTO review_v2 (id, batch_id, reason, error, state, created_at)
    SELECT id, batch_id, reason, error, state, created_at FROM review;
DROP TABLE review;
ALTER TABLE review_v2 RENAME TO review;
CREATE UNIQUE INDEX review_batch ON review (batch_id) WHERE outbox_id IS NULL;
CREATE UNIQUE INDEX review_outbox ON review (outbox_id) WHERE outbox_id IS NOT NULL;
CREATE INDEX review_open ON review (id) WHERE state = 'open';

-- Replies queued before Sabi could send were never sent, and may be days old by now: a person
-- decides about each, rather than all of them going out at once, out of context.
INSERT INTO review (batch_id, outbox_id, reason, error, state, created_at)
    SELECT batch_id, id, 'send_failed', 'queued before this version could send; not sent automatically',
           'open', created_at
    FROM outbox WHERE state = 'queued';
UPDATE outbox SET state = 'review' WHERE state = 'queued';
