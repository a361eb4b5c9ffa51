//! PostgreSQL backend: several Sabi nodes share one database.
//!
//! Every operation is one transaction on a pooled connection. Claims lock with
//! `FOR UPDATE SKIP LOCKED`, so concurrent workers never take the same batch or reply part;
//! every turn write re-reads the batch's fencing token under `FOR UPDATE`. PostgreSQL commits
//! concurrent transactions with one WAL flush (its own group commit), so acknowledgements from
//! many webhook requests share fsyncs as they do in the SQLite writer.
//!
//! The schema is versioned: `migrations/NNNN_*.sql` are applied in order at start, each in a
//! transaction of its own under an advisory lock, so nodes starting together apply each once and
//! a database made by an older build is upgraded in place. `sabi_schema` holds one row per
//! version applied.
//!
//! The SQL mirrors the SQLite backend's; the conformance suite holds both to the same behaviour.

mod broadcasts;
mod categories;
mod chat;
mod connect;
mod customers;
mod desk;
mod gather;
mod ingest;
mod message;
mod outbox;
mod retention;
mod review;
mod turns;

use std::collections::HashSet;
use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};

use super::items::known;
use super::rules::category::TemplateCategory;
use super::rules::erasure::{Marks, OptOuts};
use super::rules::item::ItemState;
use super::{
    BroadcastView, Broadcasts, ChatExchange, ChatFeed, ChatJob, ChatSubmission, Choice, Control,
    ConversationView, CustomerRecord, Customers, Desk, DeskThread, Ending, Erased, Error,
    ExportPage, Gauges, Health, HistoryEntry, Holding, Horizons, InboxQuery, Ingest, IngestReceipt,
    Inspection, Intake, Limits, NewBroadcast, OutboxEntry, Outcome, PriceCount, RecipientClaim,
    RecipientJob, RecipientState, RecipientView, Resolution, Result, Retention, ReviewEntry,
    ReviewQuery, Reviews, RouteGuess, RoutedTurn, SendClaim, SendClaims, SendResult, Sending,
    StoredItem, StoredQuarantine, Subject, Submitted, Swept, TemplateNews, TurnStats, TurnUsage,
    Turns, WebChat,
};
use crate::clock::{At, UnixSeconds};
use crate::domain::{Channel, Claim, ConversationKey, LeaseToken};

/// The schema's versions in order: the Nth takes a database at version N - 1 to N. A released
/// migration never changes: databases it already ran on would not run it again.
const MIGRATIONS: &[&str] = &[
    include_str!("migrations/0001_schema.sql"),
    include_str!("migrations/0002_claimable_conversations.sql"),
    include_str!("migrations/0003_routes.sql"),
    include_str!("migrations/0004_broadcasts.sql"),
    include_str!("migrations/0005_consents.sql"),
    include_str!("migrations/0006_broadcast_pause_and_body.sql"),
    include_str!("migrations/0007_local_hours.sql"),
    include_str!("migrations/0008_lanes.sql"),
    include_str!("migrations/0009_customers.sql"),
    include_str!("migrations/0010_retention.sql"),
    include_str!("migrations/0011_claimed_parts.sql"),
    include_str!("migrations/0012_person_lines.sql"),
    include_str!("migrations/0013_marker_key.sql"),
    include_str!("migrations/0014_chat_owners.sql"),
    include_str!("migrations/0015_marketing_messages.sql"),
    include_str!("migrations/0016_holds_and_ids.sql"),
    include_str!("migrations/0017_prices.sql"),
    include_str!("migrations/0018_desk.sql"),
];
/// The schema version this build writes and expects: its last migration's.
const VERSION: i32 = MIGRATIONS.len() as i32;
/// Server-side functions: replaced at every start, so they always match this build; the
/// rulebook's names are written into them (`'{pending}'`).
static FUNCTIONS: LazyLock<String> = LazyLock::new(|| {
    include_str!("functions.sql").replace("{pending}", ItemState::Pending.as_str())
});
/// Any constant: the advisory lock nodes take to migrate the schema one at a time.
const MIGRATION_LOCK: i64 = 0x5ab1_5ab1;

