//! An OpenAI-compatible chat-completions client with tool calling: OpenAI, Groq, Together,
//! vLLM, Ollama and LiteLLM all speak it, chosen by base URL, key and model.
//!
//! Each call is bounded by a timeout and retried with backoff on 429, 5xx and transport
//! errors; when the primary provider is out of tries, the fallback provider (if configured)
//! gets the same request. Only then does the call fail, and the turn with it.

use std::sync::Arc;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::budget::{Budget, Limits, Waits};
use crate::clock::{At, SharedClock};
use crate::metrics::Metrics;

/// One provider: where, with which key, which model.
#[derive(Debug, Clone)]
pub struct Provider {
    pub base_url: String,
    pub api_key: Option<SecretString>,
    pub model: String,
}

/// A message of the conversation sent to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<String>,
    // Some servers send `"tool_calls": null` on plain answers.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn new(role: &str, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.to_owned(),
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    pub fn tool_result(call_id: &str, content: String) -> ChatMessage {
        ChatMessage {
            tool_call_id: Some(call_id.to_owned()),
            ..ChatMessage::new("tool", content)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text, as the model wrote it.
    pub arguments: String,
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Tokens a call used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default, deserialize_with = "null_as_default")]
    pub prompt_tokens: u64,
    #[serde(default, deserialize_with = "null_as_default")]
    pub completion_tokens: u64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
    }
}

/// What the model answered: text, tool calls, or both.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub message: ChatMessage,
    pub usage: Usage,
    /// The token limit ended the answer (`finish_reason: "length"`).
    pub cut_off: bool,
    /// Which provider answered (its model), for the logs.
    pub model: String,
}

#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("LLM HTTP {status}: {body}")]
    Status {
        status: u16,
        body: String,
        /// The provider's `Retry-After`, on a 429.
        retry_after: Option<Duration>,
    },
    #[error("LLM unreachable or too slow: {0}")]
    Transport(String),
    #[error("LLM answer unreadable: {0}")]
    Unreadable(String),
}

impl LlmError {
    /// What went wrong, without anything the provider echoed.
    pub fn kind(&self) -> String {
        match self {
            LlmError::Status { status, .. } => format!("HTTP {status}"),
            LlmError::Transport(_) => "unreachable or too slow".into(),
            LlmError::Unreadable(_) => "unreadable answer".into(),
        }
    }

    fn retryable(&self) -> bool {
        match self {
            LlmError::Status { status, .. } => *status == 429 || *status >= 500,
            LlmError::Transport(_) => true,
            LlmError::Unreadable(_) => false,
        }
    }
}

/// How the model samples, sent with every request; `None` leaves the provider's default.
#[derive(Debug, Clone, Default)]
pub struct Sampling {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_tokens: Option<u32>,
    pub seed: Option<u64>,
    /// Merged into the request body last: a provider's own options.
    pub extra: serde_json::Map<String, Value>,
}

impl Sampling {
    fn apply(&self, body: &mut Value) {
        let fields = [
            ("temperature", self.temperature.map(Value::from)),
            ("top_p", self.top_p.map(Value::from)),
            ("max_tokens", self.max_tokens.map(Value::from)),
            ("seed", self.seed.map(Value::from)),
        ];
        for (name, value) in fields {
            if let Some(value) = value {
                body[name] = value;
            }
        }
        for (name, value) in &self.extra {
            body[name.as_str()] = value.clone();
        }
    }
}

/// Which providers a call may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Providers {
    /// The primary, then the fallback.
    All,
    /// The fallback only (the primary's answers were not fit to send).
    Fallback,
}

/// Retry settings of every provider.
#[derive(Debug, Clone)]
pub struct Retries {
    /// Tries per provider.
    pub attempts: u32,
    /// The first wait; doubled after each further failure.
    pub backoff: Duration,
}

pub struct Llm {
    http: reqwest::Client,
    /// Each provider with its budget.
    providers: Vec<(Provider, Budget)>,
    retries: Retries,
    sampling: Sampling,
    clock: SharedClock,
    metrics: Arc<Metrics>,
}

