//! The Graph API client: messages, read receipts with the typing indicator, and media. One
//! connection pool for every business number; the number a message goes from is part of each
//! call (`/{phone-number-id}/messages`).
//!
//! Errors keep what decides the next step: Meta's `error.code` (never the HTTP status alone),
//! `Retry-After`, and whether the request can have reached Meta at all.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::MessagingLimit;
pub use crate::config::Template;

/// What goes out.
#[derive(Debug, Clone, Copy)]
pub enum Message<'a> {
    /// Text, with quick replies when `options` is not empty: up to 3 as reply buttons, up to
    /// 10 as a list.
    Text {
        body: &'a str,
        options: &'a [String],
    },
    Template(&'a Template),
    Reaction {
        message_id: &'a str,
        emoji: &'a str,
    },
}

/// Where a message goes and what it carries besides its content.
#[derive(Debug, Clone, Copy)]
pub struct Envelope<'a> {
    /// The business number's phone-number id.
    pub from: &'a str,
    /// A phone number, or a business-scoped user id (`CC.xxxx`).
    pub to: &'a str,
    /// The customer's message to quote.
    pub quote: Option<&'a str>,
    /// Echoed by Meta in the status webhooks of this message.
    pub callback: Option<&'a str>,
}

/// A media object's download location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaInfo {
    pub url: String,
    pub mime_type: String,
}

#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// Meta answered with an error.
    #[error("Graph API error {code:?} (HTTP {status}): {message}")]
    Api {
        status: u16,
        code: Option<i64>,
        message: String,
        retry_after: Option<Duration>,
    },
    /// The request never reached Meta (no connection): safe to send again.
    #[error("Graph API not reached: {0}")]
    NotSent(String),
    /// The request may have reached Meta, but no answer came (timeout, reset).
    #[error("Graph API answer lost: {0}")]
    Unknown(String),
    /// A download larger than allowed.
    #[error("media larger than {0} bytes")]
    TooLarge(u64),
}

#[derive(Clone)]
pub struct Graph {
    http: reqwest::Client,
    base: String,
    token: SecretString,
}

