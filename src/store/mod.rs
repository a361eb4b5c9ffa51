//! Store: the only place state lives.
//!
//! One interface, several backends (SQLite embedded by default). Operations are at the level of
//! the pipeline ("ingest this delivery", "list the inbox"), never rows or SQL, so that every
//! backend can make each one atomic: an [`Store::ingest`] either keeps all of a delivery, with
//! its deduplication and scheduling, or nothing, and returns only once the delivery is as
//! durable as the backend makes it. That is what lets the ingress acknowledge after it.
//!
//! Driver errors never cross this interface: each backend maps them into [`Error`].

mod items;
mod postgres;
mod redis;
pub mod rules;
mod sqlite;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub use self::postgres::PgStore;
pub use self::redis::RedisStore;
pub use self::rules::batch::AnsweredBy;
pub use self::rules::broadcast::{
    BroadcastState, Control, Limits, Outcome, PausedBy, RecipientState, SkipReason, TemplateNews,
};
pub use self::rules::category::TemplateCategory;
pub use self::rules::consent::Choice;
pub use self::rules::erasure::{Erased, Marks, Subject};
pub use self::rules::hours::{LocalHours, QuietHours, When};
pub use self::rules::item::{ItemState, JobStatus};
pub use self::rules::part::{Delivery, PartKind, PartState, SendResult, WINDOW_CLOSED};
pub use self::rules::retention::{Horizons, Swept};
pub use self::rules::review::{Resolution, ReviewState};
pub use self::rules::turn::Ending;
pub use self::sqlite::SqliteStore;
use crate::clock::{At, SharedClock};
use crate::config::{Config, StoreConfig};
use crate::domain::{
    BatchMessage, BatchPolicy, Channel, Claim, ConversationKey, InboundItem, ItemKind, LeaseToken,
    Quarantined, ReplyPart, ReviewReason,
};

/// Errors every backend reports the same way.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The backend cannot be reached or cannot commit: retry later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store's schema is older or newer than this build expects.
    #[error("store schema: {0}")]
    Schema(String),
    /// The lease's token is no longer the batch's latest: another worker holds it now, or the
    /// batch has ended. The write was refused.
    #[error("lease lost: the batch was taken over or has ended")]
    LeaseLost,
    /// No such item (or it is no longer open).
    #[error("not found")]
    NotFound,
    /// Work under way stops the change for now (see [`rules::erasure::busy`]): try again in
    /// a moment.
    #[error("{0}; try again in a moment")]
    Busy(&'static str),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a send puts in `biz_opaque_callback_data`: the outbox part and the attempt, so a
/// status webhook settles exactly that send when its answer was lost.
pub fn send_callback(outbox_id: i64, attempt: u32) -> String {
    format!("sabi:outbox:{outbox_id}:{attempt}")
}

/// The (outbox part, attempt) a callback names, if it is one of Sabi's.
pub fn parse_send_callback(callback: &str) -> Option<(i64, u32)> {
    let (id, attempt) = callback.strip_prefix("sabi:outbox:")?.split_once(':')?;
    Some((id.parse().ok()?, attempt.parse().ok()?))
}

/// What a broadcast send puts in `biz_opaque_callback_data`: the recipient and the attempt, so
/// a status webhook settles exactly that send when its answer was lost.
pub fn broadcast_callback(recipient: i64, attempt: u32) -> String {
    format!("sabi:broadcast:{recipient}:{attempt}")
}

/// The (recipient, attempt) a broadcast callback names.
pub fn parse_broadcast_callback(callback: &str) -> Option<(i64, u32)> {
    let (id, attempt) = callback.strip_prefix("sabi:broadcast:")?.split_once(':')?;
    Some((id.parse().ok()?, attempt.parse().ok()?))
}

/// Runs a fenced write (a turn's ending, a send's outcome) again while the store is unreachable:
/// up to eight more tries, 0.1 s apart doubling to 2 s (about 9 s in all), and only while
/// `holds()` says the lease is still this node's. A short outage then costs a delay, not the
/// work. A try whose answer was lost may have written: when a later try is refused as a lost
/// lease, the write has most likely landed, and that counts as done.
///
/// # Errors
/// The last error when the store stayed away, or the first that is not [`Error::Unavailable`].
pub async fn write_through_outage<F, Fut>(
    clock: &SharedClock,
    holds: impl Fn() -> bool,
    mut write: F,
) -> Result<()>
where
    F: FnMut(At) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut wait = Duration::from_millis(100);
    let mut failed = 0;
    loop {
        let now = clock.now();
        match write(now).await {
            Err(Error::Unavailable(why)) if failed < 8 && holds() => {
                failed += 1;
                tracing::warn!(error.message = %why, tries = failed, "the store is unreachable; trying the write again");
                clock.sleep_until(now + wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            Err(Error::LeaseLost) if failed > 0 => {
                tracing::info!(
                    "a try whose answer was lost has most likely written this; nothing more to write"
                );
                return Ok(());
            }
            outcome => return outcome,
        }
    }
}

/// One delivery to keep: everything in it is stored in one atomic, durable step.
#[derive(Debug, Clone)]
pub struct Ingest {
    pub items: Vec<InboundItem>,
    pub quarantined: Vec<Quarantined>,
    /// When the delivery arrived, Unix milliseconds.
    pub received_at: At,
    /// When the conversations this delivery touches become due.
    pub policy: BatchPolicy,
    /// The messages (by dedupe key) the router answers alone. Any other message puts its
    /// conversation in the model's lane until a batch takes it; the others' turns are claimed
    /// first ([`Turns::claim_routine`]).
    pub routine: HashSet<String>,
    /// The least time between two messages to one customer (`whatsapp.pair_spacing`): a status
    /// that settles a send before its sender answered holds the customer that long.
    pub pair_spacing: Duration,
}

/// What an ingest did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IngestReceipt {
    /// Items stored for the first time.
    pub stored: usize,
    /// Items already stored with the same content: changed nothing.
    pub duplicates: usize,
    /// Items already stored under the same key with other content: logged, changed nothing.
    pub anomalies: usize,
    /// Raw parts quarantined for the first time (a redelivered one is kept once).
    pub quarantined: usize,
    /// The earliest due time among the conversations this delivery scheduled.
    pub earliest_due: Option<At>,
}

/// Which due conversations a claim or a hold looks at (see [`Ingest::routine`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    Any,
    /// Those whose pending messages the router answers alone.
    Routine,
    /// Those with a pending message for the model.
    Model,
}

