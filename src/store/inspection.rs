//! What people and the admin API read: the inbox, quarantine, conversations and gauges.

use async_trait::async_trait;

use super::rules::item::ItemState;
use super::{OutboxEntry, Result, RoutedTurn, TurnStats};
use crate::clock::At;
use crate::domain::{Channel, ConversationKey, InboundItem, ItemKind, Quarantined};

/// Which stored items to list.
#[derive(Debug, Clone, Default)]
pub struct InboxQuery {
    pub kind: Option<ItemKind>,
    pub channel: Option<Channel>,
    /// Only items after this sequence number.
    pub after: Option<i64>,
    pub limit: Option<usize>,
}

/// An inbound item as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredItem {
    /// Arrival order across the whole store.
    pub seq: i64,
    pub item: InboundItem,
    pub received_at: At,
    pub state: ItemState,
    /// The batch it was answered in, once claimed.
    pub batch: Option<i64>,
}

/// A raw piece of a delivery that Sabi could not understand.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredQuarantine {
    pub id: i64,
    pub received_at: At,
    pub quarantined: Quarantined,
}

/// Who said something in a conversation's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speaker {
    Customer,
    /// A reply Sabi sent (or kept, in sandbox mode).
    Business,
    /// A note: the conversation went to a person, and why.
    Note,
}

impl Speaker {
    pub fn as_str(self) -> &'static str {
        match self {
            Speaker::Customer => "customer",
            Speaker::Business => "business",
            Speaker::Note => "note",
        }
    }
}

/// One line of a conversation's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    pub at: At,
    pub speaker: Speaker,
    pub text: String,
}

/// A conversation and what was said in it, for people.
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationView {
    pub conversation: ConversationKey,
    /// When the customer last wrote (the 24-hour window starts there).
    pub last_inbound_at: Option<At>,
    pub history: Vec<HistoryEntry>,
}

/// How many messages Meta priced in one category, for numbers with one prefix, charged or not.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize)]
pub struct PriceCount {
    pub category: String,
    pub prefix: String,
    pub billed: bool,
    pub messages: u64,
}

/// Counts of the pipeline's state now, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Conversations whose batch is due and not yet claimed.
    pub due: u64,
    /// Batches held by a worker.
    pub running: u64,
    /// Batches waiting for a retry.
    pub waiting: u64,
    /// Open review items.
    pub review: u64,
    /// Reply parts waiting to be sent.
    pub queued_sends: u64,
    /// Sends whose outcome is unknown.
    pub unknown_sends: u64,
}

/// What operators read: the inbox, quarantine, outbox, turn statistics and the pipeline's counts.
#[async_trait]
pub trait Inspection: Send + Sync + 'static {
    /// Stored items in arrival order.
    async fn inbox(&self, query: InboxQuery) -> Result<Vec<StoredItem>>;

    /// Quarantined raw parts in arrival order.
    async fn quarantine(&self, limit: Option<usize>) -> Result<Vec<StoredQuarantine>>;

    /// Outbox rows in the order they were written.
    async fn outbox(&self, limit: Option<usize>) -> Result<Vec<OutboxEntry>>;

    /// Turns that ended since `since`.
    async fn turn_stats(&self, since: At) -> Result<TurnStats>;

    /// The pipeline's counts now.
    async fn gauges(&self, now: At) -> Result<Gauges>;

    /// Turns that ended since `since` and that the router guessed at, the latest first, at
    /// most `limit` of them.
    async fn routed_turns(&self, since: At, limit: usize) -> Result<Vec<RoutedTurn>>;

    /// The messages Meta priced from the hour `since` falls in
    /// ([`price`](super::rules::price)), by category, prefix and whether charged.
    async fn price_counts(&self, since: At) -> Result<Vec<PriceCount>>;
}