pub struct PgStore {
    pool: PgPool,
    /// One-message deliveries arriving together are stored together (gather.rs).
    gatherer: gather::Gatherer,
    /// Keys erasure's markers and hashes.
    marks: Marks,
}

impl PgStore {
    /// Connects, and creates the schema when the database has none or upgrades it in place when
    /// an older build made it.
    ///
    /// # Errors
    /// When the server cannot be reached, a migration fails, or the schema is newer than this
    /// build's (a store is never downgraded).
    pub async fn open(url: &str, marks: Marks) -> Result<PgStore> {
        let pool = connect::target(url)?.pool().await?;
        migrate(&pool, &marks).await?;
        let gatherer = gather::Gatherer::start(pool.clone());
        Ok(PgStore {
            pool,
            gatherer,
            marks,
        })
    }
}

/// How the server is reached (its version, TLS and its protocol) and the database's schema
/// version, read-only: nothing is created.
pub(super) async fn probe(url: &str) -> Result<String> {
    let target = connect::target(url)?;
    let mut conn = target.connection().await?;
    let (server, tls): (String, Option<String>) = sqlx::query_as(
        "SELECT current_setting('server_version'),
                (SELECT version FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl)",
    )
    .fetch_one(&mut conn)
    .await?;
    let reached = match tls {
        Some(protocol) => format!(
            "PostgreSQL {server}, over {protocol} (sslmode={})",
            ssl_mode_name(target.ssl_mode())
        ),
        None => format!("PostgreSQL {server}, without TLS"),
    };
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('sabi_schema') IS NOT NULL")
        .fetch_one(&mut conn)
        .await?;
    let version: Option<i32> = if exists {
        sqlx::query_scalar("SELECT max(version) FROM sabi_schema")
            .fetch_one(&mut conn)
            .await?
    } else {
        None
    };
    match version {
        None => Ok(format!(
            "{reached}; the database has no Sabi schema yet: `sabi serve` creates it"
        )),
        Some(VERSION) => Ok(format!("{reached}; schema current")),
        Some(older) if older < VERSION => Ok(format!(
            "{reached}; schema version {older}, this build upgrades it to {VERSION} at start"
        )),
        Some(newer) => Err(Error::Schema(format!("{reached}; {}", too_new(newer)))),
    }
}

/// Why a schema this build does not know is refused.
fn too_new(version: i32) -> String {
    format!(
        "schema version {version} is newer than this build's {VERSION}: a newer Sabi upgraded \
         the database; run that build (a schema is never downgraded)"
    )
}

/// The mode as libpq spells it.
fn ssl_mode_name(mode: sqlx::postgres::PgSslMode) -> &'static str {
    use sqlx::postgres::PgSslMode;
    match mode {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    }
}

/// Brings the schema to this build's version, one migration per transaction, then replaces the
/// functions. Every transaction takes the migration lock and reads the version under it, so
/// nodes starting together apply each migration once, and a migration that fails leaves the
/// database at the version before it.
async fn migrate(pool: &PgPool, marks: &Marks) -> Result<()> {
    loop {
        let mut tx = pool.begin().await?;
        let version = lock_schema(&mut tx).await?;
        if version > VERSION {
            return Err(Error::Schema(too_new(version)));
        }
        let next = usize::try_from(version)
            .ok()
            .and_then(|applied| MIGRATIONS.get(applied));
        let Some(&sql) = next else {
            sqlx::raw_sql(AssertSqlSafe(FUNCTIONS.as_str()))
                .execute(&mut *tx)
                .await
                .map_err(|e| Error::Schema(format!("creating the functions failed: {e}")))?;
            customers::rekey(&mut tx, marks).await?;
            return tx.commit().await.map_err(Error::from);
        };
        apply(&mut tx, version + 1, sql).await?;
        tx.commit().await?;
        tracing::info!(version = version + 1, "PostgreSQL schema migrated");
    }
}