/// Which stored items to list.
#[derive(Debug, Clone, Default)]
pub struct InboxQuery {
    pub kind: Option<ItemKind>,
    pub channel: Option<Channel>,
    /// Only items after this sequence number.
    pub after: Option<i64>,
    pub limit: Option<usize>,
}

/// An inbound item as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredItem {
    /// Arrival order across the whole store.
    pub seq: i64,
    pub item: InboundItem,
    pub received_at: At,
    pub state: ItemState,
    /// The batch it was answered in, once claimed.
    pub batch: Option<i64>,
}

/// A raw piece of a delivery that Sabi could not understand.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredQuarantine {
    pub id: i64,
    pub received_at: At,
    pub quarantined: Quarantined,
}

/// One reply part in the outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEntry {
    pub id: i64,
    pub batch_id: i64,
    pub part: u32,
    pub conversation: ConversationKey,
    pub text: String,
    pub state: PartState,
    /// What went out.
    pub kind: PartKind,
    /// Claims by a sender, a claim given back untried included: the latest is the fencing
    /// token of the send under way.
    pub attempts: u32,
    /// Meta's id, once it accepted the send.
    pub wamid: Option<String>,
    /// Meta's latest status, never downgraded.
    pub delivery: Option<Delivery>,
    pub error_code: Option<i64>,
    pub error: Option<String>,
    pub created_at: At,
    /// When Meta accepted it.
    pub sent_at: Option<At>,
    /// When the turn that wrote it was claimed, and when it ended.
    pub turn_started_at: At,
    pub turn_finished_at: At,
}

/// What a claim for sends took, and what it settled on the way.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SendClaims {
    pub jobs: Vec<SendJob>,
    /// Parts whose send lease lapsed with no outcome (their sender died or hung mid-request):
    /// they may have reached Meta, and wait for a status webhook as unknown.
    pub unknown: Vec<i64>,
}

/// A reply part handed to a sender under a send lease.
#[derive(Debug, Clone, PartialEq)]
pub struct SendJob {
    pub id: i64,
    pub batch_id: i64,
    pub part: u32,
    pub conversation: ConversationKey,
    pub text: String,
    pub options: Vec<String>,
    pub quote: Option<String>,
    /// The fencing token of this send: [`Store::record_send`] must carry it.
    pub attempt: u32,
    /// Failed tries so far (throttling not counted).
    pub failures: u32,
    /// Meta reported the customer service window closed for it: only a template may go.
    pub window_closed: bool,
    /// When the customer last wrote (the start of the 24-hour window), if known.
    pub last_inbound_at: Option<At>,
}

/// Which reply parts a sender may claim.
#[derive(Debug, Clone)]
pub struct SendClaim {
    pub now: At,
    /// How long a claimed part is held for its sender while it waits for its pacing slot;
    /// unsent then, it goes back to the queue.
    pub lease: Duration,
    /// How long an unknown outcome waits for a status webhook before it goes to review.
    pub unknown_wait: Duration,
    pub limit: usize,
    /// Business numbers that must not send now (their token expired).
    pub halted: Vec<String>,
}

/// A batch waiting for a person.
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewEntry {
    pub id: i64,
    pub batch_id: i64,
    /// The reply part it is about, when a send went wrong.
    pub outbox_id: Option<i64>,
    pub state: ReviewState,
    pub conversation: ConversationKey,
    pub reason: ReviewReason,
    pub error: Option<String>,
    pub created_at: At,
    pub messages: Vec<BatchMessage>,
}

/// What the router made of a turn's messages, kept with the turn so that its guesses can be
/// compared with what happened.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteGuess {
    /// Its best intent (an intent's name, or `out_of_scope`).
    pub intent: String,
    pub confidence: f32,
    /// Whether the router answered (or handed over) on its own.
    pub local: bool,
}

/// An ended turn the router guessed at: what learning from use reads.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutedTurn {
    pub batch_id: i64,
    /// The batch's messages' texts, one per line, in the order they were sent.
    pub text: String,
    pub guess: RouteGuess,
    pub answered_by: AnsweredBy,
    /// What a person said the messages asked, when one labelled them.
    pub label: Option<String>,
    pub finished_at: At,
}

