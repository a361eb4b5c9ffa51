//! A fake Chatwoot for tests: the Application API endpoints Sabi calls (an inbox, contacts
//! found by identifier or created with their contact inbox, a contact's conversations,
//! conversations and their messages), checking the `api_access_token` header, and webhooks
//! signed as Chatwoot signs them. It can be taken down (every call answers 503) and brought
//! back.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use secrecy::SecretString;
use serde_json::{Value, json};

use crate::whatsapp::sign;

/// A message as the fake keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Posted {
    pub id: i64,
    pub content: String,
    /// `incoming` or `outgoing`.
    pub message_type: String,
    pub private: bool,
    /// A file posted with it.
    pub attachment: Option<File>,
}

/// A file posted with a message: (file name, content type, bytes).
pub type File = (String, String, Vec<u8>);

#[derive(Default)]
struct Books {
    next_id: i64,
    /// id -> (identifier, name, phone).
    contacts: HashMap<i64, (String, String, Option<String>)>,
    /// id -> (contact, status, additional attributes).
    conversations: HashMap<i64, (i64, String, Value)>,
    messages: HashMap<i64, Vec<Posted>>,
}

struct Shared {
    token: String,
    inbox: i64,
    down: AtomicBool,
    books: Mutex<Books>,
}

pub struct FakeChatwoot {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

type Answer = Result<Json<Value>, StatusCode>;

impl FakeChatwoot {
    /// A fake holding account `1`'s inbox `inbox`, taking `token`.
    pub async fn start(token: &str, inbox: i64) -> FakeChatwoot {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake Chatwoot");
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            inbox,
            down: AtomicBool::new(false),
            books: Mutex::new(Books::default()),
        });
        let app = axum::Router::new()
            .route("/api/v1/accounts/1/inboxes/{id}", get(inbox_named))
            .route("/api/v1/accounts/1/contacts/search", get(search))
            .route("/api/v1/accounts/1/contacts", post(create_contact))
            .route(
                "/api/v1/accounts/1/contacts/{id}/contact_inboxes",
                post(contact_inbox),
            )
            .route(
                "/api/v1/accounts/1/contacts/{id}/conversations",
                get(contact_conversations),
            )
            .route(
                "/api/v1/accounts/1/conversations",
                post(create_conversation),
            )
            .route(
                "/api/v1/accounts/1/conversations/{id}/messages",
                post(create_message),
            )
            .with_state(shared.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeChatwoot { shared, addr }
    }

    /// The base URL to configure (`handoff.chatwoot.base_url`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Down: every call answers 503 until brought back.
    pub fn set_down(&self, down: bool) {
        self.shared.down.store(down, Ordering::SeqCst);
    }

