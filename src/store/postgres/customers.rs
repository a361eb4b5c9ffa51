//! A customer's data on PostgreSQL: everything about them read in one snapshot, and erasure
//! in one transaction that first locks their conversations, so no claim opens a turn on them
//! while it runs (claims skip locked rows).

use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};

use super::broadcasts::{RECIPIENT_COLUMNS, choice_of, recipient_view};
use super::ingest::{ITEM_COLUMNS, stored_item};
use super::outbox::{ENTRY_SELECT, entry};
use super::settle;
use crate::clock::At;
use crate::domain::{Channel, ItemKind, ReviewReason};
use crate::store::items::known;
use crate::store::rules::batch::BatchState;
use crate::store::rules::broadcast::{RecipientState, SkipReason};
use crate::store::rules::consent::Source;
use crate::store::rules::erasure::{self, Erased, Marks, Subject};
use crate::store::rules::part::PartState;
use crate::store::rules::review::ReviewState;
use crate::store::rules::sql_list;
use crate::store::sql;
use crate::store::{BroadcastSend, CustomerRecord, Error, ExportPage, Result, ReviewRecord};

/// The turns of the subject's conversations, joined as `b` (with `c`, the conversation).
const THEIR_BATCHES: &str = "conversations c JOIN batches b ON b.conversation_id = c.id
    WHERE c.channel = $1 AND c.customer = $2";

pub(super) async fn export(
    pool: &PgPool,
    who: &Subject,
    page: ExportPage,
) -> Result<CustomerRecord> {
    let mut tx = pool.begin().await?;
    // One snapshot: the parts agree with each other.
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let record = read_record(&mut tx, who, page).await?;
    tx.commit().await?;
    Ok(record)
}

async fn read_record(
    conn: &mut PgConnection,
    who: &Subject,
    page: ExportPage,
) -> Result<CustomerRecord> {
    // Numbers, written into the text: nothing a client gave.
    let limit = match i64::try_from(page.limit) {
        Ok(n) => n.to_string(),
        Err(_) => "ALL".to_owned(),
    };
    let (items_after, replies_after) = (page.items_after, page.replies_after);
    let items = format!(
        "SELECT {ITEM_COLUMNS} FROM inbox WHERE channel = $1 AND customer = $2
         AND seq > {items_after} ORDER BY seq LIMIT {limit}"
    );
    let replies = format!(
        "{ENTRY_SELECT} JOIN conversations c ON c.id = b.conversation_id
         WHERE c.channel = $1 AND c.customer = $2 AND o.id > {replies_after}
         ORDER BY o.id LIMIT {limit}"
    );
    let reviews = "SELECT r.id, r.batch_id, r.reason, r.state, r.error, r.created_at,
                          r.resolved_at, r.resolution_note
                   FROM review r JOIN batches b ON b.id = r.batch_id
                        JOIN conversations c ON c.id = b.conversation_id
                   WHERE c.channel = $1 AND c.customer = $2 ORDER BY r.id";
    let items = their_rows(conn, who, stored_item, items).await?;
    let replies = their_rows(conn, who, entry, replies).await?;
    let reviews = their_rows(conn, who, review_record, reviews.to_owned()).await?;
    let (broadcasts, consent) = match who.channel {
        Channel::Whatsapp => (
            broadcasts(conn, &who.customer).await?,
            choice_of(conn, &who.customer, false).await?,
        ),
        Channel::Webchat => (Vec::new(), None),
    };
    Ok(CustomerRecord {
        items,
        replies,
        reviews,
        broadcasts,
        consent,
    })
}

/// The rows `sql` selects for the subject ($1 their channel, $2 their id), each read by `read`.
async fn their_rows<T>(
    conn: &mut PgConnection,
    who: &Subject,
    read: fn(&PgRow) -> Result<T>,
    sql: String,
) -> Result<Vec<T>> {
    let rows = sqlx::query(AssertSqlSafe(sql))
        .bind(who.channel.as_str())
        .bind(&who.customer)
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(read).collect()
}

fn review_record(r: &PgRow) -> Result<ReviewRecord> {
    Ok(ReviewRecord {
        id: r.get(0),
        batch_id: r.get(1),
        reason: known(ReviewReason::parse, r.get(2))?,
        state: known(ReviewState::parse, r.get(3))?,
        error: r.get(4),
        created_at: r.get(5),
        resolved_at: r.get(6),
        note: r.get(7),
    })
}

async fn broadcasts(conn: &mut PgConnection, customer: &str) -> Result<Vec<BroadcastSend>> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT {RECIPIENT_COLUMNS}, b.id, b.name, b.template
         FROM broadcast_recipients r JOIN broadcasts b ON b.id = r.broadcast_id
         WHERE r.recipient = $1 ORDER BY r.id"
    )))
    .bind(customer)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(BroadcastSend {
                recipient: recipient_view(r)?,
                broadcast_id: r.get(14),
                name: r.get(15),
                template: r.get(16),
            })
        })
        .collect()
}

