//! The engine's side of the PostgreSQL store: claims under `FOR UPDATE SKIP LOCKED`, leases
//! with fencing tokens checked under `FOR UPDATE`, turn endings, history and usage.

use std::time::Duration;

use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};

use super::{conversation_at, limit, settle};
use crate::clock::At;
use crate::domain::{
    Batch, BatchMessage, Channel, Claim, ItemKind, LeaseToken, ReplyPart, ReviewReason,
};
use crate::store::items::known;
use crate::store::rules::batch::{self, BatchState, Lease, answered_by};
use crate::store::rules::item::ItemState;
use crate::store::rules::review::{self, ReviewState};
use crate::store::sql::{self, Opened};
use crate::store::{
    Ending, Error, HOLD_PART, HistoryEntry, Holding, Lane, Result, RouteGuess, RoutedTurn, Speaker,
    TurnStats, TurnUsage,
};

/// Claims due work, of one channel's conversations only when `channel` is given.
pub(super) async fn claim(
    pool: &PgPool,
    now: At,
    lease: Duration,
    count: usize,
    channel: Option<Channel>,
) -> Result<Vec<Claim>> {
    let channel = channel.map(Channel::as_str);
    let mut tx = pool.begin().await?;
    let mut claims = reclaim(&mut tx, now, lease, count, channel).await?;
    if claims.len() < count {
        let room = (0, count - claims.len());
        claims.extend(claim_opened(&mut tx, now, lease, room, channel, Lane::Any).await?);
    }
    tx.commit().await?;
    Ok(claims)
}

/// See [`crate::store::Turns::claim_routine`].
pub(super) async fn claim_routine(
    pool: &PgPool,
    now: At,
    lease: Duration,
    count: usize,
) -> Result<Vec<Claim>> {
    let mut tx = pool.begin().await?;
    let whatsapp = Some(Channel::Whatsapp.as_str());
    let claims = claim_opened(&mut tx, now, lease, (0, count), whatsapp, Lane::Routine).await?;
    tx.commit().await?;
    Ok(claims)
}

/// New batches of due conversations, as claims under their first token.
async fn claim_opened(
    conn: &mut PgConnection,
    now: At,
    lease: Duration,
    room: (usize, usize),
    channel: Option<&str>,
    lane: Lane,
) -> Result<Vec<Claim>> {
    let opened = open_batches(conn, now, lease, room, channel, lane).await?;
    let mut claims = Vec::with_capacity(opened.len());
    for o in opened {
        claims.push(Claim {
            batch: load_batch(conn, o.batch).await?,
            token: LeaseToken(1),
            attempt: 1,
            requeued: o.requeued,
        });
    }
    Ok(claims)
}

/// Batches whose lease lapsed or whose retry time came; rows another claimer holds are skipped.
async fn reclaim(
    conn: &mut PgConnection,
    now: At,
    lease: Duration,
    count: usize,
    channel: Option<&str>,
) -> Result<Vec<Claim>> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "UPDATE batches SET state = '{running}', token = token + 1, attempts = attempts + 1,
                lease_until = $2, next_attempt_at = NULL, started_at = $1
         WHERE id IN (SELECT b.id FROM batches b
                      WHERE {reclaimable}
                        AND ($4::text IS NULL OR EXISTS (
                            SELECT 1 FROM conversations c
                            WHERE c.id = b.conversation_id AND c.channel = $4))
                      ORDER BY b.due_at LIMIT $3 FOR UPDATE OF b SKIP LOCKED)
         RETURNING id, token, attempts, requeued",
        running = BatchState::Running,
        reclaimable = batch::reclaimable_sql("$1"),
    )))
    .bind(now)
    .bind(now + lease)
    .bind(limit(Some(count)))
    .bind(channel)
    .fetch_all(&mut *conn)
    .await?;
    let mut claims = Vec::with_capacity(rows.len());
    for row in rows {
        let attempts: i32 = row.get(2);
        if attempts == 1 {
            take_pending(conn, row.get(0)).await?;
        }
        claims.push(Claim {
            batch: load_batch(conn, row.get(0)).await?,
            token: LeaseToken(row.get(1)),
            attempt: u32::try_from(attempts).unwrap_or(u32::MAX),
            requeued: row.get(3),
        });
    }
    Ok(claims)
}

