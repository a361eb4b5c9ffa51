//! Broadcasts on PostgreSQL: a broadcast and its audience kept in one transaction (a key
//! taken twice at once still makes one), read back with their recipients counted by state, and
//! what people ask of them, under the broadcast's row lock.

use std::collections::{HashMap, HashSet};

use sqlx::{PgConnection, PgPool, Row};

use super::named;
use crate::clock::At;
use crate::domain::{ConversationKey, InboundItem};
use crate::store::items::{RecipientStatus, broadcast_status, known};
use crate::store::rules::broadcast::{
    self, BroadcastState, Control, Event, LIVE_SQL, Limits, Outcome, PausedBy, Recipient,
    RecipientState, SkipReason, Step, TemplateNews, WAITING_SQL,
};
use crate::store::rules::consent::{self, Choice, Source};
use crate::store::rules::hours::LocalHours;
use crate::store::rules::part::Delivery;
use crate::store::sql::{self, Due};
use crate::store::{
    BroadcastView, Error, HistoryEntry, NewBroadcast, REPLY_SPAN, RecipientClaim, RecipientJob,
    RecipientView, Result, Speaker, recipient_counts,
};

pub(super) async fn create(pool: &PgPool, b: &NewBroadcast) -> Result<(BroadcastView, bool)> {
    let mut tx = pool.begin().await?;
    let state = broadcast::initial(b.now, b.start_at);
    let id: Option<i64> = sqlx::query_scalar(
        "INSERT INTO broadcasts (key, name, template, language, business, state, created_at,
                                 start_at, deadline, rate, body, quiet_hours, tz, local_start,
                                 local_until)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
         ON CONFLICT (key) DO NOTHING RETURNING id",
    )
    .bind(&b.key)
    .bind(&b.name)
    .bind(&b.template)
    .bind(&b.language)
    .bind(&b.business)
    .bind(state.as_str())
    .bind(b.now)
    .bind(b.start_at)
    .bind(b.until)
    .bind(i64::from(b.rate))
    .bind(&b.body)
    .bind(b.hours.as_ref().and_then(LocalHours::quiet_spec))
    .bind(b.hours.as_ref().map(|h| &h.tz))
    .bind(b.hours.as_ref().and_then(LocalHours::start_text))
    .bind(b.hours.as_ref().and_then(LocalHours::until_text))
    .fetch_optional(&mut *tx)
    .await?;
    let Some(id) = id else {
        // The key was taken, by now committed: that broadcast is the answer.
        drop(tx);
        let id: i64 = sqlx::query_scalar("SELECT id FROM broadcasts WHERE key = $1")
            .bind(&b.key)
            .fetch_one(pool)
            .await?;
        let mut conn = pool.acquire().await?;
        return Ok((view(&mut conn, id).await?.ok_or(Error::NotFound)?, false));
    };
    let mut states = Vec::with_capacity(b.recipients.len());
    let mut skips = Vec::with_capacity(b.recipients.len());
    for r in &b.recipients {
        let listed = broadcast::Recipient::listed(r.skipped.as_ref().map(|s| s.0));
        states.push(listed.state.as_str());
        skips.push(listed.skipped.map(SkipReason::as_str));
    }
    let to: Vec<&str> = b.recipients.iter().map(|r| r.to.as_str()).collect();
    let params: Vec<String> = b
        .recipients
        .iter()
        .map(|r| serde_json::to_string(&r.params).unwrap_or_else(|_| "[]".into()))
        .collect();
    let lines: Vec<Option<i64>> = b
        .recipients
        .iter()
        .map(|r| r.line.map(|l| i64::try_from(l).unwrap_or(i64::MAX)))
        .collect();
    let errors: Vec<Option<&str>> = b
        .recipients
        .iter()
        .map(|r| r.skipped.as_ref().map(|s| s.1.as_str()))
        .collect();
    let zones: Vec<Option<&str>> = b.recipients.iter().map(|r| r.tz.as_deref()).collect();
    // One statement for the whole audience, in its order.
    sqlx::query(
        "INSERT INTO broadcast_recipients (broadcast_id, recipient, params, line, state, skipped,
                                           error, tz)
         SELECT $1, r, p, l, s, k, e, z
         FROM UNNEST($2::TEXT[], $3::TEXT[], $4::BIGINT[], $5::TEXT[], $6::TEXT[], $7::TEXT[],
                     $8::TEXT[]) WITH ORDINALITY AS a(r, p, l, s, k, e, z, n)
         ORDER BY n",
    )
    .bind(id)
    .bind(&to)
    .bind(&params)
    .bind(&lines)
    .bind(&states)
    .bind(&skips)
    .bind(&errors)
    .bind(&zones)
    .execute(&mut *tx)
    .await?;
    let made = view(&mut tx, id).await?.ok_or(Error::NotFound)?;
    tx.commit().await?;
    Ok((made, true))
}