/// Takes the migration lock for the transaction and reads the schema's version (0: none yet).
async fn lock_schema(tx: &mut PgConnection) -> Result<i32> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS sabi_schema (version INTEGER NOT NULL)")
        .execute(&mut *tx)
        .await?;
    let version: Option<i32> = sqlx::query_scalar("SELECT max(version) FROM sabi_schema")
        .fetch_one(&mut *tx)
        .await?;
    Ok(version.unwrap_or(0))
}

/// Runs migration number `version` and records it.
async fn apply(tx: &mut PgConnection, version: i32, sql: &'static str) -> Result<()> {
    // A migration may rewrite or index a large table: the connection's statement timeout is
    // sized for a webhook's patience, not for that.
    sqlx::query("SET LOCAL statement_timeout = 0")
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql(sql)
        .execute(&mut *tx)
        .await
        .map_err(|e| Error::Schema(format!("migration {version} failed: {e}")))?;
    sqlx::query("INSERT INTO sabi_schema (version) VALUES ($1)")
        .bind(version)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// A stored channel name read back.
pub(super) fn channel(name: &str) -> Result<Channel> {
    Channel::parse(name).ok_or_else(|| Error::Schema(format!("unknown channel {name:?}")))
}

/// The conversation named by columns `first`, `first + 1` and `first + 2` (channel, business,
/// customer) of a row.
pub(super) fn conversation_at(r: &PgRow, first: usize) -> Result<ConversationKey> {
    Ok(ConversationKey {
        channel: channel(r.get(first))?,
        business: r.get(first + 1),
        customer: r.get(first + 2),
    })
}

/// A rulebook name stored in column `i`, if one is, read back with `parse`.
pub(super) fn named<T>(r: &PgRow, i: usize, parse: fn(&str) -> Option<T>) -> Result<Option<T>> {
    r.get::<Option<&str>, _>(i)
        .map(|name| known(parse, name))
        .transpose()
}

/// A driver error read as the store's: the server may be away, or aborted a transaction that
/// may simply run again; `?` in this backend goes through here.
impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        connect::note_read_only(&e);
        let conflict = e
            .as_database_error()
            .and_then(|d| d.code())
            .is_some_and(|code| code == "40P01" || code == "40001");
        if conflict {
            Error::Unavailable(format!("{CONFLICT}{e}"))
        } else {
            Error::Unavailable(e.to_string())
        }
    }
}

/// How an error from a deadlock or a serialization failure starts: nothing was written, and the
/// same transaction may simply run again.
const CONFLICT: &str = "transaction conflict, retried: ";

/// How long one operation may take before the store counts as away. The server's statement
/// timeout bounds each statement, but not a commit waiting for a synchronous standby that is
/// gone (the old primary in a failover waits for it forever): without this, such a commit
/// would hold a scheduler's claim, and with it every turn of the node, for good.
const OPERATION_DEADLINE: Duration = Duration::from_secs(20);

/// Ends `tx` as `outcome` says: committed when the work succeeded, rolled back at once when it
/// failed. A transaction that is only dropped is rolled back later, when the pool gets to its
/// connection, and keeps its row locks until then: a claim coming first would skip the rows a
/// refused write had locked (`FOR UPDATE SKIP LOCKED`), as if they were taken.
pub(super) async fn settle<T>(
    tx: sqlx::Transaction<'_, sqlx::Postgres>,
    outcome: Result<T>,
) -> Result<T> {
    match outcome {
        Ok(value) => {
            tx.commit().await?;
            Ok(value)
        }
        Err(error) => {
            // The work's error is the one to tell; a rollback that fails leaves it to the pool.
            let _ = tx.rollback().await;
            Err(error)
        }
    }
}

