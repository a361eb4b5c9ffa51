-- Broadcasts: template campaigns, their audience in order, and each recipient's lifecycle
-- (store/rules/broadcast.rs).
CREATE TABLE broadcasts (
    id             INTEGER PRIMARY KEY,
    -- The same key always gives the same broadcast.
    key            TEXT UNIQUE,
    name           TEXT    NOT NULL,
    template       TEXT    NOT NULL,
    language       TEXT    NOT NULL,
    business       TEXT    NOT NULL,
    state          TEXT    NOT NULL,
    paused_because TEXT,
    created_at     INTEGER NOT NULL,
    start_at       INTEGER NOT NULL,
    deadline       INTEGER,
    rate           INTEGER NOT NULL
);
CREATE TABLE broadcast_recipients (
    id              INTEGER PRIMARY KEY,
    broadcast_id    INTEGER NOT NULL REFERENCES broadcasts (id),
    recipient       TEXT    NOT NULL,
    -- The template's body parameters, a JSON array.
    params          TEXT    NOT NULL,
    line            INTEGER,
    state           TEXT    NOT NULL,
    skipped         TEXT,
    error           TEXT,
    error_code      INTEGER,
    wamid           TEXT,
    delivery        TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    failures        INTEGER NOT NULL DEFAULT 0,
    holds           INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    lease_until     INTEGER,
    sent_at         INTEGER
);
CREATE INDEX broadcast_recipients_state ON broadcast_recipients (broadcast_id, state);
CREATE INDEX broadcast_recipients_wamid ON broadcast_recipients (wamid) WHERE wamid IS NOT NULL;
