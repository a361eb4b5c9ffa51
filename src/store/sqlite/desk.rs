//! A help desk's threads and mirroring on SQLite (see [`Desk`](crate::store::Desk)).

use rusqlite::{Connection, OptionalExtension, params};

use super::customers::count;
use super::{conversation_at, execute, limit_param, unavailable};
use crate::clock::At;
use crate::domain::ConversationKey;
use crate::store::rules::review::DESK_HOLD;
use crate::store::{DeskThread, Error, Result, ReviewState};

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

/// Open items the desk has not seen whole: never mirrored, or with a message past what was.
pub(super) fn pending(conn: &Connection, limit: usize) -> Result<Vec<(i64, Option<i64>)>> {
    conn.prepare_cached(&format!(
        "SELECT r.id, r.desk_seq FROM review r
         WHERE r.state = '{open}' AND (r.desk_seq IS NULL OR EXISTS (
             SELECT 1 FROM inbox i WHERE i.batch_id = r.batch_id AND i.seq > r.desk_seq))
         ORDER BY r.id LIMIT ?1",
        open = ReviewState::Open,
    ))
    .and_then(|mut s| {
        s.query_map(params![limit_param(limit)], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect()
    })
    .map_err(unavailable)
}

/// True the first time desk message `key` is claimed.
pub(super) fn claim(conn: &Connection, key: &str, now: At) -> Result<bool> {
    count(
        conn,
        "INSERT INTO desk_replies (key, at) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        params![key, now],
    )
    .map(|n| n > 0)
}

pub(super) fn set_mirrored(conn: &Connection, item: i64, seq: i64) -> Result<()> {
    execute(
        conn,
        "UPDATE review SET desk_seq = max(coalesce(desk_seq, 0), ?2) WHERE id = ?1",
        params![item, seq],
    )
}
