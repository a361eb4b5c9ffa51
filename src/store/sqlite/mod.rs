//! SQLite backend: the embedded default.
//!
//! WAL journal with `synchronous = FULL`, so a commit returns only after the WAL is fsynced:
//! what [`Store::ingest`] returns is on disk. Writes go through one writer thread that groups
//! commits ([`writer`]); reads use a small pool of their own connections, which WAL lets run
//! beside the writer. Several processes may share one file: each writer takes the lock with
//! `BEGIN IMMEDIATE` and waits for the others up to the busy timeout.

mod broadcasts;
mod categories;
mod chat;
mod customers;
mod desk;
mod ingest;
mod outbox;
mod retention;
mod review;
mod turns;
mod writer;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::ToSql;
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSqlOutput, ValueRef};
use rusqlite::{Connection, params};

use self::writer::{Waits, Writer};
use super::items::Encoded;
use super::rules::batch::BatchState;
use super::rules::broadcast::{BroadcastState, PausedBy, RecipientState, SkipReason, TemplateNews};
use super::rules::category::TemplateCategory;
use super::rules::consent::Source;
use super::rules::erasure::{Erased, Marks, OptOuts, Subject};
use super::rules::item::ItemState;
use super::rules::part::{Delivery, PartKind, PartState};
use super::rules::review::ReviewState;
use super::{
    BroadcastView, Broadcasts, ChatExchange, ChatFeed, ChatJob, ChatSubmission, Choice, Control,
    ConversationView, CustomerRecord, Customers, Desk, DeskThread, Ending, Error, ExportPage,
    Gauges, Health, HistoryEntry, Holding, Horizons, InboxQuery, Ingest, IngestReceipt, Inspection,
    Intake, Limits, NewBroadcast, OutboxEntry, Outcome, PriceCount, RecipientClaim, RecipientJob,
    RecipientView, Resolution, Result, Retention, ReviewEntry, ReviewQuery, Reviews, RouteGuess,
    RoutedTurn, SendClaim, SendClaims, SendResult, Sending, StoredItem, StoredQuarantine,
    Submitted, Swept, TurnStats, TurnUsage, Turns, WebChat,
};
use crate::clock::{At, UnixSeconds};
use crate::domain::{Channel, Claim, ConversationKey, ItemKind, LeaseToken, ReviewReason};

/// Schema versions, applied in order; `PRAGMA user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
    include_str!("migrations/0001_inbox.sql"),
    include_str!("migrations/0002_turns.sql"),
    include_str!("migrations/0003_quarantine_dedupe.sql"),
    include_str!("migrations/0004_chat_jobs.sql"),
    include_str!("migrations/0005_sender.sql"),
    include_str!("migrations/0006_agent.sql"),
    include_str!("migrations/0007_review_resolution.sql"),
    include_str!("migrations/0008_routes.sql"),
    include_str!("migrations/0009_broadcasts.sql"),
    include_str!("migrations/0010_consents.sql"),
    include_str!("migrations/0011_broadcast_pause_and_body.sql"),
    include_str!("migrations/0012_local_hours.sql"),
    include_str!("migrations/0013_lanes.sql"),
    include_str!("migrations/0014_customers.sql"),
    include_str!("migrations/0015_retention.sql"),
    include_str!("migrations/0016_lasting_ids.sql"),
    include_str!("migrations/0017_claimed_parts.sql"),
    include_str!("migrations/0018_person_lines.sql"),
    include_str!("migrations/0019_marker_key.sql"),
    include_str!("migrations/0020_chat_owners.sql"),
    include_str!("migrations/0021_marketing_messages.sql"),
    include_str!("migrations/0022_holds_and_ids.sql"),
    include_str!("migrations/0023_prices.sql"),
    include_str!("migrations/0024_desk.sql"),
];

/// How long a writer waits for another process's lock before the store reports unavailable.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Read connections at most: reads beyond wait for one, rather than open files without bound
/// (a flood of event streams would otherwise exhaust the process's open files).
const READERS: usize = 8;

