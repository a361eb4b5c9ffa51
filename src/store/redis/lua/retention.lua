-- Retention (store/rules/retention.rs): what is past its horizon goes, a batch of each kind per
-- call, each call one script (all or nothing, and short: it holds the server while it runs).
-- The caller asks `sweep_keys` first and hashes the keys of the messages about to go (Lua has
-- no SHA-256); `sweep` then leaves alone a message whose key came without a hash, for a later
-- sweep.

-- Whether an ended turn may go: no review of it is open and no reply part of it is on its way.
local function turn_settled(batch)
  local state = redis.call('HGET', k('b', batch), 'state')
  if state ~= BATCH.done and state ~= BATCH.review then
    return false
  end
  for _, id in ipairs(reviews_of(batch)) do
    if redis.call('HGET', k('r', id), 'state') == REVIEW.open then
      return false
    end
  end
  for _, part in ipairs(redis.call('ZRANGE', k('b', batch, 'parts'), 0, -1)) do
    if UNSETTLED[redis.call('HGET', k('o', part), 'state')] then
      return false
    end
  end
  return true
end

-- Up to `a.limit` turns that ended before `a.messages` and may go, oldest first; those that
-- may not yet are passed over, looking at four times the limit at most.
local function ended_turns(a)
  local out = {}
  local ended = redis.call('ZRANGEBYSCORE', k('finished'), '-inf', '(' .. int(a.messages),
    'LIMIT', 0, a.limit * 4)
  for _, batch in ipairs(ended) do
    if #out == a.limit then
      break
    end
    if turn_settled(batch) then
      out[#out + 1] = batch
    end
  end
  return out
end

-- Up to `a.limit` items of `set` (P:aged:...) that came before `before`.
local function aged(set, before, limit)
  return redis.call('ZRANGEBYSCORE', k('aged', set), '-inf', '(' .. int(before), 'LIMIT', 0, limit)
end

-- The messages a sweep would take, as {ch, key}, for the caller to hash.
local function sweep_keys(a)
  local seqs = aged('msg', a.messages, a.limit)
  for _, batch in ipairs(ended_turns(a)) do
    for _, seq in ipairs(redis.call('ZRANGE', k('b', batch, 'msgs'), 0, -1)) do
      seqs[#seqs + 1] = seq
    end
  end
  local keys = {}
  for _, seq in ipairs(seqs) do
    local i = get(k('in', seq), 'ch', 'key')
    keys[#keys + 1] = {ch = i.ch, key = i.key}
  end
  return keys
end

local function hashed(seq, a)
  local i = get(k('in', seq), 'ch', 'key')
  return a.hashes[i.ch .. '\n' .. i.key] ~= nil
end

-- A web-chat question's job.
local function drop_job(seq)
  local i = get(k('in', seq), 'ch', 'key')
  if i.ch ~= 'webchat' then
    return 0
  end
  local job = redis.call('HGET', k('jobkey'), i.key)
  if not job then
    return 0
  end
  local session = redis.call('HGET', k('job', job), 'session')
  if session then
    redis.call('ZREM', k('sj', session), job)
  end
  redis.call('HDEL', k('jobkey'), i.key)
  redis.call('DEL', k('job', job))
  return 1
end

-- A turn goes with its messages (keys kept as hashes), web-chat jobs, reply parts and review
-- items; false, changing nothing, when a message's key has no hash yet.
local function sweep_turn(batch, a, swept)
  local seqs = redis.call('ZRANGE', k('b', batch, 'msgs'), 0, -1)
  for _, seq in ipairs(seqs) do
    if not hashed(seq, a) then
      return false
    end
  end
  for _, seq in ipairs(seqs) do
    swept.chat_jobs = swept.chat_jobs + drop_job(seq)
    erase_item(seq, a, swept)
  end
  erase_said(batch, swept)
  local conv = redis.call('HGET', k('b', batch), 'conv')
  redis.call('ZREM', k('c', conv, 'batches'), batch)
  for _, set in ipairs({'finished', 'running', 'waiting'}) do
    redis.call('ZREM', k(set), batch)
  end
  redis.call('DEL', k('b', batch), k('b', batch, 'msgs'))
  swept.turns = swept.turns + 1
  return true
end

-- A conversation left with nothing, whose customer last wrote before `before`, goes: the last
-- place their number stays (with the links of their ids, when it was their last). 1 when it
-- went.
local function sweep_conversation(conv, before)
  local c = get(k('c', conv), 'ch', 'biz', 'cust', 'open', 'due', 'last_in')
  if not c.ch or c.open or c.due or (tonumber(c.last_in) or 0) >= before then
    return 0
  end
  for _, set in ipairs({'batches', 'pend', 'unsettled'}) do
    if redis.call('ZCARD', k('c', conv, set)) > 0 then
      return 0
    end
  end
  redis.call('HDEL', k('ckey'), c.ch .. '\n' .. c.biz .. '\n' .. c.cust)
  redis.call('ZREM', k('cust', c.cust), conv)
  unmark_due(conv)
  redis.call('ZREM', k('heads'), pad(conv))
  redis.call('DEL', k('c', conv), k('c', conv, 'pend'), k('c', conv, 'batches'),
    k('c', conv, 'unsettled'))
  -- Their last conversation gone, the ids Meta named them by go too.
  if redis.call('ZCARD', k('cust', c.cust)) == 0 then
    unlink(c.ch, c.cust)
  end
  return 1
end

-- Quarantined parts that came before `before`, oldest first (ids rise with time).
local function sweep_quarantine(before, limit)
  local gone = 0
  for _, id in ipairs(redis.call('ZRANGE', k('quarantine'), 0, limit - 1)) do
    local q = get(k('q', id), 'ch', 'recv', 'hash')
    if (tonumber(q.recv) or 0) >= before then
      break
    end
    if q.hash then
      redis.call('HDEL', k('qhash'), q.ch .. '\n' .. q.hash)
    end
    redis.call('ZREM', k('quarantine'), id)
    redis.call('DEL', k('q', id))
    gone = gone + 1
  end
  return gone
end

-- Priced messages counted in hours before `hour`, and each such hour's counts once its last
-- message went: counts read whole hours.
local function sweep_prices(hour, limit)
  local keys = redis.call('ZRANGEBYSCORE', k('prk'), '-inf', '(' .. int(hour), 'LIMIT', 0, limit)
  for _, key in ipairs(keys) do
    redis.call('DEL', k('pr', key))
    redis.call('ZREM', k('prk'), key)
  end
  for _, h in ipairs(redis.call('ZRANGEBYSCORE', k('prhours'), '-inf', '(' .. int(hour))) do
    if redis.call('ZCOUNT', k('prk'), h, h) == 0 then
      redis.call('DEL', k('prh', h))
      redis.call('ZREM', k('prhours'), h)
    end
  end
  return #keys
end

local function sweep(a)
  local swept = {
    turns = 0, messages = 0, replies = 0, reviews = 0, chat_jobs = 0, statuses = 0,
    quarantined = 0, conversations = 0, keys = 0, prices = 0,
  }
  local touched = {}
  for _, batch in ipairs(ended_turns(a)) do
    local conv = redis.call('HGET', k('b', batch), 'conv')
    if sweep_turn(batch, a, swept) then
      touched[conv] = true
    end
  end
  for _, seq in ipairs(aged('msg', a.messages, a.limit)) do
    if hashed(seq, a) then
      local conv = redis.call('HGET', k('in', seq), 'conv')
      erase_item(seq, a, swept)
      if conv then
        touched[conv] = true
      end
    end
  end
  for _, seq in ipairs(aged('rec', a.statuses, a.limit)) do
    local i = get(k('in', seq), 'ch', 'key', 'cust', 'conv')
    if i.ch then
      drop_item(seq, i)
      swept.statuses = swept.statuses + 1
    else
      -- Gone already (an older node's erasure does not know this list).
      redis.call('ZREM', k('aged', 'rec'), seq)
    end
  end
  swept.quarantined = sweep_quarantine(a.quarantine, a.limit)
  local keys = redis.call('ZRANGEBYSCORE', k('erasedt'), '-inf', '(' .. int(a.keys), 'LIMIT', 0,
    a.limit)
  for _, hash in ipairs(keys) do
    redis.call('HDEL', k('erased'), hash)
    redis.call('ZREM', k('erasedt'), hash)
  end
  swept.keys = #keys
  swept.prices = sweep_prices(a.price_hour, a.limit)
  for conv in pairs(touched) do
    swept.conversations = swept.conversations + sweep_conversation(conv, a.messages)
  end
  return swept
end

-- Takes lease `a.name` for `a.holder` until `a.till`, or renews it: unless another holder's
-- time is not up at `a.now` (retention::may_hold).
local function hold_lease(a)
  local l = get(k('lease', a.name), 'holder', 'till')
  if l.holder and l.holder ~= a.holder and tonumber(l.till) > a.now then
    return false
  end
  put(k('lease', a.name), {holder = a.holder, till = a.till})
  return true
end
