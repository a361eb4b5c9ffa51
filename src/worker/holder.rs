//! Holding messages: under a surge, a WhatsApp customer whose turn is expected further off than
//! `engine.hold_after` is told so once ("we will answer you in about 5 minutes"), and the
//! answer follows. The store holds the longest due conversations first, each batch once
//! ([`Turns::hold`]); the message goes through the outbox like any reply, so it leaves before
//! the answer and keeps the number's pacing. Web chat shows its queue position instead.
//!
//! Every node may run it: a conversation is held by one of them, whichever gets there first.
//! Its looks run in the runner's periodic loop (`Periodic`).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::policy;
use crate::clock::{At, SharedClock};
use crate::config::HoldSettings;
use crate::domain::ReplyPart;
use crate::metrics::Metrics;
use crate::runner::{Periodic, Runner};
use crate::store::{self, Gauges, Holding, Inspection, Turns};

/// How often the queue is looked at.
const EVERY: Duration = Duration::from_secs(5);
/// Conversations held per look: the next look holds more.
const PER_LOOK: usize = 200;
/// Conversations told one wait, in queue order.
const CHUNK: usize = 50;
/// How long a look under way at shutdown may go on.
const GRACE: Duration = Duration::from_secs(5);

pub struct Holder {
    /// Where the holding messages go: [`Turns::hold`].
    turns: Arc<dyn Turns>,
    /// What the queue looks like.
    inspection: Arc<dyn Inspection>,
    clock: SharedClock,
    settings: HoldSettings,
    metrics: Arc<Metrics>,
}

impl Holder {
    pub fn new(
        turns: Arc<dyn Turns>,
        inspection: Arc<dyn Inspection>,
        clock: SharedClock,
        settings: HoldSettings,
        metrics: Arc<Metrics>,
    ) -> Arc<Holder> {
        Arc::new(Holder {
            turns,
            inspection,
            clock,
            settings,
            metrics,
        })
    }

    /// Looks every few seconds until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        if self.settings.after.is_zero() {
            return;
        }
        let runner = Runner {
            clock: self.clock.clone(),
            slots: 1,
            poll_interval: EVERY,
            shutdown_grace: GRACE,
        };
        runner.every(EVERY, self.clone(), shutdown).await;
    }

    /// Tells the customers expected to wait past `after` how long, by their place in the
    /// queue: those the rate turns end at will reach within `after` are left alone. How many.
    ///
    /// # Errors
    /// When the store cannot be read or written.
    pub async fn look(&self) -> store::Result<usize> {
        let now = self.clock.now();
        let queue = queue(self.inspection.as_ref(), self.turns.as_ref(), now).await?;
        self.metrics
            .expected_wait_seconds
            .set(i64::try_from(queue.expected.as_secs()).unwrap_or(i64::MAX));
        let after = self.settings.after;
        if after.is_zero() || queue.expected <= after {
            return Ok(0);
        }
        // Model turns ending per second over the last minute, on every node; none: the oldest's
        // wait is all there is to go on, and everyone due is told it.
        let per_second = queue.ended_last_minute as f64 / 60.0;
        let soon = (per_second * after.as_secs_f64()) as u64;
        let skip = soon.saturating_sub(queue.gauges.waiting);
        let mut ahead = queue.gauges.waiting + skip;
        let mut held = 0;
        while held < PER_LOOK {
            let wait = match per_second > 0.0 {
                true => Duration::from_secs_f64((ahead + CHUNK as u64 / 2) as f64 / per_second),
                false => queue.expected,
            };
            let text = self
                .settings
                .message
                .replace("{wait}", &about(wait.max(after)));
            let holding = Holding {
                skip: usize::try_from(skip).unwrap_or(usize::MAX),
                limit: CHUNK,
                parts: vec![ReplyPart::text(text)],
                sandbox: self.settings.sandbox,
            };
            let chunk = self.turns.hold(now, holding).await?;
            held += chunk.len();
            ahead += chunk.len() as u64;
            if chunk.len() < CHUNK {
                break;
            }
        }
        self.metrics.holding_messages.inc_by(held as u64);
        if held > 0 {
            let expected_wait_s = queue.expected.as_secs();
            tracing::info!(held, expected_wait_s, "customers told to wait");
        }
        Ok(held)
    }
}

#[async_trait::async_trait]
impl Periodic for Holder {
    const JOBS: &'static str = "looks";

    async fn round(&self) {
        if let Err(e) = self.look().await {
            tracing::warn!(error.message = %e, "could not hold the queue's customers");
        }
    }
}

/// The queue as the store has it now.
#[derive(Debug, Clone)]
pub struct Queue {
    pub gauges: Gauges,
    /// Turns of the model's lane (answered by the agent or handed to people) that ended in the
    /// last minute, on every node: the router's turns never queue behind them, so their pace
    /// says nothing about the queue's.
    pub ended_last_minute: u64,
    /// How long a batch falling due now is expected to wait (see [`policy::expected_wait`]).
    pub expected: Duration,
}

/// The queue at `now`: held batches wait in it too. What the holder and an autoscaler read.
///
/// # Errors
/// When the store cannot be read.
pub async fn queue(
    inspection: &dyn Inspection,
    turns: &dyn Turns,
    now: At,
) -> store::Result<Queue> {
    let gauges = inspection.gauges(now).await?;
    let ended = inspection.turn_stats(now - Duration::from_secs(60)).await?;
    let oldest = turns.next_due().await?.filter(|at| *at <= now);
    let ended_last_minute = ended.agent + ended.people;
    let queued = gauges.due + gauges.waiting;
    let expected = policy::expected_wait(queued, ended_last_minute, oldest, now);
    Ok(Queue {
        gauges,
        ended_last_minute,
        expected,
    })
}

/// A wait as a customer reads it: "about 3 minutes", "about an hour".
fn about(wait: Duration) -> String {
    let minutes = wait.as_secs().div_ceil(60).max(1);
    match minutes {
        1 => "about a minute".into(),
        m if m < 60 => format!("about {m} minutes"),
        m if m < 90 => "about an hour".into(),
        m => format!("about {} hours", m.div_ceil(60)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_reads_as_a_person_would_say_it() {
        let said: Vec<String> = [30, 61, 299, 3_600, 7_000]
            .iter()
            .map(|s| about(Duration::from_secs(*s)))
            .collect();
        assert_eq!(
            said,
            [
                "about a minute",
                "about 2 minutes",
                "about 5 minutes",
                "about an hour",
                "about 2 hours"
            ]
        );
    }
}