/// Runs a transaction again when PostgreSQL aborted it for a deadlock (transactions of several
/// nodes may lock the same rows in other orders), up to a few times; gives up on a try that
/// outlasts [`OPERATION_DEADLINE`] (its connection is dropped with it).
async fn retrying<T, F, Fut>(mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut tries = 0;
    loop {
        let Ok(outcome) = tokio::time::timeout(OPERATION_DEADLINE, op()).await else {
            return Err(Error::Unavailable(format!(
                "the store did not answer within {}s",
                OPERATION_DEADLINE.as_secs()
            )));
        };
        match outcome {
            Err(Error::Unavailable(why)) if why.starts_with(CONFLICT) && tries < 3 => {
                tries += 1;
                tracing::debug!(tries, "store transaction conflict; running it again");
            }
            outcome => return outcome,
        }
    }
}

/// Row limits as PostgreSQL takes them.
fn limit(n: Option<usize>) -> i64 {
    n.map_or(i64::MAX, |n| i64::try_from(n).unwrap_or(i64::MAX))
}

#[async_trait]
impl Intake for PgStore {
    async fn ingest(&self, delivery: Ingest) -> Result<IngestReceipt> {
        retrying(|| ingest::ingest(&self.pool, &self.gatherer, &delivery, &self.marks)).await
    }
}