/// A broadcast as a person asks for it, with its audience.
#[derive(Debug, Clone, PartialEq)]
pub struct NewBroadcast {
    /// The same key always gives the same broadcast: a retried create makes no second one.
    pub key: Option<String>,
    pub name: String,
    pub template: String,
    pub language: String,
    /// The business number it goes from.
    pub business: String,
    pub now: At,
    /// Not before this.
    pub start_at: At,
    /// What is not sent by then is cancelled.
    pub until: Option<At>,
    /// Messages per second at most.
    pub rate: u32,
    /// The template's body as Meta approved it, with its placeholders (when it was checked).
    pub body: Option<String>,
    /// Quiet hours and wall-clock times, on each recipient's clock (`start_at` and `until` are
    /// then the earliest start and the latest deadline, see [`LocalHours::span`]).
    pub hours: Option<LocalHours>,
    pub recipients: Vec<NewRecipient>,
}

/// One row of a broadcast's audience.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRecipient {
    /// E.164 digits (as written, when it could not be read).
    pub to: String,
    /// The template's body parameters, in order.
    pub params: Vec<String>,
    /// Its line in the audience file, when it came from one.
    pub line: Option<u64>,
    /// Left out, and why in words.
    pub skipped: Option<(SkipReason, String)>,
    /// Its IANA time zone, when known (the broadcast's otherwise).
    pub tz: Option<String>,
}

/// A broadcast as stored, with its recipients counted by state.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BroadcastView {
    pub id: i64,
    pub key: Option<String>,
    pub name: String,
    pub template: String,
    pub language: String,
    pub business: String,
    pub state: BroadcastState,
    /// Why it is paused, and who paused it, while it is.
    pub paused_because: Option<String>,
    pub paused_by: Option<PausedBy>,
    /// The template's body as Meta approved it, when it was checked.
    pub body: Option<String>,
    /// Hours of the day it sends nothing (`HH:MM-HH:MM`), on each recipient's clock.
    pub quiet_hours: Option<String>,
    /// The time zone of recipients without their own.
    pub tz: Option<String>,
    /// A start and deadline given as wall-clock times, on each recipient's clock.
    pub local_start: Option<String>,
    pub local_until: Option<String>,
    pub created_at: At,
    pub start_at: At,
    pub until: Option<At>,
    pub rate: u32,
    pub recipients: u64,
    /// Recipients by state; every state is named, with 0 when none is in it.
    pub counts: BTreeMap<&'static str, u64>,
}

/// One recipient of a broadcast, as stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RecipientView {
    pub id: i64,
    pub to: String,
    pub params: Vec<String>,
    pub line: Option<u64>,
    pub state: RecipientState,
    pub skipped: Option<SkipReason>,
    /// Why it was skipped, failed or is held, in words.
    pub error: Option<String>,
    pub error_code: Option<i64>,
    pub wamid: Option<String>,
    /// When Meta took it.
    pub sent_at: Option<At>,
    /// When the customer first wrote after it (within [`REPLY_SPAN`]).
    pub replied_at: Option<At>,
    /// Its IANA time zone, when known (the broadcast's otherwise).
    pub tz: Option<String>,
    /// Whether Meta charges for its message, once a status said (see [`rules::broadcast::billed`]).
    pub billed: Option<bool>,
    /// Meta's pricing category for its message (`marketing`, or `marketing_lite` through the
    /// Marketing Messages API, ...), once a status said.
    pub pricing: Option<String>,
}

/// A holding message's parts are numbered from here: after any reply's, so the two never meet.
pub const HOLD_PART: u32 = 1_000;

/// How long after a broadcast a customer's message counts as its reply.
pub const REPLY_SPAN: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// Which broadcast recipients a sender may claim.
#[derive(Debug, Clone)]
pub struct RecipientClaim {
    pub now: At,
    /// How long a claimed recipient is held before its send counts as unknown.
    pub lease: Duration,
    pub limit: usize,
    /// Business numbers that must not send now.
    pub halted: Vec<String>,
    /// A customer sent a broadcast this recently is skipped by the next ([`SkipReason::Cooldown`]).
    pub cooldown: Duration,
    /// Meta's messaging limit: unique customers per rolling 24 hours (`None`: unlimited). No
    /// more are claimed once it is reached; the rest wait for headroom.
    pub daily_limit: Option<u64>,
}

/// A broadcast recipient handed to a sender under a send lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecipientJob {
    pub id: i64,
    pub broadcast_id: i64,
    /// The fencing token of this send: [`Broadcasts::record_recipient`] must carry it.
    pub attempt: u32,
    pub to: String,
    pub params: Vec<String>,
    pub template: String,
    pub language: String,
    pub business: String,
    /// The broadcast's messages per second at most.
    pub rate: u32,
}

/// The counts of `states`, every state named.
pub fn recipient_counts(
    states: impl IntoIterator<Item = (RecipientState, u64)>,
) -> BTreeMap<&'static str, u64> {
    let mut counts: BTreeMap<&'static str, u64> = RecipientState::ALL
        .iter()
        .map(|s| (s.as_str(), 0))
        .collect();
    for (state, n) in states {
        *counts.entry(state.as_str()).or_default() += n;
    }
    counts
}

