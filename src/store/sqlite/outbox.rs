//! The sender's side of the SQLite store: claiming reply parts under a send lease, recording
//! how each send ended, and reconciling the outbox with Meta's status webhooks. Every write
//! runs in the group-commit writer, so each operation is one transaction.
//!
//! A part is claimed only when it is the oldest unsettled part of its recipient, so parts go
//! out in order; it is claimed with a fresh attempt number that its outcome must carry, and a
//! part whose send may have left is never claimed again: it waits for a status webhook.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::execute;
use super::{conversation_at, limit_param, unavailable};
use crate::clock::At;
use crate::domain::ReviewReason;
use crate::store::rules::part::{
    self, CLAIMABLE_SQL, Delivery, Event, HELD_BACK_SQL, Part, PartKind, PartState, Status,
};
use crate::store::rules::review::ReviewState;
use crate::store::{
    Error, OutboxEntry, Result, SendClaim, SendClaims, SendJob, SendResult, parse_send_callback,
};

pub(super) fn claim_sends(conn: &Connection, claim: &SendClaim) -> Result<SendClaims> {
    let unknown = settle_lapsed(conn, claim)?;
    let halted = serde_json::to_string(&claim.halted).unwrap_or_else(|_| "[]".into());
    let ids: Vec<i64> = conn
        .prepare_cached(&format!(
            "SELECT o.id FROM outbox o JOIN conversations c ON c.id = o.conversation_id
             WHERE o.state IN {claimable}
               AND coalesce(o.next_attempt_at, 0) <= ?1 AND coalesce(c.send_after, 0) <= ?1
               AND o.business NOT IN (SELECT value FROM json_each(?2))
               AND NOT {held_back}
             ORDER BY o.id LIMIT ?3",
            claimable = *CLAIMABLE_SQL,
            held_back = *HELD_BACK_SQL,
        ))
        .and_then(|mut s| {
            s.query_map(params![claim.now, halted, limit_param(claim.limit)], |r| {
                r.get(0)
            })?
            .collect()
        })
        .map_err(unavailable)?;
    let jobs = ids
        .into_iter()
        .map(|id| take(conn, id, claim.now + claim.lease))
        .collect::<Result<_>>()?;
    Ok(SendClaims { jobs, unknown })
}

/// Claims that lapsed before their part departed go back to the queue. Sends whose lease
/// lapsed (their sender died or hung mid-request) may have reached Meta: they become unknown
/// (or accepted, when a status named them meanwhile); their ids are returned. Unknown ones
/// that no status webhook settled in time go to review.
fn settle_lapsed(conn: &Connection, claim: &SendClaim) -> Result<Vec<i64>> {
    let due = |state: PartState| -> Result<Vec<i64>> {
        conn.prepare_cached("SELECT id FROM outbox WHERE state = ?1 AND send_until <= ?2")
            .and_then(|mut s| {
                s.query_map(params![state.as_str(), claim.now], |r| r.get(0))?
                    .collect()
            })
            .map_err(unavailable)
    };
    let lapsed = Event::LeaseLapsed {
        unknown_wait: claim.unknown_wait,
    };
    for id in due(PartState::Claimed)? {
        step(conn, id, &lapsed, claim.now)?;
    }
    let mut unknown = Vec::new();
    for id in due(PartState::Sending)? {
        if step(conn, id, &lapsed, claim.now)? == Some(PartState::Unknown) {
            unknown.push(id);
        }
    }
    for id in due(PartState::Unknown)? {
        step(conn, id, &Event::WaitOver, claim.now)?;
    }
    Ok(unknown)
}

fn take(conn: &Connection, id: i64, until: At) -> Result<SendJob> {
    conn.prepare_cached(
        "UPDATE outbox SET state = ?3, attempts = attempts + 1, send_until = ?2,
                window_closed = (state = ?4)
         WHERE id = ?1
         RETURNING id, batch_id, part, channel, business, customer, body, options, reply_to,
                   attempts, failures, window_closed,
                   (SELECT last_inbound_at FROM conversations WHERE id = conversation_id)",
    )
    .and_then(|mut s| {
        let (sending, closed) = (PartState::Claimed, PartState::WindowClosed);
        s.query_row(params![id, until, sending.as_str(), closed.as_str()], |r| {
            let options: Option<String> = r.get(7)?;
            Ok(SendJob {
                id: r.get(0)?,
                batch_id: r.get(1)?,
                part: r.get(2)?,
                conversation: conversation_at(r, 3)?,
                text: r.get(6)?,
                options: options
                    .and_then(|o| serde_json::from_str(&o).ok())
                    .unwrap_or_default(),
                quote: r.get(8)?,
                attempt: r.get(9)?,
                failures: r.get(10)?,
                window_closed: r.get(11)?,
                last_inbound_at: r.get(12)?,
            })
        })
    })
    .map_err(unavailable)
}

