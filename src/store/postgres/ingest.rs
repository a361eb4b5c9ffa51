//! Deliveries into the PostgreSQL store, and reading them back.
//!
//! An item is inserted first (`ON CONFLICT DO NOTHING`): a concurrent copy of the same item
//! waits on the unique index and then finds it there, so only the first copy schedules its
//! conversation. An item erased since is known by its key's hash, looked for after the insert
//! (functions.sql), so an erasure committing meanwhile is seen too.

use crate::clock::At;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};

use super::gather::Gatherer;
use super::message::{Message, store_message, whatsapp_ids};
use super::{broadcasts, categories, channel, limit, outbox};
use crate::domain::{Channel, InboundItem, ItemKind, Quarantined};
use crate::store::items::known;
use crate::store::items::{Amendment, Encoded, amendment, quarantine_hash, sent_at};
use crate::store::rules::batch::BatchState;
use crate::store::rules::erasure::Marks;
use crate::store::rules::item::{ItemState, arrived};
use crate::store::rules::price::{self, Priced};
use crate::store::rules::{broadcast, category, consent, identity, review};
use crate::store::{
    Error, InboxQuery, Ingest, IngestReceipt, PriceCount, Result, StoredItem, StoredQuarantine,
};

pub(super) async fn ingest(
    pool: &PgPool,
    gatherer: &Gatherer,
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
            let message = Message::of(delivery, item, key, encoded, erased);
            return ingest_message(pool, gatherer, message, item, &encoded.hash).await;
        }
    }
    let mut tx = pool.begin().await?;
    let receipt = ingest_in(&mut tx, delivery, &encoded, &erased).await?;
    tx.commit().await?;
    Ok(receipt)
}

/// The common delivery, one customer message that wakes its conversation: stored with the
/// others waiting beside it (gather.rs), in one round trip that commits on its own.
async fn ingest_message(
    pool: &PgPool,
    gatherer: &Gatherer,
    message: Message,
    item: &InboundItem,
    hash: &[u8],
) -> Result<IngestReceipt> {
    let mut receipt = IngestReceipt::default();
    match gatherer.store(pool, message).await? {
        Some(due) => {
            receipt.stored = 1;
            receipt.earliest_due = Some(due);
        }
        None => {
            let mut conn = pool.acquire().await?;
            count_redelivery(&mut conn, item, hash, &mut receipt).await?;
        }
    }
    Ok(receipt)
}

pub(super) async fn ingest_in(
    conn: &mut PgConnection,
    delivery: &Ingest,
    encoded: &[Encoded],
    erased: &[String],
) -> Result<IngestReceipt> {
    let mut receipt = IngestReceipt::default();
    let mut priced = Vec::new();
    let order = lock_order(&delivery.items);
    let seqs = arrival_seqs(conn, &order).await?;
    for index in order {
        let (item, Encoded { facts, hash }) = (&delivery.items[index], &encoded[index]);
        let seq = seqs.as_ref().map(|seqs| seqs[index]);
        if let (ItemKind::Message, Some(key)) = (item.kind, &item.turn) {
            let message = Message::of(delivery, item, key, &encoded[index], &erased[index]);
            match store_message(&mut *conn, &message, seq).await? {
                Some(due) => {
                    receipt.stored += 1;
                    receipt.earliest_due = Some(receipt.earliest_due.map_or(due, |d| d.min(due)));
                }
                None => count_redelivery(conn, item, hash, &mut receipt).await?,
            }
            continue;
        }
        let rekeyed = identify(conn, item, delivery.received_at).await?;
        // Broadcasts went to the number Meta names, the key or not.
        let named = item.customer.as_ref();
        let item = rekeyed.as_ref().unwrap_or(item);
        let state = arrived(item.kind, false).as_str();
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
        .await?;
        if seq.is_none() {
            count_redelivery(conn, item, hash, &mut receipt).await?;
            continue;
        }
        receipt.stored += 1;
        if item.kind == ItemKind::Echo {
            person_replied(conn, item, delivery).await?;
        }
        if item.kind == ItemKind::Status {
            outbox::reconcile_status(conn, item, delivery.received_at, delivery.pair_spacing)
                .await?;
            broadcasts::reconcile_status(conn, item, delivery.received_at).await?;
            priced.extend(price::of(item));
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
            (item.kind, item.channel, named)
        {
            broadcasts::note_reply(conn, customer, delivery.received_at).await?;
        }
        if let Some(change) = amendment(item) {
            amend(conn, item.channel, &change).await?;
        }
    }
    // Last and in key order: two deliveries pricing the same messages take their rows'
    // locks in one order, and wait rather than deadlock.
    priced.sort_by(|a, b| a.key.cmp(&b.key));
    for p in &priced {
        if keep_price(conn, p, delivery.received_at).await? {
            receipt.priced.push((p.category.clone(), p.kind.clone()));
        }
    }
    for q in &delivery.quarantined {
        receipt.quarantined += keep_quarantined(conn, q, delivery.received_at).await?;
    }
    Ok(receipt)
}

/// Keeps what a status says its message costs: `true` when the message is priced for the
/// first time (counted in this hour); a later status updates what it says. Concurrent statuses
/// of one message wait on its row, so only one finds it new.
async fn keep_price(conn: &mut PgConnection, priced: &Priced, now: At) -> Result<bool> {
    let new: bool = sqlx::query_scalar(
        "INSERT INTO prices (key, hour, prefix, category, type, billed) VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (key) DO UPDATE SET prefix = excluded.prefix, category = excluded.category,
             type = excluded.type, billed = excluded.billed
         RETURNING xmax = 0",
    )
    .bind(&priced.key)
    .bind(price::hour(now))
    .bind(&priced.prefix)
    .bind(&priced.category)
    .bind(&priced.kind)
    .bind(priced.billed)
    .fetch_one(&mut *conn)
    .await?;
    Ok(new)
}

pub(super) async fn price_counts(pool: &PgPool, since: At) -> Result<Vec<PriceCount>> {
    let rows: Vec<(String, String, bool, i64)> = sqlx::query_as(
        "SELECT category, prefix, billed, count(*) FROM prices WHERE hour >= $1
         GROUP BY category, prefix, billed ORDER BY category, prefix, billed",
    )
    .bind(price::hour(since))
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(category, prefix, billed, messages)| PriceCount {
            category,
            prefix,
            billed,
            messages: u64::try_from(messages).unwrap_or_default(),
        })
        .collect())
}

