-- A person's reply is marked as theirs, so that a web-chat session's stream can show what a
-- person wrote (and that a person has joined) apart from the assistant's answers.
ALTER TABLE outbox ADD COLUMN by_person INTEGER NOT NULL DEFAULT 0;
CREATE INDEX outbox_person ON outbox (conversation_id, id) WHERE by_person = 1;