/// Erases the subject (see [`erasure`]) in one transaction.
pub(super) async fn forget(pool: &PgPool, who: &Subject, now: At, marks: &Marks) -> Result<Erased> {
    let mut tx = pool.begin().await?;
    let outcome = forget_in(&mut tx, who, now, marks).await;
    settle(tx, outcome).await
}

/// [`forget`]'s work, in its transaction.
async fn forget_in(tx: &mut PgConnection, who: &Subject, now: At, marks: &Marks) -> Result<Erased> {
    // Their conversations first, as every claim and turn write takes them: a claim skips them
    // until this commits, and a turn under way is seen below.
    sqlx::query(
        "SELECT id FROM conversations WHERE channel = $1 AND customer = $2 ORDER BY id FOR UPDATE",
    )
    .bind(who.channel.as_str())
    .bind(&who.customer)
    .fetch_all(&mut *tx)
    .await?;
    if let Some(why) = erasure::busy(
        turn_running(&mut *tx, who).await?,
        send_under_way(&mut *tx, who).await?,
    ) {
        return Err(Error::Busy(why));
    }
    let mut erased = Erased::default();
    forget_items(&mut *tx, who, now, marks, &mut erased).await?;
    keep_status_hashes(&mut *tx, who, now, marks).await?;
    forget_turns(&mut *tx, who, now, &mut erased).await?;
    if who.channel == Channel::Webchat {
        erased.chat_jobs = count(
            &mut *tx,
            "DELETE FROM chat_jobs WHERE session_id = $1",
            &[&who.customer],
        )
        .await?;
        // The session's binding names its user: forgotten with it.
        count(
            &mut *tx,
            "DELETE FROM chat_owners WHERE session_id = $1",
            &[&who.customer],
        )
        .await?;
    }
    // Theirs only, kept emptied: the same raw part arriving again is still known.
    let mentioning: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, raw FROM quarantine WHERE channel = $1 AND strpos(raw, $2) > 0")
            .bind(who.channel.as_str())
            .bind(&who.customer)
            .fetch_all(&mut *tx)
            .await?;
    let theirs: Vec<i64> = mentioning
        .into_iter()
        .filter(|(_, raw)| erasure::sent_by(raw, &who.customer))
        .map(|(id, _)| id)
        .collect();
    erased.quarantined = sqlx::query("UPDATE quarantine SET raw = '' WHERE id = ANY($1)")
        .bind(&theirs)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if who.channel == Channel::Whatsapp {
        forget_broadcasts(&mut *tx, who, now, marks, &mut erased).await?;
    }
    // The id's links to the customer's others name them too.
    sqlx::query("DELETE FROM customer_ids WHERE channel = $1 AND (alias = $2 OR customer = $2)")
        .bind(who.channel.as_str())
        .bind(&who.customer)
        .execute(&mut *tx)
        .await?;
    Ok(erased)
}

/// See [`Customers::linked_ids`](crate::store::Customers::linked_ids).
pub(super) async fn linked_ids(pool: &PgPool, who: &Subject) -> Result<Vec<String>> {
    let channel = who.channel.as_str();
    let key: String =
        sqlx::query_scalar("SELECT customer FROM customer_ids WHERE channel = $1 AND alias = $2")
            .bind(channel)
            .bind(&who.customer)
            .fetch_optional(pool)
            .await?
            .unwrap_or_else(|| who.customer.clone());
    let others: Vec<String> = sqlx::query_scalar(
        "SELECT alias FROM customer_ids WHERE channel = $1 AND customer = $2 AND alias <> $2
         ORDER BY alias",
    )
    .bind(channel)
    .bind(&key)
    .fetch_all(pool)
    .await?;
    Ok(std::iter::once(key).chain(others).collect())
}

async fn turn_running(conn: &mut PgConnection, who: &Subject) -> Result<bool> {
    exists(
        conn,
        &format!(
            "SELECT EXISTS (SELECT 1 FROM {THEIR_BATCHES} AND b.state = '{}')",
            BatchState::Running.as_str()
        ),
        &their(who),
    )
    .await
}

async fn send_under_way(conn: &mut PgConnection, who: &Subject) -> Result<bool> {
    let reply = exists(
        conn,
        &format!(
            "SELECT EXISTS (SELECT 1 FROM {THEIR_BATCHES}
                            AND EXISTS (SELECT 1 FROM outbox o
                                        WHERE o.batch_id = b.id AND o.state = '{}'))",
            PartState::Sending.as_str()
        ),
        &their(who),
    )
    .await?;
    let broadcast = who.channel == Channel::Whatsapp
        && exists(
            conn,
            &format!(
                "SELECT EXISTS (SELECT 1 FROM broadcast_recipients
                                WHERE recipient = $1 AND state = '{}')",
                RecipientState::Sending.as_str()
            ),
            &[&who.customer],
        )
        .await?;
    Ok(reply || broadcast)
}

