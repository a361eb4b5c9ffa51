-- Retention (store/rules/retention.rs): the sweeper finds what is past its horizon by age
-- (ended turns by batches_finished), and a turn's review items by the turn. Items that expire
-- by their own age are indexed apart (an item never leaves these states), so finding them
-- never walks the messages in turns.
CREATE INDEX inbox_turnless ON inbox (received_at) WHERE state IN ('skipped', 'withdrawn');
CREATE INDEX inbox_recorded ON inbox (received_at) WHERE state = 'recorded';
CREATE INDEX review_of_batch ON review (batch_id);
CREATE INDEX quarantine_received ON quarantine (received_at);
CREATE INDEX erased_keys_at ON erased_keys (erased_at);
-- Which node does a job that one node at a time does (the sweeper), and until when.
CREATE TABLE leases (
    name   TEXT   PRIMARY KEY,
    holder TEXT   NOT NULL,
    until  BIGINT NOT NULL
);
