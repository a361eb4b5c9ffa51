-- The engine's side: claims, leases with fencing tokens, turn endings, history and usage.

local function load_batch(id)
  local b = get(k('b', id), 'conv', 'due')
  local c = get(k('c', b.conv), 'ch', 'biz', 'cust', 'held')
  local messages = {}
  for _, seq in ipairs(redis.call('ZRANGE', k('b', id, 'msgs'), 0, -1)) do
    local m = get(k('in', seq), 'ch', 'key', 'type', 'text', 'media', 'pts', 'recv', 'facts')
    local user, address
    if m.ch == 'webchat' then
      local facts = cjson.decode(m.facts)
      user, address = facts.user_id, facts.address
    end
    messages[#messages + 1] = {
      seq = tonumber(seq), key = m.key, type = m.type, text = m.text, media = m.media,
      pts = tonumber(m.pts), recv = tonumber(m.recv), user = user,
      address = address,
    }
  end
  return {
    id = tonumber(id), ch = c.ch, biz = c.biz, cust = c.cust, due = tonumber(b.due),
    held = tonumber(c.held), messages = messages,
  }
end

-- Whether a conversation is of `ch` (any channel when `ch` is nil).
local function of_channel(conv, ch)
  return not ch or redis.call('HGET', k('c', conv), 'ch') == ch
end

-- How far a channel's claim looks into a set for its own conversations: the web chat's queue
-- is capped (max_queue), so a WhatsApp conversation is never further in than this.
local SCAN_FOR_CHANNEL = 5000

-- Whether a conversation is in `lane` ('routine', 'model'; any when nil): see `schedule`.
local function of_lane(conv, lane)
  return not lane or (redis.call('HGET', k('c', conv), 'model') == '1') == (lane == 'model')
end

