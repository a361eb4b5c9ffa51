-- Sabi's store on Redis: one script, one operation per call (see main.lua).
--
-- Every key starts with KEYS[1], the deployment's hash tag ("{sabi}"), so all of them live in
-- one slot: a delivery that touches several conversations is still one atomic script, also on
-- Redis Cluster. Numbers are written as integers ("%d"): Lua holds them as doubles, exact for
-- every id and millisecond time Sabi stores.
--
-- Layout (P = the tag):
--   P:ids                  hash   counters: inbox, conversation, batch, outbox, review, quarantine
--   P:schema               string layout version; P:upgrade hash where an upgrade step that
--                                 goes a slice per call stopped (layout.lua)
--   P:epoch                string random, written with the layout: every call carries it
--   P:in:<seq>             hash   an inbox item;  P:inbox zset of every seq;  P:dedupe hash
--                                 "<channel>\n<key>" -> seq;  P:wc zset of pending web-chat seqs
--   P:c:<id>               hash   a conversation; P:ckey hash "<channel>\n<business>\n<customer>"
--                                 -> id; P:c:<id>:pend zset of its pending seqs; :batches zset;
--                                 :unsettled zset of its reply parts that hold its queue;
--                                 P:cust:<customer> zset of conversation ids;
--                                 P:due zset conversation -> due time (only with no batch open);
--                                 P:routine the same for those out of the model's lane
--   P:b:<id>               hash   a batch; :msgs zset of its seqs; :parts zset outbox id by part;
--                                 P:running zset -> lease end; P:waiting zset -> retry time;
--                                 P:finished zset -> end time
--   P:o:<id>               hash   a reply part; P:outbox zset of every id; P:ready zset of parts
--                                 queued or window-closed; P:sending and P:unknown zsets -> the
--                                 time their wait ends; P:wamid hash Meta's id -> part;
--                                 P:heads zset conversation -> when the oldest part holding its
--                                 queue may go, while that part waits to be sent
--   P:stats                hash   turns ended and what they used, since the start
--   P:r:<id>               hash   a review item; P:review zset of open ones; P:rbatch hash
--                                 batch -> item; P:rout hash part -> item
--   P:q:<id>               hash   a quarantined part (with its hash); P:quarantine zset;
--                                 P:qhash hash "<channel>\n<hash>" -> id
--   P:bc:<id>              hash   a broadcast; P:bckey, P:bcs, :r and :st:<state> zsets, P:br:<id>
--                                 a recipient (broadcasts.lua)
--   P:job:<id>             hash   a web-chat job; P:jobkey hash message key -> job;
--                                 P:sj:<session> zset job by seq; P:sr:<session> zset job by
--                                 time, the last minute's only; P:owner hash session -> the
--                                 verified user it is bound to
--   P:ci:<channel>:<cust>  zset   a customer's inbox items by seq; P:acct zset the items that
--                                 name no customer (field events, errors); P:brto:<customer>
--                                 zset their broadcast recipients; P:erased hash erased key's
--                                 hash -> when, P:erasedt zset the same by time (customers.lua);
--                                 P:markerkey string the marker secrets' fingerprint
--   P:aged:msg, P:aged:rec zset   inbox items that expire by their own age, by arrival time:
--                                 messages without a turn, recorded items (retention.lua)
--   P:lease:<name>         hash   who does a one-node-at-a-time job, and until when
--   P:cid                  hash   "<channel>\n<id>" -> the customer's key, for every id Meta
--                                 named them by; P:cids:<channel>:<key> set of those ids
--                                 (store::rules::identity)
--   P:pr:<key>             hash   a priced message: hour first priced, category, prefix, type,
--                                 billed (y/n); P:prk zset key -> hour; P:prh:<hour> hash
--                                 "<category>\n<prefix>\n<billed>" -> messages; P:prhours zset
--                                 of those hours (store::rules::price)

local P = KEYS[1]

local function k(...)
  return P .. ':' .. table.concat({...}, ':')
end

