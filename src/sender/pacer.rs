//! Pacing per business number: requests leave one interval apart, so no second sees more than
//! the configured rate. Meta counts on its side, after network jitter, so the interval keeps a
//! small margin below the rate. A throttling answer holds the whole number back.
//!
//! The pacing is per process: nodes that share a number share its rate by configuration
//! (give each node its part of the 80/s).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The share of the configured rate actually used: requests that leave evenly spaced can
/// arrive bunched by a few milliseconds.
const HEADROOM: f64 = 0.95;

pub(crate) struct Pacer {
    interval: Duration,
    next: Mutex<HashMap<String, Instant>>,
}

impl Pacer {
    pub(crate) fn new(per_second: u32) -> Pacer {
        Pacer {
            interval: Duration::from_secs_f64(1.0 / (f64::from(per_second.max(1)) * HEADROOM)),
            next: Mutex::new(HashMap::new()),
        }
    }

    /// Waits for the number's next slot; how long it waited.
    pub(crate) async fn acquire(&self, number: &str) -> Duration {
        let now = Instant::now();
        let slot = {
            let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
            let entry = next.entry(number.to_owned()).or_insert(now);
            let slot = (*entry).max(now);
            *entry = slot + self.interval;
            slot
        };
        tokio::time::sleep_until(slot).await;
        slot - now
    }

    /// Takes the number's slot only if it is free now: for what is best effort (the typing
    /// indicator), which must neither wait for the rate nor delay the replies behind it.
    pub(crate) fn try_acquire(&self, number: &str) -> bool {
        let now = Instant::now();
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let entry = next.entry(number.to_owned()).or_insert(now);
        if *entry > now {
            return false;
        }
        *entry = now + self.interval;
        true
    }

    /// Numbers whose next slot is more than `horizon` away: held back by a throttling answer.
    pub(crate) fn held(&self, horizon: Duration) -> Vec<String> {
        let limit = Instant::now() + horizon;
        let next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        next.iter()
            .filter(|(_, slot)| **slot > limit)
            .map(|(number, _)| number.clone())
            .collect()
    }

    /// No request from `number` before `wait` from now.
    pub(crate) fn hold(&self, number: &str, wait: Duration) {
        let until = Instant::now() + wait;
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let entry = next.entry(number.to_owned()).or_insert(until);
        *entry = (*entry).max(until);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn slots_are_one_interval_apart_per_number() {
        let pacer = Pacer::new(10);
        let start = Instant::now();
        for _ in 0..5 {
            pacer.acquire("a").await;
        }
        let elapsed = start.elapsed();
        // Four intervals of 1/9.5 s.
        assert!(elapsed >= Duration::from_millis(420), "{elapsed:?}");
        let other = Instant::now();
        pacer.acquire("b").await;
        assert_eq!(other.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn best_effort_takes_only_a_free_slot_and_never_waits() {
        let pacer = Pacer::new(10);
        assert!(pacer.try_acquire("a"), "a free number");
        assert!(!pacer.try_acquire("a"), "its next slot is an interval away");
        pacer.acquire("b").await;
        pacer.hold("b", Duration::from_secs(5));
        assert!(!pacer.try_acquire("b"), "held back");
        tokio::time::advance(Duration::from_millis(120)).await;
        assert!(pacer.try_acquire("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_delays_the_next_slot() {
        let pacer = Pacer::new(1000);
        pacer.hold("a", Duration::from_secs(2));
        assert_eq!(pacer.held(Duration::from_secs(1)), vec!["a".to_owned()]);
        let waited = pacer.acquire("a").await;
        assert!(waited >= Duration::from_secs(2));
    }
}
