//! The people's side of the SQLite store: the review queue, settling its items, conversations
//! by customer, and the pipeline's counts for `/metrics`.

use rusqlite::{Connection, OptionalExtension, params};

use super::execute;
use super::outbox;
use super::turns::{conversation_history, load_batch};
use super::{conversation_at, limit_param, unavailable};
use crate::clock::At;
use crate::domain::{ConversationKey, ReviewReason};
use crate::store::rules::item::ItemState;
use crate::store::rules::part::Event;
use crate::store::rules::review::{self, ReviewState};
use crate::store::sql;
use crate::store::{ConversationView, Error, Gauges, Resolution, Result, ReviewEntry, ReviewQuery};

type Row = (
    i64,
    i64,
    ReviewReason,
    Option<String>,
    At,
    Option<i64>,
    ReviewState,
);

const COLUMNS: &str = "r.id, r.batch_id, r.reason, r.error, r.created_at, r.outbox_id, r.state";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
    ))
}

fn entry(conn: &Connection, row: Row) -> Result<ReviewEntry> {
    let (id, batch_id, reason, error, created_at, outbox_id, state) = row;
    let batch = load_batch(conn, batch_id)?;
    Ok(ReviewEntry {
        id,
        batch_id,
        outbox_id,
        state,
        conversation: batch.conversation,
        reason,
        error,
        created_at,
        messages: batch.messages,
    })
}

pub(super) fn queue(conn: &Connection, query: &ReviewQuery) -> Result<Vec<ReviewEntry>> {
    let rows: Vec<Row> = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM review r JOIN batches b ON b.id = r.batch_id
             JOIN conversations c ON c.id = b.conversation_id
             WHERE r.state = '{open}' AND (?1 IS NULL OR r.reason = ?1) AND (?2 IS NULL OR c.customer = ?2)
             ORDER BY c.channel = 'webchat', r.id LIMIT ?3",
            open = ReviewState::Open,
        ))
        .and_then(|mut s| {
            s.query_map(
                params![
                    query.reason.map(ReviewReason::as_str),
                    query.customer,
                    limit_param(query.limit.unwrap_or(usize::MAX))
                ],
                row,
            )?
            .collect()
        })
        .map_err(unavailable)?;
    rows.into_iter().map(|r| entry(conn, r)).collect()
}

pub(super) fn item(conn: &Connection, id: i64) -> Result<Option<ReviewEntry>> {
    let found = conn
        .prepare_cached(&format!("SELECT {COLUMNS} FROM review r WHERE r.id = ?1"))
        .and_then(|mut s| s.query_row(params![id], row).optional())
        .map_err(unavailable)?;
    found.map(|r| entry(conn, r)).transpose()
}

