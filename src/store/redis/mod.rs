//! Redis (or Valkey) backend: several Sabi nodes share one server.
//!
//! Every operation is one run of one Lua script (`lua/`, sent once and then called by its
//! hash). Redis runs a script alone, so an ingest's append, deduplication and scheduling, a
//! claim, or a turn's ending with its fencing check is one atomic step in one round trip. A
//! script checks everything it may refuse before its first write, so a refusal changes nothing.
//!
//! All keys of a deployment share one hash tag, `{sabi}` (or `{<prefix>}`), so they live in one
//! slot: a delivery that touches several conversations is still one script, also on Redis
//! Cluster. A deployment therefore lives on one shard; several deployments spread over many.
//!
//! Durability is the server's: an acknowledgement is as durable as Redis's append-only file
//! makes it. At start Sabi reads the server's persistence settings and warns, or with
//! `?durability=require` refuses to start, when an acknowledged message could be lost.

mod connection;
mod gather;
mod names;
mod script;
mod wire;

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use redis::Script;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use self::connection::{Connection, Target};
use self::gather::Gatherer;
use self::script::{Caller, reset, unavailable};
use self::wire::RawMarkerNames;
use self::wire::{
    List, Page, RawBroadcast, RawChoice, RawClaim, RawConsent, RawConversation, RawCreated,
    RawExchange, RawExport, RawFeed, RawForget, RawGauges, RawItem, RawJob, RawKey,
    RawLastBroadcast, RawLine, RawLive, RawPart, RawQuarantined, RawReceipt, RawRecipient,
    RawRecipientRow, RawReview, RawRouted, RawSendClaims, RawSendJob, RawStats, Receipt,
};
use super::items::{RecipientStatus, broadcast_status, known};
use super::items::{message_key, session_retry_after};
use super::rules::broadcast::{self, BroadcastState, Event, PausedBy, SkipReason, TemplateNews};
use super::rules::category::{self, TemplateCategory};
use super::rules::consent::{self, Source};
use super::rules::erasure::{self, Erased, Marks, OptOuts, Subject};
use super::rules::hours::{LocalHours, Turn};
use super::rules::price;
use super::rules::review;
use super::{
    BroadcastView, Broadcasts, ChatExchange, ChatFeed, ChatJob, ChatReceipt, ChatSubmission,
    Choice, Control, ConversationView, CustomerRecord, Customers, Desk, DeskThread, Ending, Error,
    ExportPage, Gauges, HOLD_PART, Health, HistoryEntry, Holding, Horizons, InboxQuery, Ingest,
    IngestReceipt, Inspection, Intake, Limits, NewBroadcast, OutboxEntry, Outcome, PriceCount,
    RecipientClaim, RecipientJob, RecipientState, RecipientView, Resolution, Result, Retention,
    ReviewEntry, ReviewQuery, Reviews, RouteGuess, RoutedTurn, SendClaim, SendClaims, SendResult,
    Sending, Speaker, StoredItem, StoredQuarantine, Submitted, Swept, TurnStats, TurnUsage, Turns,
    WebChat,
};
use crate::clock::{At, millis};
use crate::domain::{Channel, Claim, ConversationKey, ItemKind, LeaseToken};
use crate::store::items::question_item;

/// Every operation's script, the rulebook's names rendered in (`names.rs`).
static SCRIPT: LazyLock<String> = LazyLock::new(|| names::render(SCRIPT_BODY));

const SCRIPT_BODY: &str = concat!(
    include_str!("lua/keys.lua"),
    include_str!("lua/outbox.lua"),
    include_str!("lua/turns.lua"),
    include_str!("lua/ingest.lua"),
    include_str!("lua/people.lua"),
    include_str!("lua/desk.lua"),
    include_str!("lua/chat.lua"),
    include_str!("lua/broadcasts.lua"),
    include_str!("lua/templates.lua"),
    include_str!("lua/customers.lua"),
    include_str!("lua/retention.lua"),
    include_str!("lua/main.lua"),
);

/// The key layout this build writes and expects (`<tag>:schema`); `lua/layout.lua` holds the
/// steps that upgrade older layouts to it.
const VERSION: u32 = 4;

/// Writes the layout version and the epoch when the prefix is new, upgrades an older layout, and
/// reads the epoch back.
static LAYOUT: LazyLock<String> = LazyLock::new(|| names::render(LAYOUT_BODY));

const LAYOUT_BODY: &str = concat!(include_str!("lua/keys.lua"), include_str!("lua/layout.lua"));

/// Rows asked for when the caller set no limit: more than any listing shows.
const NO_LIMIT: usize = 1_000_000_000;

pub struct RedisStore {
    caller: Caller,
    /// Keys erasure's markers and hashes.
    marks: Marks,
    /// Deliveries arriving together are stored in one run of the script (gather.rs).
    gatherer: Gatherer,
}

impl RedisStore {
    /// Connects, checks the server's persistence, and writes the layout version when the
    /// prefix is new or upgrades the keys in place when an older build wrote them.
    ///
    /// # Errors
    /// When the server cannot be reached, its keys are of a newer layout (a store is never
    /// downgraded), or (with `durability=require`) it could lose acknowledged messages.
    pub async fn open(url: &str, marks: Marks) -> Result<RedisStore> {
        let target = Target::parse(url)?;
        let mut conn = Connection::open(&target).await?;
        match persistence(&mut conn, &target.tag).await {
            Persistence::Durable(_) => {}
            Persistence::Risky(why) if target.require_durable => {
                return Err(Error::Unavailable(format!(
                    "refusing to start (durability=require): {why}"
                )));
            }
            Persistence::Risky(why) => tracing::warn!("{why}"),
        }
        let epoch = claim_layout(&conn, &target.tag).await?;
        let caller = Caller {
            conn,
            script: Script::new(&SCRIPT),
            tag: target.tag,
            epoch,
        };
        let store = RedisStore {
            gatherer: Gatherer::start(caller.clone()),
            caller,
            marks,
        };
        store.rekey().await?;
        Ok(store)
    }

