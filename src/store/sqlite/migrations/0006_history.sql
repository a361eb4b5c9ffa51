-- A conversation's earlier turns, for the agent's history.
CREATE INDEX batches_conversation ON batches (conversation_id, id);