pub(super) fn resolve(conn: &Connection, id: i64, now: At, resolution: &Resolution) -> Result<()> {
    if let Resolution::Reply {
        desk: Some(key), ..
    } = resolution
    {
        let first = conn
            .prepare_cached(
                "INSERT INTO desk_replies (key, at) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            )
            .and_then(|mut s| s.execute(params![key, now]))
            .map_err(unavailable)?;
        if first == 0 {
            // Sent already: the desk delivered its message again.
            return Ok(());
        }
    }
    let held: Option<(i64, Option<i64>, String, String)> = conn
        .prepare_cached(
            "SELECT r.batch_id, r.outbox_id, r.state, c.channel FROM review r
             JOIN batches b ON b.id = r.batch_id JOIN conversations c ON c.id = b.conversation_id
             WHERE r.id = ?1",
        )
        .and_then(|mut s| {
            s.query_row(params![id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .optional()
        })
        .map_err(unavailable)?;
    let Some((batch, outbox, state, channel)) = held else {
        return Err(Error::NotFound);
    };
    let settled = sql::settled(&state, &channel, resolution)?;
    hold(conn, batch, review::hold_after(resolution, now))?;
    let note = match resolution {
        Resolution::Reply { text, sandbox, .. } => {
            person_reply(conn, batch, now, text, *sandbox)?;
            Some(text.as_str())
        }
        Resolution::Requeue => {
            match outbox {
                // A person decided the part may go again: a fresh start, whatever happened.
                Some(part) => outbox::step(conn, part, &Event::Requeue, now).map(drop)?,
                None => requeue_batch(conn, batch, now)?,
            }
            None
        }
        Resolution::Close => None,
    };
    if settled == ReviewState::Open {
        // A person answering a live chat holds it: the item stays open, with their last word.
        return execute(
            conn,
            "UPDATE review SET resolution_note = ?2 WHERE id = ?1",
            params![id, note],
        );
    }
    execute(
        conn,
        "UPDATE review SET state = ?2, resolved_at = ?3, resolution = ?2, resolution_note = ?4
         WHERE id = ?1",
        params![id, settled.as_str(), now, note],
    )
}

/// A person's hold on the batch's conversation after their step: renewed by a reply (never
/// shortened), let go by closing or requeuing ([`review::hold_after`]).
fn hold(conn: &Connection, batch: i64, until: Option<At>) -> Result<()> {
    execute(
        conn,
        "UPDATE conversations
         SET held_until = CASE WHEN ?2 IS NULL THEN NULL ELSE max(coalesce(held_until, 0), ?2) END
         WHERE id = (SELECT conversation_id FROM batches WHERE id = ?1)",
        params![batch, until],
    )
}

/// A person's reply joins the batch's reply parts, after the last, and goes out like any
/// other part: in order, paced, inside the 24-hour window (or as the template). A web-chat
/// question counts as answered then, so its browser shows the reply.
fn person_reply(conn: &Connection, batch: i64, now: At, text: &str, sandbox: bool) -> Result<()> {
    execute(
        conn,
        &format!(
            "UPDATE inbox SET state = '{answered}'
             WHERE batch_id = ?1 AND channel = 'webchat' AND kind = 'message'",
            answered = ItemState::Answered,
        ),
        params![batch],
    )?;
    execute(
        conn,
        &format!(
            "INSERT INTO outbox (batch_id, part, channel, business, customer, body, state, created_at,
                                 conversation_id, updated_at, by_person)
             SELECT b.id, coalesce((SELECT max(part) + 1 FROM outbox WHERE batch_id = b.id), 0),
                    c.channel, c.business, c.customer, ?3, {first_state}, ?2, c.id, ?2, 1
             FROM batches b JOIN conversations c ON c.id = b.conversation_id WHERE b.id = ?1",
            first_state = sql::first_state("c.channel", "?4"),
        ),
        params![batch, now, text, sandbox],
    )
}

/// The batch's messages wait for a new turn, due now and in the model's lane (the turn
/// the person retries is one the router did not settle); the old batch stays as it ended.
fn requeue_batch(conn: &Connection, batch: i64, now: At) -> Result<()> {
    execute(
        conn,
        &format!(
            "UPDATE inbox SET state = '{pending}', batch_id = NULL
             WHERE batch_id = ?1 AND kind = 'message'",
            pending = ItemState::Pending,
        ),
        params![batch],
    )?;
    execute(
        conn,
        "UPDATE conversations SET first_pending_at = coalesce(first_pending_at, ?2),
                last_pending_at = ?2, due_at = ?2, requeued = 1, model_pending = 1
         WHERE id = (SELECT conversation_id FROM batches WHERE id = ?1)",
        params![batch, now],
    )
}

pub(super) fn conversations(
    conn: &Connection,
    customer: &str,
    turns: usize,
) -> Result<Vec<ConversationView>> {
    let found: Vec<(i64, ConversationKey, Option<At>)> = conn
        .prepare_cached(
            "SELECT id, channel, business, customer, last_inbound_at FROM conversations
             WHERE customer = ?1 ORDER BY id",
        )
        .and_then(|mut s| {
            s.query_map(params![customer], |r| {
                let key = conversation_at(r, 1)?;
                Ok((r.get(0)?, key, r.get(4)?))
            })?
            .collect()
        })
        .map_err(unavailable)?;
    found
        .into_iter()
        .map(|(id, conversation, last_inbound_at)| {
            Ok(ConversationView {
                conversation,
                last_inbound_at,
                history: conversation_history(conn, id, i64::MAX, turns)?,
            })
        })
        .collect()
}

pub(super) fn gauges(conn: &Connection, now: At) -> Result<Gauges> {
    let [running, waiting, review, queued, unknown] = sql::gauge_counts();
    let count = |sql: &str| -> Result<u64> {
        conn.prepare_cached(sql)
            .and_then(|mut s| s.query_row(params![now], |r| r.get(0)))
            .map_err(unavailable)
    };
    Ok(Gauges {
        due: count(
            "SELECT count(*) FROM conversations WHERE due_at <= ?1 AND open_batch_id IS NULL",
        )?,
        running: count(&format!("SELECT {running} + 0 * ?1"))?,
        waiting: count(&format!("SELECT {waiting} + 0 * ?1"))?,
        review: count(&format!("SELECT {review} + 0 * ?1"))?,
        queued_sends: count(&format!("SELECT {queued} + 0 * ?1"))?,
        unknown_sends: count(&format!("SELECT {unknown} + 0 * ?1"))?,
    })
}
