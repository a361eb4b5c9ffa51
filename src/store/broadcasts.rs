//! Broadcasts: a template sent to many recipients, planned, claimed and paced by the broadcaster.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;

use super::Result;
use super::rules::broadcast::{
    BroadcastState, Control, Limits, Outcome, PausedBy, RecipientState, SkipReason, TemplateNews,
};
use super::rules::category::TemplateCategory;
use super::rules::consent::Choice;
use super::rules::hours::LocalHours;
use crate::clock::At;

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
    /// Whether Meta charges for its message, once a status said (see [`rules::broadcast::billed`](super::rules::broadcast::billed)).
    pub billed: Option<bool>,
    /// Meta's pricing category for its message (`marketing`, or `marketing_lite` through the
    /// Marketing Messages API, ...), once a status said.
    pub pricing: Option<String>,
}

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
    /// [`Error::NotFound`](super::Error::NotFound) when there is no such broadcast, or the control does not apply to
    /// its state (see [`rules::broadcast::control`](super::rules::broadcast::control)).
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
    /// opted out, or is inside the cooldown, is skipped ([`rules::broadcast::left_out`](super::rules::broadcast::left_out)); none
    /// is claimed beyond the messaging limit's headroom ([`rules::broadcast::headroom`](super::rules::broadcast::headroom)).
    async fn claim_recipients(&self, claim: RecipientClaim) -> Result<Vec<RecipientJob>>;

    /// Records how a send to a recipient ended, by the rulebook.
    ///
    /// # Errors
    /// [`Error::LeaseLost`](super::Error::LeaseLost) when `attempt` is not the recipient's latest or it is no longer
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
    /// ([`rules::broadcast::on_template`](super::rules::broadcast::on_template)); the ids of those it moved. Stored webhooks about
    /// templates are heard in the ingest's transaction on SQLite and PostgreSQL, and on Redis
    /// right after the ingest script kept them the first time.
    async fn hear_template(&self, news: TemplateNews) -> Result<Vec<i64>>;

    /// Keeps a template's category as Meta gave it, unless a newer word on it is kept
    /// ([`rules::category::replaces`](super::rules::category::replaces)). Stored `template_category_update` webhooks are kept in
    /// the ingest's transaction on SQLite and PostgreSQL, and on Redis right after the ingest
    /// script kept them the first time.
    async fn keep_category(&self, category: TemplateCategory) -> Result<()>;

    /// The latest category kept for template `name` in `language`; `None` when Meta has not
    /// said.
    async fn template_category(&self, name: &str, language: &str) -> Result<Option<String>>;

    /// Keeps a customer's choice about broadcasts by the rulebook
    /// ([`rules::consent::apply`](super::rules::consent::apply)); `true` when it changed their standing. A claim skips a
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