pub(super) async fn list(pool: &PgPool, limit: usize) -> Result<Vec<BroadcastView>> {
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM broadcasts ORDER BY id DESC LIMIT $1")
        .bind(super::limit(Some(limit)))
        .fetch_all(pool)
        .await?;
    let mut conn = pool.acquire().await?;
    let mut views = Vec::with_capacity(ids.len());
    for id in ids {
        views.extend(view(&mut conn, id).await?);
    }
    Ok(views)
}

pub(super) async fn view(conn: &mut PgConnection, id: i64) -> Result<Option<BroadcastView>> {
    let counted = sqlx::query(
        "SELECT state, count(*) FROM broadcast_recipients WHERE broadcast_id = $1 GROUP BY state",
    )
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    let mut counts = Vec::with_capacity(counted.len());
    for r in counted {
        let n: i64 = r.get(1);
        counts.push((
            known(RecipientState::parse, r.get(0))?,
            u64::try_from(n).unwrap_or(0),
        ));
    }
    let row = sqlx::query(
        "SELECT key, name, template, language, business, state, paused_because, created_at,
                start_at, deadline, rate, paused_by, body, quiet_hours, tz, local_start,
                local_until
         FROM broadcasts WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(r) = row else {
        return Ok(None);
    };
    Ok(Some(BroadcastView {
        id,
        key: r.get(0),
        name: r.get(1),
        template: r.get(2),
        language: r.get(3),
        business: r.get(4),
        state: known(BroadcastState::parse, r.get(5))?,
        paused_because: r.get(6),
        paused_by: named(&r, 11, PausedBy::parse)?,
        body: r.get(12),
        quiet_hours: r.get(13),
        tz: r.get(14),
        local_start: r.get(15),
        local_until: r.get(16),
        created_at: r.get(7),
        start_at: r.get(8),
        until: r.get(9),
        rate: u32::try_from(r.get::<i64, _>(10)).unwrap_or(u32::MAX),
        recipients: counts.iter().map(|(_, n)| n).sum(),
        counts: recipient_counts(counts),
    }))
}

pub(super) async fn recipients(
    pool: &PgPool,
    id: i64,
    state: Option<RecipientState>,
    limit: usize,
) -> Result<Vec<RecipientView>> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {RECIPIENT_COLUMNS} FROM broadcast_recipients r
         WHERE r.broadcast_id = $1 AND ($2::TEXT IS NULL OR r.state = $2)
         ORDER BY r.id LIMIT $3"
    )))
    .bind(id)
    .bind(state.map(RecipientState::as_str))
    .bind(super::limit(Some(limit)))
    .fetch_all(pool)
    .await?;
    rows.iter().map(recipient_view).collect()
}

/// What [`recipient_view`] reads of a recipient row, `r`, first in the row.
pub(super) const RECIPIENT_COLUMNS: &str = "r.id, r.recipient, r.params, r.line, r.state,
    r.skipped, r.error, r.error_code, r.wamid, r.sent_at, r.replied_at, r.tz, r.billed,
    r.pricing_category";