pub struct SqliteStore {
    path: PathBuf,
    writer: Writer,
    readers: Mutex<Vec<Connection>>,
    /// One permit per read connection in use.
    reading: tokio::sync::Semaphore,
    /// Keys erasure's markers and hashes.
    marks: Marks,
}

impl SqliteStore {
    /// Opens (creating the directory and file if needed) and migrates the database at `path`.
    ///
    /// # Errors
    /// When the file cannot be created or opened, or its schema is newer than this build.
    pub async fn open(path: &Path, marks: Marks) -> Result<SqliteStore> {
        SqliteStore::open_waiting(path, Waits::Async, marks).await
    }

    /// [`SqliteStore::open`] for a runtime whose time is paused: callers wait for their
    /// commits on blocking threads, which keeps tokio from jumping virtual time while a write
    /// is on disk (`sabi simulate`).
    ///
    /// # Errors
    /// As [`SqliteStore::open`].
    pub async fn open_on_paused_time(path: &Path, marks: Marks) -> Result<SqliteStore> {
        SqliteStore::open_waiting(path, Waits::Blocking, marks).await
    }

    async fn open_waiting(path: &Path, waits: Waits, marks: Marks) -> Result<SqliteStore> {
        let path = path.to_owned();
        tokio::task::spawn_blocking(move || {
            keep_private(&path)?;
            let conn = connect(&path)?;
            retention::enable_auto_vacuum(&conn)?;
            migrate(&conn, &marks)?;
            keep_private(&path)?;
            let writer = Writer::spawn(conn, waits)
                .map_err(|e| Error::Unavailable(format!("cannot start the writer: {e}")))?;
            Ok(SqliteStore {
                path,
                writer,
                readers: Mutex::new(Vec::new()),
                reading: tokio::sync::Semaphore::new(READERS),
                marks,
            })
        })
        .await
        .map_err(|e| Error::Unavailable(e.to_string()))?
    }

    /// Runs a read on a pooled connection, off the async threads.
    async fn read<T, F>(&self, op: F) -> Result<T>
    where
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let _reading = self.reading.acquire().await.map_err(|_| poisoned())?;
        let pooled = self.readers.lock().map_err(|_| poisoned())?.pop();
        let path = self.path.clone();
        let (conn, out) = tokio::task::spawn_blocking(move || {
            let conn = match pooled {
                Some(conn) => conn,
                None => connect(&path)?,
            };
            let out = op(&conn);
            Ok::<_, Error>((conn, out))
        })
        .await
        .map_err(|e| Error::Unavailable(e.to_string()))??;
        let mut idle = self.readers.lock().map_err(|_| poisoned())?;
        idle.push(conn);
        out
    }
}

/// The store holds phone numbers and what customers wrote: its directory (when Sabi makes it)
/// is the owner's alone (0700), and so are the database and its WAL and shared-memory files
/// (0600), whatever the umask. SQLite gives the WAL and shared-memory files the database's
/// own mode.
///
/// The database file is opened here only when it does not exist yet: closing any descriptor of
/// a file drops every POSIX lock this process holds on it, SQLite's included.
fn keep_private(path: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    let failed = |what: &Path, e: std::io::Error| {
        Error::Unavailable(format!("cannot prepare {}: {e}", what.display()))
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| failed(dir, e))?;
    }
    if !path.exists() {
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path);
        match created {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(failed(path, e)),
        }
    }
    for suffix in ["", "-wal", "-shm"] {
        let file = PathBuf::from(format!("{}{suffix}", path.display()));
        if file.exists() {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| failed(&file, e))?;
        }
    }
    Ok(())
}

fn poisoned() -> Error {
    Error::Unavailable("reader pool lock poisoned".into())
}

fn connect(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path).map_err(unavailable)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(unavailable)?;
    // FULL: in WAL mode NORMAL would skip the fsync at commit and lose acknowledged messages
    // on power loss. Memory-mapped reads spare a read syscall and a copy per page. Foreign
    // keys are enforced: the bundled SQLite is built with them on by default. Secure delete:
    // what a delete frees is zeroed, so an erased customer's words do not stay in free pages.
    // Incremental auto-vacuum takes effect only on a new file, before its first page is
    // written (an older store is rewritten once, see `retention::enable_auto_vacuum`).
    conn.execute_batch(
        "PRAGMA auto_vacuum = INCREMENTAL;
         PRAGMA journal_mode = WAL;
         PRAGMA synchronous = FULL;
         PRAGMA mmap_size = 268435456;
         PRAGMA secure_delete = ON;",
    )
    .map_err(unavailable)?;
    Ok(conn)
}

