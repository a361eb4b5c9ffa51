//! What crosses to and from the script: arguments as JSON, and the JSON shapes of its replies
//! with how they become the store's types. Field names are the script's own (its hash fields).

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};

use crate::clock::{At, UnixSeconds, millis};
use crate::domain::{
    Batch, BatchMessage, Channel, Claim, ConversationKey, InboundItem, ItemKind, LeaseToken,
    ReplyPart, ReviewReason,
};
use crate::store::items::{
    Encoded, amendment, known, options_of, quarantine_hash, sent_at, status_of,
};
use crate::store::rules::batch::{BatchState, answered_by};
use crate::store::rules::broadcast::{
    self, BroadcastState, Event as RecipientEvent, Limits, PausedBy, Recipient, RecipientState,
    SkipReason,
};
use crate::store::rules::consent::{Choice, Source};
use crate::store::rules::erasure::Erased;
use crate::store::rules::erasure::Marks;
use crate::store::rules::hours::{LocalHours, Turn};
use crate::store::rules::identity;
use crate::store::rules::item::ItemState;
use crate::store::rules::part::{Delivery, PartKind, PartState};
use crate::store::rules::price;
use crate::store::rules::review::{self, ReviewState};
use crate::store::{
    BroadcastSend, BroadcastView, ChatExchange, ChatFeed, ChatJob, ConversationView,
    CustomerRecord, Ending, Error, Gauges, HistoryEntry, Ingest, OutboxEntry, PersonLine,
    REPLY_SPAN, RecipientJob, RecipientView, Resolution, Result, ReviewEntry, ReviewRecord,
    RouteGuess, RoutedTurn, SendJob, SendResult, Speaker, StoredItem, StoredQuarantine, TurnStats,
    parse_send_callback, recipient_counts,
};

/// A list in a reply. Lua's JSON encoder cannot tell an empty list from an empty object and
/// writes `{}`; any other object is still an error.
#[derive(Debug, Default)]
pub(super) struct List<T>(pub(super) Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for List<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Shape<T> {
            Items(Vec<T>),
            Empty(std::collections::BTreeMap<String, ()>),
        }
        match Shape::deserialize(d)? {
            Shape::Items(items) => Ok(List(items)),
            Shape::Empty(map) if map.is_empty() => Ok(List(Vec::new())),
            Shape::Empty(_) => Err(serde::de::Error::custom("expected a list")),
        }
    }
}

fn channel(name: &str) -> Result<Channel> {
    Channel::parse(name).ok_or_else(|| Error::Schema(format!("unknown channel {name:?}")))
}

fn conversation(ch: &str, biz: String, cust: String) -> Result<ConversationKey> {
    Ok(ConversationKey {
        channel: channel(ch)?,
        business: biz,
        customer: cust,
    })
}

/// A delivery as the script takes it: each item with its hash, and what a status settles.
pub(super) fn delivery(d: &Ingest, marks: &Marks) -> Value {
    json!({
        "recv": d.received_at,
        "reply_since": d.received_at - REPLY_SPAN,
        "window": millis(d.policy.window),
        "cap": millis(d.policy.cap),
        "spacing": millis(d.pair_spacing),
        "items": d.items.iter().map(|i| {
            let mut kept = item(i, d.received_at, !d.routine.contains(&i.dedupe_key), marks);
            if i.kind == ItemKind::Echo {
                let at = sent_at(i, d.received_at);
                kept["held_until"] = json!(review::held_after_reply(at, d.human_hold));
            }
            kept
        }).collect::<Vec<_>>(),
        "quarantined": d.quarantined.iter().map(|q| json!({
            "ch": q.channel.as_str(),
            "reason": q.reason,
            "raw": q.raw,
            "hash": hex::encode(quarantine_hash(q)),
        })).collect::<Vec<_>>(),
    })
}