/// A held batch's first run (see [`hold`]): what the customer wrote while it was held joins it.
async fn take_pending(conn: &mut PgConnection, batch: i64) -> Result<()> {
    sqlx::query(AssertSqlSafe(format!(
        "WITH batch AS (SELECT conversation_id AS conversation FROM batches WHERE id = $1),
              messages AS (
                  UPDATE inbox SET state = '{batched}', batch_id = $1
                  WHERE state = '{pending}' AND conversation_id = (SELECT conversation FROM batch))
         UPDATE conversations SET first_pending_at = NULL, last_pending_at = NULL, due_at = NULL,
                model_pending = false
         WHERE id = (SELECT conversation FROM batch)",
        batched = ItemState::Batched,
        pending = ItemState::Pending,
    )))
    .bind(batch)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// New batches: every pending message of each due conversation that has no batch open; a
/// batch never starts before the conversation's previous one finished (clocks may disagree).
async fn open_batches(
    conn: &mut PgConnection,
    now: At,
    lease: Duration,
    (skip, count): (usize, usize),
    channel: Option<&str>,
    lane: Lane,
) -> Result<Vec<Opened>> {
    // Written out, so that each lane's query may use its own index.
    let query = match lane {
        Lane::Any => {
            "SELECT id, due_at, requeued, held_until FROM conversations
             WHERE due_at <= $1 AND open_batch_id IS NULL AND ($3::text IS NULL OR channel = $3)
             ORDER BY due_at LIMIT $2 OFFSET $4 FOR UPDATE SKIP LOCKED"
        }
        Lane::Routine => {
            "SELECT id, due_at, requeued, held_until FROM conversations
             WHERE due_at <= $1 AND open_batch_id IS NULL AND ($3::text IS NULL OR channel = $3)
               AND NOT model_pending
             ORDER BY due_at LIMIT $2 OFFSET $4 FOR UPDATE SKIP LOCKED"
        }
        Lane::Model => {
            "SELECT id, due_at, requeued, held_until FROM conversations
             WHERE due_at <= $1 AND open_batch_id IS NULL AND ($3::text IS NULL OR channel = $3)
               AND model_pending
             ORDER BY due_at LIMIT $2 OFFSET $4 FOR UPDATE SKIP LOCKED"
        }
    };
    let due = sqlx::query(query)
        .bind(now)
        .bind(limit(Some(count)))
        .bind(channel)
        .bind(limit(Some(skip)))
        .fetch_all(&mut *conn)
        .await?;
    let mut opened = Vec::with_capacity(due.len());
    for row in due {
        let (conversation, due_at, requeued, held_until): (i64, i64, bool, Option<At>) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        // The batch, its messages and the conversation's open batch, in one statement.
        let batch: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "WITH batch AS (
                 INSERT INTO batches (conversation_id, state, token, attempts, lease_until, due_at,
                                      created_at, started_at, requeued)
                 VALUES ($1, '{running}', 1, 1, $2, $3, $4,
                         GREATEST($4, (SELECT max(finished_at) FROM batches WHERE conversation_id = $1)),
                         $5)
                 RETURNING id),
             messages AS (
                 UPDATE inbox SET state = '{batched}', batch_id = (SELECT id FROM batch)
                 WHERE conversation_id = $1 AND state = '{pending}'),
             opened AS (
                 UPDATE conversations SET open_batch_id = (SELECT id FROM batch),
                        first_pending_at = NULL, last_pending_at = NULL, due_at = NULL,
                        requeued = false, model_pending = false
                 WHERE id = $1)
             SELECT id FROM batch",
            running = BatchState::Running,
            batched = ItemState::Batched,
            pending = ItemState::Pending,
        )))
        .bind(conversation)
        .bind(now + lease)
        .bind(due_at)
        .bind(now)
        .bind(requeued)
        .fetch_one(&mut *conn)
        .await?;
        opened.push(Opened {
            batch,
            conversation,
            requeued,
            held_until,
        });
    }
    Ok(opened)
}