/// Brings the schema up to date. The version is read inside the write lock, so processes
/// starting together on one file migrate it once.
/// Foreign keys are off meanwhile (it can only change outside a transaction): a migration that
/// rebuilds a table drops the parent that other rows point at before its copy takes the name.
fn migrate(conn: &Connection, marks: &Marks) -> Result<()> {
    conn.execute_batch("PRAGMA foreign_keys = OFF; BEGIN IMMEDIATE")
        .map_err(unavailable)?;
    let outcome = apply_migrations(conn).and_then(|()| customers::rekey(conn, marks));
    let end = if outcome.is_ok() {
        "COMMIT; PRAGMA foreign_keys = ON"
    } else {
        "ROLLBACK; PRAGMA foreign_keys = ON"
    };
    conn.execute_batch(end).map_err(unavailable)?;
    outcome
}

fn apply_migrations(conn: &Connection) -> Result<()> {
    let version: usize = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(unavailable)?;
    if version > MIGRATIONS.len() {
        return Err(Error::Schema(format!(
            "the database is at version {version}, newer than this build's {}",
            MIGRATIONS.len()
        )));
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(version) {
        conn.execute_batch(sql)
            .map_err(|e| Error::Schema(format!("migration {} failed: {e}", index + 1)))?;
    }
    conn.pragma_update(None, "user_version", MIGRATIONS.len())
        .map_err(unavailable)
}

/// The schema version of the file at `path`, read-only: nothing is created or migrated.
pub(super) async fn probe(path: &Path) -> Result<String> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        if !path.exists() {
            return Err(Error::Unavailable(format!(
                "no database at {} yet (`sabi serve` creates it)",
                path.display()
            )));
        }
        let conn = Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(unavailable)?;
        let version: usize = conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(unavailable)?;
        match version.cmp(&MIGRATIONS.len()) {
            std::cmp::Ordering::Equal => Ok(format!("{}: schema current", path.display())),
            std::cmp::Ordering::Less => Err(Error::Schema(format!(
                "{}: schema version {version}; this build migrates it to {} at start",
                path.display(),
                MIGRATIONS.len()
            ))),
            std::cmp::Ordering::Greater => Err(Error::Schema(format!(
                "{}: schema version {version} is newer than this build's {}",
                path.display(),
                MIGRATIONS.len()
            ))),
        }
    })
    .await
    .map_err(|e| Error::Unavailable(e.to_string()))?
}

/// A row limit as SQLite takes it (`usize::MAX` is "no limit").
fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// The conversation named by columns `first`, `first + 1` and `first + 2` (channel, business,
/// customer) of a row.
pub(super) fn conversation_at(
    r: &rusqlite::Row,
    first: usize,
) -> rusqlite::Result<ConversationKey> {
    Ok(ConversationKey {
        channel: r.get(first)?,
        business: r.get(first + 1)?,
        customer: r.get(first + 2)?,
    })
}

pub(super) fn unavailable(e: rusqlite::Error) -> Error {
    Error::Unavailable(e.to_string())
}

pub(super) fn execute(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<()> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.execute(params))
        .map(drop)
        .map_err(unavailable)
}

#[async_trait]
impl Intake for SqliteStore {
    async fn ingest(&self, delivery: Ingest) -> Result<IngestReceipt> {
        // Serialise and hash here, on the caller's task, so the writer's transaction (which
        // every waiting request shares) holds only the SQL.
        let encoded: Vec<Encoded> = delivery.items.iter().map(Encoded::of).collect();
        let erased: Vec<String> = delivery
            .items
            .iter()
            .map(|i| self.marks.key_hash(i.channel, &i.dedupe_key))
            .collect();
        self.writer
            .write(move |conn| ingest::ingest(conn, &delivery, &encoded, &erased))
            .await
    }
}

