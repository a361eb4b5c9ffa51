-- Ids that leave the store (batches, reply parts, review items, broadcasts and their
-- recipients: they travel in desk links and in Meta's callback data) are never given twice:
-- without AUTOINCREMENT SQLite reuses the highest id once its row is deleted (an erasure, a
-- sweep). Each table is rebuilt with AUTOINCREMENT, as SQLite's ALTER TABLE cannot add it;
-- its sqlite_sequence row starts at the highest id kept.

CREATE TABLE batches_lasting (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id   INTEGER NOT NULL REFERENCES conversations (id),
    state             TEXT NOT NULL,
    token             INTEGER NOT NULL,
    attempts          INTEGER NOT NULL,
    lease_until       INTEGER,
    next_attempt_at   INTEGER,
    due_at            INTEGER NOT NULL,
    created_at        INTEGER NOT NULL,
    started_at        INTEGER NOT NULL,
    finished_at       INTEGER,
    last_error        TEXT,
    stage             TEXT,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    cost              REAL,
    requeued          INTEGER NOT NULL DEFAULT 0,
    route_intent      TEXT,
    route_confidence  REAL,
    route_local       INTEGER,
    label             TEXT
);
INSERT INTO batches_lasting (id, conversation_id, state, token, attempts, lease_until, next_attempt_at, due_at, created_at, started_at, finished_at, last_error, stage, prompt_tokens, completion_tokens, cost, requeued, route_intent, route_confidence, route_local, label)
    SELECT id, conversation_id, state, token, attempts, lease_until, next_attempt_at, due_at, created_at, started_at, finished_at, last_error, stage, prompt_tokens, completion_tokens, cost, requeued, route_intent, route_confidence, route_local, label FROM batches;
DROP TABLE batches;
ALTER TABLE batches_lasting RENAME TO batches;
CREATE INDEX batches_running ON batches (lease_until) WHERE state = 'running';
CREATE INDEX batches_waiting ON batches (next_attempt_at) WHERE state = 'waiting';
CREATE INDEX batches_conversation ON batches (conversation_id, id);
CREATE INDEX batches_routed ON batches (finished_at) WHERE route_intent IS NOT NULL;
CREATE INDEX batches_ended ON batches (finished_at) WHERE state IN ('done', 'review');

CREATE TABLE outbox_lasting (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    batch_id        INTEGER NOT NULL REFERENCES batches (id),
    part            INTEGER NOT NULL,
    channel         TEXT NOT NULL,
    business        TEXT NOT NULL,
    customer        TEXT NOT NULL,
    body            TEXT NOT NULL,
    state           TEXT NOT NULL,
    created_at      INTEGER NOT NULL,
    conversation_id INTEGER REFERENCES conversations (id),
    options         TEXT,
    reply_to        TEXT,
    kind            TEXT NOT NULL DEFAULT 'text',
    attempts        INTEGER NOT NULL DEFAULT 0,
    failures        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    window_closed   INTEGER NOT NULL DEFAULT 0,
    send_until      INTEGER,
    wamid           TEXT,
    delivery        TEXT,
    error_code      INTEGER,
    error           TEXT,
    sent_at         INTEGER,
    updated_at      INTEGER,
    UNIQUE (batch_id, part)
);
INSERT INTO outbox_lasting (id, batch_id, part, channel, business, customer, body, state, created_at, conversation_id, options, reply_to, kind, attempts, failures, next_attempt_at, window_closed, send_until, wamid, delivery, error_code, error, sent_at, updated_at)
    SELECT id, batch_id, part, channel, business, customer, body, state, created_at, conversation_id, options, reply_to, kind, attempts, failures, next_attempt_at, window_closed, send_until, wamid, delivery, error_code, error, sent_at, updated_at FROM outbox;
DROP TABLE outbox;
ALTER TABLE outbox_lasting RENAME TO outbox;
CREATE INDEX outbox_active ON outbox (conversation_id, id)
    WHERE state IN ('queued', 'sending', 'unknown', 'window_closed');
CREATE INDEX outbox_due ON outbox (id) WHERE state IN ('queued', 'window_closed');
CREATE INDEX outbox_sending ON outbox (send_until) WHERE state = 'sending';
CREATE INDEX outbox_unknown ON outbox (send_until) WHERE state = 'unknown';
CREATE UNIQUE INDEX outbox_wamid ON outbox (wamid) WHERE wamid IS NOT NULL;

CREATE TABLE review_lasting (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    batch_id        INTEGER NOT NULL REFERENCES batches (id),
    outbox_id       INTEGER REFERENCES outbox (id),
    reason          TEXT NOT NULL,
    error           TEXT,
    state           TEXT NOT NULL,
    created_at      INTEGER NOT NULL,
    resolved_at     INTEGER,
    resolution      TEXT,
    resolution_note TEXT
);
INSERT INTO review_lasting (id, batch_id, outbox_id, reason, error, state, created_at, resolved_at, resolution, resolution_note)
    SELECT id, batch_id, outbox_id, reason, error, state, created_at, resolved_at, resolution, resolution_note FROM review;
DROP TABLE review;
ALTER TABLE review_lasting RENAME TO review;
CREATE UNIQUE INDEX review_batch ON review (batch_id) WHERE outbox_id IS NULL;
CREATE UNIQUE INDEX review_outbox ON review (outbox_id) WHERE outbox_id IS NOT NULL;
CREATE INDEX review_open ON review (id) WHERE state = 'open';
CREATE INDEX review_of_batch ON review (batch_id);

CREATE TABLE broadcasts_lasting (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    key            TEXT UNIQUE,
    name           TEXT NOT NULL,
    template       TEXT NOT NULL,
    language       TEXT NOT NULL,
    business       TEXT NOT NULL,
    state          TEXT NOT NULL,
    paused_because TEXT,
    created_at     INTEGER NOT NULL,
    start_at       INTEGER NOT NULL,
    deadline       INTEGER,
    rate           INTEGER NOT NULL,
    paused_by      TEXT,
    body           TEXT,
    quiet_hours    TEXT,
    tz             TEXT,
    local_start    TEXT,
    local_until    TEXT
);
INSERT INTO broadcasts_lasting (id, key, name, template, language, business, state, paused_because, created_at, start_at, deadline, rate, paused_by, body, quiet_hours, tz, local_start, local_until)
    SELECT id, key, name, template, language, business, state, paused_because, created_at, start_at, deadline, rate, paused_by, body, quiet_hours, tz, local_start, local_until FROM broadcasts;
DROP TABLE broadcasts;
ALTER TABLE broadcasts_lasting RENAME TO broadcasts;

CREATE TABLE broadcast_recipients_lasting (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    broadcast_id    INTEGER NOT NULL REFERENCES broadcasts (id),
    recipient       TEXT NOT NULL,
    params          TEXT NOT NULL,
    line            INTEGER,
    state           TEXT NOT NULL,
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
    sent_at         INTEGER,
    replied_at      BIGINT,
    tz              TEXT,
    billed          BOOLEAN
);
INSERT INTO broadcast_recipients_lasting (id, broadcast_id, recipient, params, line, state, skipped, error, error_code, wamid, delivery, attempts, failures, holds, next_attempt_at, lease_until, sent_at, replied_at, tz, billed)
    SELECT id, broadcast_id, recipient, params, line, state, skipped, error, error_code, wamid, delivery, attempts, failures, holds, next_attempt_at, lease_until, sent_at, replied_at, tz, billed FROM broadcast_recipients;
DROP TABLE broadcast_recipients;
ALTER TABLE broadcast_recipients_lasting RENAME TO broadcast_recipients;
CREATE INDEX broadcast_recipients_state ON broadcast_recipients (broadcast_id, state);
CREATE INDEX broadcast_recipients_wamid ON broadcast_recipients (wamid) WHERE wamid IS NOT NULL;
CREATE INDEX broadcast_recipients_sent ON broadcast_recipients (sent_at, recipient)
    WHERE sent_at IS NOT NULL;
CREATE INDEX broadcast_recipients_customer ON broadcast_recipients (recipient, sent_at);
CREATE INDEX broadcast_recipients_by_state ON broadcast_recipients (state, lease_until);