pub(super) async fn load_batch(conn: &mut PgConnection, id: i64) -> Result<Batch> {
    let row = sqlx::query(
        "SELECT c.channel, c.business, c.customer, b.due_at, c.held_until
         FROM batches b JOIN conversations c ON c.id = b.conversation_id WHERE b.id = $1",
    )
    .bind(id)
    .fetch_one(&mut *conn)
    .await?;
    let conversation = conversation_at(&row, 0)?;
    // In the order sent, unknown times first as SQLite and history order them (PostgreSQL
    // would put NULLs last); arrival order breaks ties.
    let messages = sqlx::query(
        "SELECT seq, dedupe_key, item_type, text, media_id, provider_ts, received_at,
                CASE channel WHEN 'webchat' THEN facts::jsonb ->> 'user_id' END,
                CASE channel WHEN 'webchat' THEN facts::jsonb ->> 'address' END
         FROM inbox WHERE batch_id = $1 ORDER BY provider_ts NULLS FIRST, seq",
    )
    .bind(id)
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(|r| BatchMessage {
        seq: r.get(0),
        external_id: r.get(1),
        item_type: r.get(2),
        text: r.get(3),
        media_id: r.get(4),
        provider_ts: r.get(5),
        received_at: r.get(6),
        user: r.get(7),
        address: r.get(8),
    })
    .collect();
    Ok(Batch {
        id,
        conversation,
        messages,
        due_at: row.get(3),
        held_until: row.get(4),
    })
}

/// The conversation of the batch a write carrying `token` speaks for (see [`sql::fenced`]),
/// locked for this transaction.
async fn check_token(conn: &mut PgConnection, batch: i64, token: LeaseToken) -> Result<i64> {
    sql::fenced(load_lease(conn, batch).await?, token)
}

/// A batch's lease and conversation, locked for this transaction.
async fn load_lease(conn: &mut PgConnection, batch: i64) -> Result<Option<(Lease, i64)>> {
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT {} FROM batches WHERE id = $1 FOR UPDATE",
        sql::LEASE_COLUMNS
    )))
    .bind(batch)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|row| Ok((sql::lease(row.get(0), row.get(1), row.get(2))?, row.get(3))))
        .transpose()
}

pub(super) async fn renew(
    pool: &PgPool,
    batch: i64,
    token: LeaseToken,
    now: At,
    lease: Duration,
) -> Result<()> {
    let mut tx = pool.begin().await?;
    let outcome = async {
        let renewed = sql::renewed(load_lease(&mut tx, batch).await?, token, now, lease)?;
        exec(
            &mut tx,
            "UPDATE batches SET lease_until = $2 WHERE id = $1",
            batch,
            renewed.until,
        )
        .await
    }
    .await;
    settle(tx, outcome).await
}

/// See [`crate::store::Turns::hold`]: new batches, their holding parts, and back to the queue
/// at their own due time with the attempt given back, in one transaction.
pub(super) async fn hold(pool: &PgPool, now: At, holding: &Holding) -> Result<Vec<i64>> {
    let mut tx = pool.begin().await?;
    let whatsapp = Some(Channel::Whatsapp.as_str());
    // Routine turns are claimed first: only the model's lane queues.
    let opened = open_batches(
        &mut tx,
        now,
        Duration::ZERO,
        (holding.skip, holding.limit),
        whatsapp,
        Lane::Model,
    )
    .await?;
    let mut held = Vec::with_capacity(opened.len());
    for Opened {
        batch,
        conversation,
        held_until,
        ..
    } in opened
    {
        // A person holding the conversation answers it: nobody is told to wait for the
        // assistant (the batch goes to them when it is claimed).
        if !review::person_holds(held_until, now) {
            write_reply(
                &mut tx,
                batch,
                conversation,
                now,
                &holding.parts,
                holding.sandbox,
                HOLD_PART,
            )
            .await?;
        }
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE batches SET state = '{waiting}', attempts = 0, lease_until = NULL,
                    next_attempt_at = due_at
             WHERE id = $1",
            waiting = BatchState::Waiting,
        )))
        .bind(batch)
        .execute(&mut *tx)
        .await?;
        held.push(batch);
    }
    tx.commit().await?;
    Ok(held)
}

