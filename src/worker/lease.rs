//! The lease guard: renews a batch's lease while its turn works, and stops on every exit path
//! because it is dropped with the turn.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::domain::LeaseToken;
use crate::store::{self, Turns};

pub(super) struct LeaseGuard {
    renewer: JoinHandle<()>,
    lost: CancellationToken,
}

impl LeaseGuard {
    /// Renews every quarter of `lease`. When the store says the token is stale, or renewals kept
    /// failing until the lease ran out, `lost()` fires: another worker may own the batch, and
    /// this turn stops so that two turns never run at once.
    pub(super) fn spawn(
        store: Arc<dyn Turns>,
        clock: SharedClock,
        batch: i64,
        token: LeaseToken,
        lease: Duration,
    ) -> LeaseGuard {
        let lost = CancellationToken::new();
        let signal = lost.clone();
        let renewer = tokio::spawn(async move {
            // The lease as this worker last secured it (from the claim, then each renewal), less
            // a margin so that this turn has stopped before another worker may claim the batch.
            let margin = lease / 8;
            let mut held_until = clock.now() + (lease - margin);
            loop {
                let next = (clock.now() + lease / 4).min(held_until);
                clock.sleep_until(next).await;
                let now = clock.now();
                match store.renew(batch, token, now, lease).await {
                    Ok(()) => held_until = now + (lease - margin),
                    Err(store::Error::LeaseLost) => {
                        tracing::warn!(batch, "lease lost while the turn ran; abandoning it");
                        signal.cancel();
                        return;
                    }
                    // Renewals failed until the lease ran out: another worker may take the
                    // batch now, so this turn stops rather than run beside it.
                    Err(e) if clock.now() >= held_until => {
                        tracing::warn!(batch, error.message = %e, "lease ran out while the store was unreachable; abandoning the turn");
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