/// One item as the script keeps it; `sent` is when its customer sent it, which starts the
/// 24-hour window; `model`, that it puts its conversation in the model's lane.
pub(super) fn item(item: &InboundItem, received_at: At, model: bool, marks: &Marks) -> Value {
    let Encoded { facts, hash } = Encoded::of(item);
    json!({
        "ch": item.channel.as_str(),
        "key": item.dedupe_key,
        "kind": item.kind.as_str(),
        "biz": item.business,
        "cust": item.customer,
        "type": item.item_type,
        "text": item.text,
        "media": item.media_id,
        "pts": item.provider_ts,
        "sent": sent_at(item, received_at),
        "hash": hex::encode(hash),
        // What stays of the key once erased: a retry finds it (store/rules/erasure.rs).
        "kh": marks.key_hash(item.channel, &item.dedupe_key),
        "facts": facts,
        "ids": match item.channel {
            Channel::Whatsapp => identity::ids(item),
            Channel::Webchat => Vec::new(),
        },
        "link": identity::links(item.kind),
        "turn": item.turn.as_ref().map(|t| json!({
            "ch": t.channel.as_str(), "biz": t.business, "cust": t.customer, "model": model,
        })),
        "status": status(item),
        "price": price::of(item).map(|p| json!({
            "key": p.key, "hour": price::hour(received_at), "prefix": p.prefix,
            "cat": p.category, "type": p.kind,
            // A Lua false reads as absent.
            "billed": if p.billed { "y" } else { "n" },
        })),
        "amends": amendment(item).map(|change| json!({
            "original": change.original(), "text": change.text(),
        })),
    })
}

/// The status of a message Sabi sent: which send it names, and how it went. Only a status that
/// says something of delivery: the rulebook lets any other (`deleted`, ...) change nothing, not
/// even a send it names.
fn status(item: &InboundItem) -> Option<Value> {
    if item.kind != ItemKind::Status {
        return None;
    }
    let facts = &item.facts;
    let delivery = Delivery::parse(facts["status"].as_str()?)?;
    let callback = facts["biz_opaque_callback_data"]
        .as_str()
        .and_then(parse_send_callback);
    Some(json!({
        "wamid": facts["id"].as_str()?,
        "status": delivery.as_str(),
        "callback_id": callback.map(|c| c.0),
        "callback_attempt": callback.map(|c| c.1),
        "code": facts["error_codes"].get(0).and_then(Value::as_i64),
    }))
}

pub(super) fn parts(parts: &[ReplyPart]) -> Value {
    parts
        .iter()
        .map(|p| {
            let options = (!p.options.is_empty())
                .then(|| serde_json::to_string(&p.options).unwrap_or_default());
            json!({"text": p.text, "options": options, "quote": p.quote})
        })
        .collect()
}

pub(super) fn ending(e: &Ending) -> Value {
    match e {
        Ending::Replied { parts: p, sandbox } => {
            json!({"kind": "replied", "parts": parts(p), "sandbox": sandbox})
        }
        Ending::RetryAt { at, error } => json!({"kind": "retry", "at": at, "error": error}),
        Ending::Review { reason, error } => {
            json!({"kind": "review", "reason": reason.as_str(), "error": error})
        }
        Ending::Handoff {
            parts: p,
            sandbox,
            note,
        } => json!({"kind": "handoff", "parts": parts(p), "sandbox": sandbox, "note": note}),
    }
}

pub(super) fn send_result(r: &SendResult) -> Value {
    match r {
        SendResult::Accepted {
            wamid,
            template,
            next_send_at,
        } => {
            json!({"kind": "accepted", "wamid": wamid, "template": template, "next": next_send_at})
        }
        SendResult::Retry {
            at,
            failure,
            code,
            error,
            recipient_after,
        } => json!({
            "kind": "retry", "at": at, "failure": failure, "code": code, "error": error,
            "recipient_after": recipient_after,
        }),
        SendResult::Untried => json!({"kind": "untried"}),
        SendResult::WindowClosed { code, error } => {
            json!({"kind": "window_closed", "code": code, "error": error})
        }
        SendResult::Unknown { error, wait_until } => {
            json!({"kind": "unknown", "error": error, "wait_until": wait_until})
        }
        SendResult::Review {
            reason,
            code,
            error,
        } => json!({"kind": "review", "reason": reason.as_str(), "code": code, "error": error}),
    }
}

/// A person's resolution at `now`, with the hold on the conversation it leaves.
pub(super) fn resolution(r: &Resolution, now: At) -> Value {
    let mut how = match r {
        Resolution::Reply {
            text,
            sandbox,
            desk,
            ..
        } => json!({
            "kind": "reply", "text": text, "sandbox": sandbox, "desk": desk,
            "desk_keep": millis(review::DESK_REPLY_MEMORY),
        }),
        Resolution::Requeue => json!({"kind": "requeue"}),
        Resolution::Close => json!({"kind": "close"}),
    };
    how["held_until"] = json!(review::hold_after(r, now));
    how
}

