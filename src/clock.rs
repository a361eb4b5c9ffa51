//! Clock: where every stage reads the time, so tests can drive it.
//!
//! Production code never calls `SystemTime::now()` directly; it asks the [`Clock`] it was given.
//! Tests give a [`ManualClock`] and move it forward by hand.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The source of wall-clock time, in Unix milliseconds.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> i64;
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
}

/// A clock that moves only when told to.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: std::sync::atomic::AtomicI64,
}

#[cfg(any(test, feature = "testing"))]
impl ManualClock {
    pub fn new(now_ms: i64) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            now_ms: now_ms.into(),
        })
    }

    pub fn advance(&self, by: std::time::Duration) {
        let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.now_ms
            .fetch_add(by, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(any(test, feature = "testing"))]
impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now_ms.load(std::sync::atomic::Ordering::SeqCst)
    }
}