impl Graph {
    /// A client for `base` (with its version, like `https://graph.facebook.com/v23.0`), every
    /// call bounded by `timeout`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built (no TLS roots).
    pub fn new(base: &str, token: SecretString, timeout: Duration) -> reqwest::Result<Graph> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .pool_max_idle_per_host(64)
            .build()?;
        Ok(Graph {
            http,
            base: base.trim_end_matches('/').to_owned(),
            token,
        })
    }

    /// Sends a message; Meta's id for it (the wamid) when accepted.
    ///
    /// # Errors
    /// [`GraphError`], telling whether the request may have reached Meta.
    pub async fn send(
        &self,
        envelope: Envelope<'_>,
        message: Message<'_>,
    ) -> Result<String, GraphError> {
        let body = message_body(envelope, message);
        let answer: SendAnswer = self.post_messages(envelope.from, &body).await?;
        answer
            .messages
            .into_iter()
            .next()
            .map(|m| m.id)
            .ok_or_else(|| GraphError::Unknown("accepted without a message id".into()))
    }

    /// Marks the customer's message (and all before it) read, showing the typing indicator
    /// when `typing` (Meta hides it after 25 s or when the reply arrives).
    ///
    /// # Errors
    /// [`GraphError`].
    pub async fn mark_read(
        &self,
        from: &str,
        message_id: &str,
        typing: bool,
    ) -> Result<(), GraphError> {
        let mut body = json!({
            "messaging_product": "whatsapp",
            "status": "read",
            "message_id": message_id,
        });
        if typing {
            body["typing_indicator"] = json!({"type": "text"});
        }
        self.post_messages::<Value>(from, &body).await.map(drop)
    }

    /// Where to download a media object. Its URL expires within minutes: fetch it at once.
    ///
    /// # Errors
    /// [`GraphError`].
    pub async fn media(&self, media_id: &str) -> Result<MediaInfo, GraphError> {
        #[derive(Deserialize)]
        struct Answer {
            url: String,
            #[serde(default)]
            mime_type: String,
        }
        let url = format!("{}/{}", self.base, urlencode(media_id));
        let answer: Answer = self.call(self.http.get(url)).await?;
        Ok(MediaInfo {
            url: answer.url,
            mime_type: answer.mime_type,
        })
    }

    /// Downloads media from a URL [`Graph::media`] gave, refusing more than `max_bytes`.
    ///
    /// # Errors
    /// [`GraphError`]; [`GraphError::TooLarge`] above the limit.
    pub async fn download(&self, url: &str, max_bytes: u64) -> Result<Vec<u8>, GraphError> {
        let mut response = self
            .http
            .get(url)
            .bearer_auth(self.token.expose_secret())
            .send()
            .await
            .map_err(transport)?;
        if !response.status().is_success() {
            return Err(api_error(response).await);
        }
        if response.content_length().is_some_and(|n| n > max_bytes) {
            return Err(GraphError::TooLarge(max_bytes));
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            if bytes.len() as u64 + chunk.len() as u64 > max_bytes {
                return Err(GraphError::TooLarge(max_bytes));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }

    /// The business account's templates called `name`, one per language.
    ///
    /// # Errors
    /// [`GraphError`].
    pub async fn templates(
        &self,
        account: &str,
        name: &str,
    ) -> Result<Vec<TemplateInfo>, GraphError> {
        #[derive(Deserialize)]
        struct Answer {
            #[serde(default)]
            data: Vec<TemplateInfo>,
        }
        let url = url::Url::parse_with_params(
            &format!("{}/{}/message_templates", self.base, urlencode(account)),
            [
                ("name", name),
                ("fields", "name,language,status,category,components"),
                ("limit", "100"),
            ],
        )
        .map_err(|e| GraphError::NotSent(format!("the templates address: {e}")))?;
        let answer: Answer = self.call(self.http.get(url)).await?;
        // Meta's `name` filter matches parts of names too.
        Ok(answer.data.into_iter().filter(|t| t.name == name).collect())
    }

    async fn post_messages<T: serde::de::DeserializeOwned>(
        &self,
        from: &str,
        body: &Value,
    ) -> Result<T, GraphError> {
        let url = format!("{}/{}/messages", self.base, urlencode(from));
        self.call(self.http.post(url).json(body)).await
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<T, GraphError> {
        let response = request
            .bearer_auth(self.token.expose_secret())
            .send()
            .await
            .map_err(transport)?;
        if !response.status().is_success() {
            return Err(api_error(response).await);
        }
        response
            .json()
            .await
            .map_err(|e| GraphError::Unknown(format!("unreadable answer: {e}")))
    }
}

/// A message template as Meta lists it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TemplateInfo {
    pub name: String,
    pub language: String,
    /// APPROVED, PENDING, REJECTED, PAUSED, DISABLED, ...
    pub status: String,
    #[serde(default)]
    pub category: Option<String>,
    #[serde(default)]
    pub components: Vec<TemplateComponent>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TemplateComponent {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

impl TemplateInfo {
    /// The body's text, with its `{{1}}`, `{{2}}`... (or named) placeholders.
    pub fn body(&self) -> Option<&str> {
        self.components
            .iter()
            .find(|c| c.kind.eq_ignore_ascii_case("BODY"))
            .and_then(|c| c.text.as_deref())
    }

    /// How many parameters the body takes: its distinct placeholders.
    pub fn parameters(&self) -> usize {
        let Some(body) = self.body() else { return 0 };
        let mut names: Vec<&str> = body
            .split("{{")
            .skip(1)
            .filter_map(|rest| rest.split_once("}}").map(|(name, _)| name.trim()))
            .filter(|name| !name.is_empty())
            .collect();
        names.sort_unstable();
        names.dedup();
        names.len()
    }
}

#[derive(Deserialize)]
struct SendAnswer {
    #[serde(default)]
    messages: Vec<SentMessage>,
}

#[derive(Deserialize)]
struct SentMessage {
    id: String,
}

/// A failure before any byte could reach Meta is safe to repeat; anything later is not.
fn transport(e: reqwest::Error) -> GraphError {
    if e.is_connect() || e.is_builder() {
        GraphError::NotSent(e.to_string())
    } else {
        GraphError::Unknown(e.to_string())
    }
}

async fn api_error(response: reqwest::Response) -> GraphError {
    #[derive(Deserialize)]
    struct Envelope {
        error: Detail,
    }
    #[derive(Deserialize)]
    struct Detail {
        code: Option<i64>,
        #[serde(default)]
        message: String,
    }
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let text = response.text().await.unwrap_or_default();
    let (code, message) = match serde_json::from_str::<Envelope>(&text) {
        Ok(Envelope { error }) => (error.code, error.message),
        Err(_) => (None, text.chars().take(200).collect()),
    };
    GraphError::Api {
        status,
        code,
        message,
        retry_after,
    }
}

/// The JSON body of a send, as the reference gives it.
pub fn message_body(envelope: Envelope<'_>, message: Message<'_>) -> Value {
    let mut body = json!({
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
    });
    // Phone numbers go in `to`; business-scoped user ids (`NG.1234...`) in `recipient`.
    let key = if is_phone_number(envelope.to) {
        "to"
    } else {
        "recipient"
    };
    body[key] = json!(envelope.to);
    if let Some(callback) = envelope.callback {
        body["biz_opaque_callback_data"] = json!(callback);
    }
    match message {
        Message::Text {
            body: text,
            options,
        } => {
            if let Some(quote) = envelope.quote {
                body["context"] = json!({ "message_id": quote });
            }
            match options.len() {
                0 => {
                    body["type"] = json!("text");
                    body["text"] = json!({ "preview_url": has_link(text), "body": text });
                }
                1..=3 => {
                    body["type"] = json!("interactive");
                    body["interactive"] = buttons(text, options);
                }
                _ => {
                    body["type"] = json!("interactive");
                    body["interactive"] = list(text, options);
                }
            }
        }
        Message::Template(template) => {
            body["type"] = json!("template");
            let parameters: Vec<Value> = template
                .parameters
                .iter()
                .map(|p| json!({ "type": "text", "text": p }))
                .collect();
            let mut spec = json!({
                "name": template.name,
                "language": { "code": template.language },
            });
            if !parameters.is_empty() {
                spec["components"] = json!([{ "type": "body", "parameters": parameters }]);
            }
            body["template"] = spec;
        }
        Message::Reaction { message_id, emoji } => {
            body["type"] = json!("reaction");
            body["reaction"] = json!({ "message_id": message_id, "emoji": emoji });
        }
    }
    body
}

/// Meta's template category that the Marketing Messages API takes, as Meta spells it.
pub const MARKETING: &str = "MARKETING";

/// Where a send goes: Meta's Marketing Messages API takes MARKETING templates only; every
/// other message, and a template whose category is not known, goes to Cloud API's `/messages`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Messages,
    MarketingMessages,
}

impl Endpoint {
    /// PURE: the endpoint for a template of `category` (as Meta lists it), with the Marketing
    /// Messages API turned on or off.
    pub fn for_template(category: Option<&str>, marketing_messages: bool) -> Endpoint {
        match category {
            Some(c) if marketing_messages && c.eq_ignore_ascii_case(MARKETING) => {
                Endpoint::MarketingMessages
            }
            _ => Endpoint::Messages,
        }
    }

    /// The path after the phone-number id.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Messages => "messages",
            Endpoint::MarketingMessages => "marketing_messages",
        }
    }
}