/// What one agent turn's model calls used.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TurnUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Estimated from the configured prices, in their currency.
    pub cost: f64,
}

/// Turns since a time, by who answered them, and what the model cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TurnStats {
    /// Answered without a model call (the router, or the sandbox acknowledgement).
    pub local: u64,
    /// Answered by the agent.
    pub agent: u64,
    /// Handed to people (review, hand-offs included).
    pub people: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost: f64,
}

/// Who said something in a conversation's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speaker {
    Customer,
    /// A reply Sabi sent (or kept, in sandbox mode).
    Business,
    /// A note: the conversation went to a person, and why.
    Note,
}

impl Speaker {
    pub fn as_str(self) -> &'static str {
        match self {
            Speaker::Customer => "customer",
            Speaker::Business => "business",
            Speaker::Note => "note",
        }
    }
}

/// One line of a conversation's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    pub at: At,
    pub speaker: Speaker,
    pub text: String,
}

/// Which review items to list.
#[derive(Debug, Clone, Default)]
pub struct ReviewQuery {
    /// Only items of this reason.
    pub reason: Option<ReviewReason>,
    /// Only items of this customer.
    pub customer: Option<String>,
    pub limit: Option<usize>,
}

/// A conversation and what was said in it, for people.
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationView {
    pub conversation: ConversationKey,
    /// When the customer last wrote (the 24-hour window starts there).
    pub last_inbound_at: Option<At>,
    pub history: Vec<HistoryEntry>,
}

/// Counts of the pipeline's state now, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Conversations whose batch is due and not yet claimed.
    pub due: u64,
    /// Batches held by a worker.
    pub running: u64,
    /// Batches waiting for a retry.
    pub waiting: u64,
    /// Open review items.
    pub review: u64,
    /// Reply parts waiting to be sent.
    pub queued_sends: u64,
    /// Sends whose outcome is unknown.
    pub unknown_sends: u64,
}

/// A web-chat question to keep, with its job.
#[derive(Debug, Clone)]
pub struct ChatSubmission {
    pub session_id: String,
    /// The browser's idempotency key: the same (session, message id) always gives the same job.
    pub message_id: Option<String>,
    pub question: String,
    /// The visitor's user id, when their site vouched for it (`user_hash`).
    pub user_id: Option<String>,
    /// The client address of an anonymous visitor (none for a vouched one): the desk folds
    /// repeated hand-offs from one address into one.
    pub address: Option<String>,
    /// The site the chat runs on: the conversation's business side.
    pub business: String,
    /// A fresh unguessable id, used when this is a new job.
    pub job_id: String,
    pub now: At,
    pub policy: BatchPolicy,
    /// How long the job's result can be fetched.
    pub keep: Duration,
    /// At most this many new questions from one session in the minute before `now`; counted
    /// and stored in one atomic step, so a burst cannot slip past the limit.
    pub per_minute: u64,
    /// At most this many web-chat questions waiting in all; counted in the same step.
    pub max_queue: u64,
}

/// What became of a web-chat question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    /// Stored (or stored before, for a resend): its job.
    Job(ChatReceipt),
    /// The session asked too often in the last minute: nothing stored. `retry_after`: when
    /// its oldest counted question leaves the minute, so that one more may come.
    TooFast { retry_after: Duration },
    /// The web-chat queue is full: nothing stored.
    QueueFull,
    /// The session is bound to another verified user than the one asking (or the one asking
    /// is anonymous): nothing stored, and no job of the session named.
    NotYours,
}

/// The job a submission gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatReceipt {
    pub job_id: String,
    /// False when the same message was submitted before: nothing new was stored.
    pub created: bool,
    pub earliest_due: Option<At>,
}

/// A web-chat job as its browser sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatJob {
    pub job_id: String,
    pub session_id: String,
    pub status: JobStatus,
    /// What its turn is doing, once started, if the turn said.
    pub stage: Option<String>,
    /// Questions ahead of this one, while queued.
    pub position: Option<u64>,
    pub answer: Option<String>,
    pub created_at: At,
}

/// One question of a session's history, and its answer once there is one.
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct ChatExchange {
    /// Where the exchange stands in its session's order: ask for the history `before` it for
    /// the ones asked earlier.
    #[serde(skip)]
    pub cursor: i64,
    pub job_id: String,
    pub question: String,
    pub answer: Option<String>,
    pub status: JobStatus,
    /// Milliseconds since the epoch.
    #[serde(rename = "asked_at_ms")]
    #[schema(value_type = i64)]
    pub asked_at: At,
}

/// What people wrote to a web-chat session, and whether one holds its conversation now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatFeed {
    /// A review item of the session is open: a person holds the conversation, and what the
    /// visitor writes goes to them ([`rules::review::destination`]).
    pub held: bool,
    /// People's replies after the id asked for, oldest first.
    pub lines: Vec<PersonLine>,
}

/// A person's reply to a web-chat session.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct PersonLine {
    /// Increases with every reply in the store: resume after it.
    pub id: i64,
    pub text: String,
    /// Milliseconds since the epoch.
    #[serde(rename = "at_ms")]
    #[schema(value_type = i64)]
    pub at: At,
}

