-- A customer's data (store/rules/erasure.rs): their items by customer, for export and erasure,
-- and the account's own items (field events, errors) apart, which erasure reads for mentions.
CREATE INDEX inbox_customer ON inbox (customer, seq) WHERE customer IS NOT NULL;
CREATE INDEX inbox_account ON inbox (seq) WHERE customer IS NULL;
-- What stays of an erased item: its deduplication key's hash, so that Meta's late retry of it
-- is a duplicate, never a new message.
CREATE TABLE erased_keys (
    key_hash  TEXT   PRIMARY KEY,
    erased_at BIGINT NOT NULL
);