impl Graph {
    /// Sends a MARKETING template through the Marketing Messages API
    /// (`/{phone-number-id}/marketing_messages`), with Meta's time-to-live when `ttl_seconds`
    /// is given; Meta's id for it (the wamid) when accepted. Meta refuses any other message
    /// there (#100 "Message must be a template message", 131055 for another category).
    ///
    /// # Errors
    /// [`GraphError`], telling whether the request may have reached Meta.
    pub async fn send_marketing(
        &self,
        envelope: Envelope<'_>,
        template: &Template,
        ttl_seconds: Option<u32>,
    ) -> Result<String, GraphError> {
        let body = marketing_body(envelope, template, ttl_seconds);
        let url = format!(
            "{}/{}/{}",
            self.base,
            urlencode(envelope.from),
            Endpoint::MarketingMessages.path()
        );
        let answer: SendAnswer = self.call(self.http.post(url).json(&body)).await?;
        answer
            .messages
            .into_iter()
            .next()
            .map(|m| m.id)
            .ok_or_else(|| GraphError::Unknown("accepted without a message id".into()))
    }
}

/// The JSON body of a Marketing Messages API send: a template send's, with Meta's
/// `message_send_ttl_seconds` when a time-to-live is set.
pub fn marketing_body(
    envelope: Envelope<'_>,
    template: &Template,
    ttl_seconds: Option<u32>,
) -> Value {
    let mut body = message_body(envelope, Message::Template(template));
    if let Some(ttl) = ttl_seconds {
        body["message_send_ttl_seconds"] = json!(ttl);
    }
    body
}

/// Most quick replies a message can carry (a list's 10 rows).
pub const MAX_OPTIONS: usize = 10;
/// The longest body text a message with reply buttons can have.
pub const BUTTONS_BODY_LIMIT: usize = 1024;

fn buttons(text: &str, options: &[String]) -> Value {
    let buttons: Vec<Value> = options
        .iter()
        .map(|o| json!({ "type": "reply", "reply": { "id": clip(o, 256), "title": clip(o, 20) } }))
        .collect();
    json!({ "type": "button", "body": { "text": text }, "action": { "buttons": buttons } })
}