/// What the ingress keeps: deliveries, atomically and durably.
#[async_trait]
pub trait Intake: Send + Sync + 'static {
    /// Appends a delivery's items deduplicated on (channel, dedupe key), records its statuses
    /// and quarantined parts, and schedules each conversation it wakes. Atomic and durable.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when nothing could be committed: nothing of the delivery is kept.
    async fn ingest(&self, delivery: Ingest) -> Result<IngestReceipt>;
}

/// What the scheduler and turn handlers do with batches: claim under a lease, end a turn, and what a turn reads and notes on the way.
#[async_trait]
pub trait Turns: Send + Sync + 'static {
    /// Claims up to `limit` batches due at `now`, each under a lease until `now + lease`
    /// with a fresh fencing token: batches whose lease lapsed or whose retry time came, then new
    /// batches of every pending message of conversations that are due and have no batch open.
    /// A conversation never has two batches open, so its turns never overlap. With `channel`,
    /// only that channel's conversations are claimed (the scheduler keeps slots for WhatsApp
    /// that web chat cannot take).
    async fn claim(
        &self,
        now: At,
        lease: Duration,
        limit: usize,
        channel: Option<Channel>,
    ) -> Result<Vec<Claim>>;

    /// Up to `limit` new batches of due WhatsApp conversations whose pending messages the
    /// router answers alone ([`Ingest::routine`]), the longest due first, under a lease like
    /// [`Turns::claim`]'s. The scheduler takes these before any other turn, so that a turn
    /// without the model never waits behind model turns.
    async fn claim_routine(&self, now: At, lease: Duration, limit: usize) -> Result<Vec<Claim>>;

    /// Extends a lease.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when `token` is stale.
    async fn renew(&self, batch: i64, token: LeaseToken, now: At, lease: Duration) -> Result<()>;

    /// Ends a turn: writes its reply, schedules its retry, or sends it to review.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when `token` is stale: nothing is written.
    async fn finish(&self, batch: i64, token: LeaseToken, now: At, ending: Ending) -> Result<()>;

    /// Tells the customers of up to `limit` due WhatsApp conversations of the model's lane
    /// (the router's are claimed first and never wait), after the `skip` longest due (they will
    /// be answered soon), that their answer will take a while: each gets
    /// a batch of its pending messages, `parts` go to its outbox ahead of the reply (numbered
    /// from [`HOLD_PART`]), and the batch waits in the queue at its own due time, no attempt
    /// spent; what the customer writes meanwhile joins it when it runs. Only conversations with
    /// no batch open are held, so a batch is held at most once. The held batches' ids.
    async fn hold(
        &self,
        now: At,
        skip: usize,
        limit: usize,
        parts: Vec<ReplyPart>,
        sandbox: bool,
    ) -> Result<Vec<i64>>;

    /// The earliest time at which something may become claimable, if anything is waiting.
    async fn next_due(&self) -> Result<Option<At>>;

    /// What was said in the last `turns` turns of `batch`'s conversation before it: the
    /// customer's messages, the replies, and hand-off notes, oldest first.
    async fn history(&self, batch: i64, turns: usize) -> Result<Vec<HistoryEntry>>;

    /// The latest broadcast the conversation's customer was sent from its business after
    /// `since` and up to `until`, as the customer read it: a reply to it needs it in view. Redis
    /// keeps only each customer's very last broadcast: one sent later (or from another of the
    /// business's numbers) hides it there.
    async fn last_broadcast(
        &self,
        conversation: &ConversationKey,
        since: At,
        until: At,
    ) -> Result<Option<HistoryEntry>>;

    /// Keeps the transcript of a voice note as the message's text (only where it has none), so
    /// history and people read what was said.
    async fn set_transcript(&self, channel: Channel, external_id: &str, text: &str) -> Result<()>;

    /// Records what a running turn is doing now ("looking it up"); shown by the web chat.
    async fn set_stage(&self, batch: i64, stage: &str) -> Result<()>;

    /// Adds what a turn's model calls used.
    async fn add_usage(&self, batch: i64, usage: TurnUsage) -> Result<()>;

    /// Keeps what the router made of a turn's messages.
    async fn set_route(&self, batch: i64, guess: RouteGuess) -> Result<()>;
}

/// What the sender does with reply parts: claim under a send lease and record how each send ended.
#[async_trait]
pub trait Sending: Send + Sync + 'static {
    /// Claims reply parts due for sending, each held for its sender until it departs: per
    /// recipient only the oldest part not yet settled (an unknown one holds back only the
    /// rest of its own reply), once the recipient's pacing allows. In the same step, lapsed
    /// claims go back to the queue, sends whose lease lapsed become unknown, and unknown ones
    /// past their wait go to review.
    async fn claim_sends(&self, claim: SendClaim) -> Result<SendClaims>;

    /// The claimed part `id` departs: its request may reach Meta from `now` on, and it is held
    /// under a send lease until `now + lease`.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when `attempt` is not the part's latest or its claim lapsed: the
    /// part must not be sent.
    async fn depart(&self, id: i64, attempt: u32, now: At, lease: Duration) -> Result<()>;

    /// Records how a send ended.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when `attempt` is not the part's latest or it is no longer being
    /// sent (a status webhook settled it first): nothing is written.
    async fn record_send(&self, id: i64, attempt: u32, now: At, result: SendResult) -> Result<()>;

    /// The earliest time a reply part may become claimable (the head of its recipient's
    /// queue, not from a number in `skip`), or an unsettled send's lease or wait ends.
    async fn next_send_due(&self, skip: Vec<String>) -> Result<Option<At>>;
}

