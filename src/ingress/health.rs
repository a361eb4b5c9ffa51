//! Liveness, readiness and metrics.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;

use super::AppState;
use crate::desk::Kind;
use crate::ingress::ApiError;
use crate::worker::holder;

/// The process is up and answering.
pub(super) async fn healthz() -> &'static str {
    "ok"
}

/// The store is reachable and its schema current: this node can take traffic.
pub(super) async fn readyz(
    State(state): State<AppState>,
) -> Result<(StatusCode, &'static str), ApiError> {
    state.store.ready().await?;
    // Ready all the same: the hand-offs wait on Sabi's own desk meanwhile.
    if state.metrics.desk_failing.get() > 0 {
        let says = match state.desk.as_ref().map(|d| d.kind) {
            Some(Kind::Webhook) => {
                "ready; the help desk (handoff.webhook) is failing: hand-offs wait on Sabi's desk"
            }
            _ => "ready; the help desk (Chatwoot) is failing: hand-offs wait on Sabi's desk",
        };
        return Ok((StatusCode::OK, says));
    }
    Ok((StatusCode::OK, "ready"))
}

/// The latest broadcasts whose counts `/metrics` shows (those still live among them), and
/// whose pauses `sabi_broadcasts_paused` counts: an older one paused is not seen there.
const BROADCASTS_SHOWN: usize = 50;

/// Prometheus text exposition (OpenMetrics) of this process's metrics, with the pipeline's
/// counts read from the store (left as they were when it cannot be read).
pub(super) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    match holder::queue(
        state.store.as_ref(),
        state.store.as_ref(),
        state.clock.now(),
    )
    .await
    {
        Ok(queue) => {
            state.metrics.observe_store(&queue.gauges);
            state
                .metrics
                .expected_wait_seconds
                .set(i64::try_from(queue.expected.as_secs()).unwrap_or(i64::MAX));
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
