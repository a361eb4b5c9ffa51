-- Every inbound fact, deduplicated per channel. `facts` is the normalised JSON view.
CREATE TABLE inbox (
    seq             INTEGER PRIMARY KEY,
    channel         TEXT    NOT NULL,
    dedupe_key      TEXT    NOT NULL,
    kind            TEXT    NOT NULL,
    business        TEXT,
    customer        TEXT,
    item_type       TEXT,
    text            TEXT,
    media_id        TEXT,
    provider_ts     INTEGER,
    received_at     INTEGER NOT NULL,
    state           TEXT    NOT NULL,
    conversation_id INTEGER REFERENCES conversations (id),
    content_hash    BLOB    NOT NULL,
    facts           TEXT    NOT NULL,
    UNIQUE (channel, dedupe_key)
);

-- One row per (channel, business number, customer); the schedule of its pending messages.
CREATE TABLE conversations (
    id               INTEGER PRIMARY KEY,
    channel          TEXT    NOT NULL,
    business         TEXT    NOT NULL,
    customer         TEXT    NOT NULL,
    first_pending_at INTEGER,
    last_pending_at  INTEGER,
    due_at           INTEGER,
    UNIQUE (channel, business, customer)
);
CREATE INDEX conversations_due ON conversations (due_at) WHERE due_at IS NOT NULL;

-- Signed deliveries (or parts of them) of a shape Sabi does not know, kept raw.
CREATE TABLE quarantine (
    id          INTEGER PRIMARY KEY,
    channel     TEXT    NOT NULL,
    received_at INTEGER NOT NULL,
    reason      TEXT    NOT NULL,
    raw         TEXT    NOT NULL
);