#[async_trait]
impl Turns for SqliteStore {
    async fn claim(
        &self,
        now: At,
        lease: Duration,
        limit: usize,
        channel: Option<Channel>,
    ) -> Result<Vec<Claim>> {
        self.writer
            .write(move |conn| turns::claim(conn, now, lease, limit, channel))
            .await
    }
    async fn claim_routine(&self, now: At, lease: Duration, limit: usize) -> Result<Vec<Claim>> {
        self.writer
            .write(move |conn| turns::claim_routine(conn, now, lease, limit))
            .await
    }
    async fn renew(&self, batch: i64, token: LeaseToken, now: At, lease: Duration) -> Result<()> {
        self.writer
            .write(move |conn| turns::renew(conn, batch, token, now, lease))
            .await
    }
    async fn finish(&self, batch: i64, token: LeaseToken, now: At, ending: Ending) -> Result<()> {
        self.writer
            .write(move |conn| turns::finish(conn, batch, token, now, &ending))
            .await
    }
    async fn hold(&self, now: At, holding: Holding) -> Result<Vec<i64>> {
        self.writer
            .write(move |conn| turns::hold(conn, now, &holding))
            .await
    }
    async fn next_due(&self) -> Result<Option<At>> {
        self.read(turns::next_due).await
    }
    async fn set_transcript(&self, channel: Channel, external_id: &str, text: &str) -> Result<()> {
        let (id, text) = (external_id.to_owned(), text.to_owned());
        self.writer
            .write(move |conn| {
                conn.prepare_cached(
                    "UPDATE inbox SET text = ?3 WHERE channel = ?1 AND dedupe_key = ?2 AND text IS NULL",
                )
                .and_then(|mut s| s.execute(params![channel.as_str(), id, text]))
                .map(drop)
                .map_err(unavailable)
            })
            .await
    }
    async fn set_stage(&self, batch: i64, stage: &str) -> Result<()> {
        let stage = stage.to_owned();
        self.writer
            .write(move |conn| turns::set_stage(conn, batch, &stage))
            .await
    }
    async fn set_route(&self, batch: i64, guess: RouteGuess) -> Result<()> {
        self.writer
            .write(move |conn| turns::set_route(conn, batch, &guess))
            .await
    }
    async fn add_usage(&self, batch: i64, usage: TurnUsage) -> Result<()> {
        self.writer
            .write(move |conn| turns::add_usage(conn, batch, usage))
            .await
    }
    async fn history(&self, batch: i64, turns: usize) -> Result<Vec<HistoryEntry>> {
        self.read(move |conn| turns::history(conn, batch, turns))
            .await
    }
    async fn last_broadcast(
        &self,
        conversation: &ConversationKey,
        since: At,
        until: At,
    ) -> Result<Option<HistoryEntry>> {
        let (customer, business) = (conversation.customer.clone(), conversation.business.clone());
        self.read(move |conn| broadcasts::last_to(conn, &customer, &business, since, until))
            .await
    }
}

#[async_trait]
impl Sending for SqliteStore {
    async fn claim_sends(&self, claim: SendClaim) -> Result<SendClaims> {
        self.writer
            .write(move |conn| outbox::claim_sends(conn, &claim))
            .await
    }
    async fn depart(&self, id: i64, attempt: u32, now: At, lease: Duration) -> Result<()> {
        self.writer
            .write(move |conn| outbox::depart(conn, id, attempt, now, lease))
            .await
    }
    async fn record_send(&self, id: i64, attempt: u32, now: At, result: SendResult) -> Result<()> {
        self.writer
            .write(move |conn| outbox::record_send(conn, id, attempt, now, &result))
            .await
    }
    async fn next_send_due(&self, skip: Vec<String>) -> Result<Option<At>> {
        self.read(move |conn| outbox::next_send_due(conn, &skip))
            .await
    }
}

