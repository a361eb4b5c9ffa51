//! Deliveries into the SQLite store, and reading them back: an item is inserted once (its
//! unique key refuses a redelivery), a message schedules its conversation, a status reconciles
//! the outbox, a customer's edit or deletion changes a message still waiting. Everything runs
//! in the group-commit writer, so a delivery is one transaction.

use rusqlite::{Connection, OptionalExtension, params};

use crate::clock::{At, millis};
use crate::domain::{BatchPolicy, Channel, ConversationKey, InboundItem, ItemKind, Quarantined};
use crate::store::items::{Amendment, Encoded, amendment, quarantine_hash, sent_at};
use crate::store::rules::batch::BatchState;
use crate::store::rules::broadcast::{self};
use crate::store::rules::category::{self};
use crate::store::rules::consent::{self};
use crate::store::rules::identity;
use crate::store::rules::item::{ItemState, arrived};
use crate::store::rules::price::{self, Priced};
use crate::store::rules::review::{self};
use crate::store::{
    InboxQuery, Ingest, IngestReceipt, PriceCount, Result, StoredItem, StoredQuarantine,
};

use super::{broadcasts, categories, decode, execute, limit_param, outbox, unavailable};

/// `erased` holds each item's key as erasure keeps it.
pub(super) fn ingest(
    conn: &Connection,
    delivery: &Ingest,
    encoded: &[Encoded],
    erased: &[String],
) -> Result<IngestReceipt> {
    let mut receipt = IngestReceipt::default();
    for ((item, Encoded { facts, hash }), key_hash) in
        delivery.items.iter().zip(encoded).zip(erased)
    {
        match existing_hash(conn, item)? {
            Some(stored) if stored == *hash => receipt.duplicates += 1,
            Some(_) => {
                receipt.anomalies += 1;
                tracing::warn!(
                    channel = item.channel.as_str(),
                    key = %item.dedupe_key,
                    "anomaly: a redelivered id carries other content; the first copy is kept"
                );
            }
            // A retry of an item erased since: known, and nothing to keep.
            None if was_erased(conn, key_hash)? => receipt.duplicates += 1,
            None => {
                let rekeyed = identify(conn, item, delivery.received_at)?;
                // Broadcasts went to the number Meta names, the key or not.
                let named = item.customer.as_ref();
                let item = rekeyed.as_ref().unwrap_or(item);
                let conversation = match &item.turn {
                    Some(key) => {
                        let sent_at = sent_at(item, delivery.received_at);
                        let model = !delivery.routine.contains(&item.dedupe_key);
                        let times = (delivery.received_at, sent_at);
                        let (id, due) = schedule(conn, key, times, delivery.policy, model)?;
                        receipt.earliest_due =
                            Some(receipt.earliest_due.map_or(due, |d| d.min(due)));
                        Some(id)
                    }
                    None => None,
                };
                insert_item(conn, item, facts, hash, conversation, delivery.received_at)?;
                if item.kind == ItemKind::Status {
                    reconcile_status(conn, item, delivery)?;
                }
                if let Some(priced) = price::of(item) {
                    keep_price(conn, &priced, delivery.received_at, &mut receipt)?;
                }
                if item.kind == ItemKind::Echo {
                    person_replied(conn, item, delivery)?;
                }
                for (customer, choice) in consent::preferences(item) {
                    broadcasts::choose(conn, &customer, &choice)?;
                }
                if let Some(news) = broadcast::template_news(item) {
                    broadcasts::hear_template(conn, &news)?;
                }
                if let Some(news) = category::news(item, delivery.received_at) {
                    categories::keep(conn, &news)?;
                }
                if let (ItemKind::Message, Channel::Whatsapp, Some(customer)) =
                    (item.kind, item.channel, named)
                {
                    broadcasts::note_reply(conn, customer, delivery.received_at)?;
                }
                if let Some(change) = amendment(item) {
                    amend(conn, item.channel, &change)?;
                }
                receipt.stored += 1;
            }
        }
    }
    for q in &delivery.quarantined {
        let hash = quarantine_hash(q);
        let inserted = conn
            .prepare_cached(
                "INSERT INTO quarantine (channel, received_at, reason, raw, hash) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (channel, hash) DO NOTHING",
            )
            .and_then(|mut s| s.execute(params![q.channel.as_str(), delivery.received_at, q.reason, q.raw, hash]))
            .map_err(unavailable)?;
        receipt.quarantined += inserted;
    }
    Ok(receipt)
}

