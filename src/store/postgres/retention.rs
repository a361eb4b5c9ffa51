//! Retention on PostgreSQL (the rules are in [`retention`]): one transaction per sweep,
//! deleting a batch of each kind. Rows another transaction holds are skipped (`SKIP LOCKED`)
//! and taken by a later sweep, so a sweep never waits on a turn or a send. A retry racing the
//! sweep of its message meets the key's hash after its own insert and is dropped, as after an
//! erasure (`sabi_drop_if_erased_v1`). Space: batched deletes leave dead rows, which [`vacuum`]
//! makes free for new ones after each pass (autovacuum would too, later, where it is on); the
//! tables stop growing once the horizon is reached.

use std::time::Duration;

use sqlx::{AssertSqlSafe, PgConnection, PgPool};

use super::customers::keep_key_hashes;
use crate::clock::At;
use crate::domain::{Channel, ItemKind};
use crate::store::items::known;
use crate::store::rules::batch::BatchState;
use crate::store::rules::erasure::Marks;
use crate::store::rules::item::ItemState;
use crate::store::rules::part::PartState;
use crate::store::rules::price;
use crate::store::rules::retention::{self, Horizons, Swept, TURNLESS};
use crate::store::rules::review::{self, ReviewState};
use crate::store::rules::sql_list;
use crate::store::{Error, Result};

pub(super) async fn hold_lease(
    pool: &PgPool,
    lease: &str,
    holder: &str,
    now: At,
    ttl: Duration,
) -> Result<bool> {
    let mut tx = pool.begin().await?;
    // A first take by two nodes at once meets in the insert: one of them finds the row.
    sqlx::query(
        "INSERT INTO leases (name, holder, until) VALUES ($1, '', 0) ON CONFLICT DO NOTHING",
    )
    .bind(lease)
    .execute(&mut *tx)
    .await?;
    let (by, until): (String, At) =
        sqlx::query_as("SELECT holder, until FROM leases WHERE name = $1 FOR UPDATE")
            .bind(lease)
            .fetch_one(&mut *tx)
            .await?;
    let free = by.is_empty() || retention::may_hold(Some((&by, until)), holder, now);
    if free {
        sqlx::query("UPDATE leases SET holder = $2, until = $3 WHERE name = $1")
            .bind(lease)
            .bind(holder)
            .bind(now + ttl)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(free)
}

/// One batch of each kind past its horizon at `now`, in one transaction.
pub(super) async fn sweep(
    pool: &PgPool,
    horizons: &Horizons,
    now: At,
    batch: usize,
    marks: &Marks,
) -> Result<Swept> {
    let cut = horizons.cutoffs(now);
    let limit = i64::try_from(batch).unwrap_or(i64::MAX);
    let mut tx = pool.begin().await?;
    let mut swept = Swept::default();
    let (turns, mut touched) = ended_turns(&mut tx, cut.messages, limit).await?;
    sweep_turns(&mut tx, &turns, now, marks, &mut swept).await?;
    touched.extend(sweep_turnless(&mut tx, cut.messages, now, limit, marks, &mut swept).await?);
    swept.statuses = count(
        &mut tx,
        &format!(
            "DELETE FROM inbox WHERE seq IN (SELECT seq FROM inbox
                                             WHERE received_at < $1 AND state = '{}'
                                             LIMIT $2 FOR UPDATE SKIP LOCKED)",
            ItemState::Recorded.as_str()
        ),
        cut.statuses,
        limit,
    )
    .await?;
    swept.quarantined = count(
        &mut tx,
        "DELETE FROM quarantine WHERE id IN (SELECT id FROM quarantine WHERE received_at < $1
                                             LIMIT $2 FOR UPDATE SKIP LOCKED)",
        cut.quarantine,
        limit,
    )
    .await?;
    swept.keys = count(
        &mut tx,
        "DELETE FROM erased_keys
         WHERE key_hash IN (SELECT key_hash FROM erased_keys WHERE erased_at < $1
                            LIMIT $2 FOR UPDATE SKIP LOCKED)",
        cut.keys,
        limit,
    )
    .await?;
    swept.keys += count(
        &mut tx,
        "DELETE FROM desk_replies
         WHERE key IN (SELECT key FROM desk_replies WHERE at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)",
        now - review::DESK_REPLY_MEMORY,
        limit,
    )
    .await?;
    // A ledger hour goes whole once it ends before the horizon, so counts never read a part.
    swept.prices = count(
        &mut tx,
        "DELETE FROM prices
         WHERE key IN (SELECT key FROM prices WHERE hour < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)",
        price::hour(cut.messages),
        limit,
    )
    .await?;
    swept.conversations = sweep_conversations(&mut tx, &touched, cut.messages).await?;
    tx.commit().await?;
    Ok(swept)
}

