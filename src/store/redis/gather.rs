//! Deliveries that arrive together, stored in one run of the script.
//!
//! Every run of the script defines its whole library anew and decodes and encodes JSON around
//! the operation: for a one-message delivery, the common webhook, that was much of the time
//! Redis spent on it, on the one thread Redis runs scripts on. Callers hand their delivery to
//! the gatherer; one task takes everything waiting whenever one of its slots is free and runs
//! `ingest_many`, which stores each delivery as `ingest` would alone, in arrival order, and
//! answers each with its own receipt or its own error. A delivery that finds nothing waiting
//! beside it runs `ingest` itself, so an idle store answers as soon as before.

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::script::{Caller, refusal};
use super::wire::Receipt;
use crate::store::{Error, Result};

/// The most one run carries, in bytes of its deliveries' JSON: a run holds Redis's only
/// script thread, so a group is kept to what takes a few milliseconds. (Redis checks
/// `maxmemory` before a run's first write only: a group may pass it by this much.)
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

/// Runs up to [`SLOTS`] groups at once, inside this task: a group's call is first polled, so
/// sent on the shared connection, in the order its group was taken, and a customer's
/// deliveries reach Redis in the order they arrived.
async fn gather(caller: Caller, mut waiting: mpsc::UnboundedReceiver<Waiting>) {
    let mut running = FuturesUnordered::new();
    let mut next: Option<Waiting> = None;
    let mut closed = false;
    loop {
        while running.len() < SLOTS {
            let first = match next.take() {
                Some(first) => first,
                None => match waiting.try_recv() {
                    Ok(first) => first,
                    Err(_) => break,
                },
            };
            let group = take_group(first, &mut waiting, &mut next);
            running.push(run_group(&caller, group));
        }
        if closed && running.is_empty() {
            return;
        }
        tokio::select! {
            Some(()) = running.next(), if !running.is_empty() => {}
            more = waiting.recv(), if !closed && next.is_none() && running.len() < SLOTS => {
                match more {
                    Some(more) => next = Some(more),
                    None => closed = true,
                }
            }
        }
    }
}

/// `first` and whatever else is waiting, in arrival order, within [`GROUP_BYTES`]; the first
/// delivery that does not fit waits in `next` for the following group.
fn take_group(
    first: Waiting,
    waiting: &mut mpsc::UnboundedReceiver<Waiting>,
    next: &mut Option<Waiting>,
) -> Vec<Waiting> {
    let mut bytes = first.delivery.len();
    let mut group = vec![first];
    while let Ok(more) = waiting.try_recv() {
        if bytes + more.delivery.len() > GROUP_BYTES {
            *next = Some(more);
            break;
        }
        bytes += more.delivery.len();
        group.push(more);
    }
    group
}

async fn run_group(caller: &Caller, mut group: Vec<Waiting>) {
    if group.len() == 1 {
        let alone = group.remove(0);
        let outcome = caller.call("ingest", &alone.delivery).await;
        let _ = alone.reply.send(outcome);
        return;
    }
    let mut args = String::from("{\"deliveries\":[");
    for (i, waiting) in group.iter().enumerate() {
        if i > 0 {
            args.push(',');
        }
        args.push_str(&waiting.delivery);
    }
    args.push_str("]}");
    // A caller that gave up is not told.
    match caller.call::<Vec<Value>>("ingest_many", &args).await {
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
            for waiting in group {
                let _ = waiting.reply.send(Err(e.clone()));
            }
        }
    }
}

/// One delivery's answer in `ingest_many`'s reply: its receipt, or the error its run raised
/// or the refusal it returned, read as the one-delivery call reads them.
fn outcome(answer: Value) -> Result<Receipt> {
    if let Some(why) = answer.get("err").and_then(Value::as_str) {
        return Err(refusal(why));
    }
    let receipt = answer.get("ok").cloned().unwrap_or_default();
    serde_json::from_value(receipt)
        .map_err(|e| Error::Schema(format!("undecodable receipt in ingest_many: {e}")))
}
