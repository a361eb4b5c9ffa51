-- Broadcasts. P:bc:<id> hash a broadcast; P:bckey hash key -> id; P:bcs zset of ids; P:bclive
-- zset of those scheduled, running or paused; P:bc:<id>:r zset of its recipients in audience
-- order; P:bc:<id>:st:<state> zset of its recipients in each state (counted by ZCARD);
-- P:bc:<id>:due zset of its waiting recipients (padded) -> when they may go; P:bcsending zset
-- of recipients being sent (padded) -> when their lease lapses; P:br:<id> hash a recipient;
-- P:brwamid hash Meta's id -> recipient; P:brsent zset customer -> when they were last sent a
-- broadcast, P:brlast hash customer -> that recipient (whose `replied` the ingest sets);
-- P:brto:<customer> zset every recipient naming them.
--
-- The rules are the rulebook's (store/rules/broadcast.rs): state names and allowed moves come
-- in the arguments, and a recipient is moved by the caller, which loads it, asks the rulebook,
-- and saves it here only if it has not moved meanwhile.

local function broadcast_view(id, states)
  local b = get(k('bc', id), 'key', 'name', 'template', 'language', 'business', 'state',
    'paused_because', 'paused_by', 'body', 'quiet_hours', 'tz', 'local_start', 'local_until',
    'created', 'start', 'deadline', 'rate')
  if not b.state then
    return nil
  end
  b.id = tonumber(id)
  b.created, b.start = tonumber(b.created), tonumber(b.start)
  b.deadline, b.rate = tonumber(b.deadline), tonumber(b.rate)
  b.counts = {}
  for _, state in ipairs(states) do
    b.counts[state] = redis.call('ZCARD', k('bc', id, 'st', state))
  end
  return b
end

-- A broadcast and its audience, in one step; a key already used gives its broadcast.
local function create_broadcast(a)
  if a.key then
    local id = redis.call('HGET', k('bckey'), a.key)
    if id then
      return {created = false, broadcast = broadcast_view(id, a.states)}
    end
  end
  local id = redis.call('HINCRBY', k('ids'), 'broadcast', 1)
  put(k('bc', id), {
    key = a.key, name = a.name, template = a.template, language = a.language,
    business = a.business, state = a.state, created = a.now, start = a.start,
    deadline = a['until'], rate = a.rate, body = a.body, quiet_hours = a.quiet_hours, tz = a.tz,
    local_start = a.local_start, local_until = a.local_until,
  })
  if a.key then
    redis.call('HSET', k('bckey'), a.key, int(id))
  end
  redis.call('ZADD', k('bcs'), int(id), int(id))
  redis.call('ZADD', k('bclive'), int(id), int(id))
  for _, r in ipairs(a.recipients) do
    local rid = redis.call('HINCRBY', k('ids'), 'recipient', 1)
    put(k('br', rid), {
      bc = id, to = r.to, params = r.params, line = r.line, state = r.state,
      skipped = r.skipped, error = r.error, tz = r.tz,
    })
    redis.call('ZADD', k('bc', id, 'r'), rid, int(rid))
    redis.call('ZADD', k('brto', r.to), rid, int(rid))
    redis.call('ZADD', k('bc', id, 'st', r.state), rid, int(rid))
    if r.waiting then
      redis.call('ZADD', k('bc', id, 'due'), 0, pad(rid))
    end
  end
  return {created = true, broadcast = broadcast_view(id, a.states)}
end