    /// Moves the store's markers and erased keys' hashes under the marker secret (see
    /// [`Marks::rekey_from`]). The script cannot hash: the names are read first, then moved by
    /// one script that does nothing when another node moved them meanwhile.
    async fn rekey(&self) -> Result<()> {
        let names: RawMarkerNames = self.call("marker_names", json!({})).await?;
        let rekey = self
            .marks
            .rekey_from(names.fingerprint.as_deref())
            .map_err(Error::Schema)?;
        let to = self.marks.fingerprint();
        if rekey.is_empty() {
            return Ok(());
        }
        let markers: HashMap<String, String> = names
            .markers
            .0
            .iter()
            .filter_map(|old| Some((old.clone(), rekey.marker(old)?)))
            .collect();
        let hashes: HashMap<String, String> = names
            .hashes
            .0
            .iter()
            .map(|old| (old.clone(), rekey.key_hash(old)))
            .collect();
        let moved: bool = self
            .call(
                "rekey_markers",
                json!({"from": names.fingerprint, "to": to, "markers": markers, "hashes": hashes}),
            )
            .await?;
        if moved && markers.len() + hashes.len() > 0 {
            tracing::info!(
                markers = markers.len(),
                erased_keys = hashes.len(),
                "erasure markers and erased keys moved under the marker secret"
            );
        }
        Ok(())
    }

    /// Runs one operation of the script.
    async fn call<T: DeserializeOwned>(&self, op: &str, args: Value) -> Result<T> {
        self.caller.call(op, &args.to_string()).await
    }

    /// A listing, page by page (each page is a short script run).
    async fn pages<T: DeserializeOwned>(
        &self,
        op: &str,
        limit: Option<usize>,
        args: impl Fn(i64, usize) -> Value,
    ) -> Result<Vec<T>> {
        let want = limit.unwrap_or(NO_LIMIT);
        let (mut out, mut after) = (Vec::new(), 0);
        while out.len() < want {
            let page: Page<T> = self.call(op, args(after, want - out.len())).await?;
            out.extend(page.items.0);
            match page.last {
                Some(last) if page.more => after = last,
                _ => break,
            }
        }
        Ok(out)
    }

    fn key(&self, name: &str) -> String {
        format!("{}:{name}", self.caller.tag)
    }
}

/// Brings the layout to this build's version (see `lua/layout.lua`) and returns the epoch,
/// written fresh when the prefix has none. One script, called again while an upgrade step
/// goes a slice at a time: nodes starting together upgrade once and agree on one epoch.
async fn claim_layout(conn: &Connection, tag: &str) -> Result<String> {
    let mut id = [0u8; 8];
    getrandom::fill(&mut id).map_err(|e| Error::Unavailable(e.to_string()))?;
    let script = Script::new(&LAYOUT);
    loop {
        let (found, epoch, partway): (u32, String, bool) = script
            .key(tag)
            .arg(VERSION)
            .arg(hex::encode(id))
            .invoke_async(&mut conn.clone())
            .await
            .map_err(|e| match e.code() {
                Some("SABI_NEWER_LAYOUT") => Error::Schema(format!(
                    "the keys under {}: {}",
                    tag,
                    too_new(e.detail().unwrap_or("?"))
                )),
                _ => unavailable(e),
            })?;
        if partway {
            continue;
        }
        if (1..VERSION).contains(&found) {
            tracing::info!(prefix = %tag, from = found, to = VERSION, "Redis key layout upgraded");
        }
        return Ok(epoch);
    }
}

/// Whether the server keeps what it acknowledged.
enum Persistence {
    Durable(String),
    Risky(String),
}

/// Whether the server that holds the deployment's keys (in a cluster, the primary of their
/// slot) keeps what it acknowledged: its append-only file (below), and that it never evicts keys
/// to make room (Sabi sets no expiry, so only an `allkeys-*` policy would).
async fn persistence(conn: &mut Connection, tag: &str) -> Persistence {
    let kept = append_only(conn, tag).await;
    match conn.config_get(tag, "maxmemory-policy").await {
        Some(policy) if policy.starts_with("allkeys") => {
            let evicts = format!(
                "Redis evicts keys when it is full (maxmemory-policy {policy}): stored messages \
                 can vanish; set noeviction"
            );
            match kept {
                Persistence::Risky(why) => Persistence::Risky(format!("{why}; and {evicts}")),
                Persistence::Durable(_) => Persistence::Risky(evicts),
            }
        }
        _ => kept,
    }
}

/// Reads `appendonly` and `appendfsync`: with the append-only file flushed every write
/// (`always`) or every second (`everysec`), a Redis crash loses nothing acknowledged (an OS
/// crash or power loss may lose the last second with `everysec`); without it, a restart loses
/// everything since the last snapshot.
async fn append_only(conn: &mut Connection, tag: &str) -> Persistence {
    let aof = conn.config_get(tag, "appendonly").await;
    let fsync = conn.config_get(tag, "appendfsync").await;
    match (aof.as_deref(), fsync.as_deref()) {
        (Some("yes"), Some("always")) => {
            Persistence::Durable("append-only file, flushed on every write".into())
        }
        (Some("yes"), Some("everysec")) => Persistence::Durable(
            "append-only file, flushed every second (a power loss may lose the last second)".into(),
        ),
        (Some("yes"), Some(other)) => Persistence::Risky(format!(
            "Redis flushes its append-only file only when the OS does (appendfsync {other}): \
             acknowledged messages can be lost; set appendfsync always or everysec"
        )),
        (Some(_), _) => Persistence::Risky(
            "Redis keeps no append-only file (appendonly no): acknowledged messages are lost \
             when it restarts; set appendonly yes with appendfsync always or everysec"
                .into(),
        ),
        (None, _) => Persistence::Risky(
            "cannot read Redis's persistence settings (CONFIG GET is not allowed): make sure \
             it runs with appendonly yes and appendfsync always or everysec"
                .into(),
        ),
    }
}

/// Why a layout this build does not know is refused.
fn too_new(version: &str) -> String {
    format!(
        "key layout {version} is newer than this build's {VERSION}: a newer Sabi upgraded the \
         keys; run that build (a layout is never downgraded)"
    )
}

/// Looks at the server without writing: reachability, layout version and persistence.
pub(super) async fn probe(url: &str) -> Result<String> {
    let target = Target::parse(url)?;
    let mut conn = Connection::open(&target).await?;
    let version: Option<String> = redis::cmd("GET")
        .arg(format!("{}:schema", target.tag))
        .query_async(&mut conn)
        .await
        .map_err(unavailable)?;
    let Some(version) = version else {
        return Err(Error::Schema(format!(
            "no Sabi keys under {} yet (`sabi serve` writes them)",
            target.tag
        )));
    };
    let layout = match version.parse::<u32>() {
        Ok(VERSION) => "layout current".to_owned(),
        Ok(older) if older < VERSION => {
            format!("key layout {older}, this build upgrades it to {VERSION} at start")
        }
        _ => return Err(Error::Schema(too_new(&version))),
    };
    Ok(match persistence(&mut conn, &target.tag).await {
        Persistence::Durable(how) => format!("reachable, {layout}, {how}"),
        Persistence::Risky(why) => format!("reachable, {layout}; warning: {why}"),
    })
}

