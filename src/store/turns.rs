//! The turn: the scheduler claims a conversation's due batch under a lease, the router or the agent answers it, and the turn ends with one fenced write.

use std::time::Duration;

use async_trait::async_trait;

use super::rules::batch::AnsweredBy;
use super::rules::turn::Ending;
use super::{HistoryEntry, Result};
use crate::clock::At;
use crate::domain::{Channel, Claim, ConversationKey, LeaseToken, ReplyPart};

/// Which due conversations a claim or a hold looks at (see [`Ingest::routine`](super::Ingest::routine)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    Any,
    /// Those whose pending messages the router answers alone.
    Routine,
    /// Those with a pending message for the model.
    Model,
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

/// Whom [`Turns::hold`](super::Turns::hold) tells that their answer will take a while, and what it tells them.
#[derive(Debug, Clone, PartialEq)]
pub struct Holding {
    /// The longest due conversations left out: they will be answered soon.
    pub skip: usize,
    /// Conversations held at the most.
    pub limit: usize,
    /// The holding message, numbered from [`HOLD_PART`](super::HOLD_PART).
    pub parts: Vec<ReplyPart>,
    /// Kept and shown, not sent (sandbox mode).
    pub sandbox: bool,
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
    /// router answers alone ([`Ingest::routine`](super::Ingest::routine)), the longest due first, under a lease like
    /// [`Turns::claim`](super::Turns::claim)'s. The scheduler takes these before any other turn, so that a turn
    /// without the model never waits behind model turns.
    async fn claim_routine(&self, now: At, lease: Duration, limit: usize) -> Result<Vec<Claim>>;

    /// Extends a lease.
    ///
    /// # Errors
    /// [`Error::LeaseLost`](super::Error::LeaseLost) when `token` is stale.
    async fn renew(&self, batch: i64, token: LeaseToken, now: At, lease: Duration) -> Result<()>;

    /// Ends a turn: writes its reply, schedules its retry, or sends it to review.
    ///
    /// # Errors
    /// [`Error::LeaseLost`](super::Error::LeaseLost) when `token` is stale: nothing is written.
    async fn finish(&self, batch: i64, token: LeaseToken, now: At, ending: Ending) -> Result<()>;

    /// Tells the customers of up to `holding.limit` due WhatsApp conversations of the model's
    /// lane (the router's are claimed first and never wait), after the `holding.skip` longest
    /// due (they will be answered soon), that their answer will take a while: each gets a batch
    /// of its pending messages, the holding message goes to its outbox ahead of the reply, and the batch waits in the queue at its own due time, no attempt
    /// spent; what the customer writes meanwhile joins it when it runs. Only conversations with
    /// no batch open are held, so a batch is held at most once. A conversation a person holds
    /// ([`person_holds`](super::rules::review::person_holds)) gets its batch but no message:
    /// the person answers it. The held batches' ids.
    async fn hold(&self, now: At, holding: Holding) -> Result<Vec<i64>>;

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
