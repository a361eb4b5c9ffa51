-- Deliveries and web-chat questions in, and the inbox and quarantine read back.

local function conversation_of(turn)
  local name = turn.ch .. '\n' .. turn.biz .. '\n' .. turn.cust
  local id = redis.call('HGET', k('ckey'), name)
  if id then
    return id
  end
  id = int(redis.call('HINCRBY', k('ids'), 'conversation', 1))
  redis.call('HSET', k('ckey'), name, id)
  put(k('c', id), {ch = turn.ch, biz = turn.biz, cust = turn.cust})
  redis.call('ZADD', k('cust', turn.cust), id, id)
  return id
end

-- Due one window after the latest message, never later than the cap after the first; the
-- message joins its conversation's pending ones. A message for the model puts the
-- conversation in the model's lane until a batch takes it.
local function schedule(turn, d, sent_at, seq)
  local conv = conversation_of(turn)
  local c = get(k('c', conv), 'first', 'last_in', 'open')
  local first = tonumber(c.first) or d.recv
  local due = math.min(d.recv + d.window, first + d.cap)
  put(k('c', conv), {
    first = first, due = due, last_in = math.max(tonumber(c.last_in) or 0, sent_at),
  })
  if turn.model then
    redis.call('HSET', k('c', conv), 'model', 1)
  end
  put(k('in', seq), {conv = conv})
  redis.call('ZADD', k('c', conv, 'pend'), int(seq), int(seq))
  if not c.open then
    mark_due(conv, due)
  end
  return due
end

-- A customer's deletion or edit of a message that still waits for its turn: an edit replaces
-- its text; a deletion takes it out of its batch, and a conversation left with nothing pending
-- is no longer due. A message already in a turn is left as it is.
local function amend(ch, change)
  local seq = redis.call('HGET', k('dedupe'), ch .. '\n' .. change.original)
  if not seq then
    return
  end
  local i = get(k('in', seq), 'state', 'conv')
  if i.state ~= ITEM.pending then
    return
  end
  if change.text then
    put(k('in', seq), {text = change.text})
    return
  end
  put(k('in', seq), {state = ITEM.withdrawn})
  redis.call('ZADD', k('aged', 'msg'), redis.call('HGET', k('in', seq), 'recv'), seq)
  local pending = k('c', i.conv, 'pend')
  redis.call('ZREM', pending, seq)
  if redis.call('ZCARD', pending) == 0 then
    redis.call('HDEL', k('c', i.conv), 'first', 'due', 'model')
    unmark_due(i.conv)
  end
end

-- A customer's message is the reply to the broadcast they were last sent, if that came after
-- `d.reply_since` and had none yet.
local function note_reply(customer, d)
  local rid = redis.call('HGET', k('brlast'), customer)
  if not rid then
    return
  end
  local r = get(k('br', rid), 'sent', 'replied')
  local sent = tonumber(r.sent)
  if sent and not r.replied and sent > d.reply_since and sent <= d.recv then
    redis.call('HSET', k('br', rid), 'replied', int(d.recv))
  end
end

-- A person's reply from the WhatsApp Business app (an echo): it holds the conversation until
-- `it.held_until` (store::rules::review::person_holds), and takes its place in the
-- conversation's history as the business's word, in a batch of its own that a person answered.
local function person_replied(it, d, seq)
  if not (it.biz and it.cust) then
    return
  end
  local conv = conversation_of({ch = it.ch, biz = it.biz, cust = it.cust})
  local held = tonumber(redis.call('HGET', k('c', conv), 'held')) or 0
  put(k('c', conv), {held = math.max(held, it.held_until)})
  local id = redis.call('HINCRBY', k('ids'), 'batch', 1)
  put(k('b', id), {
    conv = conv, state = BATCH.review, token = 0, attempts = 0, due = it.sent,
    created = d.recv, started = it.sent, finished = d.recv,
  })
  -- The owner's words are no turn: `turn_stats` counts none (attempts 0).
  redis.call('ZADD', k('finished'), int(d.recv), int(id))
  redis.call('ZADD', k('c', conv, 'batches'), int(id), int(id))
  redis.call('ZADD', k('b', id, 'msgs'), int(seq), int(seq))
  put(k('in', seq), {conv = conv, batch = id})
end