/// A count as the script takes it.
fn count(n: usize) -> usize {
    n.min(NO_LIMIT)
}

/// The largest integer the script's numbers (Lua doubles) hold exactly, and its JSON writes
/// without an exponent: "never" as a time.
const LATEST: At = At::from_millis(99_999_999_999_999);

fn exact(at: At) -> At {
    at.min(LATEST)
}

#[async_trait]
impl Intake for RedisStore {
    async fn ingest(&self, delivery: Ingest) -> Result<IngestReceipt> {
        let args = wire::delivery(&delivery, &self.marks).to_string();
        // What field events say is acted on below, by this caller: a delivery that holds any
        // is stored at once, so that a caller who gives up while it waits in the queue cannot
        // leave them kept and never acted on.
        let receipt: Receipt = if delivery
            .items
            .iter()
            .any(|i| i.kind == ItemKind::FieldEvent)
        {
            self.caller.call("ingest", &args).await?
        } else {
            self.gatherer.store(&self.caller, args).await?
        };
        self.settle_broadcast_statuses(&delivery).await?;
        // What field events say is acted on right after they are kept, once: were it lost in
        // between, a customer's choice would wait for their next one, a template's pause for
        // its next send's refusal.
        let fresh = delivery
            .items
            .iter()
            .filter(|item| receipt.events.0.contains(&item.dedupe_key));
        for item in fresh {
            for (customer, choice) in consent::preferences(item) {
                self.choose(&customer, choice).await?;
            }
            if let Some(news) = broadcast::template_news(item) {
                self.hear_template(news).await?;
            }
            if let Some(news) = category::news(item, delivery.received_at) {
                self.keep_category(news).await?;
            }
        }
        for key in &receipt.anomalies.0 {
            tracing::warn!(
                key = %key,
                "anomaly: a redelivered id carries other content; the first copy is kept"
            );
        }
        Ok(IngestReceipt {
            stored: receipt.stored,
            duplicates: receipt.duplicates,
            anomalies: receipt.anomalies.0.len(),
            quarantined: receipt.quarantined,
            earliest_due: receipt.due,
            priced: receipt.priced.0,
        })
    }
}

#[async_trait]
impl Turns for RedisStore {
    async fn claim(
        &self,
        now: At,
        lease: Duration,
        limit: usize,
        channel: Option<Channel>,
    ) -> Result<Vec<Claim>> {
        let raw: List<RawClaim> = self
            .call(
                "claim",
                json!({"now": now, "lease": millis(lease), "limit": count(limit),
                       "ch": channel.map(Channel::as_str)}),
            )
            .await?;
        raw.0.into_iter().map(RawClaim::into_claim).collect()
    }
    async fn claim_routine(&self, now: At, lease: Duration, limit: usize) -> Result<Vec<Claim>> {
        let args = json!({"now": now, "lease": millis(lease), "limit": count(limit)});
        let raw: List<RawClaim> = self.call("claim_routine", args).await?;
        raw.0.into_iter().map(RawClaim::into_claim).collect()
    }
    async fn renew(&self, batch: i64, token: LeaseToken, now: At, lease: Duration) -> Result<()> {
        let args = json!({"batch": batch, "token": token.0, "now": now, "lease": millis(lease)});
        let _: bool = self.call("renew", args).await?;
        Ok(())
    }
    async fn finish(&self, batch: i64, token: LeaseToken, now: At, ending: Ending) -> Result<()> {
        let args = json!({
            "batch": batch, "token": token.0, "now": now, "ending": wire::ending(&ending),
        });
        let _: bool = self.call("finish", args).await?;
        Ok(())
    }
    async fn hold(&self, now: At, h: Holding) -> Result<Vec<i64>> {
        let args = json!({
            "now": now, "skip": count(h.skip), "limit": count(h.limit), "ch": Channel::Whatsapp.as_str(),
            "parts": wire::parts(&h.parts), "sandbox": h.sandbox, "first": HOLD_PART,
        });
        let held: List<i64> = self.call("hold", args).await?;
        Ok(held.0)
    }
    async fn next_due(&self) -> Result<Option<At>> {
        self.call("next_due", json!({})).await
    }
    async fn history(&self, batch: i64, turns: usize) -> Result<Vec<HistoryEntry>> {
        let lines: List<RawLine> = self
            .call("history", json!({"batch": batch, "turns": count(turns)}))
            .await?;
        Ok(wire::history(lines))
    }
    async fn last_broadcast(
        &self,
        conversation: &ConversationKey,
        since: At,
        until: At,
    ) -> Result<Option<HistoryEntry>> {
        // The customer's very last broadcast: one from another of the business's numbers since
        // hides an earlier one from this number.
        let last: List<RawLastBroadcast> = self
            .call("last_broadcast", json!({"customer": conversation.customer}))
            .await?;
        Ok(last
            .0
            .into_iter()
            .find(|b| b.business == conversation.business && b.sent > since && b.sent <= until)
            .map(|b| {
                let params: Vec<String> = serde_json::from_str(&b.params).unwrap_or_default();
                HistoryEntry {
                    at: b.sent,
                    speaker: Speaker::Business,
                    text: broadcast::sent_text(&b.template, b.body.as_deref(), &params),
                }
            }))
    }
    async fn set_transcript(&self, channel: Channel, external_id: &str, text: &str) -> Result<()> {
        let args = json!({"ch": channel.as_str(), "key": external_id, "text": text});
        let _: bool = self.call("set_transcript", args).await?;
        Ok(())
    }
    async fn set_stage(&self, batch: i64, stage: &str) -> Result<()> {
        let _: bool = self
            .call("set_stage", json!({"batch": batch, "stage": stage}))
            .await?;
        Ok(())
    }
    async fn add_usage(&self, batch: i64, usage: TurnUsage) -> Result<()> {
        let args = json!({
            "batch": batch, "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cost": if usage.cost.is_finite() { usage.cost } else { 0.0 },
        });
        let _: bool = self.call("add_usage", args).await?;
        Ok(())
    }
    async fn set_route(&self, batch: i64, guess: RouteGuess) -> Result<()> {
        let args = json!({
            "batch": batch, "intent": guess.intent, "confidence": guess.confidence,
            "local": guess.local,
        });
        let _: bool = self.call("set_route", args).await?;
        Ok(())
    }
}

