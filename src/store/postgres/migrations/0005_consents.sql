-- Each customer's latest choice about broadcasts (store/rules/consent.rs): broadcasts skip
-- those who opted out; service replies never read it.
CREATE TABLE consents (
    customer  TEXT PRIMARY KEY,
    opted_out BOOLEAN NOT NULL,
    source    TEXT    NOT NULL,
    at        BIGINT  NOT NULL
);
