//! The web chat's side of the PostgreSQL store: a question is an inbox message like a
//! WhatsApp one, and its job is the unguessable handle its browser asks about. A submission is
//! one transaction under the session's advisory lock, so two racing double-taps cannot both
//! create a job.

use std::time::Duration;

use crate::clock::At;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};

use super::ingest;
use super::limit;
use crate::store::items::{
    Encoded, POSITION_CAP, message_key, options_of, question_item, session_retry_after, status_of,
};
use crate::store::rules::erasure::Marks;
use crate::store::rules::item::ItemState;
use crate::store::rules::review::{self, Destination, ReviewState};
use crate::store::sql;
use crate::store::{
    ChatExchange, ChatFeed, ChatJob, ChatReceipt, ChatSubmission, Error, JobStatus, PersonLine,
    Result, Submitted,
};

pub(super) async fn submit(pool: &PgPool, s: &ChatSubmission, marks: &Marks) -> Result<Submitted> {
    let key = message_key(&s.session_id, s.message_id.as_deref().unwrap_or(&s.job_id));
    let mut tx = pool.begin().await?;
    // One session's submissions take turns, so its count and its insert are one step.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('sabi.chat.' || $1))")
        .bind(&s.session_id)
        .execute(&mut *tx)
        .await?;
    // Before the resend's lookup: another's message id names nothing here.
    match (owner(&mut *tx, &s.session_id).await?, &s.user_id) {
        (Some(owner), Some(user)) if owner == *user => {}
        (Some(_), _) => return Ok(Submitted::NotYours),
        (None, Some(user)) => {
            sqlx::query(
                "INSERT INTO chat_owners (session_id, user_id, bound_at) VALUES ($1, $2, $3)",
            )
            .bind(&s.session_id)
            .bind(user)
            .bind(s.now)
            .execute(&mut *tx)
            .await?;
        }
        (None, None) => {}
    }
    if let Some(job_id) = job_for_key(&mut tx, &key).await? {
        return Ok(Submitted::Job(ChatReceipt {
            job_id,
            created: false,
            earliest_due: None,
        }));
    }
    let since = s.now - Duration::from_secs(60);
    let recent = session_recent(&mut tx, &s.session_id, since).await?;
    if recent >= s.per_minute {
        // The question whose minute ends first and leaves room for one more.
        let freeing: Option<At> = sqlx::query_scalar(
            "SELECT created_at FROM chat_jobs WHERE session_id = $1 AND created_at >= $2
             ORDER BY created_at LIMIT 1 OFFSET $3",
        )
        .bind(&s.session_id)
        .bind(since)
        .bind(i64::try_from(recent - s.per_minute).unwrap_or(i64::MAX))
        .fetch_optional(&mut *tx)
        .await?;
        return Ok(Submitted::TooFast {
            retry_after: session_retry_after(freeing, s.now),
        });
    }
    // New questions take turns (after their session's lock, always in that order) so the
    // queue's count and the insert are one step.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('sabi.chat-queue'))")
        .execute(&mut *tx)
        .await?;
    if queue_depth(&mut *tx).await? >= s.max_queue {
        return Ok(Submitted::QueueFull);
    }
    let mut item = question_item(s, key.clone());
    let latest = latest_review(&mut tx, &s.business, &s.session_id).await?;
    let destination = review::destination(latest.map(|(state, _)| state));
    if destination == Destination::Person {
        // Kept without a turn of its own; it joins the person's batch below.
        item.turn = None;
    }
    let encoded = Encoded::of(&item);
    let delivery = sql::chat_delivery(item, s);
    let erased = marks.key_hash(delivery.items[0].channel, &delivery.items[0].dedupe_key);
    let receipt = ingest::ingest_in(
        &mut tx,
        &delivery,
        std::slice::from_ref(&encoded),
        std::slice::from_ref(&erased),
    )
    .await?;
    if let (Destination::Person, Some((_, batch))) = (destination, latest) {
        sqlx::query(
            "UPDATE inbox SET state = $3, batch_id = $4,
                    conversation_id = (SELECT conversation_id FROM batches WHERE id = $4)
             WHERE channel = 'webchat' AND dedupe_key = $1 AND state = $2",
        )
        .bind(&key)
        .bind(ItemState::Skipped.as_str())
        .bind(review::arriving(destination).as_str())
        .bind(batch)
        .execute(&mut *tx)
        .await?;
    }
    let made: Option<String> = sqlx::query_scalar(
        "INSERT INTO chat_jobs (job_id, session_id, message_key, inbox_seq, created_at, expires_at)
         SELECT $1, $2, $3, seq, $4, $5 FROM inbox WHERE channel = 'webchat' AND dedupe_key = $3
         ON CONFLICT (message_key) DO NOTHING RETURNING job_id",
    )
    .bind(&s.job_id)
    .bind(&s.session_id)
    .bind(&key)
    .bind(s.now)
    .bind(s.now + s.keep)
    .fetch_optional(&mut *tx)
    .await?;
    let outcome = match made {
        Some(job_id) => ChatReceipt {
            job_id,
            created: true,
            earliest_due: receipt.earliest_due,
        },
        // A racing submission of the same message made the job first.
        None => ChatReceipt {
            job_id: job_for_key(&mut tx, &key).await?.ok_or(Error::NotFound)?,
            created: false,
            earliest_due: None,
        },
    };
    tx.commit().await?;
    Ok(Submitted::Job(outcome))
}

