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

-- Many one-message deliveries stored and scheduled in one call and one transaction, as
-- `sabi_ingest_message_v6` stores each: message `n` is the nth element of every `p_*` array
-- (`p_id_of[i]` names the message whose id `p_ids[i]` is, each message's ids together and in
-- its own order). The caller never puts two messages that share an id or a conversation in
-- one call, so what one links cannot change whom another is from, and gives all one window and
-- cap. Seqs are taken in the messages' order; locks in the order every ingest takes them: the
-- messages' unique keys in key order, then the conversations in key order. Two messages that
-- turn out to be one customer's (a number and a BSUID linked before) schedule the conversation
-- as the two calls would have, one after the other. Returns, for each
-- message stored, its place `n`, its seq and its conversation's due time; a message already
-- stored, or erased since, has no row. Rows are stored, scheduled and placed by one statement
-- for all the messages, each through an index of the rows named (never a table read whole);
-- an id's link and a broadcast's recipient are looked up one key at a time, as
-- `sabi_identify_v2` does.
CREATE OR REPLACE FUNCTION sabi_ingest_messages_v1(
    p_channel TEXT[], p_key TEXT[], p_business TEXT[], p_customer TEXT[], p_type TEXT[],
    p_text TEXT[], p_media TEXT[], p_provider_ts BIGINT[], p_received BIGINT[],
    p_hash BYTEA[], p_facts TEXT[], p_conv_channel TEXT[], p_conv_business TEXT[],
    p_conv_customer TEXT[], p_sent_at BIGINT[], p_reply_since BIGINT[], p_model BOOLEAN[],
    p_key_hash TEXT[], p_id_of INT[], p_ids TEXT[], p_window BIGINT, p_cap BIGINT)
RETURNS TABLE (n INT, seq BIGINT, due_at BIGINT) LANGUAGE plpgsql
-- Its plans are made once per connection and kept while the tables grow: one made while a
-- table was small would read it whole on every later call.
SET enable_seqscan = off AS $$
DECLARE
    kept_n INT[];
    kept_seq BIGINT[];
    alive BOOLEAN[] := array_fill(false, ARRAY[cardinality(p_key)]);
    key_of TEXT[] := array_fill(NULL::TEXT, ARRAY[cardinality(p_key)]);
    linked TEXT[] := array_fill(NULL::TEXT, ARRAY[cardinality(p_ids)]);
    link_alias TEXT[] := '{}';
    link_to TEXT[] := '{}';
    link_channel TEXT[] := '{}';
    link_at BIGINT[] := '{}';
    m INT;
    found_key TEXT;
    i INT;
