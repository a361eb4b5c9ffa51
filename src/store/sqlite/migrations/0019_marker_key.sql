-- Which marker secrets the store's erasure markers (consents, broadcast recipients) and erased
-- keys' hashes are under: a keyed fingerprint, never the secret. A store without a row holds
-- them unkeyed, as builds before the marker secret wrote them; the first start after this
-- migration moves every one under the configured secret (`customers::rekey`).
CREATE TABLE marker_key (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    fingerprint TEXT    NOT NULL
);