/// The state and batch of the latest review item of the session's conversation on `business`;
/// an item being settled is waited for, so a question never joins an item closed meanwhile.
async fn latest_review(
    conn: &mut PgConnection,
    business: &str,
    session_id: &str,
) -> Result<Option<(ReviewState, i64)>> {
    let found: Option<(String, i64)> = sqlx::query_as(
        "SELECT r.state, r.batch_id FROM conversations c
         JOIN batches b ON b.conversation_id = c.id JOIN review r ON r.batch_id = b.id
         WHERE c.channel = 'webchat' AND c.business = $1 AND c.customer = $2
         ORDER BY r.id DESC LIMIT 1 FOR SHARE OF r",
    )
    .bind(business)
    .bind(session_id)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(found.and_then(|(state, batch)| Some((ReviewState::parse(&state)?, batch))))
}

/// What people wrote to the session after `after`, and whether one holds it now.
pub(super) async fn feed(
    pool: &PgPool,
    session_id: &str,
    after: i64,
    max: usize,
) -> Result<ChatFeed> {
    let mut conn = pool.acquire().await?;
    let rows: Vec<(i64, Option<String>, At)> = sqlx::query_as(
        "SELECT o.id, o.body, o.created_at FROM outbox o
         WHERE o.by_person AND o.id > $2 AND o.conversation_id IN
               (SELECT id FROM conversations WHERE channel = 'webchat' AND customer = $1)
         ORDER BY o.id LIMIT $3",
    )
    .bind(session_id)
    .bind(after)
    .bind(limit(Some(max)))
    .fetch_all(&mut *conn)
    .await?;
    // Held exactly when the visitor's next message would go to a person: by the latest item.
    let latest: Option<String> = sqlx::query_scalar(
        "SELECT r.state FROM conversations c JOIN batches b ON b.conversation_id = c.id
         JOIN review r ON r.batch_id = b.id
         WHERE c.channel = 'webchat' AND c.customer = $1
         ORDER BY r.id DESC LIMIT 1",
    )
    .bind(session_id)
    .fetch_optional(&mut *conn)
    .await?;
    let held =
        review::destination(latest.as_deref().and_then(ReviewState::parse)) == Destination::Person;
    let lines = rows
        .into_iter()
        .map(|(id, text, at)| PersonLine {
            id,
            text: text.unwrap_or_default(),
            at,
        })
        .collect();
    Ok(ChatFeed { held, lines })
}

async fn job_for_key(conn: &mut PgConnection, key: &str) -> Result<Option<String>> {
    sqlx::query_scalar("SELECT job_id FROM chat_jobs WHERE message_key = $1")
        .bind(key)
        .fetch_optional(&mut *conn)
        .await
        .map_err(Error::from)
}

pub(super) async fn job_for_message(
    pool: &PgPool,
    session_id: &str,
    message_id: &str,
) -> Result<Option<String>> {
    let mut conn = pool.acquire().await?;
    job_for_key(&mut conn, &message_key(session_id, message_id)).await
}

