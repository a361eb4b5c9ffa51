//! A model provider's budget: calls at once, requests and tokens per minute, and one pause that
//! every call shares when the provider answers 429.
//!
//! Under a surge the budget, not the number of turns a node runs, bounds what reaches the
//! model: turns mostly wait on I/O, so a node runs many and their model calls queue here. Calls
//! leave evenly spaced within the per-minute limits (a request every `60 s / rpm`; a call's
//! estimated tokens hold the next one back by `tokens · 60 s / tpm`, corrected by the tokens
//! it really used). A 429 pauses the provider for every turn together, for its `Retry-After`,
//! instead of each turn retrying alone and keeping the provider throttled.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::clock::{At, SharedClock};

/// How much of a provider Sabi may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Calls in flight at once.
    pub concurrent: usize,
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u32>,
}

const MINUTE: Duration = Duration::from_secs(60);

pub struct Budget {
    clock: SharedClock,
    limits: Limits,
    calls: Arc<Semaphore>,
    /// Calls sent and not yet answered: those holding a slot but still waiting for their time
    /// are not counted.
    sent: Arc<AtomicUsize>,
    ledger: Mutex<Ledger>,
}

/// When the next request and the next token may go, and until when the provider is paused.
#[derive(Debug, Default)]
struct Ledger {
    next_request: At,
    next_tokens: At,
    paused_until: At,
}

/// A call's place in the budget: held while it is in flight.
pub struct Ticket {
    _permit: OwnedSemaphorePermit,
    sent: Arc<AtomicUsize>,
    /// The tokens it reserved.
    pub estimate: u32,
    /// How long it waited for the budget.
    pub waited: Duration,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.sent.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Budget {
    pub fn new(limits: Limits, clock: SharedClock) -> Budget {
        Budget {
            clock,
            calls: Arc::new(Semaphore::new(limits.concurrent.max(1))),
            sent: Arc::default(),
            limits,
            ledger: Mutex::new(Ledger::default()),
        }
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a call's turn: a free call slot, the next request and token times, and the
    /// end of any pause; `estimate` tokens are reserved.
    pub async fn acquire(&self, estimate: u32) -> Ticket {
        let asked = self.clock.now();
        let permit = self
            .calls
            .clone()
            .acquire_owned()
            .await
            .unwrap_or_else(|_| unreachable!("the budget's semaphore is never closed"));
        // A 429 may come while a call waits for its time: it then takes a new one, spaced
        // from the pause's end with everyone else's.
        loop {
            let slot = self.reserve(estimate);
            self.clock.sleep_until(slot).await;
            if self.ledger().paused_until <= self.clock.now() {
                break;
            }
        }
        self.sent.fetch_add(1, Ordering::Relaxed);
        Ticket {
            _permit: permit,
            sent: self.sent.clone(),
            estimate,
            waited: self.clock.now().since(asked),
        }
    }

    /// The next time a call may leave, taken for one of `estimate` tokens.
    fn reserve(&self, estimate: u32) -> At {
        let mut ledger = self.ledger();
        let slot = self
            .clock
            .now()
            .max(ledger.next_request)
            .max(ledger.next_tokens)
            .max(ledger.paused_until);
        if let Some(rpm) = self.limits.requests_per_minute {
            ledger.next_request = slot + MINUTE / rpm.max(1);
        }
        if let Some(tpm) = self.limits.tokens_per_minute {
            ledger.next_tokens = slot + tokens_span(estimate, tpm);
        }
        slot
    }

    /// The tokens a call really used: the next call's time moves by the difference.
    pub fn settle(&self, ticket: &Ticket, used: u32) {
        let Some(tpm) = self.limits.tokens_per_minute else {
            return;
        };
        let mut ledger = self.ledger();
        if used > ticket.estimate {
            ledger.next_tokens = ledger.next_tokens + tokens_span(used - ticket.estimate, tpm);
        } else {
            ledger.next_tokens = ledger.next_tokens - tokens_span(ticket.estimate - used, tpm);
        }
    }

    /// The provider said 429: no call of this budget leaves before `wait` has passed.
    pub fn pause(&self, wait: Duration) {
        let until = self.clock.now() + wait;
        let mut ledger = self.ledger();
        ledger.paused_until = ledger.paused_until.max(until);
        // Calls after the pause are spaced from its end, not sent all at once.
        ledger.next_request = ledger.next_request.max(until);
        ledger.next_tokens = ledger.next_tokens.max(until);
    }

    /// Whether the provider is paused now.
    pub fn paused(&self) -> bool {
        self.ledger().paused_until > self.clock.now()
    }

    /// Calls in flight now: sent, not yet answered.
    pub fn in_flight(&self) -> usize {
        self.sent.load(Ordering::Relaxed)
    }
}

/// The time one turn spent waiting for model budgets, so far and now: queue time its turn
/// timeout does not count.
pub struct Waits {
    clock: SharedClock,
    done_ms: AtomicI64,
    /// When the wait under way began (milliseconds); 0: none.
    since_ms: AtomicI64,
}

impl Waits {
    pub fn new(clock: SharedClock) -> Waits {
        Waits {
            clock,
            done_ms: AtomicI64::new(0),
            since_ms: AtomicI64::new(0),
        }
    }

    pub(crate) fn begin(&self) {
        self.since_ms
            .store(self.clock.now().millis(), Ordering::Relaxed);
    }

    pub(crate) fn end(&self) {
        let since = self.since_ms.swap(0, Ordering::Relaxed);
        if since > 0 {
            let waited = self.clock.now().millis().saturating_sub(since);
            self.done_ms.fetch_add(waited, Ordering::Relaxed);
        }
    }

    /// Every wait so far, the one under way included.
    pub fn total(&self) -> Duration {
        let since = self.since_ms.load(Ordering::Relaxed);
        let now = match since {
            0 => 0,
            since => self.clock.now().millis().saturating_sub(since),
        };
        let ms = self.done_ms.load(Ordering::Relaxed).saturating_add(now);
        Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    }
}

/// How long `tokens` take of a budget of `tpm` tokens a minute.
fn tokens_span(tokens: u32, tpm: u32) -> Duration {
    MINUTE.mul_f64(f64::from(tokens) / f64::from(tpm.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};

    fn budget(limits: Limits) -> (Arc<Budget>, Arc<ManualClock>) {
        let clock = ManualClock::new(At::from_millis(1_000_000));
        (Arc::new(Budget::new(limits, clock.clone())), clock)
    }

    /// `n` calls asking for the budget at once: each tells how long it waited.
    fn acquiring(budget: &Arc<Budget>, n: usize) -> Vec<tokio::task::JoinHandle<Duration>> {
        (0..n)
            .map(|_| {
                let budget = budget.clone();
                tokio::spawn(async move { budget.acquire(1).await.waited })
            })
            .collect()
    }

    const OPEN: Limits = Limits {
        concurrent: 2,
        requests_per_minute: None,
        tokens_per_minute: None,
    };

    #[tokio::test]
    async fn no_more_calls_than_allowed_are_in_flight() {
        let (budget, _) = budget(OPEN);
        let first = budget.acquire(10).await;
        let _second = budget.acquire(10).await;
        assert_eq!(budget.in_flight(), 2);
        let third = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire(10).await.estimate }
        });
        tokio::task::yield_now().await;
        assert!(!third.is_finished(), "waits for a free call");
        drop(first);
        assert_eq!(third.await.expect("ran"), 10);
    }

