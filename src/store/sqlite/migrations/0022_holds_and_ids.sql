-- A person who replied to the customer (the desk, the admin API, the WhatsApp Business app)
-- holds the conversation until then (ms since the epoch): the assistant stands down, and what
-- the customer writes goes to the person. NULL: nobody holds it.
ALTER TABLE conversations ADD COLUMN held_until INTEGER;

-- Every id Meta named a WhatsApp customer by (phone number, BSUID, parent BSUID), linked to the
-- one their conversations are keyed by (store::rules::identity).
CREATE TABLE customer_ids (
    channel   TEXT    NOT NULL,
    alias     TEXT    NOT NULL,
    customer  TEXT    NOT NULL,
    linked_at INTEGER NOT NULL,
    PRIMARY KEY (channel, alias)
);
CREATE INDEX customer_ids_customer ON customer_ids (channel, customer);
