//! Liveness, readiness and metrics.

use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;

use super::AppState;
use crate::ingress::ApiError;
use crate::store::{self, Gauges};
use crate::worker::policy;

/// The process is up and answering.
pub(super) async fn healthz() -> &'static str {
    "ok"
}

/// The store is reachable and its schema current: this node can take traffic.
pub(super) async fn readyz(
    State(state): State<AppState>,
) -> Result<(StatusCode, &'static str), ApiError> {
    state.store.ready().await?;
    Ok((StatusCode::OK, "ready"))
}

/// The latest broadcasts whose counts `/metrics` shows (those still live among them), and
/// whose pauses `sabi_broadcasts_paused` counts: an older one paused is not seen there.
const BROADCASTS_SHOWN: usize = 50;

/// Prometheus text exposition (OpenMetrics) of this process's metrics, with the pipeline's
/// counts read from the store (left as they were when it cannot be read).
pub(super) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    match queue(&state).await {
        Ok((gauges, expected)) => {
            state.metrics.observe_store(&gauges);
            state
                .metrics
                .expected_wait_seconds
                .set(i64::try_from(expected.as_secs()).unwrap_or(i64::MAX));
        }
        Err(e) => {
            tracing::warn!(error.message = %e, "could not read the store's counts for /metrics")
        }
    }
    match state.store.broadcasts(BROADCASTS_SHOWN).await {
        Ok(broadcasts) => state.metrics.observe_broadcasts(&broadcasts),
        Err(e) => tracing::warn!(error.message = %e, "could not read the broadcasts for /metrics"),
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

/// The store's counts, and how long a batch falling due now is expected to wait: what an
/// autoscaler reads.
async fn queue(state: &AppState) -> store::Result<(Gauges, Duration)> {
    let now = state.clock.now();
    let gauges = state.store.gauges(now).await?;
    let ended = state.store.turn_stats(now - MINUTE).await?;
    let oldest = state.store.next_due().await?.filter(|at| *at <= now);
    let ended = ended.local + ended.agent + ended.people;
    let expected = policy::expected_wait(gauges.due, ended, oldest, now);
    Ok((gauges, expected))
}

const MINUTE: Duration = Duration::from_secs(60);
