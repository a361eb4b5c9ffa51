-- What Meta charges for each message, as its statuses tell it (store::rules::price): one row
-- per priced message (per conversation under conversation-based pricing), keyed by a hash of
-- its wamid, counted in the hour (ms since the epoch) it was first priced.
CREATE TABLE prices (
    key      TEXT    NOT NULL PRIMARY KEY,
    hour     BIGINT  NOT NULL,
    prefix   TEXT    NOT NULL,
    category TEXT    NOT NULL,
    type     TEXT    NOT NULL,
    billed   BOOLEAN NOT NULL
);
CREATE INDEX prices_hour ON prices (hour);
