//! Any help desk, through signed JSON (`[handoff.webhook]`): Sabi posts each hand-off's events
//! to the desk's URL, and the desk posts its agents' replies to `POST /webhook/desk`. Both ways
//! are signed as Chatwoot signs its webhooks: `X-Sabi-Timestamp` (Unix seconds) and
//! `X-Sabi-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>.<raw body>")>`, and a
//! delivery more than five minutes old is refused.
//!
//! Sabi posts (each with an `id` that stays the same when an event is posted again after a
//! crash, for the desk to drop repeats by, and the `thread` it belongs to):
//! - `opened`: a new thread for a conversation, with the customer and the transcript;
//! - `handed_over`: a review item, with its reason;
//! - `message`: the customer's message: its text, and its media as `media.base64` with
//!   `media.mime_type` when Sabi could fetch it from Meta (else only `media_id`);
//! - `notice`: something only the agents should read;
//! - `ping`: `sabi check` asking whether the desk takes Sabi's events.
//!
//! The desk posts `{"event": "reply", "thread": ..., "id": ..., "text": ...}` (sent once per
//! `id`) and `{"event": "resolved", "thread": ...}`. A desk that answers 2xx has taken the
//! event; 5xx or no answer is retried with backoff, 4xx is retried with the next round.

use std::time::Duration;

use async_trait::async_trait;
use secrecy::SecretString;
use serde_json::{Value, json};

use base64::Engine;

use super::{
    Attachment, Customer, DeskError, Event, Line, Opened, Target, answer, handed_over_note,
    signature,
};
use crate::clock::SharedClock;
use crate::config::DeskWebhookConfig;
use crate::domain::BatchMessage;
use crate::store::ReviewEntry;

pub const SIGNATURE_HEADER: &str = "x-sabi-signature";
pub const TIMESTAMP_HEADER: &str = "x-sabi-timestamp";
/// How long one delivery may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A desk that takes Sabi's events as signed JSON.
pub struct DeskWebhook {
    http: reqwest::Client,
    url: String,
    secret: SecretString,
    clock: SharedClock,
}

impl DeskWebhook {
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(config: &DeskWebhookConfig, clock: SharedClock) -> reqwest::Result<DeskWebhook> {
        Ok(DeskWebhook {
            http: reqwest::Client::builder().timeout(TIMEOUT).build()?,
            url: config.url.clone(),
            secret: config.secret.clone(),
            clock,
        })
    }

    /// Posts `event`, signed.
    ///
    /// # Errors
    /// When the desk is away or does not answer 2xx.
    pub async fn post(&self, event: &Value) -> Result<(), DeskError> {
        let body = event.to_string().into_bytes();
        let (timestamp, signature) =
            signature(&self.secret, self.clock.now().unix_seconds(), &body);
        let response = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header(TIMESTAMP_HEADER, timestamp)
            .header(SIGNATURE_HEADER, signature)
            .body(body)
            .send()
            .await
            .map_err(|e| DeskError::Unreachable(e.to_string()))?;
        answer(response).await.map(drop)
    }
}

#[async_trait]
impl Target for DeskWebhook {
    fn owns(&self, thread: &str) -> bool {
        thread.starts_with("webhook:")
    }

    async fn open(
        &self,
        customer: &Customer,
        item: i64,
        transcript: &[Line],
    ) -> Result<Opened, DeskError> {
        // Named by the hand-off that opened it: a retry names the same thread.
        let thread = format!("webhook:{item}");
        let key = &customer.conversation;
        let lines: Vec<Value> = transcript
            .iter()
            .map(|l| json!({"from": if l.customer { "customer" } else { "sabi" }, "text": l.text}))
            .collect();
        self.post(&json!({
            "event": "opened", "id": format!("{thread}:opened"), "thread": thread,
            "conversation": {
                "channel": key.channel.as_str(), "business": key.business, "customer": key.customer,
            },
            "contact": {"name": customer.name, "phone": customer.phone},
            "transcript": lines,
        }))
        .await?;
        Ok(Opened {
            thread,
            written: Vec::new(),
        })
    }

    async fn handed_over(&self, thread: &str, item: &ReviewEntry) -> Result<(), DeskError> {
        self.post(&json!({
            "event": "handed_over", "id": format!("{thread}:item:{}", item.id), "thread": thread,
            "item": item.id, "reason": item.reason.as_str(), "error": item.error,
            "note": handed_over_note(item),
        }))
        .await
    }

    async fn message(
        &self,
        thread: &str,
        item: i64,
        message: &BatchMessage,
        attachment: Option<&Attachment>,
    ) -> Result<(), DeskError> {
        let media = attachment.map(|file| {
            json!({
                "mime_type": file.mime_type,
                "base64": base64::engine::general_purpose::STANDARD.encode(&file.bytes),
            })
        });
        self.post(&json!({
            "event": "message", "id": format!("{thread}:message:{}", message.seq),
            "thread": thread, "item": item, "type": message.item_type,
            "text": message.text, "media_id": message.media_id, "media": media,
            "sent_at": message.sent_at().unix_seconds(),
        }))
        .await
    }

    async fn notice(&self, thread: &str, text: &str) -> Result<(), DeskError> {
        let id = format!("{thread}:notice:{:016x}", fastrand::u64(..));
        self.post(&json!({"event": "notice", "id": id, "thread": thread, "text": text}))
            .await
    }
}

/// Reads a delivery from the desk.
///
/// # Errors
/// When it is not JSON, or a reply or resolution without its thread, id or text.
pub fn event(body: &[u8]) -> Result<Event, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let field = |name: &str| {
        value[name]
            .as_str()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| format!("\"{name}\" is missing or not a string"))
    };
    let thread = || {
        field("thread").and_then(|t| match t.starts_with("webhook:") {
            true => Ok(t),
            false => Err(format!("{t:?} is not a thread Sabi opened (webhook:<id>)")),
        })
    };
    match value["event"].as_str() {
        Some("reply") => Ok(Event::Reply {
            thread: thread()?,
            message: format!("webhook:{}", field("id")?),
            text: field("text")?,
        }),
        Some("resolved") => Ok(Event::Resolved { thread: thread()? }),
        _ => Ok(Event::Ignored),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_desk_replies_and_resolves_by_thread() {
        let reply = br#"{"event":"reply","thread":"webhook:4","id":"m-1","text":" On it. "}"#;
        assert_eq!(
            event(reply),
            Ok(Event::Reply {
                thread: "webhook:4".into(),
                message: "webhook:m-1".into(),
                text: "On it.".into()
            })
        );
        let resolved = br#"{"event":"resolved","thread":"webhook:4"}"#;
        assert_eq!(
            event(resolved),
            Ok(Event::Resolved {
                thread: "webhook:4".into()
            })
        );
        assert_eq!(event(br#"{"event":"typing"}"#), Ok(Event::Ignored));
        for bad in [
            &br#"{"event":"reply","thread":"webhook:4","text":"no id"}"#[..],
            br#"{"event":"reply","thread":"chatwoot:4","id":"m","text":"not ours"}"#,
            br#"{"event":"reply","thread":"webhook:4","id":"m","text":"  "}"#,
            b"not json",
        ] {
            assert!(event(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
