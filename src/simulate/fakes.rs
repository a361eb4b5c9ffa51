//! The services a simulated surge talks to, as real HTTP servers: a Graph API that tells the
//! crowd what each customer received, and a model with a latency distribution and the
//! provider's per-minute limits. Both keep time on the clock they are given (virtual time in
//! `sabi simulate`, real time in `bench/surge.sh`).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use secrecy::SecretString;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::crowd;
use crate::clock::{At, SharedClock};
use crate::plan::queue::lognormal;
use crate::whatsapp::{sign, wire};

/// A message a customer received.
#[derive(Debug, Clone)]
pub(crate) struct Delivered {
    pub customer: String,
    pub at: At,
    /// A holding message ("we will answer you in about 5 minutes"), not the answer.
    pub holding: bool,
}

/// How the fake Graph API behaves beyond answering at once.
#[derive(Debug, Clone, Default)]
pub(crate) struct GraphShape {
    /// A send's time before its answer, seconds: median and 95th percentile. Meta's answers
    /// take a few hundred milliseconds; a node killed meanwhile leaves the send unknown.
    pub latency: Option<(f64, f64)>,
    /// Where Meta's `sent` status webhook for each accepted send goes, a second after its
    /// answer, carrying the send's callback data.
    pub statuses: Option<StatusSink>,
}

/// A webhook URL and the app secret its deliveries are signed with.
#[derive(Debug, Clone)]
pub(crate) struct StatusSink {
    pub webhook: String,
    pub secret: SecretString,
}

/// How long after its answer Meta's `sent` status for a send arrives.
const STATUS_AFTER: Duration = Duration::from_secs(1);

struct GraphState {
    clock: SharedClock,
    delivered: mpsc::UnboundedSender<Delivered>,
    /// The holding message's text before and after its `{wait}`: how a holding message is
    /// told apart from an answer.
    holding: (String, String),
    shape: GraphShape,
    rng: Mutex<fastrand::Rng>,
    http: reqwest::Client,
}

/// Serves the Graph API's send endpoint on `listener`; every text sent is told on `delivered`.
pub(crate) fn serve_graph(
    listener: TcpListener,
    clock: SharedClock,
    hold_message: &str,
    shape: GraphShape,
    delivered: mpsc::UnboundedSender<Delivered>,
) {
    let (before, after) = hold_message
        .split_once("{wait}")
        .unwrap_or((hold_message, ""));
    let state = Arc::new(GraphState {
        clock,
        delivered,
        holding: (before.to_owned(), after.to_owned()),
        shape,
        rng: Mutex::new(fastrand::Rng::new()),
        http: reqwest::Client::new(),
    });
    let app = axum::Router::new()
        .route("/{version}/{number}/messages", post(send))
        .with_state(state);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
}

async fn send(
    State(state): State<Arc<GraphState>>,
    Path((_, number)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Json<Value> {
    // Read receipts and typing indicators.
    if body.get("status").is_some() {
        return Json(json!({"success": true}));
    }
    let customer = body["to"].as_str().unwrap_or_default().to_owned();
    let text = body["text"]["body"].as_str().unwrap_or_default();
    let (before, after) = &state.holding;
    let holding = !(before.is_empty() && after.is_empty())
        && text.len() >= before.len() + after.len()
        && text.starts_with(before.as_str())
        && text.ends_with(after.as_str());
    let _ = state.delivered.send(Delivered {
        customer: customer.clone(),
        at: state.clock.now(),
        holding,
    });
    let wamid = format!("wamid.SIM{:016x}", fastrand::u64(..));
    let took = state.shape.latency.map_or(Duration::ZERO, |(p50, p95)| {
        Duration::from_secs_f64(lognormal(&mut lock(&state.rng), p50, p95))
    });
    let answer_at = state.clock.now() + took;
    // Meta has the message from now on, whether or not the sender is still there for the
    // answer: its status comes all the same.
    if let Some(sink) = &state.shape.statuses {
        let callback = body["biz_opaque_callback_data"].as_str().map(str::to_owned);
        tokio::spawn(tell_status(
            state.clone(),
            sink.clone(),
            (number, customer.clone(), wamid.clone()),
            (answer_at + STATUS_AFTER, callback),
        ));
    }
    state.clock.sleep_until(answer_at).await;
    Json(json!({
        "messaging_product": "whatsapp",
        "contacts": [{"input": customer, "wa_id": customer}],
        "messages": [{"id": wamid}],
    }))
}

/// Meta's `sent` status for a send `(business, customer, wamid)`, posted `at` with the send's
/// callback data.
async fn tell_status(
    state: Arc<GraphState>,
    sink: StatusSink,
    (business, customer, wamid): (String, String, String),
    (at, callback): (At, Option<String>),
) {
    state.clock.sleep_until(at).await;
    let body = wire::encode(&wire::status_webhook(
        &business,
        &customer,
        &wamid,
        "sent",
        u64::try_from(at.unix_seconds()).unwrap_or(0),
        callback.as_deref(),
    ));
    let signature = sign(&sink.secret, body.as_bytes());
    crowd::post(
        state.http.clone(),
        sink.webhook,
        signature,
        body,
        state.clock.clone(),
    )
    .await;
}

/// How the simulated model answers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ModelShape {
    /// A call's time: median and 95th percentile, seconds.
    pub p50: f64,
    pub p95: f64,
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u32>,
    pub seed: u64,
}

/// What the model was asked, for the figures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    pub at: At,
    pub tokens: u64,
    /// Refused with 429: over the provider's limits.
    pub throttled: bool,
}