/// Turns that ended before `before` and hold nothing still under way (no open review, no
/// reply part on its way), locked; and their conversations.
async fn ended_turns(
    conn: &mut PgConnection,
    before: At,
    limit: i64,
) -> Result<(Vec<i64>, Vec<i64>)> {
    let ended = sql_list(BatchState::ALL, BatchState::as_str, retention::turn_ended);
    let unsettled = sql_list(PartState::ALL, PartState::as_str, PartState::unsettled);
    let rows: Vec<(i64, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT b.id, b.conversation_id FROM batches b
         WHERE b.state IN {ended} AND b.finished_at < $1
           AND NOT EXISTS (SELECT 1 FROM review r WHERE r.batch_id = b.id AND r.state = '{}')
           AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.batch_id = b.id AND o.state IN {unsettled})
         ORDER BY b.finished_at LIMIT $2 FOR UPDATE OF b SKIP LOCKED",
        ReviewState::Open.as_str()
    )))
    .bind(before)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows.into_iter().unzip())
}

/// The turns go with their messages (keys kept as hashes), web-chat jobs, reply parts and
/// review items.
async fn sweep_turns(
    conn: &mut PgConnection,
    turns: &[i64],
    now: At,
    marks: &Marks,
    swept: &mut Swept,
) -> Result<()> {
    if turns.is_empty() {
        return Ok(());
    }
    swept.chat_jobs = ids(
        conn,
        "DELETE FROM chat_jobs WHERE message_key IN
            (SELECT dedupe_key FROM inbox WHERE batch_id = ANY($1) AND channel = 'webchat')",
        turns,
    )
    .await?;
    let items: Vec<(String, String)> =
        sqlx::query_as("DELETE FROM inbox WHERE batch_id = ANY($1) RETURNING channel, dedupe_key")
            .bind(turns)
            .fetch_all(&mut *conn)
            .await?;
    swept.messages += keep_keys(conn, &items, now, marks).await?;
    swept.replies = ids(conn, "DELETE FROM outbox WHERE batch_id = ANY($1)", turns).await?;
    swept.reviews = ids(conn, "DELETE FROM review WHERE batch_id = ANY($1)", turns).await?;
    swept.turns = ids(conn, "DELETE FROM batches WHERE id = ANY($1)", turns).await?;
    Ok(())
}

/// Messages that never had a turn go by their own age, keys kept as hashes. Their
/// conversations.
async fn sweep_turnless(
    conn: &mut PgConnection,
    before: At,
    now: At,
    limit: i64,
    marks: &Marks,
    swept: &mut Swept,
) -> Result<Vec<i64>> {
    let states = sql_list(ItemState::ALL, ItemState::as_str, |s| TURNLESS.contains(&s));
    let found: Vec<(String, String, Option<i64>)> = sqlx::query_as(AssertSqlSafe(format!(
        "DELETE FROM inbox
         WHERE seq IN (SELECT seq FROM inbox
                       WHERE received_at < $1 AND kind = '{}' AND state IN {states}
                         AND batch_id IS NULL
                       LIMIT $2 FOR UPDATE SKIP LOCKED)
         RETURNING channel, dedupe_key, conversation_id",
        ItemKind::Message.as_str()
    )))
    .bind(before)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    let (keys, conversations): (Vec<(String, String)>, Vec<Option<i64>>) = found
        .into_iter()
        .map(|(channel, key, conversation)| ((channel, key), conversation))
        .unzip();
    swept.messages += keep_keys(conn, &keys, now, marks).await?;
    Ok(conversations.into_iter().flatten().collect())
}