/// `item` under its customer's key when that is not the id it names them by: every id a
/// WhatsApp item names its customer by is linked to the key first ([`identity`]).
fn identify(conn: &Connection, item: &InboundItem, now: At) -> Result<Option<InboundItem>> {
    if item.channel != Channel::Whatsapp {
        return Ok(None);
    }
    let ids = identity::ids(item);
    let linked = linked(conn, item.channel, &ids)?;
    let Some(key) = identity::key(&ids, &linked) else {
        return Ok(None);
    };
    let unlinked = match identity::links(item.kind) {
        true => identity::unlinked(&ids, &linked, &key),
        false => Vec::new(),
    };
    for id in unlinked {
        execute(
            conn,
            "INSERT INTO customer_ids (channel, alias, customer, linked_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (channel, alias) DO UPDATE SET customer = excluded.customer,
                 linked_at = excluded.linked_at",
            params![item.channel.as_str(), id, key, now],
        )?;
    }
    Ok(identity::rekeyed(item, &key))
}

/// The links kept for any of `ids`: each id and the key it is linked to.
pub(super) fn linked(
    conn: &Connection,
    channel: Channel,
    ids: &[String],
) -> Result<Vec<(String, String)>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    // One statement for any number of ids: the ids as a JSON list.
    let ids = serde_json::to_string(ids).unwrap_or_default();
    conn.prepare_cached(
        "SELECT alias, customer FROM customer_ids
         WHERE channel = ?1 AND alias IN (SELECT value FROM json_each(?2))",
    )
    .and_then(|mut s| {
        s.query_map(params![channel.as_str(), ids], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect()
    })
    .map_err(unavailable)
}

/// Keeps what a status says its message costs: a message priced for the first time is counted
/// in this hour, a later status updates what it says.
fn keep_price(
    conn: &Connection,
    priced: &Priced,
    now: At,
    receipt: &mut IngestReceipt,
) -> Result<()> {
    let Priced {
        key,
        prefix,
        category,
        kind,
        billed,
    } = priced;
    let new = conn
        .prepare_cached(
            "INSERT INTO prices (key, hour, prefix, category, type, billed) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (key) DO NOTHING",
        )
        .and_then(|mut s| s.execute(params![key, price::hour(now), prefix, category, kind, billed]))
        .map_err(unavailable)?
        == 1;
    if new {
        receipt.priced.push((category.clone(), kind.clone()));
    } else {
        execute(
            conn,
            "UPDATE prices SET prefix = ?2, category = ?3, type = ?4, billed = ?5 WHERE key = ?1",
            params![key, prefix, category, kind, billed],
        )?;
    }
    Ok(())
}

pub(super) fn price_counts(conn: &Connection, since: At) -> Result<Vec<PriceCount>> {
    conn.prepare_cached(
        "SELECT category, prefix, billed, count(*) FROM prices WHERE hour >= ?1
         GROUP BY category, prefix, billed ORDER BY category, prefix, billed",
    )
    .and_then(|mut s| {
        s.query_map(params![price::hour(since)], |r| {
            Ok(PriceCount {
                category: r.get(0)?,
                prefix: r.get(1)?,
                billed: r.get(2)?,
                messages: r.get(3)?,
            })
        })?
        .collect()
    })
    .map_err(unavailable)
}

fn existing_hash(conn: &Connection, item: &InboundItem) -> Result<Option<Vec<u8>>> {
    conn.prepare_cached("SELECT content_hash FROM inbox WHERE channel = ?1 AND dedupe_key = ?2")
        .and_then(|mut s| {
            s.query_row(params![item.channel.as_str(), item.dedupe_key], |row| {
                row.get(0)
            })
            .optional()
        })
        .map_err(unavailable)
}

fn was_erased(conn: &Connection, key_hash: &str) -> Result<bool> {
    conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM erased_keys WHERE key_hash = ?1)")
        .and_then(|mut s| s.query_row(params![key_hash], |row| row.get(0)))
        .map_err(unavailable)
}

