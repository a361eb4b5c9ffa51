//! The web chat's side of the SQLite store: a question is an inbox message like a WhatsApp
//! one, and its job is the unguessable handle its browser asks about. Submitting runs in the
//! group-commit writer, so "is this (session, message id) known?" and "store it" are one
//! transaction: two racing double-taps cannot both create a job.

use std::time::Duration;

use crate::clock::At;
use crate::store::rules::erasure::Marks;
use rusqlite::{Connection, OptionalExtension, params};

use super::{ingest, limit_param, unavailable};
use crate::store::items::{
    Encoded, POSITION_CAP, message_key, options_of, question_item, session_retry_after, status_of,
};

use crate::store::rules::review::{self, Destination, ReviewState};
use crate::store::sql;
use crate::store::{
    ChatExchange, ChatFeed, ChatJob, ChatReceipt, ChatSubmission, Error, JobStatus, PersonLine,
    Result, Submitted,
};

pub(super) fn submit(conn: &Connection, s: &ChatSubmission, marks: &Marks) -> Result<Submitted> {
    let key = message_key(&s.session_id, s.message_id.as_deref().unwrap_or(&s.job_id));
    // Before the resend's lookup: another's message id names nothing here.
    match (owner(conn, &s.session_id)?, &s.user_id) {
        (Some(owner), Some(user)) if owner == *user => {}
        (Some(_), _) => return Ok(Submitted::NotYours),
        (None, Some(user)) => {
            conn.prepare_cached(
                "INSERT INTO chat_owners (session_id, user_id, bound_at) VALUES (?1, ?2, ?3)",
            )
            .and_then(|mut st| st.execute(params![s.session_id, user, s.now]))
            .map_err(unavailable)?;
        }
        (None, None) => {}
    }
    // Asked again inside the transaction: two submissions racing past the HTTP layer's own
    // lookup meet here, one after the other.
    if let Some(job_id) = job_for_key(conn, &key)? {
        return Ok(Submitted::Job(ChatReceipt {
            job_id,
            created: false,
            earliest_due: None,
        }));
    }
    // Counted in the same transaction as the insert: the single writer makes them exact.
    let since = s.now - Duration::from_secs(60);
    let recent = session_recent(conn, &s.session_id, since)?;
    if recent >= s.per_minute {
        // The question whose minute ends first and leaves room for one more.
        let freeing: Option<At> = conn
            .prepare_cached(
                "SELECT created_at FROM chat_jobs WHERE session_id = ?1 AND created_at >= ?2
                 ORDER BY created_at LIMIT 1 OFFSET ?3",
            )
            .and_then(|mut st| {
                st.query_row(
                    params![
                        s.session_id,
                        since,
                        limit_param((recent - s.per_minute) as usize)
                    ],
                    |r| r.get(0),
                )
                .optional()
            })
            .map_err(unavailable)?;
        return Ok(Submitted::TooFast {
            retry_after: session_retry_after(freeing, s.now),
        });
    }
    if queue_depth(conn)? >= s.max_queue {
        return Ok(Submitted::QueueFull);
    }
    let mut item = question_item(s, key.clone());
    let latest = latest_review(conn, &s.business, &s.session_id)?;
    let destination = review::destination(latest.map(|(state, _)| state));
    if destination == Destination::Person {
        // Kept without a turn of its own; it joins the person's batch below.
        item.turn = None;
    }
    let encoded = Encoded::of(&item);
    let erased = marks.key_hash(item.channel, &item.dedupe_key);
    let delivery = sql::chat_delivery(item, s);
    let receipt = ingest::ingest(
        conn,
        &delivery,
        std::slice::from_ref(&encoded),
        std::slice::from_ref(&erased),
    )?;
    // Not stored only when the question was erased since: refused, as on the other stores.
    let seq: i64 = conn
        .prepare_cached("SELECT seq FROM inbox WHERE channel = 'webchat' AND dedupe_key = ?1")
        .and_then(|mut st| st.query_row(params![key], |r| r.get(0)).optional())
        .map_err(unavailable)?
        .ok_or(Error::NotFound)?;
    if let (Destination::Person, Some((_, batch))) = (destination, latest) {
        conn.prepare_cached(
            "UPDATE inbox SET state = ?2, batch_id = ?3,
                    conversation_id = (SELECT conversation_id FROM batches WHERE id = ?3)
             WHERE seq = ?1",
        )
        .and_then(|mut st| st.execute(params![seq, review::arriving(destination).as_str(), batch]))
        .map_err(unavailable)?;
    }
    conn.prepare_cached(
        "INSERT INTO chat_jobs (job_id, session_id, message_key, inbox_seq, created_at, expires_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut st| {
        st.execute(params![
            s.job_id,
            s.session_id,
            key,
            seq,
            s.now,
            s.now + s.keep
        ])
    })
    .map_err(unavailable)?;
    Ok(Submitted::Job(ChatReceipt {
        job_id: s.job_id.clone(),
        created: true,
        earliest_due: receipt.earliest_due,
    }))
}