pub(super) async fn finish(
    pool: &PgPool,
    batch: i64,
    token: LeaseToken,
    now: At,
    ending: &Ending,
) -> Result<()> {
    let mut tx = pool.begin().await?;
    let outcome = async {
        let conversation = check_token(&mut tx, batch, token).await?;
        match ending {
            Ending::Replied { parts, sandbox } => {
                write_reply(&mut tx, batch, conversation, now, parts, *sandbox, 0).await?;
                close(&mut tx, batch, conversation, now, batch::ended(ending)).await?;
            }
            Ending::RetryAt { at, error } => {
                sqlx::query(AssertSqlSafe(format!(
                    "UPDATE batches SET state = '{waiting}', lease_until = NULL, next_attempt_at = $2,
                            last_error = $3 WHERE id = $1",
                    waiting = batch::ended(ending),
                )))
                .bind(batch)
                .bind(at)
                .bind(error)
                .execute(&mut *tx)
                .await?;
            }
            Ending::Review { reason, error } => {
                to_review(&mut tx, batch, conversation, now, *reason, error.as_deref()).await?;
            }
            Ending::Handoff {
                parts,
                sandbox,
                note,
            } => {
                write_reply(&mut tx, batch, conversation, now, parts, *sandbox, 0).await?;
                let reason = ReviewReason::HandoffAsked;
                to_review(&mut tx, batch, conversation, now, reason, Some(note)).await?;
            }
        }
        Ok(())
    }
    .await;
    settle(tx, outcome).await
}

/// Writes `parts` to the outbox, numbered from `first`.
async fn write_reply(
    conn: &mut PgConnection,
    batch: i64,
    conversation: i64,
    now: At,
    parts: &[ReplyPart],
    sandbox: bool,
    first: u32,
) -> Result<()> {
    lock_conversation(conn, conversation).await?;
    for (index, part) in (first..).zip(parts) {
        let options = (!part.options.is_empty())
            .then(|| serde_json::to_string(&part.options).unwrap_or_default());
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO outbox (batch_id, part, channel, business, customer, body, state, created_at,
                                 conversation_id, options, reply_to, updated_at)
             SELECT $1, $2, channel, business, customer, $3, {first_state}, $5, id, $7, $8, $5
             FROM conversations WHERE id = $6
             ON CONFLICT (batch_id, part) DO NOTHING",
            first_state = sql::first_state("channel", "$4"),
        )))
        .bind(batch)
        .bind(i32::try_from(index).unwrap_or(i32::MAX))
        .bind(&part.text)
        .bind(sandbox)
        .bind(now)
        .bind(conversation)
        .bind(options)
        .bind(&part.quote)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Reply parts get their ids (the head-of-line order) under the conversation's row lock, so
/// per conversation the ids follow commit order, whichever node writes them.
pub(super) async fn lock_conversation(conn: &mut PgConnection, conversation: i64) -> Result<()> {
    sqlx::query("SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE")
        .bind(conversation)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

async fn to_review(
    conn: &mut PgConnection,
    batch: i64,
    conversation: i64,
    now: At,
    reason: ReviewReason,
    error: Option<&str>,
) -> Result<()> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO review (batch_id, reason, error, state, created_at)
         VALUES ($1, $2, $3, '{open}', $4)",
        open = ReviewState::Open,
    )))
    .bind(batch)
    .bind(reason.as_str())
    .bind(error)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    sqlx::query("UPDATE batches SET last_error = COALESCE($2, last_error) WHERE id = $1")
        .bind(batch)
        .bind(error)
        .execute(&mut *conn)
        .await?;
    close(conn, batch, conversation, now, BatchState::Review).await
}

