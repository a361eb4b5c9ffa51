//! Broadcasts on SQLite: a broadcast and its audience kept in one transaction, read back with
//! their recipients counted by state, what people ask of them, and its recipients claimed and
//! their sends recorded through the rulebook (load, ask, save) in the single writer.

use std::collections::{HashMap, HashSet};

use rusqlite::{Connection, OptionalExtension, params};

use super::{limit_param, unavailable};
use crate::clock::At;
use crate::store::items::RecipientStatus;
use crate::store::rules::broadcast::{
    self, BroadcastState, Control, Event, LIVE_SQL, Limits, Outcome, PausedBy, Recipient,
    RecipientState, Step, TemplateNews, WAITING_SQL,
};
use crate::store::rules::consent::{self, Choice, Source};
use crate::store::rules::hours::LocalHours;
use crate::store::sql::{self, Due};
use crate::store::{
    BroadcastView, Error, HistoryEntry, NewBroadcast, REPLY_SPAN, RecipientClaim, RecipientJob,
    RecipientView, Result, Speaker, recipient_counts,
};

pub(super) fn keyed(conn: &Connection, key: &str) -> Result<Option<BroadcastView>> {
    let id: Option<i64> = conn
        .prepare_cached("SELECT id FROM broadcasts WHERE key = ?1")
        .and_then(|mut s| s.query_row(params![key], |r| r.get(0)).optional())
        .map_err(unavailable)?;
    id.map_or(Ok(None), |id| view(conn, id))
}

pub(super) fn create(conn: &Connection, b: &NewBroadcast) -> Result<(BroadcastView, bool)> {
    if let Some(key) = &b.key
        && let Some(existing) = keyed(conn, key)?
    {
        return Ok((existing, false));
    }
    let state = broadcast::initial(b.now, b.start_at);
    let id: i64 = conn
        .prepare_cached(
            "INSERT INTO broadcasts (key, name, template, language, business, state, created_at,
                                     start_at, deadline, rate, body, quiet_hours, tz,
                                     local_start, local_until)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)
             RETURNING id",
        )
        .and_then(|mut s| {
            s.query_row(
                params![
                    b.key,
                    b.name,
                    b.template,
                    b.language,
                    b.business,
                    state,
                    b.now,
                    b.start_at,
                    b.until,
                    b.rate,
                    b.body,
                    b.hours.as_ref().and_then(LocalHours::quiet_spec),
                    b.hours.as_ref().map(|h| &h.tz),
                    b.hours.as_ref().and_then(LocalHours::start_text),
                    b.hours.as_ref().and_then(LocalHours::until_text),
                ],
                |r| r.get(0),
            )
        })
        .map_err(unavailable)?;
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO broadcast_recipients (broadcast_id, recipient, params, line, state,
                                               skipped, error, tz)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )
        .map_err(unavailable)?;
    for r in &b.recipients {
        let listed = broadcast::Recipient::listed(r.skipped.as_ref().map(|s| s.0));
        let params = serde_json::to_string(&r.params).unwrap_or_else(|_| "[]".into());
        let line = r.line.map(|l| i64::try_from(l).unwrap_or(i64::MAX));
        insert
            .execute(params![
                id,
                r.to,
                params,
                line,
                listed.state,
                listed.skipped,
                r.skipped.as_ref().map(|s| &s.1),
                r.tz,
            ])
            .map_err(unavailable)?;
    }
    Ok((view(conn, id)?.ok_or(Error::NotFound)?, true))
}

pub(super) fn list(conn: &Connection, limit: usize) -> Result<Vec<BroadcastView>> {
    let ids: Vec<i64> = conn
        .prepare_cached("SELECT id FROM broadcasts ORDER BY id DESC LIMIT ?1")
        .and_then(|mut s| {
            s.query_map(params![limit_param(limit)], |r| r.get(0))?
                .collect()
        })
        .map_err(unavailable)?;
    let mut views = Vec::with_capacity(ids.len());
    for id in ids {
        views.extend(view(conn, id)?);
    }
    Ok(views)
}

