//! A help desk's threads and mirroring on PostgreSQL (see [`Desk`](crate::store::Desk)).

use sqlx::{AssertSqlSafe, PgPool, Row};

use super::conversation_at;
use crate::clock::At;
use crate::domain::ConversationKey;
use crate::store::rules::review::DESK_HOLD;
use crate::store::{DeskThread, Error, Result, ReviewState};

pub(super) async fn thread(pool: &PgPool, c: &ConversationKey) -> Result<Option<DeskThread>> {
    let row = sqlx::query(
        "SELECT desk_thread, desk_open FROM conversations
         WHERE channel = $1 AND business = $2 AND customer = $3 AND desk_thread IS NOT NULL",
    )
    .bind(c.channel.as_str())
    .bind(&c.business)
    .bind(&c.customer)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| DeskThread {
        thread: r.get(0),
        open: r.get(1),
    }))
}

/// The thread is the conversation's, open, and the desk holds the conversation.
pub(super) async fn open(pool: &PgPool, c: &ConversationKey, thread: &str) -> Result<()> {
    let changed = sqlx::query(
        "UPDATE conversations SET desk_thread = $4, desk_open = TRUE,
             held_until = GREATEST(COALESCE(held_until, 0), $5)
         WHERE channel = $1 AND business = $2 AND customer = $3",
    )
    .bind(c.channel.as_str())
    .bind(&c.business)
    .bind(&c.customer)
    .bind(thread)
    .bind(DESK_HOLD)
    .execute(pool)
    .await?
    .rows_affected();
    if changed == 0 {
        return Err(Error::NotFound);
    }
    Ok(())
}

pub(super) async fn close(pool: &PgPool, thread: &str) -> Result<Option<ConversationKey>> {
    let row = sqlx::query(
        "UPDATE conversations SET desk_open = FALSE, held_until = NULL WHERE desk_thread = $1
         RETURNING channel, business, customer",
    )
    .bind(thread)
    .fetch_optional(pool)
    .await?;
    row.map(|r| conversation_at(&r, 0)).transpose()
}

pub(super) async fn conversation(pool: &PgPool, thread: &str) -> Result<Option<ConversationKey>> {
    let row =
        sqlx::query("SELECT channel, business, customer FROM conversations WHERE desk_thread = $1")
            .bind(thread)
            .fetch_optional(pool)
            .await?;
    row.map(|r| conversation_at(&r, 0)).transpose()
}

/// Open items the desk has not seen whole: never mirrored, or with a message past what was.
pub(super) async fn pending(pool: &PgPool, limit: usize) -> Result<Vec<(i64, Option<i64>)>> {
    Ok(sqlx::query_as(AssertSqlSafe(format!(
        "SELECT r.id, r.desk_seq FROM review r
         WHERE r.state = '{open}' AND (r.desk_seq IS NULL OR EXISTS (
             SELECT 1 FROM inbox i WHERE i.batch_id = r.batch_id AND i.seq > r.desk_seq))
         ORDER BY r.id LIMIT $1",
        open = ReviewState::Open,
    )))
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_all(pool)
    .await?)
}

/// True the first time desk message `key` is claimed.
pub(super) async fn claim(pool: &PgPool, key: &str, now: At) -> Result<bool> {
    let inserted =
        sqlx::query("INSERT INTO desk_replies (key, at) VALUES ($1, $2) ON CONFLICT DO NOTHING")
            .bind(key)
            .bind(now)
            .execute(pool)
            .await?
            .rows_affected();
    Ok(inserted > 0)
}

pub(super) async fn set_mirrored(pool: &PgPool, item: i64, seq: i64) -> Result<()> {
    sqlx::query("UPDATE review SET desk_seq = GREATEST(COALESCE(desk_seq, 0), $2) WHERE id = $1")
        .bind(item)
        .bind(seq)
        .execute(pool)
        .await?;
    Ok(())
}