/// Adds a pending message to its conversation: due one window after the latest message, but
/// never later than the cap after the first pending one. The customer's latest message time
/// (`sent_at`) opens the 24-hour customer service window. A message for the `model` puts the
/// conversation in the model's lane until a batch takes it.
fn schedule(
    conn: &Connection,
    key: &ConversationKey,
    (now, sent_at): (At, At),
    policy: BatchPolicy,
    model: bool,
) -> Result<(i64, At)> {
    conn.prepare_cached(
        "INSERT INTO conversations (channel, business, customer, first_pending_at, last_pending_at, due_at, last_inbound_at,
                                    model_pending)
         VALUES (?1, ?2, ?3, ?4, ?4, ?4 + min(?5, ?6), ?7, ?8)
         ON CONFLICT (channel, business, customer) DO UPDATE SET
             first_pending_at = coalesce(first_pending_at, excluded.first_pending_at),
             last_pending_at = excluded.last_pending_at,
             due_at = min(excluded.last_pending_at + ?5,
                          coalesce(first_pending_at, excluded.first_pending_at) + ?6),
             last_inbound_at = max(coalesce(last_inbound_at, 0), excluded.last_inbound_at),
             model_pending = max(model_pending, excluded.model_pending)
         RETURNING id, due_at",
    )
    .and_then(|mut s| {
        s.query_row(
            params![key.channel.as_str(), key.business, key.customer, now, millis(policy.window), millis(policy.cap), sent_at, model],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
    })
    .map_err(unavailable)
}

/// A person's reply from the WhatsApp Business app (an echo): it holds the conversation
/// ([`review::person_holds`]), and takes its place in the conversation's history as the
/// business's word, in a batch of its own that a person answered.
fn person_replied(conn: &Connection, item: &InboundItem, delivery: &Ingest) -> Result<()> {
    let (Some(business), Some(customer)) = (&item.business, &item.customer) else {
        return Ok(());
    };
    let at = sent_at(item, delivery.received_at);
    let until = review::held_after_reply(at, delivery.human_hold);
    let conversation: i64 = conn
        .prepare_cached(
            "INSERT INTO conversations (channel, business, customer, held_until) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (channel, business, customer) DO UPDATE SET
                 held_until = max(coalesce(held_until, 0), excluded.held_until)
             RETURNING id",
        )
        .and_then(|mut s| {
            s.query_row(
                params![item.channel.as_str(), business, customer, until],
                |r| r.get(0),
            )
        })
        .map_err(unavailable)?;
    let batch: i64 = conn
        .prepare_cached(&format!(
            "INSERT INTO batches (conversation_id, state, token, attempts, due_at, created_at, started_at,
                                  finished_at)
             VALUES (?1, '{by_person}', 0, 0, ?2, ?3, ?2, ?3) RETURNING id",
            by_person = BatchState::Review,
        ))
        .and_then(|mut s| {
            s.query_row(params![conversation, at, delivery.received_at], |r| {
                r.get(0)
            })
        })
        .map_err(unavailable)?;
    execute(
        conn,
        "UPDATE inbox SET conversation_id = ?3, batch_id = ?4 WHERE channel = ?1 AND dedupe_key = ?2",
        params![item.channel.as_str(), item.dedupe_key, conversation, batch],
    )
}

/// Applies a customer's deletion or edit to the message it names while that still waits for
/// its turn (see [`Amendment`]).
fn amend(conn: &Connection, channel: Channel, change: &Amendment<'_>) -> Result<()> {
    let original = change.original();
    if let Some(text) = change.text() {
        return execute(
            conn,
            &format!(
                "UPDATE inbox SET text = ?3
                 WHERE channel = ?1 AND dedupe_key = ?2 AND state = '{pending}'",
                pending = ItemState::Pending,
            ),
            params![channel.as_str(), original, text],
        );
    }
    let conversation: Option<i64> = conn
        .prepare_cached(&format!(
            "UPDATE inbox SET state = '{withdrawn}'
             WHERE channel = ?1 AND dedupe_key = ?2 AND state = '{pending}'
             RETURNING conversation_id",
            withdrawn = ItemState::Withdrawn,
            pending = ItemState::Pending,
        ))
        .and_then(|mut s| {
            s.query_row(params![channel.as_str(), original], |r| r.get(0))
                .optional()
        })
        .map_err(unavailable)?;
    match conversation {
        Some(conversation) => execute(
            conn,
            &format!(
                "UPDATE conversations SET first_pending_at = NULL, last_pending_at = NULL,
                        due_at = NULL, model_pending = 0
                 WHERE id = ?1
                   AND NOT EXISTS (SELECT 1 FROM inbox WHERE conversation_id = ?1 AND state = '{pending}')",
                pending = ItemState::Pending,
            ),
            params![conversation],
        ),
        None => Ok(()),
    }
}

