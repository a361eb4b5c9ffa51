//! Clock: where every stage reads the time and waits for it, so tests can drive it, and the
//! one type every instant has.
//!
//! Production code never calls `SystemTime::now()` or sleeps on its own; it asks the [`Clock`]
//! it was given. Tests give a `ManualClock` and move it forward by hand; moving it wakes every
//! task sleeping until a time that has now come.
//!
//! An instant is an [`At`]; a span between instants is a [`Duration`]. A provider's timestamp
//! stays [`UnixSeconds`], as it came, and becomes an `At` in one place, [`UnixSeconds::at`].

use std::fmt;
use std::future::Future;
use std::ops::{Add, Sub};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An instant: milliseconds since the Unix epoch. Stores keep it as that integer.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct At(i64);

impl At {
    pub const fn from_millis(millis: i64) -> At {
        At(millis)
    }

    pub const fn millis(self) -> i64 {
        self.0
    }

    /// Whole seconds, for what is shown to people and given to tools.
    pub const fn unix_seconds(self) -> i64 {
        self.0.div_euclid(1000)
    }

    /// How long after `earlier` this is; zero when it is not after it.
    pub fn since(self, earlier: At) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }
}

/// A provider's timestamp: whole Unix seconds, as Meta sends it and stores keep it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct UnixSeconds(pub i64);

impl UnixSeconds {
    pub const fn at(self) -> At {
        At(self.0.saturating_mul(1000))
    }
}

/// A span in whole milliseconds, as stores and scripts keep it.
pub fn millis(span: Duration) -> i64 {
    i64::try_from(span.as_millis()).unwrap_or(i64::MAX)
}

impl Add<Duration> for At {
    type Output = At;

    fn add(self, span: Duration) -> At {
        At(self.0.saturating_add(millis(span)))
    }
}

impl Sub<Duration> for At {
    type Output = At;

    fn sub(self, span: Duration) -> At {
        At(self.0.saturating_sub(millis(span)))
    }
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A future returned by [`Clock::sleep_until`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The source of wall-clock time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> At;

    /// Completes once `now() >= deadline`.
    fn sleep_until(&self, deadline: At) -> Sleep;
}

pub type SharedClock = Arc<dyn Clock>;

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> At {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        At(millis(since_epoch))
    }

    fn sleep_until(&self, deadline: At) -> Sleep {
        Box::pin(tokio::time::sleep(deadline.since(self.now())))
    }
}

/// Tokio's clock, counted from a given instant: with the runtime's time paused it is virtual
/// time, which jumps to the next timer whenever every task waits (`sabi simulate`).
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: At,
    started: tokio::time::Instant,
}

impl TokioClock {
    /// Reads `origin` now. Call it inside the runtime whose time it keeps.
    pub fn starting_at(origin: At) -> TokioClock {
        TokioClock {
            origin,
            started: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> At {
        self.origin + self.started.elapsed()
    }

    fn sleep_until(&self, deadline: At) -> Sleep {
        let at = self.started + deadline.since(self.origin);
        Box::pin(tokio::time::sleep_until(at))
    }
}

/// A clock that moves only when told to.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug)]
pub struct ManualClock {
    now: tokio::sync::watch::Sender<At>,
}

#[cfg(any(test, feature = "testing"))]
impl ManualClock {
    pub fn new(now: At) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            now: tokio::sync::watch::Sender::new(now),
        })
    }

    /// Moves time forward and wakes every sleeper whose deadline has come.
    pub fn advance(&self, by: Duration) {
        self.now.send_modify(|now| *now = *now + by);
    }
}

#[cfg(any(test, feature = "testing"))]
impl Clock for ManualClock {
    fn now(&self) -> At {
        *self.now.borrow()
    }

    fn sleep_until(&self, deadline: At) -> Sleep {
        let mut now = self.now.subscribe();
        Box::pin(async move {
            // The sender lives as long as the clock; if it is gone, time has stopped for good.
            let _ = now.wait_for(|now| *now >= deadline).await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn advancing_wakes_sleepers_whose_time_has_come() {
        let clock = ManualClock::new(At(1_000));
        let early = tokio::spawn(clock.sleep_until(At(1_500)));
        let late = tokio::spawn(clock.sleep_until(At(5_000)));
        clock.advance(Duration::from_millis(600));
        early.await.expect("woken");
        assert!(!late.is_finished());
        clock.advance(Duration::from_secs(10));
        late.await.expect("woken");
        assert_eq!(clock.now(), At(11_600));
    }

    #[test]
    fn provider_seconds_and_spans_keep_to_whole_milliseconds() {
        let sent = UnixSeconds(1_781_000_000).at();
        assert_eq!(sent.millis(), 1_781_000_000_000);
        assert_eq!(sent.unix_seconds(), 1_781_000_000);
        let later = sent + Duration::from_millis(1_500);
        assert_eq!(later.since(sent), Duration::from_millis(1_500));
        assert_eq!(sent.since(later), Duration::ZERO, "never negative");
        assert_eq!(
            At(i64::MAX) + Duration::from_secs(1),
            At(i64::MAX),
            "saturates"
        );
    }
}