/// What the client needs beside its providers.
pub struct LlmContext {
    pub timeout: Duration,
    pub retries: Retries,
    pub sampling: Sampling,
    pub clock: SharedClock,
    pub metrics: Arc<Metrics>,
}

impl Llm {
    /// A client for `primary`, then `fallback`, each within its budget, each call bounded by
    /// the context's timeout.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(
        primary: (Provider, Limits),
        fallback: Option<(Provider, Limits)>,
        context: LlmContext,
    ) -> reqwest::Result<Llm> {
        let http = reqwest::Client::builder()
            .timeout(context.timeout)
            .build()?;
        let clock = context.clock;
        let providers = std::iter::once(primary)
            .chain(fallback)
            .map(|(provider, limits)| (provider, Budget::new(limits, clock.clone())))
            .collect();
        Ok(Llm {
            http,
            providers,
            retries: context.retries,
            sampling: context.sampling,
            clock,
            metrics: context.metrics,
        })
    }

    /// A turn's record of its waits for these providers' budgets.
    pub fn waits(&self) -> Waits {
        Waits::new(self.clock.clone())
    }

    /// Calls in flight now, and whether the primary provider is paused by a 429, for the
    /// metrics.
    fn observe_budget(&self) {
        let in_flight: usize = self.providers.iter().map(|(_, b)| b.in_flight()).sum();
        let paused = self.providers.first().is_some_and(|(_, b)| b.paused());
        self.metrics
            .llm_in_flight
            .set(i64::try_from(in_flight).unwrap_or(i64::MAX));
        self.metrics.llm_paused.set(i64::from(paused));
    }

    /// Whether a fallback provider is configured.
    pub fn has_fallback(&self) -> bool {
        self.providers.len() > 1
    }

    /// One completion: each provider of `which` in turn, each with its retries.
    ///
    /// # Errors
    /// The last provider's last error.
    pub async fn complete(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        which: Providers,
        waits: &Waits,
    ) -> Result<Completion, LlmError> {
        let skip = usize::from(which == Providers::Fallback);
        let mut last = LlmError::Transport("no provider configured".into());
        let estimate = self.estimate(messages, tools);
        let providers = &self.providers[skip.min(self.providers.len())..];
        for (index, (provider, budget)) in providers.iter().enumerate() {
            let fallback_left = index + 1 < providers.len();
            for attempt in 0..self.retries.attempts.max(1) {
                // A provider paused by a 429 is passed over while another is left to ask.
                if budget.paused() && fallback_left {
                    break;
                }
                let backoff = self
                    .retries
                    .backoff
                    .saturating_mul(1 << attempt.saturating_sub(1).min(8));
                // A throttled provider is paused for every turn by its budget; other failures
                // back off here.
                if attempt > 0 && !matches!(last, LlmError::Status { status: 429, .. }) {
                    self.clock.sleep_until(self.clock.now() + backoff).await;
                }
                waits.begin();
                let ticket = budget.acquire(estimate).await;
                waits.end();
                self.metrics
                    .llm_budget_wait_seconds
                    .observe(ticket.waited.as_secs_f64());
                self.observe_budget();
                let answer = self.call(provider, messages, tools).await;
                if let Ok(completion) = &answer {
                    let used = completion.usage.prompt_tokens + completion.usage.completion_tokens;
                    budget.settle(&ticket, u32::try_from(used).unwrap_or(u32::MAX));
                }
                drop(ticket);
                self.observe_budget();
                match answer {
                    Ok(completion) => return Ok(completion),
                    Err(e) => {
                        // Only the kind of failure: an error body may echo the prompt.
                        tracing::warn!(model = %provider.model, attempt = attempt + 1, error.kind = e.kind(), "LLM call failed");
                        if let LlmError::Status {
                            status: 429,
                            retry_after,
                            ..
                        } = &e
                        {
                            self.metrics.llm_throttled.inc();
                            budget.pause(retry_after.unwrap_or_default().max(backoff));
                            self.observe_budget();
                        }
                        let retry = e.retryable();
                        last = e;
                        if !retry {
                            break;
                        }
                    }
                }
            }
        }
        Err(last)
    }

    /// The tokens a call may take, for its budget: about four characters a token of what is
    /// sent, and the answer's limit (or a typical answer).
    fn estimate(&self, messages: &[ChatMessage], tools: &[Value]) -> u32 {
        const CHARS_PER_TOKEN: usize = 4;
        const TYPICAL_ANSWER: u32 = 300;
        let sent: usize = messages
            .iter()
            .map(|m| m.content.as_deref().map_or(0, str::len))
            .sum::<usize>()
            + tools.iter().map(|t| t.to_string().len()).sum::<usize>();
        let prompt = u32::try_from(sent / CHARS_PER_TOKEN).unwrap_or(u32::MAX);
        prompt.saturating_add(self.sampling.max_tokens.unwrap_or(TYPICAL_ANSWER))
    }

    async fn call(
        &self,
        provider: &Provider,
        messages: &[ChatMessage],
        tools: &[Value],
    ) -> Result<Completion, LlmError> {
        #[derive(Deserialize)]
        struct Answer {
            choices: Vec<Choice>,
            #[serde(default, deserialize_with = "null_as_default")]
            usage: Usage,
        }
        #[derive(Deserialize)]
        struct Choice {
            message: ChatMessage,
            #[serde(default)]
            finish_reason: Option<String>,
        }
        let mut body = json!({ "model": provider.model, "messages": messages });
        if !tools.is_empty() {
            body["tools"] = json!(tools);
        }
        self.sampling.apply(&mut body);
        let url = format!(
            "{}/chat/completions",
            provider.base_url.trim_end_matches('/')
        );
        let mut request = self.http.post(url).json(&body);
        if let Some(key) = &provider.api_key {
            request = request.bearer_auth(key.expose_secret());
        }
        let response = request
            .send()
            .await
            .map_err(|e| LlmError::Transport(e.to_string()))?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after(v, self.clock.now()));
        if !status.is_success() {
            let body: String = response
                .text()
                .await
                .unwrap_or_default()
                .chars()
                .take(300)
                .collect();
            return Err(LlmError::Status {
                status: status.as_u16(),
                body,
                retry_after,
            });
        }
        let answer: Answer = response
            .json()
            .await
            .map_err(|e| LlmError::Unreadable(e.to_string()))?;
        let choice = answer
            .choices
            .into_iter()
            .next()
            .ok_or_else(|| LlmError::Unreadable("no choices".into()))?;
        Ok(Completion {
            message: choice.message,
            usage: answer.usage,
            cut_off: choice.finish_reason.as_deref() == Some("length"),
            model: provider.model.clone(),
        })
    }
}

