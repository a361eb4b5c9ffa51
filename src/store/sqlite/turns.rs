//! The engine's side of the SQLite store: claims, leases with fencing, turn endings, and the
//! outbox and review reads. Every write runs in the group-commit writer, so each operation is
//! one transaction; the token check and the write it guards are in the same transaction.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::{conversation_at, execute, limit_param, unavailable};
use crate::clock::At;
use crate::domain::{
    Batch, BatchMessage, Channel, Claim, ItemKind, LeaseToken, ReplyPart, ReviewReason,
};
use crate::store::rules::batch::{self, BatchState, Lease, answered_by};
use crate::store::rules::item::ItemState;
use crate::store::rules::review::{self, ReviewState};
use crate::store::sql::{self, Opened};
use crate::store::{
    Ending, Error, HOLD_PART, HistoryEntry, Holding, Lane, Result, RouteGuess, RoutedTurn, Speaker,
    TurnStats, TurnUsage,
};

/// Claims due work, of one channel's conversations only when `channel` is given.
pub(super) fn claim(
    conn: &Connection,
    now: At,
    lease: Duration,
    limit: usize,
    channel: Option<Channel>,
) -> Result<Vec<Claim>> {
    let channel = channel.map(Channel::as_str);
    let mut claims = reclaim(conn, now, lease, limit, channel)?;
    if claims.len() < limit {
        let room = (0, limit - claims.len());
        claims.extend(claim_opened(conn, now, lease, room, channel, Lane::Any)?);
    }
    Ok(claims)
}

/// See [`crate::store::Turns::claim_routine`].
pub(super) fn claim_routine(
    conn: &Connection,
    now: At,
    lease: Duration,
    limit: usize,
) -> Result<Vec<Claim>> {
    let whatsapp = Some(Channel::Whatsapp.as_str());
    claim_opened(conn, now, lease, (0, limit), whatsapp, Lane::Routine)
}

/// New batches of due conversations, as claims under their first token.
fn claim_opened(
    conn: &Connection,
    now: At,
    lease: Duration,
    room: (usize, usize),
    channel: Option<&str>,
    lane: Lane,
) -> Result<Vec<Claim>> {
    open_batches(conn, now, lease, room, channel, lane)?
        .into_iter()
        .map(|o| {
            Ok(Claim {
                batch: load_batch(conn, o.batch)?,
                token: LeaseToken(1),
                attempt: 1,
                requeued: o.requeued,
            })
        })
        .collect()
}

