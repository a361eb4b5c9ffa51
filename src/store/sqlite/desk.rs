//! A help desk's threads and mirroring on SQLite (see [`Desk`](crate::store::Desk)).

use rusqlite::{Connection, OptionalExtension, params};

use super::customers::count;
use super::{conversation_at, execute, unavailable};
use crate::domain::ConversationKey;
use crate::store::rules::review::DESK_HOLD;
use crate::store::{DeskThread, Error, Result};

pub(super) fn thread(conn: &Connection, c: &ConversationKey) -> Result<Option<DeskThread>> {
    conn.prepare_cached(
        "SELECT desk_thread, desk_open FROM conversations
         WHERE channel = ?1 AND business = ?2 AND customer = ?3 AND desk_thread IS NOT NULL",
    )
    .and_then(|mut s| {
        s.query_row(params![c.channel, c.business, c.customer], |r| {
            Ok(DeskThread {
                thread: r.get(0)?,
                open: r.get(1)?,
            })
        })
        .optional()
    })
    .map_err(unavailable)
}

/// The thread is the conversation's, open, and the desk holds the conversation.
pub(super) fn open(conn: &Connection, c: &ConversationKey, thread: &str) -> Result<()> {
    let changed = count(
        conn,
        "UPDATE conversations SET desk_thread = ?4, desk_open = 1,
             held_until = max(coalesce(held_until, 0), ?5)
         WHERE channel = ?1 AND business = ?2 AND customer = ?3",
        params![c.channel, c.business, c.customer, thread, DESK_HOLD],
    )?;
    if changed == 0 {
        return Err(Error::NotFound);
    }
    Ok(())
}

pub(super) fn close(conn: &Connection, thread: &str) -> Result<Option<ConversationKey>> {
    conn.prepare_cached(
        "UPDATE conversations SET desk_open = 0, held_until = NULL WHERE desk_thread = ?1
         RETURNING channel, business, customer",
    )
    .and_then(|mut s| {
        s.query_row(params![thread], |r| conversation_at(r, 0))
            .optional()
    })
    .map_err(unavailable)
}

pub(super) fn conversation(conn: &Connection, thread: &str) -> Result<Option<ConversationKey>> {
    conn.prepare_cached(
        "SELECT channel, business, customer FROM conversations WHERE desk_thread = ?1",
    )
    .and_then(|mut s| {
        s.query_row(params![thread], |r| conversation_at(r, 0))
            .optional()
    })
    .map_err(unavailable)
}

pub(super) fn mirrored(conn: &Connection, items: &[i64]) -> Result<Vec<(i64, i64)>> {
    let ids = serde_json::to_string(items).unwrap_or_default();
    conn.prepare_cached(
        "SELECT id, desk_seq FROM review
         WHERE id IN (SELECT value FROM json_each(?1)) AND desk_seq IS NOT NULL",
    )
    .and_then(|mut s| {
        s.query_map(params![ids], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect()
    })
    .map_err(unavailable)
}

pub(super) fn set_mirrored(conn: &Connection, item: i64, seq: i64) -> Result<()> {
    execute(
        conn,
        "UPDATE review SET desk_seq = max(coalesce(desk_seq, 0), ?2) WHERE id = ?1",
        params![item, seq],
    )
}
