//! Chatwoot as Sabi speaks it: its Application API (contacts, conversations and messages in
//! one API-channel inbox, `api_access_token` header) and its signed webhooks.
//!
//! A webhook carries `X-Chatwoot-Timestamp` (Unix seconds) and `X-Chatwoot-Signature:
//! sha256=<hex>`, the HMAC-SHA256 of `<timestamp>.<raw body>` with the inbox's webhook secret;
//! one signed more than [`MAX_AGE`](super::MAX_AGE) ago is refused ([`super::check`]), so a
//! captured delivery cannot be replayed later. Messages Sabi writes carry
//! `content_attributes.sabi`, and their ids are claimed as they are written, so their own
//! webhooks are never taken for an agent's reply.
//!
//! A Chatwoot conversation is opened per Sabi conversation and carries it in
//! `additional_attributes.sabi_conversation`: a customer who writes to two of the business's
//! numbers is one contact with two conversations, and a hand-off retried after a crash finds
//! the conversation it opened.

use std::time::Duration;

use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    Attachment, Customer, DeskError, Event, Line, Opened, Target, answer, handed_over_note,
    message_text,
};
use crate::config::ChatwootConfig;
use crate::domain::{BatchMessage, ConversationKey};
use crate::store::ReviewEntry;

pub const SIGNATURE_HEADER: &str = "x-chatwoot-signature";
pub const TIMESTAMP_HEADER: &str = "x-chatwoot-timestamp";
/// How long one API call may take.
const TIMEOUT: Duration = Duration::from_secs(10);

type Result<T> = std::result::Result<T, DeskError>;

/// How a message shows in the Chatwoot conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Posted {
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
    #[serde(default)]
    additional_attributes: Value,
}

/// The store's name for Chatwoot conversation `id`.
pub fn thread_of(id: i64) -> String {
    format!("chatwoot:{id}")
}

fn conversation_of(thread: &str) -> Result<i64> {
    thread
        .strip_prefix("chatwoot:")
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| DeskError::Unexpected(format!("{thread:?} is not a Chatwoot conversation")))
}

/// How a Chatwoot conversation names the Sabi conversation it is for.
fn tag(key: &ConversationKey) -> String {
    format!("{}:{}:{}", key.channel.as_str(), key.business, key.customer)
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

    /// The Chatwoot conversation for `customer`'s Sabi conversation: the open one opened for
    /// it before, else a new one. Its id, and whether it is new.
    async fn conversation(&self, customer: &Customer) -> Result<(i64, bool)> {
        let key = &customer.conversation;
        let (contact, source) = self
            .contact(&key.customer, &customer.name, customer.phone.as_deref())
            .await?;
        let listed = self
            .call(
                reqwest::Method::GET,
                &format!("/contacts/{contact}/conversations"),
                None,
            )
            .await?;
        let tag = tag(key);
        let open = serde_json::from_value::<Vec<Conversation>>(listed["payload"].clone())
            .unwrap_or_default()
            .into_iter()
            .find(|c| {
                c.inbox_id == Some(i64::from(self.inbox))
                    && c.status.as_deref() != Some("resolved")
                    && c.additional_attributes["sabi_conversation"] == tag.as_str()
            });
        if let Some(open) = open {
            return Ok((open.id, false));
        }
        let body = json!({
            "inbox_id": self.inbox, "contact_id": contact, "source_id": source, "status": "open",
            "additional_attributes": {"sabi_conversation": tag},
        });
        let created = self
            .call(reqwest::Method::POST, "/conversations", Some(body))
            .await?;
        let id = created["id"].as_i64().ok_or_else(|| {
            DeskError::Unexpected(format!("a conversation without an id: {created}"))
        })?;
        Ok((id, true))
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
        let id = payload["contact"]["id"]
            .as_i64()
            .ok_or_else(|| DeskError::Unexpected(format!("a contact without an id: {created}")))?;
        let source = payload["contact_inbox"]["source_id"]
            .as_str()
            .map_or_else(|| source_id(identifier), str::to_owned);
        Ok((id, source))
    }

    /// Posts `content` into conversation `conversation` as `how`; Chatwoot's id of it.
    async fn post(&self, conversation: i64, content: &str, how: Posted) -> Result<i64> {
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
            .ok_or_else(|| DeskError::Unexpected(format!("a message without an id: {posted}")))
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        self.send(request).await
    }

    /// Sends `request` with the token; Chatwoot's answer.
    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value> {
        let response = request
            .header("api_access_token", self.token.expose_secret())
            .send()
            .await
            .map_err(|e| DeskError::Unreachable(e.to_string()))?;
        let body = answer(response).await?;
        serde_json::from_slice(&body).map_err(|e| DeskError::Unexpected(e.to_string()))
    }
}