#[derive(Deserialize)]
pub(super) struct Receipt {
    pub(super) stored: usize,
    pub(super) duplicates: usize,
    pub(super) anomalies: List<String>,
    /// Field events kept for the first time, by dedupe key.
    pub(super) events: List<String>,
    pub(super) quarantined: usize,
    pub(super) due: Option<At>,
    /// Messages priced for the first time, as (category, type).
    pub(super) priced: List<(String, String)>,
}

/// One page of a listing, and where the next one starts.
#[derive(Deserialize)]
pub(super) struct Page<T> {
    pub(super) items: List<T>,
    pub(super) last: Option<i64>,
    pub(super) more: bool,
}

#[derive(Deserialize)]
pub(super) struct RawMessage {
    seq: i64,
    key: String,
    #[serde(rename = "type")]
    item_type: Option<String>,
    text: Option<String>,
    media: Option<String>,
    pts: Option<UnixSeconds>,
    recv: At,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    address: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct RawBatch {
    id: i64,
    ch: String,
    biz: String,
    cust: String,
    due: At,
    #[serde(default)]
    held: Option<At>,
    messages: List<RawMessage>,
}

impl RawBatch {
    /// The batch, its messages in the order the customer sent them (unknown times first, as
    /// the SQLite backend orders them).
    pub(super) fn into_batch(self) -> Result<Batch> {
        let mut messages: Vec<BatchMessage> = self
            .messages
            .0
            .into_iter()
            .map(|m| BatchMessage {
                seq: m.seq,
                external_id: m.key,
                item_type: m.item_type,
                text: m.text,
                media_id: m.media,
                provider_ts: m.pts,
                received_at: m.recv,
                user: m.user,
                address: m.address,
            })
            .collect();
        messages.sort_by_key(|m| (m.provider_ts, m.seq));
        Ok(Batch {
            id: self.id,
            conversation: conversation(&self.ch, self.biz, self.cust)?,
            messages,
            due_at: self.due,
            held_until: self.held,
        })
    }
}

#[derive(Deserialize)]
pub(super) struct RawClaim {
    batch: RawBatch,
    token: i64,
    attempt: u32,
    requeued: bool,
}

impl RawClaim {
    pub(super) fn into_claim(self) -> Result<Claim> {
        Ok(Claim {
            batch: self.batch.into_batch()?,
            token: LeaseToken(self.token),
            attempt: self.attempt,
            requeued: self.requeued,
        })
    }
}

#[derive(Deserialize)]
pub(super) struct RawItem {
    seq: i64,
    ch: String,
    key: String,
    kind: String,
    biz: Option<String>,
    cust: Option<String>,
    #[serde(rename = "type")]
    item_type: Option<String>,
    text: Option<String>,
    media: Option<String>,
    pts: Option<UnixSeconds>,
    recv: At,
    state: String,
    batch: Option<i64>,
    facts: String,
}

impl RawItem {
    pub(super) fn into_item(self) -> Result<StoredItem> {
        Ok(StoredItem {
            seq: self.seq,
            item: InboundItem {
                kind: ItemKind::parse(&self.kind)
                    .ok_or_else(|| Error::Schema(format!("unknown kind {:?}", self.kind)))?,
                channel: channel(&self.ch)?,
                dedupe_key: self.key,
                business: self.biz,
                customer: self.cust,
                item_type: self.item_type,
                text: self.text,
                media_id: self.media,
                provider_ts: self.pts,
                turn: None,
                facts: serde_json::from_str(&self.facts)
                    .map_err(|e| Error::Schema(format!("undecodable facts: {e}")))?,
            },
            received_at: self.recv,
            state: known(ItemState::parse, &self.state)?,
            batch: self.batch,
        })
    }
}

#[derive(Deserialize)]
pub(super) struct RawQuarantined {
    id: i64,
    ch: String,
    recv: At,
    reason: String,
    raw: String,
}

impl RawQuarantined {
    pub(super) fn into_quarantined(self) -> Result<StoredQuarantine> {
        Ok(StoredQuarantine {
            id: self.id,
            received_at: self.recv,
            quarantined: crate::domain::Quarantined {
                channel: channel(&self.ch)?,
                reason: self.reason,
                raw: self.raw,
            },
        })
    }
}

#[derive(Deserialize)]
pub(super) struct RawPart {
    id: i64,
    batch: i64,
    part: u32,
    ch: String,
    biz: String,
    cust: String,
    text: String,
    state: String,
    kind: String,
    attempts: u32,
    wamid: Option<String>,
    delivery: Option<String>,
    error_code: Option<i64>,
    error: Option<String>,
    created: At,
    sent: Option<At>,
    started: At,
    finished: At,
}

impl RawPart {
    pub(super) fn into_entry(self) -> Result<OutboxEntry> {
        Ok(OutboxEntry {
            id: self.id,
            batch_id: self.batch,
            part: self.part,
            conversation: conversation(&self.ch, self.biz, self.cust)?,
            text: self.text,
            state: known(PartState::parse, &self.state)?,
            kind: known(PartKind::parse, &self.kind)?,
            attempts: self.attempts,
            wamid: self.wamid,
            delivery: self
                .delivery
                .map(|d| known(Delivery::parse, &d))
                .transpose()?,
            error_code: self.error_code,
            error: self.error,
            created_at: self.created,
            sent_at: self.sent,
            turn_started_at: self.started,
            turn_finished_at: self.finished,
        })
    }
}

/// What `claim_sends` took, and the sends it found lapsed.
#[derive(Deserialize)]
pub(super) struct RawSendClaims {
    pub(super) jobs: List<RawSendJob>,
    pub(super) unknown: List<i64>,
}

#[derive(Deserialize)]
pub(super) struct RawSendJob {
    id: i64,
    batch: i64,
    part: u32,
    ch: String,
    biz: String,
    cust: String,
    text: String,
    options: Option<String>,
    quote: Option<String>,
    attempt: u32,
    failures: u32,
    window_closed: bool,
    last_in: Option<At>,
}

impl RawSendJob {
    pub(super) fn into_job(self) -> Result<SendJob> {
        Ok(SendJob {
            id: self.id,
            batch_id: self.batch,
            part: self.part,
            conversation: conversation(&self.ch, self.biz, self.cust)?,
            text: self.text,
            options: self
                .options
                .and_then(|o| serde_json::from_str(&o).ok())
                .unwrap_or_default(),
            quote: self.quote,
            attempt: self.attempt,
            failures: self.failures,
            window_closed: self.window_closed,
            last_inbound_at: self.last_in,
        })
    }
}

#[derive(Deserialize)]
pub(super) struct RawReview {
    id: i64,
    batch: RawBatch,
    outbox: Option<i64>,
    state: String,
    reason: String,
    error: Option<String>,
    created: At,
}

impl RawReview {
    pub(super) fn into_entry(self) -> Result<ReviewEntry> {
        let batch = self.batch.into_batch()?;
        Ok(ReviewEntry {
            id: self.id,
            batch_id: batch.id,
            outbox_id: self.outbox,
            state: known(ReviewState::parse, &self.state)?,
            conversation: batch.conversation,
            reason: known(ReviewReason::parse, &self.reason)?,
            error: self.error,
            created_at: self.created,
            messages: batch.messages,
        })
    }
}

#[derive(Deserialize)]
pub(super) struct RawLine {
    at: At,
    speaker: String,
    text: String,
}

pub(super) fn history(lines: List<RawLine>) -> Vec<HistoryEntry> {
    lines
        .0
        .into_iter()
        .map(|l| HistoryEntry {
            at: l.at,
            speaker: match l.speaker.as_str() {
                "customer" => Speaker::Customer,
                "business" => Speaker::Business,
                _ => Speaker::Note,
            },
            text: l.text,
        })
        .collect()
}

#[derive(Deserialize)]
pub(super) struct RawConversation {
    ch: String,
    biz: String,
    cust: String,
    last_in: Option<At>,
    history: List<RawLine>,
}

impl RawConversation {
    pub(super) fn into_view(self) -> Result<ConversationView> {
        Ok(ConversationView {
            conversation: conversation(&self.ch, self.biz, self.cust)?,
            last_inbound_at: self.last_in,
            history: history(self.history),
        })
    }
}

/// A broadcast as the scripts return it.
#[derive(Deserialize)]
pub(super) struct RawBroadcast {
    id: i64,
    key: Option<String>,
    name: String,
    template: String,
    language: String,
    business: String,
    state: String,
    paused_because: Option<String>,
    paused_by: Option<String>,
    body: Option<String>,
    quiet_hours: Option<String>,
    tz: Option<String>,
    local_start: Option<String>,
    local_until: Option<String>,
    created: At,
    start: At,
    deadline: Option<At>,
    rate: u32,
    counts: HashMap<String, u64>,
}

impl RawBroadcast {
    pub(super) fn into_view(self) -> Result<BroadcastView> {
        let mut counts = Vec::with_capacity(self.counts.len());
        for (name, n) in self.counts {
            counts.push((known(RecipientState::parse, &name)?, n));
        }
        Ok(BroadcastView {
            id: self.id,
            key: self.key,
            name: self.name,
            template: self.template,
            language: self.language,
            business: self.business,
            state: known(BroadcastState::parse, &self.state)?,
            paused_because: self.paused_because,
            paused_by: self
                .paused_by
                .as_deref()
                .map(|by| known(PausedBy::parse, by))
                .transpose()?,
            body: self.body,
            quiet_hours: self.quiet_hours,
            tz: self.tz,
            local_start: self.local_start,
            local_until: self.local_until,
            created_at: self.created,
            start_at: self.start,
            until: self.deadline,
            rate: self.rate,
            recipients: counts.iter().map(|(_, n)| n).sum(),
            counts: recipient_counts(counts),
        })
    }
}

/// What `create_broadcast` answers.
#[derive(Deserialize)]
pub(super) struct RawCreated {
    pub(super) created: bool,
    pub(super) broadcast: RawBroadcast,
}

/// A recipient as `broadcast_recipients` returns it.
#[derive(Deserialize)]
pub(super) struct RawRecipient {
    id: i64,
    to: String,
    params: String,
    line: Option<u64>,
    state: String,
    skipped: Option<String>,
    error: Option<String>,
    error_code: Option<i64>,
    wamid: Option<String>,
    sent: Option<At>,
    replied: Option<At>,
    tz: Option<String>,
    billed: Option<bool>,
    pricing: Option<String>,
}

impl RawRecipient {
    pub(super) fn into_view(self) -> Result<RecipientView> {
        Ok(RecipientView {
            id: self.id,
            to: self.to,
            params: serde_json::from_str(&self.params).unwrap_or_default(),
            line: self.line,
            state: known(RecipientState::parse, &self.state)?,
            skipped: self
                .skipped
                .map(|s| known(SkipReason::parse, &s))
                .transpose()?,
            error: self.error,
            error_code: self.error_code,
            wamid: self.wamid,
            sent_at: self.sent,
            replied_at: self.replied,
            tz: self.tz,
            billed: self.billed,
            pricing: self.pricing,
        })
    }
}

/// A recipient as the scripts load it, with what its send needs when it is due.
#[derive(Deserialize)]
pub(super) struct RawRecipientRow {
    pub(super) id: i64,
    pub(super) bc: i64,
    to: String,
    params: String,
    state: String,
    skipped: Option<String>,
    error: Option<String>,
    error_code: Option<i64>,
    wamid: Option<String>,
    delivery: Option<String>,
    attempts: Option<u32>,
    failures: Option<u32>,
    holds: Option<u32>,
    next: Option<At>,
    lease: Option<At>,
    sent: Option<At>,
    template: Option<String>,
    language: Option<String>,
    business: Option<String>,
    rate: Option<u32>,
    /// Whether its customer opted out of broadcasts, or is inside the cooldown (as a claim
    /// reads it).
    opted_out: Option<bool>,
    in_cooldown: Option<bool>,
    /// Its IANA time zone, when known.
    pub(super) tz: Option<String>,
    /// Which of the asked statuses named it (1-based, as Lua counts).
    i: Option<usize>,
}

impl RawRecipientRow {
    /// The index of the status that named it.
    pub(super) fn index(&self) -> Option<usize> {
        self.i?.checked_sub(1)
    }

