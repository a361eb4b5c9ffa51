-- The key layout's version (P:schema) and the store's epoch (P:epoch), run at every start after
-- keys.lua: a new prefix is written in this build's layout; keys of an older layout are
-- upgraded in place, one step per version; a newer layout is refused. Redis runs the script
-- alone, so nodes starting together upgrade once, and a node serves only once its layout is
-- whole. A step runs inside this one script, blocking the server while it runs, so it must stay
-- cheap, or do its work a slice per call and answer false until it is done (the caller then
-- calls again); and it must be safe to run twice: Redis keeps the writes of a script that fails
-- halfway, and the version moves only after its step.
--
-- ARGV[1] is this build's layout version, ARGV[2] a fresh epoch, kept when the store has none.
-- Returns {the version found (0 for a new prefix), the epoch, 1 when a step stopped partway},
-- or the error reply "SABI_NEWER_LAYOUT <version>" before any write.

-- Layout 2: a web-chat session's recent questions (P:sr:<session>) serve only its limit per
-- minute, and are kept for the last minute alone (submit_chat trims them); this trims those of
-- every session, found through the jobs, by the server's clock.
local function keep_the_last_minute_of_questions()
  local now = redis.call('TIME')
  local minute_ago = tonumber(now[1]) * 1000 - 60000
  local cursor = '0'
  repeat
    local page = redis.call('HSCAN', k('jobkey'), cursor, 'COUNT', 1000)
    cursor = page[1]
    for i = 2, #page[2], 2 do
      local session = redis.call('HGET', k('job', page[2][i]), 'session')
      if session then
        redis.call('ZREMRANGEBYSCORE', k('sr', session), '-inf', '(' .. int(minute_ago))
      end
    end
  until cursor == '0'
  return true
end

-- Layout 3: a customer's items (P:ci:...), the account's (P:acct) and a customer's broadcast
-- recipients (P:brto:...) are indexed, so export and erasure never read the whole store. Built
-- in one pass over every inbox item and then every recipient, by id, at the first start of this
-- build: about 6 s of the server's time per million (measured on two cores), so it goes a slice
-- per call, holding the server some 30 ms at a time, and P:upgrade keeps the place. Nodes of
-- this build wait for it; what nodes of the last build keep meanwhile gets a higher id, so a
-- later slice indexes it.
local SLICE = 5000

local function index_seq(seq)
  local i = redis.call('HMGET', k('in', seq), 'ch', 'cust')
  if i[1] then
    index_item(seq, i[1], i[2])
  end
end

local function index_recipient(rid)
  local to = redis.call('HGET', k('br', rid), 'to')
  if to then
    redis.call('ZADD', k('brto', to), rid, rid)
  end
end

-- Runs `each` on up to `budget` ids of the `counter` (P:ids) not yet passed; the budget left.
local function pass(counter, each, budget)
  local from = tonumber(redis.call('HGET', k('upgrade'), counter)) or 0
  local last = math.min(from + budget, tonumber(redis.call('HGET', k('ids'), counter)) or 0)
  for id = from + 1, last do
    each(id)
  end
  redis.call('HSET', k('upgrade'), counter, int(last))
  return budget - (last - from)
end

local function index_customers()
  local left = pass('recipient', index_recipient, pass('inbox', index_seq, SLICE))
  if left == 0 then
    return false
  end
  redis.call('DEL', k('upgrade'))
  return true
end

-- Layout 4: retention (retention.lua) finds what expires by its own age in P:aged:msg and
-- P:aged:rec, erased keys by time in P:erasedt, and a quarantined part's P:qhash entry through
-- the hash kept on the part. Built a slice per call as layout 3 is: the inbox by id, then the
-- erased keys and the quarantine's hashes by HSCAN, P:upgrade keeping the place.
local function aged_seq(seq)
  local i = redis.call('HMGET', k('in', seq), 'state', 'recv')
  if i[1] then
    index_aged(seq, i[1], tonumber(i[2]))
  end
end

-- Runs `each(field, value)` on a slice of hash P:<name>; true once every field was passed.
local function scan(name, each)
  local cursor = redis.call('HGET', k('upgrade'), 'scan:' .. name) or '0'
  if cursor == 'done' then
    return true
  end
  local page = redis.call('HSCAN', k(name), cursor, 'COUNT', SLICE)
  for i = 1, #page[2], 2 do
    each(page[2][i], page[2][i + 1])
  end
  local next = page[1] == '0' and 'done' or page[1]
  redis.call('HSET', k('upgrade'), 'scan:' .. name, next)
  return next == 'done'
end

local function erased_by_time(hash, at)
  redis.call('ZADD', k('erasedt'), at, hash)
end

local function hash_on_part(name, id)
  local hash = string.match(name, '\n(.*)$')
  if hash and redis.call('EXISTS', k('q', id)) == 1 then
    redis.call('HSET', k('q', id), 'hash', hash)
  end
end

local function index_for_retention()
  if pass('inbox', aged_seq, SLICE) == 0 or not scan('erased', erased_by_time)
    or not scan('qhash', hash_on_part) then
    return false
  end
  redis.call('DEL', k('upgrade'))
  return true
end

-- UPGRADES[n] takes keys of layout n - 1 to layout n.
local UPGRADES = {
  [2] = keep_the_last_minute_of_questions,
  [3] = index_customers,
  [4] = index_for_retention,
}

local current = tonumber(ARGV[1])
local stored = redis.call('GET', k('schema'))
local found = tonumber(stored) or 0
if stored and (found < 1 or found > current) then
  -- A later build's, or one this build cannot even read: never downgraded.
  return redis.error_reply('SABI_NEWER_LAYOUT ' .. stored)
end
local partway = 0
if found == 0 then
  -- Every other key is made when first needed, in this build's layout.
  redis.call('SET', k('schema'), int(current))
else
  for version = found + 1, current do
    if not UPGRADES[version]() then
      partway = 1
      break
    end
    redis.call('SET', k('schema'), int(version))
  end
end
redis.call('SET', k('epoch'), ARGV[2], 'NX')
return {found, redis.call('GET', k('epoch')), partway}
