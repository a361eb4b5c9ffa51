//! A fake Graph API: a real HTTP server on a random local port that answers like Meta.
//!
//! It checks the bearer token and the request shapes of the reference, answers with fresh
//! wamids or Meta's error envelope, records every request with the time it arrived, and sends
//! status webhooks back to Sabi signed like Meta (wire format, `X-Hub-Signature-256`),
//! retrying until it gets a 200. Tests steer it: throttle for a while, fail the next sends
//! with a code, accept a send but never answer it, expire the token, close the customer
//! service window for a recipient, serve media.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::whatsapp::wire;

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Received {
    pub at: Instant,
    /// The business number (phone-number id) it was sent from.
    pub number: String,
    pub body: Value,
    /// The wamid the fake gave it, when it accepted a message.
    pub wamid: Option<String>,
    /// It came to the Marketing Messages API (`/marketing_messages`), not `/messages`.
    pub marketing: bool,
}

impl Received {
    /// The recipient: `to` or `recipient`.
    pub fn recipient(&self) -> Option<&str> {
        self.body["to"]
            .as_str()
            .or_else(|| self.body["recipient"].as_str())
    }

    /// The text a customer sees: a text body, an interactive body, or the template's name.
    pub fn text(&self) -> Option<&str> {
        self.body["text"]["body"]
            .as_str()
            .or_else(|| self.body["interactive"]["body"]["text"].as_str())
            .or_else(|| self.body["template"]["name"].as_str())
    }

    /// A message send (not a read receipt).
    pub fn is_message(&self) -> bool {
        self.body.get("status").is_none()
    }
}

/// How the fake reaches Sabi with status webhooks.
#[derive(Debug, Clone)]
pub struct Webhooks {
    pub url: String,
    pub app_secret: String,
}

#[derive(Default)]
struct Behaviour {
    /// Throttling periods back to back: each ends at its instant, and throttles with HTTP 429
    /// and no code when its flag is set, with 400 + 130429 when not.
    throttle: Vec<(Instant, bool)>,
    failures: VecDeque<(u16, i64)>,
    stall_next: usize,
    /// How long accepted sends take to be answered.
    answer_delay: Duration,
    token_expired: bool,
    window_closed: HashSet<String>,
    /// Recipients whose templates Meta does not charge for (they came from an ad).
    free_entry: HashSet<String>,
    statuses: bool,
    media: HashMap<String, (String, Vec<u8>)>,
    /// Message templates as `GET /{account}/message_templates` lists them.
    templates: Vec<Value>,
    /// The portfolio's messaging limit as `GET /{phone-number-id}` answers it; none by default.
    messaging_limit: Option<Value>,
}

struct Shared {
    token: String,
    webhooks: Mutex<Option<Webhooks>>,
    received: Mutex<Vec<Received>>,
    behaviour: Mutex<Behaviour>,
    addr: SocketAddr,
    http: reqwest::Client,
}

#[derive(Clone)]
pub struct FakeGraph {
    shared: Arc<Shared>,
}

/// How long a stalled answer takes: longer than any client timeout in the tests.
const STALL: Duration = Duration::from_secs(300);
/// When a stalled send's status webhooks go out.
const STALLED_STATUS_DELAY: Duration = Duration::from_secs(1);