    /// What a claim does with it (see [`broadcast::on_claim`]).
    pub(super) fn on_claim(&self, turn: Turn, lease: Duration) -> RecipientEvent<'static> {
        let (opted_out, in_cooldown) =
            (self.opted_out == Some(true), self.in_cooldown == Some(true));
        broadcast::on_claim(turn, opted_out, in_cooldown, lease)
    }

    fn recipient(&self) -> Result<Recipient> {
        Ok(Recipient {
            state: known(RecipientState::parse, &self.state)?,
            attempts: self.attempts.unwrap_or(0),
            failures: self.failures.unwrap_or(0),
            holds: self.holds.unwrap_or(0),
            wamid: self.wamid.clone(),
            delivery: self
                .delivery
                .as_deref()
                .map(|d| known(Delivery::parse, d))
                .transpose()?,
            skipped: self
                .skipped
                .as_deref()
                .map(|s| known(SkipReason::parse, s))
                .transpose()?,
            error_code: self.error_code,
            error: self.error.clone(),
            next_attempt_at: self.next,
            until: self.lease,
            sent_at: self.sent,
        })
    }

    /// The save `event` asks for by the rulebook, guarded by the state and attempt read;
    /// `None` when the rulebook refuses it. One that opts the customer out says when
    /// (`opted_out_at`), for the saver to keep their choice.
    pub(super) fn step(
        &self,
        event: &RecipientEvent<'_>,
        now: At,
        limits: Limits,
    ) -> Result<Option<Value>> {
        let before = self.recipient()?;
        let Ok(step) = broadcast::next(&before, event, now, limits) else {
            return Ok(None);
        };
        let r = step.recipient;
        Ok(Some(json!({
            "id": self.id,
            "to": self.to,
            "opted_out_at": step.opted_out.then_some(now),
            "expect_state": before.state.as_str(),
            "expect_attempts": before.attempts,
            "state": r.state.as_str(),
            "waiting": r.state.claimable(),
            "attempts": r.attempts,
            "failures": r.failures,
            "holds": r.holds,
            "skipped": r.skipped.map(SkipReason::as_str),
            "error": r.error,
            "error_code": r.error_code,
            "wamid": r.wamid,
            "delivery": r.delivery.map(Delivery::as_str),
            "next": r.next_attempt_at,
            "lease": r.until,
            "sent": r.sent_at,
        })))
    }

