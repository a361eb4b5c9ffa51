//! One-message deliveries that arrive together, stored together.
//!
//! Under load nearly every delivery is one customer message, and each was a call and a commit
//! of its own: PostgreSQL's time went to starting, planning and committing statements more
//! than to the rows. Callers hand their message to the gatherer; one task takes everything
//! waiting whenever one of its slots is free and stores it with one call of
//! `sabi_ingest_messages_v1` (functions.sql), one statement per step for the whole group. A
//! message that finds nothing waiting beside it takes the one-message call, so an idle store
//! answers as soon as before. When the server refuses a group for what a message holds, each
//! of its messages is stored alone: one bad message fails no other.

use std::collections::{HashSet, VecDeque};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};

use super::message::{Message, store_message, store_messages};
use crate::clock::At;
use crate::store::{Error, Result};

/// The most one call carries, in bytes of its messages' fields (about). A larger request
/// leaves in more than one write when the socket's send buffer is still small, and sqlx does
/// not set TCP_NODELAY: the second part then waits for the server's delayed ACK, about 40 ms on
/// Linux. Groups of 85 of the bench's messages took 50 ms a call over TCP and 7 ms over a Unix
/// socket; within this budget they take 2 to 5 ms over either.
const GROUP_BYTES: usize = 12 * 1024;
/// The most messages taken from the queue at a time, to pick groups from.
const HELD: usize = 512;
/// Groups stored at once: one runs while the other's commit is flushed.
const SLOTS: usize = 2;

/// Where callers hand their messages; the task behind it ends when the store is dropped.
pub(super) struct Gatherer {
    queue: mpsc::UnboundedSender<Waiting>,
}

struct Waiting {
    message: Message,
    /// The conversation's due time once stored; `None` when it was already stored or erased.
    reply: oneshot::Sender<Result<Option<At>>>,
}

impl Gatherer {
    /// Starts the task that stores the groups, on the current runtime.
    pub(super) fn start(pool: PgPool) -> Gatherer {
        let (queue, waiting) = mpsc::unbounded_channel();
        tokio::spawn(gather(pool, waiting));
        Gatherer { queue }
    }

    /// Stores `message` with whatever else is waiting: its conversation's due time, or `None`
    /// when it was already stored or was erased since.
    pub(super) async fn store(&self, pool: &PgPool, message: Message) -> Result<Option<At>> {
        let (reply, answer) = oneshot::channel();
        if let Err(mpsc::error::SendError(alone)) = self.queue.send(Waiting { message, reply }) {
            // The runtime that ran the task is gone (a store moved to another runtime).
            return store_message(pool, &alone.message, None).await;
        }
        answer.await.unwrap_or_else(|_| {
            Err(Error::Unavailable(
                "the store's intake stopped before it answered".to_owned(),
            ))
        })
    }
}

/// Runs up to [`SLOTS`] groups at once, inside this task. A message whose id or conversation
/// is in a running group waits for that group to end: a customer's messages are stored in the
/// order they arrived, each group committed before the next of theirs starts.
async fn gather(pool: PgPool, mut waiting: mpsc::UnboundedReceiver<Waiting>) {
    let mut running = FuturesUnordered::new();
    let mut held = VecDeque::new();
    let mut busy: HashSet<String> = HashSet::new();
    let mut closed = false;
    loop {
        while held.len() < HELD {
            let Ok(next) = waiting.try_recv() else { break };
            held.push_back(next);
        }
        while running.len() < SLOTS {
            let group = take_group(&mut held, &busy);
            if group.is_empty() {
                break;
            }
            let names: Vec<String> = group.iter().flat_map(|w| w.message.names()).collect();
            busy.extend(names.iter().cloned());
            let pool = pool.clone();
            running.push(async move {
                store_group(&pool, group).await;
                names
            });
        }
        if closed && running.is_empty() && held.is_empty() {
            return;
        }
        tokio::select! {
            Some(names) = running.next(), if !running.is_empty() => {
                for name in names {
                    busy.remove(&name);
                }
            }
            next = waiting.recv(), if !closed && running.len() < SLOTS => match next {
                Some(next) => held.push_back(next),
                None => closed = true,
            },
        }
    }
}

/// The next group from `held`, in arrival order, within [`GROUP_BYTES`]: no two of its
/// messages share an id or a conversation, nor with a group still running (`busy`): what one
/// links could change whom the other is from, and a conversation's messages keep their order.
/// All share a window and a cap. The others wait for a later group, in their order; a message
/// that waits holds back the later messages of its customer.
fn take_group(held: &mut VecDeque<Waiting>, busy: &HashSet<String>) -> Vec<Waiting> {
    let mut group: Vec<Waiting> = Vec::new();
    let mut taken: HashSet<String> = busy.clone();
    let mut bytes = 0;
    let mut later = VecDeque::new();
    while let Some(next) = held.pop_front() {
        let size = next.message.size();
        let names = next.message.names();
        let fits = (group.is_empty() || bytes + size <= GROUP_BYTES)
            && group.first().is_none_or(|first| {
                (first.message.window, first.message.cap) == (next.message.window, next.message.cap)
            })
            && names.iter().all(|name| !taken.contains(name));
        taken.extend(names);
        if fits {
            bytes += size;
            group.push(next);
        } else {
            later.push_back(next);
        }
    }
    *held = later;
    group
}

