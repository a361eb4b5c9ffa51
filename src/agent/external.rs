//! An external agent: teams with their own agent stack keep it, and get Sabi's delivery
//! guarantees. Sabi posts the batch (messages, history from the store, the router's guess and
//! entities) as JSON with `X-Sabi-Timestamp` (Unix seconds) and `X-Sabi-Signature-256:
//! sha256=<hex>`, the HMAC-SHA256 of `<timestamp>.<body>` with the shared secret; the agent should
//! refuse old timestamps (say, over 5 minutes), so a captured request cannot be replayed. It
//! expects the reply in the answer (at most 1 MiB): `{"reply": "text", "options": ["..."]}`, or
//! `{"handoff": "note", "reply": "optional text"}`. Anything else fails the turn, which the
//! engine retries or hands to a person.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use secrecy::SecretString;
use serde::Deserialize;
use serde_json::json;

use crate::domain::{Batch, ReplyPart};
use crate::router::Router;
use crate::store::{TurnUsage, Turns};
use crate::turn::{TurnError, TurnHandler, TurnOutcome};
use crate::whatsapp::sign;

/// The header carrying the signature of `<timestamp>.<body>`.
pub const SIGNATURE_HEADER: &str = "X-Sabi-Signature-256";
/// The header carrying the time of signing, Unix seconds.
pub const TIMESTAMP_HEADER: &str = "X-Sabi-Timestamp";
/// The largest answer read.
const MAX_ANSWER_BYTES: usize = 1024 * 1024;

pub struct ExternalAgent {
    url: String,
    secret: SecretString,
    http: reqwest::Client,
    store: Arc<dyn Turns>,
    router: Option<Arc<Router>>,
}

#[derive(Deserialize)]
struct Answer {
    reply: Option<String>,
    #[serde(default)]
    options: Vec<String>,
    handoff: Option<String>,
}

impl ExternalAgent {
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(
        url: String,
        secret: SecretString,
        timeout: Duration,
        store: Arc<dyn Turns>,
        router: Option<Arc<Router>>,
    ) -> reqwest::Result<Arc<ExternalAgent>> {
        let http = reqwest::Client::builder().timeout(timeout).build()?;
        Ok(Arc::new(ExternalAgent {
            url,
            secret,
            http,
            store,
            router,
        }))
    }

    async fn body(&self, batch: &Batch) -> Result<String, TurnError> {
        let history = super::history(self.store.as_ref(), batch, 20)
            .await
            .map_err(|e| TurnError(format!("reading the history: {e}")))?;
        let text: Vec<&str> = batch
            .messages
            .iter()
            .filter_map(|m| m.text.as_deref())
            .collect();
        let routing = self.router.as_ref().map(|r| {
            let routing = r.route(&text.join("\n"));
            json!({"intent": routing.intent, "confidence": routing.confidence, "entities": routing.entities})
        });
        let body = json!({
            "batch_id": batch.id,
            "conversation": {
                "channel": batch.conversation.channel.as_str(),
                "business": batch.conversation.business,
                "customer": batch.conversation.customer,
            },
            "messages": batch.messages.iter().map(|m| json!({
                "id": m.external_id,
                "type": m.item_type,
                "text": m.text,
                "media_id": m.media_id,
                "sent_at_ms": m.sent_at(),
            })).collect::<Vec<_>>(),
            "history": history.iter().map(|h| json!({
                "speaker": h.speaker.as_str(),
                "text": h.text,
                "at_ms": h.at,
            })).collect::<Vec<_>>(),
            "routing": routing,
        });
        Ok(body.to_string())
    }
}

#[async_trait]
impl TurnHandler for ExternalAgent {
    async fn handle(&self, batch: &Batch) -> Result<TurnOutcome, TurnError> {
        // Marks the turn as the agent's in `sabi stats` (no tokens are known here).
        if let Err(e) = self.store.add_usage(batch.id, TurnUsage::default()).await {
            tracing::debug!(error.message = %e, "could not mark the turn as the agent's");
        }
        let body = self.body(batch).await?;
        let timestamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            .to_string();
        let signature = sign(&self.secret, format!("{timestamp}.{body}").as_bytes());
        let mut response = self
            .http
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(TIMESTAMP_HEADER, timestamp)
            .header(SIGNATURE_HEADER, signature)
            .body(body)
            .send()
            .await
            .map_err(|e| TurnError(format!("external agent unreachable: {e}")))?;
        let status = response.status();
        if !status.is_success() {
            return Err(TurnError(format!("external agent answered {status}")));
        }
        let mut raw = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| TurnError(format!("external agent's answer cut off: {e}")))?
        {
            if raw.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(TurnError("external agent's answer is over 1 MiB".into()));
            }
            raw.extend_from_slice(&chunk);
        }
        let answer: Answer = serde_json::from_slice(&raw)
            .map_err(|e| TurnError(format!("external agent's answer unreadable: {e}")))?;
        let part = |text: String, options: Vec<String>| ReplyPart {
            text,
            options,
            quote: None,
        };
        match answer {
            Answer {
                handoff: Some(note),
                reply,
                options,
            } => Ok(TurnOutcome::Handoff {
                parts: reply
                    .filter(|r| !r.trim().is_empty())
                    .map(|r| part(r, options))
                    .into_iter()
                    .collect(),
                note,
            }),
            Answer {
                reply: Some(reply),
                options,
                ..
            } if !reply.trim().is_empty() => Ok(TurnOutcome::Reply(vec![part(reply, options)])),
            _ => Err(TurnError(
                "external agent answered neither a reply nor a hand-off".into(),
            )),
        }
    }
}
