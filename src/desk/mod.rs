//! Hand-offs into the help desk a business already runs: Chatwoot (`[handoff.chatwoot]`), or
//! any desk that takes signed JSON (`[handoff.webhook]`).
//!
//! Sabi's own desk keeps every hand-off; the mirror copies each open review item into the help
//! desk as well, one node at a time under a lease: the first item of a conversation opens a
//! thread there with the transcript (the customer's words and Sabi's replies) and hands the
//! conversation to it ([`Desk::open_desk_thread`](crate::store::Desk::open_desk_thread): from
//! then on Sabi never answers the customer itself); every item tells the agents why it was
//! handed over, and the customer's messages follow as they come. The agents' replies come back
//! through `POST /webhook/chatwoot` or `POST /webhook/desk` (`ingress::desk`), and resolving the
//! thread gives the customer back to the assistant.
//!
//! Nothing waits for the desk: when it is away or refuses, the item stays on Sabi's own desk
//! and the next round tries again. A message is delivered at least once: one delivered just
//! before a crash is delivered again by the next node (the generic webhook's events carry an
//! `id` for the desk to drop repeats by).

pub mod chatwoot;
pub mod webhook;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use secrecy::SecretString;
use tokio_util::sync::CancellationToken;

use crate::clock::{At, SharedClock};
use crate::config::HandoffConfig;
use crate::domain::{BatchMessage, Channel, ConversationKey};
use crate::metrics::Metrics;
use crate::runner::{Periodic, Runner};
use crate::store::rules::identity;
use crate::store::{self, ReviewEntry, ReviewState, Speaker, Store, Subject};
use crate::whatsapp::graph::{Graph, GraphError};
use crate::whatsapp::{sign, verify};

/// The lease one node mirrors under.
const LEASE: &str = "desk";
/// The shortest lease: an item's few calls to the desk, each within its 10 s timeout.
const LEASE_AT_LEAST: Duration = Duration::from_secs(60);
/// Items mirrored per round at most.
const PAGE: usize = 200;
/// How much of the conversation's history a new thread starts with.
const TRANSCRIPT_TURNS: usize = 20;
/// The longest wait between two tries while the desk is down.
const MAX_PAUSE: Duration = Duration::from_secs(5 * 60);
/// The oldest signed delivery taken, by its signed timestamp.
pub const MAX_AGE: Duration = Duration::from_secs(5 * 60);

/// What went wrong talking to a desk.
#[derive(Debug, thiserror::Error)]
pub enum DeskError {
    #[error("the desk could not be reached: {0}")]
    Unreachable(String),
    #[error("the desk answered {status}: {body}")]
    Refused { status: u16, body: String },
    #[error("the desk's answer was not what its API documents: {0}")]
    Unexpected(String),
}

impl DeskError {
    /// The desk itself is away or failing, not refusing one item: the round stops.
    fn is_down(&self) -> bool {
        match self {
            DeskError::Unreachable(_) => true,
            DeskError::Refused { status, .. } => *status >= 500 || *status == 429,
            DeskError::Unexpected(_) => false,
        }
    }
}

/// The customer a thread is about, as a desk shows them.
#[derive(Debug, Clone)]
pub struct Customer {
    pub conversation: ConversationKey,
    pub name: String,
    /// Their number, once Meta has shown it (`None` on web chat).
    pub phone: Option<String>,
}

/// A line of the transcript a thread starts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// True for the customer's words, false for Sabi's replies.
    pub customer: bool,
    pub text: String,
}

/// A customer's media, fetched from Meta for the desk (Meta's own links need the business's
/// token and expire within minutes, so they are no use to an agent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub mime_type: String,
    pub bytes: Vec<u8>,
}

impl Attachment {
    /// A file name for `media` of this type: `image-<id>.jpeg`.
    pub fn file_name(&self, kind: &str, media: &str) -> String {
        let subtype = self.mime_type.split(['/', ';']).nth(1).unwrap_or("bin");
        let extension: String = subtype
            .trim()
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect();
        format!("{kind}-{media}.{extension}")
    }
}

