-- Conversations a claim may open a batch for: due, with no batch open. The claim, the
-- scheduler's next wake-up (`next_due`, asked at every poll of every node) and the due gauge
-- all ask for exactly these, by due time. The index of every due conversation they used before
-- also held those whose batch is running (messages that came during a turn), which each of
-- them had to read past; no query asks for those alone, so this index replaces it.
CREATE INDEX IF NOT EXISTS conversations_claimable ON conversations (due_at)
    WHERE due_at IS NOT NULL AND open_batch_id IS NULL;
DROP INDEX IF EXISTS conversations_due;