-- The ids of a set's members scored up to `now`, of `ch`'s conversations in `lane`, at most
-- `limit` after the first `skip` (none when nil).
local function due_members(set, now, limit, ch, conv_of, skip, lane)
  skip = skip or 0
  if not ch and not lane then
    return redis.call('ZRANGEBYSCORE', k(set), '-inf', int(now), 'LIMIT', skip, limit)
  end
  local found, passed = {}, 0
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', k(set), '-inf', int(now), 'LIMIT', 0,
      SCAN_FOR_CHANNEL)) do
    local conv = conv_of(id)
    if of_channel(conv, ch) and of_lane(conv, lane) then
      if passed < skip then
        passed = passed + 1
      else
        found[#found + 1] = id
        if #found == limit then
          break
        end
      end
    end
  end
  return found
end

local function batch_conv(id)
  return redis.call('HGET', k('b', id), 'conv')
end

-- Every pending message of conversation `conv` joins batch `id`; the conversation is due no
-- more.
local function take_pending(conv, id)
  local pending = k('c', conv, 'pend')
  for _, seq in ipairs(redis.call('ZRANGE', pending, 0, -1)) do
    put(k('in', seq), {state = ITEM.batched, batch = id})
    redis.call('ZADD', k('b', id, 'msgs'), seq, seq)
    redis.call('ZREM', k('wc'), seq)
  end
  redis.call('DEL', pending)
  redis.call('HDEL', k('c', conv), 'first', 'due', 'requeued', 'model')
  unmark_due(conv)
end

-- Batches whose lease lapsed or whose retry time came, the longest due first.
local function reclaim(now, lease, limit, ch)
  local lapsed = {}
  for _, set in ipairs({'running', 'waiting'}) do
    for _, id in ipairs(due_members(set, now, limit, ch, batch_conv)) do
      lapsed[#lapsed + 1] = {id = id, due = tonumber(redis.call('HGET', k('b', id), 'due'))}
    end
  end
  table.sort(lapsed, function(x, y)
    if x.due ~= y.due then
      return x.due < y.due
    end
    return tonumber(x.id) < tonumber(y.id)
  end)
  local claims = {}
  for i = 1, math.min(#lapsed, limit) do
    local id = lapsed[i].id
    local b = get(k('b', id), 'token', 'attempts', 'requeued', 'conv')
    local token, attempt = tonumber(b.token) + 1, tonumber(b.attempts) + 1
    if attempt == 1 then
      -- A held batch's first run: what the customer wrote while held joins it.
      take_pending(b.conv, id)
    end
    put(k('b', id), {
      state = BATCH.running, token = token, attempts = attempt, lease = now + lease, started = now,
    })
    redis.call('HDEL', k('b', id), 'next')
    redis.call('ZREM', k('waiting'), id)
    redis.call('ZADD', k('running'), int(now + lease), id)
    claims[#claims + 1] = {
      batch = load_batch(id), token = token, attempt = attempt, requeued = b.requeued == '1',
    }
  end
  return claims
end

-- A new batch of every pending message of a due conversation; it never starts before the
-- conversation's previous one finished (clocks of nodes may disagree).
local function open_batch(conv, now, lease)
  local c = get(k('c', conv), 'due', 'requeued', 'finished')
  local id = redis.call('HINCRBY', k('ids'), 'batch', 1)
  local requeued = c.requeued == '1'
  put(k('b', id), {
    conv = conv, state = BATCH.running, token = 1, attempts = 1, lease = now + lease,
    due = tonumber(c.due), created = now, started = math.max(now, tonumber(c.finished) or 0),
    requeued = requeued,
  })
  redis.call('ZADD', k('running'), int(now + lease), int(id))
  redis.call('ZADD', k('c', conv, 'batches'), int(id), int(id))
  take_pending(conv, id)
  put(k('c', conv), {open = id})
  return {batch = load_batch(id), token = 1, attempt = 1, requeued = requeued}
end

local function claim(a)
  local claims = reclaim(a.now, a.lease, a.limit, a.ch)
  if #claims < a.limit then
    local due = due_members('due', a.now, a.limit - #claims, a.ch, tonumber)
    for _, conv in ipairs(due) do
      claims[#claims + 1] = open_batch(tonumber(conv), a.now, a.lease)
    end
  end
  return claims
end

-- New batches of due WhatsApp conversations whose pending messages the router answers alone.
local function claim_routine(a)
  local claims = {}
  for _, conv in ipairs(due_members('routine', a.now, a.limit, 'whatsapp', tonumber)) do
    claims[#claims + 1] = open_batch(tonumber(conv), a.now, a.lease)
  end
  return claims
end

-- The conversation of a running batch whose latest token is `token`, or nil: a lost lease.
local function holder(batch, token)
  local b = get(k('b', batch), 'token', 'state', 'conv')
  if b.state == BATCH.running and tonumber(b.token) == token then
    return b.conv
  end
end

local function renew(a)
  if not holder(a.batch, a.token) then
    return fail('SABI_LEASE_LOST', 'the lease is no longer held')
  end
  put(k('b', a.batch), {lease = a.now + a.lease})
  redis.call('ZADD', k('running'), int(a.now + a.lease), int(a.batch))
  return true
end

-- Counts an ended turn, and what its model calls used, in the running totals.
local function count_turn(b)
  local who = 'people'
  if b.state == BATCH.done then
    who = b.prompt_tokens and 'agent' or 'local_turns'
  end
  redis.call('HINCRBY', k('stats'), who, 1)
  redis.call('HINCRBY', k('stats'), 'prompt_tokens', b.prompt_tokens or 0)
  redis.call('HINCRBY', k('stats'), 'completion_tokens', b.completion_tokens or 0)
  redis.call('HINCRBYFLOAT', k('stats'), 'cost', b.cost or 0)
end

-- Ends a batch for good and lets its conversation's next batch be claimed.
local function close(batch, conv, now, state, messages)
  put(k('b', batch), {state = state, finished = now})
  count_turn(get(k('b', batch), 'state', 'prompt_tokens', 'completion_tokens', 'cost'))
  redis.call('HDEL', k('b', batch), 'lease')
  redis.call('ZREM', k('running'), int(batch))
  redis.call('ZADD', k('finished'), int(now), int(batch))
  for _, seq in ipairs(redis.call('ZRANGE', k('b', batch, 'msgs'), 0, -1)) do
    put(k('in', seq), {state = messages})
  end
  local c = get(k('c', conv), 'open', 'due', 'finished')
  put(k('c', conv), {finished = math.max(tonumber(c.finished) or 0, now)})
  if tonumber(c.open) == tonumber(batch) then
    redis.call('HDEL', k('c', conv), 'open')
    if c.due then
      mark_due(conv, tonumber(c.due))
    end
  end
end

local function write_reply(batch, conv, now, parts, sandbox)
  for index, p in ipairs(parts) do
    local written = redis.call('ZRANGEBYSCORE', k('b', batch, 'parts'), index - 1, index - 1)
    if #written == 0 then
      add_part(batch, conv, index - 1, p.text, p.options, p.quote, now, sandbox)
    end
  end
end

local function to_review(batch, conv, now, reason, err)
  open_review(batch, nil, reason, err, now)
  put(k('b', batch), {err = err})
  close(batch, conv, now, BATCH.review, ITEM.review)
end

-- Puts a batch back to wait, leaseless, until `at`, with `fields` written alongside.
local function to_waiting(batch, at, fields)
  fields.state, fields.next = BATCH.waiting, at
  put(k('b', batch), fields)
  redis.call('HDEL', k('b', batch), 'lease')
  redis.call('ZREM', k('running'), int(batch))
  redis.call('ZADD', k('waiting'), int(at), int(batch))
end

local function finish(a)
  local conv = holder(a.batch, a.token)
  if not conv then
    return fail('SABI_LEASE_LOST', 'the lease is no longer held')
  end
  local e, batch, now = a.ending, a.batch, a.now
  if e.kind == 'replied' then
    write_reply(batch, conv, now, e.parts, e.sandbox)
    close(batch, conv, now, BATCH.done, ITEM.answered)
  elseif e.kind == 'retry' then
    to_waiting(batch, e.at, {err = e.error})
  elseif e.kind == 'review' then
    to_review(batch, conv, now, e.reason, e.error)
  else
    write_reply(batch, conv, now, e.parts, e.sandbox)
    to_review(batch, conv, now, REASON.handoff_asked, e.note)
  end
  return true
end

-- Tells the customers of up to `limit` due conversations of `ch` that their answer will take a
-- while: a batch of their pending messages, the holding parts numbered from `first`, and the
-- batch waiting at its own due time with no attempt spent (store/mod.rs, Turns::hold).
local function hold(a)
  local held = {}
  -- Routine turns are claimed first: only the model's lane queues.
  for _, conv in ipairs(due_members('due', a.now, a.limit, a.ch, tonumber, a.skip, 'model')) do
    local opened = open_batch(tonumber(conv), a.now, 0).batch
    local id = opened.id
    -- A person holding the conversation answers it: nobody is told to wait for the assistant
    -- (store::rules::review::person_holds; the batch goes to them when it is claimed).
    if not (opened.held and opened.held > a.now) then
      for index, p in ipairs(a.parts) do
        add_part(id, tonumber(conv), a.first + index - 1, p.text, p.options, p.quote, a.now,
          a.sandbox)
      end
    end
    local due = tonumber(redis.call('HGET', k('b', id), 'due'))
    to_waiting(id, due, {attempts = 0})
    held[#held + 1] = id
  end
  return held
end

local function next_due()
  return earliest(first_score(k('due')), first_score(k('running')), first_score(k('waiting')))
end

-- What was said in the last `turns` turns of a conversation before batch `before` (all of
-- them when nil), turn by turn: the customer's messages, the replies, the hand-off note.
local function conversation_history(conv, before, turns)
  local top = before and ('(' .. int(before)) or '+inf'
  local recent = redis.call('ZREVRANGEBYSCORE', k('c', conv, 'batches'), top, '-inf', 'LIMIT', 0,
    turns)
  local out = {}
  for i = #recent, 1, -1 do
    local batch = recent[i]
    local said = {}
    for _, seq in ipairs(redis.call('ZRANGE', k('b', batch, 'msgs'), 0, -1)) do
      local m = get(k('in', seq), 'recv', 'text', 'type', 'pts', 'kind')
      said[#said + 1] = {
        at = tonumber(m.recv), text = m.text or ('[' .. (m.type or 'message') .. ']'),
        pts = tonumber(m.pts) or 0, seq = tonumber(seq),
        -- The business's own reply from the WhatsApp Business app.
        speaker = m.kind == 'echo' and 'business' or 'customer',
      }
    end
    table.sort(said, function(x, y)
      if x.pts ~= y.pts then
        return x.pts < y.pts
      end
      return x.seq < y.seq
    end)
    for _, m in ipairs(said) do
      out[#out + 1] = {at = m.at, speaker = m.speaker, text = m.text}
    end
    -- In the order written: a holding message before the answer it announced.
    local parts = redis.call('ZRANGE', k('b', batch, 'parts'), 0, -1)
    table.sort(parts, function(x, y) return tonumber(x) < tonumber(y) end)
    for _, id in ipairs(parts) do
      local o = get(k('o', id), 'created', 'body', 'state')
      if o.state ~= PART.failed and o.state ~= PART.review and o.state ~= PART.window_closed then
        out[#out + 1] = {at = tonumber(o.created), speaker = 'business', text = o.body}
      end
    end
    local review = redis.call('HGET', k('rbatch'), batch)
    if review then
      local r = get(k('r', review), 'created', 'reason', 'err')
      local note = 'handed to a person (' .. r.reason .. ')' .. (r.err and (': ' .. r.err) or '')
      out[#out + 1] = {at = tonumber(r.created), speaker = 'note', text = note}
    end
  end
  return out
end

local function history(a)
  local conv = redis.call('HGET', k('b', a.batch), 'conv')
  if not conv then
    return {}
  end
  return conversation_history(conv, a.batch, a.turns)
end

local function set_stage(a)
  if redis.call('HGET', k('b', a.batch), 'state') == BATCH.running then
    redis.call('HSET', k('b', a.batch), 'stage', a.stage)
  end
  return true
end

-- What the router made of a turn's messages (learning from use).
local function set_route(a)
  local key = k('b', a.batch)
  if redis.call('EXISTS', key) == 1 then
    put(key, {route_intent = a.intent, route_conf = string.format('%.9g', a.confidence),
      route_local = a['local']})
  end
  return true
end

-- A person's word on what a turn's messages asked.
local function label_turn(a)
  local key = k('b', a.batch)
  if redis.call('EXISTS', key) == 0 then
    return fail('SABI_NOT_FOUND', 'no batch has this id')
  end
  redis.call('HSET', key, 'label', a.intent)
  return true
end

-- Ended turns the router guessed at since `since`, the latest first: each with its messages'
-- texts in the order they were sent.
local function routed_turns(a)
  local out = {}
  local ids = redis.call('ZREVRANGEBYSCORE', k('finished'), '+inf', int(a.since))
  for _, id in ipairs(ids) do
    if #out >= a.limit then
      break
    end
    local b = get(k('b', id), 'route_intent', 'route_conf', 'route_local', 'state',
      'prompt_tokens', 'label', 'finished')
    if b.route_intent then
      local messages = {}
      for _, seq in ipairs(redis.call('ZRANGE', k('b', id, 'msgs'), 0, -1)) do
        local m = get(k('in', seq), 'text', 'pts')
        if m.text then
          messages[#messages + 1] = {text = m.text, pts = tonumber(m.pts) or 0, seq = tonumber(seq)}
        end
      end
      table.sort(messages, function(x, y)
        if x.pts ~= y.pts then
          return x.pts < y.pts
        end
        return x.seq < y.seq
      end)
      local texts = {}
      for i, m in ipairs(messages) do
        texts[i] = m.text
      end
      out[#out + 1] = {
        batch = tonumber(id), intent = b.route_intent, confidence = tonumber(b.route_conf),
        ['local'] = b.route_local == '1', state = b.state, used_model = b.prompt_tokens ~= nil,
        label = b.label, finished = tonumber(b.finished), text = table.concat(texts, '\n'),
      }
    end
  end
  return out
end

-- Usage of a turn that already ended (its worker lost the lease) joins the totals too.
local function add_usage(a)
  local key = k('b', a.batch)
  if redis.call('EXISTS', key) == 0 then
    return true
  end
  local cost = string.format('%.17g', a.cost)
  local b = get(key, 'state', 'finished', 'prompt_tokens')
  if b.finished and b.state == BATCH.done and not b.prompt_tokens then
    -- It was counted as answered without a model call when it ended.
    redis.call('HINCRBY', k('stats'), 'local_turns', -1)
    redis.call('HINCRBY', k('stats'), 'agent', 1)
  end
  redis.call('HINCRBY', key, 'prompt_tokens', int(a.prompt_tokens))
  redis.call('HINCRBY', key, 'completion_tokens', int(a.completion_tokens))
  redis.call('HINCRBYFLOAT', key, 'cost', cost)
  if b.finished then
    redis.call('HINCRBY', k('stats'), 'prompt_tokens', int(a.prompt_tokens))
    redis.call('HINCRBY', k('stats'), 'completion_tokens', int(a.completion_tokens))
    redis.call('HINCRBYFLOAT', k('stats'), 'cost', cost)
  end
  return true
end

-- Turns ended since `since`: the running totals when that is before the first turn ended
-- (the usual question: "so far"), else the turns of that window.
local function turn_stats(a)
  local names = {'local_turns', 'agent', 'people', 'prompt_tokens', 'completion_tokens', 'cost'}
  local s = {}
  local first = first_score(k('finished'))
  if not first or a.since <= first then
    local totals = redis.call('HMGET', k('stats'), unpack(names))
    for i, name in ipairs(names) do
      s[name] = tonumber(totals[i]) or 0
    end
    return s
  end
  for _, name in ipairs(names) do
    s[name] = 0
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', k('finished'), int(a.since), '+inf')) do
    local b = get(k('b', id), 'state', 'attempts', 'prompt_tokens', 'completion_tokens', 'cost')
    if b.attempts == '0' then
      -- The owner's own reply from the app: no turn.
    elseif b.state == BATCH.done and b.prompt_tokens then
      s.agent = s.agent + 1
    elseif b.state == BATCH.done then
      s.local_turns = s.local_turns + 1
    elseif b.state == BATCH.review then
      s.people = s.people + 1
    end
    s.prompt_tokens = s.prompt_tokens + (tonumber(b.prompt_tokens) or 0)
    s.completion_tokens = s.completion_tokens + (tonumber(b.completion_tokens) or 0)
    s.cost = s.cost + (tonumber(b.cost) or 0)
  end
  return s
end