/// A recipient read from [`RECIPIENT_COLUMNS`].
pub(super) fn recipient_view(r: &sqlx::postgres::PgRow) -> Result<RecipientView> {
    let params: String = r.get(2);
    Ok(RecipientView {
        id: r.get(0),
        to: r.get(1),
        params: serde_json::from_str(&params).unwrap_or_default(),
        line: r
            .get::<Option<i64>, _>(3)
            .and_then(|l| u64::try_from(l).ok()),
        state: known(RecipientState::parse, r.get(4))?,
        skipped: named(r, 5, SkipReason::parse)?,
        error: r.get(6),
        error_code: r.get(7),
        wamid: r.get(8),
        sent_at: r.get(9),
        replied_at: r.get(10),
        tz: r.get(11),
        billed: r.get(12),
        pricing: r.get(13),
    })
}

pub(super) async fn control(
    pool: &PgPool,
    id: i64,
    control: Control,
    reason: Option<&str>,
) -> Result<BroadcastView> {
    let mut tx = pool.begin().await?;
    let state: Option<String> =
        sqlx::query_scalar("SELECT state FROM broadcasts WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
    let state = known(BroadcastState::parse, &state.ok_or(Error::NotFound)?)?;
    let next = broadcast::control(state, control).ok_or(Error::NotFound)?;
    let reason = (control == Control::Pause).then_some(reason).flatten();
    let by = (control == Control::Pause).then_some(PausedBy::Person);
    set_state(&mut tx, id, next, reason, by).await?;
    if control == Control::Cancel {
        cancel_waiting(&mut tx, id).await?;
    }
    let after = view(&mut tx, id).await?.ok_or(Error::NotFound)?;
    tx.commit().await?;
    Ok(after)
}

/// Meta's word on a template moves the broadcasts sending it, by the rulebook, under their row
/// locks.
pub(super) async fn hear_template(
    conn: &mut PgConnection,
    news: &TemplateNews,
) -> Result<Vec<i64>> {
    let live = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT id, state, paused_by, template, language FROM broadcasts
         WHERE template = $1 AND state IN {} ORDER BY id FOR UPDATE",
        *LIVE_SQL
    )))
    .bind(&news.name)
    .fetch_all(&mut *conn)
    .await?;
    let mut moved = Vec::new();
    for row in live {
        let id: i64 = row.get(0);
        if !news.names(row.get(3), row.get(4)) {
            continue;
        }
        let state = known(BroadcastState::parse, row.get(1))?;
        let by = named(&row, 2, PausedBy::parse)?;
        if let Some((next, by)) = broadcast::on_template(state, by, news.approved) {
            let why = by.map(|_| news.why.as_str());
            set_state(conn, id, next, why, by).await?;
            moved.push(id);
        }
    }
    Ok(moved)
}

async fn set_state(
    conn: &mut PgConnection,
    id: i64,
    state: BroadcastState,
    paused_because: Option<&str>,
    paused_by: Option<PausedBy>,
) -> Result<()> {
    sqlx::query(
        "UPDATE broadcasts SET state = $2, paused_because = $3, paused_by = $4 WHERE id = $1",
    )
    .bind(id)
    .bind(state.as_str())
    .bind(paused_because)
    .bind(paused_by.map(PausedBy::as_str))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// In one transaction: time moves the broadcasts on (see [`broadcast::at_time`]), lapsed sends
/// become unknown, and the due recipients are claimed through the rulebook; rows another node
/// holds are skipped.
pub(super) async fn claim(pool: &PgPool, c: &RecipientClaim) -> Result<Vec<RecipientJob>> {
    let mut tx = pool.begin().await?;
    let hours = advance(&mut tx, c.now).await?;
    let lapsed: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM broadcast_recipients WHERE state = $1 AND lease_until <= $2
         ORDER BY id FOR UPDATE SKIP LOCKED",
    )
    .bind(RecipientState::Sending.as_str())
    .bind(c.now)
    .fetch_all(&mut *tx)
    .await?;
    for id in lapsed {
        step(&mut tx, id, &Event::LeaseLapsed, c.now, Limits::NONE).await?;
    }
    let limit = c.limit.min(headroom(&mut tx, c).await?);
    let mut jobs = Vec::with_capacity(limit);
    for _ in 0..broadcast::CLAIM_PASSES {
        let due = due(&mut tx, c, limit - jobs.len()).await?;
        if due.is_empty() {
            break;
        }
        for due in due {
            let (id, event) = (due.0, sql::claim_event(&hours, &due, c.now, c.lease));
            let stepped = step(&mut tx, id, &event, c.now, Limits::NONE).await?;
            if let Event::Claim { .. } = event {
                jobs.push(job(&mut tx, id, stepped.recipient.attempts).await?);
            }
        }
        if jobs.len() >= limit {
            break;
        }
    }
    finish(&mut tx).await?;
    tx.commit().await?;
    Ok(jobs)
}

