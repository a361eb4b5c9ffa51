//! Store: the only place state lives.
//!
//! One interface, several backends (SQLite embedded by default). Operations are at the level of
//! the pipeline ("ingest this delivery", "list the inbox"), never rows or SQL, so that every
//! backend can make each one atomic: an [`Store::ingest`] either keeps all of a delivery, with
//! its deduplication and scheduling, or nothing, and returns only once the delivery is as
//! durable as the backend makes it. That is what lets the ingress acknowledge after it.
//!
//! Driver errors never cross this interface: each backend maps them into [`Error`].

mod sqlite;

use std::sync::Arc;

use async_trait::async_trait;

pub use self::sqlite::SqliteStore;
use crate::config::StoreConfig;
use crate::domain::{BatchPolicy, Channel, InboundItem, ItemKind, Quarantined};

/// Errors every backend reports the same way.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The backend cannot be reached or cannot commit: retry later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store's schema is older or newer than this build expects.
    #[error("store schema: {0}")]
    Schema(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One delivery to keep: everything in it is stored in one atomic, durable step.
#[derive(Debug, Clone)]
pub struct Ingest {
    pub items: Vec<InboundItem>,
    pub quarantined: Vec<Quarantined>,
    /// When the delivery arrived, Unix milliseconds.
    pub received_at_ms: i64,
    /// When the conversations this delivery touches become due.
    pub policy: BatchPolicy,
}

/// What an ingest did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IngestReceipt {
    /// Items stored for the first time.
    pub stored: usize,
    /// Items already stored with the same content: changed nothing.
    pub duplicates: usize,
    /// Items already stored under the same key with other content: logged, changed nothing.
    pub anomalies: usize,
    pub quarantined: usize,
}

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
    pub received_at_ms: i64,
    /// `pending` (waits for a turn), `skipped` (deliberately not a turn) or `recorded`.
    pub state: String,
}

/// A raw piece of a delivery that Sabi could not understand.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredQuarantine {
    pub id: i64,
    pub received_at_ms: i64,
    pub quarantined: Quarantined,
}

/// The store interface, held as `Arc<dyn Store>`.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Appends a delivery's items deduplicated on (channel, dedupe key), records its statuses
    /// and quarantined parts, and schedules each conversation it wakes. Atomic and durable.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when nothing could be committed: nothing of the delivery is kept.
    async fn ingest(&self, delivery: Ingest) -> Result<IngestReceipt>;

    /// Stored items in arrival order.
    async fn inbox(&self, query: InboxQuery) -> Result<Vec<StoredItem>>;

    /// Quarantined raw parts in arrival order.
    async fn quarantine(&self, limit: Option<usize>) -> Result<Vec<StoredQuarantine>>;

    /// Succeeds when the store is reachable and its schema is current.
    async fn ready(&self) -> Result<()>;
}

/// Opens the configured backend, creating and migrating it when needed.
///
/// # Errors
/// When the backend cannot be opened or migrated.
pub async fn open(config: &StoreConfig) -> Result<Arc<dyn Store>> {
    match config {
        StoreConfig::Sqlite { path } => Ok(Arc::new(SqliteStore::open(path).await?)),
    }
}
