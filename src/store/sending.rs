//! The sender: reply parts claimed from the outbox, paced per recipient, and each send's outcome written with its attempt.

use std::time::Duration;

use async_trait::async_trait;

use super::Result;
use super::rules::part::{Delivery, PartKind, PartState, SendResult};
use crate::clock::At;
use crate::domain::ConversationKey;

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
    /// The fencing token of this send: [`Store::record_send`](super::Sending::record_send) must carry it.
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

/// A holding message's parts are numbered from here: after any reply's, so the two never meet.
pub const HOLD_PART: u32 = 1_000;

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
    /// [`Error::LeaseLost`](super::Error::LeaseLost) when `attempt` is not the part's latest or its claim lapsed: the
    /// part must not be sent.
    async fn depart(&self, id: i64, attempt: u32, now: At, lease: Duration) -> Result<()>;

    /// Records how a send ended.
    ///
    /// # Errors
    /// [`Error::LeaseLost`](super::Error::LeaseLost) when `attempt` is not the part's latest or it is no longer being
    /// sent (a status webhook settled it first): nothing is written.
    async fn record_send(&self, id: i64, attempt: u32, now: At, result: SendResult) -> Result<()>;

    /// The earliest time a reply part may become claimable (the head of its recipient's
    /// queue, not from a number in `skip`), or an unsettled send's lease or wait ends.
    async fn next_send_due(&self, skip: Vec<String>) -> Result<Option<At>>;
}