struct ModelState {
    clock: SharedClock,
    shape: ModelShape,
    rng: Mutex<fastrand::Rng>,
    /// The last minute's accepted calls, for the limits.
    window: Mutex<VecDeque<(At, u64)>>,
    calls: Mutex<Vec<Call>>,
}

/// The model's calls, read when the run is over.
#[derive(Clone)]
pub(crate) struct ModelLog(Arc<ModelState>);

impl ModelLog {
    pub(crate) fn calls(&self) -> Vec<Call> {
        lock(&self.0.calls).clone()
    }
}

/// Serves an OpenAI-compatible chat completion endpoint on `listener`.
pub(crate) fn serve_model(
    listener: TcpListener,
    clock: SharedClock,
    shape: ModelShape,
) -> ModelLog {
    let state = Arc::new(ModelState {
        clock,
        rng: Mutex::new(fastrand::Rng::with_seed(shape.seed)),
        shape,
        window: Mutex::new(VecDeque::new()),
        calls: Mutex::new(Vec::new()),
    });
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(complete))
        .with_state(state.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    ModelLog(state)
}

/// A word is about four bytes of text, as providers count tokens.
const BYTES_PER_TOKEN: u64 = 4;
const ANSWER_TOKENS: u64 = 40;

async fn complete(State(state): State<Arc<ModelState>>, Json(body): Json<Value>) -> Response {
    let now = state.clock.now();
    let prompt = body.to_string().len() as u64 / BYTES_PER_TOKEN;
    let tokens = prompt + ANSWER_TOKENS;
    if let Some(retry) = over_limits(&state, now, tokens) {
        lock(&state.calls).push(Call {
            at: now,
            tokens,
            throttled: true,
        });
        let seconds = retry.as_secs().max(1);
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, seconds.to_string())],
            Json(json!({"error": {"message": "rate limit reached"}})),
        )
            .into_response();
    }
    lock(&state.calls).push(Call {
        at: now,
        tokens,
        throttled: false,
    });
    let took = {
        let mut rng = lock(&state.rng);
        lognormal(&mut rng, state.shape.p50, state.shape.p95)
    };
    state
        .clock
        .sleep_until(now + Duration::from_secs_f64(took))
        .await;
    Json(json!({
        "id": "chatcmpl-simulated",
        "object": "chat.completion",
        "model": body["model"],
        "choices": [{"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant",
            "content": "Thank you for writing. Here is what you asked about: we have checked it for you.",
        }}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": ANSWER_TOKENS,
                  "total_tokens": tokens},
    }))
    .into_response()
}

/// When the call would pass the provider's requests or tokens in the last minute: how long
/// until it would not. Otherwise it is counted against them.
fn over_limits(state: &ModelState, now: At, tokens: u64) -> Option<Duration> {
    const MINUTE: Duration = Duration::from_secs(60);
    let mut window = lock(&state.window);
    while window
        .front()
        .is_some_and(|(at, _)| now.since(*at) >= MINUTE)
    {
        window.pop_front();
    }
    let requests = window.len() as u64;
    let used: u64 = window.iter().map(|(_, t)| t).sum();
    let over = state
        .shape
        .requests_per_minute
        .is_some_and(|rpm| requests >= u64::from(rpm))
        || state
            .shape
            .tokens_per_minute
            .is_some_and(|tpm| used + tokens > u64::from(tpm));
    if over {
        let oldest = window.front().map_or(now, |(at, _)| *at);
        return Some((oldest + MINUTE).since(now));
    }
    window.push_back((now, tokens));
    None
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A listener on a free local port, or on `addr`.
pub(crate) async fn listen(addr: Option<SocketAddr>) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)))).await
}
