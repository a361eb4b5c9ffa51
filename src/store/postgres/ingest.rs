//! Deliveries and web-chat questions into the PostgreSQL store, and reading them back.
//!
//! An item is inserted first (`ON CONFLICT DO NOTHING`): a concurrent copy of the same item
//! waits on the unique index and then finds it there, so only the first copy schedules its
//! conversation. An item erased since is known by its key's hash, looked for after the insert
//! (functions.sql), so an erasure committing meanwhile is seen too.

use std::time::Duration;

use crate::clock::{At, millis};
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};

use super::{broadcasts, categories, channel, limit, outbox, unavailable};
use crate::domain::{Channel, ConversationKey, InboundItem, ItemKind, Quarantined};
use crate::store::items::known;
use crate::store::items::{
    Amendment, Encoded, POSITION_CAP, amendment, message_key, quarantine_hash, question_item,
    sent_at, session_retry_after, status_of,
};
use crate::store::rules::erasure::Marks;
use crate::store::rules::item::ItemState;
use crate::store::rules::review::{self, Destination, ReviewState};
use crate::store::rules::{broadcast, category, consent};
use crate::store::sql;
use crate::store::{
    ChatExchange, ChatFeed, ChatJob, ChatReceipt, ChatSubmission, Error, InboxQuery, Ingest,
    IngestReceipt, JobStatus, PersonLine, REPLY_SPAN, Result, StoredItem, StoredQuarantine,
    Submitted,
};

pub(super) async fn ingest(
    pool: &PgPool,
    delivery: &Ingest,
    marks: &Marks,
) -> Result<IngestReceipt> {
    let encoded: Vec<Encoded> = delivery.items.iter().map(Encoded::of).collect();
    // Each item's key as erasure keeps it: a retry of an erased item is not taken in again.
    let erased: Vec<String> = delivery
        .items
        .iter()
        .map(|i| marks.key_hash(i.channel, &i.dedupe_key))
        .collect();
    if let ([item], [encoded], [erased], []) = (
        delivery.items.as_slice(),
        encoded.as_slice(),
        erased.as_slice(),
        delivery.quarantined.as_slice(),
    ) {
        if let (ItemKind::Message, Some(key)) = (item.kind, &item.turn) {
            return ingest_message(pool, delivery, item, key, (encoded, erased)).await;
        }
    }
    let mut tx = pool.begin().await.map_err(unavailable)?;
    let receipt = ingest_in(&mut tx, delivery, &encoded, &erased).await?;
    tx.commit().await.map_err(unavailable)?;
    Ok(receipt)
}

/// The common delivery, one customer message that wakes its conversation, in one round trip
/// instead of four: the function call commits on its own.
async fn ingest_message(
    pool: &PgPool,
    delivery: &Ingest,
    item: &InboundItem,
    key: &ConversationKey,
    (encoded, erased): (&Encoded, &str),
) -> Result<IngestReceipt> {
    let mut receipt = IngestReceipt::default();
    match store_message(pool, delivery, item, key, (encoded, erased), None).await? {
        Some(due) => {
            receipt.stored = 1;
            receipt.earliest_due = Some(due);
        }
        None => {
            let mut conn = pool.acquire().await.map_err(unavailable)?;
            count_redelivery(&mut conn, item, &encoded.hash, &mut receipt).await?;
        }
    }
    Ok(receipt)
}

/// Stores a customer message that wakes its conversation and schedules the conversation (due
/// one window after the latest message, never later than the cap after the first), through
/// `sabi_ingest_message_v5` (functions.sql): the message's unique key first, then the
/// conversation's row, so a racing copy waits on the key and schedules nothing. The
/// conversation's due time when the message is new; `None` when it was already stored or was
/// erased since.
async fn store_message<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    delivery: &Ingest,
    item: &InboundItem,
    key: &ConversationKey,
    (Encoded { facts, hash }, erased): (&Encoded, &str),
    seq: Option<i64>,
) -> Result<Option<At>> {
    let stored: Option<(i64, At)> = sqlx::query_as(
        "SELECT seq, due_at FROM sabi_ingest_message_v5(
             $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
             $19, $20, $21)",
    )
    .bind(item.channel.as_str())
    .bind(&item.dedupe_key)
    .bind(&item.business)
    .bind(&item.customer)
    .bind(&item.item_type)
    .bind(&item.text)
    .bind(&item.media_id)
    .bind(item.provider_ts)
    .bind(delivery.received_at)
    .bind(hash)
    .bind(facts)
    .bind(key.channel.as_str())
    .bind(&key.business)
    .bind(&key.customer)
    .bind(millis(delivery.policy.window))
    .bind(millis(delivery.policy.cap))
    .bind(sent_at(item, delivery.received_at))
    .bind(seq)
    .bind(delivery.received_at - REPLY_SPAN)
    .bind(!delivery.routine.contains(&item.dedupe_key))
    .bind(erased)
    .fetch_optional(executor)
    .await
    .map_err(unavailable)?;
    Ok(stored.map(|(_, due)| due))
}

