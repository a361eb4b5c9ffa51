//! Store: the only place state lives.
//!
//! One interface, several backends (SQLite embedded by default). Operations are at the level of
//! the pipeline ("ingest this delivery", "list the inbox"), never rows or SQL, so that every
//! backend can make each one atomic: an [`Intake::ingest`] either keeps all of a delivery, with
//! its deduplication and scheduling, or nothing, and returns only once the delivery is as
//! durable as the backend makes it. That is what lets the ingress acknowledge after it.
//!
//! Driver errors never cross this interface: each backend maps them into [`Error`].

mod broadcasts;
mod customers;
mod desk;
mod health;
mod inspection;
mod intake;
mod items;
mod postgres;
mod redis;
mod retention;
mod reviews;
pub mod rules;
mod sending;
mod sql;
mod sqlite;
mod turns;
mod webchat;

use std::sync::Arc;
use std::time::Duration;

pub use self::broadcasts::*;
pub use self::customers::*;
pub use self::desk::*;
pub use self::health::*;
pub use self::inspection::*;
pub use self::intake::*;
pub use self::postgres::PgStore;
pub use self::redis::RedisStore;
pub use self::retention::*;
pub use self::reviews::*;
pub use self::rules::batch::AnsweredBy;
pub use self::rules::broadcast::{
    BroadcastState, Control, Limits, Outcome, PausedBy, RecipientState, SkipReason, TemplateNews,
};
pub use self::rules::category::TemplateCategory;
pub use self::rules::consent::Choice;
pub use self::rules::erasure::{Erased, Marks, Subject};
pub use self::rules::hours::{LocalHours, QuietHours, When};
pub use self::rules::item::{ItemState, JobStatus};
pub use self::rules::part::{Delivery, PartKind, PartState, SendResult, WINDOW_CLOSED};
pub use self::rules::retention::{Horizons, Swept};
pub use self::rules::review::{Resolution, ReviewState};
pub use self::rules::turn::Ending;
pub use self::sending::*;
pub use self::sqlite::SqliteStore;
pub use self::turns::*;
pub use self::webchat::*;
use crate::clock::{At, SharedClock};
use crate::config::{Config, StoreConfig};

/// Errors every backend reports the same way.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The backend cannot be reached or cannot commit: retry later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store's schema is older or newer than this build expects.
    #[error("store schema: {0}")]
    Schema(String),
    /// The lease's token is no longer the batch's latest: another worker holds it now, or the
    /// batch has ended. The write was refused.
    #[error("lease lost: the batch was taken over or has ended")]
    LeaseLost,
    /// No such item (or it is no longer open).
    #[error("not found")]
    NotFound,
    /// Work under way stops the change for now (see [`rules::erasure::busy`]): try again in
    /// a moment.
    #[error("{0}; try again in a moment")]
    Busy(&'static str),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a send puts in `biz_opaque_callback_data`: the outbox part and the attempt, so a
/// status webhook settles exactly that send when its answer was lost.
pub fn send_callback(outbox_id: i64, attempt: u32) -> String {
    format!("sabi:outbox:{outbox_id}:{attempt}")
}

/// The (outbox part, attempt) a callback names, if it is one of Sabi's.
pub fn parse_send_callback(callback: &str) -> Option<(i64, u32)> {
    let (id, attempt) = callback.strip_prefix("sabi:outbox:")?.split_once(':')?;
    Some((id.parse().ok()?, attempt.parse().ok()?))
}

/// What a broadcast send puts in `biz_opaque_callback_data`: the recipient and the attempt, so
/// a status webhook settles exactly that send when its answer was lost.
pub fn broadcast_callback(recipient: i64, attempt: u32) -> String {
    format!("sabi:broadcast:{recipient}:{attempt}")
}

/// The (recipient, attempt) a broadcast callback names.
pub fn parse_broadcast_callback(callback: &str) -> Option<(i64, u32)> {
    let (id, attempt) = callback.strip_prefix("sabi:broadcast:")?.split_once(':')?;
    Some((id.parse().ok()?, attempt.parse().ok()?))
}

/// Runs a fenced write (a turn's ending, a send's outcome) again while the store is unreachable:
/// up to eight more tries, 0.1 s apart doubling to 2 s (about 9 s in all), and only while
/// `holds()` says the lease is still this node's. A short outage then costs a delay, not the
/// work. A try whose answer was lost may have written: when a later try is refused as a lost
/// lease, the write has most likely landed, and that counts as done.
///
/// # Errors
/// The last error when the store stayed away, or the first that is not [`Error::Unavailable`].
pub async fn write_through_outage<F, Fut>(
    clock: &SharedClock,
    holds: impl Fn() -> bool,
    mut write: F,
) -> Result<()>
where
    F: FnMut(At) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut wait = Duration::from_millis(100);
    let mut failed = 0;
    loop {
        let now = clock.now();
        match write(now).await {
            Err(Error::Unavailable(why)) if failed < 8 && holds() => {
                failed += 1;
                tracing::warn!(error.message = %why, tries = failed, "the store is unreachable; trying the write again");
                clock.sleep_until(now + wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            Err(Error::LeaseLost) if failed > 0 => {
                tracing::info!(
                    "a try whose answer was lost has most likely written this; nothing more to write"
                );
                return Ok(());
            }
            outcome => return outcome,
        }
    }
}

/// A store is every role at once: what `open` returns and the app holds. Each component holds
/// only the role it uses ([`Turns`] for the scheduler and turn handlers, [`Sending`] for the
/// sender, ...), so a test fake implements one role.
pub trait Store:
    Intake
    + Turns
    + Sending
    + Reviews
    + WebChat
    + Inspection
    + Broadcasts
    + Customers
    + Desk
    + Retention
    + Health
{
}

impl<T> Store for T where
    T: Intake
        + Turns
        + Sending
        + Reviews
        + WebChat
        + Inspection
        + Broadcasts
        + Customers
        + Desk
        + Retention
        + Health
{
}

/// Looks at the configured backend without changing it (no file created, no migration):
/// what a `sabi check` may do against a live store.
///
/// # Errors
/// When it cannot be reached, does not exist yet, or its schema is not this build's.
pub async fn probe(config: &StoreConfig) -> Result<String> {
    match config {
        StoreConfig::Sqlite { path } => sqlite::probe(path).await,
        StoreConfig::Postgres { url } => postgres::probe(url).await,
        StoreConfig::Redis { url } => redis::probe(url).await,
    }
}

/// The configured marker secrets ([`Marks`]).
///
/// # Errors
/// As [`Config::marker_secrets`], as [`Error::Schema`].
pub fn marks(config: &Config) -> Result<Marks> {
    let (current, previous) = config
        .marker_secrets()
        .map_err(|e| Error::Schema(e.to_string()))?;
    Ok(Marks::new(current, previous))
}

/// Opens the configured backend, creating and migrating it when needed, with its erasure
/// markers under the configured secret.
///
/// # Errors
/// When the backend cannot be opened or migrated, or its markers were made with a secret the
/// configuration does not have.
pub async fn open(config: &Config) -> Result<Arc<dyn Store>> {
    let marks = marks(config)?;
    match &config.store {
        StoreConfig::Sqlite { path } => Ok(Arc::new(SqliteStore::open(path, marks).await?)),
        StoreConfig::Postgres { url } => Ok(Arc::new(PgStore::open(url, marks).await?)),
        StoreConfig::Redis { url } => Ok(Arc::new(RedisStore::open(url, marks).await?)),
    }
}
