//! The turn-handler contract: the engine hands a batch to a handler and stores what it returns.
//! The router, the agent, voice notes and the typing indicator plug in here; the worker drives
//! it. A leaf, so that every one of them can depend on it without depending on the others.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::SharedClock;
use crate::domain::{Batch, ReplyPart, ReviewReason};

/// What a turn produced.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnOutcome {
    /// The reply, in parts, in order.
    Reply(Vec<ReplyPart>),
    /// A person takes over; `parts` (possibly none) tell the customer so.
    Handoff { parts: Vec<ReplyPart>, note: String },
    /// A person takes over with nothing sent: no reply fit to send could be made, and trying
    /// the same again would not make one.
    Review { reason: ReviewReason, note: String },
}

/// A turn that could not produce a reply; the engine retries it or sends it to review.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TurnError(pub String);

#[async_trait]
pub trait TurnHandler: Send + Sync + 'static {
    /// What to do about a batch.
    ///
    /// # Errors
    /// [`TurnError`] when no reply could be made this time.
    async fn handle(&self, batch: &Batch) -> Result<TurnOutcome, TurnError>;
}

/// Replies with a plain acknowledgement, so the whole path runs end to end before the router
/// and the agent are configured. Its delay stands in for an agent's thinking time.
pub struct Acknowledger {
    clock: SharedClock,
    delay: Duration,
}

impl Acknowledger {
    pub fn new(clock: SharedClock, delay: Duration) -> Arc<Acknowledger> {
        Arc::new(Acknowledger { clock, delay })
    }
}

#[async_trait]
impl TurnHandler for Acknowledger {
    async fn handle(&self, batch: &Batch) -> Result<TurnOutcome, TurnError> {
        if !self.delay.is_zero() {
            self.clock.sleep_until(self.clock.now() + self.delay).await;
        }
        let text = match batch.messages.len() {
            1 => "Thanks, we have your message and will get back to you shortly.".to_owned(),
            n => format!("Thanks, we have your {n} messages and will get back to you shortly."),
        };
        Ok(TurnOutcome::Reply(vec![ReplyPart::text(text)]))
    }
}