async fn ingest_in(
    conn: &mut PgConnection,
    delivery: &Ingest,
    encoded: &[Encoded],
    erased: &[String],
) -> Result<IngestReceipt> {
    let mut receipt = IngestReceipt::default();
    let order = lock_order(&delivery.items);
    let seqs = arrival_seqs(conn, &order).await?;
    for index in order {
        let (item, Encoded { facts, hash }) = (&delivery.items[index], &encoded[index]);
        let seq = seqs.as_ref().map(|seqs| seqs[index]);
        if let (ItemKind::Message, Some(key)) = (item.kind, &item.turn) {
            let given = (&encoded[index], erased[index].as_str());
            match store_message(&mut *conn, delivery, item, key, given, seq).await? {
                Some(due) => {
                    receipt.stored += 1;
                    receipt.earliest_due = Some(receipt.earliest_due.map_or(due, |d| d.min(due)));
                }
                None => count_redelivery(conn, item, hash, &mut receipt).await?,
            }
            continue;
        }
        let state = crate::store::rules::item::arrived(item.kind, false).as_str();
        // functions.sql: stored once, and not at all when erased since.
        let seq: Option<i64> = sqlx::query_scalar(
            "SELECT sabi_ingest_item_v1(
                 $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
        )
        .bind(item.channel.as_str())
        .bind(&item.dedupe_key)
        .bind(item.kind.as_str())
        .bind(&item.business)
        .bind(&item.customer)
        .bind(&item.item_type)
        .bind(&item.text)
        .bind(&item.media_id)
        .bind(item.provider_ts)
        .bind(delivery.received_at)
        .bind(state)
        .bind(hash)
        .bind(facts)
        .bind(seq)
        .bind(&erased[index])
        .fetch_one(&mut *conn)
        .await
        .map_err(unavailable)?;
        if seq.is_none() {
            count_redelivery(conn, item, hash, &mut receipt).await?;
            continue;
        }
        receipt.stored += 1;
        if item.kind == ItemKind::Status {
            outbox::reconcile_status(conn, item, delivery.received_at, delivery.pair_spacing)
                .await?;
            broadcasts::reconcile_status(conn, item, delivery.received_at).await?;
        }
        for (customer, choice) in consent::preferences(item) {
            broadcasts::choose(conn, &customer, &choice).await?;
        }
        if let Some(news) = broadcast::template_news(item) {
            broadcasts::hear_template(conn, &news).await?;
        }
        if let Some(news) = category::news(item, delivery.received_at) {
            categories::keep(conn, &news).await?;
        }
        if let (ItemKind::Message, Channel::Whatsapp, Some(customer)) =
            (item.kind, item.channel, &item.customer)
        {
            broadcasts::note_reply(conn, customer, delivery.received_at).await?;
        }
        if let Some(change) = amendment(item) {
            amend(conn, item.channel, &change).await?;
        }
    }
    for q in &delivery.quarantined {
        receipt.quarantined += keep_quarantined(conn, q, delivery.received_at).await?;
    }
    Ok(receipt)
}