pub(super) fn record_send(
    conn: &Connection,
    id: i64,
    attempt: u32,
    now: At,
    result: &SendResult,
) -> Result<()> {
    let event = Event::Outcome { attempt, result };
    match step(conn, id, &event, now)? {
        Some(_) => Ok(()),
        None => Err(Error::LeaseLost),
    }
}

pub(super) fn depart(
    conn: &Connection,
    id: i64,
    attempt: u32,
    now: At,
    lease: Duration,
) -> Result<()> {
    match step(conn, id, &Event::Depart { attempt, lease }, now)? {
        Some(_) => Ok(()),
        None => Err(Error::LeaseLost),
    }
}

/// Moves part `id` by the rulebook: loads it, asks [`part::next`], writes what it says; the
/// state it moved to. `None` when there is no such part or the rulebook refused the event:
/// nothing is written.
pub(super) fn step(
    conn: &Connection,
    id: i64,
    event: &Event<'_>,
    now: At,
) -> Result<Option<PartState>> {
    let Some(held) = load(conn, id)? else {
        return Ok(None);
    };
    let Ok(step) = part::next(&held.part, event, now) else {
        return Ok(None);
    };
    save(conn, id, &step.part, now)?;
    if let Some(until) = step.effects.hold_recipient_until {
        execute(
            conn,
            "UPDATE conversations SET send_after = max(coalesce(send_after, 0), ?2) WHERE id = ?1",
            params![held.conversation, until],
        )?;
    }
    if let Some((reason, error)) = &step.effects.review {
        review(conn, held.batch, id, *reason, Some(error), now)?;
    }
    if step.effects.close_review {
        execute(
            conn,
            "UPDATE review SET state = ?2, resolved_at = ?3, resolution = ?2, resolution_note = ?4
             WHERE outbox_id = ?1 AND state = ?5",
            params![
                id,
                ReviewState::Closed.as_str(),
                now,
                part::SETTLED_BY_STATUS,
                ReviewState::Open.as_str()
            ],
        )?;
    }
    Ok(Some(step.part.state))
}

/// A part as the rulebook reads it, with the batch and conversation it belongs to.
struct Loaded {
    part: Part,
    batch: i64,
    conversation: i64,
}

fn load(conn: &Connection, id: i64) -> Result<Option<Loaded>> {
    conn.prepare_cached(
        "SELECT state, attempts, failures, window_closed, wamid, kind, delivery, error_code,
                error, next_attempt_at, send_until, sent_at, batch_id, conversation_id
         FROM outbox WHERE id = ?1",
    )
    .and_then(|mut s| {
        s.query_row(params![id], |r| {
            let name = |i: usize| -> rusqlite::Result<String> { r.get(i) };
            let bad = |i: usize| {
                rusqlite::Error::FromSqlConversionFailure(
                    i,
                    rusqlite::types::Type::Text,
                    "not a name the rulebook knows".into(),
                )
            };
            let delivery: Option<String> = r.get(6)?;
            Ok(Loaded {
                part: Part {
                    state: PartState::parse(&name(0)?).ok_or_else(|| bad(0))?,
                    attempts: r.get(1)?,
                    failures: r.get(2)?,
                    window_closed: r.get(3)?,
                    wamid: r.get(4)?,
                    kind: PartKind::parse(&name(5)?).ok_or_else(|| bad(5))?,
                    delivery: delivery.as_deref().and_then(Delivery::parse),
                    error_code: r.get(7)?,
                    error: r.get(8)?,
                    next_attempt_at: r.get(9)?,
                    until: r.get(10)?,
                    sent_at: r.get(11)?,
                },
                batch: r.get(12)?,
                conversation: r.get(13)?,
            })
        })
        .optional()
    })
    .map_err(unavailable)
}

fn save(conn: &Connection, id: i64, part: &Part, now: At) -> Result<()> {
    execute(
        conn,
        "UPDATE outbox SET state = ?2, failures = ?3, window_closed = ?4, wamid = ?5, kind = ?6,
                delivery = ?7, error_code = ?8, error = ?9, next_attempt_at = ?10,
                send_until = ?11, sent_at = ?12, updated_at = ?13
         WHERE id = ?1",
        params![
            id,
            part.state.as_str(),
            part.failures,
            part.window_closed,
            part.wamid,
            part.kind.as_str(),
            part.delivery.map(Delivery::as_str),
            part.error_code,
            part.error,
            part.next_attempt_at,
            part.until,
            part.sent_at,
            now
        ],
    )
}

/// Opens the part's review item, or opens it again (a person requeued it and it failed anew).
fn review(
    conn: &Connection,
    batch: i64,
    outbox: i64,
    reason: ReviewReason,
    error: Option<&str>,
    now: At,
) -> Result<()> {
    execute(
        conn,
        "INSERT INTO review (batch_id, outbox_id, reason, error, state, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (outbox_id) WHERE outbox_id IS NOT NULL DO UPDATE SET
             reason = excluded.reason, error = excluded.error, state = excluded.state,
             created_at = excluded.created_at, resolved_at = NULL, resolution = NULL,
             resolution_note = NULL",
        params![
            batch,
            outbox,
            reason.as_str(),
            error,
            ReviewState::Open.as_str(),
            now
        ],
    )
}