#[async_trait]
impl Turns for PgStore {
    async fn claim(
        &self,
        now: At,
        lease: Duration,
        limit: usize,
        channel: Option<Channel>,
    ) -> Result<Vec<Claim>> {
        retrying(|| turns::claim(&self.pool, now, lease, limit, channel)).await
    }
    async fn claim_routine(&self, now: At, lease: Duration, limit: usize) -> Result<Vec<Claim>> {
        retrying(|| turns::claim_routine(&self.pool, now, lease, limit)).await
    }
    async fn renew(&self, batch: i64, token: LeaseToken, now: At, lease: Duration) -> Result<()> {
        retrying(|| turns::renew(&self.pool, batch, token, now, lease)).await
    }
    async fn finish(&self, batch: i64, token: LeaseToken, now: At, ending: Ending) -> Result<()> {
        retrying(|| turns::finish(&self.pool, batch, token, now, &ending)).await
    }
    async fn hold(&self, now: At, holding: Holding) -> Result<Vec<i64>> {
        retrying(|| turns::hold(&self.pool, now, &holding)).await
    }
    async fn next_due(&self) -> Result<Option<At>> {
        turns::next_due(&self.pool).await
    }
    async fn history(&self, batch: i64, turns: usize) -> Result<Vec<HistoryEntry>> {
        turns::history(&self.pool, batch, turns).await
    }
    async fn last_broadcast(
        &self,
        conversation: &ConversationKey,
        since: At,
        until: At,
    ) -> Result<Option<HistoryEntry>> {
        broadcasts::last_to(&self.pool, conversation, since, until).await
    }
    async fn set_transcript(&self, channel: Channel, external_id: &str, text: &str) -> Result<()> {
        sqlx::query(
            "UPDATE inbox SET text = $3 WHERE channel = $1 AND dedupe_key = $2 AND text IS NULL",
        )
        .bind(channel.as_str())
        .bind(external_id)
        .bind(text)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
    async fn set_stage(&self, batch: i64, stage: &str) -> Result<()> {
        turns::set_stage(&self.pool, batch, stage).await
    }
    async fn set_route(&self, batch: i64, guess: RouteGuess) -> Result<()> {
        turns::set_route(&self.pool, batch, &guess).await
    }
    async fn add_usage(&self, batch: i64, usage: TurnUsage) -> Result<()> {
        turns::add_usage(&self.pool, batch, usage).await
    }
}

#[async_trait]
impl Sending for PgStore {
    async fn claim_sends(&self, claim: SendClaim) -> Result<SendClaims> {
        retrying(|| outbox::claim_sends(&self.pool, &claim)).await
    }
    async fn depart(&self, id: i64, attempt: u32, now: At, lease: Duration) -> Result<()> {
        retrying(|| outbox::depart(&self.pool, id, attempt, now, lease)).await
    }
    async fn record_send(&self, id: i64, attempt: u32, now: At, result: SendResult) -> Result<()> {
        retrying(|| outbox::record_send(&self.pool, id, attempt, now, &result)).await
    }
    async fn next_send_due(&self, skip: Vec<String>) -> Result<Option<At>> {
        outbox::next_send_due(&self.pool, &skip).await
    }
}

#[async_trait]
impl Reviews for PgStore {
    async fn review_queue(&self, query: ReviewQuery) -> Result<Vec<ReviewEntry>> {
        review::queue(&self.pool, &query).await
    }
    async fn review_item(&self, id: i64) -> Result<Option<ReviewEntry>> {
        review::item(&self.pool, id).await
    }
    async fn resolve_review(&self, id: i64, now: At, resolution: Resolution) -> Result<()> {
        retrying(|| review::resolve(&self.pool, id, now, &resolution)).await
    }
    async fn conversations(&self, customer: &str, turns: usize) -> Result<Vec<ConversationView>> {
        review::conversations(&self.pool, customer, turns).await
    }
    async fn label_turn(&self, batch: i64, intent: &str) -> Result<()> {
        turns::label(&self.pool, batch, intent).await
    }
}

#[async_trait]
impl WebChat for PgStore {
    async fn submit_chat(&self, submission: ChatSubmission) -> Result<Submitted> {
        retrying(|| chat::submit(&self.pool, &submission, &self.marks)).await
    }
    async fn chat_job_for_message(
        &self,
        session_id: &str,
        message_id: &str,
    ) -> Result<Option<String>> {
        chat::job_for_message(&self.pool, session_id, message_id).await
    }
    async fn chat_job(&self, job_id: &str, now: At) -> Result<Option<ChatJob>> {
        chat::job(&self.pool, job_id, now).await
    }
    async fn chat_history(
        &self,
        session_id: &str,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<ChatExchange>> {
        chat::history(&self.pool, session_id, before, limit).await
    }
    async fn chat_session_owner(&self, session_id: &str) -> Result<Option<String>> {
        chat::owner(&self.pool, session_id).await
    }
    async fn chat_queue_depth(&self) -> Result<u64> {
        chat::queue_depth(&self.pool).await
    }
    async fn chat_feed(&self, session_id: &str, after: i64, limit: usize) -> Result<ChatFeed> {
        chat::feed(&self.pool, session_id, after, limit).await
    }
}

#[async_trait]
impl Desk for PgStore {
    async fn desk_thread(&self, conversation: &ConversationKey) -> Result<Option<DeskThread>> {
        desk::thread(&self.pool, conversation).await
    }
    async fn open_desk_thread(&self, conversation: &ConversationKey, thread: &str) -> Result<()> {
        desk::open(&self.pool, conversation, thread).await
    }
    async fn close_desk_thread(&self, thread: &str) -> Result<Option<ConversationKey>> {
        desk::close(&self.pool, thread).await
    }
    async fn desk_conversation(&self, thread: &str) -> Result<Option<ConversationKey>> {
        desk::conversation(&self.pool, thread).await
    }
    async fn desk_pending(&self, limit: usize) -> Result<Vec<(i64, Option<i64>)>> {
        desk::pending(&self.pool, limit).await
    }
    async fn claim_desk_message(&self, key: &str, now: At) -> Result<bool> {
        desk::claim(&self.pool, key, now).await
    }
    async fn set_desk_mirrored(&self, item: i64, seq: i64) -> Result<()> {
        desk::set_mirrored(&self.pool, item, seq).await
    }
}

#[async_trait]
impl Inspection for PgStore {
    async fn inbox(&self, query: InboxQuery) -> Result<Vec<StoredItem>> {
        ingest::inbox(&self.pool, &query).await
    }
    async fn quarantine(&self, limit: Option<usize>) -> Result<Vec<StoredQuarantine>> {
        ingest::quarantine(&self.pool, limit).await
    }
    async fn outbox(&self, limit: Option<usize>) -> Result<Vec<OutboxEntry>> {
        outbox::outbox(&self.pool, limit).await
    }
    async fn turn_stats(&self, since: At) -> Result<TurnStats> {
        turns::stats(&self.pool, since).await
    }
    async fn gauges(&self, now: At) -> Result<Gauges> {
        review::gauges(&self.pool, now).await
    }
    async fn routed_turns(&self, since: At, limit: usize) -> Result<Vec<RoutedTurn>> {
        turns::routed(&self.pool, since, limit).await
    }
    async fn price_counts(&self, since: At) -> Result<Vec<PriceCount>> {
        ingest::price_counts(&self.pool, since).await
    }
}

#[async_trait]
impl Broadcasts for PgStore {
    async fn create_broadcast(&self, broadcast: NewBroadcast) -> Result<(BroadcastView, bool)> {
        broadcasts::create(&self.pool, &broadcast).await
    }
    async fn broadcasts(&self, limit: usize) -> Result<Vec<BroadcastView>> {
        broadcasts::list(&self.pool, limit).await
    }
    async fn broadcast(&self, id: i64) -> Result<Option<BroadcastView>> {
        let mut conn = self.pool.acquire().await?;
        broadcasts::view(&mut conn, id).await
    }
    async fn keyed_broadcast(&self, key: &str) -> Result<Option<BroadcastView>> {
        let mut conn = self.pool.acquire().await?;
        let id: Option<i64> = sqlx::query_scalar("SELECT id FROM broadcasts WHERE key = $1")
            .bind(key)
            .fetch_optional(&mut *conn)
            .await?;
        match id {
            Some(id) => broadcasts::view(&mut conn, id).await,
            None => Ok(None),
        }
    }
    async fn broadcast_recipients(
        &self,
        id: i64,
        state: Option<RecipientState>,
        limit: usize,
    ) -> Result<Vec<RecipientView>> {
        broadcasts::recipients(&self.pool, id, state, limit).await
    }
    async fn control_broadcast(
        &self,
        id: i64,
        control: Control,
        reason: Option<String>,
    ) -> Result<BroadcastView> {
        broadcasts::control(&self.pool, id, control, reason.as_deref()).await
    }
    async fn claim_recipients(&self, claim: RecipientClaim) -> Result<Vec<RecipientJob>> {
        retrying(|| broadcasts::claim(&self.pool, &claim)).await
    }
    async fn record_recipient(
        &self,
        id: i64,
        attempt: u32,
        now: At,
        outcome: Outcome,
        limits: Limits,
    ) -> Result<()> {
        broadcasts::record(&self.pool, id, attempt, now, &outcome, limits).await
    }
    async fn hear_template(&self, news: TemplateNews) -> Result<Vec<i64>> {
        retrying(|| async {
            let mut tx = self.pool.begin().await?;
            let moved = broadcasts::hear_template(&mut tx, &news).await?;
            tx.commit().await?;
            Ok(moved)
        })
        .await
    }
    async fn choose(&self, customer: &str, choice: Choice) -> Result<bool> {
        retrying(|| async {
            let mut tx = self.pool.begin().await?;
            let changed = broadcasts::choose(&mut tx, customer, &choice).await?;
            tx.commit().await?;
            Ok(changed)
        })
        .await
    }
    async fn opted_out(&self, customers: &[String]) -> Result<HashSet<String>> {
        let asked = OptOuts::ask(&self.marks, customers);
        let found = broadcasts::opted_out(&self.pool, asked.names()).await?;
        Ok(asked.of(found))
    }
    async fn sent_since(&self, customers: &[String], since: At) -> Result<HashSet<String>> {
        broadcasts::sent_since(&self.pool, customers, since).await
    }
    async fn reached(&self, since: At) -> Result<u64> {
        let mut conn = self.pool.acquire().await?;
        broadcasts::reached(&mut conn, since).await
    }
    async fn keep_category(&self, category: TemplateCategory) -> Result<()> {
        retrying(|| async {
            let mut conn = self.pool.acquire().await?;
            categories::keep(&mut conn, &category).await
        })
        .await
    }
    async fn template_category(&self, name: &str, language: &str) -> Result<Option<String>> {
        let mut conn = self.pool.acquire().await?;
        categories::category(&mut conn, name, language).await
    }
    async fn first_reached(&self, since: At) -> Result<Option<At>> {
        broadcasts::first_reached(&self.pool, since).await
    }
}

#[async_trait]
impl Customers for PgStore {
    async fn export_customer(&self, subject: &Subject) -> Result<CustomerRecord> {
        self.export_page(subject, ExportPage::ALL).await
    }
    async fn export_page(&self, subject: &Subject, page: ExportPage) -> Result<CustomerRecord> {
        customers::export(&self.pool, subject, page).await
    }
    async fn forget_customer(&self, subject: &Subject, now: At) -> Result<Erased> {
        retrying(|| customers::forget(&self.pool, subject, now, &self.marks)).await
    }
    async fn linked_ids(&self, subject: &Subject) -> Result<Vec<String>> {
        customers::linked_ids(&self.pool, subject).await
    }
}

#[async_trait]
impl Retention for PgStore {
    async fn hold_lease(&self, lease: &str, holder: &str, now: At, ttl: Duration) -> Result<bool> {
        retrying(|| retention::hold_lease(&self.pool, lease, holder, now, ttl)).await
    }