pub(super) fn view(conn: &Connection, id: i64) -> Result<Option<BroadcastView>> {
    let counts: Vec<(RecipientState, u64)> = conn
        .prepare_cached(
            "SELECT state, count(*) FROM broadcast_recipients WHERE broadcast_id = ?1
             GROUP BY state",
        )
        .and_then(|mut s| {
            s.query_map(params![id], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
        .map_err(unavailable)?;
    conn.prepare_cached(
        "SELECT key, name, template, language, business, state, paused_because, created_at,
                start_at, deadline, rate, paused_by, body, quiet_hours, tz, local_start,
                local_until
         FROM broadcasts WHERE id = ?1",
    )
    .and_then(|mut s| {
        s.query_row(params![id], |r| {
            Ok(BroadcastView {
                id,
                key: r.get(0)?,
                name: r.get(1)?,
                template: r.get(2)?,
                language: r.get(3)?,
                business: r.get(4)?,
                state: r.get(5)?,
                paused_because: r.get(6)?,
                paused_by: r.get(11)?,
                body: r.get(12)?,
                quiet_hours: r.get(13)?,
                tz: r.get(14)?,
                local_start: r.get(15)?,
                local_until: r.get(16)?,
                created_at: r.get(7)?,
                start_at: r.get(8)?,
                until: r.get(9)?,
                rate: r.get(10)?,
                recipients: counts.iter().map(|(_, n)| n).sum(),
                counts: recipient_counts(counts.iter().copied()),
            })
        })
        .optional()
    })
    .map_err(unavailable)
}

pub(super) fn recipients(
    conn: &Connection,
    id: i64,
    state: Option<RecipientState>,
    limit: usize,
) -> Result<Vec<RecipientView>> {
    conn.prepare_cached(&format!(
        "SELECT {RECIPIENT_COLUMNS} FROM broadcast_recipients r
         WHERE r.broadcast_id = ?1 AND (?2 IS NULL OR r.state = ?2)
         ORDER BY r.id LIMIT ?3"
    ))
    .and_then(|mut s| {
        s.query_map(
            params![id, state.map(RecipientState::as_str), limit_param(limit)],
            recipient_view,
        )?
        .collect()
    })
    .map_err(unavailable)
}

/// What [`recipient_view`] reads of a recipient row, `r`.
pub(super) const RECIPIENT_COLUMNS: &str = "r.id, r.recipient, r.params, r.line, r.state,
    r.skipped, r.error, r.error_code, r.wamid, r.sent_at, r.replied_at, r.tz, r.billed,
    r.pricing_category";

/// A recipient row read from [`RECIPIENT_COLUMNS`], first in the row.
pub(super) fn recipient_view(r: &rusqlite::Row<'_>) -> rusqlite::Result<RecipientView> {
    let params: String = r.get(2)?;
    Ok(RecipientView {
        id: r.get(0)?,
        to: r.get(1)?,
        params: serde_json::from_str(&params).unwrap_or_default(),
        line: r
            .get::<_, Option<i64>>(3)?
            .and_then(|l| u64::try_from(l).ok()),
        state: r.get(4)?,
        skipped: r.get(5)?,
        error: r.get(6)?,
        error_code: r.get(7)?,
        wamid: r.get(8)?,
        sent_at: r.get(9)?,
        replied_at: r.get(10)?,
        tz: r.get(11)?,
        billed: r.get(12)?,
        pricing: r.get(13)?,
    })
}

pub(super) fn control(
    conn: &Connection,
    id: i64,
    control: Control,
    reason: Option<&str>,
) -> Result<BroadcastView> {
    let state = view(conn, id)?.ok_or(Error::NotFound)?.state;
    let next = broadcast::control(state, control).ok_or(Error::NotFound)?;
    let reason = (control == Control::Pause).then_some(reason).flatten();
    let by = (control == Control::Pause).then_some(PausedBy::Person);
    set_state(conn, id, next, reason, by)?;
    if control == Control::Cancel {
        let sql = format!(
            "UPDATE broadcast_recipients SET state = ?2, next_attempt_at = NULL
             WHERE broadcast_id = ?1 AND state IN {}",
            *WAITING_SQL
        );
        conn.execute(&sql, params![id, RecipientState::Cancelled])
            .map_err(unavailable)?;
    }
    view(conn, id)?.ok_or(Error::NotFound)
}

/// Meta's word on a template moves the broadcasts sending it, by the rulebook.
pub(super) fn hear_template(conn: &Connection, news: &TemplateNews) -> Result<Vec<i64>> {
    let live: Vec<(i64, BroadcastState, Option<PausedBy>, String, String)> = conn
        .prepare_cached(&format!(
            "SELECT id, state, paused_by, template, language FROM broadcasts
             WHERE template = ?1 AND state IN {}",
            *LIVE_SQL
        ))
        .and_then(|mut s| {
            s.query_map(params![news.name], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })?
            .collect()
        })
        .map_err(unavailable)?;
    let mut moved = Vec::new();
    for (id, state, by, template, language) in live {
        if !news.names(&template, &language) {
            continue;
        }
        if let Some((next, by)) = broadcast::on_template(state, by, news.approved) {
            let why = by.map(|_| news.why.as_str());
            set_state(conn, id, next, why, by)?;
            moved.push(id);
        }
    }
    Ok(moved)
}

fn set_state(
    conn: &Connection,
    id: i64,
    state: BroadcastState,
    paused_because: Option<&str>,
    paused_by: Option<PausedBy>,
) -> Result<()> {
    conn.prepare_cached(
        "UPDATE broadcasts SET state = ?2, paused_because = ?3, paused_by = ?4 WHERE id = ?1",
    )
    .and_then(|mut s| s.execute(params![id, state, paused_because, paused_by]))
    .map(drop)
    .map_err(unavailable)
}

/// Time moves the broadcasts on (see [`broadcast::at_time`]), then lapsed sends become unknown,
/// then the due recipients are claimed one by one through the rulebook, each when its own clock
/// lets it go (see [`LocalHours::turn`]).
pub(super) fn claim(conn: &Connection, c: &RecipientClaim) -> Result<Vec<RecipientJob>> {
    let hours = advance(conn, c.now)?;
    let lapsed: Vec<i64> = conn
        .prepare_cached(
            "SELECT id FROM broadcast_recipients WHERE state = ?1 AND lease_until <= ?2",
        )
        .and_then(|mut s| {
            s.query_map(params![RecipientState::Sending, c.now], |r| r.get(0))?
                .collect()
        })
        .map_err(unavailable)?;
    for id in lapsed {
        step(conn, id, &Event::LeaseLapsed, c.now, Limits::NONE)?;
    }
    let limit = c.limit.min(headroom(conn, c)?);
    let mut jobs = Vec::with_capacity(limit);
    for _ in 0..broadcast::CLAIM_PASSES {
        let due = due(conn, c, limit - jobs.len())?;
        if due.is_empty() {
            break;
        }
        for due in due {
            let (id, event) = (due.0, sql::claim_event(&hours, &due, c.now, c.lease));
            let stepped = step(conn, id, &event, c.now, Limits::NONE)?;
            if let Event::Claim { .. } = event {
                jobs.push(job(conn, id, stepped.recipient.attempts)?);
            }
        }
        if jobs.len() >= limit {
            break;
        }
    }
    finish(conn)?;
    Ok(jobs)
}

/// Up to `limit` recipients that may go at `now`, of running broadcasts not sent from a halted
/// number, in order.
fn due(conn: &Connection, c: &RecipientClaim, limit: usize) -> Result<Vec<Due>> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let halted = serde_json::to_string(&c.halted).unwrap_or_else(|_| "[]".into());
    conn.prepare_cached(&format!(
        "SELECT r.id, r.broadcast_id, r.tz,
                EXISTS (SELECT 1 FROM consents c WHERE c.customer = r.recipient AND c.opted_out),
                EXISTS (SELECT 1 FROM broadcast_recipients o
                        WHERE o.recipient = r.recipient AND o.sent_at > ?5 AND o.id <> r.id)
         FROM broadcast_recipients r JOIN broadcasts b ON b.id = r.broadcast_id
         WHERE b.state = ?1 AND r.state IN {waiting} AND coalesce(r.next_attempt_at, 0) <= ?2
           AND b.business NOT IN (SELECT value FROM json_each(?3))
         ORDER BY r.broadcast_id, r.id LIMIT ?4",
        waiting = *WAITING_SQL,
    ))
    .and_then(|mut s| {
        let args = params![
            BroadcastState::Running,
            c.now,
            halted,
            limit_param(limit),
            c.now - c.cooldown,
        ];
        s.query_map(args, |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect()
    })
    .map_err(unavailable)
}

/// How many more customers may be sent to now under the messaging limit.
fn headroom(conn: &Connection, c: &RecipientClaim) -> Result<usize> {
    match c.daily_limit {
        None => Ok(usize::MAX),
        Some(limit) => {
            let reached = reached(conn, c.now - broadcast::LIMIT_SPAN)?;
            Ok(broadcast::headroom(Some(limit), reached))
        }
    }
}

/// Customers sent a broadcast after `since`, or being sent one.
pub(super) fn reached(conn: &Connection, since: At) -> Result<u64> {
    conn.prepare_cached(
        "SELECT count(*) FROM (
             SELECT recipient FROM broadcast_recipients WHERE sent_at > ?1
             UNION SELECT recipient FROM broadcast_recipients WHERE state = ?2)",
    )
    .and_then(|mut s| s.query_row(params![since, RecipientState::Sending], |r| r.get(0)))
    .map_err(unavailable)
}

pub(super) fn first_reached(conn: &Connection, since: At) -> Result<Option<At>> {
    conn.prepare_cached(
        "SELECT min(last) FROM (
             SELECT max(sent_at) AS last FROM broadcast_recipients WHERE sent_at > ?1
             GROUP BY recipient)",
    )
    .and_then(|mut s| s.query_row(params![since], |r| r.get(0)))
    .map_err(unavailable)
}