/// Up to `limit` recipients that may go at `now`, of running broadcasts not sent from a halted
/// number, in order; rows another claimer holds are skipped.
async fn due(conn: &mut PgConnection, c: &RecipientClaim, limit: usize) -> Result<Vec<Due>> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT r.id, r.broadcast_id, r.tz,
                EXISTS (SELECT 1 FROM consents c WHERE c.customer = r.recipient AND c.opted_out),
                EXISTS (SELECT 1 FROM broadcast_recipients o
                        WHERE o.recipient = r.recipient AND o.sent_at > $5 AND o.id <> r.id)
         FROM broadcast_recipients r JOIN broadcasts b ON b.id = r.broadcast_id
         WHERE b.state = $1 AND r.state IN {waiting} AND COALESCE(r.next_attempt_at, 0) <= $2
           AND NOT (b.business = ANY($3))
         ORDER BY r.broadcast_id, r.id LIMIT $4 FOR UPDATE OF r SKIP LOCKED",
        waiting = *WAITING_SQL,
    )))
    .bind(BroadcastState::Running.as_str())
    .bind(c.now)
    .bind(&c.halted)
    .bind(super::limit(Some(limit)))
    .bind(c.now - c.cooldown)
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::from)
}

/// How many more customers may be sent to now under the messaging limit.
async fn headroom(conn: &mut PgConnection, c: &RecipientClaim) -> Result<usize> {
    match c.daily_limit {
        None => Ok(usize::MAX),
        Some(limit) => {
            let reached = reached(conn, c.now - broadcast::LIMIT_SPAN).await?;
            Ok(broadcast::headroom(Some(limit), reached))
        }
    }
}

/// Customers sent a broadcast after `since`, or being sent one.
pub(super) async fn reached(conn: &mut PgConnection, since: At) -> Result<u64> {
    let reached: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (
             SELECT recipient FROM broadcast_recipients WHERE sent_at > $1
             UNION SELECT recipient FROM broadcast_recipients WHERE state = $2) reached",
    )
    .bind(since)
    .bind(RecipientState::Sending.as_str())
    .fetch_one(&mut *conn)
    .await?;
    Ok(u64::try_from(reached).unwrap_or(0))
}

pub(super) async fn first_reached(pool: &PgPool, since: At) -> Result<Option<At>> {
    sqlx::query_scalar(
        "SELECT min(last) FROM (
             SELECT max(sent_at) AS last FROM broadcast_recipients WHERE sent_at > $1
             GROUP BY recipient) latest",
    )
    .bind(since)
    .fetch_one(pool)
    .await
    .map_err(Error::from)
}

pub(super) async fn sent_since(
    pool: &PgPool,
    customers: &[String],
    since: At,
) -> Result<HashSet<String>> {
    let found: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT recipient FROM broadcast_recipients
         WHERE sent_at > $2 AND recipient = ANY($1)",
    )
    .bind(customers)
    .bind(since)
    .fetch_all(pool)
    .await?;
    Ok(found.into_iter().collect())
}

