-- Sabi's store on PostgreSQL: the same tables as the SQLite backend, in one version.
-- Times are Unix milliseconds (BIGINT), as everywhere in Sabi.

CREATE TABLE conversations (
    id               BIGSERIAL PRIMARY KEY,
    channel          TEXT    NOT NULL,
    business         TEXT    NOT NULL,
    customer         TEXT    NOT NULL,
    first_pending_at BIGINT,
    last_pending_at  BIGINT,
    due_at           BIGINT,
    open_batch_id    BIGINT,
    send_after       BIGINT,
    last_inbound_at  BIGINT,
    requeued         BOOLEAN NOT NULL DEFAULT false,
    UNIQUE (channel, business, customer)
);
CREATE INDEX conversations_due ON conversations (due_at) WHERE due_at IS NOT NULL;
CREATE INDEX conversations_customer ON conversations (customer);

CREATE TABLE batches (
    id                BIGSERIAL PRIMARY KEY,
    conversation_id   BIGINT  NOT NULL REFERENCES conversations (id),
    state             TEXT    NOT NULL,
    token             BIGINT  NOT NULL,
    attempts          INTEGER NOT NULL,
    lease_until       BIGINT,
    next_attempt_at   BIGINT,
    due_at            BIGINT  NOT NULL,
    created_at        BIGINT  NOT NULL,
    started_at        BIGINT  NOT NULL,
    finished_at       BIGINT,
    last_error        TEXT,
    stage             TEXT,
    prompt_tokens     BIGINT,
    completion_tokens BIGINT,
    cost              DOUBLE PRECISION,
    requeued          BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX batches_running ON batches (lease_until) WHERE state = 'running';
CREATE INDEX batches_waiting ON batches (next_attempt_at) WHERE state = 'waiting';
CREATE INDEX batches_conversation ON batches (conversation_id, id);
CREATE INDEX batches_finished ON batches (finished_at);

CREATE TABLE inbox (
    seq             BIGSERIAL PRIMARY KEY,
    channel         TEXT   NOT NULL,
    dedupe_key      TEXT   NOT NULL,
    kind            TEXT   NOT NULL,
    business        TEXT,
    customer        TEXT,
    item_type       TEXT,
    text            TEXT,
    media_id        TEXT,
    provider_ts     BIGINT,
    received_at     BIGINT NOT NULL,
    state           TEXT   NOT NULL,
    conversation_id BIGINT,
    batch_id        BIGINT,
    content_hash    BYTEA  NOT NULL,
    facts           TEXT   NOT NULL,
    UNIQUE (channel, dedupe_key)
);
CREATE INDEX inbox_pending ON inbox (conversation_id) WHERE state = 'pending';
CREATE INDEX inbox_batch ON inbox (batch_id) WHERE batch_id IS NOT NULL;
CREATE INDEX inbox_webchat_pending ON inbox (seq) WHERE state = 'pending' AND channel = 'webchat';

CREATE TABLE quarantine (
    id          BIGSERIAL PRIMARY KEY,
    channel     TEXT   NOT NULL,
    received_at BIGINT NOT NULL,
    reason      TEXT   NOT NULL,
    raw         TEXT   NOT NULL,
    hash        BYTEA  NOT NULL,
    UNIQUE (channel, hash)
);

CREATE TABLE outbox (
    id              BIGSERIAL PRIMARY KEY,
    batch_id        BIGINT  NOT NULL REFERENCES batches (id),
    part            INTEGER NOT NULL,
    channel         TEXT    NOT NULL,
    business        TEXT    NOT NULL,
    customer        TEXT    NOT NULL,
    body            TEXT    NOT NULL,
    state           TEXT    NOT NULL,
    created_at      BIGINT  NOT NULL,
    conversation_id BIGINT  NOT NULL,
    options         TEXT,
    reply_to        TEXT,
    kind            TEXT    NOT NULL DEFAULT 'text',
    attempts        INTEGER NOT NULL DEFAULT 0,
    failures        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT,
    window_closed   BOOLEAN NOT NULL DEFAULT false,
    send_until      BIGINT,
    wamid           TEXT,
    delivery        TEXT,
    error_code      BIGINT,
    error           TEXT,
    sent_at         BIGINT,
    updated_at      BIGINT,
    UNIQUE (batch_id, part)
);
CREATE INDEX outbox_active ON outbox (conversation_id, id)
    WHERE state IN ('queued', 'sending', 'unknown', 'window_closed');
CREATE INDEX outbox_due ON outbox (id) WHERE state IN ('queued', 'window_closed');
CREATE INDEX outbox_sending ON outbox (send_until) WHERE state = 'sending';
CREATE INDEX outbox_unknown ON outbox (send_until) WHERE state = 'unknown';
CREATE UNIQUE INDEX outbox_wamid ON outbox (wamid) WHERE wamid IS NOT NULL;

CREATE TABLE review (
    id              BIGSERIAL PRIMARY KEY,
    batch_id        BIGINT NOT NULL REFERENCES batches (id),
    outbox_id       BIGINT,
    reason          TEXT   NOT NULL,
    error           TEXT,
    state           TEXT   NOT NULL,
    created_at      BIGINT NOT NULL,
    resolved_at     BIGINT,
    resolution      TEXT,
    resolution_note TEXT
);
CREATE UNIQUE INDEX review_batch ON review (batch_id) WHERE outbox_id IS NULL;
CREATE UNIQUE INDEX review_outbox ON review (outbox_id) WHERE outbox_id IS NOT NULL;
CREATE INDEX review_open ON review (id) WHERE state = 'open';

CREATE TABLE chat_jobs (
    job_id      TEXT   PRIMARY KEY,
    session_id  TEXT   NOT NULL,
    message_key TEXT   NOT NULL UNIQUE,
    inbox_seq   BIGINT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
CREATE INDEX chat_jobs_session ON chat_jobs (session_id, created_at);