impl FakeGraph {
    /// Starts the fake on a random local port. It accepts `token` only.
    ///
    /// # Panics
    /// When no local port can be bound.
    pub async fn start(token: &str) -> FakeGraph {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake Graph API");
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            webhooks: Mutex::new(None),
            received: Mutex::new(Vec::new()),
            behaviour: Mutex::new(Behaviour::default()),
            addr,
            http: reqwest::Client::new(),
        });
        let app = axum::Router::new()
            .route("/{version}/{number}/messages", post(messages))
            .route(
                "/{version}/{number}/marketing_messages",
                post(marketing_messages),
            )
            .route("/{version}/{media}", get(media_info))
            .route("/{version}/{account}/message_templates", get(templates))
            .route("/download/{media}", get(download))
            .with_state(shared.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeGraph { shared }
    }

    /// The API base to configure (`SABI_WHATSAPP_API_BASE`), with a version.
    pub fn base_url(&self) -> String {
        format!("http://{}/v23.0", self.shared.addr)
    }

    /// Where status webhooks go: without this, none are sent.
    pub fn deliver_statuses_to(&self, webhooks: Webhooks) {
        *lock(&self.shared.webhooks) = Some(webhooks);
    }

    /// Everything received so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        lock(&self.shared.received).clone()
    }

    /// How many requests arrived so far.
    pub fn request_count(&self) -> usize {
        lock(&self.shared.received).len()
    }

    /// Message sends accepted so far (each with its wamid), in arrival order.
    pub fn accepted(&self) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.wamid.is_some() && r.is_message())
            .collect()
    }

    /// Answers every message send with a throttling error for `duration`.
    pub fn throttle_for(&self, duration: Duration, http_429: bool) {
        self.throttle_storm(&[(duration, http_429)]);
    }

    /// Throttles message sends for each `(duration, http_429)` in turn, from now: a storm that
    /// changes its kind of refusal on the fake's own time, not the test's.
    pub fn throttle_storm(&self, periods: &[(Duration, bool)]) {
        let mut until = Instant::now();
        lock(&self.shared.behaviour).throttle = periods
            .iter()
            .map(|&(duration, http_429)| {
                until += duration;
                (until, http_429)
            })
            .collect();
    }

    /// The next message sends fail with (HTTP status, Meta code), in order.
    pub fn fail_next(&self, failures: &[(u16, i64)]) {
        lock(&self.shared.behaviour).failures.extend(failures);
    }

    /// The next `n` message sends are accepted but never answered.
    pub fn stall_next(&self, n: usize) {
        lock(&self.shared.behaviour).stall_next += n;
    }

    /// From now on accepted message sends are answered after `delay` (a slow Graph API).
    pub fn answer_after(&self, delay: Duration) {
        lock(&self.shared.behaviour).answer_delay = delay;
    }

    /// From now on the token is refused with code 190.
    pub fn expire_token(&self) {
        lock(&self.shared.behaviour).token_expired = true;
    }

    /// Non-template messages to `recipient` are accepted, then fail with 131047 in a status
    /// webhook, as Meta does outside the customer service window.
    pub fn close_window(&self, recipient: &str) {
        lock(&self.shared.behaviour)
            .window_closed
            .insert(recipient.to_owned());
    }

    /// Templates to `recipient` are free, as when they came through a Click-to-WhatsApp ad:
    /// their statuses' pricing says `free_entry_point`.
    pub fn free_entry_point(&self, recipient: &str) {
        lock(&self.shared.behaviour)
            .free_entry
            .insert(recipient.to_owned());
    }

    /// Sends `sent` and `delivered` status webhooks for every accepted message (a stalled or
    /// window-failed one always gets its statuses); `delivered` carries the message's pricing,
    /// as Meta's v24 statuses do.
    pub fn send_statuses(&self, on: bool) {
        lock(&self.shared.behaviour).statuses = on;
    }

    /// Lists a message template of the business account: `status` as Meta gives it
    /// (APPROVED, PAUSED, ...), `body` with its `{{1}}`... placeholders.
    pub fn add_template(&self, name: &str, language: &str, status: &str, body: &str) {
        lock(&self.shared.behaviour).templates.push(json!({
            "name": name,
            "language": language,
            "status": status,
            "category": "MARKETING",
            "components": [{"type": "BODY", "text": body}],
            "id": "1689556908120042",
        }));
    }

    /// Lists a message template of `category` (MARKETING, UTILITY, AUTHENTICATION), as
    /// [`FakeGraph::add_template`] lists a MARKETING one.
    pub fn add_template_of(
        &self,
        category: &str,
        name: &str,
        language: &str,
        status: &str,
        body: &str,
    ) {
        self.add_template(name, language, status, body);
        self.recategorise(name, category);
    }

    /// Meta moves a listed template to another category: its list says so, and the Marketing
    /// Messages API takes it or refuses it (131055) by it.
    pub fn recategorise(&self, name: &str, category: &str) {
        for t in lock(&self.shared.behaviour)
            .templates
            .iter_mut()
            .filter(|t| t["name"] == name)
        {
            t["category"] = json!(category);
        }
    }

    /// Answers `tier` (like `"TIER_2K"`) as the business numbers' messaging limit.
    pub fn set_messaging_limit(&self, tier: &str) {
        lock(&self.shared.behaviour).messaging_limit = Some(json!(tier));
    }

    /// Serves `bytes` as media `id`.
    pub fn add_media(&self, id: &str, mime_type: &str, bytes: Vec<u8>) {
        lock(&self.shared.behaviour)
            .media
            .insert(id.to_owned(), (mime_type.to_owned(), bytes));
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

fn error(status: u16, code: i64, message: &str) -> Response {
    let body = json!({"error": {
        "message": format!("(#{code}) {message}"),
        "type": "OAuthException",
        "code": code,
        "error_data": {"messaging_product": "whatsapp", "details": message},
        "fbtrace_id": "AFakeTraceId",
    }});
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
        Json(body),
    )
        .into_response()
}

