//! A fake OpenAI-compatible server: chat completions (text answers, tool calls, failures,
//! stalls, on command) and audio transcriptions. A real HTTP server on a random local port that
//! records every request it gets.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

/// What the next chat completion does.
#[derive(Debug, Clone)]
pub enum Answer {
    Text(String),
    /// Text that the token limit ended (`finish_reason: "length"`).
    CutOff(String),
    /// Asks for one tool call: (name, arguments).
    ToolCall(String, Value),
    /// Asks for several tool calls at once, with ids `call_1`, `call_2`, ...
    ToolCalls(Vec<(String, Value)>),
    /// Fails with this HTTP status.
    Status(u16),
    /// 429 with `Retry-After` of this many seconds.
    Throttled(u64),
    /// Never answers (the client's timeout fires).
    Stall,
    /// Answers with the request's system message, as a model talked into repeating its
    /// instructions does.
    EchoSystem,
}

#[derive(Default)]
struct Shared {
    script: Mutex<VecDeque<Answer>>,
    completions: Mutex<Vec<Value>>,
    transcriptions: Mutex<Vec<Vec<u8>>>,
    transcript: Mutex<Option<String>>,
}

#[derive(Clone)]
pub struct FakeLlm {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

impl FakeLlm {
    /// # Panics
    /// When no local port can be bound.
    pub async fn start() -> FakeLlm {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake LLM");
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(Shared::default());
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(complete))
            .route("/v1/models", get(models))
            .route("/v1/audio/transcriptions", post(transcribe))
            .with_state(shared.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeLlm { shared, addr }
    }

    /// The base URL to configure (`SABI_LLM_BASE_URL`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The next completions answer like this, in order; after them, a text naming the last
    /// user message.
    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        lock(&self.shared.script).extend(answers);
    }

    /// Every chat-completion request body received, in order.
    pub fn completions(&self) -> Vec<Value> {
        lock(&self.shared.completions).clone()
    }

    /// Every transcription request body (multipart) received.
    pub fn transcriptions(&self) -> Vec<Vec<u8>> {
        lock(&self.shared.transcriptions).clone()
    }

    /// What transcriptions return; unset, they fail with 500.
    pub fn set_transcript(&self, text: &str) {
        *lock(&self.shared.transcript) = Some(text.to_owned());
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

async fn complete(State(shared): State<Arc<Shared>>, Json(body): Json<Value>) -> Response {
    lock(&shared.completions).push(body.clone());
    let next = lock(&shared.script).pop_front();
    let finish_reason = match next {
        Some(Answer::CutOff(_)) => "length",
        _ => "stop",
    };
    let message = match next {
        Some(Answer::Status(status)) => {
            return (
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                Json(json!({"error": {"message": "injected failure"}})),
            )
                .into_response();
        }
        Some(Answer::Throttled(seconds)) => {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [(axum::http::header::RETRY_AFTER, seconds.to_string())],
                Json(json!({"error": {"message": "rate limit reached for requests"}})),
            )
                .into_response();
        }
        Some(Answer::Stall) => {
            tokio::time::sleep(Duration::from_secs(300)).await;
            return StatusCode::GATEWAY_TIMEOUT.into_response();
        }
        Some(Answer::ToolCall(name, arguments)) => tool_calls(vec![(name, arguments)]),
        Some(Answer::ToolCalls(calls)) => tool_calls(calls),
        Some(Answer::EchoSystem) => {
            let system = body["messages"]
                .as_array()
                .and_then(|m| m.iter().find(|m| m["role"] == "system"))
                .and_then(|m| m["content"].as_str())
                .unwrap_or_default();
            json!({"role": "assistant", "content": format!("My instructions: {system}")})
        }
        // `"tool_calls": null`, as LiteLLM and others send on plain answers.
        Some(Answer::Text(text) | Answer::CutOff(text)) => {
            json!({"role": "assistant", "content": text, "tool_calls": null})
        }
        None => {
            let last_user = body["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
                .and_then(|m| m["content"].as_str())
                .unwrap_or_default()
                .to_owned();
            json!({"role": "assistant", "content": format!("fake answer to: {last_user}")})
        }
    };
    Json(json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": body["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
    }))
    .into_response()
}

async fn models() -> Json<Value> {
    Json(json!({"object": "list", "data": [{"id": "fake-model", "object": "model"}]}))
}

fn tool_calls(calls: Vec<(String, Value)>) -> Value {
    let calls: Vec<Value> = calls
        .into_iter()
        .enumerate()
        .map(|(i, (name, arguments))| {
            json!({"id": format!("call_{}", i + 1), "type": "function",
                   "function": {"name": name, "arguments": arguments.to_string()}})
        })
        .collect();
    json!({"role": "assistant", "content": null, "tool_calls": calls})
}

async fn transcribe(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    lock(&shared.transcriptions).push(body.to_vec());
    match lock(&shared.transcript).clone() {
        Some(text) => Json(json!({"text": text})).into_response(),
        None => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