/// The state and batch of the latest review item of the session's conversation on `business`.
fn latest_review(
    conn: &Connection,
    business: &str,
    session_id: &str,
) -> Result<Option<(ReviewState, i64)>> {
    let found: Option<(String, i64)> = conn
        .prepare_cached(
            "SELECT r.state, r.batch_id FROM conversations c
             JOIN batches b ON b.conversation_id = c.id JOIN review r ON r.batch_id = b.id
             WHERE c.channel = 'webchat' AND c.business = ?1 AND c.customer = ?2
             ORDER BY r.id DESC LIMIT 1",
        )
        .and_then(|mut st| {
            st.query_row(params![business, session_id], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
        })
        .map_err(unavailable)?;
    Ok(found.and_then(|(state, batch)| Some((ReviewState::parse(&state)?, batch))))
}

/// What people wrote to the session after `after`, and whether one holds it now.
pub(super) fn feed(
    conn: &Connection,
    session_id: &str,
    after: i64,
    limit: usize,
) -> Result<ChatFeed> {
    let lines = conn
        .prepare_cached(
            "SELECT o.id, o.body, o.created_at FROM outbox o INDEXED BY outbox_person
             WHERE o.by_person = 1 AND o.id > ?2 AND o.conversation_id IN
                   (SELECT id FROM conversations WHERE channel = 'webchat' AND customer = ?1)
             ORDER BY o.id LIMIT ?3",
        )
        .and_then(|mut st| {
            st.query_map(params![session_id, after, limit_param(limit)], |r| {
                Ok(PersonLine {
                    id: r.get(0)?,
                    text: r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                    at: r.get(2)?,
                })
            })?
            .collect()
        })
        .map_err(unavailable)?;
    // Held exactly when the visitor's next message would go to a person: by the latest item.
    let latest: Option<String> = conn
        .prepare_cached(
            "SELECT r.state FROM conversations c JOIN batches b ON b.conversation_id = c.id
             JOIN review r ON r.batch_id = b.id
             WHERE c.channel = 'webchat' AND c.customer = ?1
             ORDER BY r.id DESC LIMIT 1",
        )
        .and_then(|mut st| st.query_row(params![session_id], |r| r.get(0)).optional())
        .map_err(unavailable)?;
    let held =
        review::destination(latest.as_deref().and_then(ReviewState::parse)) == Destination::Person;
    Ok(ChatFeed { held, lines })
}

/// The job already made for (session, message id), if any.
pub(super) fn job_for_message(
    conn: &Connection,
    session_id: &str,
    message_id: &str,
) -> Result<Option<String>> {
    job_for_key(conn, &message_key(session_id, message_id))
}

fn job_for_key(conn: &Connection, key: &str) -> Result<Option<String>> {
    conn.prepare_cached("SELECT job_id FROM chat_jobs WHERE message_key = ?1")
        .and_then(|mut st| st.query_row(params![key], |r| r.get(0)).optional())
        .map_err(unavailable)
}

pub(super) fn job(conn: &Connection, job_id: &str, now: At) -> Result<Option<ChatJob>> {
    let row: Option<(String, At, At, String, Option<i64>, i64)> = conn
        .prepare_cached(
            "SELECT j.session_id, j.created_at, j.expires_at, i.state, i.batch_id, i.seq
             FROM chat_jobs j JOIN inbox i ON i.seq = j.inbox_seq WHERE j.job_id = ?1",
        )
        .and_then(|mut st| {
            st.query_row(params![job_id], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })
            .optional()
        })
        .map_err(unavailable)?;
    let Some((session_id, created_at, expires_at, state, batch, seq)) = row else {
        return Ok(None);
    };
    if expires_at <= now {
        return Ok(None);
    }
    let status = status_of(&state);
    let position = match status {
        JobStatus::Queued => Some(queued_ahead(conn, seq)?),
        _ => None,
    };
    let (answer, options) = match (status, batch) {
        (JobStatus::Finished, Some(batch)) => answer_of(conn, batch)?,
        _ => (None, Vec::new()),
    };
    let stage = match (status, batch) {
        (JobStatus::Started, Some(batch)) => stage_of(conn, batch)?,
        _ => None,
    };
    Ok(Some(ChatJob {
        job_id: job_id.to_owned(),
        session_id,
        status,
        stage,
        position,
        answer,
        options,
        created_at,
    }))
}

