-- How a person settled a review item: replied, requeued (back to the agent, or a send tried
-- again) or closed.
ALTER TABLE review ADD COLUMN resolved_at INTEGER;
ALTER TABLE review ADD COLUMN resolution TEXT;
ALTER TABLE review ADD COLUMN resolution_note TEXT;
CREATE INDEX conversations_customer ON conversations (customer);
-- A person sent the conversation's messages back to the agent: its next batch is answered
-- however old they are.
ALTER TABLE conversations ADD COLUMN requeued INTEGER NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN requeued INTEGER NOT NULL DEFAULT 0;