pub(super) async fn record(
    pool: &PgPool,
    id: i64,
    attempt: u32,
    now: At,
    outcome: &Outcome,
    limits: Limits,
) -> Result<()> {
    let mut tx = pool.begin().await?;
    step(
        &mut tx,
        id,
        &Event::Outcome { attempt, outcome },
        now,
        limits,
    )
    .await?;
    tx.commit().await.map_err(Error::from)
}

/// A status of a broadcast message moves its recipient by the rulebook, in the ingest's
/// transaction; one that changes nothing (older, repeated, for another send) is dropped.
pub(super) async fn reconcile_status(
    conn: &mut PgConnection,
    item: &InboundItem,
    now: At,
) -> Result<()> {
    let Some(RecipientStatus {
        status,
        named,
        billed,
        pricing,
    }) = broadcast_status(item)
    else {
        return Ok(());
    };
    let wamid = status.wamid;
    let by_wamid: Option<i64> =
        sqlx::query_scalar("SELECT id FROM broadcast_recipients WHERE wamid = $1")
            .bind(wamid)
            .fetch_optional(&mut *conn)
            .await?;
    let id = match (by_wamid, named) {
        (Some(id), _) => Some(id),
        (None, Some((id, attempt))) => {
            sqlx::query_scalar(
                "SELECT id FROM broadcast_recipients WHERE id = $1 AND attempts = $2",
            )
            .bind(id)
            .bind(i32::try_from(attempt).unwrap_or(i32::MAX))
            .fetch_optional(&mut *conn)
            .await?
        }
        (None, None) => None,
    };
    let Some(id) = id else {
        return Ok(());
    };
    // Kept whatever the status does to the recipient: a late status still tells the price.
    if billed.is_some() || pricing.is_some() {
        sqlx::query(
            "UPDATE broadcast_recipients
                SET billed = COALESCE($2, billed), pricing_category = COALESCE($3, pricing_category)
              WHERE id = $1",
        )
        .bind(id)
        .bind(billed)
        .bind(pricing)
        .execute(&mut *conn)
        .await?;
    }
    match step(conn, id, &Event::Status(status), now, Limits::NONE).await {
        Ok(_) | Err(Error::LeaseLost) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Time moves the live broadcasts on (see [`broadcast::at_time`]); the hours on their
/// recipients' clocks, by broadcast.
async fn advance(conn: &mut PgConnection, now: At) -> Result<HashMap<i64, Option<LocalHours>>> {
    let live = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT id, state, start_at, deadline, quiet_hours, tz, local_start, local_until
         FROM broadcasts WHERE state IN {} ORDER BY id FOR UPDATE",
        *LIVE_SQL
    )))
    .fetch_all(&mut *conn)
    .await?;
    let mut hours = HashMap::new();
    for row in live {
        let id: i64 = row.get(0);
        hours.insert(
            id,
            LocalHours::stored(row.get(4), row.get(5), row.get(6), row.get(7)),
        );
        let state = known(BroadcastState::parse, row.get(1))?;
        let next = broadcast::at_time(state, now, row.get(2), row.get(3));
        if next == state {
            continue;
        }
        sqlx::query("UPDATE broadcasts SET state = $2 WHERE id = $1")
            .bind(id)
            .bind(next.as_str())
            .execute(&mut *conn)
            .await?;
        if next == BroadcastState::Cancelled {
            cancel_waiting(conn, id).await?;
        }
    }
    Ok(hours)
}

