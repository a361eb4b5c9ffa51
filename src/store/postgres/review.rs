//! The people's side of the PostgreSQL store: the review queue, settling its items,
//! conversations by customer, and the pipeline's counts (the SQLite backend's rules).

use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};

use super::outbox;
use super::turns::{conversation_history, load_batch, lock_conversation};
use super::{conversation_at, limit, settle};
use crate::clock::At;
use crate::domain::ReviewReason;
use crate::store::items::known;
use crate::store::rules::item::ItemState;
use crate::store::rules::part::Event;
use crate::store::rules::review::{self, ReviewState};
use crate::store::sql;
use crate::store::{ConversationView, Error, Gauges, Resolution, Result, ReviewEntry, ReviewQuery};

const COLUMNS: &str = "r.id, r.batch_id, r.reason, r.error, r.created_at, r.outbox_id, r.state";

async fn entries(
    conn: &mut PgConnection,
    rows: Vec<sqlx::postgres::PgRow>,
) -> Result<Vec<ReviewEntry>> {
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let batch = load_batch(conn, r.get(1)).await?;
        out.push(ReviewEntry {
            id: r.get(0),
            batch_id: r.get(1),
            outbox_id: r.get(5),
            state: known(ReviewState::parse, r.get(6))?,
            conversation: batch.conversation,
            reason: known(ReviewReason::parse, r.get(2))?,
            error: r.get(3),
            created_at: r.get(4),
            messages: batch.messages,
        });
    }
    Ok(out)
}

pub(super) async fn queue(pool: &PgPool, query: &ReviewQuery) -> Result<Vec<ReviewEntry>> {
    let mut conn = pool.acquire().await?;
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM review r JOIN batches b ON b.id = r.batch_id
         JOIN conversations c ON c.id = b.conversation_id
         WHERE r.state = '{open}' AND ($1::text IS NULL OR r.reason = $1)
           AND ($2::text IS NULL OR c.customer = $2)
         ORDER BY c.channel = 'webchat', r.id LIMIT $3",
        open = ReviewState::Open,
    )))
    .bind(query.reason.map(ReviewReason::as_str))
    .bind(&query.customer)
    .bind(limit(query.limit))
    .fetch_all(&mut *conn)
    .await?;
    entries(&mut conn, rows).await
}

pub(super) async fn item(pool: &PgPool, id: i64) -> Result<Option<ReviewEntry>> {
    let mut conn = pool.acquire().await?;
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM review r WHERE r.id = $1"
    )))
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    Ok(entries(&mut conn, rows).await?.pop())
}

pub(super) async fn resolve(
    pool: &PgPool,
    id: i64,
    now: At,
    resolution: &Resolution,
) -> Result<()> {
    let mut tx = pool.begin().await?;
    let outcome = settle_item(&mut tx, id, now, resolution).await;
    settle(tx, outcome).await
}

