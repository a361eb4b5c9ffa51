//! A customer message that wakes its conversation, as PostgreSQL's intake functions take it
//! (functions.sql), and the two calls that store such messages: one alone, or many together.

use sqlx::PgPool;

use crate::clock::{At, UnixSeconds, millis};
use crate::domain::{Channel, ConversationKey, InboundItem};
use crate::store::items::{Encoded, sent_at};
use crate::store::rules::identity;
use crate::store::{Ingest, REPLY_SPAN, Result};

/// A customer message that wakes its conversation, as the functions that store it take it.
pub(super) struct Message {
    channel: Channel,
    key: String,
    business: Option<String>,
    customer: Option<String>,
    item_type: Option<String>,
    text: Option<String>,
    media: Option<String>,
    provider_ts: Option<UnixSeconds>,
    received: At,
    hash: Vec<u8>,
    facts: String,
    conversation: ConversationKey,
    sent_at: At,
    reply_since: At,
    /// For the model: not among the messages the router answers alone.
    model: bool,
    /// Its key as erasure keeps it.
    key_hash: String,
    /// The ids WhatsApp names its customer by (phone numbers first).
    ids: Vec<String>,
    /// Its delivery's batch policy, in milliseconds.
    pub(super) window: i64,
    pub(super) cap: i64,
}

impl Message {
    #[cfg(test)]
    pub(super) fn key(&self) -> &str {
        &self.key
    }

    /// What names its customer: each id, and its conversation.
    pub(super) fn names(&self) -> Vec<String> {
        let key = &self.conversation;
        let conversation = format!(
            "{}\n{}\n{}",
            key.channel.as_str(),
            key.business,
            key.customer
        );
        let mut names = self.ids.clone();
        names.push(conversation);
        names
    }

    /// About what the message adds to a call that carries it: its fields' bytes.
    pub(super) fn size(&self) -> usize {
        let texts = [
            &self.business,
            &self.customer,
            &self.item_type,
            &self.text,
            &self.media,
        ];
        let optional: usize = texts
            .iter()
            .map(|t| t.as_ref().map_or(0, String::len))
            .sum();
        let ids: usize = self.ids.iter().map(|id| id.len() + 8).sum();
        let key = &self.conversation;
        let named = key.business.len() + key.customer.len() + self.key.len() + self.key_hash.len();
        // 22 fields, each with a 4-byte length; 6 of them 8-byte numbers.
        optional + ids + named + self.facts.len() + self.hash.len() + 22 * 4 + 6 * 8 + 24
    }

    pub(super) fn of(
        delivery: &Ingest,
        item: &InboundItem,
        key: &ConversationKey,
        Encoded { facts, hash }: &Encoded,
        erased: &str,
    ) -> Message {
        Message {
            channel: item.channel,
            key: item.dedupe_key.clone(),
            business: item.business.clone(),
            customer: item.customer.clone(),
            item_type: item.item_type.clone(),
            text: item.text.clone(),
            media: item.media_id.clone(),
            provider_ts: item.provider_ts,
            received: delivery.received_at,
            hash: hash.clone(),
            facts: facts.clone(),
            conversation: key.clone(),
            sent_at: sent_at(item, delivery.received_at),
            reply_since: delivery.received_at - REPLY_SPAN,
            model: !delivery.routine.contains(&item.dedupe_key),
            key_hash: erased.to_owned(),
            ids: whatsapp_ids(item),
            window: millis(delivery.policy.window),
            cap: millis(delivery.policy.cap),
        }
    }
}

