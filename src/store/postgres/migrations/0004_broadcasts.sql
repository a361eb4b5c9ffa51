-- Broadcasts: template campaigns, their audience in order, and each recipient's lifecycle
-- (store/rules/broadcast.rs).
CREATE TABLE broadcasts (
    id             BIGSERIAL PRIMARY KEY,
    -- The same key always gives the same broadcast.
    key            TEXT UNIQUE,
    name           TEXT    NOT NULL,
    template       TEXT    NOT NULL,
    language       TEXT    NOT NULL,
    business       TEXT    NOT NULL,
    state          TEXT    NOT NULL,
    paused_because TEXT,
    created_at     BIGINT  NOT NULL,
    start_at       BIGINT  NOT NULL,
    deadline       BIGINT,
    rate           BIGINT  NOT NULL
);
CREATE TABLE broadcast_recipients (
    id              BIGSERIAL PRIMARY KEY,
    broadcast_id    BIGINT  NOT NULL REFERENCES broadcasts (id),
    recipient       TEXT    NOT NULL,
    -- The template's body parameters, a JSON array.
    params          TEXT    NOT NULL,
    line            BIGINT,
    state           TEXT    NOT NULL,
    skipped         TEXT,
    error           TEXT,
    error_code      BIGINT,
    wamid           TEXT,
    delivery        TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    failures        INTEGER NOT NULL DEFAULT 0,
    holds           INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT,
    lease_until     BIGINT,
    sent_at         BIGINT
);
CREATE INDEX broadcast_recipients_state ON broadcast_recipients (broadcast_id, state);
CREATE INDEX broadcast_recipients_wamid ON broadcast_recipients (wamid) WHERE wamid IS NOT NULL;
