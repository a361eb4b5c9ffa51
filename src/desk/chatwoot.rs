//! Chatwoot as Sabi speaks it: its Application API (contacts, conversations and messages in
//! one API-channel inbox, `api_access_token` header) and its signed webhooks.
//!
//! A webhook carries `X-Chatwoot-Timestamp` (Unix seconds) and `X-Chatwoot-Signature:
//! sha256=<hex>`, the HMAC-SHA256 of `<timestamp>.<raw body>` with the inbox's webhook secret;
//! one signed more than [`MAX_AGE`] ago is refused, so a captured delivery cannot be replayed
//! later. Messages Sabi writes carry `content_attributes.sabi`, so their own webhooks are never
//! taken for an agent's reply.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::clock::At;
use crate::config::ChatwootConfig;
use crate::whatsapp::{sign, verify};

pub const SIGNATURE_HEADER: &str = "x-chatwoot-signature";
pub const TIMESTAMP_HEADER: &str = "x-chatwoot-timestamp";
/// The oldest webhook taken, by its signed timestamp.
pub const MAX_AGE: Duration = Duration::from_secs(5 * 60);
/// How long one API call may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What went wrong talking to Chatwoot.
#[derive(Debug, thiserror::Error)]
pub enum ChatwootError {
    #[error("Chatwoot could not be reached: {0}")]
    Unreachable(String),
    #[error("Chatwoot answered {status}: {body}")]
    Refused { status: u16, body: String },
    #[error("Chatwoot's answer was not what its API documents: {0}")]
    Unexpected(String),
}

type Result<T> = std::result::Result<T, ChatwootError>;

/// How a message shows in the Chatwoot conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posted {
    /// The customer's words.
    Incoming,
    /// Sabi's earlier replies.
    Outgoing,
    /// A private note for the agents.
    Note,
}

/// The Chatwoot account and inbox hand-offs go to.
pub struct Chatwoot {
    http: reqwest::Client,
    base: String,
    token: SecretString,
    inbox: u32,
}

#[derive(Deserialize)]
struct Contact {
    id: i64,
    #[serde(default)]
    identifier: Option<String>,
}

#[derive(Deserialize)]
struct Conversation {
    id: i64,
    inbox_id: Option<i64>,
    status: Option<String>,
}

impl Chatwoot {
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(config: &ChatwootConfig) -> reqwest::Result<Chatwoot> {
        Ok(Chatwoot {
            http: reqwest::Client::builder().timeout(TIMEOUT).build()?,
            base: format!(
                "{}/api/v1/accounts/{}",
                config.base_url.trim_end_matches('/'),
                config.account_id
            ),
            token: config.api_token.clone(),
            inbox: config.inbox_id,
        })
    }

    /// The inbox, as `sabi check` asks for it: the token is good and the inbox is there.
    ///
    /// # Errors
    /// When Chatwoot is away or refuses.
    pub async fn inbox(&self) -> Result<String> {
        let inbox = self
            .call(
                reqwest::Method::GET,
                &format!("/inboxes/{}", self.inbox),
                None,
            )
            .await?;
        Ok(inbox["name"].as_str().unwrap_or("unnamed").to_owned())
    }

    /// The Chatwoot conversation for the customer `identifier` (their number or BSUID, or a
    /// web-chat session): an open one of theirs in the inbox, else a new one. Its id.
    ///
    /// # Errors
    /// When Chatwoot is away or refuses.
    pub async fn conversation(
        &self,
        identifier: &str,
        name: &str,
        phone: Option<&str>,
    ) -> Result<i64> {
        let (contact, source) = self.contact(identifier, name, phone).await?;
        let listed = self
            .call(
                reqwest::Method::GET,
                &format!("/contacts/{contact}/conversations"),
                None,
            )
            .await?;
        let open: Option<Conversation> =
            serde_json::from_value::<Vec<Conversation>>(listed["payload"].clone())
                .unwrap_or_default()
                .into_iter()
                .find(|c| {
                    c.inbox_id == Some(i64::from(self.inbox))
                        && c.status.as_deref() != Some("resolved")
                });
        if let Some(open) = open {
            return Ok(open.id);
        }
        let body = json!({
            "inbox_id": self.inbox, "contact_id": contact, "source_id": source, "status": "open",
        });
        let created = self
            .call(reqwest::Method::POST, "/conversations", Some(body))
            .await?;
        created["id"].as_i64().ok_or_else(|| {
            ChatwootError::Unexpected(format!("a conversation without an id: {created}"))
        })
    }