fn list(text: &str, options: &[String]) -> Value {
    let rows: Vec<Value> = options
        .iter()
        .take(MAX_OPTIONS)
        .map(|o| json!({ "id": clip(o, 200), "title": clip(o, 24) }))
        .collect();
    json!({
        "type": "list",
        "body": { "text": text },
        "action": { "button": "Options", "sections": [{ "title": "Options", "rows": rows }] },
    })
}

/// At most `max` characters, cut on a character boundary.
fn clip(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

fn has_link(text: &str) -> bool {
    text.contains("https://") || text.contains("http://")
}

fn is_phone_number(to: &str) -> bool {
    !to.is_empty()
        && to
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '+' | '-' | ' ' | '(' | ')'))
}

fn urlencode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The fields of a business number that say its messaging limit: the portfolio's, which Meta
/// sets since October 2025 and shares between the portfolio's numbers, and the number's own
/// tier, which older accounts still answer.
const LIMIT_FIELDS: &str = "whatsapp_business_manager_messaging_limit,messaging_limit_tier";

impl Graph {
    /// Meta's messaging limit for the business `phone_number_id` belongs to: how many customers
    /// business-initiated messages may reach in 24 hours. `None` when Meta answers neither
    /// field (a test number, an account not yet rated).
    ///
    /// # Errors
    /// [`GraphError`].
    pub async fn messaging_limit(
        &self,
        phone_number_id: &str,
    ) -> Result<Option<MessagingLimit>, GraphError> {
        #[derive(Deserialize)]
        struct Answer {
            whatsapp_business_manager_messaging_limit: Option<Value>,
            messaging_limit_tier: Option<Value>,
        }
        let url = url::Url::parse_with_params(
            &format!("{}/{}", self.base, urlencode(phone_number_id)),
            [("fields", LIMIT_FIELDS)],
        )
        .map_err(|e| GraphError::NotSent(format!("the number's address: {e}")))?;
        let answer: Answer = self.call(self.http.get(url)).await?;
        Ok(answer
            .whatsapp_business_manager_messaging_limit
            .as_ref()
            .and_then(tier)
            .or_else(|| answer.messaging_limit_tier.as_ref().and_then(tier)))
    }
}

/// A messaging limit as Meta writes it: `TIER_250`, `TIER_2K`, `TIER_10K`, `TIER_100K`,
/// `TIER_UNLIMITED` (and the older `TIER_50`, `TIER_1K`), or a count as a number or text.
fn tier(value: &Value) -> Option<MessagingLimit> {
    if let Some(n) = value.as_u64() {
        return Some(MessagingLimit(Some(n)));
    }
    let text = value.as_str()?.trim().to_ascii_uppercase();
    let count = text.strip_prefix("TIER_").unwrap_or(&text);
    if count == "UNLIMITED" {
        return Some(MessagingLimit(None));
    }
    let (digits, times) = match count.strip_suffix('K') {
        Some(thousands) => (thousands, 1_000),
        None => (count, 1),
    };
    let n = digits.parse::<u64>().ok()?.checked_mul(times)?;
    Some(MessagingLimit(Some(n)))
}

#[cfg(test)]
mod limit_tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn metas_tiers_read_as_customers_a_day() {
        for (written, limit) in [
            (json!("TIER_250"), Some(250)),
            (json!("TIER_2K"), Some(2_000)),
            (json!("TIER_10K"), Some(10_000)),
            (json!("TIER_100K"), Some(100_000)),
            (json!("TIER_1K"), Some(1_000)),
            (json!("10000"), Some(10_000)),
            (json!(2000), Some(2_000)),
        ] {
            assert_eq!(tier(&written), Some(MessagingLimit(limit)), "{written}");
        }
        assert_eq!(tier(&json!("TIER_UNLIMITED")), Some(MessagingLimit(None)));
        assert_eq!(tier(&json!("TIER_SOON")), None);
        assert_eq!(tier(&json!(null)), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_templates_parameters_are_its_body_s_distinct_placeholders() {
        let template: TemplateInfo = serde_json::from_value(json!({
            "name": "diwali_offer", "language": "en", "status": "APPROVED",
            "components": [
                {"type": "HEADER", "format": "TEXT", "text": "Hi {{1}}"},
                {"type": "BODY", "text": "Happy Diwali, {{1}}! {{2}} off, {{1}}, tonight."},
                {"type": "FOOTER", "text": "Reply STOP to opt out"}
            ],
        }))
        .expect("a template");
        assert_eq!(template.parameters(), 2);
        assert_eq!(
            template.body(),
            Some("Happy Diwali, {{1}}! {{2}} off, {{1}}, tonight.")
        );
    }

    fn envelope(to: &str) -> Envelope<'_> {
        Envelope {
            from: "1",
            to,
            quote: None,
            callback: Some("sabi:outbox:7"),
        }
    }