    /// A claim's save and the attempt it hands out; `None` when the rulebook refuses it.
    pub(super) fn claimed(
        &self,
        claim: &RecipientEvent<'_>,
        now: At,
    ) -> Result<Option<(Value, u32)>> {
        Ok(self
            .step(claim, now, Limits::NONE)?
            .map(|write| (write, self.attempts.unwrap_or(0) + 1)))
    }

    pub(super) fn into_job(self, attempt: u32) -> RecipientJob {
        RecipientJob {
            id: self.id,
            broadcast_id: self.bc,
            attempt,
            to: self.to,
            params: serde_json::from_str(&self.params).unwrap_or_default(),
            template: self.template.unwrap_or_default(),
            language: self.language.unwrap_or_default(),
            business: self.business.unwrap_or_default(),
            rate: self.rate.unwrap_or(1),
        }
    }
}

/// A live broadcast, for time to move on.
#[derive(Deserialize)]
pub(super) struct RawLive {
    pub(super) id: i64,
    pub(super) state: String,
    pub(super) start: At,
    pub(super) deadline: Option<At>,
    pub(super) template: String,
    pub(super) language: String,
    pub(super) paused_by: Option<String>,
    pub(super) quiet_hours: Option<String>,
    pub(super) tz: Option<String>,
    pub(super) local_start: Option<String>,
    pub(super) local_until: Option<String>,
}