fn stage_of(conn: &Connection, batch: i64) -> Result<Option<String>> {
    conn.prepare_cached("SELECT stage FROM batches WHERE id = ?1")
        .and_then(|mut s| s.query_row(params![batch], |r| r.get(0)).optional())
        .map(Option::flatten)
        .map_err(unavailable)
}

/// Questions ahead, counted up to [`POSITION_CAP`]: past it the exact figure tells a person
/// nothing more, and counting further would cost every poll a longer scan.
fn queued_ahead(conn: &Connection, seq: i64) -> Result<u64> {
    conn.prepare_cached(&format!(
        "SELECT count(*) FROM (SELECT 1 FROM inbox INDEXED BY inbox_webchat_pending
         WHERE {waiting} AND seq < ?1 LIMIT ?2)",
        waiting = *sql::WEBCHAT_WAITING_SQL,
    ))
    .and_then(|mut st| st.query_row(params![seq, POSITION_CAP], |r| r.get(0)))
    .map_err(unavailable)
}

/// The reply to the batch the question was answered in, its parts joined, and the choices its
/// last part offers.
fn answer_of(conn: &Connection, batch: i64) -> Result<(Option<String>, Vec<String>)> {
    let parts: Vec<(String, Option<String>)> = conn
        .prepare_cached("SELECT body, options FROM outbox WHERE batch_id = ?1 ORDER BY part")
        .and_then(|mut st| {
            st.query_map(params![batch], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
        .map_err(unavailable)?;
    let options = options_of(parts.last().and_then(|(_, o)| o.as_deref()));
    let bodies: Vec<String> = parts.into_iter().map(|(body, _)| body).collect();
    Ok(((!bodies.is_empty()).then(|| bodies.join("\n\n")), options))
}

/// The verified user the session is bound to, if any.
pub(super) fn owner(conn: &Connection, session_id: &str) -> Result<Option<String>> {
    conn.prepare_cached("SELECT user_id FROM chat_owners WHERE session_id = ?1")
        .and_then(|mut st| st.query_row(params![session_id], |r| r.get(0)).optional())
        .map_err(unavailable)
}

pub(super) fn history(
    conn: &Connection,
    session_id: &str,
    before: Option<i64>,
    limit: usize,
) -> Result<Vec<ChatExchange>> {
    // In the order asked: arrival order, which the clocks of nodes sharing the store (whose
    // `now` each question carries) cannot reorder.
    let rows: Vec<(ChatExchange, Option<i64>)> = conn
        .prepare_cached(
            "SELECT j.job_id, i.text, i.state, i.batch_id, j.created_at, j.inbox_seq
             FROM chat_jobs j JOIN inbox i ON i.seq = j.inbox_seq
             WHERE j.session_id = ?1 AND j.inbox_seq < ?3 ORDER BY j.inbox_seq DESC LIMIT ?2",
        )
        .and_then(|mut st| {
            let before = before.unwrap_or(i64::MAX);
            st.query_map(params![session_id, limit_param(limit), before], |r| {
                let exchange = ChatExchange {
                    cursor: r.get(5)?,
                    job_id: r.get(0)?,
                    question: r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                    answer: None,
                    status: status_of(&r.get::<_, String>(2)?),
                    asked_at: r.get(4)?,
                };
                Ok((exchange, r.get(3)?))
            })?
            .collect()
        })
        .map_err(unavailable)?;
    let mut exchanges = Vec::with_capacity(rows.len());
    for (mut exchange, batch) in rows.into_iter().rev() {
        if let (JobStatus::Finished, Some(batch)) = (exchange.status, batch) {
            exchange.answer = answer_of(conn, batch)?.0;
        }
        exchanges.push(exchange);
    }
    Ok(exchanges)
}

pub(super) fn queue_depth(conn: &Connection) -> Result<u64> {
    conn.prepare_cached(&format!(
        "SELECT count(*) FROM inbox INDEXED BY inbox_webchat_pending WHERE {}",
        *sql::WEBCHAT_WAITING_SQL
    ))
    .and_then(|mut st| st.query_row([], |r| r.get(0)))
    .map_err(unavailable)
}

fn session_recent(conn: &Connection, session_id: &str, since: At) -> Result<u64> {
    conn.prepare_cached("SELECT count(*) FROM chat_jobs WHERE session_id = ?1 AND created_at >= ?2")
        .and_then(|mut st| st.query_row(params![session_id, since], |r| r.get(0)))
        .map_err(unavailable)
}