/// Arrival-order seqs for a delivery stored out of its order (see [`lock_order`]), one per item
/// by its place in the delivery, taken ahead in one round trip; `None` when the order is the
/// delivery's own and each insert takes the next seq itself.
async fn arrival_seqs(conn: &mut PgConnection, order: &[usize]) -> Result<Option<Vec<i64>>> {
    if order.is_sorted() {
        return Ok(None);
    }
    let seqs: Vec<i64> = sqlx::query_scalar(
        "SELECT nextval('inbox_seq_seq'::regclass) AS seq
         FROM generate_series(1, $1) ORDER BY seq",
    )
    .bind(i32::try_from(order.len()).unwrap_or(i32::MAX))
    .fetch_all(&mut *conn)
    .await
    .map_err(unavailable)?;
    Ok(Some(seqs))
}

/// The order a delivery's items are stored in, so that concurrent transactions take row locks
/// in one order and cannot deadlock: statuses first (they lock reply parts, and a sender locks a
/// part before its conversation), then messages by conversation. A conversation's own messages
/// keep their order, so arrival order still breaks ties within it. Deletions and edits come
/// last, after the messages they may name (a rare lock-order crossing is retried as any
/// deadlock is).
fn lock_order(items: &[InboundItem]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| {
        let item = &items[i];
        let conversation = item
            .turn
            .as_ref()
            .map(|k| (k.channel.as_str(), k.business.as_str(), k.customer.as_str()));
        (
            item.kind != ItemKind::Status,
            amendment(item).is_some(),
            conversation,
        )
    });
    order
}

/// Applies a customer's deletion or edit to the message it names while that still waits for
/// its turn (see [`Amendment`]).
async fn amend(conn: &mut PgConnection, channel: Channel, change: &Amendment<'_>) -> Result<()> {
    let original = change.original();
    if let Some(text) = change.text() {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE inbox SET text = $3
             WHERE channel = $1 AND dedupe_key = $2 AND state = '{pending}'",
            pending = ItemState::Pending,
        )))
        .bind(channel.as_str())
        .bind(original)
        .bind(text)
        .execute(&mut *conn)
        .await
        .map_err(unavailable)?;
        return Ok(());
    }
    let conversation: Option<Option<i64>> = sqlx::query_scalar(AssertSqlSafe(format!(
        "UPDATE inbox SET state = '{withdrawn}'
         WHERE channel = $1 AND dedupe_key = $2 AND state = '{pending}'
         RETURNING conversation_id",
        withdrawn = ItemState::Withdrawn,
        pending = ItemState::Pending,
    )))
    .bind(channel.as_str())
    .bind(original)
    .fetch_optional(&mut *conn)
    .await
    .map_err(unavailable)?;
    if let Some(Some(conversation)) = conversation {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE conversations SET first_pending_at = NULL, last_pending_at = NULL,
                    due_at = NULL, model_pending = false
             WHERE id = $1
               AND NOT EXISTS (SELECT 1 FROM inbox WHERE conversation_id = $1 AND state = '{pending}')",
            pending = ItemState::Pending,
        )))
        .bind(conversation)
        .execute(&mut *conn)
        .await
        .map_err(unavailable)?;
    }
    Ok(())
}

async fn count_redelivery(
    conn: &mut PgConnection,
    item: &InboundItem,
    hash: &[u8],
    receipt: &mut IngestReceipt,
) -> Result<()> {
    let stored: Option<Vec<u8>> =
        sqlx::query_scalar("SELECT content_hash FROM inbox WHERE channel = $1 AND dedupe_key = $2")
            .bind(item.channel.as_str())
            .bind(&item.dedupe_key)
            .fetch_optional(&mut *conn)
            .await
            .map_err(unavailable)?;
    // Not stored and not taken: a retry of an item erased since, known by its key's hash.
    let Some(stored) = stored else {
        receipt.duplicates += 1;
        return Ok(());
    };
    if stored == hash {
        receipt.duplicates += 1;
    } else {
        receipt.anomalies += 1;
        tracing::warn!(
            channel = item.channel.as_str(),
            key = %item.dedupe_key,
            "anomaly: a redelivered id carries other content; the first copy is kept"
        );
    }
    Ok(())
}

async fn keep_quarantined(conn: &mut PgConnection, q: &Quarantined, at: At) -> Result<usize> {
    let done = sqlx::query(
        "INSERT INTO quarantine (channel, received_at, reason, raw, hash) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (channel, hash) DO NOTHING",
    )
    .bind(q.channel.as_str())
    .bind(at)
    .bind(&q.reason)
    .bind(&q.raw)
    .bind(quarantine_hash(q))
    .execute(&mut *conn)
    .await
    .map_err(unavailable)?;
    Ok(usize::try_from(done.rows_affected()).unwrap_or(0))
}