impl RawLive {
    pub(super) fn hours(&self) -> Option<LocalHours> {
        LocalHours::stored(
            self.quiet_hours.as_deref(),
            self.tz.as_deref(),
            self.local_start.as_deref(),
            self.local_until.as_deref(),
        )
    }
}

/// A turn the router guessed at, as `routed_turns` returns it.
#[derive(Deserialize)]
pub(super) struct RawRouted {
    batch: i64,
    intent: String,
    confidence: f32,
    #[serde(rename = "local")]
    routed_locally: bool,
    state: String,
    used_model: bool,
    label: Option<String>,
    finished: At,
    text: String,
}

impl RawRouted {
    /// The turn, unless it has not ended (a lapsed lease read mid-way).
    pub(super) fn into_turn(self) -> Result<Option<RoutedTurn>> {
        let state = known(BatchState::parse, &self.state)?;
        Ok(
            answered_by(state, self.used_model, self.routed_locally).map(|answered_by| {
                RoutedTurn {
                    batch_id: self.batch,
                    text: self.text,
                    guess: RouteGuess {
                        intent: self.intent,
                        confidence: self.confidence,
                        local: self.routed_locally,
                    },
                    answered_by,
                    label: self.label,
                    finished_at: self.finished,
                }
            }),
        )
    }
}