/// The items naming the subject (theirs, and the account's events that mention them) go;
/// their keys stay as hashes.
async fn forget_items(
    conn: &mut PgConnection,
    who: &Subject,
    now: At,
    marks: &Marks,
    erased: &mut Erased,
) -> Result<()> {
    let found: Vec<(String, String)> = sqlx::query_as(
        "DELETE FROM inbox
         WHERE seq IN (SELECT seq FROM inbox WHERE channel = $1 AND customer = $2
                       UNION ALL
                       SELECT seq FROM inbox
                       WHERE customer IS NULL AND channel = $1 AND strpos(facts, $2) > 0)
         RETURNING dedupe_key, kind",
    )
    .bind(who.channel.as_str())
    .bind(&who.customer)
    .fetch_all(&mut *conn)
    .await?;
    let hashes: Vec<String> = found
        .iter()
        .map(|(key, _)| marks.key_hash(who.channel, key))
        .collect();
    keep_key_hashes(conn, &hashes, now).await?;
    for (_, kind) in &found {
        match known(ItemKind::parse, kind)? {
            ItemKind::Message => erased.messages += 1,
            _ => erased.statuses += 1,
        }
    }
    Ok(())
}

/// The statuses Meta may still send about the messages to them (replies and broadcasts) are
/// known before they come: a late one is a duplicate, and never stores their number again.
async fn keep_status_hashes(
    conn: &mut PgConnection,
    who: &Subject,
    now: At,
    marks: &Marks,
) -> Result<()> {
    if who.channel != Channel::Whatsapp {
        return Ok(());
    }
    let wamids: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT wamid FROM outbox
         WHERE wamid IS NOT NULL AND batch_id IN (SELECT b.id FROM {THEIR_BATCHES})
         UNION
         SELECT wamid FROM broadcast_recipients WHERE wamid IS NOT NULL AND recipient = $2"
    )))
    .bind(who.channel.as_str())
    .bind(&who.customer)
    .fetch_all(&mut *conn)
    .await?;
    let hashes: Vec<String> = wamids.iter().flat_map(|w| marks.status_hashes(w)).collect();
    keep_key_hashes(conn, &hashes, now).await
}

/// What stays of deleted items (erasure and retention both): their keys' hashes, from `now`,
/// so a retry of one is a duplicate until the `dedupe` horizon sweeps the hash.
pub(super) async fn keep_key_hashes(
    conn: &mut PgConnection,
    hashes: &[String],
    now: At,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO erased_keys (key_hash, erased_at) SELECT unnest($1::TEXT[]), $2
         ON CONFLICT (key_hash) DO NOTHING",
    )
    .bind(hashes)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Their conversations keep their turns' counts under a name that is no one's; what the turns
/// said goes, and a turn waiting for a retry ends: its messages are gone. A turn in review
/// stays one (it counts as handed to people), without its review item.
async fn forget_turns(
    conn: &mut PgConnection,
    who: &Subject,
    now: At,
    erased: &mut Erased,
) -> Result<()> {
    erased.reviews = count(
        conn,
        &format!("DELETE FROM review WHERE batch_id IN (SELECT b.id FROM {THEIR_BATCHES})"),
        &their(who),
    )
    .await?;
    erased.replies = count(
        conn,
        &format!("DELETE FROM outbox WHERE batch_id IN (SELECT b.id FROM {THEIR_BATCHES})"),
        &their(who),
    )
    .await?;
    let (done, waiting) = (BatchState::Done.as_str(), BatchState::Waiting.as_str());
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE batches SET state = CASE WHEN state = '{waiting}' THEN '{done}' ELSE state END,
                            finished_at = COALESCE(finished_at, $3),
                            last_error = NULL, stage = NULL, next_attempt_at = NULL
         WHERE id IN (SELECT b.id FROM {THEIR_BATCHES})"
    )))
    .bind(who.channel.as_str())
    .bind(&who.customer)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    erased.conversations = count(
        conn,
        "UPDATE conversations
         SET customer = 'erased:' || id, first_pending_at = NULL, last_pending_at = NULL,
             due_at = NULL, open_batch_id = NULL, last_inbound_at = NULL, model_pending = false
         WHERE channel = $1 AND customer = $2",
        &their(who),
    )
    .await?;
    Ok(())
}