    #[tokio::test]
    async fn a_call_waiting_for_its_time_is_not_in_flight() {
        let (budget, clock) = budget(Limits {
            concurrent: 4,
            requests_per_minute: Some(60),
            tokens_per_minute: None,
        });
        let first = budget.acquire(10).await;
        let second = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire(10).await.estimate }
        });
        tokio::task::yield_now().await;
        assert_eq!(
            budget.in_flight(),
            1,
            "the second waits a second for its time"
        );
        clock.advance(Duration::from_secs(1));
        assert_eq!(second.await.expect("ran"), 10);
        drop(first);
        assert_eq!(budget.in_flight(), 0, "answered calls are not in flight");
    }

    #[tokio::test]
    async fn requests_and_tokens_are_spaced_within_the_minute() {
        let (budget, clock) = budget(Limits {
            concurrent: 10,
            requests_per_minute: Some(60),
            tokens_per_minute: Some(6_000),
        });
        let start = clock.now();
        let first = budget.acquire(100).await;
        assert_eq!(first.waited, Duration::ZERO);
        // 100 tokens of 6,000 a minute hold the next call a second, as 60 requests a minute do;
        // the first used 400, so the next waits four seconds.
        budget.settle(&first, 400);
        let next = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire(100).await.waited }
        });
        tokio::task::yield_now().await;
        clock.advance(Duration::from_secs(3));
        tokio::task::yield_now().await;
        assert!(!next.is_finished(), "not before the tokens allow");
        clock.advance(Duration::from_secs(1));
        assert_eq!(next.await.expect("ran"), Duration::from_secs(4));
        assert_eq!(clock.now().since(start), Duration::from_secs(4));
    }

    #[tokio::test]
    async fn calls_after_a_pause_leave_spaced_not_at_once() {
        let (budget, clock) = budget(Limits {
            concurrent: 4,
            requests_per_minute: Some(60),
            tokens_per_minute: None,
        });
        budget.pause(Duration::from_secs(5));
        let start = clock.now();
        let waiting = acquiring(&budget, 2);
        tokio::task::yield_now().await;
        clock.advance(Duration::from_secs(5));
        tokio::task::yield_now().await;
        clock.advance(Duration::from_secs(1));
        let mut waits = Vec::new();
        for w in waiting {
            waits.push(w.await.expect("ran"));
        }
        waits.sort();
        assert_eq!(waits, [Duration::from_secs(5), Duration::from_secs(6)]);
        assert_eq!(clock.now().since(start), Duration::from_secs(6));
    }

    #[tokio::test]
    async fn a_429_pauses_every_call_together() {
        let (budget, clock) = budget(OPEN);
        budget.pause(Duration::from_secs(5));
        assert!(budget.paused());
        let waiting = acquiring(&budget, 2);
        tokio::task::yield_now().await;
        clock.advance(Duration::from_secs(4));
        tokio::task::yield_now().await;
        assert!(waiting.iter().all(|w| !w.is_finished()), "all wait");
        clock.advance(Duration::from_secs(1));
        for w in waiting {
            assert_eq!(w.await.expect("ran"), Duration::from_secs(5));
        }
        assert!(!budget.paused());
    }
}
