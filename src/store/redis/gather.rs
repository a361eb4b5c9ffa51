//! Deliveries that arrive together, stored in one run of the script.
//!
//! Every run of the script defines its whole library anew and decodes and encodes JSON around
//! the operation: for a one-message delivery, the common webhook, that was much of the time
//! Redis spent on it, on the one thread Redis runs scripts on. Callers hand their delivery to
//! the gatherer; one task takes everything waiting whenever one of its slots is free and runs
//! `ingest_many`, which stores each delivery as `ingest` would alone, in arrival order, and
//! answers each with its own receipt or its own error. A delivery that finds nothing waiting
//! beside it runs `ingest` itself, so an idle store answers as soon as before.

use std::sync::Arc;

use serde::Deserialize;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::script::{Caller, reset};
use super::wire::Receipt;
use crate::store::{Error, Result};

/// The most one run carries, in bytes of its deliveries' JSON: a run holds Redis's only
/// script thread, so a group is kept to what takes a few milliseconds.
const GROUP_BYTES: usize = 64 * 1024;
/// Runs at once: one is decoded and queued while Redis runs the other.
const SLOTS: usize = 2;

/// Where callers hand their deliveries; the task behind it ends when the store is dropped.
pub(super) struct Gatherer {
    queue: mpsc::UnboundedSender<Waiting>,
}

struct Waiting {
    /// The delivery as `ingest` takes it, JSON.
    delivery: String,
    reply: oneshot::Sender<Result<Receipt>>,
}

/// One delivery's outcome in `ingest_many`'s reply.
#[derive(Deserialize)]
struct Answer {
    ok: Option<Receipt>,
    err: Option<String>,
}

impl Gatherer {
    /// Starts the task that runs the groups, on the current runtime.
    pub(super) fn start(caller: Caller) -> Gatherer {
        let (queue, waiting) = mpsc::unbounded_channel();
        tokio::spawn(gather(caller, waiting));
        Gatherer { queue }
    }

    /// Stores `delivery` (the JSON `ingest` takes) with whatever else is waiting.
    pub(super) async fn store(&self, caller: &Caller, delivery: String) -> Result<Receipt> {
        let (reply, answer) = oneshot::channel();
        if let Err(mpsc::error::SendError(alone)) = self.queue.send(Waiting { delivery, reply }) {
            // The runtime that ran the task is gone (a store moved to another runtime).
            return caller.call("ingest", &alone.delivery).await;
        }
        answer.await.unwrap_or_else(|_| {
            Err(Error::Unavailable(
                "the store's intake stopped before it answered".to_owned(),
            ))
        })
    }
}

async fn gather(caller: Caller, mut waiting: mpsc::UnboundedReceiver<Waiting>) {
    let slots = Arc::new(Semaphore::new(SLOTS));
    let mut next = None;
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let first = match next.take() {
            Some(first) => first,
            None => match waiting.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let mut bytes = first.delivery.len();
        let mut group = vec![first];
        while let Ok(more) = waiting.try_recv() {
            if bytes + more.delivery.len() > GROUP_BYTES {
                next = Some(more);
                break;
            }
            bytes += more.delivery.len();
            group.push(more);
        }
        let caller = caller.clone();
        tokio::spawn(async move {
            run_group(&caller, group).await;
            drop(slot);
        });
    }
}

async fn run_group(caller: &Caller, mut group: Vec<Waiting>) {
    if group.len() == 1 {
        let alone = group.remove(0);
        let outcome = caller.call("ingest", &alone.delivery).await;
        let _ = alone.reply.send(outcome);
        return;
    }
    let mut args =
        String::with_capacity(group.iter().map(|w| w.delivery.len() + 1).sum::<usize>() + 16);
    args.push_str("{\"deliveries\":[");
    for (i, waiting) in group.iter().enumerate() {
        if i > 0 {
            args.push(',');
        }
        args.push_str(&waiting.delivery);
    }
    args.push_str("]}");
    // A caller that gave up is not told.
    match caller.call::<Vec<Answer>>("ingest_many", &args).await {
        Ok(answers) if answers.len() == group.len() => {
            for (waiting, answer) in group.into_iter().zip(answers) {
                let _ = waiting.reply.send(outcome(answer));
            }
        }
        Ok(answers) => {
            let why = format!(
                "ingest_many answered {} deliveries of {}",
                answers.len(),
                group.len()
            );
            for waiting in group {
                let _ = waiting.reply.send(Err(Error::Schema(why.clone())));
            }
        }
        // The server away or the store reset: every caller hears it at once.
        Err(e) => {
            let why = e.to_string();
            let reset = matches!(e, Error::Schema(_));
            for waiting in group {
                let error = if reset {
                    Error::Schema(why.clone())
                } else {
                    Error::Unavailable(why.clone())
                };
                let _ = waiting.reply.send(Err(error));
            }
        }
    }
}

/// One delivery's receipt, or the error its own run raised.
fn outcome(answer: Answer) -> Result<Receipt> {
    match (answer.ok, answer.err) {
        (Some(receipt), _) => Ok(receipt),
        (None, Some(why)) if why.starts_with("SABI_RESET") => Err(reset()),
        (None, why) => {
            Err(Error::Unavailable(why.unwrap_or_else(|| {
                "ingest_many answered neither".to_owned()
            })))
        }
    }
}
