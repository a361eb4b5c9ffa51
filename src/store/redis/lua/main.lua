-- One operation per call: ARGV[1] names it, ARGV[2] holds its arguments as JSON, ARGV[3] is the
-- store's epoch as the calling node read it at start; the reply is its result as JSON, or an
-- error reply "SABI_<WHAT> <why>" written before anything was changed.

-- JSON nulls (cjson.null is a truthy value) become plain absent fields.
local function clean(v)
  if v == cjson.null then
    return nil
  end
  if type(v) == 'table' then
    for name, x in pairs(v) do
      v[name] = clean(x)
    end
  end
  return v
end

local OPS = {
  ingest = ingest, ingest_many = ingest_many, set_transcript = set_transcript, inbox = inbox,
  quarantine = quarantine,
  claim = claim, claim_routine = claim_routine, renew = renew, finish = finish, hold = hold,
  next_due = next_due, history = history,
  set_stage = set_stage, add_usage = add_usage, turn_stats = turn_stats,
  outbox = outbox, claim_sends = claim_sends, depart = depart, record_send = record_send,
  next_send_due = next_send_due, review_queue = review_queue, review_item = review_item,
  resolve_review = resolve_review, conversations = conversations, gauges = gauges,
  submit_chat = submit_chat, chat_owner = chat_owner, job_for_message = job_for_message, chat_job = chat_job,
  chat_history = chat_history, chat_queue_depth = chat_queue_depth, chat_feed = chat_feed, set_route = set_route,
  label_turn = label_turn, routed_turns = routed_turns, create_broadcast = create_broadcast,
  broadcasts = broadcasts, broadcast = broadcast,
  keyed_broadcast = keyed_broadcast, broadcast_recipients = broadcast_recipients,
  control_broadcast = control_broadcast, recipients_load = recipients_load,
  recipients_save = recipients_save, recipients_bill = recipients_bill,
  broadcasts_live = broadcasts_live,
  recipients_lapsed = recipients_lapsed, recipients_due = recipients_due,
  broadcasts_finish = broadcasts_finish, recipients_for_statuses = recipients_for_statuses,
  consents = consents, consent_save = consent_save, broadcast_reach = broadcast_reach,
  broadcast_first_reach = broadcast_first_reach,
  sent_since = sent_since, last_broadcast = last_broadcast,
  customer_export = customer_export, customer_keys = customer_keys, forget = forget,
  linked_ids = linked_ids,
  marker_names = marker_names, rekey_markers = rekey_markers, customer_wamids = customer_wamids,
  sweep_keys = sweep_keys, sweep = sweep, hold_lease = hold_lease,
  category_keep = category_keep, category_get = category_get, price_counts = price_counts,
  desk_thread = desk_thread, open_desk_thread = open_desk_thread,
  close_desk_thread = close_desk_thread, desk_conversation = desk_conversation,
  desk_pending = desk_pending, set_desk_mirrored = set_desk_mirrored,
  claim_desk_message = claim_desk_message,
}

-- Keys lost (a restart without persistence, a flush) and made again start every counter anew:
-- a node that started before must not fence with ids and tokens that now name other work.
if redis.call('GET', k('epoch')) ~= ARGV[3] then
  return redis.error_reply('SABI_RESET the store was reset since this node started; restart it')
end

local op = OPS[ARGV[1]]
if not op then
  return redis.error_reply('SABI_UNKNOWN_OPERATION ' .. ARGV[1])
end
local out = op(clean(cjson.decode(ARGV[2])))
if type(out) == 'table' and out.__error then
  return redis.error_reply(out.__error)
end
return cjson.encode(out)