/// Batches whose lease lapsed (their worker died or stalled) or whose retry time has come.
fn reclaim(
    conn: &Connection,
    now: At,
    lease: Duration,
    limit: usize,
    channel: Option<&str>,
) -> Result<Vec<Claim>> {
    let ids: Vec<i64> = conn
        .prepare_cached(&format!(
            "SELECT b.id FROM batches b JOIN conversations c ON c.id = b.conversation_id
             WHERE {reclaimable} AND (?3 IS NULL OR c.channel = ?3)
             ORDER BY b.due_at LIMIT ?2",
            reclaimable = batch::reclaimable_sql("?1"),
        ))
        .and_then(|mut s| {
            s.query_map(params![now, limit_param(limit), channel], |r| r.get(0))?
                .collect()
        })
        .map_err(unavailable)?;
    let mut claims = Vec::with_capacity(ids.len());
    for id in ids {
        let (token, attempts, requeued): (i64, u32, bool) = conn
            .prepare_cached(&format!(
                "UPDATE batches SET state = '{running}', token = token + 1, attempts = attempts + 1,
                        lease_until = ?2, next_attempt_at = NULL, started_at = ?3
                 WHERE id = ?1 RETURNING token, attempts, requeued",
                running = BatchState::Running,
            ))
            .and_then(|mut s| {
                s.query_row(params![id, now + lease, now], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
            })
            .map_err(unavailable)?;
        if attempts == 1 {
            take_pending(conn, id)?;
        }
        claims.push(Claim {
            batch: load_batch(conn, id)?,
            token: LeaseToken(token),
            attempt: attempts,
            requeued,
        });
    }
    Ok(claims)
}

/// A held batch's first run (see [`hold`]): what the customer wrote while it was held joins it.
fn take_pending(conn: &Connection, batch: i64) -> Result<()> {
    execute(
        conn,
        &format!(
            "UPDATE inbox SET state = '{batched}', batch_id = ?1
             WHERE state = '{pending}'
               AND conversation_id = (SELECT conversation_id FROM batches WHERE id = ?1)",
            batched = ItemState::Batched,
            pending = ItemState::Pending,
        ),
        params![batch],
    )?;
    execute(
        conn,
        "UPDATE conversations SET first_pending_at = NULL, last_pending_at = NULL, due_at = NULL,
                model_pending = 0
         WHERE id = (SELECT conversation_id FROM batches WHERE id = ?1)",
        params![batch],
    )
}

/// New batches: every pending message of each due conversation that has no batch open. A
/// batch never starts before the conversation's previous one finished, even when the caller's
/// `now` was read before it waited for the write lock (or on a node whose clock is behind).
fn open_batches(
    conn: &Connection,
    now: At,
    lease: Duration,
    (skip, limit): (usize, usize),
    channel: Option<&str>,
    lane: Lane,
) -> Result<Vec<Opened>> {
    // Written out, so that each lane's query may use its own index.
    let query = match lane {
        Lane::Any => {
            "SELECT id, due_at, requeued, held_until FROM conversations
             WHERE due_at <= ?1 AND open_batch_id IS NULL AND (?3 IS NULL OR channel = ?3)
             ORDER BY due_at LIMIT ?2 OFFSET ?4"
        }
        Lane::Routine => {
            "SELECT id, due_at, requeued, held_until FROM conversations
             WHERE due_at <= ?1 AND open_batch_id IS NULL AND (?3 IS NULL OR channel = ?3)
               AND model_pending = 0
             ORDER BY due_at LIMIT ?2 OFFSET ?4"
        }
        Lane::Model => {
            "SELECT id, due_at, requeued, held_until FROM conversations
             WHERE due_at <= ?1 AND open_batch_id IS NULL AND (?3 IS NULL OR channel = ?3)
               AND model_pending = 1
             ORDER BY due_at LIMIT ?2 OFFSET ?4"
        }
    };
    let conversations: Vec<(i64, i64, bool, Option<At>)> = conn
        .prepare_cached(query)
        .and_then(|mut s| {
            let skip = limit_param(skip).max(0);
            s.query_map(params![now, limit_param(limit), channel, skip], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect()
        })
        .map_err(unavailable)?;
    let mut opened = Vec::with_capacity(conversations.len());
    for (conversation, due_at, requeued, held_until) in conversations {
        let batch: i64 = conn
            .prepare_cached(&format!(
                "INSERT INTO batches (conversation_id, state, token, attempts, lease_until, due_at, created_at, started_at, requeued)
                 VALUES (?1, '{running}', 1, 1, ?2, ?3, ?4,
                         max(?4, coalesce((SELECT max(finished_at) FROM batches WHERE conversation_id = ?1), ?4)),
                         ?5) RETURNING id",
                running = BatchState::Running,
            ))
            .and_then(|mut s| s.query_row(params![conversation, now + lease, due_at, now, requeued], |r| r.get(0)))
            .map_err(unavailable)?;
        execute(
            conn,
            &format!(
                "UPDATE inbox SET state = '{batched}', batch_id = ?1
                 WHERE conversation_id = ?2 AND state = '{pending}'",
                batched = ItemState::Batched,
                pending = ItemState::Pending,
            ),
            params![batch, conversation],
        )?;
        execute(
            conn,
            "UPDATE conversations SET open_batch_id = ?1, first_pending_at = NULL, last_pending_at = NULL, due_at = NULL,
                    requeued = 0, model_pending = 0
             WHERE id = ?2",
            params![batch, conversation],
        )?;
        opened.push(Opened {
            batch,
            conversation,
            requeued,
            held_until,
        });
    }
    Ok(opened)
}

pub(super) fn load_batch(conn: &Connection, id: i64) -> Result<Batch> {
    let (conversation, due_at, held_until) = conn
        .prepare_cached(
            "SELECT c.channel, c.business, c.customer, b.due_at, c.held_until
             FROM batches b JOIN conversations c ON c.id = b.conversation_id WHERE b.id = ?1",
        )
        .and_then(|mut s| {
            s.query_row(params![id], |r| {
                let key = conversation_at(r, 0)?;
                Ok((key, r.get(3)?, r.get(4)?))
            })
        })
        .map_err(unavailable)?;
    Ok(Batch {
        id,
        conversation,
        messages: batch_messages(conn, id)?,
        due_at,
        held_until,
    })
}

/// A batch's messages in the order the customer sent them; arrival order breaks ties.
fn batch_messages(conn: &Connection, batch: i64) -> Result<Vec<BatchMessage>> {
    conn.prepare_cached(
        "SELECT seq, dedupe_key, item_type, text, media_id, provider_ts, received_at,
                CASE channel WHEN 'webchat' THEN json_extract(facts, '$.user_id') END,
                CASE channel WHEN 'webchat' THEN json_extract(facts, '$.address') END
         FROM inbox WHERE batch_id = ?1 ORDER BY provider_ts, seq",
    )
    .and_then(|mut s| {
        s.query_map(params![batch], |r| {
            Ok(BatchMessage {
                seq: r.get(0)?,
                external_id: r.get(1)?,
                item_type: r.get(2)?,
                text: r.get(3)?,
                media_id: r.get(4)?,
                provider_ts: r.get(5)?,
                received_at: r.get(6)?,
                user: r.get(7)?,
                address: r.get(8)?,
            })
        })?
        .collect()
    })
    .map_err(unavailable)
}

pub(super) fn renew(
    conn: &Connection,
    batch: i64,
    token: LeaseToken,
    now: At,
    lease: Duration,
) -> Result<()> {
    let renewed = sql::renewed(load_lease(conn, batch)?, token, now, lease)?;
    execute(
        conn,
        "UPDATE batches SET lease_until = ?2 WHERE id = ?1",
        params![batch, renewed.until],
    )
}

pub(super) fn finish(
    conn: &Connection,
    batch: i64,
    token: LeaseToken,
    now: At,
    ending: &Ending,
) -> Result<()> {
    let conversation = check_token(conn, batch, token)?;
    match ending {
        Ending::Replied { parts, sandbox } => {
            write_reply(conn, batch, conversation, now, parts, *sandbox, 0)?;
            close(conn, batch, conversation, now, batch::ended(ending))
        }
        Ending::RetryAt { at, error } => execute(
            conn,
            &format!(
                "UPDATE batches SET state = '{waiting}', lease_until = NULL, next_attempt_at = ?2,
                        last_error = ?3
                 WHERE id = ?1",
                waiting = batch::ended(ending),
            ),
            params![batch, at, error],
        ),
        Ending::Review { reason, error } => {
            to_review(conn, batch, conversation, now, *reason, error.as_deref())
        }
        Ending::Handoff {
            parts,
            sandbox,
            note,
        } => {
            write_reply(conn, batch, conversation, now, parts, *sandbox, 0)?;
            to_review(
                conn,
                batch,
                conversation,
                now,
                ReviewReason::HandoffAsked,
                Some(note),
            )
        }
    }
}

fn to_review(
    conn: &Connection,
    batch: i64,
    conversation: i64,
    now: At,
    reason: ReviewReason,
    error: Option<&str>,
) -> Result<()> {
    execute(
        conn,
        &format!(
            "INSERT INTO review (batch_id, reason, error, state, created_at)
             VALUES (?1, ?2, ?3, '{open}', ?4)",
            open = ReviewState::Open,
        ),
        params![batch, reason.as_str(), error, now],
    )?;
    execute(
        conn,
        "UPDATE batches SET last_error = coalesce(?2, last_error) WHERE id = ?1",
        params![batch, error],
    )?;
    close(conn, batch, conversation, now, BatchState::Review)
}

/// The conversation of the batch a write carrying `token` speaks for (see [`sql::fenced`]).
fn check_token(conn: &Connection, batch: i64, token: LeaseToken) -> Result<i64> {
    sql::fenced(load_lease(conn, batch)?, token)
}

/// A batch's lease and conversation.
fn load_lease(conn: &Connection, batch: i64) -> Result<Option<(Lease, i64)>> {
    let row: Option<(String, i64, Option<At>, i64)> = conn
        .prepare_cached(&format!(
            "SELECT {} FROM batches WHERE id = ?1",
            sql::LEASE_COLUMNS
        ))
        .and_then(|mut s| {
            s.query_row(params![batch], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .optional()
        })
        .map_err(unavailable)?;
    row.map(|(state, token, until, conversation)| {
        Ok((sql::lease(&state, token, until)?, conversation))
    })
    .transpose()
}

/// Writes `parts` to the outbox, numbered from `first`.
fn write_reply(
    conn: &Connection,
    batch: i64,
    conversation: i64,
    now: At,
    parts: &[ReplyPart],
    sandbox: bool,
    first: u32,
) -> Result<()> {
    for (index, part) in (first..).zip(parts) {
        let options = (!part.options.is_empty())
            .then(|| serde_json::to_string(&part.options).unwrap_or_default());
        // (batch, part) is unique: a part is written at most once whatever happens. Web-chat
        // answers are served from here; WhatsApp ones wait for the sender (or, in sandbox
        // mode, are only kept).
        execute(
            conn,
            &format!(
            "INSERT INTO outbox (batch_id, part, channel, business, customer, body, state, created_at,
                                 conversation_id, options, reply_to, updated_at)
             SELECT ?1, ?2, channel, business, customer, ?3,
                    {first_state},
                    ?5, id, ?7, ?8, ?5
             FROM conversations WHERE id = ?6
             ON CONFLICT (batch_id, part) DO NOTHING",
                first_state = sql::first_state("channel", "?4"),
            ),
            params![batch, index, part.text, sandbox, now, conversation, options, part.quote],
        )?;
    }
    Ok(())
}

/// Ends a batch for good and lets its conversation's next batch be claimed.
fn close(
    conn: &Connection,
    batch: i64,
    conversation: i64,
    now: At,
    state: BatchState,
) -> Result<()> {
    execute(
        conn,
        "UPDATE batches SET state = ?2, lease_until = NULL, finished_at = ?3 WHERE id = ?1",
        params![batch, state, now],
    )?;
    execute(
        conn,
        "UPDATE inbox SET state = ?2 WHERE batch_id = ?1",
        params![batch, sql::answered(state)],
    )?;
    execute(
        conn,
        "UPDATE conversations SET open_batch_id = NULL WHERE id = ?1 AND open_batch_id = ?2",
        params![conversation, batch],
    )
}

/// See [`crate::store::Turns::hold`]: new batches, their holding parts, and back to the queue
/// at their own due time with the attempt given back.
pub(super) fn hold(conn: &Connection, now: At, holding: &Holding) -> Result<Vec<i64>> {
    let whatsapp = Some(Channel::Whatsapp.as_str());
    // Routine turns are claimed first: only the model's lane queues.
    let opened = open_batches(
        conn,
        now,
        Duration::ZERO,
        (holding.skip, holding.limit),
        whatsapp,
        Lane::Model,
    )?;
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
                conn,
                batch,
                conversation,
                now,
                &holding.parts,
                holding.sandbox,
                HOLD_PART,
            )?;
        }
        execute(
            conn,
            &format!(
                "UPDATE batches SET state = '{waiting}', attempts = 0, lease_until = NULL,
                        next_attempt_at = due_at
                 WHERE id = ?1",
                waiting = BatchState::Waiting,
            ),
            params![batch],
        )?;
        held.push(batch);
    }
    Ok(held)
}