fn authorised(shared: &Shared, headers: &HeaderMap) -> bool {
    let expected = format!("Bearer {}", shared.token);
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == expected)
        && !lock(&shared.behaviour).token_expired
}

/// An error answer: HTTP status, Meta code, message.
type Refusal = (u16, i64, &'static str);

/// What the reference requires of a send body; the error Meta gives otherwise.
fn check_shape(body: &Value) -> Result<(), Refusal> {
    if body["messaging_product"] != "whatsapp" {
        return Err((400, 100, "messaging_product must be whatsapp"));
    }
    if body.get("status").is_some() {
        return match body["message_id"].as_str() {
            Some(id) if id.starts_with("wamid.") => Ok(()),
            _ => Err((400, 100, "unknown message_id")),
        };
    }
    if body["to"].as_str().is_none() && body["recipient"].as_str().is_none() {
        return Err((400, 131_008, "to or recipient is required"));
    }
    let kind = body["type"].as_str().unwrap_or_default();
    if body.get(kind).is_none() {
        return Err((400, 131_008, "the message object is missing"));
    }
    match kind {
        "text" => match body["text"]["body"].as_str() {
            Some(text) if text.chars().count() <= 4096 && !text.is_empty() => Ok(()),
            _ => Err((400, 100, "text.body missing or over 4096 characters")),
        },
        "interactive" => {
            let text = body["interactive"]["body"]["text"]
                .as_str()
                .unwrap_or_default();
            let buttons = body["interactive"]["action"]["buttons"]
                .as_array()
                .map_or(0, Vec::len);
            let over = if buttons > 0 { 1024 } else { 4096 };
            if text.is_empty() || text.chars().count() > over || buttons > 3 {
                Err((400, 100, "interactive message out of limits"))
            } else {
                Ok(())
            }
        }
        "template" => match (
            body["template"]["name"].as_str(),
            body["template"]["language"]["code"].as_str(),
        ) {
            (Some(_), Some(_)) => Ok(()),
            _ => Err((400, 131_008, "template name and language are required")),
        },
        "reaction" | "image" | "audio" | "document" | "video" | "sticker" => Ok(()),
        _ => Err((400, 100, "unknown message type")),
    }
}

enum Plan {
    Accept { stall: bool, fail_window: bool },
    Refuse(Response),
}

fn plan(shared: &Shared, body: &Value) -> Plan {
    let mut b = lock(&shared.behaviour);
    let now = Instant::now();
    if let Some(&(_, http_429)) = b.throttle.iter().find(|(until, _)| now < *until) {
        return Plan::Refuse(if http_429 {
            (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, "1")]).into_response()
        } else {
            error(400, 130_429, "Rate limit hit")
        });
    }
    if let Some((status, code)) = b.failures.pop_front() {
        return Plan::Refuse(error(status, code, "injected failure"));
    }
    let stall = b.stall_next > 0;
    if stall {
        b.stall_next -= 1;
    }
    let recipient = body["to"].as_str().or_else(|| body["recipient"].as_str());
    let fail_window =
        body["type"] != "template" && recipient.is_some_and(|r| b.window_closed.contains(r));
    Plan::Accept { stall, fail_window }
}

async fn messages(
    State(shared): State<Arc<Shared>>,
    Path((_version, number)): Path<(String, String)>,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    take(shared, number, headers, raw, false).await
}

/// The Marketing Messages API: Cloud API's send, for MARKETING templates only, priced
/// `marketing_lite`.
async fn marketing_messages(
    State(shared): State<Arc<Shared>>,
    Path((_version, number)): Path<(String, String)>,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    take(shared, number, headers, raw, true).await
}