pub(super) fn sent_since(
    conn: &Connection,
    customers: &[String],
    since: At,
) -> Result<HashSet<String>> {
    let asked = serde_json::to_string(customers).unwrap_or_else(|_| "[]".into());
    conn.prepare_cached(
        "SELECT DISTINCT recipient FROM broadcast_recipients
         WHERE sent_at > ?2 AND recipient IN (SELECT value FROM json_each(?1))",
    )
    .and_then(|mut s| s.query_map(params![asked, since], |r| r.get(0))?.collect())
    .map_err(unavailable)
}

pub(super) fn record(
    conn: &Connection,
    id: i64,
    attempt: u32,
    now: At,
    outcome: &Outcome,
    limits: Limits,
) -> Result<()> {
    let event = Event::Outcome { attempt, outcome };
    step(conn, id, &event, now, limits).map(drop)
}

/// A status of a broadcast message moves its recipient by the rulebook, in the ingest's
/// transaction; one that changes nothing (older, repeated, for another send) is dropped.
pub(super) fn reconcile(conn: &Connection, found: RecipientStatus<'_>, now: At) -> Result<()> {
    let RecipientStatus {
        status,
        named,
        billed,
        pricing,
    } = found;
    let by_wamid: Option<i64> = conn
        .prepare_cached("SELECT id FROM broadcast_recipients WHERE wamid = ?1")
        .and_then(|mut s| s.query_row(params![status.wamid], |r| r.get(0)).optional())
        .map_err(unavailable)?;
    let id = match (by_wamid, named) {
        (Some(id), _) => id,
        (None, Some((id, attempt))) => {
            let named: Option<i64> = conn
                .prepare_cached(
                    "SELECT id FROM broadcast_recipients WHERE id = ?1 AND attempts = ?2",
                )
                .and_then(|mut s| s.query_row(params![id, attempt], |r| r.get(0)).optional())
                .map_err(unavailable)?;
            let Some(id) = named else {
                return Ok(());
            };
            id
        }
        (None, None) => return Ok(()),
    };
    // Kept whatever the status does to the recipient: a late status still tells the price.
    if billed.is_some() || pricing.is_some() {
        conn.prepare_cached(
            "UPDATE broadcast_recipients
                SET billed = COALESCE(?2, billed), pricing_category = COALESCE(?3, pricing_category)
              WHERE id = ?1",
        )
        .and_then(|mut s| s.execute(params![id, billed, pricing]))
        .map_err(unavailable)?;
    }
    match step(conn, id, &Event::Status(status), now, Limits::NONE) {
        Ok(_) | Err(Error::LeaseLost) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Scheduled broadcasts whose start came run; live ones past their deadline are cancelled,
/// their waiting recipients with them. The hours on their recipients' clocks, by broadcast.
fn advance(conn: &Connection, now: At) -> Result<HashMap<i64, Option<LocalHours>>> {
    type Live = (i64, BroadcastState, At, Option<At>, [Option<String>; 4]);
    let live: Vec<Live> = conn
        .prepare_cached(&format!(
            "SELECT id, state, start_at, deadline, quiet_hours, tz, local_start, local_until
             FROM broadcasts WHERE state IN {}",
            *LIVE_SQL
        ))
        .and_then(|mut s| {
            s.query_map([], |r| {
                let hours = [r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?];
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, hours))
            })?
            .collect()
        })
        .map_err(unavailable)?;
    let mut hours = HashMap::new();
    for (id, state, start_at, deadline, [quiet, tz, start, until]) in live {
        let local = LocalHours::stored(
            quiet.as_deref(),
            tz.as_deref(),
            start.as_deref(),
            until.as_deref(),
        );
        hours.insert(id, local);
        let next = broadcast::at_time(state, now, start_at, deadline);
        if next == state {
            continue;
        }
        if next == BroadcastState::Cancelled {
            control(conn, id, Control::Cancel, None)?;
        } else {
            conn.prepare_cached("UPDATE broadcasts SET state = ?2 WHERE id = ?1")
                .and_then(|mut s| s.execute(params![id, next]))
                .map_err(unavailable)?;
        }
    }
    Ok(hours)
}