/// `item` under its customer's key when that is not the id it names them by, every id it names
/// linked to the key (`sabi_identify_v2`, functions.sql).
async fn identify(
    conn: &mut PgConnection,
    item: &InboundItem,
    now: At,
) -> Result<Option<InboundItem>> {
    let ids = whatsapp_ids(item);
    if ids.is_empty() {
        return Ok(None);
    }
    let key: Option<String> = sqlx::query_scalar("SELECT sabi_identify_v2($1, $2, $3, $4)")
        .bind(item.channel.as_str())
        .bind(&ids)
        .bind(now)
        .bind(identity::links(item.kind))
        .fetch_one(&mut *conn)
        .await?;
    Ok(key.and_then(|key| identity::rekeyed(item, &key)))
}

/// A person's reply from the WhatsApp Business app (an echo): it holds the conversation
/// ([`review::person_holds`]), and takes its place in the conversation's history as the
/// business's word, in a batch of its own that a person answered.
async fn person_replied(
    conn: &mut PgConnection,
    item: &InboundItem,
    delivery: &Ingest,
) -> Result<()> {
    let (Some(business), Some(customer)) = (&item.business, &item.customer) else {
        return Ok(());
    };
    let at = sent_at(item, delivery.received_at);
    let until = review::held_after_reply(at, delivery.human_hold);
    let conversation: i64 = sqlx::query_scalar(
        "INSERT INTO conversations (channel, business, customer, held_until) VALUES ($1, $2, $3, $4)
         ON CONFLICT (channel, business, customer) DO UPDATE SET
             held_until = GREATEST(COALESCE(conversations.held_until, 0), excluded.held_until)
         RETURNING id",
    )
    .bind(item.channel.as_str())
    .bind(business)
    .bind(customer)
    .bind(until)
    .fetch_one(&mut *conn)
    .await?;
    let batch: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "INSERT INTO batches (conversation_id, state, token, attempts, due_at, created_at, started_at,
                              finished_at)
         VALUES ($1, '{by_person}', 0, 0, $2, $3, $2, $3) RETURNING id",
        by_person = BatchState::Review,
    )))
    .bind(conversation)
    .bind(at)
    .bind(delivery.received_at)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE inbox SET conversation_id = $3, batch_id = $4 WHERE channel = $1 AND dedupe_key = $2",
    )
    .bind(item.channel.as_str())
    .bind(&item.dedupe_key)
    .bind(conversation)
    .bind(batch)
    .execute(&mut *conn)
    .await?;
    Ok(())
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
    .await?;
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
        .await?;
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
    .await?;
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
        .await?;
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
            .await?;
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
    .await?;
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
    .await?;
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
    .await?;
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
