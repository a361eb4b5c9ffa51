//! The WhatsApp Cloud API webhook: verification (GET) and deliveries (POST).
//!
//! A delivery is answered 200 only after everything in it is durably stored: Meta retries
//! anything else for days, and no API can fetch a webhook again. Order of checks: body size
//! (413), signature over the raw bytes (401, nothing stored), JSON (400), then one store call
//! (503 when it cannot commit, so Meta retries). Unknown shapes are quarantined and answered 200.

mod payload;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use subtle::ConstantTimeEq;

pub use self::payload::{NotJson, Parsed, parse};
use super::AppState;
use crate::config::Config;
use crate::domain::{BatchPolicy, InboundItem};
use crate::ingress::ApiError;
use crate::metrics::{self, Metrics};
use crate::router::Router;
use crate::store::Ingest;
use crate::whatsapp::verify as verify_signature;

const SIGNATURE_HEADER: &str = "x-hub-signature-256";

/// The webhook's settings, typed once at start.
pub struct Settings {
    secrets: Vec<SecretString>,
    verify_token: Option<SecretString>,
    policy: BatchPolicy,
    pair_spacing: std::time::Duration,
    human_hold: std::time::Duration,
    max_body_bytes: usize,
    /// Tells which messages it answers alone, so their turns go first; `None` when it is off.
    router: Option<Arc<Router>>,
}

impl Settings {
    pub fn from_config(config: &Config, router: Option<Arc<Router>>) -> Settings {
        Settings {
            secrets: config.whatsapp.app_secrets(),
            verify_token: config.whatsapp.verify_token.clone(),
            policy: config.whatsapp.batch_policy(),
            pair_spacing: config.whatsapp.pair_spacing,
            human_hold: config.engine.human_hold,
            max_body_bytes: config.ingress.max_body_bytes,
            router,
        }
    }

    /// The messages the router answers alone (it takes microseconds; see [`Ingest::routine`]).
    /// Those without text (a voice note, a picture) go to the model's lane.
    fn routine(&self, items: &[InboundItem]) -> HashSet<String> {
        let Some(router) = &self.router else {
            return HashSet::new();
        };
        items
            .iter()
            .filter(|item| item.turn.is_some())
            .filter(|item| {
                item.text
                    .as_deref()
                    .is_some_and(|t| router.answers_alone(t))
            })
            .map(|item| item.dedupe_key.clone())
            .collect()
    }
}

/// `GET /webhook/whatsapp`: Meta checks the callback URL; echo its challenge byte for byte.
pub(super) async fn verify(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<String, ApiError> {
    let expected = state
        .whatsapp
        .verify_token
        .as_ref()
        .ok_or(ApiError::VerificationRefused)?;
    let mode = query.get("hub.mode").map(String::as_str);
    let token = query
        .get("hub.verify_token")
        .map(String::as_bytes)
        .unwrap_or_default();
    let token_ok: bool = token.ct_eq(expected.expose_secret().as_bytes()).into();
    match (mode, token_ok, query.get("hub.challenge")) {
        (Some("subscribe"), true, Some(challenge)) => Ok(challenge.clone()),
        _ => Err(ApiError::VerificationRefused),
    }
}

/// `POST /webhook/whatsapp`: verify, parse, store, acknowledge; counted by outcome.
pub(super) async fn receive(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    // Wall time of the request itself, for the latency histogram (not business time).
    let started = std::time::Instant::now();
    let outcome = store_delivery(&state, &headers, body).await;
    let metrics = &state.metrics;
    match &outcome {
        Ok(_) => {
            Metrics::count(&metrics.webhooks, "stored");
            metrics.ack_seconds.observe(started.elapsed().as_secs_f64());
        }
        Err(e) => Metrics::count(&metrics.webhooks, e.code()),
    }
    outcome
}

async fn store_delivery(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let body = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge {
            limit: state.whatsapp.max_body_bytes,
        },
        _ => ApiError::UnreadableBody(rejection.body_text()),
    })?;
    let header = headers.get(SIGNATURE_HEADER).map(|v| v.as_bytes());
    verify_signature(&state.whatsapp.secrets, header, &body)?;
    let Parsed { items, quarantined } = parse(&body)?;
    // The reason may quote the part (a phone number, a text): it is kept in the store, and
    // `sabi quarantine` shows it, not the logs.
    for q in &quarantined {
        tracing::warn!(
            bytes = q.raw.len(),
            "quarantined a webhook part of unknown shape"
        );
    }
    let receipt = state
        .store
        .ingest(Ingest {
            routine: state.whatsapp.routine(&items),
            items,
            quarantined,
            received_at: state.clock.now(),
            policy: state.whatsapp.policy,
            pair_spacing: state.whatsapp.pair_spacing,
            human_hold: state.whatsapp.human_hold,
        })
        .await?;
    tracing::debug!(?receipt, "webhook stored");
    let metrics = &state.metrics;
    metrics.items_stored.inc_by(receipt.stored as u64);
    metrics
        .duplicates
        .inc_by((receipt.duplicates + receipt.anomalies) as u64);
    metrics.quarantined.inc_by(receipt.quarantined as u64);
    for (category, r#type) in receipt.priced {
        metrics
            .priced
            .get_or_create(&metrics::Priced { category, r#type })
            .inc();
    }
    if let Some(due) = receipt.earliest_due {
        state.wakeup.due_at(due);
    }
    Ok(StatusCode::OK)
}