/// The largest media attached; a larger file is named by its id (WhatsApp's own limits are
/// 16 MB for video and 100 MB for documents).
pub const MAX_ATTACHMENT: u64 = 16 * 1024 * 1024;

/// A thread on the desk, as [`Target::open`] leaves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The store's name for it (`chatwoot:<id>`, `webhook:<id>`).
    pub thread: String,
    /// The desk's ids of the messages Sabi wrote there, as its replies would be named: claimed,
    /// so that none comes back as an agent's reply.
    pub written: Vec<String>,
}

/// A help desk hand-offs go to.
#[async_trait]
pub trait Target: Send + Sync + 'static {
    /// Whether `thread` is one of this desk's (a thread of another desk, configured before,
    /// is replaced by a new one).
    fn owns(&self, thread: &str) -> bool;

    /// A thread for the customer's conversation, started with `transcript`, for hand-off
    /// `item`. Asked again for the same conversation (a retry after a crash), it gives the same
    /// thread and writes no second transcript.
    async fn open(
        &self,
        customer: &Customer,
        item: i64,
        transcript: &[Line],
    ) -> Result<Opened, DeskError>;

    /// Tells the agents why review item `item` was handed over.
    async fn handed_over(&self, thread: &str, item: &ReviewEntry) -> Result<(), DeskError>;

    /// The customer's message `message`, of review item `item`, with its media when Sabi
    /// could fetch it.
    async fn message(
        &self,
        thread: &str,
        item: i64,
        message: &BatchMessage,
        attachment: Option<&Attachment>,
    ) -> Result<(), DeskError>;

    /// Something only the agents should read.
    async fn notice(&self, thread: &str, text: &str) -> Result<(), DeskError>;
}

/// What a desk's webhook asks of Sabi.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An agent wrote to the customer: send it, once per `message`.
    Reply {
        thread: String,
        message: String,
        text: String,
    },
    /// The thread was resolved: the customer is the assistant's again.
    Resolved { thread: String },
    /// Anything else: private notes, Sabi's own messages, other events.
    Ignored,
}

/// Why a signed delivery was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the timestamp header is missing or not Unix seconds")]
    NoTime,
    #[error("the timestamp is more than five minutes away: a stale or replayed delivery")]
    Stale,
    #[error("the signature does not match the body")]
    Signature,
}

/// Checks a delivery's signature (`sha256=<hex>`, the HMAC-SHA256 of `<timestamp>.<body>`)
/// and its age at `now`: Chatwoot signs its webhooks so, and Sabi and the desks on
/// `[handoff.webhook]` sign theirs the same way.
///
/// # Errors
/// What was wrong, for the 401 answer.
pub fn check(
    secret: &SecretString,
    timestamp: Option<&str>,
    signature: Option<&[u8]>,
    body: &[u8],
    now: At,
) -> Result<(), Refused> {
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

/// The headers' values for `body` signed at `seconds`: (timestamp, signature).
pub fn signature(secret: &SecretString, seconds: i64, body: &[u8]) -> (String, String) {
    (seconds.to_string(), sign(secret, &signed(seconds, body)))
}

fn signed(seconds: i64, body: &[u8]) -> Vec<u8> {
    let mut signed = format!("{seconds}.").into_bytes();
    signed.extend_from_slice(body);
    signed
}

/// The most of a desk's answer read: its answers to Sabi's calls are a few kilobytes.
const MAX_ANSWER: usize = 1 << 20;

/// A desk's answer: its body (the first [`MAX_ANSWER`] bytes) when it is 2xx.
///
/// # Errors
/// [`DeskError::Refused`] with the start of the body otherwise; `Unreachable` when the body
/// breaks off.
async fn answer(mut response: reqwest::Response) -> Result<Vec<u8>, DeskError> {
    let status = response.status();
    let mut body = Vec::new();
    while body.len() < MAX_ANSWER {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => break,
            Err(e) => return Err(DeskError::Unreachable(e.to_string())),
        }
    }
    // The last chunk may run past the cap.
    body.truncate(MAX_ANSWER);
    if !status.is_success() {
        return Err(DeskError::Refused {
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body).chars().take(200).collect(),
        });
    }
    Ok(body)
}

