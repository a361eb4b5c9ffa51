-- A help desk's thread for a conversation handed to it (Chatwoot's conversation id), and
-- whether it is open: an open thread holds the conversation for the desk (store::desk).
ALTER TABLE conversations ADD COLUMN desk_thread TEXT;
ALTER TABLE conversations ADD COLUMN desk_open BOOLEAN NOT NULL DEFAULT FALSE;
CREATE UNIQUE INDEX conversations_desk_thread ON conversations (desk_thread);

-- The last of a review item's messages mirrored into the desk's thread.
ALTER TABLE review ADD COLUMN desk_seq BIGINT;

-- A desk's replies already sent, by the desk's id of the message: a desk delivers a webhook
-- again when unsure, and a reply goes once. Kept as long as erased keys (retention.dedupe).
CREATE TABLE desk_replies (
    key TEXT    NOT NULL PRIMARY KEY,
    at  BIGINT NOT NULL
);
CREATE INDEX desk_replies_at ON desk_replies (at);
