//! The sender's side of the PostgreSQL store; the same rules as the SQLite backend's: a part
//! is claimed only as the head of its recipient's queue, under `FOR UPDATE SKIP LOCKED`, with a
//! fresh attempt number its outcome must carry; a send that may have left is never claimed
//! again but waits for its status webhook.

use std::time::Duration;

use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};

use super::{conversation_at, limit, named, settle};
use crate::clock::At;
use crate::domain::{InboundItem, ReviewReason};
use crate::store::items::known;
use crate::store::rules::part::{
    self, CLAIMABLE_SQL, Delivery, Event, HELD_BACK_SQL, Part, PartKind, PartState, Status,
};
use crate::store::rules::review::ReviewState;
use crate::store::{
    Error, OutboxEntry, Result, SendClaim, SendClaims, SendJob, SendResult, parse_send_callback,
};

pub(super) async fn claim_sends(pool: &PgPool, claim: &SendClaim) -> Result<SendClaims> {
    let mut tx = pool.begin().await?;
    let unknown = settle_lapsed(&mut tx, claim).await?;
    let rows = sqlx::query(AssertSqlSafe(format!(
        "WITH heads AS (
             SELECT o.id FROM outbox o JOIN conversations c ON c.id = o.conversation_id
             WHERE o.state IN {claimable}
               AND COALESCE(o.next_attempt_at, 0) <= $1 AND COALESCE(c.send_after, 0) <= $1
               AND NOT (o.business = ANY($2))
               AND NOT {held_back}
             ORDER BY o.id LIMIT $3 FOR UPDATE OF o SKIP LOCKED)
         UPDATE outbox o SET state = '{claimed}', attempts = attempts + 1, send_until = $4,
                window_closed = (o.state = '{closed}')
         FROM heads WHERE o.id = heads.id
         RETURNING o.id, o.batch_id, o.part, o.channel, o.business, o.customer, o.body, o.options,
                   o.reply_to, o.attempts, o.failures, o.window_closed,
                   (SELECT last_inbound_at FROM conversations c WHERE c.id = o.conversation_id)",
        claimable = *CLAIMABLE_SQL,
        held_back = *HELD_BACK_SQL,
        claimed = PartState::Claimed,
        closed = PartState::WindowClosed,
    )))
    .bind(claim.now)
    .bind(&claim.halted)
    .bind(limit(Some(claim.limit)))
    .bind(claim.now + claim.lease)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let mut jobs = rows
        .iter()
        .map(|r| {
            let options: Option<String> = r.get(7);
            let count = |i: usize| u32::try_from(r.get::<i32, _>(i)).unwrap_or(0);
            Ok(SendJob {
                id: r.get(0),
                batch_id: r.get(1),
                part: count(2),
                conversation: conversation_at(r, 3)?,
                text: r.get(6),
                options: options
                    .and_then(|o| serde_json::from_str(&o).ok())
                    .unwrap_or_default(),
                quote: r.get(8),
                attempt: count(9),
                failures: count(10),
                window_closed: r.get(11),
                last_inbound_at: r.get(12),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    jobs.sort_by_key(|j| j.id);
    Ok(SendClaims { jobs, unknown })
}

/// Claims that lapsed before their part departed go back to the queue. Sends whose lease
/// lapsed may have reached Meta: unknown (or accepted, when a status webhook named them
/// meanwhile); their ids are returned. Unknown ones past their wait go to review. Each part
/// moves under its row lock, so a status webhook naming it waits and then finds it moved.
async fn settle_lapsed(conn: &mut PgConnection, claim: &SendClaim) -> Result<Vec<i64>> {
    let lapsed = Event::LeaseLapsed {
        unknown_wait: claim.unknown_wait,
    };
    let mut unknown = Vec::new();
    for (state, event) in [
        (PartState::Claimed, lapsed.clone()),
        (PartState::Sending, lapsed),
        (PartState::Unknown, Event::WaitOver),
    ] {
        let due: Vec<i64> =
            sqlx::query_scalar("SELECT id FROM outbox WHERE state = $1 AND send_until <= $2")
                .bind(state.as_str())
                .bind(claim.now)
                .fetch_all(&mut *conn)
                .await?;
        for id in due {
            let moved = step(conn, id, &event, claim.now).await?;
            if state == PartState::Sending && moved == Some(PartState::Unknown) {
                unknown.push(id);
            }
        }
    }
    Ok(unknown)
}

pub(super) async fn record_send(
    pool: &PgPool,
    id: i64,
    attempt: u32,
    now: At,
    result: &SendResult,
) -> Result<()> {
    stepped(pool, id, &Event::Outcome { attempt, result }, now).await
}

pub(super) async fn depart(
    pool: &PgPool,
    id: i64,
    attempt: u32,
    now: At,
    lease: Duration,
) -> Result<()> {
    stepped(pool, id, &Event::Depart { attempt, lease }, now).await
}

/// [`step`] in a transaction of its own; a refused event is a lost lease.
async fn stepped(pool: &PgPool, id: i64, event: &Event<'_>, now: At) -> Result<()> {
    let mut tx = pool.begin().await?;
    let outcome = match step(&mut tx, id, event, now).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(Error::LeaseLost),
        Err(error) => Err(error),
    };
    settle(tx, outcome).await
}

/// Moves part `id` by the rulebook, under its row lock: loads it, asks [`part::next`], writes
/// what it says; the state it moved to. `None` when there is no such part or the rulebook
/// refused the event: nothing is written.
pub(super) async fn step(
    conn: &mut PgConnection,
    id: i64,
    event: &Event<'_>,
    now: At,
) -> Result<Option<PartState>> {
    let Some(held) = load(conn, id).await? else {
        return Ok(None);
    };
    let Ok(step) = part::next(&held.part, event, now) else {
        return Ok(None);
    };
    save(conn, id, &step.part, now).await?;
    if let Some(until) = step.effects.hold_recipient_until {
        sqlx::query(
            "UPDATE conversations SET send_after = GREATEST(COALESCE(send_after, 0), $2)
             WHERE id = $1",
        )
        .bind(held.conversation)
        .bind(until)
        .execute(&mut *conn)
        .await?;
    }
    if let Some((reason, error)) = &step.effects.review {
        review(conn, held.batch, id, *reason, Some(error), now).await?;
    }
    if step.effects.close_review {
        sqlx::query(
            "UPDATE review SET state = $2, resolved_at = $3, resolution = $2, resolution_note = $4
             WHERE outbox_id = $1 AND state = $5",
        )
        .bind(id)
        .bind(ReviewState::Closed.as_str())
        .bind(now)
        .bind(part::SETTLED_BY_STATUS)
        .bind(ReviewState::Open.as_str())
        .execute(&mut *conn)
        .await?;
    }
    Ok(Some(step.part.state))
}

/// A part as the rulebook reads it, with the batch and conversation it belongs to.
struct Loaded {
    part: Part,
    batch: i64,
    conversation: i64,
}

async fn load(conn: &mut PgConnection, id: i64) -> Result<Option<Loaded>> {
    let row = sqlx::query(
        "SELECT state, attempts, failures, window_closed, wamid, kind, delivery, error_code,
                error, next_attempt_at, send_until, sent_at, batch_id, conversation_id
         FROM outbox WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(r) = row else { return Ok(None) };
    let count = |i: usize| u32::try_from(r.get::<i32, _>(i)).unwrap_or(0);
    let name = |i: usize| -> String { r.get(i) };
    let unknown = |what: &str| Error::Schema(format!("outbox {id}: unknown {what}"));
    let delivery: Option<String> = r.get(6);
    Ok(Some(Loaded {
        part: Part {
            state: PartState::parse(&name(0)).ok_or_else(|| unknown("state"))?,
            attempts: count(1),
            failures: count(2),
            window_closed: r.get(3),
            wamid: r.get(4),
            kind: PartKind::parse(&name(5)).ok_or_else(|| unknown("kind"))?,
            delivery: delivery.as_deref().and_then(Delivery::parse),
            error_code: r.get(7),
            error: r.get(8),
            next_attempt_at: r.get(9),
            until: r.get(10),
            sent_at: r.get(11),
        },
        batch: r.get(12),
        conversation: r.get(13),
    }))
}

async fn save(conn: &mut PgConnection, id: i64, part: &Part, now: At) -> Result<()> {
    sqlx::query(
        "UPDATE outbox SET state = $2, failures = $3, window_closed = $4, wamid = $5, kind = $6,
                delivery = $7, error_code = $8, error = $9, next_attempt_at = $10,
                send_until = $11, sent_at = $12, updated_at = $13
         WHERE id = $1",
    )
    .bind(id)
    .bind(part.state.as_str())
    .bind(i32::try_from(part.failures).unwrap_or(i32::MAX))
    .bind(part.window_closed)
    .bind(&part.wamid)
    .bind(part.kind.as_str())
    .bind(part.delivery.map(Delivery::as_str))
    .bind(part.error_code)
    .bind(&part.error)
    .bind(part.next_attempt_at)
    .bind(part.until)
    .bind(part.sent_at)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Opens the part's review item, or opens it again (a person requeued it and it failed anew).
async fn review(
    conn: &mut PgConnection,
    batch: i64,
    outbox: i64,
    reason: ReviewReason,
    error: Option<&str>,
    now: At,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO review (batch_id, outbox_id, reason, error, state, created_at)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (outbox_id) WHERE outbox_id IS NOT NULL DO UPDATE SET
             reason = EXCLUDED.reason, error = EXCLUDED.error, state = EXCLUDED.state,
             created_at = EXCLUDED.created_at, resolved_at = NULL, resolution = NULL,
             resolution_note = NULL",
    )
    .bind(batch)
    .bind(outbox)
    .bind(reason.as_str())
    .bind(error)
    .bind(ReviewState::Open.as_str())
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A status of a message Sabi sent settles its outbox row, in the ingest's transaction.
pub(super) async fn reconcile_status(
    conn: &mut PgConnection,
    item: &InboundItem,
    now: At,
    spacing: Duration,
) -> Result<()> {
    let facts = &item.facts;
    let (Some(wamid), Some(delivery)) = (
        facts["id"].as_str(),
        facts["status"].as_str().and_then(Delivery::parse),
    ) else {
        return Ok(());
    };
    let callback = facts["biz_opaque_callback_data"].as_str();
    let Some(id) = find_sent(conn, wamid, callback).await? else {
        return Ok(());
    };
    let status = Status {
        wamid,
        delivery,
        code: facts["error_codes"]
            .get(0)
            .and_then(serde_json::Value::as_i64),
    };
    step(conn, id, &Event::Status(status, spacing), now)
        .await
        .map(drop)
}

/// The part a status names: by Meta's id, or, for a send whose answer never came, by the
/// (part, attempt) in its callback data. Whether its state is one a callback names is the
/// rulebook's to say.
async fn find_sent(
    conn: &mut PgConnection,
    wamid: &str,
    callback: Option<&str>,
) -> Result<Option<i64>> {
    let by_wamid = sqlx::query_scalar("SELECT id FROM outbox WHERE wamid = $1")
        .bind(wamid)
        .fetch_optional(&mut *conn)
        .await?;
    if by_wamid.is_some() {
        return Ok(by_wamid);
    }
    let Some((id, attempt)) = callback.and_then(parse_send_callback) else {
        return Ok(None);
    };
    // `wamid = $3` too: a sender recording this very id may commit before the rulebook reads it.
    sqlx::query_scalar(
        "SELECT id FROM outbox WHERE id = $1 AND attempts = $2 AND (wamid IS NULL OR wamid = $3)",
    )
    .bind(id)
    .bind(i32::try_from(attempt).unwrap_or(i32::MAX))
    .bind(wamid)
    .fetch_optional(&mut *conn)
    .await
    .map_err(Error::from)
}

pub(super) async fn next_send_due(pool: &PgPool, skip: &[String]) -> Result<Option<At>> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT LEAST(
             (SELECT min(GREATEST(COALESCE(o.next_attempt_at, 0), COALESCE(c.send_after, 0)))
              FROM outbox o JOIN conversations c ON c.id = o.conversation_id
              WHERE o.state IN {claimable} AND NOT (o.business = ANY($1))
                AND NOT {held_back}),
             {ends})",
        claimable = *CLAIMABLE_SQL,
        held_back = *HELD_BACK_SQL,
        ends = part::lease_ends_sql().join(", "),
    )))
    .bind(skip)
    .fetch_one(pool)
    .await
    .map_err(Error::from)
}

