-- Sabi's server-side code on PostgreSQL, (re)made at every start under the migration lock.
-- Code, not data: a new build replaces it; its name carries its signature's version.

-- Whether the item just stored as `p_seq` was erased since (its key's hash, `p_key_hash`, is in
-- erased_keys: store/rules/erasure.rs); if so it is taken out again. Asked after the insert,
-- not before: an erasure that deleted the same key while the insert waited on its row has
-- committed by then, and this query, with a snapshot of its own, sees its hash, where a check
-- before the insert would not.
CREATE OR REPLACE FUNCTION sabi_drop_if_erased_v1(p_seq BIGINT, p_key_hash TEXT)
RETURNS BOOLEAN LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM erased_keys WHERE key_hash = p_key_hash) THEN
        RETURN false;
    END IF;
    DELETE FROM inbox WHERE inbox.seq = p_seq;
    RETURN true;
END;
$$;

-- Any other item (a status, an error, a message that wakes no turn), stored in one round trip:
-- its seq, or NULL when it was already stored or was erased since (`sabi_drop_if_erased_v1`).
-- `p_seq` as in `sabi_ingest_message_v6`.
CREATE OR REPLACE FUNCTION sabi_ingest_item_v1(
    p_channel TEXT, p_key TEXT, p_kind TEXT, p_business TEXT, p_customer TEXT, p_type TEXT,
    p_text TEXT, p_media TEXT, p_provider_ts BIGINT, p_received BIGINT, p_state TEXT,
    p_hash BYTEA, p_facts TEXT, p_seq BIGINT, p_key_hash TEXT)
RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    stored BIGINT;
BEGIN
    INSERT INTO inbox (seq, channel, dedupe_key, kind, business, customer, item_type, text,
                       media_id, provider_ts, received_at, state, content_hash, facts)
    VALUES (COALESCE(p_seq, nextval('inbox_seq_seq'::regclass)), p_channel, p_key, p_kind,
            p_business, p_customer, p_type, p_text, p_media, p_provider_ts, p_received, p_state,
            p_hash, p_facts)
    ON CONFLICT (channel, dedupe_key) DO NOTHING
    RETURNING inbox.seq INTO stored;
    IF stored IS NULL OR sabi_drop_if_erased_v1(stored, p_key_hash) THEN
        RETURN NULL;
    END IF;
    RETURN stored;
END;
$$;

-- The key of the WhatsApp customer `p_ids` name (phone numbers first), each id linked to it:
-- store::rules::identity (`key`: the key of the first id that has one, else the first id;
-- `unlinked`: only ids not yet linked to it are written, so a known customer costs one read;
-- `links`: nothing is written unless `p_link`). NULL for no ids.
-- Each id is looked up alone, through the primary key: a join of the ids with customer_ids,
-- planned once for all calls while the statistics still described a small table (a new store
-- under load), read the channel's whole index (every customer met) for each message.
CREATE OR REPLACE FUNCTION sabi_identify_v2(p_channel TEXT, p_ids TEXT[], p_now BIGINT,
                                            p_link BOOLEAN)
RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    found TEXT;
    id TEXT;
BEGIN
    IF p_ids IS NULL OR cardinality(p_ids) = 0 THEN
        RETURN NULL;
    END IF;
    FOREACH id IN ARRAY p_ids LOOP
        SELECT c.customer INTO found FROM customer_ids c
        WHERE c.channel = p_channel AND c.alias = id;
        EXIT WHEN found IS NOT NULL;
    END LOOP;
    found := COALESCE(found, p_ids[1]);
    IF NOT p_link THEN
        RETURN found;
    END IF;
    INSERT INTO customer_ids AS c (channel, alias, customer, linked_at)
    SELECT p_channel, i.alias, found, p_now FROM unnest(p_ids) AS i(alias)
    WHERE NOT EXISTS (SELECT 1 FROM customer_ids k
                      WHERE k.channel = p_channel AND k.alias = i.alias AND k.customer = found)
    ON CONFLICT (channel, alias) DO UPDATE SET customer = EXCLUDED.customer,
                                               linked_at = EXCLUDED.linked_at;
    RETURN found;
END;
$$;

