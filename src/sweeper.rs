//! The sweeper: every `retention.sweep_every` it deletes what is past its retention horizon
//! (the rules are in [`crate::store::rules::retention`]), a small batch of each kind per store
//! call with a pause between, so ingest and turns never wait long behind it. One node sweeps at
//! a time, under a lease it renews after each batch; another node takes over when a sweeping
//! node stops.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::metrics::{self, Metrics};
use crate::store::rules::retention::LEASE;
use crate::store::{self, Horizons, Store, Swept};

/// Rows of each kind per store call: a few milliseconds of the store's time.
const BATCH: usize = 500;
/// Between two batches, so that what waits for the store goes first.
const PAUSE: Duration = Duration::from_millis(10);

pub struct Sweeper {
    store: Arc<dyn Store>,
    clock: SharedClock,
    horizons: Horizons,
    every: Duration,
    /// This node's name on the lease.
    holder: String,
    metrics: Arc<Metrics>,
}

impl Sweeper {
    pub fn new(
        store: Arc<dyn Store>,
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
        })
    }

    /// Sweeps every `sweep_every` until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            if let Err(e) = self.sweep(&shutdown).await {
                tracing::warn!(error.message = %e, "sweeping what is past its retention failed; trying again later");
            }
            let next = self.clock.now() + self.every;
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.clock.sleep_until(next) => {}
            }
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
        loop {
            let now = self.clock.now();
            if !self
                .store
                .hold_lease(LEASE, &self.holder, now, lease)
                .await?
            {
                return Ok(None);
            }
            let swept = self.store.sweep(&self.horizons, now, BATCH).await?;
            if swept.is_empty() {
                break;
            }
            self.count(&swept);
            total.add(&swept);
            if stop.is_cancelled() {
                break;
            }
            tokio::time::sleep(PAUSE).await;
        }
        if !total.is_empty() {
            let Swept {
                turns,
                messages,
                replies,
                statuses,
                quarantined,
                conversations,
                keys,
                ..
            } = total;
            tracing::info!(
                turns,
                messages,
                replies,
                statuses,
                quarantined,
                conversations,
                keys,
                "deleted what was past its retention"
            );
        }
        Ok(Some(total))
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
