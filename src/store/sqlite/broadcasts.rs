//! Broadcasts on SQLite: a broadcast and its audience kept in one transaction, read back with
//! their recipients counted by state, and what people ask of them.

use rusqlite::{Connection, OptionalExtension, params};

use super::{limit_param, unavailable};
use crate::store::rules::broadcast::{self, Control, RecipientState, WAITING_SQL};
use crate::store::{BroadcastView, Error, NewBroadcast, RecipientView, Result, recipient_counts};

pub(super) fn create(conn: &Connection, b: &NewBroadcast) -> Result<(BroadcastView, bool)> {
    if let Some(key) = &b.key {
        let existing: Option<i64> = conn
            .prepare_cached("SELECT id FROM broadcasts WHERE key = ?1")
            .and_then(|mut s| s.query_row(params![key], |r| r.get(0)).optional())
            .map_err(unavailable)?;
        if let Some(id) = existing {
            return Ok((view(conn, id)?.ok_or(Error::NotFound)?, false));
        }
    }
    let state = broadcast::initial(b.now, b.start_at);
    let id: i64 = conn
        .prepare_cached(
            "INSERT INTO broadcasts (key, name, template, language, business, state, created_at,
                                     start_at, deadline, rate)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) RETURNING id",
        )
        .and_then(|mut s| {
            s.query_row(
                params![
                    b.key, b.name, b.template, b.language, b.business, state, b.now, b.start_at,
                    b.until, b.rate
                ],
                |r| r.get(0),
            )
        })
        .map_err(unavailable)?;
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO broadcast_recipients (broadcast_id, recipient, params, line, state,
                                               skipped, error)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
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
                start_at, deadline, rate
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
    conn.prepare_cached(
        "SELECT id, recipient, params, line, state, skipped, error, error_code, wamid
         FROM broadcast_recipients
         WHERE broadcast_id = ?1 AND (?2 IS NULL OR state = ?2)
         ORDER BY id LIMIT ?3",
    )
    .and_then(|mut s| {
        s.query_map(
            params![id, state.map(RecipientState::as_str), limit_param(limit)],
            |r| {
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
                })
            },
        )?
        .collect()
    })
    .map_err(unavailable)
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
    conn.prepare_cached("UPDATE broadcasts SET state = ?2, paused_because = ?3 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![id, next, reason]))
        .map_err(unavailable)?;
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