#[async_trait]
impl Target for Chatwoot {
    fn owns(&self, thread: &str) -> bool {
        thread.starts_with("chatwoot:")
    }

    async fn open(&self, customer: &Customer, _item: i64, transcript: &[Line]) -> Result<Opened> {
        let (conversation, new) = self.conversation(customer).await?;
        let mut written = Vec::new();
        if new {
            for line in transcript {
                let how = match line.customer {
                    true => Posted::Incoming,
                    false => Posted::Outgoing,
                };
                let id = self.post(conversation, &line.text, how).await?;
                written.push(thread_of(id));
            }
        }
        Ok(Opened {
            thread: thread_of(conversation),
            written,
        })
    }

    async fn handed_over(&self, thread: &str, item: &ReviewEntry) -> Result<()> {
        let note = handed_over_note(item);
        self.post(conversation_of(thread)?, &note, Posted::Note)
            .await
            .map(drop)
    }

    async fn message(
        &self,
        thread: &str,
        _item: i64,
        message: &BatchMessage,
        attachment: Option<&Attachment>,
    ) -> Result<()> {
        let conversation = conversation_of(thread)?;
        let text = message_text(message, attachment.is_some());
        let (Some(file), Some(media)) = (attachment, &message.media_id) else {
            return self
                .post(conversation, &text, Posted::Incoming)
                .await
                .map(drop);
        };
        let kind = message.item_type.as_deref().unwrap_or("file");
        let part = reqwest::multipart::Part::bytes(file.bytes.clone())
            .file_name(file.file_name(kind, media))
            .mime_str(&file.mime_type)
            .map_err(|e| DeskError::Unexpected(format!("media type {:?}: {e}", file.mime_type)))?;
        let form = reqwest::multipart::Form::new()
            .text("content", text)
            .text("message_type", "incoming")
            .text("private", "false")
            .part("attachments[]", part);
        let request = self
            .http
            .post(format!(
                "{}/conversations/{conversation}/messages",
                self.base
            ))
            .multipart(form);
        self.send(request).await.map(drop)
    }

    async fn notice(&self, thread: &str, text: &str) -> Result<()> {
        self.post(conversation_of(thread)?, text, Posted::Note)
            .await
            .map(drop)
    }
}

/// The contact's id in an API-channel inbox: Sabi's name for the customer, stable, so a
/// retried hand-off finds the same one.
fn source_id(identifier: &str) -> String {
    format!("sabi-{identifier}")
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
                    thread: thread_of(conversation),
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
        thread: thread_of(value["conversation"]["id"].as_i64()?),
        message: thread_of(value["id"].as_i64()?),
        text: text.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_agents_public_reply_is_sent() {
        let reply = br#"{"event":"message_created","id":91,"content":" On it. ","message_type":"outgoing","private":false,"sender":{"type":"user"},"conversation":{"id":17}}"#;
        assert_eq!(
            event(reply).expect("json"),
            Event::Reply {
                thread: "chatwoot:17".into(),
                message: "chatwoot:91".into(),
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
            Event::Resolved {
                thread: "chatwoot:17".into()
            }
        );
    }
}
