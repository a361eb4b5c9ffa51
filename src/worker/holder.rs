//! Holding messages: under a surge, a WhatsApp customer whose turn is expected further off than
//! `engine.hold_after` is told so once ("we will answer you in about 5 minutes"), and the
//! answer follows. The store holds the longest due conversations first, each batch once
//! ([`Turns::hold`]); the message goes through the outbox like any reply, so it leaves before
//! the answer and keeps the number's pacing. Web chat shows its queue position instead.
//!
//! Every node may run it: a conversation is held by one of them, whichever gets there first.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::policy;
use crate::clock::{At, SharedClock};
use crate::config::HoldSettings;
use crate::domain::ReplyPart;
use crate::metrics::Metrics;
use crate::store::{self, Gauges, Store};

/// How often the queue is looked at.
const EVERY: Duration = Duration::from_secs(5);
/// Conversations held per look: the next look holds more.
const PER_LOOK: usize = 200;

pub struct Holder {
    store: Arc<dyn Store>,
    clock: SharedClock,
    settings: HoldSettings,
    metrics: Arc<Metrics>,
}

impl Holder {
    pub fn new(
        store: Arc<dyn Store>,
        clock: SharedClock,
        settings: HoldSettings,
        metrics: Arc<Metrics>,
    ) -> Arc<Holder> {
        Arc::new(Holder {
            store,
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
        loop {
            if let Err(e) = self.look().await {
                tracing::warn!(error.message = %e, "could not hold the queue's customers");
            }
            let next = self.clock.now() + EVERY;
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.clock.sleep_until(next) => {}
            }
        }
    }

    /// Holds the longest due conversations when the expected wait is past `after`; how many.
    ///
    /// # Errors
    /// When the store cannot be read or written.
    pub async fn look(&self) -> store::Result<usize> {
        let now = self.clock.now();
        let expected = self.expected_wait().await?;
        self.metrics
            .expected_wait_seconds
            .set(i64::try_from(expected.as_secs()).unwrap_or(i64::MAX));
        if self.settings.after.is_zero() || expected <= self.settings.after {
            return Ok(0);
        }
        let text = self.settings.message.replace("{wait}", &about(expected));
        let held = self
            .store
            .hold(
                now,
                PER_LOOK,
                vec![ReplyPart::text(text)],
                self.settings.sandbox,
            )
            .await?;
        self.metrics.holding_messages.inc_by(held.len() as u64);
        if !held.is_empty() {
            tracing::info!(
                held = held.len(),
                expected_wait_s = expected.as_secs(),
                "customers told to wait"
            );
        }
        Ok(held.len())
    }

    async fn expected_wait(&self) -> store::Result<Duration> {
        Ok(queue(self.store.as_ref(), self.clock.now()).await?.1)
    }
}

/// The store's counts, and how long a batch falling due at `now` is expected to wait (see
/// [`policy::expected_wait`]; held batches wait in the queue too): what the holder and an
/// autoscaler read.
///
/// # Errors
/// When the store cannot be read.
pub async fn queue(store: &dyn Store, now: At) -> store::Result<(Gauges, Duration)> {
    let gauges = store.gauges(now).await?;
    let ended = store.turn_stats(now - Duration::from_secs(60)).await?;
    let oldest = store.next_due().await?.filter(|at| *at <= now);
    let ended = ended.local + ended.agent + ended.people;
    let queued = gauges.due + gauges.waiting;
    let expected = policy::expected_wait(queued, ended, oldest, now);
    Ok((gauges, expected))
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