/// A status of a message Sabi sent settles its outbox row, in the same transaction.
fn reconcile_status(conn: &Connection, item: &InboundItem, delivery: &Ingest) -> Result<()> {
    let now = delivery.received_at;
    let facts = &item.facts;
    let (Some(wamid), Some(status)) = (facts["id"].as_str(), facts["status"].as_str()) else {
        return Ok(());
    };
    let update = outbox::StatusUpdate {
        wamid,
        status,
        callback: facts["biz_opaque_callback_data"].as_str(),
        error_code: facts["error_codes"]
            .get(0)
            .and_then(serde_json::Value::as_i64),
        spacing: delivery.pair_spacing,
    };
    outbox::reconcile(conn, update, now)?;
    match crate::store::items::broadcast_status(item) {
        Some(found) => broadcasts::reconcile(conn, found, now),
        None => Ok(()),
    }
}

fn insert_item(
    conn: &Connection,
    item: &InboundItem,
    facts: &str,
    hash: &[u8],
    conversation: Option<i64>,
    received_at: At,
) -> Result<()> {
    let state = arrived(item.kind, conversation.is_some());
    conn.prepare_cached(
        "INSERT INTO inbox (channel, dedupe_key, kind, business, customer, item_type, text, media_id,
                            provider_ts, received_at, state, conversation_id, content_hash, facts)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
    )
    .and_then(|mut s| {
        s.execute(params![
            item.channel.as_str(),
            item.dedupe_key,
            item.kind.as_str(),
            item.business,
            item.customer,
            item.item_type,
            item.text,
            item.media_id,
            item.provider_ts,
            received_at,
            state,
            conversation,
            hash,
            facts,
        ])
    })
    .map_err(unavailable)?;
    Ok(())
}

pub(super) fn inbox(conn: &Connection, query: &InboxQuery) -> Result<Vec<StoredItem>> {
    let limit = limit_param(query.limit.unwrap_or(usize::MAX));
    let sql = format!(
        "SELECT {ITEM_COLUMNS} FROM inbox
         WHERE seq > ?1 AND (?2 IS NULL OR kind = ?2) AND (?3 IS NULL OR channel = ?3)
         ORDER BY seq LIMIT ?4"
    );
    let params = params![
        query.after.unwrap_or(0),
        query.kind.map(ItemKind::as_str),
        query.channel.map(Channel::as_str),
        limit
    ];
    stored_items(conn, &sql, params)
}

/// What [`stored_items`] reads of each inbox row.
pub(super) const ITEM_COLUMNS: &str =
    "seq, channel, dedupe_key, kind, business, customer, item_type, text,
    media_id, provider_ts, received_at, state, batch_id, facts";

/// The inbox rows `sql` selects ([`ITEM_COLUMNS`]), as stored.
pub(super) fn stored_items(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<StoredItem>> {
    let mut stmt = conn.prepare_cached(sql).map_err(unavailable)?;
    let rows = stmt
        .query_map(params, |row| {
            let item = StoredItem {
                seq: row.get(0)?,
                item: InboundItem {
                    channel: row.get(1)?,
                    dedupe_key: row.get(2)?,
                    kind: row.get(3)?,
                    business: row.get(4)?,
                    customer: row.get(5)?,
                    item_type: row.get(6)?,
                    text: row.get(7)?,
                    media_id: row.get(8)?,
                    provider_ts: row.get(9)?,
                    turn: None,
                    facts: serde_json::Value::Null,
                },
                received_at: row.get(10)?,
                state: row.get(11)?,
                batch: row.get(12)?,
            };
            Ok((item, row.get::<_, String>(13)?))
        })
        .map_err(unavailable)?;
    let mut items = Vec::new();
    for row in rows {
        let (mut item, facts) = row.map_err(unavailable)?;
        item.item.facts = decode(&facts)?;
        items.push(item);
    }
    Ok(items)
}

pub(super) fn quarantine(conn: &Connection, limit: Option<usize>) -> Result<Vec<StoredQuarantine>> {
    let limit = limit_param(limit.unwrap_or(usize::MAX));
    let mut stmt = conn
        .prepare_cached(
            "SELECT id, channel, received_at, reason, raw FROM quarantine ORDER BY id LIMIT ?1",
        )
        .map_err(unavailable)?;
    let rows = stmt
        .query_map(params![limit], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, Channel>(1)?,
                row.get::<_, At>(2)?,
                row.get::<_, String>(3)?,
                row.get::<_, String>(4)?,
            ))
        })
        .map_err(unavailable)?;
    let mut out = Vec::new();
    for row in rows {
        let (id, channel, received_at, reason, raw) = row.map_err(unavailable)?;
        out.push(StoredQuarantine {
            id,
            received_at,
            quarantined: Quarantined {
                channel,
                reason,
                raw,
            },
        });
    }
    Ok(out)
}