pub(super) fn next_due(conn: &Connection) -> Result<Option<At>> {
    conn.prepare_cached(&format!(
        "SELECT min(t) FROM (
             SELECT min(due_at) AS t FROM conversations WHERE open_batch_id IS NULL AND due_at IS NOT NULL
             UNION ALL {lease_ends})",
        lease_ends = batch::lease_ends_sql().join(" UNION ALL "),
    ))
    .and_then(|mut s| s.query_row([], |r| r.get(0)))
    .map_err(unavailable)
}

pub(super) fn history(conn: &Connection, batch: i64, turns: usize) -> Result<Vec<HistoryEntry>> {
    let conversation: Option<i64> = conn
        .prepare_cached("SELECT conversation_id FROM batches WHERE id = ?1")
        .and_then(|mut s| s.query_row(params![batch], |r| r.get(0)).optional())
        .map_err(unavailable)?;
    match conversation {
        Some(conversation) => conversation_history(conn, conversation, batch, turns),
        None => Ok(Vec::new()),
    }
}

/// What was said in the last `turns` turns of a conversation before batch `before`, turn by
/// turn: the customer's messages in the order sent, the reply parts that went (or will go) out,
/// then hand-off notes.
pub(super) fn conversation_history(
    conn: &Connection,
    conversation: i64,
    before: i64,
    turns: usize,
) -> Result<Vec<HistoryEntry>> {
    conn.prepare_cached(&format!(
        "WITH recent AS (
             SELECT id FROM batches WHERE conversation_id = ?3 AND id < ?1
             ORDER BY id DESC LIMIT ?2)
         SELECT received_at, CASE kind WHEN '{echo}' THEN 1 ELSE 0 END,
                coalesce(text, '[' || coalesce(item_type, 'message') || ']'),
                batch_id, coalesce(provider_ts, 0), seq
             FROM inbox WHERE batch_id IN (SELECT id FROM recent)
         UNION ALL SELECT created_at, 1, body, batch_id, id, 0 FROM outbox
             WHERE batch_id IN (SELECT id FROM recent) AND state NOT IN {unsaid}
         UNION ALL SELECT created_at, 2, 'handed to a person (' || reason || ')' || coalesce(': ' || error, ''),
                batch_id, id, 0
             FROM review WHERE batch_id IN (SELECT id FROM recent) AND outbox_id IS NULL
         ORDER BY 4, 2, 5, 6",
        unsaid = *sql::UNSAID_SQL,
        echo = ItemKind::Echo.as_str(),
    ))
    .and_then(|mut s| {
        s.query_map(params![before, limit_param(turns), conversation], |r| {
            let speaker = match r.get::<_, i64>(1)? {
                0 => Speaker::Customer,
                1 => Speaker::Business,
                _ => Speaker::Note,
            };
            Ok(HistoryEntry {
                at: r.get(0)?,
                speaker,
                text: r.get(2)?,
            })
        })?
        .collect()
    })
    .map_err(unavailable)
}

