//! The sweeper: every `retention.sweep_every` it deletes what is past its retention horizon
//! (the rules are in [`crate::store::rules::retention`]), a batch of each kind per store call,
//! then gives the freed space back. Ingest and turns never wait long behind it: each batch is
//! sized to take about `TARGET` of the store's time, and the sweeper waits twice as long as
//! a call took before the next, so it has a third of the store's time at most. One node sweeps
//! at a time, under a lease it renews before each batch; another takes over when it stops.
//! Its passes run in the runner's periodic loop (`Periodic`), on the injected
//! clock like every wait of its own.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::metrics::{self, Metrics};
use crate::runner::{Periodic, Runner};
use crate::store::rules::retention::LEASE;
use crate::store::{self, Horizons, Retention, Swept};

/// How long one store call should take: what ingest may wait behind it.
const TARGET: Duration = Duration::from_millis(20);
/// Rows of each kind in the first call of a pass, and the bounds as batches are sized.
const FIRST_BATCH: usize = 50;
const BATCHES: std::ops::RangeInclusive<usize> = 10..=2_000;
/// The shortest wait between two calls.
const PAUSE: Duration = Duration::from_millis(10);
/// How long a pass under way at shutdown may go on: it stops between two calls, so one call.
const GRACE: Duration = Duration::from_secs(5);

pub struct Sweeper {
    store: Arc<dyn Retention>,
    clock: SharedClock,
    horizons: Horizons,
    every: Duration,
    /// This node's name on the lease.
    holder: String,
    metrics: Arc<Metrics>,
    /// This node's shutdown, once it runs: a pass stops between two calls when it comes.
    stopping: OnceLock<CancellationToken>,
}

impl Sweeper {
    pub fn new(
        store: Arc<dyn Retention>,
        clock: SharedClock,
        horizons: Horizons,
        every: Duration,
        metrics: Arc<Metrics>,
    ) -> Arc<Sweeper> {
        let holder = format!("{}-{:016x}", std::process::id(), fastrand::u64(..));
        Arc::new(Sweeper {
            store,
            clock,
            horizons,
            every,
            holder,
            metrics,
            stopping: OnceLock::new(),
        })
    }

    /// Sweeps every `sweep_every` until `shutdown`, then lets the lease go, so that another
    /// node sweeps next without waiting for it to lapse.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let _ = self.stopping.set(shutdown.clone());
        let runner = Runner {
            clock: self.clock.clone(),
            slots: 1,
            poll_interval: self.every,
            shutdown_grace: GRACE,
        };
        runner.every(self.every, self.clone(), shutdown).await;
        // Held until now: lapsed for every other node (and taken by none if another holds it).
        let now = self.clock.now();
        if let Err(e) = self
            .store
            .hold_lease(LEASE, &self.holder, now, Duration::ZERO)
            .await
        {
            tracing::debug!(error.message = %e, "could not let the sweeper's lease go; it lapses");
        }
    }

    /// Sweeps until nothing is past its horizon, or `stop`; what went, or `None` when another
    /// node holds the lease.
    ///
    /// # Errors
    /// When the store cannot be read or written; what went before stays gone.
    pub async fn sweep(&self, stop: &CancellationToken) -> store::Result<Option<Swept>> {
        // Long enough to outlast a pause between sweeps, short enough that another node soon
        // takes over from one that stopped.
        let lease = self.every * 2;
        let mut total = Swept::default();
        let mut batch = FIRST_BATCH;
        loop {
            let now = self.clock.now();
            if !self
                .store
                .hold_lease(LEASE, &self.holder, now, lease)
                .await?
            {
                return Ok(None);
            }
            let started = Instant::now();
            let swept = self.store.sweep(&self.horizons, now, batch).await?;
            let took = started.elapsed();
            if swept.is_empty() {
                break;
            }
            self.count(&swept);
            total.add(&swept);
            if stop.is_cancelled() {
                break;
            }
            let took_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
            tracing::debug!(batch, took_ms, "swept a batch");
            batch = next_batch(batch, took);
            self.pause(took).await;
        }
        while !total.is_empty() && !stop.is_cancelled() {
            let started = Instant::now();
            if !self.store.reclaim_space().await? {
                break;
            }
            self.pause(started.elapsed()).await;
        }
        if !total.is_empty() {
            tracing::info!(swept = ?total, "deleted what was past its retention");
        }
        Ok(Some(total))
    }

    /// Twice as long as a call took, so the sweeper has a third of the store's time at most.
    async fn pause(&self, took: Duration) {
        let until = self.clock.now() + PAUSE.max(took * 2);
        self.clock.sleep_until(until).await;
    }

    fn count(&self, swept: &Swept) {
        let Ok(serde_json::Value::Object(kinds)) = serde_json::to_value(swept) else {
            return;
        };
        for (kind, n) in kinds {
            let n = n.as_u64().unwrap_or_default();
            if n > 0 {
                self.metrics
                    .swept
                    .get_or_create(&metrics::Swept { kind })
                    .inc_by(n);
            }
        }
    }
}

#[async_trait::async_trait]
impl Periodic for Sweeper {
    const JOBS: &'static str = "sweeps";

    async fn round(&self) {
        let stop = self.stopping.get().cloned().unwrap_or_default();
        if let Err(e) = self.sweep(&stop).await {
            tracing::warn!(error.message = %e, "sweeping what is past its retention failed; trying again later");
        }
    }
}

/// The next batch size after one of `batch` rows took `took`: twice as many when it took less
/// than half the target, half as many when it took more than twice.
fn next_batch(batch: usize, took: Duration) -> usize {
    let next = if took < TARGET / 2 {
        batch * 2
    } else if took > TARGET * 2 {
        batch / 2
    } else {
        batch
    };
    next.clamp(*BATCHES.start(), *BATCHES.end())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_grow_while_quick_and_shrink_while_slow_within_bounds() {
        let ms = Duration::from_millis;
        assert_eq!(next_batch(50, ms(2)), 100);
        assert_eq!(next_batch(50, ms(20)), 50);
        assert_eq!(next_batch(50, ms(200)), 25);
        assert_eq!(next_batch(2_000, ms(1)), 2_000);
        assert_eq!(next_batch(10, ms(900)), 10);
    }
}
