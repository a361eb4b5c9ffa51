--
-- PostgreSQL database dump
--


-- Dumped from database version 15.20 (Debian 15.20-0+deb12u1)
-- Dumped by pg_dump version 15.20 (Debian 15.20-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: sabi_ingest_message_v2(text, text, text, text, text, text, text, bigint, bigint, bytea, text, text, text, text, bigint, bigint, bigint, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.sabi_ingest_message_v2(p_channel text, p_key text, p_business text, p_customer text, p_type text, p_text text, p_media text, p_provider_ts bigint, p_received bigint, p_hash bytea, p_facts text, p_conv_channel text, p_conv_business text, p_conv_customer text, p_window bigint, p_cap bigint, p_sent_at bigint, p_seq bigint) RETURNS TABLE(seq bigint, due_at bigint)
    LANGUAGE plpgsql
    AS $$
DECLARE
    stored BIGINT;
    conversation BIGINT;
    due BIGINT;
BEGIN
    INSERT INTO inbox (seq, channel, dedupe_key, kind, business, customer, item_type, text,
                       media_id, provider_ts, received_at, state, content_hash, facts)
    VALUES (COALESCE(p_seq, nextval(pg_get_serial_sequence('inbox', 'seq'))), p_channel, p_key,
            'message', p_business, p_customer, p_type, p_text, p_media, p_provider_ts,
            p_received, 'pending', p_hash, p_facts)
    ON CONFLICT (channel, dedupe_key) DO NOTHING
    RETURNING inbox.seq INTO stored;
    IF stored IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO conversations AS c (channel, business, customer, first_pending_at,
                                    last_pending_at, due_at, last_inbound_at)
    VALUES (p_conv_channel, p_conv_business, p_conv_customer, p_received, p_received,
            p_received + LEAST(p_window, p_cap), p_sent_at)
    ON CONFLICT (channel, business, customer) DO UPDATE SET
        first_pending_at = COALESCE(c.first_pending_at, EXCLUDED.first_pending_at),
        last_pending_at = EXCLUDED.last_pending_at,
        due_at = LEAST(EXCLUDED.last_pending_at + p_window,
                       COALESCE(c.first_pending_at, EXCLUDED.first_pending_at) + p_cap),
        last_inbound_at = GREATEST(COALESCE(c.last_inbound_at, 0), EXCLUDED.last_inbound_at)
    RETURNING c.id, c.due_at INTO conversation, due;
    UPDATE inbox SET conversation_id = conversation WHERE inbox.seq = stored;
    seq := stored;
    due_at := due;
    RETURN NEXT;
END;
$$;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: batches; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.batches (
    id bigint NOT NULL,
    conversation_id bigint NOT NULL,
    state text NOT NULL,
    token bigint NOT NULL,
    attempts integer NOT NULL,
    lease_until bigint,
    next_attempt_at bigint,
    due_at bigint NOT NULL,
    created_at bigint NOT NULL,
    started_at bigint NOT NULL,
    finished_at bigint,
    last_error text,
    stage text,
    prompt_tokens bigint,
    completion_tokens bigint,
    cost double precision,
    requeued boolean DEFAULT false NOT NULL
);


--
-- Name: batches_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.batches_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: batches_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.batches_id_seq OWNED BY public.batches.id;


--
-- Name: chat_jobs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.chat_jobs (
    job_id text NOT NULL,
    session_id text NOT NULL,
    message_key text NOT NULL,
    inbox_seq bigint NOT NULL,
    created_at bigint NOT NULL,
    expires_at bigint NOT NULL
);


--
-- Name: conversations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.conversations (
    id bigint NOT NULL,
    channel text NOT NULL,
    business text NOT NULL,
    customer text NOT NULL,
    first_pending_at bigint,
    last_pending_at bigint,
    due_at bigint,
    open_batch_id bigint,
    send_after bigint,
    last_inbound_at bigint,
    requeued boolean DEFAULT false NOT NULL
);


--
-- Name: conversations_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.conversations_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: conversations_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.conversations_id_seq OWNED BY public.conversations.id;


--
-- Name: inbox; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.inbox (
    seq bigint NOT NULL,
    channel text NOT NULL,
    dedupe_key text NOT NULL,
    kind text NOT NULL,
    business text,
    customer text,
    item_type text,
    text text,
    media_id text,
    provider_ts bigint,
    received_at bigint NOT NULL,
    state text NOT NULL,
    conversation_id bigint,
    batch_id bigint,
    content_hash bytea NOT NULL,
    facts text NOT NULL
);


--
-- Name: inbox_seq_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.inbox_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: inbox_seq_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.inbox_seq_seq OWNED BY public.inbox.seq;


--
-- Name: outbox; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.outbox (
    id bigint NOT NULL,
    batch_id bigint NOT NULL,
    part integer NOT NULL,
    channel text NOT NULL,
    business text NOT NULL,
    customer text NOT NULL,
    body text NOT NULL,
    state text NOT NULL,
    created_at bigint NOT NULL,
    conversation_id bigint NOT NULL,
    options text,
    reply_to text,
    kind text DEFAULT 'text'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    failures integer DEFAULT 0 NOT NULL,
    next_attempt_at bigint,
    window_closed boolean DEFAULT false NOT NULL,
    send_until bigint,
    wamid text,
    delivery text,
    error_code bigint,
    error text,
    sent_at bigint,
    updated_at bigint
);


--
-- Name: outbox_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.outbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: outbox_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.outbox_id_seq OWNED BY public.outbox.id;


--
-- Name: quarantine; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.quarantine (
    id bigint NOT NULL,
    channel text NOT NULL,
    received_at bigint NOT NULL,
    reason text NOT NULL,
    raw text NOT NULL,
    hash bytea NOT NULL
);


--
-- Name: quarantine_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.quarantine_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: quarantine_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.quarantine_id_seq OWNED BY public.quarantine.id;


--
-- Name: review; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.review (
    id bigint NOT NULL,
    batch_id bigint NOT NULL,
    outbox_id bigint,
    reason text NOT NULL,
    error text,
    state text NOT NULL,
    created_at bigint NOT NULL,
    resolved_at bigint,
    resolution text,
    resolution_note text
);


--
-- Name: review_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.review_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: review_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.review_id_seq OWNED BY public.review.id;


--
-- Name: sabi_schema; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.sabi_schema (
    version integer NOT NULL
);


--
-- Name: batches id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.batches ALTER COLUMN id SET DEFAULT nextval('public.batches_id_seq'::regclass);


--
-- Name: conversations id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.conversations ALTER COLUMN id SET DEFAULT nextval('public.conversations_id_seq'::regclass);


--
-- Name: inbox seq; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.inbox ALTER COLUMN seq SET DEFAULT nextval('public.inbox_seq_seq'::regclass);


--
-- Name: outbox id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox ALTER COLUMN id SET DEFAULT nextval('public.outbox_id_seq'::regclass);


--
-- Name: quarantine id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.quarantine ALTER COLUMN id SET DEFAULT nextval('public.quarantine_id_seq'::regclass);


--
-- Name: review id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.review ALTER COLUMN id SET DEFAULT nextval('public.review_id_seq'::regclass);


--
-- Data for Name: batches; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.batches (id, conversation_id, state, token, attempts, lease_until, next_attempt_at, due_at, created_at, started_at, finished_at, last_error, stage, prompt_tokens, completion_tokens, cost, requeued) VALUES (1, 1, 'done', 1, 1, NULL, NULL, 1781000010000, 1781000020000, 1781000020000, 1781000021000, NULL, NULL, NULL, NULL, NULL, false);
INSERT INTO public.batches (id, conversation_id, state, token, attempts, lease_until, next_attempt_at, due_at, created_at, started_at, finished_at, last_error, stage, prompt_tokens, completion_tokens, cost, requeued) VALUES (2, 3, 'review', 1, 1, NULL, NULL, 1781000010000, 1781000020000, 1781000020000, 1781000021000, 'the customer asked for a person', NULL, NULL, NULL, NULL, false);


--
-- Data for Name: chat_jobs; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.chat_jobs (job_id, session_id, message_key, inbox_seq, created_at, expires_at) VALUES ('job-1', 'session-1', '9:session-1:m-1', 5, 1781000031000, 1781086431000);


--
-- Data for Name: conversations; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.conversations (id, channel, business, customer, first_pending_at, last_pending_at, due_at, open_batch_id, send_after, last_inbound_at, requeued) VALUES (3, 'whatsapp', '100000000000001', '2348022222222', NULL, NULL, NULL, NULL, NULL, 1780999999000, false);
INSERT INTO public.conversations (id, channel, business, customer, first_pending_at, last_pending_at, due_at, open_batch_id, send_after, last_inbound_at, requeued) VALUES (1, 'whatsapp', '100000000000001', '2348011111111', 1781000030000, 1781000030000, 1781000040000, NULL, NULL, 1781000029000, false);
INSERT INTO public.conversations (id, channel, business, customer, first_pending_at, last_pending_at, due_at, open_batch_id, send_after, last_inbound_at, requeued) VALUES (5, 'webchat', 'web', 'session-1', 1781000031000, 1781000031000, 1781000031000, NULL, NULL, 1781000031000, false);


--
-- Data for Name: inbox; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.inbox (seq, channel, dedupe_key, kind, business, customer, item_type, text, media_id, provider_ts, received_at, state, conversation_id, batch_id, content_hash, facts) VALUES (1, 'whatsapp', 'wamid.A1', 'message', '100000000000001', '2348011111111', 'text', 'Abeg, wetin be my account balance?', NULL, 1780999998, 1781000000000, 'answered', 1, 1, '\xd774b04d28fe7a90bedc033a50aaea9a', '{"from":"2348011111111","id":"wamid.A1","text":"Abeg, wetin be my account balance?","timestamp":1780999998,"type":"text"}');
INSERT INTO public.inbox (seq, channel, dedupe_key, kind, business, customer, item_type, text, media_id, provider_ts, received_at, state, conversation_id, batch_id, content_hash, facts) VALUES (2, 'whatsapp', 'wamid.A2', 'message', '100000000000001', '2348011111111', 'text', 'and my last transfer', NULL, 1780999999, 1781000000000, 'answered', 1, 1, '\x4192ab82ccfdc2e17c77fb9eaf4e4768', '{"from":"2348011111111","id":"wamid.A2","text":"and my last transfer","timestamp":1780999999,"type":"text"}');
INSERT INTO public.inbox (seq, channel, dedupe_key, kind, business, customer, item_type, text, media_id, provider_ts, received_at, state, conversation_id, batch_id, content_hash, facts) VALUES (3, 'whatsapp', 'wamid.B1', 'message', '100000000000001', '2348022222222', 'text', 'I wan talk to person', NULL, 1780999999, 1781000000000, 'review', 3, 2, '\xa4c70a5c1bcd5e00736baaa11321ee94', '{"from":"2348022222222","id":"wamid.B1","text":"I wan talk to person","timestamp":1780999999,"type":"text"}');
INSERT INTO public.inbox (seq, channel, dedupe_key, kind, business, customer, item_type, text, media_id, provider_ts, received_at, state, conversation_id, batch_id, content_hash, facts) VALUES (4, 'whatsapp', 'wamid.A3', 'message', '100000000000001', '2348011111111', 'text', 'thank you', NULL, 1781000029, 1781000030000, 'pending', 1, NULL, '\xe6e65d2bf04f1fa729d456a0a67a87a4', '{"from":"2348011111111","id":"wamid.A3","text":"thank you","timestamp":1781000029,"type":"text"}');
INSERT INTO public.inbox (seq, channel, dedupe_key, kind, business, customer, item_type, text, media_id, provider_ts, received_at, state, conversation_id, batch_id, content_hash, facts) VALUES (5, 'webchat', '9:session-1:m-1', 'message', 'web', 'session-1', 'text', 'Do you open on Saturday?', NULL, NULL, 1781000031000, 'pending', 5, NULL, '\x92bb0f2a4364ca669dbec00ea429af6b', '{"address":"203.0.113.7","job_id":"job-1","kind":"message","message_id":"m-1","session_id":"session-1","type":"text","user_id":null}');


--
-- Data for Name: outbox; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.outbox (id, batch_id, part, channel, business, customer, body, state, created_at, conversation_id, options, reply_to, kind, attempts, failures, next_attempt_at, window_closed, send_until, wamid, delivery, error_code, error, sent_at, updated_at) VALUES (1, 1, 0, 'whatsapp', '100000000000001', '2348011111111', 'Your balance is NGN 5,000.', 'queued', 1781000021000, 1, NULL, NULL, 'text', 0, 0, NULL, false, NULL, NULL, NULL, NULL, NULL, NULL, 1781000021000);
INSERT INTO public.outbox (id, batch_id, part, channel, business, customer, body, state, created_at, conversation_id, options, reply_to, kind, attempts, failures, next_attempt_at, window_closed, send_until, wamid, delivery, error_code, error, sent_at, updated_at) VALUES (2, 1, 1, 'whatsapp', '100000000000001', '2348011111111', 'Your last transfer was NGN 1,200.', 'queued', 1781000021000, 1, NULL, NULL, 'text', 0, 0, NULL, false, NULL, NULL, NULL, NULL, NULL, NULL, 1781000021000);


--
-- Data for Name: quarantine; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.quarantine (id, channel, received_at, reason, raw, hash) VALUES (1, 'whatsapp', 1781000000000, 'unknown shape', '{"object":"page"}', '\x0c3c92fc0a6b7c4b4c3f1e64d9335880');


--
-- Data for Name: review; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.review (id, batch_id, outbox_id, reason, error, state, created_at, resolved_at, resolution, resolution_note) VALUES (1, 2, NULL, 'handoff_asked', 'the customer asked for a person', 'open', 1781000021000, NULL, NULL, NULL);


--
-- Data for Name: sabi_schema; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.sabi_schema (version) VALUES (1);


--
-- Name: batches_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.batches_id_seq', 2, true);


--
-- Name: conversations_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.conversations_id_seq', 5, true);


--
-- Name: inbox_seq_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.inbox_seq_seq', 5, true);


--
-- Name: outbox_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.outbox_id_seq', 2, true);


--
-- Name: quarantine_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.quarantine_id_seq', 1, true);


--
-- Name: review_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.review_id_seq', 1, true);


--
-- Name: batches batches_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.batches
    ADD CONSTRAINT batches_pkey PRIMARY KEY (id);


--
-- Name: chat_jobs chat_jobs_message_key_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.chat_jobs
    ADD CONSTRAINT chat_jobs_message_key_key UNIQUE (message_key);


--
-- Name: chat_jobs chat_jobs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.chat_jobs
    ADD CONSTRAINT chat_jobs_pkey PRIMARY KEY (job_id);


--
-- Name: conversations conversations_channel_business_customer_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.conversations
    ADD CONSTRAINT conversations_channel_business_customer_key UNIQUE (channel, business, customer);


--
-- Name: conversations conversations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.conversations
    ADD CONSTRAINT conversations_pkey PRIMARY KEY (id);


--
-- Name: inbox inbox_channel_dedupe_key_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.inbox
    ADD CONSTRAINT inbox_channel_dedupe_key_key UNIQUE (channel, dedupe_key);


--
-- Name: inbox inbox_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.inbox
    ADD CONSTRAINT inbox_pkey PRIMARY KEY (seq);


--
-- Name: outbox outbox_batch_id_part_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_batch_id_part_key UNIQUE (batch_id, part);


--
-- Name: outbox outbox_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);


--
-- Name: quarantine quarantine_channel_hash_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.quarantine
    ADD CONSTRAINT quarantine_channel_hash_key UNIQUE (channel, hash);


--
-- Name: quarantine quarantine_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.quarantine
    ADD CONSTRAINT quarantine_pkey PRIMARY KEY (id);


--
-- Name: review review_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.review
    ADD CONSTRAINT review_pkey PRIMARY KEY (id);


--
-- Name: batches_conversation; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX batches_conversation ON public.batches USING btree (conversation_id, id);


--
-- Name: batches_finished; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX batches_finished ON public.batches USING btree (finished_at);


--
-- Name: batches_running; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX batches_running ON public.batches USING btree (lease_until) WHERE (state = 'running'::text);


--
-- Name: batches_waiting; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX batches_waiting ON public.batches USING btree (next_attempt_at) WHERE (state = 'waiting'::text);


--
-- Name: chat_jobs_session; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX chat_jobs_session ON public.chat_jobs USING btree (session_id, created_at);


--
-- Name: conversations_customer; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX conversations_customer ON public.conversations USING btree (customer);


--
-- Name: conversations_due; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX conversations_due ON public.conversations USING btree (due_at) WHERE (due_at IS NOT NULL);


--
-- Name: inbox_batch; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX inbox_batch ON public.inbox USING btree (batch_id) WHERE (batch_id IS NOT NULL);


--
-- Name: inbox_pending; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX inbox_pending ON public.inbox USING btree (conversation_id) WHERE (state = 'pending'::text);


--
-- Name: inbox_webchat_pending; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX inbox_webchat_pending ON public.inbox USING btree (seq) WHERE ((state = 'pending'::text) AND (channel = 'webchat'::text));


--
-- Name: outbox_active; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_active ON public.outbox USING btree (conversation_id, id) WHERE (state = ANY (ARRAY['queued'::text, 'sending'::text, 'unknown'::text, 'window_closed'::text]));


--
-- Name: outbox_due; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_due ON public.outbox USING btree (id) WHERE (state = ANY (ARRAY['queued'::text, 'window_closed'::text]));


--
-- Name: outbox_sending; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_sending ON public.outbox USING btree (send_until) WHERE (state = 'sending'::text);


--
-- Name: outbox_unknown; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX outbox_unknown ON public.outbox USING btree (send_until) WHERE (state = 'unknown'::text);


--
-- Name: outbox_wamid; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX outbox_wamid ON public.outbox USING btree (wamid) WHERE (wamid IS NOT NULL);


--
-- Name: review_batch; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX review_batch ON public.review USING btree (batch_id) WHERE (outbox_id IS NULL);


--
-- Name: review_open; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX review_open ON public.review USING btree (id) WHERE (state = 'open'::text);


--
-- Name: review_outbox; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX review_outbox ON public.review USING btree (outbox_id) WHERE (outbox_id IS NOT NULL);


--
-- Name: batches batches_conversation_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.batches
    ADD CONSTRAINT batches_conversation_id_fkey FOREIGN KEY (conversation_id) REFERENCES public.conversations(id);


--
-- Name: outbox outbox_batch_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_batch_id_fkey FOREIGN KEY (batch_id) REFERENCES public.batches(id);


--
-- Name: review review_batch_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.review
    ADD CONSTRAINT review_batch_id_fkey FOREIGN KEY (batch_id) REFERENCES public.batches(id);


--
-- PostgreSQL database dump complete
--


