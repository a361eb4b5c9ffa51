//! The sender's side of the PostgreSQL store; the same rules as the SQLite backend's: a part
//! is claimed only as the head of its recipient's queue, under `FOR UPDATE SKIP LOCKED`, with a
//! fresh attempt number its outcome must carry; a send that may have left is never claimed
//! again but waits for its status webhook.

use sqlx::AssertSqlSafe;
use sqlx::{PgConnection, PgPool, Row};

use super::ingest::channel;
use super::{limit, unavailable};
use crate::domain::{ConversationKey, InboundItem, ReviewReason};
use crate::store::items::{UNSETTLED, delivery_rank, with_noted_wamid};
use crate::store::{
    Error, OutboxEntry, Result, SendClaim, SendJob, SendResult, WINDOW_CLOSED, parse_send_callback,
};

pub(super) async fn claim_sends(pool: &PgPool, claim: &SendClaim) -> Result<Vec<SendJob>> {
    let mut tx = pool.begin().await.map_err(unavailable)?;
    settle_lapsed(&mut tx, claim).await?;
    let rows = sqlx::query(AssertSqlSafe(format!(
        "WITH heads AS (
             SELECT o.id FROM outbox o JOIN conversations c ON c.id = o.conversation_id
             WHERE o.state IN ('queued', 'window_closed')
               AND COALESCE(o.next_attempt_at, 0) <= $1 AND COALESCE(c.send_after, 0) <= $1
               AND NOT (o.business = ANY($2))
               AND NOT EXISTS (SELECT 1 FROM outbox p WHERE p.conversation_id = o.conversation_id
                               AND p.id < o.id AND p.state IN {UNSETTLED})
             ORDER BY o.id LIMIT $3 FOR UPDATE OF o SKIP LOCKED)
         UPDATE outbox o SET state = 'sending', attempts = attempts + 1, send_until = $4,
                window_closed = (o.state = 'window_closed')
         FROM heads WHERE o.id = heads.id
         RETURNING o.id, o.batch_id, o.part, o.channel, o.business, o.customer, o.body, o.options,
                   o.reply_to, o.attempts, o.failures, o.window_closed,
                   (SELECT last_inbound_at FROM conversations c WHERE c.id = o.conversation_id)"
    )))
    .bind(claim.now_ms)
    .bind(&claim.halted)
    .bind(limit(Some(claim.limit)))
    .bind(claim.now_ms + claim.lease_ms)
    .fetch_all(&mut *tx)
    .await
    .map_err(unavailable)?;
    tx.commit().await.map_err(unavailable)?;
    let mut jobs = rows
        .iter()
        .map(|r| {
            let options: Option<String> = r.get(7);
            let count = |i: usize| u32::try_from(r.get::<i32, _>(i)).unwrap_or(0);
            Ok(SendJob {
                id: r.get(0),
                batch_id: r.get(1),
                part: count(2),
                conversation: ConversationKey {
                    channel: channel(r.get(3))?,
                    business: r.get(4),
                    customer: r.get(5),
                },
                text: r.get(6),
                options: options
                    .and_then(|o| serde_json::from_str(&o).ok())
                    .unwrap_or_default(),
                quote: r.get(8),
                attempt: count(9),
                failures: count(10),
                window_closed: r.get(11),
                last_inbound_at_ms: r.get(12),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    jobs.sort_by_key(|j| j.id);
    Ok(jobs)
}

/// Sends whose lease lapsed may have reached Meta: unknown (or accepted, when a status webhook
/// named them meanwhile). Unknown ones past their wait go to review.
async fn settle_lapsed(conn: &mut PgConnection, claim: &SendClaim) -> Result<()> {
    // One statement: a status webhook noting Meta's id between two statements would
    // otherwise leave an accepted send marked unknown.
    sqlx::query(
        "UPDATE outbox SET
             state = CASE WHEN wamid IS NOT NULL THEN 'accepted' ELSE 'unknown' END,
             sent_at = CASE WHEN wamid IS NOT NULL THEN COALESCE(sent_at, $1) ELSE sent_at END,
             send_until = CASE WHEN wamid IS NOT NULL THEN NULL ELSE $1 + $2 END,
             error = CASE WHEN wamid IS NOT NULL THEN error
                          ELSE COALESCE(error, 'the sender stopped while sending') END,
             updated_at = $1
         WHERE state = 'sending' AND send_until <= $1",
    )
    .bind(claim.now_ms)
    .bind(claim.unknown_wait_ms)
    .execute(&mut *conn)
    .await
    .map_err(unavailable)?;
    let expired = sqlx::query(
        "UPDATE outbox SET state = 'review', updated_at = $1
         WHERE state = 'unknown' AND send_until <= $1 RETURNING id, batch_id",
    )
    .bind(claim.now_ms)
    .fetch_all(&mut *conn)
    .await
    .map_err(unavailable)?;
    for row in expired {
        let why =
            "no status webhook named this send in time; it may or may not have been delivered";
        review(
            conn,
            row.get(1),
            row.get(0),
            ReviewReason::UnknownOutcome,
            Some(why),
            claim.now_ms,
        )
        .await?;
    }
    Ok(())
}

pub(super) async fn record_send(
    pool: &PgPool,
    id: i64,
    attempt: u32,
    now: i64,
    result: &SendResult,
) -> Result<()> {
    let mut tx = pool.begin().await.map_err(unavailable)?;
    let held = sqlx::query(
        "SELECT batch_id, conversation_id, wamid FROM outbox
         WHERE id = $1 AND attempts = $2 AND state = 'sending' FOR UPDATE",
    )
    .bind(id)
    .bind(i32::try_from(attempt).unwrap_or(i32::MAX))
    .fetch_optional(&mut *tx)
    .await
    .map_err(unavailable)?;
    let Some(held) = held else {
        return Err(Error::LeaseLost);
    };
    let (batch, conversation, noted): (i64, i64, Option<String>) =
        (held.get(0), held.get(1), held.get(2));
    let result = with_noted_wamid(noted, result, now);
    let result = result.as_ref();
    apply(&mut tx, id, batch, conversation, now, result).await?;
    tx.commit().await.map_err(unavailable)
}

async fn apply(
    conn: &mut PgConnection,
    id: i64,
    batch: i64,
    conversation: i64,
    now: i64,
    result: &SendResult,
) -> Result<()> {
    match result {
        SendResult::Accepted {
            wamid,
            template,
            next_send_at_ms,
        } => {
            sqlx::query(
                "UPDATE outbox SET state = 'accepted', wamid = $2,
                        kind = CASE WHEN $3 OR window_closed THEN 'template' ELSE 'text' END,
                        sent_at = $4, send_until = NULL, updated_at = $4
                 WHERE id = $1",
            )
            .bind(id)
            .bind(wamid)
            .bind(template)
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(unavailable)?;
            hold_recipient(conn, conversation, *next_send_at_ms).await
        }
        SendResult::Retry {
            at_ms,
            failure,
            code,
            error,
            recipient_after_ms,
        } => {
            sqlx::query(
                "UPDATE outbox SET state = CASE WHEN window_closed THEN 'window_closed' ELSE 'queued' END,
                        next_attempt_at = $2, failures = failures + $3, error_code = $4, error = $5,
                        send_until = NULL, updated_at = $6
                 WHERE id = $1",
            )
            .bind(id)
            .bind(at_ms)
            .bind(i32::from(*failure))
            .bind(code)
            .bind(error)
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(unavailable)?;
            match recipient_after_ms {
                Some(after) => hold_recipient(conn, conversation, *after).await,
                None => Ok(()),
            }
        }
        SendResult::Untried => {
            sqlx::query(
                "UPDATE outbox SET state = CASE WHEN window_closed THEN 'window_closed' ELSE 'queued' END,
                        send_until = NULL
                 WHERE id = $1",
            )
            .bind(id)
            .execute(&mut *conn)
            .await
            .map_err(unavailable)?;
            Ok(())
        }
        SendResult::WindowClosed { code, error } => {
            sqlx::query(
                "UPDATE outbox SET state = 'window_closed', window_closed = true, wamid = NULL,
                        error_code = $2, error = $3, next_attempt_at = NULL, send_until = NULL,
                        updated_at = $4
                 WHERE id = $1",
            )
            .bind(id)
            .bind(code)
            .bind(error)
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(unavailable)?;
            Ok(())
        }
        SendResult::Unknown {
            error,
            wait_until_ms,
        } => {
            sqlx::query(
                "UPDATE outbox SET state = 'unknown', send_until = $2, error = $3, updated_at = $4
                 WHERE id = $1",
            )
            .bind(id)
            .bind(wait_until_ms)
            .bind(error)
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(unavailable)?;
            Ok(())
        }
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
            sqlx::query(
                "UPDATE outbox SET state = $2, error_code = $3, error = $4, send_until = NULL,
                        updated_at = $5
                 WHERE id = $1",
            )
            .bind(id)
            .bind(state)
            .bind(code)
            .bind(error)
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(unavailable)?;
            review(conn, batch, id, *reason, Some(error), now).await
        }
    }
}

async fn hold_recipient(conn: &mut PgConnection, conversation: i64, until: i64) -> Result<()> {
    sqlx::query(
        "UPDATE conversations SET send_after = GREATEST(COALESCE(send_after, 0), $2) WHERE id = $1",
    )
    .bind(conversation)
    .bind(until)
    .execute(&mut *conn)
    .await
    .map(drop)
    .map_err(unavailable)
}

/// Opens the part's review item, or opens it again (a person requeued it and it failed anew).
async fn review(
    conn: &mut PgConnection,
    batch: i64,
    outbox: i64,
    reason: ReviewReason,
    error: Option<&str>,
    now: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO review (batch_id, outbox_id, reason, error, state, created_at)
         VALUES ($1, $2, $3, $4, 'open', $5)
         ON CONFLICT (outbox_id) WHERE outbox_id IS NOT NULL DO UPDATE SET
             reason = EXCLUDED.reason, error = EXCLUDED.error, state = 'open',
             created_at = EXCLUDED.created_at, resolved_at = NULL, resolution = NULL,
             resolution_note = NULL",
    )
    .bind(batch)
    .bind(outbox)
    .bind(reason.as_str())
    .bind(error)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map(drop)
    .map_err(unavailable)
}

/// A status of a message Sabi sent settles its outbox row, in the ingest's transaction.
pub(super) async fn reconcile_status(
    conn: &mut PgConnection,
    item: &InboundItem,
    now: i64,
) -> Result<()> {
    let facts = &item.facts;
    let (Some(wamid), Some(status)) = (facts["id"].as_str(), facts["status"].as_str()) else {
        return Ok(());
    };
    let callback = facts["biz_opaque_callback_data"].as_str();
    let code = facts["error_codes"]
        .get(0)
        .and_then(serde_json::Value::as_i64);
    let Some(row) = find_sent(conn, wamid, callback).await? else {
        return Ok(());
    };
    let (id, batch, state, kind, delivery): (i64, i64, String, String, Option<String>) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    match state.as_str() {
        "sending" => {
            sqlx::query("UPDATE outbox SET wamid = $2, updated_at = $3 WHERE id = $1")
                .bind(id)
                .bind(wamid)
                .bind(now)
                .execute(&mut *conn)
                .await
                .map_err(unavailable)?;
        }
        "unknown" => {
            sqlx::query(
                "UPDATE outbox SET state = 'accepted', wamid = $2, sent_at = COALESCE(sent_at, $3),
                        send_until = NULL, updated_at = $3
                 WHERE id = $1",
            )
            .bind(id)
            .bind(wamid)
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(unavailable)?;
        }
        _ => {}
    }
    if delivery_rank(status) <= delivery.as_deref().map_or(0, delivery_rank) {
        return Ok(());
    }
    sqlx::query("UPDATE outbox SET delivery = $2, updated_at = $3 WHERE id = $1")
        .bind(id)
        .bind(status)
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(unavailable)?;
    if status != "failed" {
        return Ok(());
    }
    let error = format!(
        "Meta reported the message failed (code {})",
        code.map_or_else(|| "unknown".to_owned(), |c| c.to_string())
    );
    if code == Some(WINDOW_CLOSED) && kind == "text" {
        sqlx::query(
            "UPDATE outbox SET state = 'window_closed', window_closed = true, wamid = NULL,
                    delivery = NULL, error_code = $2, error = $3, next_attempt_at = NULL,
                    updated_at = $4
             WHERE id = $1",
        )
        .bind(id)
        .bind(code)
        .bind(&error)
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(unavailable)?;
        return Ok(());
    }
    sqlx::query("UPDATE outbox SET state = 'failed', error_code = $2, error = $3 WHERE id = $1")
        .bind(id)
        .bind(code)
        .bind(&error)
        .execute(&mut *conn)
        .await
        .map_err(unavailable)?;
    review(conn, batch, id, ReviewReason::SendFailed, Some(&error), now).await
}

async fn find_sent(
    conn: &mut PgConnection,
    wamid: &str,
    callback: Option<&str>,
) -> Result<Option<sqlx::postgres::PgRow>> {
    let by_wamid = sqlx::query(
        "SELECT id, batch_id, state, kind, delivery FROM outbox WHERE wamid = $1 FOR UPDATE",
    )
    .bind(wamid)
    .fetch_optional(&mut *conn)
    .await
    .map_err(unavailable)?;
    if by_wamid.is_some() {
        return Ok(by_wamid);
    }
    let Some((id, attempt)) = callback.and_then(parse_send_callback) else {
        return Ok(None);
    };
    // `wamid = $3` too: a sender recording this very id may commit while we wait on the row.
    sqlx::query(
        "SELECT id, batch_id, state, kind, delivery FROM outbox
         WHERE id = $1 AND attempts = $2 AND (wamid IS NULL OR wamid = $3)
           AND state IN ('sending', 'unknown', 'accepted')
         FOR UPDATE",
    )
    .bind(id)
    .bind(i32::try_from(attempt).unwrap_or(i32::MAX))
    .bind(wamid)
    .fetch_optional(&mut *conn)
    .await
    .map_err(unavailable)
}

pub(super) async fn next_send_due(pool: &PgPool, skip: &[String]) -> Result<Option<i64>> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT LEAST(
             (SELECT min(GREATEST(COALESCE(o.next_attempt_at, 0), COALESCE(c.send_after, 0)))
              FROM outbox o JOIN conversations c ON c.id = o.conversation_id
              WHERE o.state IN ('queued', 'window_closed') AND NOT (o.business = ANY($1))
                AND NOT EXISTS (SELECT 1 FROM outbox p WHERE p.conversation_id = o.conversation_id
                                AND p.id < o.id AND p.state IN {UNSETTLED})),
             (SELECT min(send_until) FROM outbox WHERE state = 'sending'),
             (SELECT min(send_until) FROM outbox WHERE state = 'unknown'))"
    )))
    .bind(skip)
    .fetch_one(pool)
    .await
    .map_err(unavailable)
}

