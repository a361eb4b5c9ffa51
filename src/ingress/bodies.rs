//! Request bodies, read before any route sees them: a declared length over the route's limit
//! is answered 413 at once (nothing read), the whole body must arrive within the body timeout
//! (408 otherwise), and only a few large bodies are read at once, so that memory stays bounded
//! and the small webhooks Meta sends are never held up behind them (503 beyond, Meta retries).
//! The webhook has large-body places of its own: nothing posted elsewhere takes them. One
//! client address (an IPv6 client's /64) has a budget of bytes being read, small bodies
//! included: each body counts its declared length (the route's limit when it declares none)
//! until read, and one beyond the budget gets 503 at once. Every refusal closes the
//! connection.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use super::source::{SourcePolicy, forwarded_for};
use crate::http::serve::network;
use crate::ingress::ApiError;

/// Bodies above this many bytes (or of unknown length) count as large.
const LARGE: u64 = 64 * 1024;

/// One route group's rules.
pub(super) struct BodyRules {
    pub(super) max_bytes: usize,
    pub(super) timeout: Duration,
    /// One permit per large body being read, shared by the routes of a group (the webhook's
    /// own; everything else's).
    pub(super) large: Arc<Semaphore>,
    /// Bytes being read per client address; `None`: not counted (the admin API, whose token
    /// is checked first).
    pub(super) per_address: Option<Arc<AddressBudget>>,
}

/// Bytes of bodies being read, per client address.
pub(super) struct AddressBudget {
    pub(super) max_bytes: usize,
    /// Whose `X-Forwarded-For` names the client.
    pub(super) source: SourcePolicy,
    reading: Mutex<HashMap<IpAddr, usize>>,
}

impl AddressBudget {
    pub(super) fn new(max_bytes: usize, source: SourcePolicy) -> Self {
        AddressBudget {
            max_bytes,
            source,
            reading: Mutex::default(),
        }
    }

    /// `bytes` more for `client`, if they fit in its budget.
    fn reserve(self: &Arc<Self>, client: IpAddr, bytes: usize) -> Option<Reserved> {
        let mut reading = self.reading.lock().unwrap_or_else(|e| e.into_inner());
        let held = reading.entry(client).or_default();
        if held.saturating_add(bytes) > self.max_bytes {
            if *held == 0 {
                reading.remove(&client);
            }
            return None;
        }
        *held += bytes;
        Some(Reserved {
            budget: self.clone(),
            client,
            bytes,
        })
    }
}

/// A body's share of its address's budget, given back when dropped.
struct Reserved {
    budget: Arc<AddressBudget>,
    client: IpAddr,
    bytes: usize,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let mut reading = self
            .budget
            .reading
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(held) = reading.get_mut(&self.client) {
            *held = held.saturating_sub(self.bytes);
            if *held == 0 {
                reading.remove(&self.client);
            }
        }
    }
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
    // Whatever the method: a GET that declares a body has it read too.
    let has_body = matches!(
        *request.method(),
        Method::POST | Method::PUT | Method::PATCH
    ) || declared.is_some_and(|n| n > 0)
        || request.headers().contains_key(header::TRANSFER_ENCODING);
    let _reserved = match (&rules.per_address, has_body) {
        (Some(budget), true) => {
            let peer = request.extensions().get::<ConnectInfo<SocketAddr>>();
            let chain = forwarded_for(request.headers());
            let client = peer
                .and_then(|ConnectInfo(peer)| budget.source.client(peer.ip(), chain.as_deref()));
            match client {
                Some(client) => {
                    // A length is declared, and within the limit (checked above), or the
                    // body may take the whole limit.
                    let bytes = declared.map_or(rules.max_bytes, |n| {
                        usize::try_from(n).unwrap_or(usize::MAX)
                    });
                    Some(
                        budget
                            .reserve(network(client), bytes)
                            .ok_or(ApiError::AddressBodiesBusy)?,
                    )
                }
                None => None,
            }
        }
        _ => None,
    };
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