async fn cancel_waiting(conn: &mut PgConnection, id: i64) -> Result<()> {
    let sql = format!(
        "UPDATE broadcast_recipients SET state = $2, next_attempt_at = NULL
         WHERE broadcast_id = $1 AND state IN {}",
        *WAITING_SQL
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .bind(RecipientState::Cancelled.as_str())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

async fn finish(conn: &mut PgConnection) -> Result<()> {
    let sql = format!(
        "UPDATE broadcasts SET state = $1 WHERE state = $2 AND NOT EXISTS (
             SELECT 1 FROM broadcast_recipients r WHERE r.broadcast_id = broadcasts.id
             AND (r.state IN {waiting} OR r.state = $3))",
        waiting = *WAITING_SQL,
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(BroadcastState::Finished.as_str())
        .bind(BroadcastState::Running.as_str())
        .bind(RecipientState::Sending.as_str())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Loads a recipient under its row lock, asks the rulebook, and saves what it says; a refusal
/// writes nothing.
async fn step(
    conn: &mut PgConnection,
    id: i64,
    event: &Event<'_>,
    now: At,
    limits: Limits,
) -> Result<Step> {
    let recipient = load(conn, id).await?.ok_or(Error::NotFound)?;
    let step = broadcast::next(&recipient, event, now, limits).map_err(|_| Error::LeaseLost)?;
    save(conn, id, &step.recipient).await?;
    if step.opted_out {
        let customer: String =
            sqlx::query_scalar("SELECT recipient FROM broadcast_recipients WHERE id = $1")
                .bind(id)
                .fetch_one(&mut *conn)
                .await?;
        let choice = Choice {
            opted_out: true,
            source: Source::Refused,
            at: now,
        };
        choose(conn, &customer, &choice).await?;
    }
    Ok(step)
}

/// Keeps a customer's choice by the rulebook under the customer's row lock; two first choices
/// at once meet in the upsert, which applies the same rule. `true` when it changed their
/// standing.
pub(super) async fn choose(
    conn: &mut PgConnection,
    customer: &str,
    choice: &Choice,
) -> Result<bool> {
    let kept = choice_of(conn, customer, true).await?;
    let Some(new) = consent::apply(kept.as_ref(), choice) else {
        return Ok(false);
    };
    // A first choice made at once by another transaction may have landed meanwhile: this one
    // is kept only over an older choice of the other standing.
    let written = sqlx::query(
        "INSERT INTO consents (customer, opted_out, source, at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (customer) DO UPDATE
         SET opted_out = excluded.opted_out, source = excluded.source, at = excluded.at
         WHERE consents.at <= excluded.at AND consents.opted_out <> excluded.opted_out",
    )
    .bind(customer)
    .bind(new.opted_out)
    .bind(new.source.as_str())
    .bind(new.at)
    .execute(&mut *conn)
    .await?;
    Ok(written.rows_affected() > 0)
}

/// A customer's latest choice about broadcasts, if they made one; `for_update` takes their row
/// lock until the transaction ends.
pub(super) async fn choice_of(
    conn: &mut PgConnection,
    customer: &str,
    for_update: bool,
) -> Result<Option<Choice>> {
    let lock = if for_update { " FOR UPDATE" } else { "" };
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT opted_out, source, at FROM consents WHERE customer = $1{lock}"
    )))
    .bind(customer)
    .fetch_optional(&mut *conn)
    .await?
    .map(|r| {
        Ok(Choice {
            opted_out: r.get(0),
            source: known(Source::parse, r.get(1))?,
            at: r.get(2),
        })
    })
    .transpose()
}

pub(super) async fn opted_out(pool: &PgPool, customers: &[String]) -> Result<HashSet<String>> {
    let found: Vec<String> =
        sqlx::query_scalar("SELECT customer FROM consents WHERE opted_out AND customer = ANY($1)")
            .bind(customers)
            .fetch_all(pool)
            .await?;
    Ok(found.into_iter().collect())
}