#[async_trait]
impl Sending for RedisStore {
    async fn claim_sends(&self, claim: SendClaim) -> Result<SendClaims> {
        let args = json!({
            "now": claim.now, "lease": millis(claim.lease), "unknown_wait": millis(claim.unknown_wait),
            "limit": count(claim.limit), "halted": claim.halted,
        });
        let raw: RawSendClaims = self.call("claim_sends", args).await?;
        Ok(SendClaims {
            jobs: raw
                .jobs
                .0
                .into_iter()
                .map(RawSendJob::into_job)
                .collect::<Result<_>>()?,
            unknown: raw.unknown.0,
        })
    }
    async fn depart(&self, id: i64, attempt: u32, now: At, lease: Duration) -> Result<()> {
        let args = json!({"id": id, "attempt": attempt, "now": now, "lease": millis(lease)});
        let _: bool = self.call("depart", args).await?;
        Ok(())
    }
    async fn record_send(&self, id: i64, attempt: u32, now: At, result: SendResult) -> Result<()> {
        let args = json!({
            "id": id, "attempt": attempt, "now": now, "result": wire::send_result(&result),
        });
        let _: bool = self.call("record_send", args).await?;
        Ok(())
    }
    async fn next_send_due(&self, skip: Vec<String>) -> Result<Option<At>> {
        self.call("next_send_due", json!({"skip": skip})).await
    }
}

#[async_trait]
impl Reviews for RedisStore {
    async fn review_queue(&self, query: ReviewQuery) -> Result<Vec<ReviewEntry>> {
        let args = json!({
            "reason": query.reason, "customer": query.customer,
            "limit": count(query.limit.unwrap_or(NO_LIMIT)),
        });
        let raw: List<RawReview> = self.call("review_queue", args).await?;
        raw.0.into_iter().map(RawReview::into_entry).collect()
    }
    async fn review_item(&self, id: i64) -> Result<Option<ReviewEntry>> {
        let raw: Option<RawReview> = self.call("review_item", json!({"id": id})).await?;
        raw.map(RawReview::into_entry).transpose()
    }
    async fn resolve_review(&self, id: i64, now: At, resolution: Resolution) -> Result<()> {
        let args = json!({"id": id, "now": now, "resolution": wire::resolution(&resolution, now)});
        let _: bool = self.call("resolve_review", args).await?;
        Ok(())
    }
    async fn conversations(&self, customer: &str, turns: usize) -> Result<Vec<ConversationView>> {
        let raw: List<RawConversation> = self
            .call(
                "conversations",
                json!({"customer": customer, "turns": count(turns)}),
            )
            .await?;
        raw.0.into_iter().map(RawConversation::into_view).collect()
    }
    async fn label_turn(&self, batch: i64, intent: &str) -> Result<()> {
        let args = json!({"batch": batch, "intent": intent});
        let _: bool = self.call("label_turn", args).await?;
        Ok(())
    }
}