    /// The contact and their source id in the inbox: found by identifier, else created.
    async fn contact(
        &self,
        identifier: &str,
        name: &str,
        phone: Option<&str>,
    ) -> Result<(i64, String)> {
        let found = self
            .call(
                reqwest::Method::GET,
                &format!(
                    "/contacts/search?q={}",
                    url::form_urlencoded::byte_serialize(identifier.as_bytes()).collect::<String>()
                ),
                None,
            )
            .await?;
        let known = serde_json::from_value::<Vec<Contact>>(found["payload"].clone())
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.identifier.as_deref() == Some(identifier));
        if let Some(contact) = known {
            let body = json!({"inbox_id": self.inbox, "source_id": source_id(identifier)});
            let inbox = self
                .call(
                    reqwest::Method::POST,
                    &format!("/contacts/{}/contact_inboxes", contact.id),
                    Some(body),
                )
                .await?;
            let source = inbox["source_id"]
                .as_str()
                .unwrap_or(&source_id(identifier))
                .to_owned();
            return Ok((contact.id, source));
        }
        let mut body = json!({
            "inbox_id": self.inbox, "name": name, "identifier": identifier,
        });
        if let Some(phone) = phone {
            body["phone_number"] = json!(format!("+{phone}"));
        }
        let created = self
            .call(reqwest::Method::POST, "/contacts", Some(body))
            .await?;
        let payload = &created["payload"];
        let id = payload["contact"]["id"].as_i64().ok_or_else(|| {
            ChatwootError::Unexpected(format!("a contact without an id: {created}"))
        })?;
        let source = payload["contact_inbox"]["source_id"]
            .as_str()
            .map_or_else(|| source_id(identifier), str::to_owned);
        Ok((id, source))
    }

    /// Posts `content` into conversation `conversation` as `how`; Chatwoot's id of it.
    ///
    /// # Errors
    /// When Chatwoot is away or refuses.
    pub async fn post(&self, conversation: i64, content: &str, how: Posted) -> Result<i64> {
        let (message_type, private) = match how {
            Posted::Incoming => ("incoming", false),
            Posted::Outgoing => ("outgoing", false),
            Posted::Note => ("outgoing", true),
        };
        let body = json!({
            "content": content, "message_type": message_type, "private": private,
            "content_attributes": {"sabi": true},
        });
        let posted = self
            .call(
                reqwest::Method::POST,
                &format!("/conversations/{conversation}/messages"),
                Some(body),
            )
            .await?;
        posted["id"]
            .as_i64()
            .ok_or_else(|| ChatwootError::Unexpected(format!("a message without an id: {posted}")))
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("api_access_token", self.token.expose_secret());
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| ChatwootError::Unreachable(e.to_string()))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| ChatwootError::Unreachable(e.to_string()))?;
        if !status.is_success() {
            return Err(ChatwootError::Refused {
                status: status.as_u16(),
                body: text.chars().take(200).collect(),
            });
        }
        serde_json::from_str(&text).map_err(|e| ChatwootError::Unexpected(e.to_string()))
    }
}

/// The contact's id in an API-channel inbox: Sabi's name for the customer, stable, so a
/// retried hand-off finds the same one.
fn source_id(identifier: &str) -> String {
    format!("sabi-{identifier}")
}

/// Why a webhook was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("X-Chatwoot-Timestamp is missing or not Unix seconds")]
    NoTime,
    #[error("X-Chatwoot-Timestamp is more than five minutes away: a stale or replayed delivery")]
    Stale,
    #[error("X-Chatwoot-Signature does not match the body")]
    Signature,
}

/// Checks a webhook's signature over `<timestamp>.<body>` and its age at `now`.
///
/// # Errors
/// What was wrong, for the 401 answer.
pub fn check(
    secret: &SecretString,
    timestamp: Option<&str>,
    signature: Option<&[u8]>,
    body: &[u8],
    now: At,
) -> std::result::Result<(), Refused> {
    let seconds: i64 = timestamp
        .and_then(|t| t.trim().parse().ok())
        .ok_or(Refused::NoTime)?;
    let signed_at = At::from_millis(seconds.saturating_mul(1000));
    if now.since(signed_at) > MAX_AGE || signed_at.since(now) > MAX_AGE {
        return Err(Refused::Stale);
    }
    verify(
        std::slice::from_ref(secret),
        signature,
        &signed(seconds, body),
    )
    .map_err(|_| Refused::Signature)
}

/// The headers Chatwoot sends with `body` signed at `seconds`: (timestamp, signature).
pub fn signature(secret: &SecretString, seconds: i64, body: &[u8]) -> (String, String) {
    (seconds.to_string(), sign(secret, &signed(seconds, body)))
}