#[async_trait]
impl Reviews for SqliteStore {
    async fn review_queue(&self, query: ReviewQuery) -> Result<Vec<ReviewEntry>> {
        self.read(move |conn| review::queue(conn, &query)).await
    }
    async fn review_item(&self, id: i64) -> Result<Option<ReviewEntry>> {
        self.read(move |conn| review::item(conn, id)).await
    }
    async fn resolve_review(&self, id: i64, now: At, resolution: Resolution) -> Result<()> {
        self.writer
            .write(move |conn| review::resolve(conn, id, now, &resolution))
            .await
    }
    async fn conversations(&self, customer: &str, turns: usize) -> Result<Vec<ConversationView>> {
        let customer = customer.to_owned();
        self.read(move |conn| review::conversations(conn, &customer, turns))
            .await
    }
    async fn label_turn(&self, batch: i64, intent: &str) -> Result<()> {
        let intent = intent.to_owned();
        self.writer
            .write(move |conn| turns::label(conn, batch, &intent))
            .await
    }
}

#[async_trait]
impl WebChat for SqliteStore {
    async fn submit_chat(&self, submission: ChatSubmission) -> Result<Submitted> {
        let marks = self.marks.clone();
        self.writer
            .write(move |conn| chat::submit(conn, &submission, &marks))
            .await
    }
    async fn chat_job(&self, job_id: &str, now: At) -> Result<Option<ChatJob>> {
        let job_id = job_id.to_owned();
        self.read(move |conn| chat::job(conn, &job_id, now)).await
    }
    async fn chat_history(
        &self,
        session_id: &str,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<ChatExchange>> {
        let session_id = session_id.to_owned();
        self.read(move |conn| chat::history(conn, &session_id, before, limit))
            .await
    }
    async fn chat_session_owner(&self, session_id: &str) -> Result<Option<String>> {
        let session_id = session_id.to_owned();
        self.read(move |conn| chat::owner(conn, &session_id)).await
    }
    async fn chat_job_for_message(
        &self,
        session_id: &str,
        message_id: &str,
    ) -> Result<Option<String>> {
        let (session_id, message_id) = (session_id.to_owned(), message_id.to_owned());
        self.read(move |conn| chat::job_for_message(conn, &session_id, &message_id))
            .await
    }
    async fn chat_queue_depth(&self) -> Result<u64> {
        self.read(chat::queue_depth).await
    }
    async fn chat_feed(&self, session_id: &str, after: i64, limit: usize) -> Result<ChatFeed> {
        let session_id = session_id.to_owned();
        self.read(move |conn| chat::feed(conn, &session_id, after, limit))
            .await
    }
}

#[async_trait]
impl Desk for SqliteStore {
    async fn desk_thread(&self, conversation: &ConversationKey) -> Result<Option<DeskThread>> {
        let conversation = conversation.clone();
        self.read(move |conn| desk::thread(conn, &conversation))
            .await
    }
    async fn open_desk_thread(&self, conversation: &ConversationKey, thread: &str) -> Result<()> {
        let (conversation, thread) = (conversation.clone(), thread.to_owned());
        self.writer
            .write(move |conn| desk::open(conn, &conversation, &thread))
            .await
    }
    async fn close_desk_thread(&self, thread: &str) -> Result<Option<ConversationKey>> {
        let thread = thread.to_owned();
        self.writer
            .write(move |conn| desk::close(conn, &thread))
            .await
    }
    async fn desk_conversation(&self, thread: &str) -> Result<Option<ConversationKey>> {
        let thread = thread.to_owned();
        self.read(move |conn| desk::conversation(conn, &thread))
            .await
    }
    async fn desk_pending(&self, limit: usize) -> Result<Vec<(i64, Option<i64>)>> {
        self.read(move |conn| desk::pending(conn, limit)).await
    }
    async fn claim_desk_message(&self, key: &str, now: At) -> Result<bool> {
        let key = key.to_owned();
        self.writer
            .write(move |conn| desk::claim(conn, &key, now))
            .await
    }
    async fn set_desk_mirrored(&self, item: i64, seq: i64) -> Result<()> {
        self.writer
            .write(move |conn| desk::set_mirrored(conn, item, seq))
            .await
    }
}

#[async_trait]
impl Inspection for SqliteStore {
    async fn outbox(&self, limit: Option<usize>) -> Result<Vec<OutboxEntry>> {
        self.read(move |conn| outbox::outbox(conn, limit)).await
    }
    async fn turn_stats(&self, since: At) -> Result<TurnStats> {
        self.read(move |conn| turns::stats(conn, since)).await
    }
    async fn gauges(&self, now: At) -> Result<Gauges> {
        self.read(move |conn| review::gauges(conn, now)).await
    }
    async fn routed_turns(&self, since: At, limit: usize) -> Result<Vec<RoutedTurn>> {
        self.read(move |conn| turns::routed(conn, since, limit))
            .await
    }
    async fn price_counts(&self, since: At) -> Result<Vec<PriceCount>> {
        self.read(move |conn| ingest::price_counts(conn, since))
            .await
    }
    async fn inbox(&self, query: InboxQuery) -> Result<Vec<StoredItem>> {
        self.read(move |conn| ingest::inbox(conn, &query)).await
    }
    async fn quarantine(&self, limit: Option<usize>) -> Result<Vec<StoredQuarantine>> {
        self.read(move |conn| ingest::quarantine(conn, limit)).await
    }
}

#[async_trait]
impl Broadcasts for SqliteStore {
    async fn create_broadcast(&self, broadcast: NewBroadcast) -> Result<(BroadcastView, bool)> {
        self.writer
            .write(move |conn| broadcasts::create(conn, &broadcast))
            .await
    }
    async fn broadcasts(&self, limit: usize) -> Result<Vec<BroadcastView>> {
        self.read(move |conn| broadcasts::list(conn, limit)).await
    }
    async fn broadcast(&self, id: i64) -> Result<Option<BroadcastView>> {
        self.read(move |conn| broadcasts::view(conn, id)).await
    }
    async fn keyed_broadcast(&self, key: &str) -> Result<Option<BroadcastView>> {
        let key = key.to_owned();
        self.read(move |conn| broadcasts::keyed(conn, &key)).await
    }
    async fn broadcast_recipients(
        &self,
        id: i64,
        state: Option<RecipientState>,
        limit: usize,
    ) -> Result<Vec<RecipientView>> {
        self.read(move |conn| broadcasts::recipients(conn, id, state, limit))
            .await
    }
    async fn control_broadcast(
        &self,
        id: i64,
        control: Control,
        reason: Option<String>,
    ) -> Result<BroadcastView> {
        self.writer
            .write(move |conn| broadcasts::control(conn, id, control, reason.as_deref()))
            .await
    }
    async fn claim_recipients(&self, claim: RecipientClaim) -> Result<Vec<RecipientJob>> {
        self.writer
            .write(move |conn| broadcasts::claim(conn, &claim))
            .await
    }
    async fn record_recipient(
        &self,
        id: i64,
        attempt: u32,
        now: At,
        outcome: Outcome,
        limits: Limits,
    ) -> Result<()> {
        self.writer
            .write(move |conn| broadcasts::record(conn, id, attempt, now, &outcome, limits))
            .await
    }
    async fn hear_template(&self, news: TemplateNews) -> Result<Vec<i64>> {
        self.writer
            .write(move |conn| broadcasts::hear_template(conn, &news))
            .await
    }
    async fn keep_category(&self, category: TemplateCategory) -> Result<()> {
        self.writer
            .write(move |conn| categories::keep(conn, &category))
            .await
    }
    async fn template_category(&self, name: &str, language: &str) -> Result<Option<String>> {
        let (name, language) = (name.to_owned(), language.to_owned());
        self.read(move |conn| categories::category(conn, &name, &language))
            .await
    }
    async fn choose(&self, customer: &str, choice: Choice) -> Result<bool> {
        let customer = customer.to_owned();
        self.writer
            .write(move |conn| broadcasts::choose(conn, &customer, &choice))
            .await
    }
    async fn opted_out(&self, customers: &[String]) -> Result<HashSet<String>> {
        let asked = OptOuts::ask(&self.marks, customers);
        let names = asked.names().to_vec();
        let found = self
            .read(move |conn| broadcasts::opted_out(conn, &names))
            .await?;
        Ok(asked.of(found))
    }
    async fn sent_since(&self, customers: &[String], since: At) -> Result<HashSet<String>> {
        let customers = customers.to_vec();
        self.read(move |conn| broadcasts::sent_since(conn, &customers, since))
            .await
    }
    async fn reached(&self, since: At) -> Result<u64> {
        self.read(move |conn| broadcasts::reached(conn, since))
            .await
    }
    async fn first_reached(&self, since: At) -> Result<Option<At>> {
        self.read(move |conn| broadcasts::first_reached(conn, since))
            .await
    }
}

#[async_trait]
impl Customers for SqliteStore {
    async fn export_customer(&self, subject: &Subject) -> Result<CustomerRecord> {
        self.export_page(subject, ExportPage::ALL).await
    }
    async fn export_page(&self, subject: &Subject, page: ExportPage) -> Result<CustomerRecord> {
        let who = subject.clone();
        self.read(move |conn| customers::export(conn, &who, page))
            .await
    }
    async fn linked_ids(&self, subject: &Subject) -> Result<Vec<String>> {
        let who = subject.clone();
        self.read(move |conn| customers::linked_ids(conn, &who))
            .await
    }
    async fn forget_customer(&self, subject: &Subject, now: At) -> Result<Erased> {
        let who = subject.clone();
        let erased = self
            .writer
            .write({
                let marks = self.marks.clone();
                move |conn| customers::forget(conn, &who, now, &marks)
            })
            .await?;
        self.read(customers::fold_wal).await?;
        Ok(erased)
    }
}

#[async_trait]
impl Retention for SqliteStore {
    async fn hold_lease(&self, lease: &str, holder: &str, now: At, ttl: Duration) -> Result<bool> {
        let (lease, holder) = (lease.to_owned(), holder.to_owned());
        self.writer
            .write(move |conn| retention::hold_lease(conn, &lease, &holder, now, ttl))
            .await
    }

