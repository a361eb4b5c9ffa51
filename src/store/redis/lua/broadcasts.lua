-- Broadcasts. P:bc:<id> hash a broadcast; P:bckey hash key -> id; P:bcs zset of ids;
-- P:bc:<id>:r zset of its recipients in audience order; P:bc:<id>:st:<state> zset of its
-- recipients in each state (counted by ZCARD); P:br:<id> hash a recipient. State names and
-- which moves are allowed come in the arguments, from the rulebook (store/rules/broadcast.rs).

local function broadcast_view(id, states)
  local b = get(k('bc', id), 'key', 'name', 'template', 'language', 'business', 'state',
    'paused_because', 'created', 'start', 'deadline', 'rate')
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
    deadline = a['until'], rate = a.rate,
  })
  if a.key then
    redis.call('HSET', k('bckey'), a.key, int(id))
  end
  redis.call('ZADD', k('bcs'), int(id), int(id))
  for _, r in ipairs(a.recipients) do
    local rid = redis.call('HINCRBY', k('ids'), 'recipient', 1)
    put(k('br', rid), {
      bc = id, to = r.to, params = r.params, line = r.line, state = r.state,
      skipped = r.skipped, error = r.error,
    })
    redis.call('ZADD', k('bc', id, 'r'), rid, int(rid))
    redis.call('ZADD', k('bc', id, 'st', r.state), rid, int(rid))
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

local function broadcast_recipients(a)
  local set = a.state and k('bc', a.id, 'st', a.state) or k('bc', a.id, 'r')
  local out = {}
  for _, rid in ipairs(redis.call('ZRANGE', set, 0, a.limit - 1)) do
    local r = get(k('br', rid), 'to', 'params', 'line', 'state', 'skipped', 'error',
      'error_code', 'wamid')
    r.id, r.line, r.error_code = tonumber(rid), tonumber(r.line), tonumber(r.error_code)
    out[#out + 1] = r
  end
  return out
end

-- Moves a broadcast from one of `from` to `to`; a cancel moves every recipient still in one of
-- `waiting` to `cancelled`.
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
  if a.reason then
    put(k('bc', a.id), {paused_because = a.reason})
  else
    redis.call('HDEL', k('bc', a.id), 'paused_because')
  end
  for _, waiting in ipairs(a.waiting or {}) do
    local from = k('bc', a.id, 'st', waiting)
    for _, rid in ipairs(redis.call('ZRANGE', from, 0, -1)) do
      put(k('br', rid), {state = a.cancelled})
      redis.call('HDEL', k('br', rid), 'next')
      redis.call('ZADD', k('bc', a.id, 'st', a.cancelled), rid, rid)
    end
    redis.call('DEL', from)
  end
  return broadcast_view(a.id, a.states)
end