/// A status webhook about a message Sabi sent. Found by its wamid, or, for a send whose
/// outcome was unknown, by the outbox id Sabi put in `biz_opaque_callback_data`.
#[derive(Debug, Clone, Copy)]
pub(super) struct StatusUpdate<'a> {
    pub wamid: &'a str,
    pub status: &'a str,
    pub callback: Option<&'a str>,
    pub error_code: Option<i64>,
    /// How long a send it settles holds its recipient.
    pub spacing: Duration,
}

pub(super) fn reconcile(conn: &Connection, update: StatusUpdate<'_>, now: At) -> Result<()> {
    let Some(delivery) = Delivery::parse(update.status) else {
        return Ok(());
    };
    let Some(id) = find_sent(conn, update)? else {
        return Ok(());
    };
    let status = Status {
        wamid: update.wamid,
        delivery,
        code: update.error_code,
    };
    step(conn, id, &Event::Status(status, update.spacing), now).map(drop)
}

/// The part a status names: by Meta's id, or, for a send whose answer never came, by the
/// (part, attempt) in its callback data.
fn find_sent(conn: &Connection, update: StatusUpdate<'_>) -> Result<Option<i64>> {
    let by_wamid = conn
        .prepare_cached("SELECT id FROM outbox WHERE wamid = ?1")
        .and_then(|mut s| s.query_row(params![update.wamid], |r| r.get(0)).optional())
        .map_err(unavailable)?;
    if by_wamid.is_some() {
        return Ok(by_wamid);
    }
    let Some((id, attempt)) = update.callback.and_then(parse_send_callback) else {
        return Ok(None);
    };
    // Whether its state is one a callback names is the rulebook's to say.
    conn.prepare_cached("SELECT id FROM outbox WHERE id = ?1 AND attempts = ?2 AND wamid IS NULL")
        .and_then(|mut s| s.query_row(params![id, attempt], |r| r.get(0)).optional())
        .map_err(unavailable)
}

pub(super) fn next_send_due(conn: &Connection, skip: &[String]) -> Result<Option<At>> {
    let skip = serde_json::to_string(skip).unwrap_or_else(|_| "[]".into());
    conn.prepare_cached(&format!(
        "SELECT min(t) FROM (
             SELECT min(max(coalesce(o.next_attempt_at, 0), coalesce(c.send_after, 0))) AS t
             FROM outbox o JOIN conversations c ON c.id = o.conversation_id
             WHERE o.state IN {claimable}
               AND o.business NOT IN (SELECT value FROM json_each(?1))
               AND NOT {held_back}
             {timed})",
        claimable = *CLAIMABLE_SQL,
        held_back = *HELD_BACK_SQL,
        timed = part::lease_ends_sql()
            .iter()
            .map(|end| format!(" UNION ALL SELECT {end}"))
            .collect::<String>(),
    ))
    .and_then(|mut s| s.query_row(params![skip], |r| r.get(0)))
    .map_err(unavailable)
}

pub(super) fn outbox(conn: &Connection, limit: Option<usize>) -> Result<Vec<OutboxEntry>> {
    entries(
        conn,
        "ORDER BY o.id LIMIT ?1",
        params![limit_param(limit.unwrap_or(usize::MAX))],
    )
}

/// The reply parts `filter` (a WHERE and ORDER BY on `o`, the outbox, and `b`, its batch)
/// selects, with their turn's times.
pub(super) fn entries(
    conn: &Connection,
    filter: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<OutboxEntry>> {
    conn.prepare_cached(&format!(
        "SELECT o.id, o.batch_id, o.part, o.channel, o.business, o.customer, o.body, o.state, o.created_at,
                b.started_at, coalesce(b.finished_at, o.created_at), o.kind, o.attempts, o.wamid,
                o.delivery, o.error_code, o.error, o.sent_at
         FROM outbox o JOIN batches b ON b.id = o.batch_id {filter}"
    ))
    .and_then(|mut s| {
        s.query_map(params, |r| {
            Ok(OutboxEntry {
                id: r.get(0)?,
                batch_id: r.get(1)?,
                part: r.get(2)?,
                conversation: conversation_at(r, 3)?,
                text: r.get(6)?,
                state: r.get(7)?,
                created_at: r.get(8)?,
                turn_started_at: r.get(9)?,
                turn_finished_at: r.get(10)?,
                kind: r.get(11)?,
                attempts: r.get(12)?,
                wamid: r.get(13)?,
                delivery: r.get(14)?,
                error_code: r.get(15)?,
                error: r.get(16)?,
                sent_at: r.get(17)?,
            })
        })?
        .collect()
    })
    .map_err(unavailable)
}
