//! Request bodies, read before any route sees them: a declared length over the route's limit
//! is answered 413 at once (nothing read), the whole body must arrive within the body timeout
//! (408 otherwise), and only a few large bodies are read at once, so that memory stays bounded
//! and the small webhooks Meta sends are never held up behind them (503 beyond, Meta retries).
//! Every refusal closes the connection.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use crate::ingress::ApiError;

/// Bodies above this many bytes (or of unknown length) count as large.
const LARGE: u64 = 64 * 1024;

/// One route group's rules.
pub(super) struct BodyRules {
    pub(super) max_bytes: usize,
    pub(super) timeout: Duration,
    /// One permit per large body being read, shared by every route of the node.
    pub(super) large: Arc<Semaphore>,
}

pub(super) async fn guard(
    State(rules): State<Arc<BodyRules>>,
    request: Request,
    next: Next,
) -> Response {
    match read(&rules, request).await {
        Ok(request) => next.run(request).await,
        Err(refused) => {
            let mut response = refused.into_response();
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}

/// The request with its body read in full, or why not.
async fn read(rules: &BodyRules, request: Request) -> Result<Request, ApiError> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    let too_large = ApiError::TooLarge {
        limit: rules.max_bytes,
    };
    if declared.is_some_and(|n| n > rules.max_bytes as u64) {
        return Err(too_large);
    }
    let has_body = matches!(
        *request.method(),
        Method::POST | Method::PUT | Method::PATCH
    );
    let _permit = match declared {
        Some(n) if n <= LARGE => None,
        _ if !has_body => None,
        _ => Some(
            rules
                .large
                .clone()
                .try_acquire_owned()
                .map_err(|_| ApiError::LargeBodiesBusy)?,
        ),
    };
    let (parts, body) = request.into_parts();
    let bytes = tokio::time::timeout(rules.timeout, axum::body::to_bytes(body, rules.max_bytes))
        .await
        .map_err(|_| ApiError::BodyTimeout)?
        .map_err(|e| {
            let over_limit = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if over_limit {
                too_large
            } else {
                ApiError::UnreadableBody(e.to_string())
            }
        })?;
    Ok(Request::from_parts(parts, Body::from(bytes)))
}