pub(super) async fn job(pool: &PgPool, job_id: &str, now: At) -> Result<Option<ChatJob>> {
    let row = sqlx::query(
        "SELECT j.session_id, j.created_at, j.expires_at, i.state, i.batch_id, i.seq
         FROM chat_jobs j JOIN inbox i ON i.seq = j.inbox_seq WHERE j.job_id = $1",
    )
    .bind(job_id)
    .fetch_optional(pool)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let expires_at: At = row.get(2);
    if expires_at <= now {
        return Ok(None);
    }
    let status = status_of(row.get(3));
    let batch: Option<i64> = row.get(4);
    let position = match status {
        JobStatus::Queued => Some(queued_ahead(pool, row.get(5)).await?),
        _ => None,
    };
    let (answer, options) = match (status, batch) {
        (JobStatus::Finished, Some(batch)) => answer_of(pool, batch).await?,
        _ => (None, Vec::new()),
    };
    let stage = match (status, batch) {
        (JobStatus::Started, Some(batch)) => {
            sqlx::query_scalar::<_, Option<String>>("SELECT stage FROM batches WHERE id = $1")
                .bind(batch)
                .fetch_optional(pool)
                .await?
                .flatten()
        }
        _ => None,
    };
    Ok(Some(ChatJob {
        job_id: job_id.to_owned(),
        session_id: row.get(0),
        status,
        stage,
        position,
        answer,
        options,
        created_at: row.get(1),
    }))
}

async fn queued_ahead(pool: &PgPool, seq: i64) -> Result<u64> {
    let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM (SELECT 1 FROM inbox
         WHERE {waiting} AND seq < $1 LIMIT $2) ahead",
        waiting = *sql::WEBCHAT_WAITING_SQL,
    )))
    .bind(seq)
    .bind(POSITION_CAP)
    .fetch_one(pool)
    .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The reply to the batch the question was answered in, its parts joined, and the choices its
/// last part offers.
async fn answer_of(pool: &PgPool, batch: i64) -> Result<(Option<String>, Vec<String>)> {
    let parts: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT body, options FROM outbox WHERE batch_id = $1 ORDER BY part")
            .bind(batch)
            .fetch_all(pool)
            .await?;
    let options = options_of(parts.last().and_then(|(_, o)| o.as_deref()));
    let bodies: Vec<String> = parts.into_iter().map(|(body, _)| body).collect();
    Ok(((!bodies.is_empty()).then(|| bodies.join("\n\n")), options))
}

/// The verified user the session is bound to, if any.
pub(super) async fn owner<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    session_id: &str,
) -> Result<Option<String>> {
    sqlx::query_scalar("SELECT user_id FROM chat_owners WHERE session_id = $1")
        .bind(session_id)
        .fetch_optional(executor)
        .await
        .map_err(Error::from)
}

pub(super) async fn history(
    pool: &PgPool,
    session_id: &str,
    before: Option<i64>,
    count: usize,
) -> Result<Vec<ChatExchange>> {
    // In the order asked, as the SQLite backend's: arrival, not the nodes' clocks.
    let rows = sqlx::query(
        "SELECT j.job_id, i.text, i.state, i.batch_id, j.created_at, j.inbox_seq
         FROM chat_jobs j JOIN inbox i ON i.seq = j.inbox_seq
         WHERE j.session_id = $1 AND j.inbox_seq < $3 ORDER BY j.inbox_seq DESC LIMIT $2",
    )
    .bind(session_id)
    .bind(limit(Some(count)))
    .bind(before.unwrap_or(i64::MAX))
    .fetch_all(pool)
    .await?;
    let mut exchanges = Vec::with_capacity(rows.len());
    for row in rows.iter().rev() {
        let status = status_of(row.get(2));
        let batch: Option<i64> = row.get(3);
        let answer = match (status, batch) {
            (JobStatus::Finished, Some(batch)) => answer_of(pool, batch).await?.0,
            _ => None,
        };
        exchanges.push(ChatExchange {
            cursor: row.get(5),
            job_id: row.get(0),
            question: row.get::<Option<String>, _>(1).unwrap_or_default(),
            answer,
            status,
            asked_at: row.get(4),
        });
    }
    Ok(exchanges)
}

pub(super) async fn queue_depth<'e, E: sqlx::PgExecutor<'e>>(executor: E) -> Result<u64> {
    let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM inbox WHERE {}",
        *sql::WEBCHAT_WAITING_SQL
    )))
    .fetch_one(executor)
    .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

async fn session_recent(conn: &mut PgConnection, session_id: &str, since: At) -> Result<u64> {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM chat_jobs WHERE session_id = $1 AND created_at >= $2",
    )
    .bind(session_id)
    .bind(since)
    .fetch_one(&mut *conn)
    .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}