/// [`resolve`]'s work, in its transaction.
async fn settle_item(
    tx: &mut PgConnection,
    id: i64,
    now: At,
    resolution: &Resolution,
) -> Result<()> {
    if let Resolution::Reply {
        desk: Some(key), ..
    } = resolution
    {
        let first = sqlx::query(
            "INSERT INTO desk_replies (key, at) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        )
        .bind(key)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if first == 0 {
            // Sent already: the desk delivered its message again.
            return Ok(());
        }
    }
    let held = sqlx::query(
        "SELECT r.batch_id, r.outbox_id, r.state, c.channel FROM review r
         JOIN batches b ON b.id = r.batch_id JOIN conversations c ON c.id = b.conversation_id
         WHERE r.id = $1 FOR UPDATE OF r",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(held) = held else {
        return Err(Error::NotFound);
    };
    let (batch, outbox, state, channel): (i64, Option<i64>, String, String) =
        (held.get(0), held.get(1), held.get(2), held.get(3));
    let settled = sql::settled(&state, &channel, resolution)?;
    let note = match resolution {
        Resolution::Reply { text, sandbox, .. } => {
            person_reply(&mut *tx, batch, now, text, *sandbox).await?;
            Some(text.as_str())
        }
        Resolution::Requeue => {
            match outbox {
                // A person decided the part may go again: a fresh start, whatever happened.
                Some(part) => outbox::step(&mut *tx, part, &Event::Requeue, now)
                    .await
                    .map(drop)?,
                None => requeue_batch(&mut *tx, batch, now).await?,
            }
            None
        }
        Resolution::Close => None,
    };
    hold(&mut *tx, batch, review::hold_after(resolution, now)).await?;
    if settled == ReviewState::Open {
        // A person answering a live chat holds it: the item stays open, with their last word.
        sqlx::query("UPDATE review SET resolution_note = $2 WHERE id = $1")
            .bind(id)
            .bind(note)
            .execute(&mut *tx)
            .await?;
        return Ok(());
    }
    sqlx::query(
        "UPDATE review SET state = $2, resolved_at = $3, resolution = $2, resolution_note = $4
         WHERE id = $1",
    )
    .bind(id)
    .bind(settled.as_str())
    .bind(now)
    .bind(note)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// A person's hold on the batch's conversation after their step: renewed by a reply (never
/// shortened), let go by closing or requeuing ([`review::hold_after`]).
async fn hold(conn: &mut PgConnection, batch: i64, until: Option<At>) -> Result<()> {
    sqlx::query(
        "UPDATE conversations
         SET held_until = CASE WHEN $2::BIGINT IS NULL THEN NULL
                               ELSE GREATEST(COALESCE(held_until, 0), $2::BIGINT) END
         WHERE id = (SELECT conversation_id FROM batches WHERE id = $1)",
    )
    .bind(batch)
    .bind(until)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn person_reply(
    conn: &mut PgConnection,
    batch: i64,
    now: At,
    text: &str,
    sandbox: bool,
) -> Result<()> {
    let conversation: i64 = sqlx::query_scalar("SELECT conversation_id FROM batches WHERE id = $1")
        .bind(batch)
        .fetch_one(&mut *conn)
        .await?;
    // Also orders two people's replies to one batch: the second numbers its part after the first.
    lock_conversation(conn, conversation).await?;
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE inbox SET state = '{answered}'
         WHERE batch_id = $1 AND channel = 'webchat' AND kind = 'message'",
        answered = ItemState::Answered,
    )))
    .bind(batch)
    .execute(&mut *conn)
    .await?;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO outbox (batch_id, part, channel, business, customer, body, state, created_at,
                             conversation_id, updated_at, by_person)
         SELECT b.id, COALESCE((SELECT max(part) + 1 FROM outbox WHERE batch_id = b.id), 0),
                c.channel, c.business, c.customer, $3, {first_state}, $2, c.id, $2, true
         FROM batches b JOIN conversations c ON c.id = b.conversation_id WHERE b.id = $1",
        first_state = sql::first_state("c.channel", "$4"),
    )))
    .bind(batch)
    .bind(now)
    .bind(text)
    .bind(sandbox)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn requeue_batch(conn: &mut PgConnection, batch: i64, now: At) -> Result<()> {
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE inbox SET state = '{pending}', batch_id = NULL
         WHERE batch_id = $1 AND kind = 'message'",
        pending = ItemState::Pending,
    )))
    .bind(batch)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE conversations SET first_pending_at = COALESCE(first_pending_at, $2),
                last_pending_at = $2, due_at = $2, requeued = true, model_pending = true
         WHERE id = (SELECT conversation_id FROM batches WHERE id = $1)",
    )
    .bind(batch)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

pub(super) async fn conversations(
    pool: &PgPool,
    customer: &str,
    turns: usize,
) -> Result<Vec<ConversationView>> {
    let rows = sqlx::query(
        "SELECT id, channel, business, customer, last_inbound_at FROM conversations
         WHERE customer = $1 ORDER BY id",
    )
    .bind(customer)
    .fetch_all(pool)
    .await?;
    let mut views = Vec::with_capacity(rows.len());
    for r in rows {
        views.push(ConversationView {
            conversation: conversation_at(&r, 1)?,
            last_inbound_at: r.get(4),
            history: conversation_history(pool, r.get(0), i64::MAX, turns).await?,
        });
    }
    Ok(views)
}

pub(super) async fn gauges(pool: &PgPool, now: At) -> Result<Gauges> {
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT
             (SELECT count(*) FROM conversations WHERE due_at <= $1 AND open_batch_id IS NULL),
             {}",
        sql::gauge_counts().join(", ")
    )))
    .bind(now)
    .fetch_one(pool)
    .await?;
    let n = |i: usize| u64::try_from(row.get::<i64, _>(i)).unwrap_or(0);
    Ok(Gauges {
        due: n(0),
        running: n(1),
        waiting: n(2),
        review: n(3),
        queued_sends: n(4),
        unknown_sends: n(5),
    })
}