/// Ends a batch for good and lets its conversation's next batch be claimed, in one statement.
async fn close(
    conn: &mut PgConnection,
    batch: i64,
    conversation: i64,
    now: At,
    state: BatchState,
) -> Result<()> {
    sqlx::query(
        "WITH ended AS (
             UPDATE batches SET state = $2, lease_until = NULL, finished_at = $3 WHERE id = $1),
         answered AS (
             UPDATE inbox SET state = $4 WHERE batch_id = $1)
         UPDATE conversations SET open_batch_id = NULL WHERE id = $5 AND open_batch_id = $1",
    )
    .bind(batch)
    .bind(state.as_str())
    .bind(now)
    .bind(sql::answered(state).as_str())
    .bind(conversation)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// `UPDATE ... WHERE id = $1` with one more value.
async fn exec(conn: &mut PgConnection, sql: &'static str, id: i64, value: At) -> Result<()> {
    sqlx::query(sql)
        .bind(id)
        .bind(value)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

pub(super) async fn next_due(pool: &PgPool) -> Result<Option<At>> {
    let lease_ends: Vec<String> = batch::lease_ends_sql()
        .iter()
        .map(|end| format!("({end})"))
        .collect();
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT LEAST(
             (SELECT min(due_at) FROM conversations WHERE open_batch_id IS NULL AND due_at IS NOT NULL),
             {})",
        lease_ends.join(", ")
    )))
    .fetch_one(pool)
    .await
    .map_err(Error::from)
}

pub(super) async fn history(pool: &PgPool, batch: i64, turns: usize) -> Result<Vec<HistoryEntry>> {
    let conversation: Option<i64> =
        sqlx::query_scalar("SELECT conversation_id FROM batches WHERE id = $1")
            .bind(batch)
            .fetch_optional(pool)
            .await?;
    match conversation {
        Some(conversation) => conversation_history(pool, conversation, batch, turns).await,
        None => Ok(Vec::new()),
    }
}

/// What was said in the last `turns` turns of a conversation before batch `before`, turn by
/// turn (the SQLite backend's order).
pub(super) async fn conversation_history(
    pool: &PgPool,
    conversation: i64,
    before: i64,
    turns: usize,
) -> Result<Vec<HistoryEntry>> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "WITH recent AS (
             SELECT id FROM batches WHERE conversation_id = $3 AND id < $1
             ORDER BY id DESC LIMIT $2)
         SELECT received_at, CASE kind WHEN '{echo}' THEN 1 ELSE 0 END,
                COALESCE(text, '[' || COALESCE(item_type, 'message') || ']'),
                batch_id, COALESCE(provider_ts, 0), seq
             FROM inbox WHERE batch_id IN (SELECT id FROM recent)
         UNION ALL SELECT created_at, 1, body, batch_id, id, 0 FROM outbox
             WHERE batch_id IN (SELECT id FROM recent) AND state NOT IN {unsaid}
         UNION ALL SELECT created_at, 2, 'handed to a person (' || reason || ')' || COALESCE(': ' || error, ''),
                batch_id, id, 0
             FROM review WHERE batch_id IN (SELECT id FROM recent) AND outbox_id IS NULL
         ORDER BY 4, 2, 5, 6",
        unsaid = *sql::UNSAID_SQL,
        echo = ItemKind::Echo.as_str(),
    )))
    .bind(before)
    .bind(limit(Some(turns)))
    .bind(conversation)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .iter()
        .map(|r| HistoryEntry {
            at: r.get(0),
            speaker: match r.get::<i32, _>(1) {
                0 => Speaker::Customer,
                1 => Speaker::Business,
                _ => Speaker::Note,
            },
            text: r.get(2),
        })
        .collect())
}

pub(super) async fn set_stage(pool: &PgPool, batch: i64, stage: &str) -> Result<()> {
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE batches SET stage = $2 WHERE id = $1 AND state = '{running}'",
        running = BatchState::Running,
    )))
    .bind(batch)
    .bind(stage)
    .execute(pool)
    .await?;
    Ok(())
}