pub(super) async fn outbox(pool: &PgPool, count: Option<usize>) -> Result<Vec<OutboxEntry>> {
    let rows = sqlx::query(
        "SELECT o.id, o.batch_id, o.part, o.channel, o.business, o.customer, o.body, o.state,
                o.created_at, b.started_at, COALESCE(b.finished_at, o.created_at), o.kind,
                o.attempts, o.wamid, o.delivery, o.error_code, o.error, o.sent_at
         FROM outbox o JOIN batches b ON b.id = o.batch_id ORDER BY o.id LIMIT $1",
    )
    .bind(limit(count))
    .fetch_all(pool)
    .await
    .map_err(unavailable)?;
    rows.iter()
        .map(|r| {
            let count = |i: usize| u32::try_from(r.get::<i32, _>(i)).unwrap_or(0);
            Ok(OutboxEntry {
                id: r.get(0),
                batch_id: r.get(1),
                part: count(2),
                conversation: ConversationKey {
                    channel: channel(r.get(3))?,
                    business: r.get(4),
                    customer: r.get(5),
                },
                text: r.get(6),
                state: r.get(7),
                created_at_ms: r.get(8),
                turn_started_at_ms: r.get(9),
                turn_finished_at_ms: r.get(10),
                kind: r.get(11),
                attempts: count(12),
                wamid: r.get(13),
                delivery: r.get(14),
                error_code: r.get(15),
                error: r.get(16),
                sent_at_ms: r.get(17),
            })
        })
        .collect()
}