/// Running broadcasts with nobody left to send to, or being sent, are finished.
fn finish(conn: &Connection) -> Result<()> {
    let sql = format!(
        "UPDATE broadcasts SET state = ?1 WHERE state = ?2 AND NOT EXISTS (
             SELECT 1 FROM broadcast_recipients r WHERE r.broadcast_id = broadcasts.id
             AND (r.state IN {waiting} OR r.state = ?3))",
        waiting = *WAITING_SQL,
    );
    conn.prepare_cached(&sql)
        .and_then(|mut s| {
            s.execute(params![
                BroadcastState::Finished,
                BroadcastState::Running,
                RecipientState::Sending
            ])
        })
        .map(drop)
        .map_err(unavailable)
}

/// Keeps a customer's choice by the rulebook; `true` when it changed their standing.
pub(super) fn choose(conn: &Connection, customer: &str, choice: &Choice) -> Result<bool> {
    let kept = choice_of(conn, customer)?;
    let Some(new) = consent::apply(kept.as_ref(), choice) else {
        return Ok(false);
    };
    conn.prepare_cached(
        "INSERT INTO consents (customer, opted_out, source, at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (customer) DO UPDATE
         SET opted_out = excluded.opted_out, source = excluded.source, at = excluded.at",
    )
    .and_then(|mut s| s.execute(params![customer, new.opted_out, new.source, new.at]))
    .map_err(unavailable)?;
    Ok(true)
}

