-- A customer's data (store/rules/erasure.rs): everything about them, read in one script so it
-- is one snapshot, and erasure in one script so it is all or nothing. Both read the customer's
-- indexes (P:ci, P:cust, P:brto) and the account's items (P:acct), never the whole store;
-- only the quarantine is read whole, for raw parts that are theirs.

-- Their conversations on channel `ch`.
local function conversations_of(ch, cust)
  local out = {}
  for _, conv in ipairs(redis.call('ZRANGE', k('cust', cust), 0, -1)) do
    if redis.call('HGET', k('c', conv), 'ch') == ch then
      out[#out + 1] = conv
    end
  end
  return out
end

-- The batches of their conversations, in id order.
local function batches_of(convs)
  local out = {}
  for _, conv in ipairs(convs) do
    for _, batch in ipairs(redis.call('ZRANGE', k('c', conv, 'batches'), 0, -1)) do
      out[#out + 1] = tonumber(batch)
    end
  end
  table.sort(out)
  return out
end

-- A batch's review items: the batch's own and its parts'.
local function reviews_of(batch)
  local out = {}
  local own = redis.call('HGET', k('rbatch'), int(batch))
  if own then
    out[#out + 1] = tonumber(own)
  end
  for _, part in ipairs(redis.call('ZRANGE', k('b', batch, 'parts'), 0, -1)) do
    local id = redis.call('HGET', k('rout'), part)
    if id then
      out[#out + 1] = tonumber(id)
    end
  end
  return out
end

local function review_record(id)
  local r = get(k('r', id), 'batch', 'reason', 'state', 'err', 'created', 'resolved', 'note')
  return {
    id = id, batch = tonumber(r.batch), reason = r.reason, state = r.state, error = r.err,
    created = tonumber(r.created), resolved = tonumber(r.resolved), note = r.note,
  }
end

-- One page: the items after a.items_after and the reply parts after a.replies_after, at most
-- a.limit of each (-1: all); hand-offs, broadcasts and the choice whole.
local function customer_export(a)
  local items = {}
  local seqs = redis.call('ZRANGEBYSCORE', k('ci', a.ch, a.cust), '(' .. int(a.items_after),
    '+inf', 'LIMIT', 0, a.limit)
  for _, seq in ipairs(seqs) do
    items[#items + 1] = item_view(seq)
  end
  local part_ids, reviews = {}, {}
  for _, batch in ipairs(batches_of(conversations_of(a.ch, a.cust))) do
    for _, part in ipairs(redis.call('ZRANGE', k('b', batch, 'parts'), 0, -1)) do
      if tonumber(part) > a.replies_after then
        part_ids[#part_ids + 1] = tonumber(part)
      end
    end
    for _, id in ipairs(reviews_of(batch)) do
      reviews[#reviews + 1] = review_record(id)
    end
  end
  table.sort(part_ids)
  local parts = {}
  for _, part in ipairs(part_ids) do
    if a.limit >= 0 and #parts >= a.limit then
      break
    end
    parts[#parts + 1] = part_entry(int(part))
  end
  table.sort(reviews, function(x, y) return x.id < y.id end)
  local sends = {}
  local consent
  if a.ch == 'whatsapp' then
    for _, rid in ipairs(redis.call('ZRANGE', k('brto', a.cust), 0, -1)) do
      local r = recipient_view(rid)
      local b = get(k('bc', redis.call('HGET', k('br', rid), 'bc')), 'name', 'template')
      sends[#sends + 1] = {
        recipient = r, bc = tonumber(redis.call('HGET', k('br', rid), 'bc')), name = b.name,
        template = b.template,
      }
    end
    consent = redis.call('HGET', k('consent'), a.cust) or nil
  end
  return {items = items, parts = parts, reviews = reviews, sends = sends, consent = consent}
end

-- Whether work under way for them makes erasure wait: a turn holding its lease, a reply or a
-- broadcast on its way to Meta.
local function under_way(a, batches)
  local running, sending = false, false
  for _, batch in ipairs(batches) do
    if redis.call('HGET', k('b', batch), 'state') == BATCH.running then
      running = true
    end
    for _, part in ipairs(redis.call('ZRANGE', k('b', batch, 'parts'), 0, -1)) do
      if redis.call('HGET', k('o', part), 'state') == PART.sending then
        sending = true
      end
    end
  end
  if a.ch == 'whatsapp' then
    for _, rid in ipairs(redis.call('ZRANGE', k('brto', a.cust), 0, -1)) do
      if redis.call('HGET', k('br', rid), 'state') == a.recipient_sending then
        sending = true
      end
    end
  end
  return running, sending
end

-- An inbox item goes, with every index that names it.
local function drop_item(seq, i)
  redis.call('HDEL', k('dedupe'), i.ch .. '\n' .. i.key)
  for _, set in ipairs({'inbox', 'wc', 'acct', 'aged:msg', 'aged:rec'}) do
    redis.call('ZREM', k(set), seq)
  end
  if i.cust then
    redis.call('ZREM', k('ci', i.ch, i.cust), seq)
  end
  if i.conv then
    redis.call('ZREM', k('c', i.conv, 'pend'), seq)
  end
  redis.call('DEL', k('in', seq))
end

-- An inbox item goes (erasure and retention both) and its key stays as a hash, given by the
-- caller in `a.hashes` under "<channel>\n<key>" (Lua has no SHA-256), from `a.now` until the
-- `dedupe` horizon sweeps it. Counted in `erased` by kind.
local function erase_item(seq, a, erased)
  local i = get(k('in', seq), 'ch', 'key', 'kind', 'cust', 'conv')
  local hash = a.hashes[i.ch .. '\n' .. i.key]
  redis.call('HSET', k('erased'), hash, int(a.now))
  redis.call('ZADD', k('erasedt'), int(a.now), hash)
  drop_item(seq, i)
  if i.kind == 'message' then
    erased.messages = erased.messages + 1
  else
    erased.statuses = erased.statuses + 1
  end
end

-- A reply part goes, with every index that names it.
local function erase_part(part)
  local o = get(k('o', part), 'conv', 'wamid')
  for _, set in ipairs({'outbox', 'ready', 'claimed', 'sending', 'unknown'}) do
    redis.call('ZREM', k(set), part)
  end
  if o.wamid then
    redis.call('HDEL', k('wamid'), o.wamid)
  end
  redis.call('ZREM', k('c', o.conv, 'unsettled'), part)
  redis.call('DEL', k('o', part))
end

local function erase_review(id)
  local r = get(k('r', id), 'batch', 'outbox')
  if r.outbox then
    redis.call('HDEL', k('rout'), r.outbox)
  else
    redis.call('HDEL', k('rbatch'), r.batch)
  end
  redis.call('ZREM', k('review'), int(id))
  redis.call('DEL', k('r', id))
end

-- What a batch said goes (erasure and retention both): its review items and reply parts,
-- counted in `counts`.
local function erase_said(batch, counts)
  for _, id in ipairs(reviews_of(batch)) do
    erase_review(id)
    counts.reviews = counts.reviews + 1
  end
  for _, part in ipairs(redis.call('ZRANGE', k('b', batch, 'parts'), 0, -1)) do
    erase_part(part)
    counts.replies = counts.replies + 1
  end
  redis.call('DEL', k('b', batch, 'parts'))
end

-- A batch keeps its counts; what it said goes, and one waiting for a retry ends (its messages
-- are gone). One in review stays one: it counts as handed to people.
local function erase_batch(batch, conv, a, erased)
  erase_said(batch, erased)
  redis.call('DEL', k('b', batch, 'msgs'))
  if redis.call('HGET', k('b', batch), 'state') == BATCH.waiting then
    put(k('b', batch), {state = BATCH.done, finished = a.now})
    count_turn(get(k('b', batch), 'state', 'prompt_tokens', 'completion_tokens', 'cost'))
    redis.call('ZREM', k('waiting'), int(batch))
    redis.call('ZADD', k('finished'), int(a.now), int(batch))
  end
  redis.call('HDEL', k('b', batch), 'err', 'stage', 'next')
  redis.call('HDEL', k('c', conv), 'open')
end

-- The conversation keeps its turns under a name that is no one's.
local function erase_conversation(conv, a)
  local c = get(k('c', conv), 'ch', 'biz', 'cust')
  local name = 'erased:' .. conv
  redis.call('HDEL', k('ckey'), c.ch .. '\n' .. c.biz .. '\n' .. c.cust)
  redis.call('HSET', k('ckey'), c.ch .. '\n' .. c.biz .. '\n' .. name, conv)
  redis.call('ZREM', k('cust', a.cust), conv)
  redis.call('DEL', k('c', conv, 'pend'), k('c', conv, 'unsettled'))
  redis.call('HDEL', k('c', conv), 'first', 'due', 'last_in', 'model', 'requeued', 'open')
  put(k('c', conv), {cust = name})
  unmark_due(conv)
  redis.call('ZREM', k('heads'), pad(conv))
end

-- Sends not yet made are skipped as an opt-out; every send keeps its counts under the marker;
-- their choice gives way to the marker's standing opt-out.
local function erase_broadcasts(a, erased)
  local unsent = {}
  for _, state in ipairs(a.unsent) do
    unsent[state] = true
  end
  for _, rid in ipairs(redis.call('ZRANGE', k('brto', a.cust), 0, -1)) do
    local r = get(k('br', rid), 'bc', 'state', 'wamid')
    if unsent[r.state] then
      redis.call('ZREM', k('bc', r.bc, 'st', r.state), rid)
      redis.call('ZADD', k('bc', r.bc, 'st', a.skipped), rid, rid)
      redis.call('ZREM', k('bc', r.bc, 'due'), pad(tonumber(rid)))
      put(k('br', rid), {state = a.skipped, skipped = a.opted_out})
    end
    if r.wamid then
      redis.call('HDEL', k('brwamid'), r.wamid)
    end
    redis.call('HDEL', k('br', rid), 'tz', 'wamid', 'error')
    put(k('br', rid), {to = a.marker, params = '[]'})
    redis.call('ZADD', k('brto', a.marker), rid, rid)
    erased.broadcast_sends = erased.broadcast_sends + 1
  end
  redis.call('DEL', k('brto', a.cust))
  redis.call('HDEL', k('brlast'), a.cust)
  local sent = redis.call('ZSCORE', k('brsent'), a.cust)
  if sent then
    redis.call('ZREM', k('brsent'), a.cust)
    redis.call('ZADD', k('brsent'), sent, a.marker)
  end
  erased.consents = redis.call('HDEL', k('consent'), a.cust)
  redis.call('HSET', k('consent'), a.marker, a.choice)
end

-- The inbox items erasure takes: the customer's, and the account's that mention them.
local function items_naming(ch, cust)
  local out = redis.call('ZRANGE', k('ci', ch, cust), 0, -1)
  for _, seq in ipairs(redis.call('ZRANGE', k('acct'), 0, -1)) do
    local i = get(k('in', seq), 'ch', 'facts')
    if i.ch == ch and i.facts and string.find(i.facts, cust, 1, true) then
      out[#out + 1] = seq
    end
  end
  return out
end

-- The keys of the items erasure would take, for the caller to hash (Lua has no SHA-256).
local function customer_keys(a)
  local keys = {}
  for _, seq in ipairs(items_naming(a.ch, a.cust)) do
    keys[#keys + 1] = redis.call('HGET', k('in', seq), 'key')
  end
  return keys
end

-- Meta's ids of the messages sent to them (replies and broadcasts), for the caller to hash the
-- keys of the statuses Meta may still send about them.
local function customer_wamids(a)
  local out = {}
  if a.ch ~= 'whatsapp' then
    return out
  end
  for _, batch in ipairs(batches_of(conversations_of(a.ch, a.cust))) do
    for _, part in ipairs(redis.call('ZRANGE', k('b', batch, 'parts'), 0, -1)) do
      local wamid = redis.call('HGET', k('o', part), 'wamid')
      if wamid then
        out[#out + 1] = wamid
      end
    end
  end
  for _, rid in ipairs(redis.call('ZRANGE', k('brto', a.cust), 0, -1)) do
    local wamid = redis.call('HGET', k('br', rid), 'wamid')
    if wamid then
      out[#out + 1] = wamid
    end
  end
  return out
end

-- Whether a quarantined raw part is the customer's (store/rules/erasure.rs `sent_by`): sent by
-- them, about a message to them, or their session's; not one that only mentions them.
local function sent_by(raw, cust)
  local ok, part = pcall(cjson.decode, raw)
  if not ok or type(part) ~= 'table' then
    return false
  end
  for _, field in ipairs({'from', 'recipient_id', 'session_id'}) do
    local v = part[field]
    if (type(v) == 'string' and v == cust) or (type(v) == 'number' and int(v) == cust) then
      return true
    end
  end
  return false
end

-- Erases the customer, given the hash of each key `customer_keys` listed; `{stale = true}`,
-- having changed nothing, when an item came since and its key has no hash yet.
local function forget(a)
  local convs = conversations_of(a.ch, a.cust)
  local batches = batches_of(convs)
  local running, sending = under_way(a, batches)
  if running or sending then
    return {running = running, sending = sending}
  end
  local seqs = items_naming(a.ch, a.cust)
  for _, seq in ipairs(seqs) do
    if not a.hashes[a.ch .. '\n' .. redis.call('HGET', k('in', seq), 'key')] then
      return {stale = true}
    end
  end
  local erased = {
    messages = 0, statuses = 0, replies = 0, reviews = 0, chat_jobs = 0, quarantined = 0,
    broadcast_sends = 0, conversations = 0, consents = 0,
  }
  -- A late status about a message to them is a known duplicate, never their number again.
  for _, hash in ipairs(a.status_hashes or {}) do
    redis.call('HSET', k('erased'), hash, int(a.now))
    redis.call('ZADD', k('erasedt'), int(a.now), hash)
  end
  for _, seq in ipairs(seqs) do
    erase_item(seq, a, erased)
  end
  redis.call('DEL', k('ci', a.ch, a.cust))
  for _, conv in ipairs(convs) do
    for _, batch in ipairs(redis.call('ZRANGE', k('c', conv, 'batches'), 0, -1)) do
      erase_batch(batch, conv, a, erased)
    end
    erase_conversation(conv, a)
    erased.conversations = erased.conversations + 1
  end
  if a.ch == 'webchat' then
    for _, job in ipairs(redis.call('ZRANGE', k('sj', a.cust), 0, -1)) do
      redis.call('HDEL', k('jobkey'), redis.call('HGET', k('job', job), 'mkey'))
      redis.call('DEL', k('job', job))
      erased.chat_jobs = erased.chat_jobs + 1
    end
    redis.call('DEL', k('sj', a.cust), k('sr', a.cust))
    -- The session's binding names its user: forgotten with it.
    redis.call('HDEL', k('owner'), a.cust)
  end
  -- Kept, emptied: the same raw part arriving again is still known.
  for _, id in ipairs(redis.call('ZRANGE', k('quarantine'), 0, -1)) do
    local q = get(k('q', id), 'ch', 'raw')
    if q.ch == a.ch and q.raw and q.raw ~= '' and string.find(q.raw, a.cust, 1, true)
        and sent_by(q.raw, a.cust) then
      redis.call('HSET', k('q', id), 'raw', '')
      erased.quarantined = erased.quarantined + 1
    end
  end
  if a.ch == 'whatsapp' then
    erase_broadcasts(a, erased)
  end
  -- The id's links to the customer's others name them too.
  unlink(a.ch, a.cust)
  return {erased = erased}
end

-- Every id of the customer `a.cust` names: the key first, then the others linked to it.
local function linked_ids(a)
  local key = redis.call('HGET', k('cid'), a.ch .. '\n' .. a.cust) or a.cust
  local others = {}
  for _, alias in ipairs(redis.call('SMEMBERS', k('cids', a.ch, key))) do
    if alias ~= key then
      others[#others + 1] = alias
    end
  end
  table.sort(others)
  table.insert(others, 1, key)
  return others
end

-- Which marker secrets the store is under (P:markerkey, a keyed fingerprint; none: unkeyed, as
-- builds before the marker secret wrote them), its markers and its erased keys' hashes, for
-- the caller to key (Lua has no HMAC).
local function marker_names(a)
  local markers = {}
  for _, name in ipairs(redis.call('HKEYS', k('consent'))) do
    if string.sub(name, 1, 7) == 'erased:' then
      markers[#markers + 1] = name
    end
  end
  for _, name in ipairs(redis.call('ZRANGE', k('brsent'), 0, -1)) do
    if string.sub(name, 1, 7) == 'erased:' and redis.call('HEXISTS', k('consent'), name) == 0 then
      markers[#markers + 1] = name
    end
  end
  return {
    fingerprint = redis.call('GET', k('markerkey')) or nil,
    markers = markers,
    hashes = redis.call('HKEYS', k('erased')),
  }
end

-- Moves every marker and erased key's hash to its keyed name (`markers`, `hashes`: old -> new)
-- and records the secrets' fingerprint `to`; false, changing nothing, when the store is no
-- longer under `from` (another node moved them first).
local function rekey_markers(a)
  local now = redis.call('GET', k('markerkey')) or nil
  if now ~= a.from then
    return false
  end
  for old, new in pairs(a.markers) do
    local choice = redis.call('HGET', k('consent'), old)
    if choice then
      redis.call('HDEL', k('consent'), old)
      redis.call('HSET', k('consent'), new, choice)
    end
    local sent = redis.call('ZSCORE', k('brsent'), old)
    if sent then
      redis.call('ZREM', k('brsent'), old)
      redis.call('ZADD', k('brsent'), sent, new)
    end
    local rids = redis.call('ZRANGE', k('brto', old), 0, -1)
    for _, rid in ipairs(rids) do
      redis.call('HSET', k('br', rid), 'to', new)
      redis.call('ZADD', k('brto', new), rid, rid)
    end
    redis.call('DEL', k('brto', old))
  end
  for old, new in pairs(a.hashes) do
    local at = redis.call('HGET', k('erased'), old)
    if at then
      redis.call('HDEL', k('erased'), old)
      redis.call('HSET', k('erased'), new, at)
      redis.call('ZREM', k('erasedt'), old)
      redis.call('ZADD', k('erasedt'), at, new)
    end
  end
  redis.call('SET', k('markerkey'), a.to)
  return true
end