/// The note that tells the agents why `item` was handed over.
fn handed_over_note(item: &ReviewEntry) -> String {
    format!(
        "Handed over by Sabi ({}){}. Review item #{} on Sabi's desk. Reply here to answer the \
         customer; resolve the conversation to give them back to the assistant.",
        item.reason.as_str().replace('_', " "),
        item.error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default(),
        item.id
    )
}

/// A message as a line of text: its words (a caption), else its kind and media id when the
/// media is not attached.
fn message_text(m: &BatchMessage, attached: bool) -> String {
    match (&m.text, &m.media_id) {
        (Some(text), _) => text.clone(),
        (None, _) if attached => String::new(),
        (None, Some(media)) => format!("[{} {media}]", kind_of(m)),
        (None, None) => format!("[{}]", kind_of(m)),
    }
}

fn kind_of(m: &BatchMessage) -> &str {
    m.item_type.as_deref().unwrap_or("message")
}

/// Which kind of help desk is configured: its webhook's path and headers differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chatwoot,
    Webhook,
}

/// The help desk hand-offs go to, as configured: what the mirror writes to, and the secret its
/// webhooks are signed with.
#[derive(Clone)]
pub struct HelpDesk {
    pub kind: Kind,
    pub target: Arc<dyn Target>,
    pub secret: SecretString,
    pub mirror_every: Duration,
}

impl HelpDesk {
    /// The desk `[handoff]` names, if any.
    ///
    /// # Errors
    /// When its HTTP client cannot be built.
    pub fn from_config(
        handoff: &HandoffConfig,
        clock: SharedClock,
    ) -> reqwest::Result<Option<HelpDesk>> {
        if let Some(c) = &handoff.chatwoot {
            return Ok(Some(HelpDesk {
                kind: Kind::Chatwoot,
                target: Arc::new(chatwoot::Chatwoot::new(c)?),
                secret: c.webhook_secret.clone(),
                mirror_every: c.mirror_every,
            }));
        }
        if let Some(w) = &handoff.webhook {
            return Ok(Some(HelpDesk {
                kind: Kind::Webhook,
                target: Arc::new(webhook::DeskWebhook::new(w, clock)?),
                secret: w.secret.clone(),
                mirror_every: w.mirror_every,
            }));
        }
        Ok(None)
    }
}

pub struct Mirror {
    store: Arc<dyn Store>,
    target: Arc<dyn Target>,
    /// Fetches WhatsApp media to attach; none in sandbox mode.
    graph: Option<Graph>,
    clock: SharedClock,
    every: Duration,
    /// This node's name on the lease.
    holder: String,
    metrics: Arc<Metrics>,
    /// Rounds that failed in a row, and when the next may go: a desk that is down is asked
    /// again after a wait that doubles, up to [`MAX_PAUSE`].
    backoff: Mutex<(u32, At)>,
}

impl Mirror {
    pub fn new(
        store: Arc<dyn Store>,
        desk: &HelpDesk,
        graph: Option<Graph>,
        clock: SharedClock,
        metrics: Arc<Metrics>,
    ) -> Arc<Mirror> {
        let holder = format!("{}-{:016x}", std::process::id(), fastrand::u64(..));
        Arc::new(Mirror {
            store,
            target: desk.target.clone(),
            graph,
            clock,
            every: desk.mirror_every,
            holder,
            metrics,
            backoff: Mutex::new((0, At::default())),
        })
    }