/// The customer's latest choice about broadcasts, if they made one.
pub(super) fn choice_of(conn: &Connection, customer: &str) -> Result<Option<Choice>> {
    conn.prepare_cached("SELECT opted_out, source, at FROM consents WHERE customer = ?1")
        .and_then(|mut s| {
            s.query_row(params![customer], |r| {
                Ok(Choice {
                    opted_out: r.get(0)?,
                    source: r.get(1)?,
                    at: r.get(2)?,
                })
            })
            .optional()
        })
        .map_err(unavailable)
}

pub(super) fn opted_out(conn: &Connection, customers: &[String]) -> Result<HashSet<String>> {
    let asked = serde_json::to_string(customers).unwrap_or_else(|_| "[]".into());
    conn.prepare_cached(
        "SELECT customer FROM consents
         WHERE opted_out AND customer IN (SELECT value FROM json_each(?1))",
    )
    .and_then(|mut s| s.query_map(params![asked], |r| r.get(0))?.collect())
    .map_err(unavailable)
}

/// Loads a recipient, asks the rulebook, and saves what it says; a refusal writes nothing.
/// Meta's word that the customer opted out (131050) is kept with it.
fn step(conn: &Connection, id: i64, event: &Event<'_>, now: At, limits: Limits) -> Result<Step> {
    let recipient = load(conn, id)?.ok_or(Error::NotFound)?;
    let step = broadcast::next(&recipient, event, now, limits).map_err(|_| Error::LeaseLost)?;
    save(conn, id, &step.recipient)?;
    if step.opted_out {
        let customer: String = conn
            .prepare_cached("SELECT recipient FROM broadcast_recipients WHERE id = ?1")
            .and_then(|mut s| s.query_row(params![id], |r| r.get(0)))
            .map_err(unavailable)?;
        let choice = Choice {
            opted_out: true,
            source: Source::Refused,
            at: now,
        };
        choose(conn, &customer, &choice)?;
    }
    Ok(step)
}

