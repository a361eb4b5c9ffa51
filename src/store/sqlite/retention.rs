//! Retention on SQLite (the rules are in [`retention`]): each sweep is one job of the single
//! writer, so it commits whole and nothing else writes in between; ingest and turns queue
//! behind it for the few milliseconds a batch takes (the sweeper sizes batches to keep it so).
//! Space comes back to the file system by incremental auto-vacuum ([`release_space`]), a slice
//! at a time; `secure_delete` zeroes what goes.

use std::collections::BTreeSet;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::customers::{count, drop_item, unlink};
use super::execute;
use super::unavailable;
use crate::clock::At;
use crate::domain::{Channel, ItemKind};
use crate::store::Result;
use crate::store::rules::batch::BatchState;
use crate::store::rules::erasure::Marks;
use crate::store::rules::item::ItemState;
use crate::store::rules::part::PartState;
use crate::store::rules::price;
use crate::store::rules::retention::{self, Cutoffs, Horizons, Swept, TURNLESS};
use crate::store::rules::review::{self, ReviewState};
use crate::store::rules::sql_list;

/// Free pages kept for reuse: a tenth of the file. Beyond that they go back to the file
/// system, this many at a time (1 MB of 4 KB pages), so no one release holds the writer long.
const RELEASE_PAGES: i64 = 256;

