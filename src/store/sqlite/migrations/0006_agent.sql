-- A conversation's earlier turns, for the agent's history.
CREATE INDEX batches_conversation ON batches (conversation_id, id);

-- What a running turn is doing, for the web chat to show.
ALTER TABLE batches ADD COLUMN stage TEXT;
-- What the agent's model calls cost the turn (NULL: no model was called).
ALTER TABLE batches ADD COLUMN prompt_tokens INTEGER;
ALTER TABLE batches ADD COLUMN completion_tokens INTEGER;
ALTER TABLE batches ADD COLUMN cost REAL;