/// Stores a customer message that wakes its conversation and schedules the conversation (due
/// one window after the latest message, never later than the cap after the first), through
/// `sabi_ingest_message_v6` (functions.sql): the message's unique key first, then the
/// conversation's row, so a racing copy waits on the key and schedules nothing. The
/// conversation's due time when the message is new; `None` when it was already stored or was
/// erased since.
pub(super) async fn store_message<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    message: &Message,
    seq: Option<i64>,
) -> Result<Option<At>> {
    let stored: Option<(i64, At)> = sqlx::query_as(
        "SELECT seq, due_at FROM sabi_ingest_message_v6(
             $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
             $19, $20, $21, $22)",
    )
    .bind(message.channel.as_str())
    .bind(&message.key)
    .bind(&message.business)
    .bind(&message.customer)
    .bind(&message.item_type)
    .bind(&message.text)
    .bind(&message.media)
    .bind(message.provider_ts)
    .bind(message.received)
    .bind(&message.hash)
    .bind(&message.facts)
    .bind(message.conversation.channel.as_str())
    .bind(&message.conversation.business)
    .bind(&message.conversation.customer)
    .bind(message.window)
    .bind(message.cap)
    .bind(message.sent_at)
    .bind(seq)
    .bind(message.reply_since)
    .bind(message.model)
    .bind(&message.key_hash)
    .bind(&message.ids)
    .fetch_optional(executor)
    .await?;
    Ok(stored.map(|(_, due)| due))
}

/// Stores many messages that share no id, and one window and cap, as [`store_message`] stores
/// each, in one call of `sabi_ingest_messages_v1` (functions.sql): for each message in the
/// order given, its conversation's due time, or `None` when it was already stored or erased.
/// The driver's error as it came, so the caller can tell a refused message from an outage.
pub(super) async fn store_messages(
    pool: &PgPool,
    messages: &[&Message],
) -> Result<Vec<Option<At>>, sqlx::Error> {
    let column = |f: fn(&Message) -> Option<&str>| -> Vec<Option<&str>> {
        messages.iter().map(|m| f(m)).collect()
    };
    let millis =
        |f: fn(&Message) -> At| -> Vec<i64> { messages.iter().map(|m| f(m).millis()).collect() };
    let (mut id_of, mut ids) = (Vec::new(), Vec::new());
    for (n, m) in messages.iter().enumerate() {
        let n = i32::try_from(n + 1).unwrap_or(i32::MAX);
        id_of.extend(m.ids.iter().map(|_| n));
        ids.extend(m.ids.iter().map(String::as_str));
    }
    let first = messages.first().map_or((0, 0), |m| (m.window, m.cap));
    let rows: Vec<(i32, i64, At)> = sqlx::query_as(
        "SELECT n, seq, due_at FROM sabi_ingest_messages_v1(
             $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
             $19, $20, $21, $22)",
    )
    .bind(column(|m| Some(m.channel.as_str())))
    .bind(column(|m| Some(&m.key)))
    .bind(column(|m| m.business.as_deref()))
    .bind(column(|m| m.customer.as_deref()))
    .bind(column(|m| m.item_type.as_deref()))
    .bind(column(|m| m.text.as_deref()))
    .bind(column(|m| m.media.as_deref()))
    .bind(
        messages
            .iter()
            .map(|m| m.provider_ts.map(|t| t.0))
            .collect::<Vec<_>>(),
    )
    .bind(millis(|m| m.received))
    .bind(
        messages
            .iter()
            .map(|m| m.hash.as_slice())
            .collect::<Vec<_>>(),
    )
    .bind(column(|m| Some(&m.facts)))
    .bind(column(|m| Some(m.conversation.channel.as_str())))
    .bind(column(|m| Some(&m.conversation.business)))
    .bind(column(|m| Some(&m.conversation.customer)))
    .bind(millis(|m| m.sent_at))
    .bind(millis(|m| m.reply_since))
    .bind(messages.iter().map(|m| m.model).collect::<Vec<_>>())
    .bind(column(|m| Some(&m.key_hash)))
    .bind(id_of)
    .bind(ids)
    .bind(first.0)
    .bind(first.1)
    .fetch_all(pool)
    .await?;
    let mut dues = vec![None; messages.len()];
    for (n, _, due) in rows {
        if let Some(slot) = usize::try_from(n - 1).ok().and_then(|n| dues.get_mut(n)) {
            *slot = Some(due);
        }
    }
    Ok(dues)
}

/// The ids a WhatsApp item names its customer by ([`identity::ids`]); none on web chat.
pub(super) fn whatsapp_ids(item: &InboundItem) -> Vec<String> {
    match item.channel {
        Channel::Whatsapp => identity::ids(item),
        Channel::Webchat => Vec::new(),
    }
}