-- store::rules::identity: every id a WhatsApp item names its customer by (`it.ids`, phone
-- numbers first) is linked to one key, the key of the first id that has one, else the first
-- id; the item is kept under the key. Only ids not yet linked to it are written, and only by
-- what links them (`it.link`: a customer's message, an echo; a status only reads).
local function identify(it)
  if not it.ids or #it.ids == 0 then
    return
  end
  local key
  for _, id in ipairs(it.ids) do
    key = redis.call('HGET', k('cid'), it.ch .. '\n' .. id)
    if key then
      break
    end
  end
  key = key or it.ids[1]
  for _, id in ipairs(it.link and it.ids or {}) do
    local name = it.ch .. '\n' .. id
    local was = redis.call('HGET', k('cid'), name)
    if was ~= key then
      if was then
        redis.call('SREM', k('cids', it.ch, was), id)
      end
      redis.call('HSET', k('cid'), name, key)
      redis.call('SADD', k('cids', it.ch, key), id)
    end
  end
  it.cust = key
  if it.turn then
    it.turn.cust = key
  end
end

-- store::rules::price: a message priced for the first time is counted in its hour; a later
-- status updates what it says, and moves its count within that hour.
local function keep_price(p, receipt)
  local name = k('pr', p.key)
  local counted = p.cat .. '\n' .. p.prefix .. '\n' .. p.billed
  local was = redis.call('HMGET', name, 'hour', 'cat', 'prefix', 'billed')
  redis.call('HSET', name, 'cat', p.cat, 'prefix', p.prefix, 'type', p.type, 'billed', p.billed)
  if was[1] then
    local before = was[2] .. '\n' .. was[3] .. '\n' .. was[4]
    if before ~= counted then
      local hour = k('prh', was[1])
      if redis.call('HINCRBY', hour, before, -1) <= 0 then
        redis.call('HDEL', hour, before)
      end
      redis.call('HINCRBY', hour, counted, 1)
    end
    return
  end
  redis.call('HSET', name, 'hour', int(p.hour))
  redis.call('ZADD', k('prk'), int(p.hour), p.key)
  redis.call('ZADD', k('prhours'), int(p.hour), int(p.hour))
  redis.call('HINCRBY', k('prh', int(p.hour)), counted, 1)
  receipt.priced[#receipt.priced + 1] = {p.cat, p.type}
end

-- Messages priced from `a.hour` on, by category, prefix and whether charged.
local function price_counts(a)
  local counts = {}
  for _, hour in ipairs(redis.call('ZRANGEBYSCORE', k('prhours'), int(a.hour), '+inf')) do
    local fields = redis.call('HGETALL', k('prh', hour))
    for i = 1, #fields, 2 do
      counts[fields[i]] = (counts[fields[i]] or 0) + tonumber(fields[i + 1])
    end
  end
  local rows = {}
  for counted, n in pairs(counts) do
    local cat, prefix, billed = string.match(counted, '^(.-)\n(.-)\n(.-)$')
    rows[#rows + 1] = {category = cat, prefix = prefix, billed = billed == 'y', messages = n}
  end
  return rows
end

local function keep_item(it, d, receipt)
  -- Broadcasts went to the number Meta names, the key or not.
  local named = it.cust
  identify(it)
  local seq = redis.call('HINCRBY', k('ids'), 'inbox', 1)
  local state = ITEM.recorded
  if it.kind == 'message' then
    state = it.turn and ITEM.pending or ITEM.skipped
  end
  put(k('in', seq), {
    ch = it.ch, key = it.key, kind = it.kind, biz = it.biz, cust = it.cust, type = it.type,
    text = it.text, media = it.media, pts = it.pts, recv = d.recv, state = state,
    hash = it.hash, facts = it.facts,
  })
  redis.call('HSET', k('dedupe'), it.ch .. '\n' .. it.key, int(seq))
  redis.call('ZADD', k('inbox'), int(seq), int(seq))
  index_item(seq, it.ch, it.cust)
  index_aged(seq, state, d.recv)
  receipt.stored = receipt.stored + 1
  if it.kind == 'field_event' then
    receipt.events[#receipt.events + 1] = it.key
  end
  if it.kind == 'message' and it.ch == 'whatsapp' and named then
    note_reply(named, d)
  end
  if it.turn then
    receipt.due = earliest(receipt.due, schedule(it.turn, d, it.sent, seq))
    if it.ch == 'webchat' then
      redis.call('ZADD', k('wc'), int(seq), int(seq))
    end
  end
  if it.kind == 'echo' then
    person_replied(it, d, seq)
  end
  if it.status then
    reconcile(it.status, d.recv, d.spacing)
  end
  if it.price then
    keep_price(it.price, receipt)
  end
  if it.amends then
    amend(it.ch, it.amends)
  end
end

local function keep_quarantined(q, d, receipt)
  local name = q.ch .. '\n' .. q.hash
  if redis.call('HEXISTS', k('qhash'), name) == 1 then
    return
  end
  local id = redis.call('HINCRBY', k('ids'), 'quarantine', 1)
  put(k('q', id), {ch = q.ch, recv = d.recv, reason = q.reason, raw = q.raw, hash = q.hash})
  redis.call('HSET', k('qhash'), name, int(id))
  redis.call('ZADD', k('quarantine'), int(id), int(id))
  receipt.quarantined = receipt.quarantined + 1
end

-- A whole delivery: each item once per (channel, key); a redelivery with other content is an
-- anomaly, reported and not kept. The keys of field events kept for the first time are
-- reported too, for the caller to act on once.
local function ingest(d)
  local receipt = {
    stored = 0, duplicates = 0, anomalies = {}, events = {}, quarantined = 0, priced = {},
  }
  for _, it in ipairs(d.items) do
    local seen = redis.call('HGET', k('dedupe'), it.ch .. '\n' .. it.key)
    if not seen and redis.call('HEXISTS', k('erased'), it.kh) == 1 then
      -- A retry of an item erased since: known, and nothing to keep.
      receipt.duplicates = receipt.duplicates + 1
    elseif not seen then
      keep_item(it, d, receipt)
    elseif redis.call('HGET', k('in', seen), 'hash') == it.hash then
      receipt.duplicates = receipt.duplicates + 1
    else
      receipt.anomalies[#receipt.anomalies + 1] = it.key
    end
  end
  for _, q in ipairs(d.quarantined) do
    keep_quarantined(q, d, receipt)
  end
  return receipt
end

-- Deliveries that arrived together: each stored as `ingest` stores it alone, in order. A
-- delivery whose run fails answers with its error in its place; the others are kept.
local function ingest_many(a)
  local answers = {}
  for i, d in ipairs(a.deliveries) do
    local ok, receipt = pcall(ingest, d)
    if not ok then
      answers[i] = {err = type(receipt) == 'table' and receipt.err or tostring(receipt)}
    elseif receipt.__error then
      answers[i] = {err = receipt.__error}
    else
      answers[i] = {ok = receipt}
    end
  end
  return answers
end

local function set_transcript(a)
  local seq = redis.call('HGET', k('dedupe'), a.ch .. '\n' .. a.key)
  if seq then
    redis.call('HSETNX', k('in', seq), 'text', a.text)
  end
  return true
end

-- Pages of the inbox and of the quarantine: a bounded scan per call, so that listing a large
-- store never holds Redis for long; the caller goes on from `last`.
local SCAN = 500

-- An inbox item as a listing shows it.
local function item_view(seq)
  local i = get(k('in', seq), 'ch', 'key', 'kind', 'biz', 'cust', 'type', 'text', 'media',
    'pts', 'recv', 'state', 'batch', 'facts')
  return {
    seq = tonumber(seq), ch = i.ch, key = i.key, kind = i.kind, biz = i.biz, cust = i.cust,
    type = i.type, text = i.text, media = i.media, pts = tonumber(i.pts),
    recv = tonumber(i.recv), state = i.state, batch = tonumber(i.batch), facts = i.facts,
  }
end

local function inbox(a)
  local page = redis.call('ZRANGEBYSCORE', k('inbox'), '(' .. int(a.after), '+inf', 'LIMIT', 0,
    SCAN)
  local items = {}
  for _, seq in ipairs(page) do
    local i = item_view(seq)
    if (not a.kind or i.kind == a.kind) and (not a.ch or i.ch == a.ch) and #items < a.limit then
      items[#items + 1] = i
    end
  end
  return {items = items, last = tonumber(page[#page]), more = #page == SCAN}
end

local function quarantine(a)
  local page = redis.call('ZRANGEBYSCORE', k('quarantine'), '(' .. int(a.after), '+inf',
    'LIMIT', 0, math.min(a.limit, SCAN))
  local items = {}
  for _, id in ipairs(page) do
    local q = get(k('q', id), 'ch', 'recv', 'reason', 'raw')
    items[#items + 1] = {
      id = tonumber(id), ch = q.ch, recv = tonumber(q.recv), reason = q.reason, raw = q.raw,
    }
  end
  return {items = items, last = tonumber(page[#page]), more = #page == SCAN}
end

local function outbox(a)
  local page = redis.call('ZRANGEBYSCORE', k('outbox'), '(' .. int(a.after), '+inf', 'LIMIT', 0,
    math.min(a.limit, SCAN))
  local items = {}
  for _, id in ipairs(page) do
    items[#items + 1] = part_entry(id)
  end
  return {items = items, last = tonumber(page[#page]), more = #page == SCAN}
end
