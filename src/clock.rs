//! Clock: where every stage reads the time and waits for it, so tests can drive it.
//!
//! Production code never calls `SystemTime::now()` or sleeps on its own; it asks the [`Clock`]
//! it was given. Tests give a [`ManualClock`] and move it forward by hand; moving it wakes every
//! task sleeping until a time that has now come.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A future returned by [`Clock::sleep_until`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The source of wall-clock time, in Unix milliseconds.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> i64;

    /// Completes once `now_ms() >= deadline_ms`.
    fn sleep_until(&self, deadline_ms: i64) -> Sleep;
}

pub type SharedClock = Arc<dyn Clock>;

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
    }

    fn sleep_until(&self, deadline_ms: i64) -> Sleep {
        let wait = u64::try_from(deadline_ms.saturating_sub(self.now_ms())).unwrap_or(0);
        Box::pin(tokio::time::sleep(Duration::from_millis(wait)))
    }
}

/// A clock that moves only when told to.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug)]
pub struct ManualClock {
    now_ms: tokio::sync::watch::Sender<i64>,
}

#[cfg(any(test, feature = "testing"))]
impl ManualClock {
    pub fn new(now_ms: i64) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            now_ms: tokio::sync::watch::Sender::new(now_ms),
        })
    }

    /// Moves time forward and wakes every sleeper whose deadline has come.
    pub fn advance(&self, by: Duration) {
        let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.now_ms.send_modify(|now| *now = now.saturating_add(by));
    }
}

#[cfg(any(test, feature = "testing"))]
impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        *self.now_ms.borrow()
    }

    fn sleep_until(&self, deadline_ms: i64) -> Sleep {
        let mut now = self.now_ms.subscribe();
        Box::pin(async move {
            // The sender lives as long as the clock; if it is gone, time has stopped for good.
            let _ = now.wait_for(|now| *now >= deadline_ms).await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn advancing_wakes_sleepers_whose_time_has_come() {
        let clock = ManualClock::new(1_000);
        let early = tokio::spawn(clock.sleep_until(1_500));
        let late = tokio::spawn(clock.sleep_until(5_000));
        clock.advance(Duration::from_millis(600));
        early.await.expect("woken");
        assert!(!late.is_finished());
        clock.advance(Duration::from_secs(10));
        late.await.expect("woken");
        assert_eq!(clock.now_ms(), 11_600);
    }
}