pub(super) fn set_stage(conn: &Connection, batch: i64, stage: &str) -> Result<()> {
    execute(
        conn,
        &format!(
            "UPDATE batches SET stage = ?2 WHERE id = ?1 AND state = '{running}'",
            running = BatchState::Running,
        ),
        params![batch, stage],
    )
}

pub(super) fn add_usage(conn: &Connection, batch: i64, usage: TurnUsage) -> Result<()> {
    let tokens = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    execute(
        conn,
        "UPDATE batches SET prompt_tokens = coalesce(prompt_tokens, 0) + ?2,
                completion_tokens = coalesce(completion_tokens, 0) + ?3,
                cost = coalesce(cost, 0) + ?4
         WHERE id = ?1",
        params![
            batch,
            tokens(usage.prompt_tokens),
            tokens(usage.completion_tokens),
            usage.cost
        ],
    )
}

pub(super) fn set_route(conn: &Connection, batch: i64, guess: &RouteGuess) -> Result<()> {
    execute(
        conn,
        "UPDATE batches SET route_intent = ?2, route_confidence = ?3, route_local = ?4
         WHERE id = ?1",
        params![
            batch,
            guess.intent,
            f64::from(guess.confidence),
            guess.local
        ],
    )
}

/// A person's label; refused for a batch that does not exist.
pub(super) fn label(conn: &Connection, batch: i64, intent: &str) -> Result<()> {
    let changed = conn
        .prepare_cached("UPDATE batches SET label = ?2 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![batch, intent]))
        .map_err(unavailable)?;
    if changed == 0 {
        return Err(Error::NotFound);
    }
    Ok(())
}

pub(super) fn routed(conn: &Connection, since: At, limit: usize) -> Result<Vec<RoutedTurn>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT b.id, b.route_intent, b.route_confidence, b.route_local, b.state,
                    b.prompt_tokens IS NOT NULL, b.label, b.finished_at,
                    (SELECT group_concat(text, char(10)) FROM
                        (SELECT text FROM inbox WHERE batch_id = b.id AND text IS NOT NULL
                         ORDER BY coalesce(provider_ts, 0), seq))
             FROM batches b
             WHERE b.route_intent IS NOT NULL AND b.finished_at >= ?1
             ORDER BY b.finished_at DESC, b.id DESC LIMIT ?2",
        )
        .map_err(unavailable)?;
    let rows = stmt
        .query_map(params![since, limit_param(limit)], |r| {
            let state: BatchState = r.get(4)?;
            let local: bool = r.get(3)?;
            Ok((
                r.get::<_, i64>(0)?,
                RouteGuess {
                    intent: r.get(1)?,
                    confidence: r.get::<_, f64>(2)? as f32,
                    local,
                },
                answered_by(state, r.get(5)?, local),
                r.get(6)?,
                r.get(7)?,
                r.get::<_, Option<String>>(8)?,
            ))
        })
        .map_err(unavailable)?;
    let mut turns = Vec::new();
    for row in rows {
        let (batch_id, guess, answered_by, label, finished_at, text) = row.map_err(unavailable)?;
        let Some(answered_by) = answered_by else {
            continue;
        };
        turns.push(RoutedTurn {
            batch_id,
            text: text.unwrap_or_default(),
            guess,
            answered_by,
            label,
            finished_at,
        });
    }
    Ok(turns)
}

pub(super) fn stats(conn: &Connection, since: At) -> Result<TurnStats> {
    conn.prepare_cached(&format!(
        "SELECT count(*) FILTER (WHERE state = '{done}' AND prompt_tokens IS NULL),
                count(*) FILTER (WHERE state = '{done}' AND prompt_tokens IS NOT NULL),
                count(*) FILTER (WHERE state = '{review}' AND attempts > 0),
                coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0),
                coalesce(sum(cost), 0.0)
         FROM batches WHERE finished_at >= ?1",
        done = BatchState::Done,
        review = BatchState::Review,
    ))
    .and_then(|mut s| {
        s.query_row(params![since], |r| {
            Ok(TurnStats {
                local: r.get(0)?,
                agent: r.get(1)?,
                people: r.get(2)?,
                prompt_tokens: r.get(3)?,
                completion_tokens: r.get(4)?,
                cost: r.get(5)?,
            })
        })
    })
    .map_err(unavailable)
}