/// What the Marketing Messages API refuses that `/messages` takes, as Meta refuses it.
fn check_marketing(shared: &Shared, body: &Value) -> Result<(), Refusal> {
    if body["type"] != "template" {
        return Err((400, 100, "Message must be a template message."));
    }
    let b = lock(&shared.behaviour);
    let listed = b.templates.iter().find(|t| {
        t["name"] == body["template"]["name"]
            && t["language"] == body["template"]["language"]["code"]
    });
    match listed {
        None => Err((
            404,
            132_001,
            "Template name does not exist in the translation",
        )),
        Some(t) if t["category"] != "MARKETING" => Err((400, 131_055, "Method not allowed")),
        Some(_) => Ok(()),
    }
}

async fn take(
    shared: Arc<Shared>,
    number: String,
    headers: HeaderMap,
    raw: Bytes,
    marketing: bool,
) -> Response {
    let at = Instant::now();
    let Ok(body) = serde_json::from_slice::<Value>(&raw) else {
        return error(400, 100, "malformed JSON");
    };
    let mut received = Received {
        at,
        number: number.clone(),
        body: body.clone(),
        wamid: None,
        marketing,
    };
    if !authorised(&shared, &headers) {
        lock(&shared.received).push(received);
        return error(
            401,
            190,
            "Error validating access token: Session has expired",
        );
    }
    let checked = check_shape(&body).and_then(|()| match marketing {
        true => check_marketing(&shared, &body),
        false => Ok(()),
    });
    if let Err((status, code, message)) = checked {
        lock(&shared.received).push(received);
        return error(status, code, message);
    }
    if body.get("status").is_some() {
        lock(&shared.received).push(received);
        return Json(json!({"success": true})).into_response();
    }
    let (stall, fail_window) = match plan(&shared, &body) {
        Plan::Refuse(response) => {
            lock(&shared.received).push(received);
            return response;
        }
        Plan::Accept { stall, fail_window } => (stall, fail_window),
    };
    let wamid = format!("wamid.FAKE{}", uuid_like());
    received.wamid = Some(wamid.clone());
    lock(&shared.received).push(received);
    let recipient = body["to"]
        .as_str()
        .or_else(|| body["recipient"].as_str())
        .unwrap_or_default()
        .to_owned();
    let callback = body["biz_opaque_callback_data"].as_str().map(str::to_owned);
    let mut pricing = pricing(&shared, &body, &recipient);
    if marketing {
        pricing["category"] = json!("marketing_lite");
    }
    let statuses = lock(&shared.behaviour).statuses || fail_window || stall;
    if statuses {
        let shared = shared.clone();
        let (number, wamid, recipient) = (number.clone(), wamid.clone(), recipient.clone());
        tokio::spawn(async move {
            // A stalled send's statuses come after the client gave up, as late webhooks do.
            if stall {
                tokio::time::sleep(STALLED_STATUS_DELAY).await;
            }
            let list: &[&str] = if fail_window {
                &["failed"]
            } else {
                &["sent", "delivered"]
            };
            for status in list {
                let sent = Sent {
                    number: &number,
                    wamid: &wamid,
                    recipient: &recipient,
                    callback: callback.as_deref(),
                    pricing: (*status == "delivered").then_some(&pricing),
                };
                post_status(&shared, &sent, status).await;
            }
        });
    }
    if stall {
        tokio::time::sleep(STALL).await;
    }
    let delay = lock(&shared.behaviour).answer_delay;
    tokio::time::sleep(delay).await;
    let input_key = if body["to"].is_string() {
        "wa_id"
    } else {
        "user_id"
    };
    let mut answer = json!({
        "messaging_product": "whatsapp",
        "contacts": [{"input": recipient, input_key: recipient}],
        "messages": [{"id": wamid}],
    });
    if body["type"] == "template" {
        answer["messages"][0]["message_status"] = json!("accepted");
    }
    Json(answer).into_response()
}

fn uuid_like() -> String {
    let mut bytes = [0u8; 12];
    getrandom::fill(&mut bytes).unwrap_or_default();
    hex::encode_upper(bytes)
}

/// What Meta says a message costs: templates are charged (`regular`, marketing) unless their
/// recipient came from an ad; replies in an open window are free service messages.
fn pricing(shared: &Shared, body: &Value, recipient: &str) -> Value {
    let template = body["type"] == "template";
    let free_entry = template && lock(&shared.behaviour).free_entry.contains(recipient);
    let (kind, category) = match (template, free_entry) {
        (true, false) => ("regular", "marketing"),
        (true, true) => ("free_entry_point", "marketing"),
        (false, _) => ("free_customer_service", "service"),
    };
    json!({"billable": kind == "regular", "pricing_model": "PMP", "type": kind, "category": category})
}

