//! A help desk's threads and mirroring on PostgreSQL (see [`Desk`](crate::store::Desk)).

use sqlx::{PgPool, Row};

use super::conversation_at;
use crate::domain::ConversationKey;
use crate::store::rules::review::DESK_HOLD;
use crate::store::{DeskThread, Error, Result};

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

pub(super) async fn mirrored(pool: &PgPool, items: &[i64]) -> Result<Vec<(i64, i64)>> {
    Ok(sqlx::query_as(
        "SELECT id, desk_seq FROM review WHERE id = ANY($1) AND desk_seq IS NOT NULL",
    )
    .bind(items)
    .fetch_all(pool)
    .await?)
}

pub(super) async fn set_mirrored(pool: &PgPool, item: i64, seq: i64) -> Result<()> {
    sqlx::query("UPDATE review SET desk_seq = GREATEST(COALESCE(desk_seq, 0), $2) WHERE id = $1")
        .bind(item)
        .bind(seq)
        .execute(pool)
        .await?;
    Ok(())
}
