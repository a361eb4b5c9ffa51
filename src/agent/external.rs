//! An external agent: teams with their own agent stack keep it, and get Sabi's delivery
//! guarantees. Sabi posts the batch (messages, history from the store, the router's guess and
//! entities) as JSON signed with HMAC-SHA256 (`X-Sabi-Signature-256: sha256=<hex>`, the same
//! scheme as Meta's webhooks), and expects the reply in the answer:
//! `{"reply": "text", "options": ["..."]}`, or `{"handoff": "note", "reply": "optional text"}`.
//! Anything else fails the turn, which the engine retries or hands to a person.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use secrecy::SecretString;
use serde::Deserialize;
use serde_json::json;

use crate::domain::{Batch, ReplyPart};
use crate::ingress::whatsapp::sign;
use crate::router::Router;
use crate::store::{Speaker, Store};
use crate::worker::{TurnError, TurnHandler, TurnOutcome};

/// The header carrying the body's signature.
pub const SIGNATURE_HEADER: &str = "X-Sabi-Signature-256";

pub struct ExternalAgent {
    url: String,
    secret: SecretString,
    http: reqwest::Client,
    store: Arc<dyn Store>,
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
        store: Arc<dyn Store>,
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
        let history = self
            .store
            .history(batch.id, 20)
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
                "sent_at_ms": m.sent_at_ms(),
            })).collect::<Vec<_>>(),
            "history": history.iter().map(|h| json!({
                "speaker": match h.speaker {
                    Speaker::Customer => "customer",
                    Speaker::Business => "business",
                    Speaker::Note => "note",
                },
                "text": h.text,
                "at_ms": h.at_ms,
            })).collect::<Vec<_>>(),
            "routing": routing,
        });
        Ok(body.to_string())
    }
}

#[async_trait]
impl TurnHandler for ExternalAgent {
    async fn handle(&self, batch: &Batch) -> Result<TurnOutcome, TurnError> {
        let body = self.body(batch).await?;
        let signature = sign(&self.secret, body.as_bytes());
        let response = self
            .http
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature)
            .body(body)
            .send()
            .await
            .map_err(|e| TurnError(format!("external agent unreachable: {e}")))?;
        let status = response.status();
        if !status.is_success() {
            return Err(TurnError(format!("external agent answered {status}")));
        }
        let answer: Answer = response
            .json()
            .await
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
                parts: reply.map(|r| part(r, options)).into_iter().collect(),
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
