//! Pacing per business number: requests leave one interval apart, so no second sees more than
//! the configured rate. Meta counts on its side, after network jitter, so the interval keeps a
//! small margin below the rate. A throttling answer holds the whole number back.
//!
//! The pacing is per process: nodes that share a number share its rate by configuration
//! (give each node its part of the 80/s).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::{At, SharedClock};

/// The share of Meta's rate Sabi uses: a little under it, so clock skew never tips it over.
const HEADROOM: f64 = 0.95;

/// Slots per business number on the injected clock. Slots are kept in microseconds (the clock
/// reads milliseconds) so that a rate of hundreds a second keeps its spacing exactly.
pub(crate) struct Pacer {
    clock: SharedClock,
    interval_us: i64,
    next_us: Mutex<HashMap<String, i64>>,
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

impl Pacer {
    pub(crate) fn new(per_second: u32, clock: SharedClock) -> Pacer {
        let interval = Duration::from_secs_f64(1.0 / (f64::from(per_second.max(1)) * HEADROOM));
        Pacer {
            clock,
            interval_us: micros(interval),
            next_us: Mutex::new(HashMap::new()),
        }
    }

    /// The time between two of a number's slots.
    pub(crate) fn interval(&self) -> Duration {
        Duration::from_micros(u64::try_from(self.interval_us).unwrap_or(0))
    }

    fn now_us(&self) -> i64 {
        self.clock.now().millis().saturating_mul(1000)
    }

    /// Waits for the number's next free slot and takes it; returns how long it waited.
    pub(crate) async fn acquire(&self, number: &str) -> Duration {
        let now = self.now_us();
        let slot = {
            let mut next = self.next_us.lock().unwrap_or_else(|p| p.into_inner());
            let entry = next.entry(number.to_owned()).or_insert(now);
            let slot = (*entry).max(now);
            *entry = slot + self.interval_us;
            slot
        };
        // Woken at the millisecond the slot falls in, never before it.
        let wake = At::from_millis(slot.saturating_add(999) / 1000);
        self.clock.sleep_until(wake).await;
        Duration::from_micros(u64::try_from(slot - now).unwrap_or(0))
    }

    /// Takes the number's slot only if it is free now; never waits.
    pub(crate) fn try_acquire(&self, number: &str) -> bool {
        let now = self.now_us();
        let mut next = self.next_us.lock().unwrap_or_else(|p| p.into_inner());
        let entry = next.entry(number.to_owned()).or_insert(now);
        if *entry > now {
            return false;
        }
        *entry = now + self.interval_us;
        true
    }

    /// Numbers whose next slot is further than `horizon` away.
    pub(crate) fn held(&self, horizon: Duration) -> Vec<String> {
        let limit = self.now_us().saturating_add(micros(horizon));
        let next = self.next_us.lock().unwrap_or_else(|p| p.into_inner());
        next.iter()
            .filter(|(_, slot)| **slot > limit)
            .map(|(number, _)| number.clone())
            .collect()
    }

    /// Nothing leaves from the number for `wait` (Meta said it is throttled).
    pub(crate) fn hold(&self, number: &str, wait: Duration) {
        let until = self.now_us().saturating_add(micros(wait));
        let mut next = self.next_us.lock().unwrap_or_else(|p| p.into_inner());
        let entry = next.entry(number.to_owned()).or_insert(until);
        *entry = (*entry).max(until);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::{Clock, ManualClock};

    fn pacer(per_second: u32) -> (Pacer, Arc<ManualClock>) {
        let clock = ManualClock::new(At::from_millis(1_000_000));
        (Pacer::new(per_second, clock.clone()), clock)
    }

    /// Runs `acquire` to its end, moving the clock a millisecond at a time while it waits.
    async fn acquire(pacer: &Pacer, clock: &ManualClock, number: &str) -> Duration {
        let waiting = pacer.acquire(number);
        tokio::pin!(waiting);
        loop {
            tokio::select! {
                biased;
                waited = &mut waiting => return waited,
                () = tokio::task::yield_now() => clock.advance(Duration::from_millis(1)),
            }
        }
    }

    #[tokio::test]
    async fn slots_are_one_interval_apart_per_number() {
        let (pacer, clock) = pacer(10);
        let start = clock.now();
        for _ in 0..5 {
            acquire(&pacer, &clock, "a").await;
        }
        // Five slots, four intervals of 1/9.5 s after the first.
        let waited = clock.now().since(start).as_millis();
        assert!(waited >= 421, "{waited}");
        let other = clock.now();
        acquire(&pacer, &clock, "b").await;
        assert_eq!(clock.now(), other);
    }

    #[tokio::test]
    async fn hundreds_a_second_keep_their_rate_to_the_microsecond() {
        let (pacer, clock) = pacer(400);
        let start = clock.now();
        for _ in 0..380 {
            acquire(&pacer, &clock, "a").await;
        }
        // 400 a second with headroom is 380: the 380th slot is a whole second after the first.
        let waited = clock.now().since(start).as_millis();
        assert!((997..=1_000).contains(&waited), "{waited}");
    }

    #[tokio::test]
    async fn best_effort_takes_only_a_free_slot_and_never_waits() {
        let (pacer, clock) = pacer(10);
        assert!(pacer.try_acquire("a"), "a free number");
        assert!(!pacer.try_acquire("a"), "its next slot is an interval away");
        acquire(&pacer, &clock, "b").await;
        pacer.hold("b", Duration::from_secs(5));
        assert!(!pacer.try_acquire("b"), "held back");
        clock.advance(Duration::from_millis(120));
        assert!(pacer.try_acquire("a"));
    }

    #[tokio::test]
    async fn a_hold_delays_the_next_slot() {
        let (pacer, clock) = pacer(1000);
        pacer.hold("a", Duration::from_secs(2));
        assert_eq!(pacer.held(Duration::from_secs(1)), vec!["a".to_owned()]);
        let waited = acquire(&pacer, &clock, "a").await;
        assert!(waited >= Duration::from_secs(2));
    }
}