/// A `Retry-After` value: seconds, or an HTTP date.
fn retry_after(value: &str, now: At) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let when = jiff::fmt::rfc2822::parse(value).ok()?.timestamp();
    Some(At::from_millis(when.as_millisecond()).since(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_seconds_or_an_http_date() {
        let now = At::from_millis(1_445_412_480_000); // 2015-10-21T07:28:00Z
        assert_eq!(retry_after(" 30 ", now), Some(Duration::from_secs(30)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:29:00 GMT", now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(retry_after("soon", now), None);
    }

    #[test]
    fn null_tool_calls_and_usage_read_as_none() {
        let message: ChatMessage =
            serde_json::from_str(r#"{"role":"assistant","content":"hi","tool_calls":null}"#)
                .expect("readable");
        assert!(message.tool_calls.is_empty());
        let usage: Usage =
            serde_json::from_str(r#"{"prompt_tokens":null,"completion_tokens":3}"#).expect("usage");
        assert_eq!(usage.completion_tokens, 3);
        // An assistant message asking for tools is sent back with null content, as OpenAI's.
        let asked = ChatMessage {
            role: "assistant".into(),
            content: None,
            tool_calls: vec![ToolCall {
                id: "call_9".into(),
                kind: "function".into(),
                function: FunctionCall {
                    name: "t".into(),
                    arguments: "{}".into(),
                },
            }],
            tool_call_id: None,
        };
        let sent = serde_json::to_value(&asked).expect("json");
        assert_eq!(sent["content"], Value::Null);
        assert_eq!(sent["tool_calls"][0]["type"], "function");
    }
}
