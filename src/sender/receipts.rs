//! Read receipts that are never dropped: every answered message is marked read.
//!
//! A turn's typing indicator marks its latest message read when the number has a free slot
//! that instant (see [`super::Typing`]); otherwise the message waits here. Per conversation only
//! the latest waits (marking it read marks the earlier ones too), so a saturated number owes at
//! most one receipt per customer. Receipts wait behind replies: one takes a slot at once when the
//! number has one free, and while replies keep the number busy, at most one slot in
//! [`SHARE`] joins the line, so replies keep nine tenths of the Graph calls and the receipts
//! still drain. The queue is this node's: a crash loses the receipts it held, never a reply.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::Sender;
use crate::clock::At;
use crate::metrics::Metrics;

/// While replies keep a number busy, a receipt takes at most one slot in this many.
const SHARE: u32 = 10;

/// A conversation whose latest answered message waits to be marked read.
type Conversation = (String, String);

#[derive(Default)]
pub(crate) struct Receipts {
    waiting: Mutex<Waiting>,
    added: Notify,
}

#[derive(Default)]
struct Waiting {
    /// Per business number, its customers in the order they first waited, each once. Each
    /// number drains on its own: one held back by Meta never keeps another's receipts waiting.
    order: HashMap<String, VecDeque<String>>,
    /// The message to mark read, per waiting conversation.
    latest: HashMap<Conversation, String>,
    /// Per number: when a receipt may next take a slot in line behind replies.
    next_in_line: HashMap<String, At>,
    /// The numbers whose receipts are being sent.
    draining: HashSet<String>,
}

impl Waiting {
    fn count(&self, sender: &Sender) {
        let left = i64::try_from(self.latest.len()).unwrap_or(i64::MAX);
        sender.metrics.receipts_waiting.set(left);
    }

    fn forget(&mut self, (business, customer): &Conversation) {
        if let Some(line) = self.order.get_mut(business) {
            line.retain(|c| c != customer);
        }
    }
}

impl Receipts {
    /// `message_id` (from `customer` to `business`) is to be marked read; it stands for every
    /// earlier message of the conversation still waiting.
    pub(crate) fn owe(&self, sender: &Sender, business: &str, customer: &str, message_id: &str) {
        let key = (business.to_owned(), customer.to_owned());
        let mut waiting = lock(&self.waiting);
        match waiting.latest.insert(key, message_id.to_owned()) {
            Some(_) => count(sender, "coalesced"),
            None => waiting
                .order
                .entry(business.to_owned())
                .or_default()
                .push_back(customer.to_owned()),
        }
        waiting.count(sender);
        drop(waiting);
        self.added.notify_one();
    }

    /// The conversation was just marked read up to its latest message: nothing waits for it.
    pub(crate) fn paid(&self, sender: &Sender, business: &str, customer: &str) {
        let key = (business.to_owned(), customer.to_owned());
        let mut waiting = lock(&self.waiting);
        if waiting.latest.remove(&key).is_some() {
            waiting.forget(&key);
            count(sender, "coalesced");
            waiting.count(sender);
        }
    }

    /// Sends waiting receipts until `shutdown`: a drain per number that has some.
    pub(crate) async fn run(&self, sender: Arc<Sender>, shutdown: CancellationToken) {
        loop {
            for number in self.undrained() {
                tokio::spawn(drain(sender.clone(), number, shutdown.clone()));
            }
            tokio::select! {
                () = self.added.notified() => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// Numbers with receipts waiting and nobody sending them, now marked as being drained.
    fn undrained(&self) -> Vec<String> {
        let mut waiting = lock(&self.waiting);
        let Waiting {
            order, draining, ..
        } = &mut *waiting;
        let numbers: Vec<String> = order
            .iter()
            .filter(|(number, line)| !line.is_empty() && !draining.contains(*number))
            .map(|(number, _)| number.clone())
            .collect();
        draining.extend(numbers.iter().cloned());
        numbers
    }

    /// The next customer of `number` whose receipt waits; none left ends the drain.
    fn next_of(&self, number: &str) -> Option<String> {
        let mut waiting = lock(&self.waiting);
        let next = waiting.order.get(number).and_then(|l| l.front().cloned());
        if next.is_none() {
            waiting.order.remove(number);
            waiting.draining.remove(number);
        }
        next
    }

    /// Takes a slot for the conversation's number as the share allows, then marks its latest
    /// message read.
    async fn send(&self, sender: &Sender, conversation: Conversation) {
        let business = conversation.0.clone();
        if !sender.pacer().try_acquire(&business) {
            let clock = sender.clock();
            let in_line = lock(&self.waiting)
                .next_in_line
                .get(&business)
                .copied()
                .unwrap_or_default();
            if clock.now() < in_line {
                // Wait for a free slot or the receipts' turn in line, whichever comes first.
                let tick = clock.now() + sender.pacer().interval();
                clock.sleep_until(tick.min(in_line)).await;
                return;
            }
            sender.pacer().acquire(&business).await;
            let share = sender.pacer().interval() * SHARE;
            lock(&self.waiting)
                .next_in_line
                .insert(business.clone(), clock.now() + share);
        }
        let message_id = {
            let mut waiting = lock(&self.waiting);
            let Some(id) = waiting.latest.remove(&conversation) else {
                return; // paid by a typing indicator meanwhile
            };
            waiting.forget(&conversation);
            waiting.count(sender);
            id
        };
        match sender
            .graph()
            .mark_read(&business, &message_id, false)
            .await
        {
            Ok(()) => count(sender, "sent"),
            Err(e) => {
                count(sender, "failed");
                tracing::warn!(error.message = %e, "could not mark a message read");
            }
        }
    }
}

/// Sends `number`'s waiting receipts, oldest first, until none is left or `shutdown`.
async fn drain(sender: Arc<Sender>, number: String, shutdown: CancellationToken) {
    let receipts = sender.receipts();
    while let Some(customer) = receipts.next_of(&number) {
        tokio::select! {
            () = receipts.send(&sender, (number.clone(), customer)) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

fn count(sender: &Sender, result: &str) {
    Metrics::count(&sender.metrics.receipts, result);
}

fn lock(waiting: &Mutex<Waiting>) -> std::sync::MutexGuard<'_, Waiting> {
    waiting.lock().unwrap_or_else(|p| p.into_inner())
}