    async fn sweep(&self, horizons: &Horizons, now: At, batch: usize) -> Result<Swept> {
        let horizons = *horizons;
        self.writer
            .write({
                let marks = self.marks.clone();
                move |conn| retention::sweep(conn, &horizons, now, batch, &marks)
            })
            .await
    }

    async fn reclaim_space(&self) -> Result<bool> {
        self.writer.write(retention::release_space).await
    }
}

#[async_trait]
impl Health for SqliteStore {
    async fn ready(&self) -> Result<()> {
        if !self.writer.is_alive() {
            return Err(Error::Unavailable("the SQLite writer has stopped".into()));
        }
        self.read(|conn| {
            let version: usize = conn
                .query_row("PRAGMA user_version", [], |row| row.get(0))
                .map_err(unavailable)?;
            if version == MIGRATIONS.len() {
                Ok(())
            } else {
                Err(Error::Schema(format!(
                    "schema version {version}, expected {}",
                    MIGRATIONS.len()
                )))
            }
        })
        .await
    }
}

pub(super) fn decode<T: serde::de::DeserializeOwned>(json: &str) -> Result<T> {
    serde_json::from_str(json)
        .map_err(|e| Error::Schema(format!("undecodable stored value {json:?}: {e}")))
}

/// Enums are stored as their names; a name this build does not know is a schema problem.
fn from_name<T>(value: ValueRef<'_>, parse: fn(&str) -> Option<T>) -> FromSqlResult<T> {
    let name = value.as_str()?;
    parse(name)
        .ok_or_else(|| FromSqlError::Other(format!("unknown name {name:?} in the store").into()))
}

/// Enums stored as their names, and read back.
macro_rules! from_names {
    ($($name:ty),*) => {
        $(
            impl FromSql for $name {
                fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
                    from_name(value, <$name>::parse)
                }
            }

            impl ToSql for $name {
                fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                    Ok(ToSqlOutput::from(self.as_str()))
                }
            }
        )*
    };
}

