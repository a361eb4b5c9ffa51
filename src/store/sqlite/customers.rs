//! A customer's data on SQLite: everything about them read in one snapshot, and erasure in
//! one transaction of the single writer. `secure_delete` (set on every connection) zeroes
//! what a delete frees, and [`fold_wal`] then empties the WAL, so no erased word stays in
//! either file.

use rusqlite::{Connection, OptionalExtension, params};

use super::broadcasts::{RECIPIENT_COLUMNS, choice_of, recipient_view};
use super::execute;
use super::ingest::{ITEM_COLUMNS, stored_items};
use super::outbox::entries;
use super::unavailable;
use crate::clock::At;
use crate::domain::{Channel, ItemKind};
use crate::store::rules::batch::BatchState;
use crate::store::rules::broadcast::{RecipientState, SkipReason};
use crate::store::rules::consent::Source;
use crate::store::rules::erasure::{self, Erased, Marks, Subject};
use crate::store::rules::part::PartState;
use crate::store::sql;
use crate::store::{BroadcastSend, CustomerRecord, Error, ExportPage, Result, ReviewRecord};

/// The turns of the subject's conversations, joined as `b` (with `c`, the conversation).
const THEIR_BATCHES: &str = "conversations c JOIN batches b ON b.conversation_id = c.id
    WHERE c.channel = ?1 AND c.customer = ?2";

pub(super) fn export(conn: &Connection, who: &Subject, page: ExportPage) -> Result<CustomerRecord> {
    // One read transaction: the parts agree with each other.
    let snapshot = conn.unchecked_transaction().map_err(unavailable)?;
    let (channel, customer) = (who.channel.as_str(), who.customer.as_str());
    let limit = i64::try_from(page.limit).unwrap_or(i64::MAX);
    let items = stored_items(
        &snapshot,
        &format!(
            "SELECT {ITEM_COLUMNS} FROM inbox WHERE channel = ?1 AND customer = ?2 AND seq > ?3
             ORDER BY seq LIMIT ?4"
        ),
        params![channel, customer, page.items_after, limit],
    )?;
    let replies = entries(
        &snapshot,
        "JOIN conversations c ON c.id = b.conversation_id
         WHERE c.channel = ?1 AND c.customer = ?2 AND o.id > ?3 ORDER BY o.id LIMIT ?4",
        params![channel, customer, page.replies_after, limit],
    )?;
    let reviews = reviews(&snapshot, who)?;
    let (broadcasts, consent) = match who.channel {
        Channel::Whatsapp => (
            broadcasts(&snapshot, customer)?,
            choice_of(&snapshot, customer)?,
        ),
        Channel::Webchat => (Vec::new(), None),
    };
    Ok(CustomerRecord {
        items,
        replies,
        reviews,
        broadcasts,
        consent,
    })
}

fn reviews(conn: &Connection, who: &Subject) -> Result<Vec<ReviewRecord>> {
    conn.prepare_cached(
        "SELECT r.id, r.batch_id, r.reason, r.state, r.error, r.created_at, r.resolved_at,
                r.resolution_note
         FROM review r JOIN batches b ON b.id = r.batch_id
              JOIN conversations c ON c.id = b.conversation_id
         WHERE c.channel = ?1 AND c.customer = ?2 ORDER BY r.id",
    )
    .and_then(|mut s| {
        s.query_map(params![who.channel.as_str(), who.customer], |r| {
            Ok(ReviewRecord {
                id: r.get(0)?,
                batch_id: r.get(1)?,
                reason: r.get(2)?,
                state: r.get(3)?,
                error: r.get(4)?,
                created_at: r.get(5)?,
                resolved_at: r.get(6)?,
                note: r.get(7)?,
            })
        })?
        .collect()
    })
    .map_err(unavailable)
}

fn broadcasts(conn: &Connection, customer: &str) -> Result<Vec<BroadcastSend>> {
    conn.prepare_cached(&format!(
        "SELECT {RECIPIENT_COLUMNS}, b.id, b.name, b.template
         FROM broadcast_recipients r JOIN broadcasts b ON b.id = r.broadcast_id
         WHERE r.recipient = ?1 ORDER BY r.id"
    ))
    .and_then(|mut s| {
        s.query_map(params![customer], |r| {
            Ok(BroadcastSend {
                recipient: recipient_view(r)?,
                broadcast_id: r.get(14)?,
                name: r.get(15)?,
                template: r.get(16)?,
            })
        })?
        .collect()
    })
    .map_err(unavailable)
}

