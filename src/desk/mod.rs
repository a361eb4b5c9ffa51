//! Hand-offs into the help desk a business already runs (Chatwoot, `[handoff.chatwoot]`).
//!
//! Sabi's own desk keeps every hand-off; the mirror copies each open review item into the help
//! desk as well, one node at a time under a lease: the first item of a conversation opens a
//! Chatwoot conversation with the transcript (the customer's words incoming, Sabi's replies
//! outgoing) and hands the conversation to it ([`Desk::open_desk_thread`](crate::store::Desk::open_desk_thread): from then on Sabi
//! never answers the customer itself); every item adds a private note with its reason, and the
//! customer's messages follow as they come. The agent's replies come back through
//! `POST /webhook/chatwoot` (`ingress::chatwoot`), and resolving the conversation in Chatwoot
//! gives the customer back to the assistant.
//!
//! Nothing waits for Chatwoot: when it is away or refuses, the item stays on Sabi's own desk
//! and the next round tries again. A message is posted at least once: one posted just before a
//! crash is posted again by the next node.

pub mod chatwoot;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use self::chatwoot::{Chatwoot, ChatwootError, Posted};
use crate::clock::{At, SharedClock};
use crate::domain::{Channel, ConversationKey};
use crate::metrics::Metrics;
use crate::runner::{Periodic, Runner};
use crate::store::rules::identity;
use crate::store::{self, ReviewEntry, ReviewQuery, Speaker, Store, Subject};

/// The lease one node mirrors under.
const LEASE: &str = "desk";
/// Open items read per round.
const PAGE: usize = 200;
/// How much of the conversation's history a new Chatwoot conversation starts with.
const TRANSCRIPT_TURNS: usize = 20;

/// What stopped an item's mirroring this round.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error(transparent)]
    Chatwoot(#[from] ChatwootError),
}

impl MirrorError {
    /// Chatwoot itself is away or failing, not refusing this one item: the round stops.
    fn is_down(&self) -> bool {
        match self {
            MirrorError::Chatwoot(ChatwootError::Unreachable(_)) => true,
            MirrorError::Chatwoot(ChatwootError::Refused { status, .. }) => *status >= 500,
            _ => false,
        }
    }
}

/// The store's name for a Chatwoot conversation.
pub fn thread_of(conversation: i64) -> String {
    format!("chatwoot:{conversation}")
}

fn conversation_of(thread: &str) -> Option<i64> {
    thread.strip_prefix("chatwoot:")?.parse().ok()
}

pub struct Mirror {
    store: Arc<dyn Store>,
    chatwoot: Arc<Chatwoot>,
    clock: SharedClock,
    every: Duration,
    /// This node's name on the lease.
    holder: String,
    metrics: Arc<Metrics>,
    /// Rounds that failed in a row, and when the next may go: Chatwoot down is asked again
    /// after a wait that doubles, up to [`MAX_PAUSE`].
    backoff: Mutex<(u32, At)>,
}

/// The longest wait between two tries while Chatwoot is down.
const MAX_PAUSE: Duration = Duration::from_secs(5 * 60);

