//! Liveness and readiness.

use axum::extract::State;
use axum::http::StatusCode;

use super::AppState;
use crate::http::ApiError;

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
