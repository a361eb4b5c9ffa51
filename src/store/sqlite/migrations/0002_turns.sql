-- Batches: a conversation's pending messages taken together under a lease.
CREATE TABLE batches (
    id              INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations (id),
    -- running (leased) | waiting (for a retry) | done | review
    state           TEXT    NOT NULL,
    -- The fencing token: bumped on every claim; writes must carry the latest.
    token           INTEGER NOT NULL,
    attempts        INTEGER NOT NULL,
    lease_until     INTEGER,
    next_attempt_at INTEGER,
    due_at          INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    started_at      INTEGER NOT NULL,
    finished_at     INTEGER,
    last_error      TEXT
);
CREATE INDEX batches_running ON batches (lease_until) WHERE state = 'running';
CREATE INDEX batches_waiting ON batches (next_attempt_at) WHERE state = 'waiting';

ALTER TABLE inbox ADD COLUMN batch_id INTEGER REFERENCES batches (id);
CREATE INDEX inbox_pending ON inbox (conversation_id) WHERE state = 'pending';
CREATE INDEX inbox_batch ON inbox (batch_id) WHERE batch_id IS NOT NULL;

-- The batch a conversation has open; no second one is claimed until it ends.
ALTER TABLE conversations ADD COLUMN open_batch_id INTEGER REFERENCES batches (id);

-- Reply parts, written with the lease's token before anything is sent; one row per (batch, part).
CREATE TABLE outbox (
    id         INTEGER PRIMARY KEY,
    batch_id   INTEGER NOT NULL REFERENCES batches (id),
    part       INTEGER NOT NULL,
    channel    TEXT    NOT NULL,
    business   TEXT    NOT NULL,
    customer   TEXT    NOT NULL,
    body       TEXT    NOT NULL,
    state      TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    UNIQUE (batch_id, part)
);

-- Batches handed to a person.
CREATE TABLE review (
    id         INTEGER PRIMARY KEY,
    batch_id   INTEGER NOT NULL UNIQUE REFERENCES batches (id),
    reason     TEXT    NOT NULL,
    error      TEXT,
    state      TEXT    NOT NULL,
    created_at INTEGER NOT NULL
);