/// What people do: the review queue, settling its items, and customers' conversations.
#[async_trait]
pub trait Reviews: Send + Sync + 'static {
    /// Open review items, oldest first.
    async fn review_queue(&self, query: ReviewQuery) -> Result<Vec<ReviewEntry>>;

    /// One review item, open or settled.
    async fn review_item(&self, id: i64) -> Result<Option<ReviewEntry>>;

    /// Settles an open review item, atomically with what it asks for.
    ///
    /// # Errors
    /// [`Error::NotFound`] when no open item has this id.
    async fn resolve_review(&self, id: i64, now: At, resolution: Resolution) -> Result<()>;

    /// The conversations of a customer, with their history (the last `turns` turns).
    async fn conversations(&self, customer: &str, turns: usize) -> Result<Vec<ConversationView>>;

    /// A person's word on what a turn's messages asked (an intent's name, or `out_of_scope`);
    /// a later label replaces an earlier one.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such batch.
    async fn label_turn(&self, batch: i64, intent: &str) -> Result<()>;
}

/// What the web chat keeps and serves: questions, their jobs, a session's history.
#[async_trait]
pub trait WebChat: Send + Sync + 'static {
    /// Keeps a web-chat question and its job in one atomic step; the same (session, message
    /// id) always gives the same job, also when two submissions race. While a review item of
    /// the session is open, the question joins that item's batch for the person and no turn is
    /// scheduled ([`rules::review::destination`]). The session's
    /// `per_minute` limit and the queue's `max_queue` are counted in the same step, so no burst
    /// slips past either. A session is bound to the first verified user whose question it
    /// keeps; from then on anyone else's submission (an anonymous one too, and a resend of one
    /// of its message ids) is [`Submitted::NotYours`], decided in the same step.
    async fn submit_chat(&self, submission: ChatSubmission) -> Result<Submitted>;

    /// The verified user the session is bound to: the first whose question it kept
    /// ([`ChatSubmission::user_id`]); `None` while only anonymous visitors used it.
    async fn chat_session_owner(&self, session_id: &str) -> Result<Option<String>>;

    /// The job already made for this (session, message id), if any.
    async fn chat_job_for_message(
        &self,
        session_id: &str,
        message_id: &str,
    ) -> Result<Option<String>>;

    /// A job, unless it is unknown or expired at `now`.
    async fn chat_job(&self, job_id: &str, now: At) -> Result<Option<ChatJob>>;

    /// A session's questions and answers in the order they arrived, the last `limit` of them
    /// asked before the exchange whose cursor is `before` (`None`: the latest): the clocks of
    /// the nodes that took them (each question's `now`) do not reorder them.
    async fn chat_history(
        &self,
        session_id: &str,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<ChatExchange>>;

    /// Web-chat questions waiting for a turn. Counts them: callers keep the figure a moment.
    async fn chat_queue_depth(&self) -> Result<u64>;

    /// People's replies to the session after reply `after` (at most `limit`, oldest first),
    /// and whether a person holds it now. One cheap read: event streams ask it every second.
    async fn chat_feed(&self, session_id: &str, after: i64, limit: usize) -> Result<ChatFeed>;
}

/// What operators read: the inbox, quarantine, outbox, turn statistics and the pipeline's counts.
#[async_trait]
pub trait Inspection: Send + Sync + 'static {
    /// Stored items in arrival order.
    async fn inbox(&self, query: InboxQuery) -> Result<Vec<StoredItem>>;

    /// Quarantined raw parts in arrival order.
    async fn quarantine(&self, limit: Option<usize>) -> Result<Vec<StoredQuarantine>>;

    /// Outbox rows in the order they were written.
    async fn outbox(&self, limit: Option<usize>) -> Result<Vec<OutboxEntry>>;

    /// Turns that ended since `since`.
    async fn turn_stats(&self, since: At) -> Result<TurnStats>;

    /// The pipeline's counts now.
    async fn gauges(&self, now: At) -> Result<Gauges>;

    /// Turns that ended since `since` and that the router guessed at, the latest first, at
    /// most `limit` of them.
    async fn routed_turns(&self, since: At, limit: usize) -> Result<Vec<RoutedTurn>>;
}

