-- The sender's side: a part is claimed only as the head of its recipient's queue, with a fresh
-- attempt number its outcome must carry; a send that may have left is never claimed again but
-- waits for its status webhook. The same rules as the SQL backends'.

local WINDOW_CLOSED = 131047

-- Meta's delivery statuses only move forward: the rulebook's ranks.
local RANK = RANK_TABLE

local function rank(status)
  return status and RANK[status] or 0
end

local function note_wamid(id, wamid)
  redis.call('HSET', k('wamid'), wamid, int(id))
end

local function forget_wamid(id)
  local wamid = redis.call('HGET', k('o', id), 'wamid')
  if wamid then
    redis.call('HDEL', k('wamid'), wamid)
    redis.call('HDEL', k('o', id), 'wamid')
  end
end

local function hold_recipient(conv, till)
  local after = tonumber(redis.call('HGET', k('c', conv), 'send_after')) or 0
  put(k('c', conv), {send_after = math.max(after, till)})
  refresh_head(conv)
end

-- Meta's error code of the latest try, or none.
local function set_code(id, code)
  if code then
    put(k('o', id), {error_code = code})
  else
    redis.call('HDEL', k('o', id), 'error_code')
  end
end

-- At most this many lapsed sends settle per claim: the rest wait for the next one.
local SETTLE = 256

-- Claims that lapsed before their part departed go back to the queue. Sends whose lease
-- lapsed may have reached Meta: unknown (returned), or accepted when a status webhook named
-- them meanwhile. Unknown ones past their wait go to review.
local function settle_lapsed(now, wait)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', k('claimed'), '-inf', int(now), 'LIMIT', 0,
      SETTLE)) do
    local closed = redis.call('HGET', k('o', id), 'window_closed') == '1'
    move_part(id, closed and PART.window_closed or PART.queued)
  end
  local unknown = {}
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', k('sending'), '-inf', int(now), 'LIMIT', 0,
      SETTLE)) do
    local o = get(k('o', id), 'wamid', 'sent', 'err')
    if o.wamid then
      move_part(id, PART.accepted, {sent = tonumber(o.sent) or now, updated = now})
    else
      move_part(id, PART.unknown, {
        till = now + wait, err = o.err or 'the sender stopped while sending', updated = now,
      })
      unknown[#unknown + 1] = tonumber(id)
    end
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', k('unknown'), '-inf', int(now), 'LIMIT', 0,
      SETTLE)) do
    move_part(id, PART.review, {updated = now})
    open_review(redis.call('HGET', k('o', id), 'batch'), tonumber(id), REASON.unknown_outcome,
      'no status webhook named this send in time; it may or may not have been delivered', now)
  end
  return unknown
end

local function set_of(list)
  local set = {}
  for _, v in ipairs(list) do
    set[v] = true
  end
  return set
end

-- Hands the head part of a conversation to a sender, held until it departs or `lease` lapses.
local function claim_head(conv, now, lease)
  local id = head_of(conv)
  local o = get(k('o', id), 'state', 'attempts')
  local attempt = tonumber(o.attempts) + 1
  local closed = o.state == PART.window_closed
  move_part(id, PART.claimed, {attempts = attempt, till = now + lease, window_closed = closed})
  local p = get(k('o', id), 'batch', 'part', 'ch', 'biz', 'cust', 'body', 'options',
    'reply_to', 'failures')
  return {
    id = tonumber(id), batch = tonumber(p.batch), part = tonumber(p.part), ch = p.ch,
    biz = p.biz, cust = p.cust, text = p.body, options = p.options, quote = p.reply_to,
    attempt = attempt, failures = tonumber(p.failures), window_closed = closed,
    last_in = tonumber(redis.call('HGET', k('c', conv), 'last_in')),
  }
end