#[derive(Deserialize)]
pub(super) struct RawGauges {
    due: u64,
    running: u64,
    waiting: u64,
    review: u64,
    queued_sends: u64,
    unknown_sends: u64,
}

impl From<RawGauges> for Gauges {
    fn from(g: RawGauges) -> Gauges {
        Gauges {
            due: g.due,
            running: g.running,
            waiting: g.waiting,
            review: g.review,
            queued_sends: g.queued_sends,
            unknown_sends: g.unknown_sends,
        }
    }
}

#[derive(Deserialize)]
pub(super) struct RawStats {
    local_turns: u64,
    agent: u64,
    people: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    cost: f64,
}

impl From<RawStats> for TurnStats {
    fn from(s: RawStats) -> TurnStats {
        TurnStats {
            local: s.local_turns,
            agent: s.agent,
            people: s.people,
            prompt_tokens: s.prompt_tokens,
            completion_tokens: s.completion_tokens,
            cost: s.cost,
        }
    }
}

#[derive(Deserialize)]
pub(super) struct RawReceipt {
    pub(super) job: Option<String>,
    #[serde(default)]
    pub(super) created: bool,
    pub(super) due: Option<At>,
    #[serde(default)]
    pub(super) limited: bool,
    #[serde(default)]
    pub(super) full: bool,
    /// Limited: when the question that frees a place in the session's minute was asked.
    pub(super) freeing: Option<At>,
    #[serde(default)]
    pub(super) not_yours: bool,
}

#[derive(Deserialize)]
pub(super) struct RawJob {
    session: String,
    created: At,
    state: String,
    position: Option<u64>,
    answer: Option<String>,
    #[serde(default)]
    options: Option<String>,
    stage: Option<String>,
}

impl RawJob {
    pub(super) fn into_job(self, job_id: &str) -> ChatJob {
        ChatJob {
            job_id: job_id.to_owned(),
            session_id: self.session,
            status: status_of(&self.state),
            stage: self.stage,
            position: self.position,
            answer: self.answer,
            options: options_of(self.options.as_deref()),
            created_at: self.created,
        }
    }
}

#[derive(Deserialize)]
pub(super) struct RawExchange {
    job: String,
    question: String,
    state: String,
    created: At,
    answer: Option<String>,
    seq: i64,
}

impl From<RawExchange> for ChatExchange {
    fn from(e: RawExchange) -> ChatExchange {
        ChatExchange {
            cursor: e.seq,
            job_id: e.job,
            question: e.question,
            answer: e.answer,
            status: status_of(&e.state),
            asked_at: e.created,
        }
    }
}

/// A session's feed as `chat_feed` returns it.
#[derive(Deserialize)]
pub(super) struct RawFeed {
    held: bool,
    lines: List<RawPersonLine>,
}

#[derive(Deserialize)]
struct RawPersonLine {
    id: i64,
    text: String,
    at: At,
}

impl From<RawFeed> for ChatFeed {
    fn from(f: RawFeed) -> ChatFeed {
        ChatFeed {
            held: f.held,
            lines: f
                .lines
                .0
                .into_iter()
                .map(|l| PersonLine {
                    id: l.id,
                    text: l.text,
                    at: l.at,
                })
                .collect(),
        }
    }
}

/// A customer's choice about broadcasts as the store keeps it: JSON in the consent hash.
#[derive(Serialize, Deserialize, PartialEq)]
pub(super) struct RawChoice {
    opted_out: bool,
    source: String,
    at: At,
}