local function int(x)
  return string.format('%d', x)
end

-- A conversation as a member of a time-scored set: zero-padded, so that conversations due at
-- the same time come out in the order they began, as in the SQL backends (Redis orders equal
-- scores by member bytes). tonumber() reads it back.
local function pad(id)
  return string.format('%015d', id)
end

-- Sets hash fields; numbers as integers, booleans as "1"/"0", nil fields untouched.
local function put(key, fields)
  local args = {}
  for name, v in pairs(fields) do
    args[#args + 1] = name
    if type(v) == 'number' then
      args[#args + 1] = int(v)
    elseif type(v) == 'boolean' then
      args[#args + 1] = v and '1' or '0'
    else
      args[#args + 1] = v
    end
  end
  if #args > 0 then
    redis.call('HSET', key, unpack(args))
  end
end

-- The named fields of a hash that are set, as strings.
local function get(key, ...)
  local names = {...}
  local values = redis.call('HMGET', key, unpack(names))
  local row = {}
  for i, name in ipairs(names) do
    if values[i] then
      row[name] = values[i]
    end
  end
  return row
end

local function first_score(key)
  local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return tonumber(head[2])
end

local function earliest(...)
  local best
  for _, v in pairs({...}) do
    if not best or v < best then
      best = v
    end
  end
  return best
end

-- Reply parts that still hold their recipient's queue, those a sender may claim, and those
-- whose lease or wait runs out (each in a set of its own, by when).
local UNSETTLED = {
  [PART.queued] = true, [PART.claimed] = true, [PART.sending] = true, [PART.unknown] = true,
  [PART.window_closed] = true,
}
local READY = {[PART.queued] = true, [PART.window_closed] = true}
local TIMED = {PART.claimed, PART.sending, PART.unknown}

-- The part a conversation's queue waits on: its oldest unsettled part, passing over unknown
-- ones, which hold back only the rest of their own reply (the rulebook's holds_later_replies).
local function head_of(conv)
  local blocked = {}
  for _, id in ipairs(redis.call('ZRANGE', k('c', conv, 'unsettled'), 0, -1)) do
    local o = get(k('o', id), 'state', 'batch')
    if not blocked[o.batch] then
      if o.state ~= PART.unknown then
        return id
      end
      blocked[o.batch] = true
    end
  end
end

-- Keeps a conversation's place in the sender's work list: listed, at the time its head part
-- may go, only while that part waits to be sent.
local function refresh_head(conv)
  local head = head_of(conv)
  if head then
    local o = get(k('o', head), 'state', 'next')
    if READY[o.state] then
      local after = tonumber(redis.call('HGET', k('c', conv), 'send_after')) or 0
      redis.call('ZADD', k('heads'), int(math.max(tonumber(o.next) or 0, after)), pad(conv))
      return
    end
  end
  redis.call('ZREM', k('heads'), pad(conv))
end

-- Moves a reply part to `state` with `fields`, keeping every index of parts by state in step.
-- `till` is when a claimed, sending or unknown part's lease or wait ends.
local function move_part(id, state, fields)
  fields = fields or {}
  fields.state = state
  put(k('o', id), fields)
  local conv = redis.call('HGET', k('o', id), 'conv')
  local m = int(id)
  if UNSETTLED[state] then
    redis.call('ZADD', k('c', conv, 'unsettled'), m, m)
  else
    redis.call('ZREM', k('c', conv, 'unsettled'), m)
  end
  if READY[state] then
    redis.call('ZADD', k('ready'), m, m)
  else
    redis.call('ZREM', k('ready'), m)
  end
  local timed = false
  for _, each in ipairs(TIMED) do
    redis.call('ZREM', k(each), m)
    timed = timed or each == state
  end
  if timed then
    redis.call('ZADD', k(state), int(fields.till), m)
  else
    redis.call('HDEL', k('o', id), 'till')
  end
  refresh_head(conv)
end

-- Writes reply part number `part` of a batch: served at once on the web chat, kept in sandbox
-- mode, queued for the sender otherwise.
local function add_part(batch, conv, part, text, options, quote, now, sandbox)
  local c = get(k('c', conv), 'ch', 'biz', 'cust')
  local state = PART.queued
  if c.ch == 'webchat' then
    state = PART.served
  elseif sandbox then
    state = PART.sandbox
  end
  local id = redis.call('HINCRBY', k('ids'), 'outbox', 1)
  put(k('o', id), {
    batch = batch, part = part, ch = c.ch, biz = c.biz, cust = c.cust, conv = conv, body = text,
    options = options, reply_to = quote, kind = 'text', attempts = 0, failures = 0,
    created = now, updated = now,
  })
  redis.call('ZADD', k('outbox'), int(id), int(id))
  redis.call('ZADD', k('b', batch, 'parts'), int(part), int(id))
  move_part(id, state)
end

-- Opens a review item: one per batch, or one per reply part (opened again when a part a
-- person requeued fails anew).
local function open_review(batch, part, reason, err, now)
  local id = part and redis.call('HGET', k('rout'), part)
  if not id then
    id = redis.call('HINCRBY', k('ids'), 'review', 1)
    if part then
      redis.call('HSET', k('rout'), int(part), int(id))
    else
      redis.call('HSET', k('rbatch'), int(batch), int(id))
    end
  end
  redis.call('DEL', k('r', id))
  put(k('r', id), {
    batch = batch, outbox = part, reason = reason, err = err, state = REVIEW.open, created = now,
  })
  redis.call('ZADD', k('review'), int(id), int(id))
end

-- A refused operation: main.lua turns it into the error reply "<code> <why>". Only returned
-- before any write.
local function fail(code, why)
  return {__error = code .. ' ' .. why}
end

-- Indexes inbox item `seq` by its customer, or as the account's when it names none: what a
-- customer's export and erasure read instead of the whole inbox.
local function index_item(seq, ch, cust)
  if cust then
    redis.call('ZADD', k('ci', ch, cust), int(seq), int(seq))
  else
    redis.call('ZADD', k('acct'), int(seq), int(seq))
  end
end

-- Lists inbox item `seq` by the time it came, when it expires by its own age (retention.lua):
-- a message that will have no turn (P:aged:msg), a status or other recorded item
-- (P:aged:rec). Messages with a turn expire with it.
local function index_aged(seq, state, recv)
  if state == ITEM.skipped or state == ITEM.withdrawn then
    redis.call('ZADD', k('aged', 'msg'), int(recv), int(seq))
  elseif state == ITEM.recorded then
    redis.call('ZADD', k('aged', 'rec'), int(recv), int(seq))
  end
end

-- Conversation `conv` is due at `due` with no batch open: in P:due, and in P:routine too while
-- no pending message needs the model, so the routine lane is read without passing over the
-- model's queue (however long a surge makes it).
local function mark_due(conv, due)
  redis.call('ZADD', k('due'), int(due), pad(conv))
  if redis.call('HGET', k('c', conv), 'model') == '1' then
    redis.call('ZREM', k('routine'), pad(conv))
  else
    redis.call('ZADD', k('routine'), int(due), pad(conv))
  end
end

-- Conversation `conv` is no longer due: a batch took its messages, or none are left.
local function unmark_due(conv)
  redis.call('ZREM', k('due'), pad(conv))
  redis.call('ZREM', k('routine'), pad(conv))
end

-- Forgets the links of `id` (store::rules::identity): its own to its key, and every other id's
-- to it.
local function unlink(ch, id)
  local key = redis.call('HGET', k('cid'), ch .. '\n' .. id)
  if key then
    redis.call('SREM', k('cids', ch, key), id)
    redis.call('HDEL', k('cid'), ch .. '\n' .. id)
  end
  for _, alias in ipairs(redis.call('SMEMBERS', k('cids', ch, id))) do
    redis.call('HDEL', k('cid'), ch .. '\n' .. alias)
  end
  redis.call('DEL', k('cids', ch, id))
end