BEGIN
    WITH given AS (
        SELECT g.n::INT AS n, nextval('inbox_seq_seq'::regclass) AS seq
        FROM generate_subscripts(p_key, 1) AS g(n)
    ), stored AS (
        INSERT INTO inbox (seq, channel, dedupe_key, kind, business, customer, item_type, text,
                           media_id, provider_ts, received_at, state, content_hash, facts)
        SELECT g.seq, p_channel[g.n], p_key[g.n], 'message', p_business[g.n],
               p_customer[g.n], p_type[g.n], p_text[g.n], p_media[g.n], p_provider_ts[g.n],
               p_received[g.n], '{pending}', p_hash[g.n], p_facts[g.n]
        FROM given g ORDER BY p_channel[g.n], p_key[g.n]
        ON CONFLICT (channel, dedupe_key) DO NOTHING
        RETURNING inbox.seq
    )
    SELECT array_agg(g.n ORDER BY g.n), array_agg(g.seq ORDER BY g.n) INTO kept_n, kept_seq
    FROM stored s JOIN given g ON g.seq = s.seq;
    -- Erased since: asked after the inserts, as `sabi_drop_if_erased_v1` asks.
    IF kept_n IS NOT NULL
       AND EXISTS (SELECT 1 FROM erased_keys e WHERE e.key_hash = ANY (p_key_hash)) THEN
        FOR i IN 1 .. cardinality(kept_n) LOOP
            IF sabi_drop_if_erased_v1(kept_seq[i], p_key_hash[kept_n[i]]) THEN
                kept_seq[i] := NULL;
            END IF;
        END LOOP;
        SELECT array_agg(k.n ORDER BY k.n), array_agg(k.seq ORDER BY k.n) INTO kept_n, kept_seq
        FROM unnest(kept_n, kept_seq) AS k(n, seq) WHERE k.seq IS NOT NULL;
    END IF;
    IF kept_n IS NULL THEN
        RETURN;
    END IF;
    FOREACH m IN ARRAY kept_n LOOP
        alive[m] := true;
    END LOOP;
    -- Whom each message is from: the key of its first id that has one, else its first id;
    -- then each of its ids not yet linked to that key is.
    FOR i IN 1 .. coalesce(cardinality(p_ids), 0) LOOP
        m := p_id_of[i];
        CONTINUE WHEN NOT alive[m];
        SELECT c.customer INTO found_key FROM customer_ids c
        WHERE c.channel = p_channel[m] AND c.alias = p_ids[i];
        linked[i] := found_key;
        key_of[m] := COALESCE(key_of[m], linked[i]);
    END LOOP;
    FOR i IN 1 .. coalesce(cardinality(p_ids), 0) LOOP
        m := p_id_of[i];
        CONTINUE WHEN NOT alive[m];
        key_of[m] := COALESCE(key_of[m], p_ids[i]);
        IF linked[i] IS DISTINCT FROM key_of[m] THEN
            link_channel := link_channel || p_channel[m];
            link_alias := link_alias || p_ids[i];
            link_to := link_to || key_of[m];
            link_at := link_at || p_received[m];
        END IF;
    END LOOP;
    INSERT INTO customer_ids AS c (channel, alias, customer, linked_at)
    SELECT l.channel, l.alias, l.customer, l.at
    FROM unnest(link_channel, link_alias, link_to, link_at) AS l(channel, alias, customer, at)
    ORDER BY l.channel, l.alias
    ON CONFLICT (channel, alias) DO UPDATE SET customer = EXCLUDED.customer,
                                               linked_at = EXCLUDED.linked_at;
    RETURN QUERY
    WITH kept AS (
        SELECT k.n, k.seq, p_conv_channel[k.n] AS channel, p_conv_business[k.n] AS business,
               COALESCE(key_of[k.n], p_conv_customer[k.n]) AS customer
        FROM unnest(kept_n, kept_seq) AS k(n, seq)
    ), scheduled AS (
        INSERT INTO conversations AS c (channel, business, customer, first_pending_at,
                                        last_pending_at, due_at, last_inbound_at, model_pending)
        SELECT m.channel, m.business, m.customer, m.first, m.last,
               LEAST(m.last + p_window, m.first + p_cap), m.sent, m.model
        FROM (SELECT k.channel, k.business, k.customer,
                     (array_agg(p_received[k.n] ORDER BY k.n))[1] AS first,
                     (array_agg(p_received[k.n] ORDER BY k.n DESC))[1] AS last,
                     max(p_sent_at[k.n]) AS sent, bool_or(p_model[k.n]) AS model
              FROM kept k GROUP BY k.channel, k.business, k.customer) m
        ORDER BY m.channel, m.business, m.customer
        ON CONFLICT (channel, business, customer) DO UPDATE SET
            first_pending_at = COALESCE(c.first_pending_at, EXCLUDED.first_pending_at),
            last_pending_at = EXCLUDED.last_pending_at,
            due_at = LEAST(EXCLUDED.last_pending_at + p_window,
                           COALESCE(c.first_pending_at, EXCLUDED.first_pending_at) + p_cap),
            last_inbound_at = GREATEST(COALESCE(c.last_inbound_at, 0), EXCLUDED.last_inbound_at),
            model_pending = c.model_pending OR EXCLUDED.model_pending
        RETURNING c.id, c.channel, c.business, c.customer, c.due_at
    ), placed AS (
        SELECT k.n, k.seq, s.id, s.due_at, COALESCE(key_of[k.n], p_customer[k.n]) AS customer
        FROM kept k JOIN scheduled s USING (channel, business, customer)
    ), moved AS (
        UPDATE inbox i SET conversation_id = p.id, customer = p.customer
        FROM placed p WHERE i.seq = ANY (kept_seq) AND i.seq = p.seq
    )
    SELECT p.n, p.seq, p.due_at FROM placed p;
    -- On WhatsApp, the reply to the broadcast each customer was last sent, as the one-message
    -- call notes it.
    IF EXISTS (SELECT 1 FROM broadcast_recipients r WHERE r.recipient = ANY (p_customer)) THEN
        FOREACH m IN ARRAY kept_n LOOP
            CONTINUE WHEN p_channel[m] <> 'whatsapp';
            UPDATE broadcast_recipients SET replied_at = p_received[m]
            WHERE id = (SELECT r.id FROM broadcast_recipients r
                        WHERE r.recipient = p_customer[m] AND r.sent_at > p_reply_since[m]
                          AND r.sent_at <= p_received[m]
                        ORDER BY r.sent_at DESC LIMIT 1)
              AND replied_at IS NULL;
        END LOOP;
    END IF;
END;
$$;