#[async_trait]
impl WebChat for RedisStore {
    async fn submit_chat(&self, s: ChatSubmission) -> Result<Submitted> {
        let key = message_key(&s.session_id, s.message_id.as_deref().unwrap_or(&s.job_id));
        let item = wire::item(&question_item(&s, key.clone()), s.now, true, &self.marks);
        let args = json!({
            "key": key, "session": s.session_id, "user": s.user_id, "job": s.job_id, "now": s.now,
            "expires": exact(s.now + s.keep), "per_minute": s.per_minute,
            "max_queue": s.max_queue,
            "item": item,
            "window": millis(s.policy.window), "cap": millis(s.policy.cap),
        });
        // A question erased since is refused (`Error::NotFound`), as on PostgreSQL.
        let raw: RawReceipt = self.call("submit_chat", args).await?;
        if raw.not_yours {
            return Ok(Submitted::NotYours);
        }
        if raw.limited {
            return Ok(Submitted::TooFast {
                retry_after: session_retry_after(raw.freeing, s.now),
            });
        }
        if raw.full {
            return Ok(Submitted::QueueFull);
        }
        let job_id = raw
            .job
            .ok_or_else(|| Error::Schema("a chat receipt without a job".into()))?;
        Ok(Submitted::Job(ChatReceipt {
            job_id,
            created: raw.created,
            earliest_due: raw.due,
        }))
    }
    async fn chat_session_owner(&self, session_id: &str) -> Result<Option<String>> {
        self.call("chat_owner", json!({"session": session_id}))
            .await
    }
    async fn chat_job_for_message(
        &self,
        session_id: &str,
        message_id: &str,
    ) -> Result<Option<String>> {
        let key = message_key(session_id, message_id);
        self.call("job_for_message", json!({"key": key})).await
    }
    async fn chat_job(&self, job_id: &str, now: At) -> Result<Option<ChatJob>> {
        let raw: Option<RawJob> = self
            .call("chat_job", json!({"job": job_id, "now": now}))
            .await?;
        Ok(raw.map(|j| j.into_job(job_id)))
    }
    async fn chat_history(
        &self,
        session_id: &str,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<ChatExchange>> {
        let raw: List<RawExchange> = self
            .call(
                "chat_history",
                json!({"session": session_id, "before": before, "limit": count(limit)}),
            )
            .await?;
        Ok(raw.0.into_iter().map(ChatExchange::from).collect())
    }
    async fn chat_queue_depth(&self) -> Result<u64> {
        self.call("chat_queue_depth", json!({})).await
    }
    async fn chat_feed(&self, session_id: &str, after: i64, limit: usize) -> Result<ChatFeed> {
        let args = json!({"session": session_id, "after": after, "limit": count(limit)});
        let raw: RawFeed = self.call("chat_feed", args).await?;
        Ok(raw.into())
    }
}

#[async_trait]
impl Desk for RedisStore {
    async fn desk_thread(&self, conversation: &ConversationKey) -> Result<Option<DeskThread>> {
        let found: Option<RawDeskThread> = self.call("desk_thread", key_json(conversation)).await?;
        Ok(found.map(|t| DeskThread {
            thread: t.thread,
            open: t.open,
        }))
    }
    async fn open_desk_thread(&self, conversation: &ConversationKey, thread: &str) -> Result<()> {
        let mut args = key_json(conversation);
        args["thread"] = json!(thread);
        args["hold"] = json!(review::DESK_HOLD);
        let _: bool = self.call("open_desk_thread", args).await?;
        Ok(())
    }
    async fn close_desk_thread(&self, thread: &str) -> Result<Option<ConversationKey>> {
        let found: Option<RawKey3> = self
            .call("close_desk_thread", json!({"thread": thread}))
            .await?;
        found.map(RawKey3::into_key).transpose()
    }
    async fn desk_conversation(&self, thread: &str) -> Result<Option<ConversationKey>> {
        let found: Option<RawKey3> = self
            .call("desk_conversation", json!({"thread": thread}))
            .await?;
        found.map(RawKey3::into_key).transpose()
    }
    async fn desk_pending(&self, limit: usize) -> Result<Vec<(i64, Option<i64>)>> {
        let List(rows): List<(i64, Option<i64>)> = self
            .call("desk_pending", json!({"limit": count(limit)}))
            .await?;
        Ok(rows)
    }
    async fn claim_desk_message(&self, key: &str, now: At) -> Result<bool> {
        let keep = i64::try_from(review::DESK_REPLY_MEMORY.as_millis()).unwrap_or(i64::MAX);
        let args = json!({"key": key, "now": now, "keep": keep});
        self.call("claim_desk_message", args).await
    }
    async fn set_desk_mirrored(&self, item: i64, seq: i64) -> Result<()> {
        let _: bool = self
            .call("set_desk_mirrored", json!({"item": item, "seq": seq}))
            .await?;
        Ok(())
    }
}

/// A conversation as the desk's scripts take it.
fn key_json(c: &ConversationKey) -> serde_json::Value {
    json!({"ch": c.channel.as_str(), "biz": c.business, "cust": c.customer})
}

#[derive(serde::Deserialize)]
struct RawDeskThread {
    thread: String,
    open: bool,
}

/// A conversation as the desk's scripts give it.
#[derive(serde::Deserialize)]
struct RawKey3 {
    ch: String,
    biz: String,
    cust: String,
}

impl RawKey3 {
    fn into_key(self) -> Result<ConversationKey> {
        Ok(ConversationKey {
            channel: known(Channel::parse, &self.ch)?,
            business: self.biz,
            customer: self.cust,
        })
    }
}

#[async_trait]
impl Inspection for RedisStore {
    async fn inbox(&self, query: InboxQuery) -> Result<Vec<StoredItem>> {
        let kind = query.kind.map(ItemKind::as_str);
        let channel = query.channel.map(Channel::as_str);
        let start = query.after.unwrap_or(0);
        let raw: Vec<RawItem> = self
            .pages("inbox", query.limit, |after, limit| {
                json!({"after": after.max(start), "limit": limit, "kind": kind, "ch": channel})
            })
            .await?;
        raw.into_iter().map(RawItem::into_item).collect()
    }
    async fn quarantine(&self, limit: Option<usize>) -> Result<Vec<StoredQuarantine>> {
        let raw: Vec<RawQuarantined> = self
            .pages(
                "quarantine",
                limit,
                |after, limit| json!({"after": after, "limit": limit}),
            )
            .await?;
        raw.into_iter()
            .map(RawQuarantined::into_quarantined)
            .collect()
    }
    async fn outbox(&self, limit: Option<usize>) -> Result<Vec<OutboxEntry>> {
        let raw: Vec<RawPart> = self
            .pages(
                "outbox",
                limit,
                |after, limit| json!({"after": after, "limit": limit}),
            )
            .await?;
        raw.into_iter().map(RawPart::into_entry).collect()
    }
    async fn turn_stats(&self, since: At) -> Result<TurnStats> {
        let stats: RawStats = self.call("turn_stats", json!({"since": since})).await?;
        Ok(stats.into())
    }
    async fn gauges(&self, now: At) -> Result<Gauges> {
        let raw: RawGauges = self.call("gauges", json!({"now": now})).await?;
        Ok(raw.into())
    }
    async fn routed_turns(&self, since: At, limit: usize) -> Result<Vec<RoutedTurn>> {
        let args = json!({"since": since, "limit": count(limit)});
        let raw: List<RawRouted> = self.call("routed_turns", args).await?;
        let turns: Result<Vec<Option<RoutedTurn>>> =
            raw.0.into_iter().map(RawRouted::into_turn).collect();
        Ok(turns?.into_iter().flatten().collect())
    }
    async fn price_counts(&self, since: At) -> Result<Vec<PriceCount>> {
        let args = json!({"hour": price::hour(since)});
        let List(mut counts): List<PriceCount> = self.call("price_counts", args).await?;
        counts.sort();
        Ok(counts)
    }
}

/// Every recipient state's name: the scripts count each.
fn recipient_states() -> Vec<&'static str> {
    RecipientState::ALL.iter().map(|s| s.as_str()).collect()
}