/// Erases the subject (see [`erasure`]): runs inside the writer's transaction, so all of it
/// commits or none.
pub(super) fn forget(conn: &Connection, who: &Subject, now: At, marks: &Marks) -> Result<Erased> {
    if let Some(why) = erasure::busy(turn_running(conn, who)?, send_under_way(conn, who)?) {
        return Err(Error::Busy(why));
    }
    let mut erased = Erased::default();
    let (channel, customer) = (who.channel.as_str(), who.customer.as_str());
    if who.channel == Channel::Webchat {
        // Before the questions they name.
        erased.chat_jobs = count(
            conn,
            "DELETE FROM chat_jobs WHERE session_id = ?1",
            params![customer],
        )?;
        // The session's binding names its user: forgotten with it.
        count(
            conn,
            "DELETE FROM chat_owners WHERE session_id = ?1",
            params![customer],
        )?;
    }
    forget_items(conn, who, now, marks, &mut erased)?;
    keep_status_hashes(conn, who, now, marks)?;
    forget_turns(conn, who, now, &mut erased)?;
    // Theirs only, kept emptied: the same raw part arriving again is still known.
    let mentioning: Vec<(i64, String)> = conn
        .prepare_cached("SELECT id, raw FROM quarantine WHERE channel = ?1 AND instr(raw, ?2) > 0")
        .and_then(|mut s| {
            s.query_map(params![channel, customer], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
        .map_err(unavailable)?;
    for (id, raw) in mentioning {
        if erasure::sent_by(&raw, customer) {
            erased.quarantined += count(
                conn,
                "UPDATE quarantine SET raw = '' WHERE id = ?1",
                params![id],
            )?;
        }
    }
    if who.channel == Channel::Whatsapp {
        forget_broadcasts(conn, who, now, marks, &mut erased)?;
    }
    // The id's links to the customer's others name them too.
    unlink(conn, channel, customer)?;
    Ok(erased)
}

/// Forgets the links of `id` ([`identity`](crate::store::rules::identity)): its own to its
/// key, and every other id's to it.
pub(super) fn unlink(conn: &Connection, channel: &str, id: &str) -> Result<()> {
    execute(
        conn,
        "DELETE FROM customer_ids WHERE channel = ?1 AND (alias = ?2 OR customer = ?2)",
        params![channel, id],
    )
}

/// See [`Customers::linked_ids`](crate::store::Customers::linked_ids).
pub(super) fn linked_ids(conn: &Connection, who: &Subject) -> Result<Vec<String>> {
    let channel = who.channel.as_str();
    let key: String = conn
        .prepare_cached("SELECT customer FROM customer_ids WHERE channel = ?1 AND alias = ?2")
        .and_then(|mut s| {
            s.query_row(params![channel, who.customer], |r| r.get(0))
                .optional()
        })
        .map_err(unavailable)?
        .unwrap_or_else(|| who.customer.clone());
    let others: Vec<String> = conn
        .prepare_cached(
            "SELECT alias FROM customer_ids WHERE channel = ?1 AND customer = ?2 AND alias <> ?2
             ORDER BY alias",
        )
        .and_then(|mut s| s.query_map(params![channel, key], |r| r.get(0))?.collect())
        .map_err(unavailable)?;
    Ok(std::iter::once(key).chain(others).collect())
}

fn turn_running(conn: &Connection, who: &Subject) -> Result<bool> {
    exists(
        conn,
        &format!(
            "SELECT EXISTS (SELECT 1 FROM {THEIR_BATCHES} AND b.state = '{}')",
            BatchState::Running.as_str()
        ),
        params![who.channel.as_str(), who.customer],
    )
}

fn send_under_way(conn: &Connection, who: &Subject) -> Result<bool> {
    let sending = PartState::Sending.as_str();
    let reply = exists(
        conn,
        &format!(
            "SELECT EXISTS (SELECT 1 FROM {THEIR_BATCHES}
                            AND EXISTS (SELECT 1 FROM outbox o
                                        WHERE o.batch_id = b.id AND o.state = '{sending}'))"
        ),
        params![who.channel.as_str(), who.customer],
    )?;
    let broadcast = who.channel == Channel::Whatsapp
        && exists(
            conn,
            &format!(
                "SELECT EXISTS (SELECT 1 FROM broadcast_recipients
                                WHERE recipient = ?1 AND state = '{}')",
                RecipientState::Sending.as_str()
            ),
            params![who.customer],
        )?;
    Ok(reply || broadcast)
}

/// The items naming the subject (theirs, and the account's events that mention them) go;
/// their keys stay as hashes.
fn forget_items(
    conn: &Connection,
    who: &Subject,
    now: At,
    marks: &Marks,
    erased: &mut Erased,
) -> Result<()> {
    let (channel, customer) = (who.channel.as_str(), who.customer.as_str());
    let found: Vec<(i64, String, ItemKind)> = conn
        .prepare_cached(
            "SELECT seq, dedupe_key, kind FROM inbox WHERE channel = ?1 AND customer = ?2
             UNION ALL
             SELECT seq, dedupe_key, kind FROM inbox
             WHERE customer IS NULL AND channel = ?1 AND instr(facts, ?2) > 0",
        )
        .and_then(|mut s| {
            s.query_map(params![channel, customer], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?
            .collect()
        })
        .map_err(unavailable)?;
    for (seq, key, kind) in found {
        drop_item(conn, seq, who.channel, &key, now, marks)?;
        match kind {
            ItemKind::Message => erased.messages += 1,
            _ => erased.statuses += 1,
        }
    }
    Ok(())
}

/// Deletes an item and keeps its key as a hash from `now` (erasure and retention both): a
/// retry of it is a duplicate until the `dedupe` horizon sweeps the hash.
pub(super) fn drop_item(
    conn: &Connection,
    seq: i64,
    channel: Channel,
    key: &str,
    now: At,
    marks: &Marks,
) -> Result<()> {
    execute(
        conn,
        "INSERT OR IGNORE INTO erased_keys (key_hash, erased_at) VALUES (?1, ?2)",
        params![marks.key_hash(channel, key), now],
    )?;
    execute(conn, "DELETE FROM inbox WHERE seq = ?1", params![seq])
}

/// The statuses Meta may still send about the messages to them (replies and broadcasts) are
/// known before they come: a late one is a duplicate, and never stores their number again.
fn keep_status_hashes(conn: &Connection, who: &Subject, now: At, marks: &Marks) -> Result<()> {
    if who.channel != Channel::Whatsapp {
        return Ok(());
    }
    let wamids: Vec<String> = conn
        .prepare_cached(&format!(
            "SELECT wamid FROM outbox
             WHERE wamid IS NOT NULL AND batch_id IN (SELECT b.id FROM {THEIR_BATCHES})
             UNION
             SELECT wamid FROM broadcast_recipients WHERE wamid IS NOT NULL AND recipient = ?2"
        ))
        .and_then(|mut s| {
            s.query_map(params![who.channel.as_str(), who.customer], |r| r.get(0))?
                .collect()
        })
        .map_err(unavailable)?;
    for hash in wamids.iter().flat_map(|w| marks.status_hashes(w)) {
        execute(
            conn,
            "INSERT OR IGNORE INTO erased_keys (key_hash, erased_at) VALUES (?1, ?2)",
            params![hash, now],
        )?;
    }
    Ok(())
}

/// Their conversations keep their turns' counts under a name that is no one's; what the turns
/// said goes, and a turn waiting for a retry ends: its messages are gone. A turn in review
/// stays one (it counts as handed to people), without its review item.
fn forget_turns(conn: &Connection, who: &Subject, now: At, erased: &mut Erased) -> Result<()> {
    let params = params![who.channel.as_str(), who.customer];
    erased.reviews = count(
        conn,
        &format!("DELETE FROM review WHERE batch_id IN (SELECT b.id FROM {THEIR_BATCHES})"),
        params,
    )?;
    erased.replies = count(
        conn,
        &format!("DELETE FROM outbox WHERE batch_id IN (SELECT b.id FROM {THEIR_BATCHES})"),
        params,
    )?;
    let (done, waiting) = (BatchState::Done.as_str(), BatchState::Waiting.as_str());
    execute(
        conn,
        &format!(
            "UPDATE batches SET state = CASE WHEN state = '{waiting}' THEN '{done}' ELSE state END,
                                finished_at = coalesce(finished_at, ?3),
                                last_error = NULL, stage = NULL, next_attempt_at = NULL
             WHERE id IN (SELECT b.id FROM {THEIR_BATCHES})"
        ),
        params![who.channel.as_str(), who.customer, now],
    )?;
    erased.conversations = count(
        conn,
        "UPDATE conversations
         SET customer = 'erased:' || id, first_pending_at = NULL, last_pending_at = NULL,
             due_at = NULL, open_batch_id = NULL, last_inbound_at = NULL, model_pending = 0
         WHERE channel = ?1 AND customer = ?2",
        params,
    )?;
    Ok(())
}

/// Sends not yet made are skipped as an opt-out; every send keeps its counts under the
/// marker; the customer's choice gives way to the marker's standing opt-out.
fn forget_broadcasts(
    conn: &Connection,
    who: &Subject,
    now: At,
    marks: &Marks,
    erased: &mut Erased,
) -> Result<()> {
    let marker = marks.marker(who.channel, &who.customer);
    let unsent = crate::store::rules::sql_list(RecipientState::ALL, RecipientState::as_str, |s| {
        matches!(s, RecipientState::Queued | RecipientState::Held)
    });
    execute(
        conn,
        &format!(
            "UPDATE broadcast_recipients SET state = '{}', skipped = '{}'
             WHERE recipient = ?1 AND state IN {unsent}",
            RecipientState::Skipped.as_str(),
            SkipReason::OptedOut.as_str()
        ),
        params![who.customer],
    )?;
    erased.broadcast_sends = count(
        conn,
        "UPDATE broadcast_recipients
         SET recipient = ?2, params = '[]', tz = NULL, wamid = NULL, error = NULL
         WHERE recipient = ?1",
        params![who.customer, marker],
    )?;
    erased.consents = count(
        conn,
        "DELETE FROM consents WHERE customer = ?1",
        params![who.customer],
    )?;
    execute(
        conn,
        "INSERT INTO consents (customer, opted_out, source, at) VALUES (?1, 1, ?2, ?3)
         ON CONFLICT (customer) DO UPDATE SET opted_out = 1, source = ?2, at = ?3",
        params![marker, Source::Erased.as_str(), now],
    )
}

/// Moves the store's markers and erased keys' hashes under `marks` (see
/// [`Marks::rekey_from`]), within the migration's transaction: the store records which
/// secrets they are under, so this runs once per new secret, on every row at once.
pub(super) fn rekey(conn: &Connection, marks: &Marks) -> Result<()> {
    let recorded: Option<String> = conn
        .query_row("SELECT fingerprint FROM marker_key WHERE id = 1", [], |r| {
            r.get(0)
        })
        .optional()
        .map_err(unavailable)?;
    let rekey = marks
        .rekey_from(recorded.as_deref())
        .map_err(Error::Schema)?;
    if !rekey.is_empty() {
        let mut moved = 0u64;
        for (table, column) in sql::MARKED {
            let names: Vec<String> = conn
                .prepare(&sql::markers_sql(table, column))
                .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
                .map_err(unavailable)?;
            for old in names {
                if let Some(new) = rekey.marker(&old) {
                    moved += count(
                        conn,
                        &format!("UPDATE {table} SET {column} = ?2 WHERE {column} = ?1"),
                        params![old, new],
                    )?;
                }
            }
        }
        let hashes: Vec<String> = conn
            .prepare("SELECT key_hash FROM erased_keys")
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .map_err(unavailable)?;
        for old in &hashes {
            execute(
                conn,
                "UPDATE erased_keys SET key_hash = ?2 WHERE key_hash = ?1",
                params![old, rekey.key_hash(old)],
            )?;
        }
        sql::rekeyed(moved, hashes.len());
    }
    execute(
        conn,
        "INSERT INTO marker_key (id, fingerprint) VALUES (1, ?1)
         ON CONFLICT (id) DO UPDATE SET fingerprint = ?1",
        params![marks.fingerprint()],
    )
}

/// Folds the WAL into the database and empties it: the pages the erasure zeroed replace
/// the old ones, and the WAL's older frames, which still hold the erased words, are gone.
/// Waits (the busy timeout) for readers on older snapshots; when they outlast it the WAL is
/// emptied at a later checkpoint or the store's clean stop, and this says so.
pub(super) fn fold_wal(conn: &Connection) -> Result<()> {
    let busy: i64 = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
        .map_err(unavailable)?;
    if busy != 0 {
        tracing::warn!(
            "the WAL could not be emptied after an erasure (readers held it); \
             it is emptied at a later checkpoint or a clean stop"
        );
    }
    Ok(())
}

fn exists(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<bool> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.query_row(params, |r| r.get(0)))
        .map_err(unavailable)
}

pub(super) fn count(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<u64> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.execute(params))
        .map(|n| n as u64)
        .map_err(unavailable)
}