async fn store_group(pool: &PgPool, mut group: Vec<Waiting>) {
    if group.len() == 1 {
        let alone = group.remove(0);
        let outcome = store_message(pool, &alone.message, None).await;
        let _ = alone.reply.send(outcome);
        return;
    }
    let messages: Vec<&Message> = group.iter().map(|w| &w.message).collect();
    // A caller that gave up is not told.
    match store_messages(pool, &messages).await {
        Ok(dues) => {
            for (waiting, due) in group.into_iter().zip(dues) {
                let _ = waiting.reply.send(Ok(due));
            }
        }
        Err(e) if refused(&e) => {
            tracing::debug!(error = %e, messages = group.len(), "the server refused a group; storing each alone");
            for waiting in group {
                let outcome = store_message(pool, &waiting.message, None).await;
                let _ = waiting.reply.send(outcome);
            }
        }
        // The server away, a timeout or a deadlock: every caller hears it at once, and each
        // runs again as any store call does (a deadlock) or answers 503 (an outage), rather
        // than wait while the group is tried one message at a time.
        Err(e) => {
            let why = match Error::from(e) {
                Error::Unavailable(why) => why,
                other => other.to_string(),
            };
            for waiting in group {
                let _ = waiting.reply.send(Err(Error::Unavailable(why.clone())));
            }
        }
    }
}

/// Whether the server refused what a message holds (a data exception or a broken constraint,
/// SQLSTATE classes 22 and 23): only that message's delivery should fail.
fn refused(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code.starts_with("22") || code.starts_with("23"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::domain::{BatchPolicy, Channel, ConversationKey, InboundItem, ItemKind};
    use crate::store::Ingest;
    use crate::store::items::Encoded;

    fn waiting(key: &str, customer: &str, text: &str) -> Waiting {
        let conversation = ConversationKey {
            channel: Channel::Whatsapp,
            business: "1000".into(),
            customer: customer.into(),
        };
        let item = InboundItem {
            kind: ItemKind::Message,
            channel: Channel::Whatsapp,
            dedupe_key: key.into(),
            business: Some("1000".into()),
            customer: Some(customer.into()),
            item_type: Some("text".into()),
            text: Some(text.into()),
            media_id: None,
            provider_ts: None,
            turn: Some(conversation.clone()),
            facts: serde_json::json!({}),
        };
        let delivery = Ingest {
            items: Vec::new(),
            quarantined: Vec::new(),
            received_at: At::from_millis(0),
            policy: BatchPolicy {
                window: Duration::from_secs(5),
                cap: Duration::from_secs(20),
            },
            routine: Default::default(),
            pair_spacing: Duration::ZERO,
            human_hold: Duration::ZERO,
        };
        let encoded = Encoded::of(&item);
        let message = Message::of(&delivery, &item, &conversation, &encoded, "hash");
        Waiting {
            message,
            reply: oneshot::channel().0,
        }
    }

    fn keys(group: &[Waiting]) -> Vec<&str> {
        group.iter().map(|w| w.message.key()).collect()
    }

    #[test]
    fn a_message_left_for_later_holds_back_its_customers_next_ones() {
        let long = "x".repeat(GROUP_BYTES);
        let mut held: VecDeque<Waiting> = [
            waiting("w.1", "2348000000001", "hi"),
            waiting("w.2", "2348000000002", &long),
            waiting("w.3", "2348000000002", "and this"),
            waiting("w.4", "2348000000001", "again"),
            waiting("w.5", "2348000000003", "hello"),
        ]
        .into();
        let mut groups = Vec::new();
        while !held.is_empty() {
            groups.push(keys(&take_group(&mut held, &HashSet::new())).join(" "));
        }
        // w.2 is too long to join w.1; w.3 waits behind it, w.4 behind w.1; w.2 goes alone.
        assert_eq!(groups, ["w.1 w.5", "w.2", "w.3 w.4"]);
    }

    #[test]
    fn a_message_waits_while_a_group_of_its_customer_runs() {
        let mut held: VecDeque<Waiting> = [
            waiting("w.1", "2348000000001", "hi"),
            waiting("w.2", "2348000000002", "hello"),
        ]
        .into();
        let running = waiting("w.0", "2348000000001", "earlier").message.names();
        let busy: HashSet<String> = running.into_iter().collect();
        assert_eq!(keys(&take_group(&mut held, &busy)), ["w.2"]);
        assert_eq!(keys(&take_group(&mut held, &HashSet::new())), ["w.1"]);
    }
}