pub(super) async fn add_usage(pool: &PgPool, batch: i64, usage: TurnUsage) -> Result<()> {
    let tokens = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    sqlx::query(
        "UPDATE batches SET prompt_tokens = COALESCE(prompt_tokens, 0) + $2,
                completion_tokens = COALESCE(completion_tokens, 0) + $3,
                cost = COALESCE(cost, 0) + $4
         WHERE id = $1",
    )
    .bind(batch)
    .bind(tokens(usage.prompt_tokens))
    .bind(tokens(usage.completion_tokens))
    .bind(usage.cost)
    .execute(pool)
    .await?;
    Ok(())
}

pub(super) async fn set_route(pool: &PgPool, batch: i64, guess: &RouteGuess) -> Result<()> {
    sqlx::query(
        "UPDATE batches SET route_intent = $2, route_confidence = $3, route_local = $4
         WHERE id = $1",
    )
    .bind(batch)
    .bind(&guess.intent)
    .bind(guess.confidence)
    .bind(guess.local)
    .execute(pool)
    .await?;
    Ok(())
}

/// A person's label; refused for a batch that does not exist.
pub(super) async fn label(pool: &PgPool, batch: i64, intent: &str) -> Result<()> {
    let done = sqlx::query("UPDATE batches SET label = $2 WHERE id = $1")
        .bind(batch)
        .bind(intent)
        .execute(pool)
        .await?;
    if done.rows_affected() == 0 {
        return Err(Error::NotFound);
    }
    Ok(())
}

pub(super) async fn routed(pool: &PgPool, since: At, limit: usize) -> Result<Vec<RoutedTurn>> {
    let rows = sqlx::query(
        "SELECT b.id, b.route_intent, b.route_confidence, b.route_local, b.state,
                b.prompt_tokens IS NOT NULL, b.label, b.finished_at,
                (SELECT string_agg(text, E'\n' ORDER BY provider_ts NULLS FIRST, seq)
                 FROM inbox WHERE batch_id = b.id AND text IS NOT NULL)
         FROM batches b
         WHERE b.route_intent IS NOT NULL AND b.finished_at >= $1
         ORDER BY b.finished_at DESC, b.id DESC LIMIT $2",
    )
    .bind(since)
    .bind(super::limit(Some(limit)))
    .fetch_all(pool)
    .await?;
    let mut turns = Vec::new();
    for r in rows {
        let state = known(BatchState::parse, r.get(4))?;
        let Some(answered_by) = answered_by(state, r.get(5), r.get(3)) else {
            continue;
        };
        turns.push(RoutedTurn {
            batch_id: r.get(0),
            text: r.get::<Option<String>, _>(8).unwrap_or_default(),
            guess: RouteGuess {
                intent: r.get(1),
                confidence: r.get(2),
                local: r.get(3),
            },
            answered_by,
            label: r.get(6),
            finished_at: r.get(7),
        });
    }
    Ok(turns)
}

pub(super) async fn stats(pool: &PgPool, since: At) -> Result<TurnStats> {
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT count(*) FILTER (WHERE state = '{done}' AND prompt_tokens IS NULL),
                count(*) FILTER (WHERE state = '{done}' AND prompt_tokens IS NOT NULL),
                count(*) FILTER (WHERE state = '{review}' AND attempts > 0),
                COALESCE(sum(prompt_tokens), 0)::BIGINT, COALESCE(sum(completion_tokens), 0)::BIGINT,
                COALESCE(sum(cost), 0)::DOUBLE PRECISION
         FROM batches WHERE finished_at >= $1",
        done = BatchState::Done,
        review = BatchState::Review,
    )))
    .bind(since)
    .fetch_one(pool)
    .await?;
    let n = |i: usize| u64::try_from(row.get::<i64, _>(i)).unwrap_or(0);
    Ok(TurnStats {
        local: n(0),
        agent: n(1),
        people: n(2),
        prompt_tokens: n(3),
        completion_tokens: n(4),
        cost: row.get(5),
    })
}