/// What broadcasts keep: their audience, who got them, and what people ask of them.
#[async_trait]
pub trait Broadcasts: Send + Sync + 'static {
    /// Keeps a broadcast and its recipients in one atomic step; with a `key` already used, the
    /// broadcast made with it is returned instead (`false`: nothing new was kept).
    async fn create_broadcast(&self, broadcast: NewBroadcast) -> Result<(BroadcastView, bool)>;

    /// The latest broadcasts first, at most `limit`.
    async fn broadcasts(&self, limit: usize) -> Result<Vec<BroadcastView>>;

    async fn broadcast(&self, id: i64) -> Result<Option<BroadcastView>>;

    /// The broadcast created with `key`, if one was.
    async fn keyed_broadcast(&self, key: &str) -> Result<Option<BroadcastView>>;

    /// A broadcast's recipients in audience order, only those in `state` when given.
    async fn broadcast_recipients(
        &self,
        id: i64,
        state: Option<RecipientState>,
        limit: usize,
    ) -> Result<Vec<RecipientView>>;

    /// Pauses (with `reason`), resumes or cancels a broadcast; a cancel also cancels every
    /// recipient still waiting, in the same step.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such broadcast, or the control does not apply to
    /// its state (see [`rules::broadcast::control`]).
    async fn control_broadcast(
        &self,
        id: i64,
        control: Control,
        reason: Option<String>,
    ) -> Result<BroadcastView>;

    /// Claims up to `limit` recipients of running broadcasts, the oldest broadcast first and
    /// each in audience order, under a send lease. In the same step, time moves the broadcasts
    /// on: a scheduled one whose start came runs, one past its deadline is cancelled with its
    /// waiting recipients, a send whose lease lapsed becomes unknown (never sent again), and a
    /// running broadcast with nobody left to send to is finished. A due recipient whose customer
    /// opted out, or is inside the cooldown, is skipped ([`rules::broadcast::left_out`]); none
    /// is claimed beyond the messaging limit's headroom ([`rules::broadcast::headroom`]).
    async fn claim_recipients(&self, claim: RecipientClaim) -> Result<Vec<RecipientJob>>;

    /// Records how a send to a recipient ended, by the rulebook.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when `attempt` is not the recipient's latest or it is no longer
    /// being sent: nothing is written.
    async fn record_recipient(
        &self,
        id: i64,
        attempt: u32,
        now: At,
        outcome: Outcome,
        limits: Limits,
    ) -> Result<()>;

    /// Meta's word on a template moves every broadcast sending it, by the rulebook
    /// ([`rules::broadcast::on_template`]); the ids of those it moved. Stored webhooks about
    /// templates are heard in the ingest's transaction on SQLite and PostgreSQL, and on Redis
    /// right after the ingest script kept them the first time.
    async fn hear_template(&self, news: TemplateNews) -> Result<Vec<i64>>;

    /// Keeps a template's category as Meta gave it, unless a newer word on it is kept
    /// ([`rules::category::replaces`]). Stored `template_category_update` webhooks are kept in
    /// the ingest's transaction on SQLite and PostgreSQL, and on Redis right after the ingest
    /// script kept them the first time.
    async fn keep_category(&self, category: TemplateCategory) -> Result<()>;

    /// The latest category kept for template `name` in `language`; `None` when Meta has not
    /// said.
    async fn template_category(&self, name: &str, language: &str) -> Result<Option<String>>;

    /// Keeps a customer's choice about broadcasts by the rulebook
    /// ([`rules::consent::apply`]); `true` when it changed their standing. A claim skips a
    /// recipient whose customer opted out. Meta's word that a recipient opted out (131050) is
    /// kept with the recipient's step on SQLite and PostgreSQL, and right after it on Redis
    /// (lost there only if the node dies in between: the next refusal tells it again).
    async fn choose(&self, customer: &str, choice: Choice) -> Result<bool>;

    /// Those of `customers` who opted out of broadcasts.
    async fn opted_out(&self, customers: &[String]) -> Result<HashSet<String>>;

    /// Those of `customers` sent a broadcast after `since`.
    async fn sent_since(&self, customers: &[String], since: At) -> Result<HashSet<String>>;

    /// How many customers broadcasts reached after `since`, or are being sent to: what Meta's
    /// messaging limit counts.
    async fn reached(&self, since: At) -> Result<u64>;

    /// The earliest latest broadcast send, after `since`, among the customers [`reached`]
    /// counts: a day after it the messaging limit frees a place. `None` when nobody was sent one.
    ///
    /// [`reached`]: Broadcasts::reached
    async fn first_reached(&self, since: At) -> Result<Option<At>>;
}

/// Everything Sabi holds about one customer: what their right of access gives them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CustomerRecord {
    /// What came from them or about them (messages, statuses), in arrival order.
    pub items: Vec<StoredItem>,
    /// Replies to them, Sabi's and people's, with how their sending went, oldest first.
    pub replies: Vec<OutboxEntry>,
    /// Their turns that went to a person, and how each was settled, oldest first.
    pub reviews: Vec<ReviewRecord>,
    /// Broadcasts addressed to them, oldest first.
    pub broadcasts: Vec<BroadcastSend>,
    /// Their latest choice about broadcasts.
    pub consent: Option<Choice>,
}

/// One page of a customer's record: the items and the replies after these (arrival order, ids
/// from the previous page), at most `limit` of each; hand-offs, broadcasts and the choice
/// whole on every page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportPage {
    pub items_after: i64,
    pub replies_after: i64,
    pub limit: usize,
}

impl ExportPage {
    /// The whole record at once.
    pub const ALL: ExportPage = ExportPage {
        items_after: 0,
        replies_after: 0,
        limit: usize::MAX,
    };

    /// What follows `record`, read as this page, or `None` when it was the last.
    pub fn next(&self, record: &CustomerRecord) -> Option<ExportPage> {
        let full = record.items.len() >= self.limit || record.replies.len() >= self.limit;
        full.then(|| ExportPage {
            items_after: record.items.last().map_or(self.items_after, |i| i.seq),
            replies_after: record.replies.last().map_or(self.replies_after, |r| r.id),
            limit: self.limit,
        })
    }
}