/// Keeps the hashes of the deleted items' keys; how many there were.
async fn keep_keys(
    conn: &mut PgConnection,
    items: &[(String, String)],
    now: At,
    marks: &Marks,
) -> Result<u64> {
    let hashes = items
        .iter()
        .map(|(channel, key)| Ok(marks.key_hash(known(Channel::parse, channel)?, key)))
        .collect::<Result<Vec<String>>>()?;
    keep_key_hashes(conn, &hashes, now).await?;
    Ok(hashes.len() as u64)
}

/// Of the conversations whose content went, those left with nothing, whose customer last
/// wrote before the horizon. A message arriving meanwhile makes its conversation due (or a
/// claim opens a turn on it), which the delete reads again on the row it waited for.
async fn sweep_conversations(conn: &mut PgConnection, touched: &[i64], before: At) -> Result<u64> {
    if touched.is_empty() {
        return Ok(0);
    }
    let gone: Vec<(String, String)> = sqlx::query_as(AssertSqlSafe(format!(
        "DELETE FROM conversations c
         WHERE c.id = ANY($1) AND c.due_at IS NULL AND c.open_batch_id IS NULL
           AND coalesce(c.last_inbound_at, 0) < $2
           AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.conversation_id = c.id)
           AND NOT EXISTS (SELECT 1 FROM inbox i
                           WHERE i.conversation_id = c.id AND i.state = '{pending}')
         RETURNING c.channel, c.customer",
        pending = ItemState::Pending,
    )))
    .bind(touched)
    .bind(before)
    .fetch_all(&mut *conn)
    .await?;
    // A customer whose last conversation went: the ids Meta named them by go too.
    for (channel, customer) in &gone {
        sqlx::query(
            "DELETE FROM customer_ids
             WHERE channel = $1 AND (alias = $2 OR customer = $2)
               AND NOT EXISTS (SELECT 1 FROM conversations WHERE channel = $1 AND customer = $2)",
        )
        .bind(channel)
        .bind(customer)
        .execute(&mut *conn)
        .await?;
    }
    Ok(u64::try_from(gone.len()).unwrap_or(u64::MAX))
}

/// Makes the space of the rows a pass deleted free for new rows now, rather than at
/// autovacuum's next look (a server may have it off): the tables sweeps delete from, skipping
/// one another vacuum holds.
pub(super) async fn vacuum(pool: &PgPool) -> Result<()> {
    sqlx::raw_sql(
        "VACUUM (SKIP_LOCKED) inbox, outbox, batches, review, chat_jobs, conversations, \
         quarantine, erased_keys, prices, desk_replies",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Rows `sql` changed, with the ids as $1.
async fn ids(conn: &mut PgConnection, sql: &'static str, ids: &[i64]) -> Result<u64> {
    sqlx::query(sql)
        .bind(ids)
        .execute(&mut *conn)
        .await
        .map(|done| done.rows_affected())
        .map_err(Error::from)
}

/// Rows `sql` changed, with a time as $1 and a row limit as $2.
async fn count(conn: &mut PgConnection, sql: &str, before: At, limit: i64) -> Result<u64> {
    sqlx::query(AssertSqlSafe(sql.to_owned()))
        .bind(before)
        .bind(limit)
        .execute(&mut *conn)
        .await
        .map(|done| done.rows_affected())
        .map_err(Error::from)
}