    async fn sweep(&self, horizons: &Horizons, now: At, batch: usize) -> Result<Swept> {
        retrying(|| retention::sweep(&self.pool, horizons, now, batch, &self.marks)).await
    }

    async fn reclaim_space(&self) -> Result<bool> {
        retention::vacuum(&self.pool).await.map(|()| false)
    }
}

#[async_trait]
impl Health for PgStore {
    async fn ready(&self) -> Result<()> {
        let version: Option<i32> = sqlx::query_scalar("SELECT max(version) FROM sabi_schema")
            .fetch_one(&self.pool)
            .await?;
        match version {
            Some(VERSION) => Ok(()),
            other => Err(Error::Schema(format!(
                "schema version {other:?}, expected {VERSION}"
            ))),
        }
    }
}

/// Instants and provider timestamps are kept as BIGINT: milliseconds and seconds since the
/// epoch.
macro_rules! stored_as_bigint {
    ($($ty:ty: $into:expr, $from:expr;)*) => {
        $(
            impl sqlx::Type<sqlx::Postgres> for $ty {
                fn type_info() -> sqlx::postgres::PgTypeInfo {
                    <i64 as sqlx::Type<sqlx::Postgres>>::type_info()
                }
            }

            impl sqlx::Encode<'_, sqlx::Postgres> for $ty {
                fn encode_by_ref(
                    &self,
                    buf: &mut sqlx::postgres::PgArgumentBuffer,
                ) -> std::result::Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                    <i64 as sqlx::Encode<sqlx::Postgres>>::encode_by_ref(&$into(*self), buf)
                }
            }

            impl sqlx::Decode<'_, sqlx::Postgres> for $ty {
                fn decode(
                    value: sqlx::postgres::PgValueRef<'_>,
                ) -> std::result::Result<Self, sqlx::error::BoxDynError> {
                    <i64 as sqlx::Decode<sqlx::Postgres>>::decode(value).map($from)
                }
            }
        )*
    };
}

stored_as_bigint! {
    At: At::millis, At::from_millis;
    UnixSeconds: |s: UnixSeconds| s.0, UnixSeconds;
}