/// A hand-off to a person and how it was settled.
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewRecord {
    pub id: i64,
    pub batch_id: i64,
    pub reason: ReviewReason,
    pub state: ReviewState,
    pub error: Option<String>,
    pub created_at: At,
    pub resolved_at: Option<At>,
    /// The person's reply, when they wrote one.
    pub note: Option<String>,
}

/// A broadcast addressed to a customer, and what became of it.
#[derive(Debug, Clone, PartialEq)]
pub struct BroadcastSend {
    pub broadcast_id: i64,
    pub name: String,
    pub template: String,
    pub recipient: RecipientView,
}

/// A customer's data as a whole: everything about them, and forgetting it
/// ([`rules::erasure`] has the rules).
#[async_trait]
pub trait Customers: Send + Sync + 'static {
    /// Everything held about the customer; empty for one Sabi does not know.
    async fn export_customer(&self, subject: &Subject) -> Result<CustomerRecord>;

    /// One page of [`Customers::export_customer`]. A backend that cannot page reads the whole
    /// record and returns the page of it.
    async fn export_page(&self, subject: &Subject, page: ExportPage) -> Result<CustomerRecord> {
        let mut record = self.export_customer(subject).await?;
        record.items.retain(|i| i.seq > page.items_after);
        record.items.truncate(page.limit);
        record.replies.retain(|r| r.id > page.replies_after);
        record.replies.truncate(page.limit);
        Ok(record)
    }

    /// Erases the customer, in one transaction on every backend, and says what it removed.
    /// Running it again removes nothing more.
    ///
    /// # Errors
    /// [`Error::Busy`] while a turn or a send for them is under way.
    async fn forget_customer(&self, subject: &Subject, now: At) -> Result<Erased>;
}

/// Keeping data only as long as it is needed ([`rules::retention`] has the rules).
#[async_trait]
pub trait Retention: Send + Sync + 'static {
    /// Takes `lease` for `holder` until `now + ttl`, or renews it; `false` while another
    /// holder's time is not up.
    async fn hold_lease(&self, lease: &str, holder: &str, now: At, ttl: Duration) -> Result<bool>;

    /// Removes at most `batch` of each kind past its horizon at `now`, and says what went.
    /// Empty: nothing more is past its horizon.
    async fn sweep(&self, horizons: &Horizons, now: At, batch: usize) -> Result<Swept>;

    /// After a pass that deleted something: gives a slice of the space it freed back to the
    /// file system (SQLite), or makes it free for new rows at once (PostgreSQL's vacuum);
    /// `true` while more could go.
    async fn reclaim_space(&self) -> Result<bool> {
        Ok(false)
    }
}

/// Whether the store can serve.
#[async_trait]
pub trait Health: Send + Sync + 'static {
    /// Succeeds when the store is reachable and its schema is current.
    async fn ready(&self) -> Result<()>;
}

/// A store is every role at once: what `open` returns and the app holds. Each component holds
/// only the role it uses ([`Turns`] for the scheduler and turn handlers, [`Sending`] for the
/// sender, ...), so a test fake implements one role.
pub trait Store:
    Intake
    + Turns
    + Sending
    + Reviews
    + WebChat
    + Inspection
    + Broadcasts
    + Customers
    + Retention
    + Health
{
}

impl<T> Store for T where
    T: Intake
        + Turns
        + Sending
        + Reviews
        + WebChat
        + Inspection
        + Broadcasts
        + Customers
        + Retention
        + Health
{
}

/// Looks at the configured backend without changing it (no file created, no migration):
/// what a `sabi check` may do against a live store.
///
/// # Errors
/// When it cannot be reached, does not exist yet, or its schema is not this build's.
pub async fn probe(config: &StoreConfig) -> Result<String> {
    match config {
        StoreConfig::Sqlite { path } => sqlite::probe(path).await,
        StoreConfig::Postgres { url } => postgres::probe(url).await,
        StoreConfig::Redis { url } => redis::probe(url).await,
    }
}

/// The configured marker secrets ([`Marks`]).
///
/// # Errors
/// As [`Config::marker_secrets`], as [`Error::Schema`].
pub fn marks(config: &Config) -> Result<Marks> {
    let (current, previous) = config
        .marker_secrets()
        .map_err(|e| Error::Schema(e.to_string()))?;
    Ok(Marks::new(current, previous))
}

/// Opens the configured backend, creating and migrating it when needed, with its erasure
/// markers under the configured secret.
///
/// # Errors
/// When the backend cannot be opened or migrated, or its markers were made with a secret the
/// configuration does not have.
pub async fn open(config: &Config) -> Result<Arc<dyn Store>> {
    let marks = marks(config)?;
    match &config.store {
        StoreConfig::Sqlite { path } => Ok(Arc::new(SqliteStore::open(path, marks).await?)),
        StoreConfig::Postgres { url } => Ok(Arc::new(PgStore::open(url, marks).await?)),
        StoreConfig::Redis { url } => Ok(Arc::new(RedisStore::open(url, marks).await?)),
    }
}
