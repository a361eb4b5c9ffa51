-- The people's side: the review queue, settling its items, conversations by customer, and the
-- pipeline's counts.

local function review_entry(id)
  local r = get(k('r', id), 'batch', 'outbox', 'state', 'reason', 'err', 'created')
  if not r.batch then
    return nil
  end
  return {
    id = tonumber(id), batch = load_batch(r.batch), outbox = tonumber(r.outbox), state = r.state,
    reason = r.reason, error = r.err, created = tonumber(r.created),
  }
end

-- Open items, WhatsApp's (whose customers Meta names) ahead of web chat's, oldest first.
local function review_queue(a)
  local out = {}
  for _, channel in ipairs({'whatsapp', 'webchat'}) do
    for _, id in ipairs(redis.call('ZRANGE', k('review'), 0, -1)) do
      if #out >= a.limit then
        return out
      end
      local r = get(k('r', id), 'reason', 'batch')
      local conv = redis.call('HGET', k('b', r.batch), 'conv')
      local c = get(k('c', conv), 'cust', 'ch')
      if c.ch == channel and (not a.reason or r.reason == a.reason)
          and (not a.customer or c.cust == a.customer) then
        out[#out + 1] = review_entry(id)
      end
    end
  end
  return out
end

local function review_item(a)
  return review_entry(a.id)
end

-- A person's reply to the customer: the batch's web-chat questions count as answered, and the
-- reply is the batch's next part.
local function person_reply(batch, now, text, sandbox)
  local conv = redis.call('HGET', k('b', batch), 'conv')
  for _, seq in ipairs(redis.call('ZRANGE', k('b', batch, 'msgs'), 0, -1)) do
    local i = get(k('in', seq), 'ch', 'kind')
    if i.ch == 'webchat' and i.kind == 'message' then
      put(k('in', seq), {state = ITEM.answered})
    end
  end
  local last = redis.call('ZRANGE', k('b', batch, 'parts'), -1, -1, 'WITHSCORES')[2]
  local part = last and tonumber(last) + 1 or 0
  add_part(batch, conv, part, text, nil, nil, now, sandbox)
  -- Marked as a person's: the web chat's session stream shows it.
  local id = redis.call('ZRANGEBYSCORE', k('b', batch, 'parts'), part, part)[1]
  redis.call('HSET', k('o', id), 'person', 1)
end

-- The batch's messages are pending again, and due at once, for a turn that answers them
-- however old they are.
local function requeue_batch(batch, now)
  local conv = redis.call('HGET', k('b', batch), 'conv')
  for _, seq in ipairs(redis.call('ZRANGE', k('b', batch, 'msgs'), 0, -1)) do
    put(k('in', seq), {state = ITEM.pending})
    redis.call('HDEL', k('in', seq), 'batch')
    redis.call('ZADD', k('c', conv, 'pend'), seq, seq)
    if redis.call('HGET', k('in', seq), 'ch') == 'webchat' then
      redis.call('ZADD', k('wc'), seq, seq)
    end
  end
  redis.call('DEL', k('b', batch, 'msgs'))
  local c = get(k('c', conv), 'first', 'open')
  put(k('c', conv), {first = tonumber(c.first) or now, due = now, requeued = true, model = 1})
  if not c.open then
    mark_due(conv, now)
  end
end

local function requeue_send(part, now)
  local closed = redis.call('HGET', k('o', part), 'window_closed') == '1'
  forget_wamid(part)
  redis.call('HDEL', k('o', part), 'delivery', 'next')
  move_part(part, closed and PART.window_closed or PART.queued, {failures = 0, updated = now})
end

local function resolve_review(a)
  local how, state, note = a.resolution, REVIEW.closed, nil
  -- A help desk's reply goes once, however often the desk delivers it (kept as long as erased
  -- keys); the key is only written once the item is found open.
  if how.desk and redis.call('EXISTS', k('dr', how.desk)) == 1 then
    return true
  end
  local r = get(k('r', a.id), 'state', 'batch', 'outbox')
  if r.state ~= REVIEW.open then
    return fail('SABI_NOT_FOUND', 'no open review item has this id')
  end
  if how.desk then
    redis.call('SET', k('dr', how.desk), int(a.now), 'PX', int(how.desk_keep))
  end
  -- A reply renews the person's hold on the conversation; closing or requeuing lets it go
  -- (store::rules::review::hold_after).
  local conv = redis.call('HGET', k('b', r.batch), 'conv')
  if how.held_until then
    local held = tonumber(redis.call('HGET', k('c', conv), 'held')) or 0
    put(k('c', conv), {held = math.max(held, how.held_until)})
  else
    redis.call('HDEL', k('c', conv), 'held')
  end
  if how.kind == 'reply' then
    person_reply(r.batch, a.now, how.text, how.sandbox)
    if how.desk or redis.call('HGET', k('c', conv), 'ch') == 'webchat' then
      -- A person answering a live chat, or a help desk holding the conversation, keeps the
      -- item open, with their last word (store::rules::review::settle).
      redis.call('HSET', k('r', a.id), 'note', how.text)
      return true
    end
    state, note = REVIEW.replied, how.text
  elseif how.kind == 'requeue' then
    if r.outbox then
      requeue_send(r.outbox, a.now)
    else
      requeue_batch(r.batch, a.now)
    end
    state = REVIEW.requeued
  end
  put(k('r', a.id), {state = state, resolved = a.now, resolution = state, note = note})
  redis.call('ZREM', k('review'), int(a.id))
  return true
end

local function conversations(a)
  local views = {}
  for _, conv in ipairs(redis.call('ZRANGE', k('cust', a.customer), 0, -1)) do
    local c = get(k('c', conv), 'ch', 'biz', 'cust', 'last_in')
    views[#views + 1] = {
      ch = c.ch, biz = c.biz, cust = c.cust, last_in = tonumber(c.last_in),
      history = conversation_history(conv, nil, a.turns),
    }
  end
  return views
end

local function gauges(a)
  return {
    due = redis.call('ZCOUNT', k('due'), '-inf', int(a.now)),
    running = redis.call('ZCARD', k('running')),
    waiting = redis.call('ZCARD', k('waiting')),
    review = redis.call('ZCARD', k('review')),
    queued_sends = redis.call('ZCARD', k('ready')),
    unknown_sends = redis.call('ZCARD', k('unknown')),
  }
end