from_names!(
    BatchState,
    BroadcastState,
    Channel,
    ItemKind,
    ItemState,
    PartState,
    PartKind,
    Delivery,
    RecipientState,
    ReviewState,
    ReviewReason,
    SkipReason,
    Source,
    PausedBy
);

/// Instants and provider timestamps are kept as integers: milliseconds and seconds since the
/// epoch.
macro_rules! stored_as_integer {
    ($($ty:ty: $into:expr, $from:expr;)*) => {
        $(
            impl ToSql for $ty {
                fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                    Ok(ToSqlOutput::from($into(*self)))
                }
            }

            impl FromSql for $ty {
                fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
                    value.as_i64().map($from)
                }
            }
        )*
    };
}

stored_as_integer! {
    At: At::millis, At::from_millis;
    UnixSeconds: |s: UnixSeconds| s.0, UnixSeconds;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit_marks() -> Marks {
        Marks::new(
            secrecy::SecretString::from("unit-test-marker-secret".to_owned()),
            Vec::new(),
        )
    }

    /// A store at `version` with one WhatsApp reply queued, as builds before the sender left it
    /// (and before retention: without auto-vacuum).
    fn store_at(version: usize) -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = Connection::open(dir.path().join("s.db")).expect("open");
        conn.execute_batch("PRAGMA journal_mode = WAL")
            .expect("wal");
        for sql in &MIGRATIONS[..version] {
            conn.execute_batch(sql).expect("old migration");
        }
        conn.execute_batch(
            "INSERT INTO conversations (id, channel, business, customer) VALUES (1, 'whatsapp', 'b', 'c');
             INSERT INTO batches (id, conversation_id, state, token, attempts, due_at, created_at, started_at)
                 VALUES (1, 1, 'done', 1, 1, 0, 0, 0);
             INSERT INTO outbox (batch_id, part, channel, business, customer, body, state, created_at)
                 VALUES (1, 0, 'whatsapp', 'b', 'c', 'old reply', 'queued', 0);",
        )
        .expect("old rows");
        conn.pragma_update(None, "user_version", version)
            .expect("version");
        (dir, conn)
    }

    fn pragma(conn: &Connection, name: &str) -> i64 {
        conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
            .expect("pragma")
    }

    #[tokio::test]
    async fn a_store_made_before_retention_is_rewritten_once_and_then_gives_space_back() {
        let (dir, conn) = store_at(14);
        assert_eq!(
            pragma(&conn, "auto_vacuum"),
            0,
            "as earlier builds made stores"
        );
        // Two thousand quarantined bodies of 4 KB, all long past their horizon.
        conn.execute_batch(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
             INSERT INTO quarantine (channel, received_at, reason, raw, hash)
             SELECT 'whatsapp', 0, 'odd', hex(randomblob(2000)), randomblob(16) FROM n;",
        )
        .expect("rows");
        drop(conn);
        let path = dir.path().join("s.db");
        let full = std::fs::metadata(&path).expect("file").len();

        let store = SqliteStore::open(&path, unit_marks())
            .await
            .expect("opened");
        let now = At::from_millis(100 * 86_400_000);
        let mut gone = 0;
        loop {
            let swept = store
                .sweep(&Horizons::default(), now, 500)
                .await
                .expect("swept");
            if swept.is_empty() {
                break;
            }
            gone += swept.quarantined;
        }
        assert_eq!(gone, 2000);
        while store.reclaim_space().await.expect("reclaimed") {}
        drop(store);

        let conn = connect(&path).expect("open");
        assert_eq!(pragma(&conn, "auto_vacuum"), 2, "incremental");
        let body: String = conn
            .query_row("SELECT body FROM outbox", [], |r| r.get(0))
            .expect("the earlier rows are intact");
        assert_eq!(body, "old reply");
        let now_size = std::fs::metadata(&path).expect("file").len();
        assert!(
            now_size < full / 4,
            "{full} bytes before, {now_size} after: the freed pages went back"
        );
    }

    #[test]
    fn replies_queued_before_the_sender_go_to_a_person_not_out() {
        let (_dir, conn) = store_at(4);
        migrate(&conn, &unit_marks()).expect("migrated");
        let (state, conversation): (String, i64) = conn
            .query_row("SELECT state, conversation_id FROM outbox", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .expect("row");
        assert_eq!((state.as_str(), conversation), ("review", 1));
        let reason: String = conn
            .query_row(
                "SELECT reason FROM review WHERE outbox_id IS NOT NULL",
                [],
                |r| r.get(0),
            )
            .expect("review item");
        assert_eq!(reason, "send_failed");
    }
}