pub(super) async fn outbox(pool: &PgPool, count: Option<usize>) -> Result<Vec<OutboxEntry>> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "{ENTRY_SELECT} ORDER BY o.id LIMIT $1"
    )))
    .bind(limit(count))
    .fetch_all(pool)
    .await?;
    rows.iter().map(entry).collect()
}

/// Reply parts (`o`) with their turn's times (`b`, the batch): a WHERE and ORDER BY follow.
pub(super) const ENTRY_SELECT: &str =
    "SELECT o.id, o.batch_id, o.part, o.channel, o.business, o.customer, o.body, o.state,
            o.created_at, b.started_at, COALESCE(b.finished_at, o.created_at), o.kind,
            o.attempts, o.wamid, o.delivery, o.error_code, o.error, o.sent_at
     FROM outbox o JOIN batches b ON b.id = o.batch_id";

/// A row of [`ENTRY_SELECT`].
pub(super) fn entry(r: &sqlx::postgres::PgRow) -> Result<OutboxEntry> {
    let count = |i: usize| u32::try_from(r.get::<i32, _>(i)).unwrap_or(0);
    Ok(OutboxEntry {
        id: r.get(0),
        batch_id: r.get(1),
        part: count(2),
        conversation: conversation_at(r, 3)?,
        text: r.get(6),
        state: known(PartState::parse, r.get(7))?,
        created_at: r.get(8),
        turn_started_at: r.get(9),
        turn_finished_at: r.get(10),
        kind: known(PartKind::parse, r.get(11))?,
        attempts: count(12),
        wamid: r.get(13),
        delivery: named(r, 14, Delivery::parse)?,
        error_code: r.get(15),
        error: r.get(16),
        sent_at: r.get(17),
    })
}