local function broadcasts(a)
  local out = {}
  for _, id in ipairs(redis.call('ZREVRANGE', k('bcs'), 0, a.limit - 1)) do
    out[#out + 1] = broadcast_view(id, a.states)
  end
  return out
end

local function broadcast(a)
  return broadcast_view(a.id, a.states)
end

local function keyed_broadcast(a)
  local id = redis.call('HGET', k('bckey'), a.key)
  if not id then
    return nil
  end
  return broadcast_view(id, a.states)
end

-- A recipient as a listing shows it.
local function recipient_view(rid)
  local r = get(k('br', rid), 'to', 'params', 'line', 'state', 'skipped', 'error',
    'error_code', 'wamid', 'sent', 'replied', 'tz', 'billed', 'pricing')
  r.id, r.line, r.error_code = tonumber(rid), tonumber(r.line), tonumber(r.error_code)
  if r.billed then
    r.billed = r.billed == '1'
  end
  r.sent, r.replied = tonumber(r.sent), tonumber(r.replied)
  return r
end

local function broadcast_recipients(a)
  local set = a.state and k('bc', a.id, 'st', a.state) or k('bc', a.id, 'r')
  local out = {}
  for _, rid in ipairs(redis.call('ZRANGE', set, 0, a.limit - 1)) do
    out[#out + 1] = recipient_view(rid)
  end
  return out
end

-- Moves a broadcast from one of `from` to `to`, paused by `paused_by` because of `reason` when
-- given; a cancel moves every recipient still in one of `waiting` to `cancelled`.
local function control_broadcast(a)
  local state = redis.call('HGET', k('bc', a.id), 'state')
  local allowed = false
  for _, s in ipairs(a.from) do
    allowed = allowed or s == state
  end
  if not allowed then
    return fail('SABI_NOT_FOUND', 'no broadcast with this id takes this')
  end
  put(k('bc', a.id), {state = a.to})
  if not a.live then
    redis.call('ZREM', k('bclive'), int(a.id))
  end
  if a.reason then
    put(k('bc', a.id), {paused_because = a.reason})
  else
    redis.call('HDEL', k('bc', a.id), 'paused_because')
  end
  if a.paused_by then
    put(k('bc', a.id), {paused_by = a.paused_by})
  else
    redis.call('HDEL', k('bc', a.id), 'paused_by')
  end
  for _, waiting in ipairs(a.waiting or {}) do
    local from = k('bc', a.id, 'st', waiting)
    for _, rid in ipairs(redis.call('ZRANGE', from, 0, -1)) do
      put(k('br', rid), {state = a.cancelled})
      redis.call('HDEL', k('br', rid), 'next')
      redis.call('ZADD', k('bc', a.id, 'st', a.cancelled), rid, rid)
    end
    redis.call('DEL', from)
    redis.call('DEL', k('bc', a.id, 'due'))
  end
  return broadcast_view(a.id, a.states)
end

local RECIPIENT = {'bc', 'to', 'params', 'line', 'state', 'skipped', 'error', 'error_code',
  'wamid', 'delivery', 'attempts', 'failures', 'holds', 'next', 'lease', 'sent', 'tz'}
-- The fields a save may leave empty, cleared when it does.
local OPTIONAL = {'skipped', 'error', 'error_code', 'wamid', 'delivery', 'next', 'lease', 'sent'}

local function recipient_row(rid)
  local r = get(k('br', rid), unpack(RECIPIENT))
  if not r.state then
    return nil
  end
  r.id = tonumber(rid)
  for _, name in ipairs({'bc', 'line', 'error_code', 'attempts', 'failures', 'holds', 'next',
      'lease', 'sent'}) do
    r[name] = tonumber(r[name])
  end
  return r
end

local function recipients_load(a)
  local out = {}
  for _, id in ipairs(a.ids) do
    out[#out + 1] = recipient_row(id)
  end
  return out
end

-- Customers sent a broadcast after `since`, or being sent one: what Meta's messaging limit
-- counts (an upper bound: one being sent who was also sent lately counts twice).
local function reach(since)
  return redis.call('ZCOUNT', k('brsent'), '(' .. since, '+inf') + redis.call('ZCARD', k('bcsending'))
end

-- Each write lands only if its recipient is still in the state and attempt the caller read;
-- `strict` refuses the call instead of skipping such a write. With `reach` ({since, read}),
-- nothing lands unless the messaging limit's count is still what the caller read: a claim
-- sized to the headroom left then is not made beside another node's. Returns the ids written.
local function recipients_save(a)
  local saved = {}
  if a.reach and reach(a.reach.since) ~= a.reach.read then
    return saved
  end
  for _, w in ipairs(a.writes) do
    local key = k('br', w.id)
    local now = get(key, 'state', 'attempts', 'bc')
    if now.state == w.expect_state and (tonumber(now.attempts) or 0) == w.expect_attempts then
      if now.state ~= w.state then
        redis.call('ZREM', k('bc', now.bc, 'st', now.state), int(w.id))
        redis.call('ZADD', k('bc', now.bc, 'st', w.state), int(w.id), int(w.id))
      end
      local fields = {state = w.state, attempts = w.attempts, failures = w.failures,
        holds = w.holds}
      local gone = {}
      for _, name in ipairs(OPTIONAL) do
        if w[name] == nil then
          gone[#gone + 1] = name
        else
          fields[name] = w[name]
        end
      end
      put(key, fields)
      redis.call('HDEL', key, unpack(gone))
      if w.wamid then
        redis.call('HSET', k('brwamid'), w.wamid, int(w.id))
      end
      if w.sent then
        local last = tonumber(redis.call('ZSCORE', k('brsent'), w.to))
        if not last or w.sent >= last then
          redis.call('ZADD', k('brsent'), w.sent, w.to)
          redis.call('HSET', k('brlast'), w.to, int(w.id))
        end
      end
      if w.waiting then
        redis.call('ZADD', k('bc', now.bc, 'due'), w.next or 0, pad(w.id))
      else
        redis.call('ZREM', k('bc', now.bc, 'due'), pad(w.id))
      end
      if w.lease then
        redis.call('ZADD', k('bcsending'), w.lease, pad(w.id))
      else
        redis.call('ZREM', k('bcsending'), pad(w.id))
      end
      saved[#saved + 1] = w.id
    elseif a.strict then
      return fail('SABI_LEASE_LOST', 'the recipient moved since it was read')
    end
  end
  return saved
end

-- Whether Meta charges for each recipient's message, and its pricing category, as a
-- status's pricing said.
local function recipients_bill(a)
  for _, b in ipairs(a.bills) do
    if redis.call('EXISTS', k('br', b.id)) == 1 then
      if b.billed ~= nil then
        redis.call('HSET', k('br', b.id), 'billed', b.billed and 1 or 0)
      end
      if b.pricing then
        redis.call('HSET', k('br', b.id), 'pricing', b.pricing)
      end
    end
  end
  return true
end

-- The recipients statuses name: by Meta's id, or by the (recipient, attempt) of a send whose
-- answer was lost. Each found one carries `i`, the index of its status.
local function recipients_for_statuses(a)
  local out = {}
  for i, st in ipairs(a.statuses) do
    local rid = redis.call('HGET', k('brwamid'), st.wamid)
    if not rid and st.id then
      local r = get(k('br', st.id), 'attempts')
      if tonumber(r.attempts) == st.attempt then
        rid = st.id
      end
    end
    local r = rid and recipient_row(rid)
    if r then
      r.i = i
      out[#out + 1] = r
    end
  end
  return out
end

-- Live broadcasts, for time and Meta's word on their templates to move them on.
local function broadcasts_live(a)
  local out = {}
  for _, id in ipairs(redis.call('ZRANGE', k('bclive'), 0, -1)) do
    local b = get(k('bc', id), 'state', 'start', 'deadline', 'template', 'language', 'paused_by',
      'quiet_hours', 'tz', 'local_start', 'local_until')
    out[#out + 1] = {id = tonumber(id), state = b.state, start = tonumber(b.start),
      deadline = tonumber(b.deadline), template = b.template, language = b.language,
      paused_by = b.paused_by, quiet_hours = b.quiet_hours, tz = b.tz,
      local_start = b.local_start, local_until = b.local_until}
  end
  return out
end

-- Sends whose lease lapsed by `now`.
local function recipients_lapsed(a)
  local out = {}
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', k('bcsending'), '-inf', a.now)) do
    out[#out + 1] = recipient_row(tonumber(m))
  end
  return out
end

-- Recipients that may go at `now`, of running broadcasts (the oldest first) not sent from a
-- halted number, with what their send needs.
local function recipients_due(a)
  local halted = {}
  for _, number in ipairs(a.halted) do
    halted[number] = true
  end
  local out = {}
  for _, id in ipairs(redis.call('ZRANGE', k('bclive'), 0, -1)) do
    if #out >= a.limit then
      break
    end
    local b = get(k('bc', id), 'state', 'business', 'template', 'language', 'rate')
    if b.state == a.running and not halted[b.business] then
      local due = redis.call('ZRANGEBYSCORE', k('bc', id, 'due'), '-inf', a.now, 'LIMIT', 0,
        a.limit - #out)
      for _, m in ipairs(due) do
        local r = recipient_row(tonumber(m))
        r.template, r.language, r.business = b.template, b.language, b.business
        r.rate = tonumber(b.rate)
        local choice = redis.call('HGET', k('consent'), r.to)
        r.opted_out = choice and cjson.decode(choice).opted_out or false
        local sent = tonumber(redis.call('ZSCORE', k('brsent'), r.to))
        r.in_cooldown = sent ~= nil and sent > a.cooled
        out[#out + 1] = r
      end
    end
  end
  return out
end

local function broadcast_reach(a)
  return reach(a.since)
end

-- The earliest latest send after `since` (cjson's null when none).
local function broadcast_first_reach(a)
  local first = redis.call('ZRANGEBYSCORE', k('brsent'), '(' .. a.since, '+inf', 'WITHSCORES',
    'LIMIT', 0, 1)
  if first[2] then
    return tonumber(first[2])
  end
  return cjson.null
end

-- Running broadcasts with nobody waiting or being sent are finished.
local function broadcasts_finish(a)
  for _, id in ipairs(redis.call('ZRANGE', k('bclive'), 0, -1)) do
    if redis.call('HGET', k('bc', id), 'state') == a.running then
      local left = redis.call('ZCARD', k('bc', id, 'st', a.sending))
      for _, waiting in ipairs(a.waiting) do
        left = left + redis.call('ZCARD', k('bc', id, 'st', waiting))
      end
      if left == 0 then
        put(k('bc', id), {state = a.finished})
        redis.call('ZREM', k('bclive'), id)
      end
    end
  end
  return true
end

-- Customers' choices about broadcasts: P:consent hash customer -> the latest choice as JSON
-- ({opted_out, source, at}). The rule (store/rules/consent.rs) is the caller's, which saves a
-- choice only over the one it read.
local function consents(a)
  local out = {}
  for _, customer in ipairs(a.customers) do
    local choice = redis.call('HGET', k('consent'), customer)
    if choice then
      out[#out + 1] = {customer = customer, choice = choice}
    end
  end
  return out
end

local function consent_save(a)
  local kept = redis.call('HGET', k('consent'), a.customer)
  if (kept or nil) ~= a.expect then
    return false
  end
  redis.call('HSET', k('consent'), a.customer, a.choice)
  return true
end

-- Those of `customers` sent a broadcast after `since`.
local function sent_since(a)
  local out = {}
  for _, customer in ipairs(a.customers) do
    local sent = tonumber(redis.call('ZSCORE', k('brsent'), customer))
    if sent and sent > a.since then
      out[#out + 1] = customer
    end
  end
  return out
end

-- The last broadcast `customer` was sent: when, with which parameters, of which template and
-- body, from which number.
local function last_broadcast(a)
  local rid = redis.call('HGET', k('brlast'), a.customer)
  if not rid then
    return {}
  end
  local r = get(k('br', rid), 'sent', 'params', 'bc')
  local b = get(k('bc', r.bc), 'template', 'body', 'business')
  return {{sent = tonumber(r.sent), params = r.params, template = b.template, body = b.body,
    business = b.business}}
end