async fn load(conn: &mut PgConnection, id: i64) -> Result<Option<Recipient>> {
    let row = sqlx::query(
        "SELECT state, attempts, failures, holds, wamid, delivery, skipped, error_code, error,
                next_attempt_at, lease_until, sent_at
         FROM broadcast_recipients WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(r) = row else {
        return Ok(None);
    };
    let count = |i: usize| u32::try_from(r.get::<i32, _>(i)).unwrap_or(0);
    Ok(Some(Recipient {
        state: known(RecipientState::parse, r.get(0))?,
        attempts: count(1),
        failures: count(2),
        holds: count(3),
        wamid: r.get(4),
        delivery: named(&r, 5, Delivery::parse)?,
        skipped: named(&r, 6, SkipReason::parse)?,
        error_code: r.get(7),
        error: r.get(8),
        next_attempt_at: r.get(9),
        until: r.get(10),
        sent_at: r.get(11),
    }))
}

async fn save(conn: &mut PgConnection, id: i64, r: &Recipient) -> Result<()> {
    let count = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    sqlx::query(
        "UPDATE broadcast_recipients SET state = $2, attempts = $3, failures = $4, holds = $5,
                wamid = $6, delivery = $7, skipped = $8, error_code = $9, error = $10,
                next_attempt_at = $11, lease_until = $12, sent_at = $13
         WHERE id = $1",
    )
    .bind(id)
    .bind(r.state.as_str())
    .bind(count(r.attempts))
    .bind(count(r.failures))
    .bind(count(r.holds))
    .bind(&r.wamid)
    .bind(r.delivery.map(Delivery::as_str))
    .bind(r.skipped.map(SkipReason::as_str))
    .bind(r.error_code)
    .bind(&r.error)
    .bind(r.next_attempt_at)
    .bind(r.until)
    .bind(r.sent_at)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn job(conn: &mut PgConnection, id: i64, attempt: u32) -> Result<RecipientJob> {
    let r = sqlx::query(
        "SELECT r.broadcast_id, r.recipient, r.params, b.template, b.language, b.business, b.rate
         FROM broadcast_recipients r JOIN broadcasts b ON b.id = r.broadcast_id WHERE r.id = $1",
    )
    .bind(id)
    .fetch_one(&mut *conn)
    .await?;
    let params: String = r.get(2);
    Ok(RecipientJob {
        id,
        broadcast_id: r.get(0),
        attempt,
        to: r.get(1),
        params: serde_json::from_str(&params).unwrap_or_default(),
        template: r.get(3),
        language: r.get(4),
        business: r.get(5),
        rate: u32::try_from(r.get::<i64, _>(6)).unwrap_or(u32::MAX),
    })
}

/// A customer's message is the reply to the broadcast they were last sent, if that came within
/// [`REPLY_SPAN`] and had none yet.
pub(super) async fn note_reply(conn: &mut PgConnection, customer: &str, at: At) -> Result<()> {
    sqlx::query(
        "UPDATE broadcast_recipients SET replied_at = $2
         WHERE id = (SELECT id FROM broadcast_recipients
                     WHERE recipient = $1 AND sent_at > $3 AND sent_at <= $2
                     ORDER BY sent_at DESC LIMIT 1)
           AND replied_at IS NULL",
    )
    .bind(customer)
    .bind(at)
    .bind(at - REPLY_SPAN)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The latest broadcast sent to the conversation's customer from its business in (`since`,
/// `until`], as read.
pub(super) async fn last_to(
    pool: &PgPool,
    conversation: &ConversationKey,
    since: At,
    until: At,
) -> Result<Option<HistoryEntry>> {
    let found = sqlx::query(
        "SELECT r.sent_at, b.template, b.body, r.params
         FROM broadcast_recipients r JOIN broadcasts b ON b.id = r.broadcast_id
         WHERE r.recipient = $1 AND b.business = $2 AND r.sent_at > $3 AND r.sent_at <= $4
         ORDER BY r.sent_at DESC LIMIT 1",
    )
    .bind(&conversation.customer)
    .bind(&conversation.business)
    .bind(since)
    .bind(until)
    .fetch_optional(pool)
    .await?;
    Ok(found.map(|r| {
        let params: Vec<String> = serde_json::from_str(r.get(3)).unwrap_or_default();
        HistoryEntry {
            at: r.get(0),
            speaker: Speaker::Business,
            text: broadcast::sent_text(r.get(1), r.get(2), &params),
        }
    }))
}
