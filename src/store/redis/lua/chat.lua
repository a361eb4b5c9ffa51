-- The web chat's side: a question is an inbox message like a WhatsApp one, and its job is the
-- handle its browser asks about. Looking the (session, message id) up, counting the session's
-- recent questions and storing the new one are one script, so neither a double tap nor a burst
-- can slip past.

local POSITION_CAP = 10000

local function submit_chat(a)
  local job = redis.call('HGET', k('jobkey'), a.key)
  if job then
    return {job = job, created = false}
  end
  if redis.call('ZCOUNT', k('sr', a.session), int(a.now - 60000), '+inf') >= a.per_minute then
    return {limited = true}
  end
  if redis.call('ZCARD', k('wc')) >= a.max_queue then
    return {full = true}
  end
  -- A question erased since (its session was forgotten) is never kept again, nor given a job.
  if redis.call('HEXISTS', k('erased'), a.item.kh) == 1 then
    return fail('SABI_NOT_FOUND', 'this question was erased')
  end
  local receipt = ingest({items = {a.item}, quarantined = {}, recv = a.now, window = a.window,
    cap = a.cap})
  local seq = redis.call('HGET', k('dedupe'), 'webchat\n' .. a.key)
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

local function job_for_message(a)
  return redis.call('HGET', k('jobkey'), a.key) or nil
end

local function answer_of(batch)
  local bodies = {}
  for _, id in ipairs(redis.call('ZRANGE', k('b', batch, 'parts'), 0, -1)) do
    bodies[#bodies + 1] = redis.call('HGET', k('o', id), 'body')
  end
  if #bodies > 0 then
    return table.concat(bodies, '\n\n')
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
    view.answer = answer_of(i.batch)
  elseif i.state == ITEM.batched and i.batch then
    view.stage = redis.call('HGET', k('b', i.batch), 'stage') or nil
  end
  return view
end

local function chat_history(a)
  if a.limit < 1 then
    return {}
  end
  local jobs = redis.call('ZREVRANGE', k('sj', a.session), 0, a.limit - 1)
  local out = {}
  for n = #jobs, 1, -1 do
    local j = get(k('job', jobs[n]), 'created', 'seq')
    local i = get(k('in', j.seq), 'text', 'state', 'batch')
    out[#out + 1] = {
      job = jobs[n], question = i.text or '', state = i.state, created = tonumber(j.created),
      answer = i.state == ITEM.answered and i.batch and answer_of(i.batch) or nil,
    }
  end
  return out
end

local function chat_queue_depth()
  return redis.call('ZCARD', k('wc'))
end