-- One customer message that wakes its conversation, stored and scheduled in one round trip:
-- the message's unique key first, then the conversation's row (the order every ingest takes its
-- locks in), so a racing copy waits on the key and schedules nothing. Due one window after the
-- latest message, never later than the cap after the first; a WhatsApp message is noted as the
-- reply to the customer's latest broadcast; a message for the model (`p_model`) puts the
-- conversation in the model's lane until a batch takes it. Returns the message's seq and the
-- conversation's due time, or no row when the message was already stored or was erased since
-- (`sabi_drop_if_erased_v1`). Every PostgreSQL ingest of such a message calls it, alone or
-- inside a delivery's transaction. `p_seq`, when given, is the message's place in arrival
-- order, taken ahead for a delivery whose items are stored in another order than they came
-- (see `lock_order`). The sequence is named, not looked up by `pg_get_serial_sequence`, which
-- would cost a catalog read on every message.
CREATE OR REPLACE FUNCTION sabi_ingest_message_v6(
    p_channel TEXT, p_key TEXT, p_business TEXT, p_customer TEXT, p_type TEXT, p_text TEXT,
    p_media TEXT, p_provider_ts BIGINT, p_received BIGINT, p_hash BYTEA, p_facts TEXT,
    p_conv_channel TEXT, p_conv_business TEXT, p_conv_customer TEXT,
    p_window BIGINT, p_cap BIGINT, p_sent_at BIGINT, p_seq BIGINT, p_reply_since BIGINT,
    p_model BOOLEAN, p_key_hash TEXT, p_ids TEXT[])
RETURNS TABLE (seq BIGINT, due_at BIGINT) LANGUAGE plpgsql AS $$
DECLARE
    stored BIGINT;
    conversation BIGINT;
    due BIGINT;
    customer_key TEXT;
BEGIN
    INSERT INTO inbox (seq, channel, dedupe_key, kind, business, customer, item_type, text,
                       media_id, provider_ts, received_at, state, content_hash, facts)
    VALUES (COALESCE(p_seq, nextval('inbox_seq_seq'::regclass)), p_channel, p_key,
            'message', p_business, p_customer, p_type, p_text, p_media, p_provider_ts,
            p_received, '{pending}', p_hash, p_facts)
    ON CONFLICT (channel, dedupe_key) DO NOTHING
    RETURNING inbox.seq INTO stored;
    IF stored IS NULL OR sabi_drop_if_erased_v1(stored, p_key_hash) THEN
        RETURN;
    END IF;
    -- Under the customer's key, however this message names them (`p_ids`).
    customer_key := sabi_identify_v2(p_channel, p_ids, p_received, true);
    p_conv_customer := COALESCE(customer_key, p_conv_customer);
    INSERT INTO conversations AS c (channel, business, customer, first_pending_at,
                                    last_pending_at, due_at, last_inbound_at, model_pending)
    VALUES (p_conv_channel, p_conv_business, p_conv_customer, p_received, p_received,
            p_received + LEAST(p_window, p_cap), p_sent_at, p_model)
    ON CONFLICT (channel, business, customer) DO UPDATE SET
        first_pending_at = COALESCE(c.first_pending_at, EXCLUDED.first_pending_at),
        last_pending_at = EXCLUDED.last_pending_at,
        due_at = LEAST(EXCLUDED.last_pending_at + p_window,
                       COALESCE(c.first_pending_at, EXCLUDED.first_pending_at) + p_cap),
        last_inbound_at = GREATEST(COALESCE(c.last_inbound_at, 0), EXCLUDED.last_inbound_at),
        model_pending = c.model_pending OR EXCLUDED.model_pending
    RETURNING c.id, c.due_at INTO conversation, due;
    UPDATE inbox SET conversation_id = conversation, customer = COALESCE(customer_key, p_customer)
    WHERE inbox.seq = stored;
    -- On WhatsApp, the reply to the broadcast the customer was last sent, if that came after
    -- p_reply_since and had none yet (broadcast reports count it).
    IF p_channel = 'whatsapp' THEN
        UPDATE broadcast_recipients SET replied_at = p_received
        WHERE id = (SELECT r.id FROM broadcast_recipients r
                    WHERE r.recipient = p_customer AND r.sent_at > p_reply_since
                      AND r.sent_at <= p_received
                    ORDER BY r.sent_at DESC LIMIT 1)
          AND replied_at IS NULL;
    END IF;
    seq := stored;
    due_at := due;
    RETURN NEXT;
END;
$$;