-- Per recipient only the oldest part not yet settled, once its pacing allows, and not from a
-- halted number; the work list is read a page at a time.
local function claim_sends(a)
  local unknown = settle_lapsed(a.now, a.unknown_wait)
  local halted = set_of(a.halted)
  local jobs, skipped = {}, 0
  while #jobs < a.limit do
    local due = redis.call('ZRANGEBYSCORE', k('heads'), '-inf', int(a.now), 'LIMIT', skipped,
      64)
    if #due == 0 then
      break
    end
    for _, member in ipairs(due) do
      local conv = tonumber(member)
      if #jobs >= a.limit then
        break
      end
      if halted[redis.call('HGET', k('c', conv), 'biz')] then
        skipped = skipped + 1
      else
        jobs[#jobs + 1] = claim_head(conv, a.now, a.lease)
      end
    end
  end
  return {jobs = jobs, unknown = unknown}
end

-- A claimed part took its pacing slot: its request may leave from now on.
local function depart(a)
  local o = get(k('o', a.id), 'state', 'attempts')
  if o.state ~= PART.claimed or tonumber(o.attempts) ~= a.attempt then
    return fail('SABI_LEASE_LOST', 'the claim is no longer held')
  end
  move_part(a.id, PART.sending, {till = a.now + a.lease, updated = a.now})
  return true
end

local function next_send_due(a)
  local skip = set_of(a.skip)
  local best, from = nil, 0
  while not best do
    local heads = redis.call('ZRANGE', k('heads'), from, from + 63, 'WITHSCORES')
    if #heads == 0 then
      break
    end
    for i = 1, #heads, 2 do
      if not best and not skip[redis.call('HGET', k('c', tonumber(heads[i])), 'biz')] then
        best = tonumber(heads[i + 1])
      end
    end
    from = from + 64
  end
  return earliest(best, first_score(k('claimed')), first_score(k('sending')),
    first_score(k('unknown')))
end

-- The sender's answer for a part a status webhook settled first: only what the status could
-- not tell is kept (whether the template went, the recipient's spacing from the answer).
local function accepted_again(id, o, r)
  if r.kind ~= 'accepted' or o.wamid ~= r.wamid then
    return fail('SABI_LEASE_LOST', 'a status webhook settled this send')
  end
  if r.template or o.window_closed == '1' then
    put(k('o', id), {kind = KIND.template})
  end
  hold_recipient(o.conv, r.next)
  return true
end

local function record_send(a)
  local id, now, r = a.id, a.now, a.result
  local o = get(k('o', id), 'state', 'attempts', 'batch', 'conv', 'wamid', 'window_closed')
  if o.state == PART.accepted and tonumber(o.attempts) == a.attempt then
    return accepted_again(id, o, r)
  end
  -- A claimed part never left: only "not tried" may end it.
  local held = o.state == PART.sending or (o.state == PART.claimed and r.kind == 'untried')
  if not held or tonumber(o.attempts) ~= a.attempt then
    return fail('SABI_LEASE_LOST', 'the lease is no longer held')
  end
  -- A status webhook already named this send: Meta has it, whatever the sender saw.
  if o.wamid and r.kind ~= 'accepted' then
    r = {kind = 'accepted', wamid = o.wamid, template = false, next = now}
  end
  local closed = o.window_closed == '1'
  local back = closed and PART.window_closed or PART.queued
  if r.kind == 'accepted' then
    if o.wamid ~= r.wamid then
      forget_wamid(id)
    end
    local kind = (r.template or closed) and KIND.template or KIND.text
    move_part(id, PART.accepted, {wamid = r.wamid, kind = kind, sent = now, updated = now})
    note_wamid(id, r.wamid)
    hold_recipient(o.conv, r.next)
  elseif r.kind == 'retry' then
    local failures = tonumber(redis.call('HGET', k('o', id), 'failures')) or 0
    set_code(id, r.code)
    move_part(id, back, {
      next = r.at, failures = failures + (r.failure and 1 or 0), err = r.error, updated = now,
    })
    if r.recipient_after then
      hold_recipient(o.conv, r.recipient_after)
    end
  elseif r.kind == 'untried' then
    move_part(id, back)
  elseif r.kind == 'window_closed' then
    forget_wamid(id)
    set_code(id, r.code)
    redis.call('HDEL', k('o', id), 'next')
    move_part(id, PART.window_closed, {window_closed = true, err = r.error, updated = now})
  elseif r.kind == 'unknown' then
    move_part(id, PART.unknown, {till = r.wait_until, err = r.error, updated = now})
  else
    set_code(id, r.code)
    move_part(id, r.reason == REASON.send_failed and PART.failed or PART.review, {
      err = r.error, updated = now,
    })
    open_review(o.batch, id, r.reason, r.error, now)
  end
  return true
end

-- Closes part `id`'s open review item: a late status settled the part.
local function close_review_of(id, now)
  local review = redis.call('HGET', k('rout'), int(id))
  if review and redis.call('HGET', k('r', review), 'state') == REVIEW.open then
    put(k('r', review), {
      state = REVIEW.closed, resolved = now, resolution = REVIEW.closed, note = SETTLED_BY_STATUS,
    })
    redis.call('ZREM', k('review'), int(review))
  end
end

local function find_sent(st)
  local id = redis.call('HGET', k('wamid'), st.wamid)
  if id then
    return id
  end
  if not st.callback_id then
    return nil
  end
  local o = get(k('o', st.callback_id), 'state', 'attempts', 'wamid')
  local named = o.state == PART.sending or o.state == PART.unknown or o.state == PART.accepted
    or o.state == PART.review
  if named and tonumber(o.attempts) == st.callback_attempt
      and (not o.wamid or o.wamid == st.wamid) then
    return int(st.callback_id)
  end
end

-- A status of a message Sabi sent settles its reply part, in the ingest's script; one being
-- sent holds its recipient for `spacing` from now (Meta took it before the status came).
local function reconcile(st, now, spacing)
  local id = find_sent(st)
  if not id then
    return
  end
  local o = get(k('o', id), 'batch', 'state', 'kind', 'delivery', 'sent', 'wamid')
  -- Meta has it, whether its sender is still in its request, lost the answer, or died: it is
  -- settled at once and never sent again.
  if o.state == PART.sending or o.state == PART.unknown then
    move_part(id, PART.accepted, {wamid = st.wamid, sent = tonumber(o.sent) or now, updated = now})
    note_wamid(id, st.wamid)
    if o.state == PART.sending then
      hold_recipient(redis.call('HGET', k('o', id), 'conv'), now + spacing)
    end
  elseif o.state == PART.review and not o.wamid then
    -- A person was asked because no status came in time; a failure stays with them.
    note_wamid(id, st.wamid)
    put(k('o', id), {wamid = st.wamid, updated = now})
    if st.status ~= DELIVERY.failed then
      move_part(id, PART.accepted, {sent = now})
      o.state = PART.accepted
      close_review_of(id, now)
    end
  end
  if rank(st.status) <= rank(o.delivery) then
    return
  end
  put(k('o', id), {delivery = st.status, updated = now})
  -- Only a failure of a part people do not have yet changes more than its delivery.
  if st.status ~= DELIVERY.failed or o.state == PART.failed or o.state == PART.review then
    return
  end
  local err = 'Meta reported the message failed (code ' .. (st.code and int(st.code) or 'unknown') .. ')'
  if st.code == WINDOW_CLOSED and o.kind == KIND.text then
    forget_wamid(id)
    set_code(id, st.code)
    redis.call('HDEL', k('o', id), 'delivery', 'next')
    move_part(id, PART.window_closed, {window_closed = true, err = err, updated = now})
    return
  end
  set_code(id, st.code)
  move_part(id, PART.failed, {err = err})
  open_review(o.batch, tonumber(id), REASON.send_failed, err, now)
end

local function part_entry(id)
  local o = get(k('o', id), 'batch', 'part', 'ch', 'biz', 'cust', 'body', 'state', 'created',
    'kind', 'attempts', 'wamid', 'delivery', 'error_code', 'err', 'sent')
  local b = get(k('b', o.batch), 'started', 'finished')
  return {
    id = tonumber(id), batch = tonumber(o.batch), part = tonumber(o.part), ch = o.ch,
    biz = o.biz, cust = o.cust, text = o.body, state = o.state, kind = o.kind,
    attempts = tonumber(o.attempts), wamid = o.wamid, delivery = o.delivery,
    error_code = tonumber(o.error_code), error = o.err, created = tonumber(o.created),
    sent = tonumber(o.sent), started = tonumber(b.started),
    finished = tonumber(b.finished) or tonumber(o.created),
  }
end