fn signed(seconds: i64, body: &[u8]) -> Vec<u8> {
    let mut signed = format!("{seconds}.").into_bytes();
    signed.extend_from_slice(body);
    signed
}

/// What a Chatwoot webhook asks of Sabi.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An agent wrote to the customer: send it.
    Reply {
        conversation: i64,
        message: i64,
        text: String,
    },
    /// The conversation was resolved: the customer is Sabi's again.
    Resolved { conversation: i64 },
    /// Anything else: private notes, Sabi's own messages, other events.
    Ignored,
}

/// Reads a webhook's body.
///
/// # Errors
/// When it is not JSON.
pub fn event(body: &[u8]) -> serde_json::Result<Event> {
    let value: Value = serde_json::from_slice(body)?;
    Ok(match value["event"].as_str() {
        Some("message_created") => reply(&value).unwrap_or(Event::Ignored),
        Some("conversation_status_changed" | "conversation_resolved")
            if value["status"] == "resolved" =>
        {
            value["id"]
                .as_i64()
                .map_or(Event::Ignored, |conversation| Event::Resolved {
                    conversation,
                })
        }
        _ => Event::Ignored,
    })
}

/// An agent's public outgoing message; `None` for the customer's, a private note, a bot's, or
/// Sabi's own.
fn reply(value: &Value) -> Option<Event> {
    let outgoing = value["message_type"] == "outgoing" || value["message_type"] == 1;
    let private = value["private"].as_bool().unwrap_or(false);
    let from_sabi = value["content_attributes"]["sabi"]
        .as_bool()
        .unwrap_or(false);
    let from_bot = value["sender"]["type"] == "agent_bot";
    if !outgoing || private || from_sabi || from_bot {
        return None;
    }
    let text = value["content"].as_str()?.trim();
    if text.is_empty() {
        return None;
    }
    Some(Event::Reply {
        conversation: value["conversation"]["id"].as_i64()?,
        message: value["id"].as_i64()?,
        text: text.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: At = At::from_millis(1_781_000_000_000);

    #[test]
    fn a_webhook_is_taken_only_signed_and_fresh() {
        let secret = SecretString::from("cw-secret".to_owned());
        let body = br#"{"event":"message_created"}"#;
        let (time, sig) = signature(&secret, NOW.unix_seconds(), body);
        let ok = check(&secret, Some(&time), Some(sig.as_bytes()), body, NOW);
        assert_eq!(ok, Ok(()));
        let forged = check(&secret, Some(&time), Some(sig.as_bytes()), b"{}", NOW);
        assert_eq!(forged, Err(Refused::Signature));
        let later = NOW + Duration::from_secs(301);
        let replayed = check(&secret, Some(&time), Some(sig.as_bytes()), body, later);
        assert_eq!(replayed, Err(Refused::Stale));
        assert_eq!(
            check(&secret, None, Some(sig.as_bytes()), body, NOW),
            Err(Refused::NoTime)
        );
        let other = SecretString::from("another".to_owned());
        assert_eq!(
            check(&other, Some(&time), Some(sig.as_bytes()), body, NOW),
            Err(Refused::Signature)
        );
    }

    #[test]
    fn only_an_agents_public_reply_is_sent() {
        let reply = br#"{"event":"message_created","id":91,"content":" On it. ","message_type":"outgoing","private":false,"sender":{"type":"user"},"conversation":{"id":17}}"#;
        assert_eq!(
            event(reply).expect("json"),
            Event::Reply {
                conversation: 17,
                message: 91,
                text: "On it.".into()
            }
        );
        for ignored in [
            r#"{"event":"message_created","id":92,"content":"note","message_type":"outgoing","private":true,"conversation":{"id":17}}"#,
            r#"{"event":"message_created","id":93,"content":"hi","message_type":"incoming","conversation":{"id":17}}"#,
            r#"{"event":"message_created","id":94,"content":"mirrored","message_type":"outgoing","content_attributes":{"sabi":true},"conversation":{"id":17}}"#,
            r#"{"event":"message_created","id":95,"content":"bot","message_type":"outgoing","sender":{"type":"agent_bot"},"conversation":{"id":17}}"#,
            r#"{"event":"conversation_status_changed","id":17,"status":"pending"}"#,
            r#"{"event":"webwidget_triggered"}"#,
        ] {
            assert_eq!(
                event(ignored.as_bytes()).expect("json"),
                Event::Ignored,
                "{ignored}"
            );
        }
        let resolved = br#"{"event":"conversation_status_changed","id":17,"status":"resolved"}"#;
        assert_eq!(
            event(resolved).expect("json"),
            Event::Resolved { conversation: 17 }
        );
    }
}
