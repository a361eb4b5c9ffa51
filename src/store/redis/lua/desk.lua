-- A help desk's threads (store::desk): a conversation's thread in P:c:<id> (dthread, dopen),
-- P:dthread hash thread -> conversation; how far a review item was mirrored in P:r:<id>
-- (dseq). An open thread holds the conversation for the desk (held = a.hold).

local function desk_conversation_id(a)
  return redis.call('HGET', k('ckey'), a.ch .. '\n' .. a.biz .. '\n' .. a.cust)
end

local function desk_thread(a)
  local conv = desk_conversation_id(a)
  if not conv then
    return cjson.null
  end
  local c = get(k('c', conv), 'dthread', 'dopen')
  if not c.dthread then
    return cjson.null
  end
  return {thread = c.dthread, open = c.dopen == '1'}
end

local function open_desk_thread(a)
  local conv = desk_conversation_id(a)
  if not conv then
    return fail('SABI_NOT_FOUND', 'no such conversation')
  end
  local c = get(k('c', conv), 'held', 'dthread')
  if c.dthread and c.dthread ~= a.thread then
    redis.call('HDEL', k('dthread'), c.dthread)
  end
  put(k('c', conv), {dthread = a.thread, dopen = 1, held = math.max(tonumber(c.held) or 0, a.hold)})
  redis.call('HSET', k('dthread'), a.thread, conv)
  return true
end

-- The conversation whose thread `thread` is now, as the SQL stores read it: an older thread of
-- it, or one of a conversation retention removed, names none.
local function thread_conversation(thread)
  local conv = redis.call('HGET', k('dthread'), thread)
  if conv and redis.call('HGET', k('c', conv), 'dthread') == thread then
    return conv
  end
  return nil
end

local function desk_key(conv)
  local c = get(k('c', conv), 'ch', 'biz', 'cust')
  return {ch = c.ch, biz = c.biz, cust = c.cust}
end

local function close_desk_thread(a)
  local conv = thread_conversation(a.thread)
  if not conv then
    return cjson.null
  end
  put(k('c', conv), {dopen = 0})
  redis.call('HDEL', k('c', conv), 'held')
  return desk_key(conv)
end

local function desk_conversation(a)
  local conv = thread_conversation(a.thread)
  if not conv then
    return cjson.null
  end
  return desk_key(conv)
end

-- Open items the desk has not seen whole: never mirrored, or with a message past dseq.
local function desk_pending(a)
  local rows = {}
  for _, id in ipairs(redis.call('ZRANGE', k('review'), 0, -1)) do
    if #rows >= a.limit then
      break
    end
    local r = get(k('r', id), 'batch', 'dseq')
    local last = r.batch and redis.call('ZRANGE', k('b', r.batch, 'msgs'), -1, -1)[1]
    if not r.batch then
      -- A review item without its turn is nothing to mirror.
    elseif not r.dseq then
      rows[#rows + 1] = {tonumber(id), cjson.null}
    elseif last and tonumber(last) > tonumber(r.dseq) then
      rows[#rows + 1] = {tonumber(id), tonumber(r.dseq)}
    end
  end
  return rows
end

local function claim_desk_message(a)
  return redis.call('SET', k('dr', a.key), int(a.now), 'NX', 'PX', int(a.keep)) ~= false
end

local function set_desk_mirrored(a)
  if redis.call('EXISTS', k('r', a.item)) == 1 then
    local seq = tonumber(redis.call('HGET', k('r', a.item), 'dseq')) or 0
    put(k('r', a.item), {dseq = math.max(seq, a.seq)})
  end
  return true
end