    /// Every conversation's id, in the order opened.
    pub fn conversations(&self) -> Vec<i64> {
        let books = lock(&self.shared.books);
        let mut ids: Vec<i64> = books.conversations.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// The contact (identifier, name, phone) of conversation `id`.
    pub fn contact_of(&self, id: i64) -> Option<(String, String, Option<String>)> {
        let books = lock(&self.shared.books);
        let (contact, ..) = books.conversations.get(&id)?;
        books.contacts.get(contact).cloned()
    }

    /// What was posted into conversation `id`, in order.
    pub fn messages(&self, id: i64) -> Vec<Posted> {
        lock(&self.shared.books)
            .messages
            .get(&id)
            .cloned()
            .unwrap_or_default()
    }

    /// A `message_created` webhook for an agent's public reply in conversation `id`.
    pub fn agent_reply(conversation: i64, message: i64, text: &str) -> Vec<u8> {
        json!({
            "event": "message_created", "id": message, "content": text,
            "message_type": "outgoing", "private": false, "content_attributes": {},
            "sender": {"id": 3, "name": "Ada", "type": "user"},
            "conversation": {"id": conversation, "status": "open"},
            "account": {"id": 1},
        })
        .to_string()
        .into_bytes()
    }

    /// A `conversation_status_changed` webhook: conversation `id` resolved.
    pub fn resolved(conversation: i64) -> Vec<u8> {
        json!({"event": "conversation_status_changed", "id": conversation, "status": "resolved"})
            .to_string()
            .into_bytes()
    }
}

/// `body` signed with `secret` at `seconds`, as Chatwoot posts it: the headers to send
/// (`X-Chatwoot-Signature`, the HMAC-SHA256 of `<timestamp>.<body>`).
pub fn signed_headers(secret: &str, seconds: i64, body: &[u8]) -> [(&'static str, String); 2] {
    let mut signed = format!("{seconds}.").into_bytes();
    signed.extend_from_slice(body);
    let signature = sign(&SecretString::from(secret.to_owned()), &signed);
    [
        ("x-chatwoot-timestamp", seconds.to_string()),
        ("x-chatwoot-signature", signature),
    ]
}

fn lock(books: &Mutex<Books>) -> std::sync::MutexGuard<'_, Books> {
    books.lock().unwrap_or_else(|e| e.into_inner())
}

/// The token is right and the fake is up.
fn admitted(shared: &Shared, headers: &HeaderMap) -> Result<(), StatusCode> {
    if shared.down.load(Ordering::SeqCst) {
        return Err(StatusCode::SERVICE_UNAVAILABLE);
    }
    let token = headers
        .get("api_access_token")
        .and_then(|v| v.to_str().ok());
    if token != Some(shared.token.as_str()) {
        return Err(StatusCode::UNAUTHORIZED);
    }
    Ok(())
}

async fn inbox_named(
    State(s): State<Arc<Shared>>,
    Path(id): Path<i64>,
    headers: HeaderMap,
) -> Answer {
    admitted(&s, &headers)?;
    if id != s.inbox {
        return Err(StatusCode::NOT_FOUND);
    }
    Ok(Json(
        json!({"id": id, "name": "Sabi hand-offs", "channel_type": "Channel::Api"}),
    ))
}

async fn search(
    State(s): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Answer {
    admitted(&s, &headers)?;
    let q = query.get("q").cloned().unwrap_or_default();
    let books = lock(&s.books);
    let found: Vec<Value> = books
        .contacts
        .iter()
        .filter(|(_, (identifier, ..))| *identifier == q)
        .map(
            |(id, (identifier, name, _))| json!({"id": id, "identifier": identifier, "name": name}),
        )
        .collect();
    Ok(Json(json!({"payload": found})))
}

async fn create_contact(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Answer {
    admitted(&s, &headers)?;
    let mut books = lock(&s.books);
    books.next_id += 1;
    let id = books.next_id;
    let identifier = body["identifier"].as_str().unwrap_or_default().to_owned();
    let name = body["name"].as_str().unwrap_or_default().to_owned();
    let phone = body["phone_number"].as_str().map(str::to_owned);
    books.contacts.insert(id, (identifier.clone(), name, phone));
    Ok(Json(json!({"payload": {
        "contact": {"id": id, "identifier": identifier},
        "contact_inbox": {"source_id": format!("src-{id}"), "inbox": {"id": s.inbox}},
    }})))
}

async fn contact_inbox(
    State(s): State<Arc<Shared>>,
    Path(id): Path<i64>,
    headers: HeaderMap,
) -> Answer {
    admitted(&s, &headers)?;
    Ok(Json(
        json!({"source_id": format!("src-{id}"), "inbox": {"id": s.inbox}}),
    ))
}

async fn contact_conversations(
    State(s): State<Arc<Shared>>,
    Path(id): Path<i64>,
    headers: HeaderMap,
) -> Answer {
    admitted(&s, &headers)?;
    let books = lock(&s.books);
    let listed: Vec<Value> = books
        .conversations
        .iter()
        .filter(|(_, (contact, ..))| *contact == id)
        .map(|(c, (_, status, attributes))| {
            json!({"id": c, "inbox_id": s.inbox, "status": status,
                   "additional_attributes": attributes})
        })
        .collect();
    Ok(Json(json!({"payload": listed})))
}

async fn create_conversation(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Answer {
    admitted(&s, &headers)?;
    let mut books = lock(&s.books);
    let contact = body["contact_id"]
        .as_i64()
        .ok_or(StatusCode::UNPROCESSABLE_ENTITY)?;
    if !books.contacts.contains_key(&contact) || body["inbox_id"].as_i64() != Some(s.inbox) {
        return Err(StatusCode::UNPROCESSABLE_ENTITY);
    }
    books.next_id += 1;
    let id = books.next_id;
    let attributes = body["additional_attributes"].clone();
    books
        .conversations
        .insert(id, (contact, "open".into(), attributes));
    Ok(Json(
        json!({"id": id, "inbox_id": s.inbox, "status": "open"}),
    ))
}

/// A message, as JSON or, with a file, as `multipart/form-data` (`attachments[]`).
async fn create_message(
    State(s): State<Arc<Shared>>,
    Path(id): Path<i64>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    admitted(&s, &headers)?;
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let (fields, attachment) = match content_type.split_once("boundary=") {
        Some((_, boundary)) => form(&body, boundary).ok_or(StatusCode::BAD_REQUEST)?,
        None => (
            serde_json::from_slice(&body).map_err(|_| StatusCode::BAD_REQUEST)?,
            None,
        ),
    };
    let mut books = lock(&s.books);
    if !books.conversations.contains_key(&id) {
        return Err(StatusCode::NOT_FOUND);
    }
    books.next_id += 1;
    let message = Posted {
        id: books.next_id,
        content: fields["content"].as_str().unwrap_or_default().to_owned(),
        message_type: fields["message_type"]
            .as_str()
            .ok_or(StatusCode::UNPROCESSABLE_ENTITY)?
            .to_owned(),
        private: fields["private"] == true || fields["private"] == "true",
        attachment,
    };
    let posted = message.id;
    books.messages.entry(id).or_default().push(message);
    Ok(Json(json!({"id": posted, "conversation_id": id})))
}

/// A multipart form's text fields, and its file: what Chatwoot's Rails parser would give.
fn form(body: &[u8], boundary: &str) -> Option<(Value, Option<File>)> {
    let delimiter = format!("--{}", boundary.trim_matches('"'));
    let mut fields = serde_json::Map::new();
    let mut file = None;
    for part in split(body, delimiter.as_bytes()) {
        let part = part.strip_prefix(b"\r\n")?;
        let Some(at) = find(part, b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&part[..at]).to_string();
        let data = part[at + 4..].strip_suffix(b"\r\n")?;
        let quoted = |key: &str| {
            let start = head.find(&format!("{key}=\""))? + key.len() + 2;
            let end = head[start..].find('"')? + start;
            Some(head[start..end].to_owned())
        };
        let name = quoted("name")?;
        match quoted("filename") {
            // Chatwoot takes files under `attachments[]` only.
            Some(file_name) if name == "attachments[]" => {
                let kind = head
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("content-type: ")
                            .or(l.strip_prefix("Content-Type: "))
                    })
                    .unwrap_or_default()
                    .to_owned();
                file = Some((file_name, kind, data.to_vec()));
            }
            Some(_) => {}
            None => {
                let text = String::from_utf8_lossy(data).to_string();
                fields.insert(name, Value::String(text));
            }
        }
    }
    Some((Value::Object(fields), file))
}

/// The parts between the delimiters, the preamble and the closing `--` left out.
fn split<'a>(body: &'a [u8], delimiter: &[u8]) -> Vec<&'a [u8]> {
    let mut parts = Vec::new();
    let mut rest = body;
    while let Some(at) = find(rest, delimiter) {
        parts.push(&rest[..at]);
        rest = &rest[at + delimiter.len()..];
    }
    parts.into_iter().skip(1).collect()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl FakeChatwoot {
    /// Marks conversation `id` resolved, as an agent resolving it in Chatwoot does.
    pub fn resolve(&self, id: i64) {
        if let Some(conversation) = lock(&self.shared.books).conversations.get_mut(&id) {
            conversation.1 = "resolved".into();
        }
    }
}