pub(super) async fn inbox(pool: &PgPool, query: &InboxQuery) -> Result<Vec<StoredItem>> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT {ITEM_COLUMNS} FROM inbox
         WHERE seq > $1 AND ($2::text IS NULL OR kind = $2) AND ($3::text IS NULL OR channel = $3)
         ORDER BY seq LIMIT $4"
    )))
    .bind(query.after.unwrap_or(0))
    .bind(query.kind.map(ItemKind::as_str))
    .bind(query.channel.map(Channel::as_str))
    .bind(limit(query.limit))
    .fetch_all(pool)
    .await
    .map_err(unavailable)?;
    rows.iter().map(stored_item).collect()
}

/// What [`stored_item`] reads of an inbox row.
pub(super) const ITEM_COLUMNS: &str = "seq, channel, dedupe_key, kind, business, customer,
    item_type, text, media_id, provider_ts, received_at, state, batch_id, facts";

/// An inbox row read from [`ITEM_COLUMNS`].
pub(super) fn stored_item(r: &sqlx::postgres::PgRow) -> Result<StoredItem> {
    let kind: String = r.get(3);
    let facts: String = r.get(13);
    Ok(StoredItem {
        seq: r.get(0),
        item: InboundItem {
            kind: ItemKind::parse(&kind)
                .ok_or_else(|| Error::Schema(format!("unknown kind {kind:?}")))?,
            channel: channel(r.get(1))?,
            dedupe_key: r.get(2),
            business: r.get(4),
            customer: r.get(5),
            item_type: r.get(6),
            text: r.get(7),
            media_id: r.get(8),
            provider_ts: r.get(9),
            turn: None,
            facts: serde_json::from_str(&facts)
                .map_err(|e| Error::Schema(format!("undecodable facts: {e}")))?,
        },
        received_at: r.get(10),
        state: known(ItemState::parse, r.get(11))?,
        batch: r.get(12),
    })
}

pub(super) async fn quarantine(
    pool: &PgPool,
    count: Option<usize>,
) -> Result<Vec<StoredQuarantine>> {
    let rows = sqlx::query(
        "SELECT id, channel, received_at, reason, raw FROM quarantine ORDER BY id LIMIT $1",
    )
    .bind(limit(count))
    .fetch_all(pool)
    .await
    .map_err(unavailable)?;
    rows.iter()
        .map(|r| {
            Ok(StoredQuarantine {
                id: r.get(0),
                received_at: r.get(2),
                quarantined: Quarantined {
                    channel: channel(r.get(1))?,
                    reason: r.get(3),
                    raw: r.get(4),
                },
            })
        })
        .collect()
}

pub(super) async fn submit_chat(
    pool: &PgPool,
    s: &ChatSubmission,
    marks: &Marks,
) -> Result<Submitted> {
    let key = message_key(&s.session_id, s.message_id.as_deref().unwrap_or(&s.job_id));
    let mut tx = pool.begin().await.map_err(unavailable)?;
    // One session's submissions take turns, so its count and its insert are one step.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('sabi.chat.' || $1))")
        .bind(&s.session_id)
        .execute(&mut *tx)
        .await
        .map_err(unavailable)?;
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
            .await
            .map_err(unavailable)?;
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
        .await
        .map_err(unavailable)?;
        return Ok(Submitted::TooFast {
            retry_after: session_retry_after(freeing, s.now),
        });
    }
    // New questions take turns (after their session's lock, always in that order) so the
    // queue's count and the insert are one step.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('sabi.chat-queue'))")
        .execute(&mut *tx)
        .await
        .map_err(unavailable)?;
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
    let delivery = Ingest {
        items: vec![item],
        quarantined: Vec::new(),
        received_at: s.now,
        policy: s.policy,
        // Web chat has slots of its own, not the routine lane.
        routine: Default::default(),
        pair_spacing: std::time::Duration::ZERO,
    };
    let erased = marks.key_hash(delivery.items[0].channel, &delivery.items[0].dedupe_key);
    let receipt = ingest_in(
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
        .await
        .map_err(unavailable)?;
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
    .await
    .map_err(unavailable)?;
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
    tx.commit().await.map_err(unavailable)?;
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
    .await
    .map_err(unavailable)?;
    Ok(found.and_then(|(state, batch)| Some((ReviewState::parse(&state)?, batch))))
}