fn load(conn: &Connection, id: i64) -> Result<Option<Recipient>> {
    conn.prepare_cached(
        "SELECT state, attempts, failures, holds, wamid, delivery, skipped, error_code, error,
                next_attempt_at, lease_until, sent_at
         FROM broadcast_recipients WHERE id = ?1",
    )
    .and_then(|mut s| {
        s.query_row(params![id], |r| {
            Ok(Recipient {
                state: r.get(0)?,
                attempts: r.get(1)?,
                failures: r.get(2)?,
                holds: r.get(3)?,
                wamid: r.get(4)?,
                delivery: r.get(5)?,
                skipped: r.get(6)?,
                error_code: r.get(7)?,
                error: r.get(8)?,
                next_attempt_at: r.get(9)?,
                until: r.get(10)?,
                sent_at: r.get(11)?,
            })
        })
        .optional()
    })
    .map_err(unavailable)
}

fn save(conn: &Connection, id: i64, r: &Recipient) -> Result<()> {
    conn.prepare_cached(
        "UPDATE broadcast_recipients SET state = ?2, attempts = ?3, failures = ?4, holds = ?5,
                wamid = ?6, delivery = ?7, skipped = ?8, error_code = ?9, error = ?10,
                next_attempt_at = ?11, lease_until = ?12, sent_at = ?13
         WHERE id = ?1",
    )
    .and_then(|mut s| {
        s.execute(params![
            id,
            r.state,
            r.attempts,
            r.failures,
            r.holds,
            r.wamid,
            r.delivery,
            r.skipped,
            r.error_code,
            r.error,
            r.next_attempt_at,
            r.until,
            r.sent_at
        ])
    })
    .map(drop)
    .map_err(unavailable)
}

fn job(conn: &Connection, id: i64, attempt: u32) -> Result<RecipientJob> {
    conn.prepare_cached(
        "SELECT r.broadcast_id, r.recipient, r.params, b.template, b.language, b.business, b.rate
         FROM broadcast_recipients r JOIN broadcasts b ON b.id = r.broadcast_id WHERE r.id = ?1",
    )
    .and_then(|mut s| {
        s.query_row(params![id], |r| {
            let params: String = r.get(2)?;
            Ok(RecipientJob {
                id,
                broadcast_id: r.get(0)?,
                attempt,
                to: r.get(1)?,
                params: serde_json::from_str(&params).unwrap_or_default(),
                template: r.get(3)?,
                language: r.get(4)?,
                business: r.get(5)?,
                rate: r.get(6)?,
            })
        })
    })
    .map_err(unavailable)
}

/// A customer's message is the reply to the broadcast they were last sent, if that came within
/// [`REPLY_SPAN`] and had none yet.
pub(super) fn note_reply(conn: &Connection, customer: &str, at: At) -> Result<()> {
    conn.prepare_cached(
        "UPDATE broadcast_recipients SET replied_at = ?2
         WHERE id = (SELECT id FROM broadcast_recipients
                     WHERE recipient = ?1 AND sent_at > ?3 AND sent_at <= ?2
                     ORDER BY sent_at DESC LIMIT 1)
           AND replied_at IS NULL",
    )
    .and_then(|mut s| s.execute(params![customer, at, at - REPLY_SPAN]))
    .map(drop)
    .map_err(unavailable)
}

/// The latest broadcast sent to `customer` from `business` in (`since`, `until`], as read.
pub(super) fn last_to(
    conn: &Connection,
    customer: &str,
    business: &str,
    since: At,
    until: At,
) -> Result<Option<HistoryEntry>> {
    let found: Option<(At, String, Option<String>, String)> = conn
        .prepare_cached(
            "SELECT r.sent_at, b.template, b.body, r.params
             FROM broadcast_recipients r JOIN broadcasts b ON b.id = r.broadcast_id
             WHERE r.recipient = ?1 AND b.business = ?2 AND r.sent_at > ?3 AND r.sent_at <= ?4
             ORDER BY r.sent_at DESC LIMIT 1",
        )
        .and_then(|mut s| {
            s.query_row(params![customer, business, since, until], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .optional()
        })
        .map_err(unavailable)?;
    Ok(found.map(|(at, template, body, params)| {
        let params: Vec<String> = serde_json::from_str(&params).unwrap_or_default();
        HistoryEntry {
            at,
            speaker: Speaker::Business,
            text: broadcast::sent_text(&template, body.as_deref(), &params),
        }
    }))
}
