//! The lease guard: renews a batch's lease while its turn works, and stops on every exit path
//! because it is dropped with the turn.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::domain::LeaseToken;
use crate::store::{self, Store};

pub(super) struct LeaseGuard {
    renewer: JoinHandle<()>,
    lost: CancellationToken,
}

impl LeaseGuard {
    /// Renews every quarter of `lease`. When the store says the token is stale, `lost()` fires:
    /// another worker owns the batch and this turn's writes would be refused anyway.
    pub(super) fn spawn(
        store: Arc<dyn Store>,
        clock: SharedClock,
        batch: i64,
        token: LeaseToken,
        lease: Duration,
    ) -> LeaseGuard {
        let lost = CancellationToken::new();
        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        let signal = lost.clone();
        let renewer = tokio::spawn(async move {
            loop {
                clock
                    .sleep_until(clock.now_ms().saturating_add(lease_ms / 4))
                    .await;
                match store.renew(batch, token, clock.now_ms(), lease_ms).await {
                    Ok(()) => {}
                    Err(store::Error::LeaseLost) => {
                        tracing::warn!(batch, "lease lost while the turn ran; abandoning it");
                        signal.cancel();
                        return;
                    }
                    // The next renewal may get through before the lease runs out.
                    Err(e) => tracing::warn!(batch, error.message = %e, "lease renewal failed"),
                }
            }
        });
        LeaseGuard { renewer, lost }
    }

    /// Fires when the lease is known to be lost.
    pub(super) fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}
