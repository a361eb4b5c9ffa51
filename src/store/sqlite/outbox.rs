//! The sender's side of the SQLite store: claiming reply parts under a send lease, recording
//! how each send ended, and reconciling the outbox with Meta's status webhooks. Every write
//! runs in the group-commit writer, so each operation is one transaction.
//!
//! A part is claimed only when it is the oldest unsettled part of its recipient, so parts go
//! out in order; it is claimed with a fresh attempt number that its outcome must carry, and a
//! part whose send may have left is never claimed again: it waits for a status webhook.

use rusqlite::{Connection, OptionalExtension, params};

use super::turns::execute;
use super::{limit_param, unavailable};
use crate::domain::{ConversationKey, ReviewReason};
use crate::store::items::{UNSETTLED, delivery_rank, with_noted_wamid};
use crate::store::{
    Error, OutboxEntry, Result, SendClaim, SendJob, SendResult, WINDOW_CLOSED, parse_send_callback,
};

pub(super) fn claim_sends(conn: &Connection, claim: &SendClaim) -> Result<Vec<SendJob>> {
    settle_lapsed(conn, claim)?;
    let halted = serde_json::to_string(&claim.halted).unwrap_or_else(|_| "[]".into());
    let ids: Vec<i64> = conn
        .prepare_cached(&format!(
            "SELECT o.id FROM outbox o JOIN conversations c ON c.id = o.conversation_id
             WHERE o.state IN ('queued', 'window_closed')
               AND coalesce(o.next_attempt_at, 0) <= ?1 AND coalesce(c.send_after, 0) <= ?1
               AND o.business NOT IN (SELECT value FROM json_each(?2))
               AND NOT EXISTS (SELECT 1 FROM outbox p WHERE p.conversation_id = o.conversation_id
                               AND p.id < o.id AND p.state IN {UNSETTLED})
             ORDER BY o.id LIMIT ?3"
        ))
        .and_then(|mut s| {
            s.query_map(
                params![claim.now_ms, halted, limit_param(claim.limit)],
                |r| r.get(0),
            )?
            .collect()
        })
        .map_err(unavailable)?;
    ids.into_iter()
        .map(|id| take(conn, id, claim.now_ms + claim.lease_ms))
        .collect()
}