    /// Mirrors every `every` until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let runner = Runner {
            clock: self.clock.clone(),
            slots: 1,
            poll_interval: self.every,
            shutdown_grace: Duration::from_secs(5),
        };
        runner.every(self.every, self.clone(), shutdown).await;
    }

    /// One round: what the desk has not seen of the open review items goes to it. The items
    /// mirrored, or `None` when another node holds the lease.
    ///
    /// # Errors
    /// When the store cannot be read; an item the desk refused is counted and left for the
    /// next round.
    pub async fn mirror(&self) -> store::Result<Option<usize>> {
        let now = self.clock.now();
        if now < self.backoff().1 {
            return Ok(Some(0));
        }
        if !self.lease().await? {
            // Another node mirrors, and says how it goes.
            self.metrics.desk_failing.set(0);
            return Ok(None);
        }
        let mut moved = 0;
        let mut failed = false;
        for (id, done) in self.store.desk_pending(PAGE).await? {
            let Some(item) = self.store.review_item(id).await? else {
                continue;
            };
            // Settled since it was listed (resolved on the desk, or on Sabi's own).
            if item.state != ReviewState::Open {
                continue;
            }
            if !self.lease().await? {
                break;
            }
            match self.item(&item, done).await {
                Ok(()) => {
                    moved += 1;
                    Metrics::count(&self.metrics.desk, "mirrored");
                }
                Err(e) => {
                    failed = true;
                    Metrics::count(&self.metrics.desk, "failed");
                    tracing::warn!(item = item.id, error.message = %e, "mirroring a hand-off to the help desk failed; it stays on Sabi's desk and is tried again");
                    if matches!(&e, MirrorError::Desk(e) if e.is_down()) {
                        break;
                    }
                }
            }
        }
        self.metrics.desk_failing.set(i64::from(failed));
        let mut backoff = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
        *backoff = match failed {
            true => {
                let pause = self
                    .every
                    .saturating_mul(2u32.saturating_pow(backoff.0 + 1));
                (backoff.0 + 1, now + pause.min(MAX_PAUSE))
            }
            false => (0, At::default()),
        };
        Ok(Some(moved))
    }

    /// Takes or keeps the lease: long enough for an item's calls to the desk, each bounded
    /// by their timeout, and taken again before every item.
    async fn lease(&self) -> store::Result<bool> {
        let hold = (self.every * 3).max(LEASE_AT_LEAST);
        self.store
            .hold_lease(LEASE, &self.holder, self.clock.now(), hold)
            .await
    }

    fn backoff(&self) -> (u32, At) {
        *self.backoff.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Item `item` in its conversation's thread: opened first when the conversation has none,
    /// the agents told why when the item is new, its messages after `done`.
    async fn item(&self, item: &ReviewEntry, done: Option<i64>) -> Result<(), MirrorError> {
        let key = &item.conversation;
        let open = self
            .store
            .desk_thread(key)
            .await?
            .filter(|t| t.open && self.target.owns(&t.thread));
        let thread = match open {
            Some(open) => {
                if done.is_none() {
                    // Settled on Sabi's own desk since, the conversation went back to the
                    // assistant: this hand-off gives it to the desk's thread again.
                    self.store.open_desk_thread(key, &open.thread).await?;
                }
                open.thread
            }
            None => self.open(item).await?,
        };
        if done.is_none() {
            self.target.handed_over(&thread, item).await?;
            // Told: a failure further on does not tell the agents twice.
            self.store.set_desk_mirrored(item.id, 0).await?;
        }
        // By arrival, each recorded as it goes: a failure posts no message twice.
        let mut fresh: Vec<&BatchMessage> = item
            .messages
            .iter()
            .filter(|m| Some(m.seq) > done)
            .collect();
        fresh.sort_by_key(|m| m.seq);
        for m in fresh {
            let attachment = self.attachment(key, m).await?;
            self.target
                .message(&thread, item.id, m, attachment.as_ref())
                .await?;
            self.store.set_desk_mirrored(item.id, m.seq).await?;
        }
        Ok(())
    }

    /// The message's media from Meta, when it has some and this node can fetch it. Meta
    /// away is tried again next round; media Meta no longer has, or too large, goes by its id.
    async fn attachment(
        &self,
        key: &ConversationKey,
        m: &BatchMessage,
    ) -> Result<Option<Attachment>, MirrorError> {
        let (Some(graph), Some(media)) = (&self.graph, &m.media_id) else {
            return Ok(None);
        };
        if key.channel != Channel::Whatsapp {
            return Ok(None);
        }
        let fetched = match graph.media(media).await {
            Ok(info) => graph
                .download(&info.url, MAX_ATTACHMENT)
                .await
                .map(|bytes| Attachment {
                    mime_type: info.mime_type,
                    bytes,
                }),
            Err(e) => Err(e),
        };
        match fetched {
            Ok(attachment) => Ok(Some(attachment)),
            Err(GraphError::TooLarge(_)) => Ok(None),
            Err(GraphError::Api { status, .. }) if status < 500 && status != 429 => {
                tracing::warn!(
                    media,
                    status,
                    "the customer's media could not be fetched from Meta; the desk gets its id"
                );
                Ok(None)
            }
            Err(e) => Err(MirrorError::Media(e)),
        }
    }

    /// A thread for the item's conversation with its transcript, and the store's hold for it:
    /// the thread.
    async fn open(&self, item: &ReviewEntry) -> Result<String, MirrorError> {
        let key = &item.conversation;
        let customer = self.customer(key).await?;
        let own: Vec<&str> = item
            .messages
            .iter()
            .filter_map(|m| m.text.as_deref())
            .collect();
        let views = self
            .store
            .conversations(&key.customer, TRANSCRIPT_TURNS)
            .await?;
        let history = views
            .into_iter()
            .find(|v| v.conversation == *key)
            .map(|v| v.history)
            .unwrap_or_default();
        let transcript: Vec<Line> = history
            .into_iter()
            .filter_map(|line| match line.speaker {
                // The item's own messages follow as they come.
                Speaker::Customer if own.contains(&line.text.as_str()) => None,
                Speaker::Customer | Speaker::Business => Some(Line {
                    customer: line.speaker == Speaker::Customer,
                    text: line.text,
                }),
                Speaker::Note => None,
            })
            .collect();
        let opened = self.target.open(&customer, item.id, &transcript).await?;
        let now = self.clock.now();
        for written in &opened.written {
            self.store.claim_desk_message(written, now).await?;
        }
        self.store.open_desk_thread(key, &opened.thread).await?;
        Ok(opened.thread)
    }

    /// How the desk shows the customer, and their number when Meta has shown it.
    async fn customer(&self, key: &ConversationKey) -> store::Result<Customer> {
        let (name, phone) = match key.channel {
            Channel::Webchat => (format!("Web visitor {}", short(&key.customer)), None),
            Channel::Whatsapp => {
                let subject = Subject {
                    channel: Channel::Whatsapp,
                    customer: key.customer.clone(),
                };
                let linked = self.store.linked_ids(&subject).await?;
                let number = identity::address(&key.customer, &linked);
                let phone = (!identity::is_bsuid(number)).then(|| number.to_owned());
                (format!("WhatsApp {}", key.customer), phone)
            }
        };
        Ok(Customer {
            conversation: key.clone(),
            name,
            phone,
        })
    }
}

/// What stopped an item's mirroring this round.
#[derive(Debug, thiserror::Error)]
enum MirrorError {
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error(transparent)]
    Desk(#[from] DeskError),
    #[error("fetching the customer's media from Meta: {0}")]
    Media(GraphError),
}

/// The first characters of a session id: enough to tell visitors apart.
fn short(id: &str) -> &str {
    id.char_indices().nth(8).map_or(id, |(at, _)| &id[..at])
}

#[async_trait]
impl Periodic for Mirror {
    const JOBS: &'static str = "desk mirrors";

    async fn round(&self) {
        if let Err(e) = self.mirror().await {
            tracing::warn!(error.message = %e, "mirroring hand-offs to the help desk failed; trying again later");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: At = At::from_millis(1_781_000_000_000);

    #[test]
    fn a_delivery_is_taken_only_signed_and_fresh() {
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
}