/// What people wrote to the session after `after`, and whether one holds it now.
pub(super) async fn chat_feed(
    pool: &PgPool,
    session_id: &str,
    after: i64,
    max: usize,
) -> Result<ChatFeed> {
    let mut conn = pool.acquire().await.map_err(unavailable)?;
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
    .await
    .map_err(unavailable)?;
    // Held exactly when the visitor's next message would go to a person: by the latest item.
    let latest: Option<String> = sqlx::query_scalar(
        "SELECT r.state FROM conversations c JOIN batches b ON b.conversation_id = c.id
         JOIN review r ON r.batch_id = b.id
         WHERE c.channel = 'webchat' AND c.customer = $1
         ORDER BY r.id DESC LIMIT 1",
    )
    .bind(session_id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(unavailable)?;
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
        .map_err(unavailable)
}

pub(super) async fn job_for_message(
    pool: &PgPool,
    session_id: &str,
    message_id: &str,
) -> Result<Option<String>> {
    let mut conn = pool.acquire().await.map_err(unavailable)?;
    job_for_key(&mut conn, &message_key(session_id, message_id)).await
}

pub(super) async fn chat_job(pool: &PgPool, job_id: &str, now: At) -> Result<Option<ChatJob>> {
    let row = sqlx::query(
        "SELECT j.session_id, j.created_at, j.expires_at, i.state, i.batch_id, i.seq
         FROM chat_jobs j JOIN inbox i ON i.seq = j.inbox_seq WHERE j.job_id = $1",
    )
    .bind(job_id)
    .fetch_optional(pool)
    .await
    .map_err(unavailable)?;
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
    let answer = match (status, batch) {
        (JobStatus::Finished, Some(batch)) => answer_of(pool, batch).await?,
        _ => None,
    };
    let stage = match (status, batch) {
        (JobStatus::Started, Some(batch)) => {
            sqlx::query_scalar::<_, Option<String>>("SELECT stage FROM batches WHERE id = $1")
                .bind(batch)
                .fetch_optional(pool)
                .await
                .map_err(unavailable)?
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
    .await
    .map_err(unavailable)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

async fn answer_of(pool: &PgPool, batch: i64) -> Result<Option<String>> {
    let parts: Vec<String> =
        sqlx::query_scalar("SELECT body FROM outbox WHERE batch_id = $1 ORDER BY part")
            .bind(batch)
            .fetch_all(pool)
            .await
            .map_err(unavailable)?;
    Ok((!parts.is_empty()).then(|| parts.join("\n\n")))
}

/// The verified user the session is bound to, if any.
pub(super) async fn chat_owner(pool: &PgPool, session_id: &str) -> Result<Option<String>> {
    owner(pool, session_id).await
}

async fn owner<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    session_id: &str,
) -> Result<Option<String>> {
    sqlx::query_scalar("SELECT user_id FROM chat_owners WHERE session_id = $1")
        .bind(session_id)
        .fetch_optional(executor)
        .await
        .map_err(unavailable)
}

pub(super) async fn chat_history(
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
    .await
    .map_err(unavailable)?;
    let mut exchanges = Vec::with_capacity(rows.len());
    for row in rows.iter().rev() {
        let status = status_of(row.get(2));
        let batch: Option<i64> = row.get(3);
        let answer = match (status, batch) {
            (JobStatus::Finished, Some(batch)) => answer_of(pool, batch).await?,
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
    .await
    .map_err(unavailable)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

async fn session_recent(conn: &mut PgConnection, session_id: &str, since: At) -> Result<u64> {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM chat_jobs WHERE session_id = $1 AND created_at >= $2",
    )
    .bind(session_id)
    .bind(since)
    .fetch_one(&mut *conn)
    .await
    .map_err(unavailable)?;
    Ok(u64::try_from(n).unwrap_or(0))
}
