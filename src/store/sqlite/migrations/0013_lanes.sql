-- The model's lane: set while a conversation has a pending message the router would not answer
-- alone (ingest knows), cleared when its batch takes them. Due conversations without it are
-- claimed first (`claim_routine`), so a turn that needs no model never waits behind model turns.
ALTER TABLE conversations ADD COLUMN model_pending INTEGER NOT NULL DEFAULT 0;
CREATE INDEX conversations_routine ON conversations (due_at)
    WHERE due_at IS NOT NULL AND open_batch_id IS NULL AND model_pending = 0;
-- What was already waiting before the upgrade is the model's: nothing says the router would
-- answer it alone.
UPDATE conversations SET model_pending = 1 WHERE due_at IS NOT NULL;
