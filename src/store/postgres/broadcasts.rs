//! Broadcasts on PostgreSQL: a broadcast and its audience kept in one transaction (a key
//! taken twice at once still makes one), read back with their recipients counted by state, and
//! what people ask of them, under the broadcast's row lock.

use sqlx::{PgConnection, PgPool, Row};

use super::unavailable;
use crate::store::items::known;
use crate::store::rules::broadcast::{
    self, BroadcastState, Control, RecipientState, SkipReason, WAITING_SQL,
};
use crate::store::{BroadcastView, Error, NewBroadcast, RecipientView, Result, recipient_counts};

pub(super) async fn create(pool: &PgPool, b: &NewBroadcast) -> Result<(BroadcastView, bool)> {
    let mut tx = pool.begin().await.map_err(unavailable)?;
    let state = broadcast::initial(b.now, b.start_at);
    let id: Option<i64> = sqlx::query_scalar(
        "INSERT INTO broadcasts (key, name, template, language, business, state, created_at,
                                 start_at, deadline, rate)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
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
    .fetch_optional(&mut *tx)
    .await
    .map_err(unavailable)?;
    let Some(id) = id else {
        // The key was taken, by now committed: that broadcast is the answer.
        drop(tx);
        let id: i64 = sqlx::query_scalar("SELECT id FROM broadcasts WHERE key = $1")
            .bind(&b.key)
            .fetch_one(pool)
            .await
            .map_err(unavailable)?;
        let mut conn = pool.acquire().await.map_err(unavailable)?;
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
    // One statement for the whole audience, in its order.
    sqlx::query(
        "INSERT INTO broadcast_recipients (broadcast_id, recipient, params, line, state, skipped,
                                           error)
         SELECT $1, r, p, l, s, k, e FROM UNNEST($2::TEXT[], $3::TEXT[], $4::BIGINT[], $5::TEXT[], $6::TEXT[],
                                  $7::TEXT[]) WITH ORDINALITY AS a(r, p, l, s, k, e, n)
         ORDER BY n",
    )
    .bind(id)
    .bind(&to)
    .bind(&params)
    .bind(&lines)
    .bind(&states)
    .bind(&skips)
    .bind(&errors)
    .execute(&mut *tx)
    .await
    .map_err(unavailable)?;
    let made = view(&mut tx, id).await?.ok_or(Error::NotFound)?;
    tx.commit().await.map_err(unavailable)?;
    Ok((made, true))
}

pub(super) async fn list(pool: &PgPool, limit: usize) -> Result<Vec<BroadcastView>> {
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM broadcasts ORDER BY id DESC LIMIT $1")
        .bind(super::limit(Some(limit)))
        .fetch_all(pool)
        .await
        .map_err(unavailable)?;
    let mut conn = pool.acquire().await.map_err(unavailable)?;
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
    .await
    .map_err(unavailable)?;
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
                start_at, deadline, rate
         FROM broadcasts WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(unavailable)?;
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
    let rows = sqlx::query(
        "SELECT id, recipient, params, line, state, skipped, error, error_code, wamid
         FROM broadcast_recipients
         WHERE broadcast_id = $1 AND ($2::TEXT IS NULL OR state = $2)
         ORDER BY id LIMIT $3",
    )
    .bind(id)
    .bind(state.map(RecipientState::as_str))
    .bind(super::limit(Some(limit)))
    .fetch_all(pool)
    .await
    .map_err(unavailable)?;
    rows.iter()
        .map(|r| {
            let params: String = r.get(2);
            Ok(RecipientView {
                id: r.get(0),
                to: r.get(1),
                params: serde_json::from_str(&params).unwrap_or_default(),
                line: r
                    .get::<Option<i64>, _>(3)
                    .and_then(|l| u64::try_from(l).ok()),
                state: known(RecipientState::parse, r.get(4))?,
                skipped: r
                    .get::<Option<&str>, _>(5)
                    .map(|s| known(SkipReason::parse, s))
                    .transpose()?,
                error: r.get(6),
                error_code: r.get(7),
                wamid: r.get(8),
            })
        })
        .collect()
}

pub(super) async fn control(
    pool: &PgPool,
    id: i64,
    control: Control,
    reason: Option<&str>,
) -> Result<BroadcastView> {
    let mut tx = pool.begin().await.map_err(unavailable)?;
    let state: Option<String> =
        sqlx::query_scalar("SELECT state FROM broadcasts WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(unavailable)?;
    let state = known(BroadcastState::parse, &state.ok_or(Error::NotFound)?)?;
    let next = broadcast::control(state, control).ok_or(Error::NotFound)?;
    let reason = (control == Control::Pause).then_some(reason).flatten();
    sqlx::query("UPDATE broadcasts SET state = $2, paused_because = $3 WHERE id = $1")
        .bind(id)
        .bind(next.as_str())
        .bind(reason)
        .execute(&mut *tx)
        .await
        .map_err(unavailable)?;
    if control == Control::Cancel {
        let sql = format!(
            "UPDATE broadcast_recipients SET state = $2, next_attempt_at = NULL
             WHERE broadcast_id = $1 AND state IN {}",
            *WAITING_SQL
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(RecipientState::Cancelled.as_str())
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
    }
    let after = view(&mut tx, id).await?.ok_or(Error::NotFound)?;
    tx.commit().await.map_err(unavailable)?;
    Ok(after)
}