impl RawChoice {
    pub(super) fn of(choice: &Choice) -> RawChoice {
        RawChoice {
            opted_out: choice.opted_out,
            source: choice.source.as_str().to_owned(),
            at: choice.at,
        }
    }

    pub(super) fn choice(&self) -> Result<Choice> {
        Ok(Choice {
            opted_out: self.opted_out,
            source: known(Source::parse, &self.source)?,
            at: self.at,
        })
    }
}

/// A kept choice, by customer, as the JSON the hash holds.
#[derive(Deserialize)]
pub(super) struct RawConsent {
    pub(super) customer: String,
    pub(super) choice: String,
}

/// The last broadcast a customer was sent, as `last_broadcast` returns it.
#[derive(Deserialize)]
pub(super) struct RawLastBroadcast {
    pub(super) sent: At,
    pub(super) params: String,
    pub(super) template: String,
    pub(super) body: Option<String>,
    pub(super) business: String,
}

/// Everything about a customer, as `customer_export` returns it.
#[derive(Deserialize)]
pub(super) struct RawExport {
    items: List<RawItem>,
    parts: List<RawPart>,
    reviews: List<RawReviewRecord>,
    sends: List<RawSend>,
    consent: Option<String>,
}

#[derive(Deserialize)]
struct RawReviewRecord {
    id: i64,
    batch: i64,
    reason: String,
    state: String,
    error: Option<String>,
    created: At,
    resolved: Option<At>,
    note: Option<String>,
}

#[derive(Deserialize)]
struct RawSend {
    recipient: RawRecipient,
    bc: i64,
    name: String,
    template: String,
}

impl RawExport {
    pub(super) fn into_record(self) -> Result<CustomerRecord> {
        let reviews = self.reviews.0.into_iter().map(|r| {
            Ok(ReviewRecord {
                id: r.id,
                batch_id: r.batch,
                reason: known(ReviewReason::parse, &r.reason)?,
                state: known(ReviewState::parse, &r.state)?,
                error: r.error,
                created_at: r.created,
                resolved_at: r.resolved,
                note: r.note,
            })
        });
        let broadcasts = self.sends.0.into_iter().map(|s| {
            Ok(BroadcastSend {
                broadcast_id: s.bc,
                name: s.name,
                template: s.template,
                recipient: s.recipient.into_view()?,
            })
        });
        let consent = self
            .consent
            .map(|json| {
                serde_json::from_str::<RawChoice>(&json)
                    .map_err(|e| Error::Schema(format!("undecodable choice {json:?}: {e}")))?
                    .choice()
            })
            .transpose()?;
        Ok(CustomerRecord {
            items: self
                .items
                .0
                .into_iter()
                .map(RawItem::into_item)
                .collect::<Result<_>>()?,
            replies: self
                .parts
                .0
                .into_iter()
                .map(RawPart::into_entry)
                .collect::<Result<_>>()?,
            reviews: reviews.collect::<Result<_>>()?,
            broadcasts: broadcasts.collect::<Result<_>>()?,
            consent,
        })
    }
}

/// What `marker_names` read: which marker secrets the store is under (none: unkeyed, or a new
/// store), its markers and its erased keys' hashes.
#[derive(Deserialize)]
pub(super) struct RawMarkerNames {
    pub(super) fingerprint: Option<String>,
    pub(super) markers: List<String>,
    pub(super) hashes: List<String>,
}

/// A message `sweep_keys` found about to go, for its key to be hashed.
#[derive(Deserialize)]
pub(super) struct RawKey {
    pub(super) ch: String,
    pub(super) key: String,
}

impl RawKey {
    /// The key's hash under the name the scripts look it up by: "<channel>\n<key>".
    pub(super) fn hashed(&self, marks: &Marks) -> Result<(String, String)> {
        let hash = marks.key_hash(channel(&self.ch)?, &self.key);
        Ok((format!("{}\n{}", self.ch, self.key), hash))
    }
}

/// What `forget` did: nothing while work for the customer is under way (`running`,
/// `sending`) or an item came since its keys were read (`stale`); else what it erased.
#[derive(Deserialize)]
pub(super) struct RawForget {
    #[serde(default)]
    pub(super) running: bool,
    #[serde(default)]
    pub(super) sending: bool,
    pub(super) erased: Option<Erased>,
}
