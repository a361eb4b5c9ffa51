-- The web chat's side: a question is an inbox message like a WhatsApp one, and its job is the
-- handle its browser asks about. Looking the (session, message id) up, counting the session's
-- recent questions and storing the new one are one script, so neither a double tap nor a burst
-- can slip past.

local POSITION_CAP = 10000

-- The latest review item among the session's last questions' turns: its id, state and batch.
-- Its questions are in the order asked, so the first turn with an item is the latest's.
local function latest_review(session)
  for _, job in ipairs(redis.call('ZREVRANGE', k('sj', session), 0, 99)) do
    local seq = redis.call('HGET', k('job', job), 'seq')
    local batch = seq and redis.call('HGET', k('in', seq), 'batch')
    local id = batch and redis.call('HGET', k('rbatch'), batch)
    if id then
      return {id = id, state = redis.call('HGET', k('r', id), 'state'), batch = batch}
    end
  end
end

local function submit_chat(a)
  -- Before the resend's lookup: another's message id names nothing here.
  local owner = redis.call('HGET', k('owner'), a.session)
  if owner then
    if owner ~= a.user then
      return {not_yours = true}
    end
  elseif a.user then
    redis.call('HSET', k('owner'), a.session, a.user)
  end
  local job = redis.call('HGET', k('jobkey'), a.key)
  if job then
    return {job = job, created = false}
  end
  local recent = redis.call('ZCOUNT', k('sr', a.session), int(a.now - 60000), '+inf')
  if recent >= a.per_minute then
    -- The question whose minute ends first and leaves room for one more.
    local freeing = redis.call('ZRANGEBYSCORE', k('sr', a.session), int(a.now - 60000), '+inf',
      'WITHSCORES', 'LIMIT', recent - a.per_minute, 1)
    return {limited = true, freeing = freeing[2] and tonumber(freeing[2]) or nil}
  end
  if redis.call('ZCARD', k('wc')) >= a.max_queue then
    return {full = true}
  end
  -- A question erased since (its session was forgotten) is never kept again, nor given a job.
  if redis.call('HEXISTS', k('erased'), a.item.kh) == 1 then
    return fail('SABI_NOT_FOUND', 'this question was erased')
  end
  -- While a person holds the conversation (its item is open), the question joins the person's
  -- batch and no turn is scheduled (store::rules::review::destination).
  local latest = latest_review(a.session)
  local to_person = latest and latest.state == REVIEW.open
  if to_person then
    a.item.turn = nil
  end
  local receipt = ingest({items = {a.item}, quarantined = {}, recv = a.now, window = a.window,
    cap = a.cap})
  local seq = redis.call('HGET', k('dedupe'), 'webchat\n' .. a.key)
  if to_person then
    redis.call('ZREM', k('aged', 'msg'), int(seq))
    local conv = redis.call('HGET', k('b', latest.batch), 'conv')
    put(k('in', seq), {state = ITEM.review, batch = latest.batch, conv = conv})
    redis.call('ZADD', k('b', latest.batch, 'msgs'), int(seq), int(seq))
  end
  put(k('job', a.job), {
    session = a.session, mkey = a.key, seq = seq, created = a.now, expires = a.expires,
  })
  redis.call('HSET', k('jobkey'), a.key, a.job)
  redis.call('ZADD', k('sr', a.session), int(a.now), a.job)
  -- Only the last minute's questions count (above): older ones are let go, so a session's
  -- key does not grow with every question it ever asked.
  redis.call('ZREMRANGEBYSCORE', k('sr', a.session), '-inf', '(' .. int(a.now - 60000))
  redis.call('ZADD', k('sj', a.session), seq, a.job)
  return {job = a.job, created = true, due = receipt.due}
end

local function chat_owner(a)
  return redis.call('HGET', k('owner'), a.session) or nil
end

local function job_for_message(a)
  return redis.call('HGET', k('jobkey'), a.key) or nil
end

-- The reply to the batch the question was answered in, its parts joined, and the choices its
-- last part offers (as kept: a JSON list).
local function answer_of(batch)
  local bodies, options = {}, nil
  for _, id in ipairs(redis.call('ZRANGE', k('b', batch, 'parts'), 0, -1)) do
    local o = get(k('o', id), 'body', 'options')
    bodies[#bodies + 1] = o.body
    options = o.options
  end
  if #bodies > 0 then
    return table.concat(bodies, '\n\n'), options
  end
end

local function chat_job(a)
  local j = get(k('job', a.job), 'session', 'created', 'expires', 'seq')
  if not j.session or tonumber(j.expires) <= a.now then
    return nil
  end
  local i = get(k('in', j.seq), 'state', 'batch')
  local view = {session = j.session, created = tonumber(j.created), state = i.state}
  if i.state == ITEM.pending then
    view.position = math.min(redis.call('ZCOUNT', k('wc'), '-inf', '(' .. j.seq), POSITION_CAP)
  elseif i.state == ITEM.answered and i.batch then
    view.answer, view.options = answer_of(i.batch)
  elseif i.state == ITEM.batched and i.batch then
    view.stage = redis.call('HGET', k('b', i.batch), 'stage') or nil
  end
  return view
end

local function chat_history(a)
  if a.limit < 1 then
    return {}
  end
  local below = a.before and ('(' .. int(a.before)) or '+inf'
  local jobs = redis.call('ZREVRANGEBYSCORE', k('sj', a.session), below, '-inf', 'LIMIT', 0,
    a.limit)
  local out = {}
  for n = #jobs, 1, -1 do
    local j = get(k('job', jobs[n]), 'created', 'seq')
    local i = get(k('in', j.seq), 'text', 'state', 'batch')
    out[#out + 1] = {
      job = jobs[n], question = i.text or '', state = i.state, created = tonumber(j.created),
      seq = tonumber(j.seq),
      answer = i.state == ITEM.answered and i.batch and answer_of(i.batch) or nil,
    }
  end
  return out
end

-- What people wrote to the session after `after`, among its last questions' turns, and
-- whether a person holds it now.
local function chat_feed(a)
  local lines, batches = {}, {}
  for _, job in ipairs(redis.call('ZREVRANGE', k('sj', a.session), 0, 99)) do
    local seq = redis.call('HGET', k('job', job), 'seq')
    local batch = seq and redis.call('HGET', k('in', seq), 'batch')
    if batch and not batches[batch] then
      batches[batch] = true
      for _, id in ipairs(redis.call('ZRANGE', k('b', batch, 'parts'), 0, -1)) do
        if tonumber(id) > a.after then
          local o = get(k('o', id), 'body', 'created', 'person')
          if o.person == '1' then
            lines[#lines + 1] = {id = tonumber(id), text = o.body or '', at = tonumber(o.created)}
          end
        end
      end
    end
  end
  table.sort(lines, function(x, y) return x.id < y.id end)
  while #lines > a.limit do
    table.remove(lines)
  end
  local latest = latest_review(a.session)
  return {held = latest ~= nil and latest.state == REVIEW.open, lines = lines}
end

local function chat_queue_depth()
  return redis.call('ZCARD', k('wc'))
end