/// A message the fake took, as its status webhooks name it.
struct Sent<'a> {
    number: &'a str,
    wamid: &'a str,
    recipient: &'a str,
    callback: Option<&'a str>,
    pricing: Option<&'a Value>,
}

/// A status webhook, signed like Meta, posted until Sabi answers 200 (a few tries).
async fn post_status(shared: &Shared, sent: &Sent<'_>, status: &str) {
    let Sent {
        number,
        wamid,
        recipient,
        callback,
        pricing,
    } = *sent;
    let Some(hooks) = lock(&shared.webhooks).clone() else {
        return;
    };
    let mut item = json!({
        "id": wamid,
        "status": status,
        "timestamp": (chrono_now_secs()).to_string(),
        "recipient_id": recipient,
    });
    if let Some(callback) = callback {
        item["biz_opaque_callback_data"] = json!(callback);
    }
    if let Some(pricing) = pricing {
        item["pricing"] = pricing.clone();
    }
    if status == "failed" {
        item["errors"] = json!([{
            "code": 131_047,
            "title": "Re-engagement message",
            "message": "Re-engagement message",
            "error_data": {"details": "Message failed to send because more than 24 hours have passed since the customer last replied to this number."},
        }]);
    }
    let body = wire::encode(&json!({
        "object": "whatsapp_business_account",
        "entry": [{"id": "100000000000000", "changes": [{"field": "messages", "value": {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "15550000000", "phone_number_id": number},
            "statuses": [item],
        }}]}],
    }));
    for _ in 0..20 {
        let sent =
            super::webhook::signed(&shared.http, &hooks.url, &hooks.app_secret, body.clone())
                .send()
                .await;
        if sent.is_ok_and(|r| r.status() == StatusCode::OK) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn chrono_now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The account's templates whose names contain `name`, as Meta's filter matches.
async fn templates(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if !authorised(&shared, &headers) {
        return error(401, 190, "Error validating access token");
    }
    let name = query.get("name").cloned().unwrap_or_default();
    let data: Vec<Value> = lock(&shared.behaviour)
        .templates
        .iter()
        .filter(|t| t["name"].as_str().is_some_and(|n| n.contains(&name)))
        .cloned()
        .collect();
    Json(json!({"data": data, "paging": {"cursors": {"before": "MAZDZD", "after": "MAZDZD"}}}))
        .into_response()
}

/// `GET /{version}/{id}` is both a media object and, when `fields=` asks for its messaging
/// limit, a business number.
async fn media_info(
    State(shared): State<Arc<Shared>>,
    Path((_version, media)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if !authorised(&shared, &headers) {
        return error(401, 190, "Error validating access token");
    }
    if query
        .get("fields")
        .is_some_and(|f| f.contains("messaging_limit"))
    {
        return number_fields(&shared, &media);
    }
    if media == "me" {
        return Json(json!({"id": "100000000000009", "name": "Sabi system user"})).into_response();
    }
    let known = lock(&shared.behaviour).media.get(&media).cloned();
    match known {
        Some((mime_type, bytes)) => Json(json!({
            "messaging_product": "whatsapp",
            "url": format!("http://{}/download/{media}", shared.addr),
            "mime_type": mime_type,
            "sha256": "0",
            "file_size": bytes.len().to_string(),
            "id": media,
        }))
        .into_response(),
        None => error(400, 100, "unknown media id"),
    }
}

/// A business number's fields: its id, and the portfolio's messaging limit when a test set it.
fn number_fields(shared: &Shared, id: &str) -> Response {
    let mut answer = json!({"id": id});
    if let Some(limit) = lock(&shared.behaviour).messaging_limit.clone() {
        answer["whatsapp_business_manager_messaging_limit"] = limit;
    }
    Json(answer).into_response()
}

async fn download(
    State(shared): State<Arc<Shared>>,
    Path(media): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !authorised(&shared, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let known = lock(&shared.behaviour).media.get(&media).cloned();
    match known {
        Some((mime_type, bytes)) => ([(header::CONTENT_TYPE, mime_type)], bytes).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