/// Sends not yet made are skipped as an opt-out; every send keeps its counts under the
/// marker; the customer's choice gives way to the marker's standing opt-out.
async fn forget_broadcasts(
    conn: &mut PgConnection,
    who: &Subject,
    now: At,
    marks: &Marks,
    erased: &mut Erased,
) -> Result<()> {
    let unsent = sql_list(RecipientState::ALL, RecipientState::as_str, |s| {
        matches!(s, RecipientState::Queued | RecipientState::Held)
    });
    count(
        conn,
        &format!(
            "UPDATE broadcast_recipients SET state = '{}', skipped = '{}'
             WHERE recipient = $1 AND state IN {unsent}",
            RecipientState::Skipped.as_str(),
            SkipReason::OptedOut.as_str()
        ),
        &[&who.customer],
    )
    .await?;
    let marker = marks.marker(who.channel, &who.customer);
    erased.broadcast_sends = count(
        conn,
        "UPDATE broadcast_recipients
         SET recipient = $2, params = '[]', tz = NULL, wamid = NULL, error = NULL
         WHERE recipient = $1",
        &[&who.customer, &marker],
    )
    .await?;
    erased.consents = count(
        conn,
        "DELETE FROM consents WHERE customer = $1",
        &[&who.customer],
    )
    .await?;
    sqlx::query(
        "INSERT INTO consents (customer, opted_out, source, at) VALUES ($1, true, $2, $3)
         ON CONFLICT (customer) DO UPDATE SET opted_out = true, source = $2, at = $3",
    )
    .bind(&marker)
    .bind(Source::Erased.as_str())
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Moves the store's markers and erased keys' hashes under `marks` (see
/// [`Marks::rekey_from`]), in the migration's transaction under its lock: nodes starting
/// together move them once, and the store records which secrets they are under.
pub(super) async fn rekey(conn: &mut PgConnection, marks: &Marks) -> Result<()> {
    let recorded: Option<String> =
        sqlx::query_scalar("SELECT fingerprint FROM marker_key WHERE id = 1")
            .fetch_optional(&mut *conn)
            .await?;
    let rekey = marks
        .rekey_from(recorded.as_deref())
        .map_err(Error::Schema)?;
    if !rekey.is_empty() {
        let mut moved = 0u64;
        for (table, column) in sql::MARKED {
            let names: Vec<String> =
                sqlx::query_scalar(AssertSqlSafe(sql::markers_sql(table, column)))
                    .fetch_all(&mut *conn)
                    .await?;
            let (old, new): (Vec<String>, Vec<String>) = names
                .iter()
                .filter_map(|old| Some((old.clone(), rekey.marker(old)?)))
                .unzip();
            moved += sqlx::query(AssertSqlSafe(format!(
                "UPDATE {table} t SET {column} = m.new
                 FROM unnest($1::TEXT[], $2::TEXT[]) AS m(old, new) WHERE t.{column} = m.old"
            )))
            .bind(&old)
            .bind(&new)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        }
        let old: Vec<String> = sqlx::query_scalar("SELECT key_hash FROM erased_keys")
            .fetch_all(&mut *conn)
            .await?;
        let new: Vec<String> = old.iter().map(|h| rekey.key_hash(h)).collect();
        sqlx::query(
            "UPDATE erased_keys e SET key_hash = m.new
             FROM unnest($1::TEXT[], $2::TEXT[]) AS m(old, new) WHERE e.key_hash = m.old",
        )
        .bind(&old)
        .bind(&new)
        .execute(&mut *conn)
        .await?;
        sql::rekeyed(moved, old.len());
    }
    sqlx::query(
        "INSERT INTO marker_key (id, fingerprint) VALUES (1, $1)
         ON CONFLICT (id) DO UPDATE SET fingerprint = $1",
    )
    .bind(marks.fingerprint())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Whether `sql`, a `SELECT EXISTS`, with `binds` as $1, $2, ..., finds a row.
async fn exists(conn: &mut PgConnection, sql: &str, binds: &[&str]) -> Result<bool> {
    let mut query = sqlx::query_scalar(AssertSqlSafe(sql.to_owned()));
    for bind in binds {
        query = query.bind(*bind);
    }
    query.fetch_one(&mut *conn).await.map_err(Error::from)
}

/// The subject as most statements here bind it: $1 their channel, $2 their id.
fn their(who: &Subject) -> [&str; 2] {
    [who.channel.as_str(), &who.customer]
}

/// Rows `sql`, with `binds` as $1, $2, ..., changed.
async fn count(conn: &mut PgConnection, sql: &str, binds: &[&str]) -> Result<u64> {
    let mut query = sqlx::query(AssertSqlSafe(sql.to_owned()));
    for bind in binds {
        query = query.bind(*bind);
    }
    query
        .execute(&mut *conn)
        .await
        .map(|done| done.rows_affected())
        .map_err(Error::from)
}