pub(super) fn hold_lease(
    conn: &Connection,
    lease: &str,
    holder: &str,
    now: At,
    ttl: Duration,
) -> Result<bool> {
    let held: Option<(String, At)> = conn
        .prepare_cached("SELECT holder, until FROM leases WHERE name = ?1")
        .and_then(|mut s| {
            s.query_row(params![lease], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(unavailable)?;
    let held = held.as_ref().map(|(by, until)| (by.as_str(), *until));
    if !retention::may_hold(held, holder, now) {
        return Ok(false);
    }
    execute(
        conn,
        "INSERT INTO leases (name, holder, until) VALUES (?1, ?2, ?3)
         ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, until = excluded.until",
        params![lease, holder, now + ttl],
    )?;
    Ok(true)
}

/// One batch of each kind past its horizon at `now`.
pub(super) fn sweep(
    conn: &Connection,
    horizons: &Horizons,
    now: At,
    batch: usize,
    marks: &Marks,
) -> Result<Swept> {
    let cut = horizons.cutoffs(now);
    let limit = i64::try_from(batch).unwrap_or(i64::MAX);
    let mut swept = Swept::default();
    let mut touched = BTreeSet::new();
    for (id, conversation) in ended_turns(conn, cut.messages, limit)? {
        sweep_turn(conn, id, now, marks, &mut swept)?;
        touched.insert(conversation);
    }
    sweep_turnless(
        conn,
        cut.messages,
        now,
        limit,
        marks,
        &mut swept,
        &mut touched,
    )?;
    sweep_aged(conn, &cut, limit, &mut swept)?;
    swept.keys += count(
        conn,
        "DELETE FROM desk_replies WHERE key IN (SELECT key FROM desk_replies WHERE at < ?1 LIMIT ?2)",
        params![now - review::DESK_REPLY_MEMORY, limit],
    )?;
    for conversation in touched {
        swept.conversations += sweep_conversation(conn, conversation, cut.messages)?;
    }
    Ok(swept)
}

/// A conversation left with nothing, whose customer last wrote before `before`, goes: the
/// last place their number stays, with the links of their ids when it was their last. 1 when
/// it went.
fn sweep_conversation(conn: &Connection, conversation: i64, before: At) -> Result<u64> {
    let gone: Option<(String, String)> = conn
        .prepare_cached(&format!(
            "DELETE FROM conversations
             WHERE id = ?1 AND due_at IS NULL AND open_batch_id IS NULL
               AND coalesce(last_inbound_at, 0) < ?2
               AND NOT EXISTS (SELECT 1 FROM batches WHERE conversation_id = ?1)
               AND NOT EXISTS (SELECT 1 FROM inbox WHERE conversation_id = ?1 AND state = '{pending}')
             RETURNING channel, customer",
            pending = ItemState::Pending,
        ))
        .and_then(|mut s| {
            s.query_row(params![conversation, before], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(unavailable)?;
    let Some((channel, customer)) = gone else {
        return Ok(0);
    };
    let last: bool = conn
        .prepare_cached(
            "SELECT NOT EXISTS (SELECT 1 FROM conversations WHERE channel = ?1 AND customer = ?2)",
        )
        .and_then(|mut s| s.query_row(params![channel, customer], |r| r.get(0)))
        .map_err(unavailable)?;
    if last {
        unlink(conn, &channel, &customer)?;
    }
    Ok(1)
}

/// Turns that ended before `before` and hold nothing still under way: no open review, no
/// reply part on its way. With their conversations.
fn ended_turns(conn: &Connection, before: At, limit: i64) -> Result<Vec<(i64, i64)>> {
    let ended = sql_list(BatchState::ALL, BatchState::as_str, retention::turn_ended);
    let unsettled = sql_list(PartState::ALL, PartState::as_str, PartState::unsettled);
    conn.prepare_cached(&format!(
        "SELECT b.id, b.conversation_id FROM batches b
         WHERE b.state IN {ended} AND b.finished_at < ?1
           AND NOT EXISTS (SELECT 1 FROM review r WHERE r.batch_id = b.id AND r.state = '{}')
           AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.batch_id = b.id AND o.state IN {unsettled})
         ORDER BY b.finished_at LIMIT ?2",
        ReviewState::Open.as_str()
    ))
    .and_then(|mut s| {
        s.query_map(params![before, limit], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect()
    })
    .map_err(unavailable)
}

/// A turn goes with its messages (their keys kept as hashes), their web-chat jobs, its reply
/// parts and review items.
fn sweep_turn(
    conn: &Connection,
    batch: i64,
    now: At,
    marks: &Marks,
    swept: &mut Swept,
) -> Result<()> {
    let items: Vec<(i64, Channel, String)> = conn
        .prepare_cached("SELECT seq, channel, dedupe_key FROM inbox WHERE batch_id = ?1")
        .and_then(|mut s| {
            s.query_map(params![batch], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect()
        })
        .map_err(unavailable)?;
    for (seq, channel, key) in items {
        if channel == Channel::Webchat {
            swept.chat_jobs += count(
                conn,
                "DELETE FROM chat_jobs WHERE message_key = ?1",
                params![key],
            )?;
        }
        drop_item(conn, seq, channel, &key, now, marks)?;
        swept.messages += 1;
    }
    swept.replies += count(
        conn,
        "DELETE FROM outbox WHERE batch_id = ?1",
        params![batch],
    )?;
    swept.reviews += count(
        conn,
        "DELETE FROM review WHERE batch_id = ?1",
        params![batch],
    )?;
    execute(conn, "DELETE FROM batches WHERE id = ?1", params![batch])?;
    swept.turns += 1;
    Ok(())
}

/// Messages that never had a turn go by their own age, keys kept as hashes.
fn sweep_turnless(
    conn: &Connection,
    before: At,
    now: At,
    limit: i64,
    marks: &Marks,
    swept: &mut Swept,
    touched: &mut BTreeSet<i64>,
) -> Result<()> {
    let states = sql_list(ItemState::ALL, ItemState::as_str, |s| TURNLESS.contains(&s));
    let found: Vec<(i64, Channel, String, Option<i64>)> = conn
        .prepare_cached(&format!(
            "SELECT seq, channel, dedupe_key, conversation_id FROM inbox
             WHERE received_at < ?1 AND kind = '{}' AND state IN {states} AND batch_id IS NULL
             LIMIT ?2",
            ItemKind::Message.as_str()
        ))
        .and_then(|mut s| {
            s.query_map(params![before, limit], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect()
        })
        .map_err(unavailable)?;
    for (seq, channel, key, conversation) in found {
        drop_item(conn, seq, channel, &key, now, marks)?;
        swept.messages += 1;
        touched.extend(conversation);
    }
    Ok(())
}

/// What goes by age alone: recorded items, quarantined bodies, keys past `dedupe`.
fn sweep_aged(conn: &Connection, cut: &Cutoffs, limit: i64, swept: &mut Swept) -> Result<()> {
    swept.statuses = count(
        conn,
        &format!(
            "DELETE FROM inbox WHERE seq IN (SELECT seq FROM inbox
                                             WHERE received_at < ?1 AND state = '{}' LIMIT ?2)",
            ItemState::Recorded.as_str()
        ),
        params![cut.statuses, limit],
    )?;
    swept.quarantined = count(
        conn,
        "DELETE FROM quarantine
         WHERE id IN (SELECT id FROM quarantine WHERE received_at < ?1 LIMIT ?2)",
        params![cut.quarantine, limit],
    )?;
    swept.keys = count(
        conn,
        "DELETE FROM erased_keys
         WHERE key_hash IN (SELECT key_hash FROM erased_keys WHERE erased_at < ?1 LIMIT ?2)",
        params![cut.keys, limit],
    )?;
    // A ledger hour goes whole once it ends before the horizon, so counts never read a part.
    swept.prices = count(
        conn,
        "DELETE FROM prices WHERE key IN (SELECT key FROM prices WHERE hour < ?1 LIMIT ?2)",
        params![price::hour(cut.messages), limit],
    )?;
    Ok(())
}

/// Gives free pages beyond a tenth of the file back to the file system, a slice at a time;
/// the rest stay for the next rows to reuse. `true` while more could go.
pub(super) fn release_space(conn: &Connection) -> Result<bool> {
    let pages = |pragma: &str| -> Result<i64> {
        conn.query_row(pragma, [], |r| r.get(0))
            .map_err(unavailable)
    };
    let excess = pages("PRAGMA freelist_count")? - pages("PRAGMA page_count")? / 10;
    if excess <= 0 {
        return Ok(false);
    }
    let slice = excess.min(RELEASE_PAGES);
    // Each step of the pragma frees one page: stepped to its end.
    let mut vacuum = conn
        .prepare(&format!("PRAGMA incremental_vacuum({slice})"))
        .map_err(unavailable)?;
    let mut steps = vacuum.query([]).map_err(unavailable)?;
    while steps.next().map_err(unavailable)?.is_some() {}
    Ok(excess > slice)
}

/// Turns incremental auto-vacuum on for a store made before retention, once: SQLite takes the
/// change (asked for at every connection) only with a full `VACUUM`, outside any transaction.
pub(super) fn enable_auto_vacuum(conn: &Connection) -> Result<()> {
    const INCREMENTAL: i64 = 2;
    let mode: i64 = conn
        .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
        .map_err(unavailable)?;
    if mode == INCREMENTAL {
        return Ok(());
    }
    let started = std::time::Instant::now();
    tracing::info!("rewriting the store once so freed space can go back to the file system");
    conn.execute_batch("VACUUM").map_err(unavailable)?;
    let seconds = started.elapsed().as_secs_f64();
    tracing::info!(seconds, "store rewritten with incremental auto-vacuum");
    Ok(())
}