/// Sends whose lease lapsed (their sender died or hung mid-request) may have reached Meta:
/// they become unknown. Unknown ones that no status webhook settled in time go to review.
fn settle_lapsed(conn: &Connection, claim: &SendClaim) -> Result<()> {
    execute(
        conn,
        "UPDATE outbox SET state = 'accepted', sent_at = coalesce(sent_at, ?1), send_until = NULL,
                updated_at = ?1
         WHERE state = 'sending' AND send_until <= ?1 AND wamid IS NOT NULL",
        params![claim.now_ms],
    )?;
    execute(
        conn,
        "UPDATE outbox SET state = 'unknown', send_until = ?1 + ?2, updated_at = ?1,
                error = coalesce(error, 'the sender stopped while sending')
         WHERE state = 'sending' AND send_until <= ?1",
        params![claim.now_ms, claim.unknown_wait_ms],
    )?;
    let expired: Vec<(i64, i64)> = conn
        .prepare_cached(
            "SELECT id, batch_id FROM outbox
             WHERE state = 'unknown' AND send_until <= ?1",
        )
        .and_then(|mut s| {
            s.query_map(params![claim.now_ms], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
        .map_err(unavailable)?;
    for (id, batch) in expired {
        execute(
            conn,
            "UPDATE outbox SET state = 'review', updated_at = ?2 WHERE id = ?1",
            params![id, claim.now_ms],
        )?;
        review(
            conn,
            batch,
            id,
            ReviewReason::UnknownOutcome,
            Some(
                "no status webhook named this send in time; it may or may not have been delivered",
            ),
            claim.now_ms,
        )?;
    }
    Ok(())
}

fn take(conn: &Connection, id: i64, until: i64) -> Result<SendJob> {
    conn.prepare_cached(
        "UPDATE outbox SET state = 'sending', attempts = attempts + 1, send_until = ?2,
                window_closed = (state = 'window_closed')
         WHERE id = ?1
         RETURNING id, batch_id, part, channel, business, customer, body, options, reply_to,
                   attempts, failures, window_closed,
                   (SELECT last_inbound_at FROM conversations WHERE id = conversation_id)",
    )
    .and_then(|mut s| {
        s.query_row(params![id, until], |r| {
            let options: Option<String> = r.get(7)?;
            Ok(SendJob {
                id: r.get(0)?,
                batch_id: r.get(1)?,
                part: r.get(2)?,
                conversation: ConversationKey {
                    channel: r.get(3)?,
                    business: r.get(4)?,
                    customer: r.get(5)?,
                },
                text: r.get(6)?,
                options: options
                    .and_then(|o| serde_json::from_str(&o).ok())
                    .unwrap_or_default(),
                quote: r.get(8)?,
                attempt: r.get(9)?,
                failures: r.get(10)?,
                window_closed: r.get(11)?,
                last_inbound_at_ms: r.get(12)?,
            })
        })
    })
    .map_err(unavailable)
}

pub(super) fn record_send(
    conn: &Connection,
    id: i64,
    attempt: u32,
    now: i64,
    result: &SendResult,
) -> Result<()> {
    let held: Option<(i64, i64, Option<String>)> = conn
        .prepare_cached(
            "SELECT batch_id, conversation_id, wamid FROM outbox
             WHERE id = ?1 AND attempts = ?2 AND state = 'sending'",
        )
        .and_then(|mut s| {
            s.query_row(params![id, attempt], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()
        })
        .map_err(unavailable)?;
    let Some((batch, conversation, noted)) = held else {
        return Err(Error::LeaseLost);
    };
    let result = with_noted_wamid(noted, result, now);
    let result = result.as_ref();
    match result {
        SendResult::Accepted {
            wamid,
            template,
            next_send_at_ms,
        } => {
            execute(
                conn,
                "UPDATE outbox SET state = 'accepted', wamid = ?2,
                        kind = CASE WHEN ?3 OR window_closed THEN 'template' ELSE 'text' END,
                        sent_at = ?4, send_until = NULL, updated_at = ?4
                 WHERE id = ?1",
                params![id, wamid, template, now],
            )?;
            hold_recipient(conn, conversation, *next_send_at_ms)
        }
        SendResult::Retry {
            at_ms,
            failure,
            code,
            error,
            recipient_after_ms,
        } => {
            execute(
                conn,
                "UPDATE outbox SET state = CASE WHEN window_closed THEN 'window_closed' ELSE 'queued' END,
                        next_attempt_at = ?2, failures = failures + ?3, error_code = ?4, error = ?5,
                        send_until = NULL, updated_at = ?6
                 WHERE id = ?1",
                params![id, at_ms, i64::from(*failure), code, error, now],
            )?;
            match recipient_after_ms {
                Some(after) => hold_recipient(conn, conversation, *after),
                None => Ok(()),
            }
        }
        SendResult::Untried => execute(
            conn,
            "UPDATE outbox SET state = CASE WHEN window_closed THEN 'window_closed' ELSE 'queued' END,
                    send_until = NULL
             WHERE id = ?1",
            params![id],
        ),
        SendResult::WindowClosed { code, error } => execute(
            conn,
            "UPDATE outbox SET state = 'window_closed', window_closed = 1, wamid = NULL,
                    error_code = ?2, error = ?3, next_attempt_at = NULL, send_until = NULL,
                    updated_at = ?4
             WHERE id = ?1",
            params![id, code, error, now],
        ),
        SendResult::Unknown {
            error,
            wait_until_ms,
        } => execute(
            conn,
            "UPDATE outbox SET state = 'unknown', send_until = ?2, error = ?3, updated_at = ?4
             WHERE id = ?1",
            params![id, wait_until_ms, error, now],
        ),
        SendResult::Review {
            reason,
            code,
            error,
        } => {
            let state = if *reason == ReviewReason::SendFailed {
                "failed"
            } else {
                "review"
            };
            execute(
                conn,
                "UPDATE outbox SET state = ?2, error_code = ?3, error = ?4, send_until = NULL,
                        updated_at = ?5
                 WHERE id = ?1",
                params![id, state, code, error, now],
            )?;
            review(conn, batch, id, *reason, Some(error), now)
        }
    }
}

/// Nothing more goes to this recipient before `until`.
fn hold_recipient(conn: &Connection, conversation: i64, until: i64) -> Result<()> {
    execute(
        conn,
        "UPDATE conversations SET send_after = max(coalesce(send_after, 0), ?2) WHERE id = ?1",
        params![conversation, until],
    )
}

/// Opens the part's review item, or opens it again (a person requeued it and it failed anew).
fn review(
    conn: &Connection,
    batch: i64,
    outbox: i64,
    reason: ReviewReason,
    error: Option<&str>,
    now: i64,
) -> Result<()> {
    execute(
        conn,
        "INSERT INTO review (batch_id, outbox_id, reason, error, state, created_at)
         VALUES (?1, ?2, ?3, ?4, 'open', ?5)
         ON CONFLICT (outbox_id) WHERE outbox_id IS NOT NULL DO UPDATE SET
             reason = excluded.reason, error = excluded.error, state = 'open',
             created_at = excluded.created_at, resolved_at = NULL, resolution = NULL,
             resolution_note = NULL",
        params![batch, outbox, reason.as_str(), error, now],
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
}

pub(super) fn reconcile(conn: &Connection, update: StatusUpdate<'_>, now: i64) -> Result<()> {
    let Some((id, batch, state, kind, delivery)) = find_sent(conn, update)? else {
        return Ok(());
    };
    match state.as_str() {
        // The sender still holds it: note Meta's id; the sender records the outcome (and the
        // recipient's spacing), and whatever it saw, the part counts as accepted.
        "sending" => execute(
            conn,
            "UPDATE outbox SET wamid = ?2, updated_at = ?3 WHERE id = ?1",
            params![id, update.wamid, now],
        )?,
        // Its answer was lost, but Meta has it: it left after all, and is never sent again.
        "unknown" => execute(
            conn,
            "UPDATE outbox SET state = 'accepted', wamid = ?2, sent_at = coalesce(sent_at, ?3),
                    send_until = NULL, updated_at = ?3
             WHERE id = ?1",
            params![id, update.wamid, now],
        )?,
        _ => {}
    }
    if delivery_rank(update.status) <= delivery.as_deref().map_or(0, delivery_rank) {
        return Ok(());
    }
    execute(
        conn,
        "UPDATE outbox SET delivery = ?2, updated_at = ?3 WHERE id = ?1",
        params![id, update.status, now],
    )?;
    if update.status != "failed" {
        return Ok(());
    }
    let error = format!(
        "Meta reported the message failed (code {})",
        update
            .error_code
            .map_or_else(|| "unknown".to_owned(), |c| c.to_string())
    );
    if update.error_code == Some(WINDOW_CLOSED) && kind == "text" {
        // The customer service window had closed: the part goes again, as the template, a new
        // message with its own id and statuses.
        return execute(
            conn,
            "UPDATE outbox SET state = 'window_closed', window_closed = 1, wamid = NULL,
                    delivery = NULL, error_code = ?2, error = ?3, next_attempt_at = NULL,
                    updated_at = ?4
             WHERE id = ?1",
            params![id, update.error_code, error, now],
        );
    }
    execute(
        conn,
        "UPDATE outbox SET state = 'failed', error_code = ?2, error = ?3 WHERE id = ?1",
        params![id, update.error_code, error],
    )?;
    review(conn, batch, id, ReviewReason::SendFailed, Some(&error), now)
}

type SentRow = (i64, i64, String, String, Option<String>);

/// The part a status names: by Meta's id, or, for a send whose answer never came, by the
/// (part, attempt) in its callback data.
fn find_sent(conn: &Connection, update: StatusUpdate<'_>) -> Result<Option<SentRow>> {
    let row = |r: &rusqlite::Row<'_>| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?));
    let by_wamid = conn
        .prepare_cached("SELECT id, batch_id, state, kind, delivery FROM outbox WHERE wamid = ?1")
        .and_then(|mut s| s.query_row(params![update.wamid], row).optional())
        .map_err(unavailable)?;
    if by_wamid.is_some() {
        return Ok(by_wamid);
    }
    let Some((id, attempt)) = update.callback.and_then(parse_send_callback) else {
        return Ok(None);
    };
    conn.prepare_cached(
        "SELECT id, batch_id, state, kind, delivery FROM outbox
         WHERE id = ?1 AND attempts = ?2 AND wamid IS NULL AND state IN ('sending', 'unknown')",
    )
    .and_then(|mut s| s.query_row(params![id, attempt], row).optional())
    .map_err(unavailable)
}

pub(super) fn next_send_due(conn: &Connection, skip: &[String]) -> Result<Option<i64>> {
    let skip = serde_json::to_string(skip).unwrap_or_else(|_| "[]".into());
    conn.prepare_cached(&format!(
        "SELECT min(t) FROM (
             SELECT min(max(coalesce(o.next_attempt_at, 0), coalesce(c.send_after, 0))) AS t
             FROM outbox o JOIN conversations c ON c.id = o.conversation_id
             WHERE o.state IN ('queued', 'window_closed')
               AND o.business NOT IN (SELECT value FROM json_each(?1))
               AND NOT EXISTS (SELECT 1 FROM outbox p WHERE p.conversation_id = o.conversation_id
                               AND p.id < o.id AND p.state IN {UNSETTLED})
             UNION ALL SELECT min(send_until) FROM outbox WHERE state = 'sending'
             UNION ALL SELECT min(send_until) FROM outbox WHERE state = 'unknown')"
    ))
    .and_then(|mut s| s.query_row(params![skip], |r| r.get(0)))
    .map_err(unavailable)
}

pub(super) fn outbox(conn: &Connection, limit: Option<usize>) -> Result<Vec<OutboxEntry>> {
    conn.prepare_cached(
        "SELECT o.id, o.batch_id, o.part, o.channel, o.business, o.customer, o.body, o.state, o.created_at,
                b.started_at, coalesce(b.finished_at, o.created_at), o.kind, o.attempts, o.wamid,
                o.delivery, o.error_code, o.error, o.sent_at
         FROM outbox o JOIN batches b ON b.id = o.batch_id ORDER BY o.id LIMIT ?1",
    )
    .and_then(|mut s| {
        s.query_map(params![limit_param(limit.unwrap_or(usize::MAX))], |r| {
            Ok(OutboxEntry {
                id: r.get(0)?,
                batch_id: r.get(1)?,
                part: r.get(2)?,
                conversation: ConversationKey {
                    channel: r.get(3)?,
                    business: r.get(4)?,
                    customer: r.get(5)?,
                },
                text: r.get(6)?,
                state: r.get(7)?,
                created_at_ms: r.get(8)?,
                turn_started_at_ms: r.get(9)?,
                turn_finished_at_ms: r.get(10)?,
                kind: r.get(11)?,
                attempts: r.get(12)?,
                wamid: r.get(13)?,
                delivery: r.get(14)?,
                error_code: r.get(15)?,
                error: r.get(16)?,
                sent_at_ms: r.get(17)?,
            })
        })?
        .collect()
    })
    .map_err(unavailable)
}