    #[test]
    fn phone_numbers_go_in_to_and_user_ids_in_recipient() {
        let body = message_body(
            envelope("2348031234567"),
            Message::Text {
                body: "hi",
                options: &[],
            },
        );
        assert_eq!(body["to"], "2348031234567");
        assert_eq!(body["biz_opaque_callback_data"], "sabi:outbox:7");
        assert_eq!(body["text"]["body"], "hi");
        let body = message_body(
            envelope("NG.8812734650192837"),
            Message::Text {
                body: "hi",
                options: &[],
            },
        );
        assert_eq!(body["recipient"], "NG.8812734650192837");
        assert!(body.get("to").is_none());
    }

    #[test]
    fn options_become_buttons_or_a_list() {
        let three: Vec<String> = ["Yes", "No", "Talk to a person please"]
            .map(String::from)
            .to_vec();
        let body = message_body(
            envelope("1"),
            Message::Text {
                body: "Helpful?",
                options: &three,
            },
        );
        assert_eq!(body["interactive"]["type"], "button");
        assert_eq!(
            body["interactive"]["action"]["buttons"][2]["reply"]["title"],
            "Talk to a person ple"
        );
        let many: Vec<String> = (0..12).map(|i| format!("Option {i}")).collect();
        let body = message_body(
            envelope("1"),
            Message::Text {
                body: "Pick",
                options: &many,
            },
        );
        assert_eq!(body["interactive"]["type"], "list");
        let rows = body["interactive"]["action"]["sections"][0]["rows"]
            .as_array()
            .map_or(0, Vec::len);
        assert_eq!(rows, MAX_OPTIONS);
    }

    #[test]
    fn reactions_name_the_message_and_never_quote() {
        let quoting = Envelope {
            quote: Some("wamid.in"),
            ..envelope("1")
        };
        let body = message_body(
            quoting,
            Message::Reaction {
                message_id: "wamid.in",
                emoji: "👍",
            },
        );
        assert_eq!(body["type"], "reaction");
        assert_eq!(body["reaction"]["message_id"], "wamid.in");
        assert_eq!(body["reaction"]["emoji"], "👍");
        assert!(
            body.get("context").is_none(),
            "a reaction cannot be a contextual reply"
        );
    }

    #[test]
    fn only_marketing_templates_go_to_the_marketing_messages_api_when_it_is_on() {
        use Endpoint::{MarketingMessages, Messages};
        assert_eq!(
            Endpoint::for_template(Some("MARKETING"), true),
            MarketingMessages
        );
        assert_eq!(
            Endpoint::for_template(Some("marketing"), true),
            MarketingMessages
        );
        assert_eq!(Endpoint::for_template(Some("MARKETING"), false), Messages);
        assert_eq!(Endpoint::for_template(Some("UTILITY"), true), Messages);
        assert_eq!(
            Endpoint::for_template(Some("AUTHENTICATION"), true),
            Messages
        );
        assert_eq!(
            Endpoint::for_template(None, true),
            Messages,
            "unknown: /messages"
        );
        assert_eq!(MarketingMessages.path(), "marketing_messages");
    }

    #[test]
    fn a_marketing_send_carries_its_time_to_live_only_when_set() {
        let template = Template {
            name: "diwali_offer".into(),
            language: "en".into(),
            parameters: vec![],
        };
        let body = marketing_body(envelope("2348031234567"), &template, Some(86_400));
        assert_eq!(body["type"], "template");
        assert_eq!(body["template"]["name"], "diwali_offer");
        assert_eq!(body["message_send_ttl_seconds"], 86_400);
        let body = marketing_body(envelope("2348031234567"), &template, None);
        assert!(body.get("message_send_ttl_seconds").is_none());
    }

    #[test]
    fn templates_carry_positional_parameters() {
        let template = Template {
            name: "reply_waiting".into(),
            language: "en_US".into(),
            parameters: vec!["Ada".into()],
        };
        let body = message_body(envelope("1"), Message::Template(&template));
        assert_eq!(body["template"]["name"], "reply_waiting");
        assert_eq!(body["template"]["language"]["code"], "en_US");
        assert_eq!(
            body["template"]["components"][0]["parameters"][0]["text"],
            "Ada"
        );
    }
}