#[async_trait]
impl Broadcasts for RedisStore {
    async fn create_broadcast(&self, b: NewBroadcast) -> Result<(BroadcastView, bool)> {
        let recipients: Vec<_> = b
            .recipients
            .iter()
            .map(|r| {
                let listed = broadcast::Recipient::listed(r.skipped.as_ref().map(|s| s.0));
                json!({
                    "to": r.to,
                    "params": serde_json::to_string(&r.params).unwrap_or_else(|_| "[]".into()),
                    "line": r.line,
                    "state": listed.state.as_str(),
                    "waiting": listed.state.claimable(),
                    "skipped": listed.skipped.map(SkipReason::as_str),
                    "error": r.skipped.as_ref().map(|s| &s.1),
                    "tz": r.tz,
                })
            })
            .collect();
        let args = json!({
            "key": b.key, "name": b.name, "template": b.template, "language": b.language,
            "business": b.business, "now": b.now, "start": b.start_at, "until": b.until,
            "rate": b.rate, "body": b.body, "state": broadcast::initial(b.now, b.start_at).as_str(),
            "quiet_hours": b.hours.as_ref().and_then(LocalHours::quiet_spec),
            "tz": b.hours.as_ref().map(|h| &h.tz),
            "local_start": b.hours.as_ref().and_then(LocalHours::start_text),
            "local_until": b.hours.as_ref().and_then(LocalHours::until_text),
            "recipients": recipients, "states": recipient_states(),
        });
        let raw: RawCreated = self.call("create_broadcast", args).await?;
        Ok((raw.broadcast.into_view()?, raw.created))
    }
    async fn broadcasts(&self, limit: usize) -> Result<Vec<BroadcastView>> {
        let args = json!({"limit": count(limit), "states": recipient_states()});
        let raw: List<RawBroadcast> = self.call("broadcasts", args).await?;
        raw.0.into_iter().map(RawBroadcast::into_view).collect()
    }
    async fn broadcast(&self, id: i64) -> Result<Option<BroadcastView>> {
        let args = json!({"id": id, "states": recipient_states()});
        let raw: Option<RawBroadcast> = self.call("broadcast", args).await?;
        raw.map(RawBroadcast::into_view).transpose()
    }
    async fn keyed_broadcast(&self, key: &str) -> Result<Option<BroadcastView>> {
        let args = json!({"key": key, "states": recipient_states()});
        let raw: Option<RawBroadcast> = self.call("keyed_broadcast", args).await?;
        raw.map(RawBroadcast::into_view).transpose()
    }
    async fn broadcast_recipients(
        &self,
        id: i64,
        state: Option<RecipientState>,
        limit: usize,
    ) -> Result<Vec<RecipientView>> {
        let args =
            json!({"id": id, "state": state.map(RecipientState::as_str), "limit": count(limit)});
        let raw: List<RawRecipient> = self.call("broadcast_recipients", args).await?;
        raw.0.into_iter().map(RawRecipient::into_view).collect()
    }
    async fn control_broadcast(
        &self,
        id: i64,
        control: Control,
        reason: Option<String>,
    ) -> Result<BroadcastView> {
        // The move as the rulebook allows it: from which states, to which.
        let from: Vec<&str> = BroadcastState::ALL
            .iter()
            .filter(|s| broadcast::control(**s, control).is_some())
            .map(|s| s.as_str())
            .collect();
        let to = BroadcastState::ALL
            .iter()
            .find_map(|s| broadcast::control(*s, control))
            .ok_or(Error::NotFound)?;
        let waiting: Vec<&str> = match control {
            Control::Cancel => RecipientState::ALL
                .iter()
                .filter(|s| s.claimable())
                .map(|s| s.as_str())
                .collect(),
            Control::Pause | Control::Resume => Vec::new(),
        };
        let pause = control == Control::Pause;
        let args = json!({
            "id": id, "from": from, "to": to.as_str(), "waiting": waiting, "live": to.live(),
            "cancelled": RecipientState::Cancelled.as_str(),
            "reason": reason.filter(|_| pause),
            "paused_by": pause.then_some(PausedBy::Person.as_str()),
            "states": recipient_states(),
        });
        let raw: RawBroadcast = self.call("control_broadcast", args).await?;
        raw.into_view()
    }
    async fn claim_recipients(&self, claim: RecipientClaim) -> Result<Vec<RecipientJob>> {
        let hours = self.advance_broadcasts(claim.now).await?;
        let lapsed: List<RawRecipientRow> = self
            .call("recipients_lapsed", json!({"now": claim.now}))
            .await?;
        let mut writes = Vec::new();
        for row in &lapsed.0 {
            writes.extend(row.step(&Event::LeaseLapsed, claim.now, Limits::NONE)?);
        }
        self.save_recipients(writes, false, None).await?;
        let mut jobs = Vec::new();
        for _ in 0..broadcast::CLAIM_PASSES {
            let Some(taken) = self.claim_pass(&claim, &hours, jobs.len()).await? else {
                break;
            };
            jobs.extend(taken);
            if jobs.len() >= claim.limit {
                break;
            }
        }
        let args = json!({
            "running": BroadcastState::Running.as_str(),
            "finished": BroadcastState::Finished.as_str(),
            "sending": RecipientState::Sending.as_str(),
            "waiting": waiting_states(),
        });
        let _: bool = self.call("broadcasts_finish", args).await?;
        Ok(jobs)
    }
    async fn record_recipient(
        &self,
        id: i64,
        attempt: u32,
        now: At,
        outcome: Outcome,
        limits: Limits,
    ) -> Result<()> {
        let rows: List<RawRecipientRow> =
            self.call("recipients_load", json!({"ids": [id]})).await?;
        let row = rows.0.into_iter().next().ok_or(Error::NotFound)?;
        let event = Event::Outcome {
            attempt,
            outcome: &outcome,
        };
        let write = row.step(&event, now, limits)?.ok_or(Error::LeaseLost)?;
        self.save_recipients(vec![write], true, None)
            .await
            .map(drop)
    }
    async fn hear_template(&self, news: TemplateNews) -> Result<Vec<i64>> {
        let live: List<RawLive> = self.call("broadcasts_live", json!({})).await?;
        let mut moved = Vec::new();
        for b in live.0 {
            if !news.names(&b.template, &b.language) {
                continue;
            }
            let state = known(BroadcastState::parse, &b.state)?;
            let by = b
                .paused_by
                .as_deref()
                .map(|by| known(PausedBy::parse, by))
                .transpose()?;
            let Some((next, by)) = broadcast::on_template(state, by, news.approved) else {
                continue;
            };
            // Moved only from the state read: one a person moved meanwhile stays as they left it.
            let args = json!({
                "id": b.id, "from": [state.as_str()], "to": next.as_str(), "live": next.live(),
                "reason": by.map(|_| &news.why), "paused_by": by.map(PausedBy::as_str),
                "states": recipient_states(),
            });
            match self.call::<RawBroadcast>("control_broadcast", args).await {
                Ok(_) => moved.push(b.id),
                Err(Error::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(moved)
    }
    async fn keep_category(&self, c: TemplateCategory) -> Result<()> {
        let args = json!({
            "name": c.name, "language": c.language, "category": c.category,
            "heard_at": c.heard_at,
        });
        self.call::<bool>("category_keep", args).await.map(drop)
    }
    async fn template_category(&self, name: &str, language: &str) -> Result<Option<String>> {
        self.call("category_get", json!({"name": name, "language": language}))
            .await
    }
    async fn choose(&self, customer: &str, choice: Choice) -> Result<bool> {
        // The rule is the rulebook's; the script saves only over the choice read, so a choice
        // made meanwhile is read again and the rule asked again.
        loop {
            let kept = self.consents(&[customer.to_owned()]).await?;
            let (kept, raw) = match kept.get(customer) {
                Some((choice, raw)) => (Some(*choice), Some(raw.clone())),
                None => (None, None),
            };
            let Some(new) = consent::apply(kept.as_ref(), &choice) else {
                return Ok(false);
            };
            let json = serde_json::to_string(&RawChoice::of(&new)).unwrap_or_default();
            let args = json!({"customer": customer, "expect": raw, "choice": json});
            let saved: bool = self.call("consent_save", args).await?;
            if saved {
                return Ok(true);
            }
        }
    }
    async fn sent_since(&self, customers: &[String], since: At) -> Result<HashSet<String>> {
        let args = json!({"customers": customers, "since": since});
        let sent: List<String> = self.call("sent_since", args).await?;
        Ok(sent.0.into_iter().collect())
    }
    async fn reached(&self, since: At) -> Result<u64> {
        self.call("broadcast_reach", json!({ "since": since }))
            .await
    }
    async fn first_reached(&self, since: At) -> Result<Option<At>> {
        self.call("broadcast_first_reach", json!({ "since": since }))
            .await
    }
    async fn opted_out(&self, customers: &[String]) -> Result<HashSet<String>> {
        let asked = OptOuts::ask(&self.marks, customers);
        let found = self
            .consents(asked.names())
            .await?
            .into_iter()
            .filter(|(_, (choice, _))| choice.opted_out)
            .map(|(customer, _)| customer)
            .collect();
        Ok(asked.of(found))
    }
}

/// How often erasure reads the customer's keys again when messages from them keep coming
/// between the read and the erasure.
const FORGET_TRIES: usize = 5;

#[async_trait]
impl Customers for RedisStore {
    async fn export_customer(&self, subject: &Subject) -> Result<CustomerRecord> {
        self.export_page(subject, ExportPage::ALL).await
    }

    async fn export_page(&self, subject: &Subject, page: ExportPage) -> Result<CustomerRecord> {
        let args = json!({
            "ch": subject.channel.as_str(), "cust": subject.customer,
            "items_after": page.items_after, "replies_after": page.replies_after,
            // -1: all.
            "limit": i64::try_from(page.limit).unwrap_or(-1),
        });
        let raw: RawExport = self.call("customer_export", args).await?;
        raw.into_record()
    }

    async fn linked_ids(&self, subject: &Subject) -> Result<Vec<String>> {
        let args = json!({"ch": subject.channel.as_str(), "cust": subject.customer});
        let ids: List<String> = self.call("linked_ids", args).await?;
        Ok(ids.0)
    }

    async fn forget_customer(&self, subject: &Subject, now: At) -> Result<Erased> {
        let (ch, cust) = (subject.channel.as_str(), &subject.customer);
        let choice = RawChoice::of(&Choice {
            opted_out: true,
            source: Source::Erased,
            at: now,
        });
        let unsent = [RecipientState::Queued, RecipientState::Held].map(RecipientState::as_str);
        for _ in 0..FORGET_TRIES {
            // The script cannot hash: the keys first, then the erasure, which refuses when an
            // item came in between.
            let keys: List<String> = self
                .call("customer_keys", json!({"ch": ch, "cust": cust}))
                .await?;
            let hashes: HashMap<String, String> = keys
                .0
                .into_iter()
                .map(|key| {
                    let hash = self.marks.key_hash(subject.channel, &key);
                    (format!("{ch}\n{key}"), hash)
                })
                .collect();
            let wamids: List<String> = self
                .call("customer_wamids", json!({"ch": ch, "cust": cust}))
                .await?;
            let status_hashes: Vec<String> = wamids
                .0
                .iter()
                .flat_map(|w| self.marks.status_hashes(w))
                .collect();
            let args = json!({
                "ch": ch, "cust": cust, "now": now, "hashes": hashes,
                "status_hashes": status_hashes,
                "marker": self.marks.marker(subject.channel, &subject.customer),
                "choice": serde_json::to_string(&choice).unwrap_or_default(),
                "unsent": unsent, "skipped": RecipientState::Skipped.as_str(),
                "opted_out": SkipReason::OptedOut.as_str(),
                "recipient_sending": RecipientState::Sending.as_str(),
            });
            let outcome: RawForget = self.call("forget", args).await?;
            if let Some(why) = erasure::busy(outcome.running, outcome.sending) {
                return Err(Error::Busy(why));
            }
            if let Some(erased) = outcome.erased {
                return Ok(erased);
            }
        }
        Err(Error::Busy("messages from this customer keep arriving"))
    }
}

#[async_trait]
impl Retention for RedisStore {
    async fn hold_lease(&self, lease: &str, holder: &str, now: At, ttl: Duration) -> Result<bool> {
        let args = json!({"name": lease, "holder": holder, "now": now, "till": now + ttl});
        self.call("hold_lease", args).await
    }

    async fn sweep(&self, horizons: &Horizons, now: At, batch: usize) -> Result<Swept> {
        let cut = horizons.cutoffs(now);
        let mut args = json!({
            "now": now, "messages": cut.messages, "statuses": cut.statuses,
            "quarantine": cut.quarantine, "keys": cut.keys, "limit": batch.max(1),
            "price_hour": price::hour(cut.messages),
        });
        // The script cannot hash: the keys of the messages about to go first. One that comes
        // into the sweep without its hash stays for the next.
        let keys: List<RawKey> = self.call("sweep_keys", args.clone()).await?;
        let hashes = keys
            .0
            .iter()
            .map(|k| k.hashed(&self.marks))
            .collect::<Result<HashMap<_, _>>>()?;
        args["hashes"] = json!(hashes);
        self.call("sweep", args).await
    }
}

/// The recipient states a sender may still claim from.
fn waiting_states() -> Vec<&'static str> {
    RecipientState::ALL
        .iter()
        .filter(|s| s.claimable())
        .map(|s| s.as_str())
        .collect()
}

impl RedisStore {
    /// Time moves the live broadcasts on, by the rulebook ([`broadcast::at_time`]); the hours
    /// on their recipients' clocks, by broadcast.
    async fn advance_broadcasts(&self, now: At) -> Result<HashMap<i64, Option<LocalHours>>> {
        let live_ones: List<RawLive> = self.call("broadcasts_live", json!({})).await?;
        let mut hours = HashMap::new();
        for b in live_ones.0 {
            hours.insert(b.id, b.hours());
            let state = known(BroadcastState::parse, &b.state)?;
            let next = broadcast::at_time(state, now, b.start, b.deadline);
            if next == state {
                continue;
            }
            let waiting = match next {
                BroadcastState::Cancelled => waiting_states(),
                _ => Vec::new(),
            };
            let args = json!({
                "id": b.id, "from": [state.as_str()], "to": next.as_str(), "waiting": waiting,
                "live": next.live(), "cancelled": RecipientState::Cancelled.as_str(),
                "states": recipient_states(),
            });
            // Another node may have moved it first: then there is nothing left to do.
            match self.call::<RawBroadcast>("control_broadcast", args).await {
                Ok(_) | Err(Error::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(hours)
    }

    /// One pass of a claim over the due recipients, `taken` already taken: those that wait, are
    /// left out or are cancelled are saved as such, and the rest claimed; the claim lands only
    /// if the messaging limit's count is still what the pass read (when another node claimed
    /// meanwhile, the next pass reads it again). `None` when no recipient is due.
    async fn claim_pass(
        &self,
        claim: &RecipientClaim,
        hours: &HashMap<i64, Option<LocalHours>>,
        taken: usize,
    ) -> Result<Option<Vec<RecipientJob>>> {
        let reach = match claim.daily_limit {
            None => None,
            Some(_) => {
                let since = claim.now - broadcast::LIMIT_SPAN;
                Some((since, self.reached(since).await?))
            }
        };
        let limit = match (claim.daily_limit, reach) {
            (Some(daily), Some((_, reached))) => {
                claim.limit.min(broadcast::headroom(Some(daily), reached))
            }
            _ => claim.limit,
        }
        .saturating_sub(taken);
        if limit == 0 {
            return Ok(None);
        }
        let args = json!({
            "now": claim.now, "limit": count(limit), "halted": claim.halted,
            "running": BroadcastState::Running.as_str(), "cooled": claim.now - claim.cooldown,
        });
        let due: List<RawRecipientRow> = self.call("recipients_due", args).await?;
        if due.0.is_empty() {
            return Ok(None);
        }
        let (mut moves, mut takes, mut jobs) = (Vec::new(), Vec::new(), Vec::new());
        for row in due.0 {
            let turn = hours
                .get(&row.bc)
                .and_then(Option::as_ref)
                .map_or(Turn::Go, |h| h.turn(row.tz.as_deref(), claim.now));
            let event = row.on_claim(turn, claim.lease);
            if let Event::Claim { .. } = event {
                if let Some((write, attempt)) = row.claimed(&event, claim.now)? {
                    takes.push(write);
                    jobs.push(row.into_job(attempt));
                }
            } else {
                moves.extend(row.step(&event, claim.now, Limits::NONE)?);
            }
        }
        self.save_recipients(moves, false, None).await?;
        let saved = self.save_recipients(takes, false, reach).await?;
        jobs.retain(|j| saved.contains(&j.id));
        Ok(Some(jobs))
    }

    /// Statuses of broadcast messages move their recipients by the rulebook, right after the
    /// delivery is kept; one that changes nothing (older, repeated, for another send) is
    /// dropped. A crash between the two leaves the recipient as it was: the status stays in
    /// the inbox.
    async fn settle_broadcast_statuses(&self, delivery: &Ingest) -> Result<()> {
        let statuses: Vec<RecipientStatus<'_>> =
            delivery.items.iter().filter_map(broadcast_status).collect();
        if statuses.is_empty() {
            return Ok(());
        }
        let asked: Vec<Value> = statuses
            .iter()
            .map(|s| {
                json!({"wamid": s.status.wamid, "id": s.named.map(|n| n.0), "attempt": s.named.map(|n| n.1)})
            })
            .collect();
        let found: List<RawRecipientRow> = self
            .call("recipients_for_statuses", json!({ "statuses": asked }))
            .await?;
        let (mut writes, mut bills) = (Vec::new(), Vec::new());
        for row in &found.0 {
            let Some(found) = row.index().and_then(|i| statuses.get(i)) else {
                continue;
            };
            // Kept whatever the status does to the recipient: a late status still tells the
            // price.
            if found.billed.is_some() || found.pricing.is_some() {
                bills.push(json!({"id": row.id, "billed": found.billed, "pricing": found.pricing}));
            }
            let event = Event::Status(found.status.clone());
            writes.extend(row.step(&event, delivery.received_at, Limits::NONE)?);
        }
        if !bills.is_empty() {
            let _: bool = self
                .call("recipients_bill", json!({ "bills": bills }))
                .await?;
        }
        self.save_recipients(writes, false, None).await.map(drop)
    }

    /// Saves recipient writes that still find their recipient as read (and, with `reach`, the
    /// messaging limit's count after `since` as read); the ids saved.
    async fn save_recipients(
        &self,
        writes: Vec<Value>,
        strict: bool,
        reach: Option<(At, u64)>,
    ) -> Result<Vec<i64>> {
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        let reach = reach.map(|(since, read)| json!({"since": since, "read": read}));
        let saved: List<i64> = self
            .call(
                "recipients_save",
                json!({"writes": writes, "strict": strict, "reach": reach}),
            )
            .await?;
        // Meta's word that a customer opted out (131050) is kept right after: were it lost
        // in between, the next broadcast's refusal would tell it again.
        for write in &writes {
            let (Some(id), Some(to), Some(at)) = (
                write["id"].as_i64(),
                write["to"].as_str(),
                write["opted_out_at"].as_i64(),
            ) else {
                continue;
            };
            if saved.0.contains(&id) {
                let choice = Choice {
                    opted_out: true,
                    source: Source::Refused,
                    at: At::from_millis(at),
                };
                self.choose(to, choice).await?;
            }
        }
        Ok(saved.0)
    }

    /// Customers' choices about broadcasts as kept, with the JSON each is kept as.
    async fn consents(&self, customers: &[String]) -> Result<HashMap<String, (Choice, String)>> {
        let kept: List<RawConsent> = self
            .call("consents", json!({ "customers": customers }))
            .await?;
        kept.0
            .into_iter()
            .map(|c| {
                let raw: RawChoice = serde_json::from_str(&c.choice)
                    .map_err(|e| Error::Unavailable(format!("a kept choice: {e}")))?;
                Ok((c.customer, (raw.choice()?, c.choice)))
            })
            .collect()
    }
}

#[async_trait]
impl Health for RedisStore {
    async fn ready(&self) -> Result<()> {
        let mut conn = self.caller.conn.clone();
        // One MGET: the two keys share the slot, also on a cluster.
        let (version, epoch): (Option<String>, Option<String>) = redis::cmd("MGET")
            .arg(self.key("schema"))
            .arg(self.key("epoch"))
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        match (version, epoch) {
            (Some(v), _) if v != VERSION.to_string() => Err(Error::Schema(format!(
                "key layout {v} under {}, expected {VERSION}",
                self.caller.tag
            ))),
            (Some(_), Some(epoch)) if epoch == self.caller.epoch => Ok(()),
            _ => {
                tracing::error!(prefix = %self.caller.tag, "the Redis store was reset since this node started (restarted without an append-only file, or flushed): what it held is gone, and this node refuses work until it is restarted");
                Err(reset())
            }
        }
    }
}