impl Mirror {
    pub fn new(
        store: Arc<dyn Store>,
        chatwoot: Arc<Chatwoot>,
        clock: SharedClock,
        every: Duration,
        metrics: Arc<Metrics>,
    ) -> Arc<Mirror> {
        let holder = format!("{}-{:016x}", std::process::id(), fastrand::u64(..));
        Arc::new(Mirror {
            store,
            chatwoot,
            clock,
            every,
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

    /// One round: every open review item's new part goes to Chatwoot. The items mirrored, or
    /// `None` when another node holds the lease.
    ///
    /// # Errors
    /// When the store cannot be read; an item Chatwoot refused is counted and left for the
    /// next round.
    pub async fn mirror(&self) -> store::Result<Option<usize>> {
        let now = self.clock.now();
        if now < self.backoff().1 {
            return Ok(Some(0));
        }
        if !self
            .store
            .hold_lease(LEASE, &self.holder, now, self.every * 3)
            .await?
        {
            return Ok(None);
        }
        let query = ReviewQuery {
            limit: Some(PAGE),
            ..ReviewQuery::default()
        };
        let items = self.store.review_queue(query).await?;
        let ids: Vec<i64> = items.iter().map(|i| i.id).collect();
        let mirrored = self.store.desk_mirrored(&ids).await?;
        let mut moved = 0;
        let mut failed = false;
        for item in &items {
            let done = mirrored.iter().find(|(id, _)| *id == item.id).map(|m| m.1);
            let fresh = item.messages.iter().any(|m| Some(m.seq) > done);
            if done.is_some() && !fresh {
                continue;
            }
            match self.item(item, done).await {
                Ok(()) => {
                    moved += 1;
                    Metrics::count(&self.metrics.desk, "mirrored");
                }
                Err(e) => {
                    failed = true;
                    Metrics::count(&self.metrics.desk, "failed");
                    tracing::warn!(item = item.id, error.message = %e, "mirroring a hand-off to Chatwoot failed; it stays on Sabi's desk and is tried again");
                    if e.is_down() {
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

    fn backoff(&self) -> (u32, At) {
        *self.backoff.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Item `item` in its Chatwoot conversation: opened first when the conversation has none,
    /// its note when new, its messages after `done`.
    async fn item(&self, item: &ReviewEntry, done: Option<i64>) -> Result<(), MirrorError> {
        let key = &item.conversation;
        let open = self
            .store
            .desk_thread(key)
            .await?
            .filter(|t| t.open)
            .and_then(|t| conversation_of(&t.thread));
        let conversation = match open {
            Some(conversation) => conversation,
            None => self.open(item).await?,
        };
        if done.is_none() {
            let note = format!(
                "Handed over by Sabi ({}){}. Review item #{} on Sabi's desk. Reply here to \
                 answer the customer; resolve the conversation to give them back to the assistant.",
                item.reason.as_str().replace('_', " "),
                item.error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default(),
                item.id
            );
            self.chatwoot
                .post(conversation, &note, Posted::Note)
                .await?;
        }
        let mut last = done.unwrap_or(0);
        for m in item.messages.iter().filter(|m| Some(m.seq) > done) {
            let text = m.text.clone().unwrap_or_else(|| {
                let kind = m.item_type.as_deref().unwrap_or("message");
                match &m.media_id {
                    Some(media) => format!("[{kind} {media}]"),
                    None => format!("[{kind}]"),
                }
            });
            self.chatwoot
                .post(conversation, &text, Posted::Incoming)
                .await?;
            last = last.max(m.seq);
        }
        self.store.set_desk_mirrored(item.id, last).await?;
        Ok(())
    }

    /// A Chatwoot conversation for the item's customer, its transcript, and the store's hold
    /// for it: Chatwoot's id.
    async fn open(&self, item: &ReviewEntry) -> Result<i64, MirrorError> {
        let key = &item.conversation;
        let (name, phone) = self.names(key).await?;
        let conversation = self
            .chatwoot
            .conversation(&key.customer, &name, phone.as_deref())
            .await?;
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
        for line in &history {
            let how = match line.speaker {
                // The item's own messages follow as they come.
                Speaker::Customer if own.contains(&line.text.as_str()) => continue,
                Speaker::Customer => Posted::Incoming,
                Speaker::Business => Posted::Outgoing,
                Speaker::Note => continue,
            };
            self.chatwoot.post(conversation, &line.text, how).await?;
        }
        self.store
            .open_desk_thread(key, &thread_of(conversation))
            .await?;
        Ok(conversation)
    }

    /// How Chatwoot shows the customer, and their number when Meta has shown it.
    async fn names(&self, key: &ConversationKey) -> store::Result<(String, Option<String>)> {
        match key.channel {
            Channel::Webchat => Ok((format!("Web visitor {}", short(&key.customer)), None)),
            Channel::Whatsapp => {
                let subject = Subject {
                    channel: Channel::Whatsapp,
                    customer: key.customer.clone(),
                };
                let linked = self.store.linked_ids(&subject).await?;
                let number = identity::address(&key.customer, &linked);
                let phone = (!identity::is_bsuid(number)).then(|| number.to_owned());
                Ok((format!("WhatsApp {}", key.customer), phone))
            }
        }
    }
}

/// The first characters of a session id: enough to tell visitors apart.
fn short(id: &str) -> &str {
    id.char_indices().nth(8).map_or(id, |(at, _)| &id[..at])
}

#[async_trait::async_trait]
impl Periodic for Mirror {
    const JOBS: &'static str = "desk mirrors";

    async fn round(&self) {
        if let Err(e) = self.mirror().await {
            tracing::warn!(error.message = %e, "mirroring hand-offs to Chatwoot failed; trying again later");
        }
    }
}
