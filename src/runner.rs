//! The runner of every background loop (the scheduler's turns, the sender's sends, the
//! broadcaster's recipients; the holder's looks and the sweeper's passes, see [`Periodic`]): it claims jobs
//! from the store up to its free slots, runs each on a task of its own, and between claims
//! sleeps until this process stores work, a job ends, or the next due time comes (never later
//! than the next poll, for work that other nodes stored). A store that cannot claim pauses the
//! loop for a poll interval. At shutdown it stops claiming and gives running jobs a grace
//! period; a job still running then is stopped where it is, and its lease lapses.
//!
//! What is claimed and how a job runs belong to the loop ([`Work`]). Every wait is on the
//! injected clock, so tests drive the loops with a manual one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::clock::{At, SharedClock};
use crate::store;

/// One background loop's work.
#[async_trait::async_trait]
pub(crate) trait Work: Send + Sync + 'static {
    type Job: Send + 'static;

    /// What the loop's log lines call its jobs ("turns", "sends").
    const JOBS: &'static str;

    /// Claims at most `free` jobs (none when `free` is 0).
    async fn claim(&self, free: usize) -> store::Result<Vec<Self::Job>>;

    /// Runs one claimed job to its end.
    async fn perform(self: Arc<Self>, job: Self::Job);

    /// When to look at the store again if nothing wakes the loop first; see [`wake_time`].
    async fn next_wake(&self) -> At;

    /// Completes when this process stored work the loop should look at before its next wake.
    async fn stored(&self);

    /// Whether a claim that took `claimed` of the `asked` jobs may have left due ones in the
    /// store, so the loop claims again at once while slots are free: a full claim may have.
    fn claim_again(&self, asked: usize, claimed: usize) -> bool {
        asked > 0 && claimed == asked
    }
}

/// Work done now and then rather than claimed (the holder's look at the queue, the sweeper's
/// pass over what is past its retention): the runner does it at start, then `every` after the
/// last one ended, one at a time.
#[async_trait::async_trait]
pub(crate) trait Periodic: Send + Sync + 'static {
    /// What the loop's log lines call its rounds ("looks", "sweeps").
    const JOBS: &'static str;

    /// One round; it logs its own failures.
    async fn round(&self);
}

/// A [`Periodic`] as the runner's [`Work`]: a round is due at `next`.
struct Every<P> {
    periodic: Arc<P>,
    clock: SharedClock,
    every: Duration,
    next: Mutex<At>,
}

impl<P> Every<P> {
    fn next(&self) -> At {
        // A poisoned lock still holds a valid instant: a round panicked after setting it.
        *self.next.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait::async_trait]
impl<P: Periodic> Work for Every<P> {
    type Job = ();

    const JOBS: &'static str = P::JOBS;

    async fn claim(&self, free: usize) -> store::Result<Vec<()>> {
        let due = free > 0 && self.clock.now() >= self.next();
        Ok(if due { vec![()] } else { Vec::new() })
    }

    async fn perform(self: Arc<Self>, (): ()) {
        self.periodic.round().await;
        let next = self.clock.now() + self.every;
        *self.next.lock().unwrap_or_else(|e| e.into_inner()) = next;
    }

    async fn next_wake(&self) -> At {
        self.next()
    }

    async fn stored(&self) {
        // Nothing stored wakes a periodic loop: it keeps its own time.
        std::future::pending().await
    }
}

/// How a loop runs.
pub(crate) struct Runner {
    pub(crate) clock: SharedClock,
    /// Jobs at once on this node.
    pub(crate) slots: usize,
    /// The longest sleep between two looks at the store, and the pause after a failed claim.
    pub(crate) poll_interval: Duration,
    /// How long running jobs may take to end at shutdown.
    pub(crate) shutdown_grace: Duration,
}

impl Runner {
    /// Claims and runs `work`'s jobs until `shutdown`, then drains them within the grace.
    pub(crate) async fn run<W: Work>(self, work: Arc<W>, shutdown: CancellationToken) {
        let slots = Arc::new(Semaphore::new(self.slots));
        let mut running = JoinSet::new();
        while !shutdown.is_cancelled() {
            // Jobs that ended since the last claim: their slots are free now.
            while running.try_join_next().is_some() {}
            let free = slots.available_permits();
            let jobs = match work.claim(free).await {
                Ok(jobs) => jobs,
                Err(e) => {
                    tracing::error!(error.message = %e, work = W::JOBS, "claiming failed; pausing before the next try");
                    self.pause(&shutdown).await;
                    continue;
                }
            };
            let claimed = jobs.len();
            start(&work, jobs, &slots, &mut running);
            if work.claim_again(free, claimed) && slots.available_permits() > 0 {
                continue;
            }
            self.wait(&*work, &slots, &mut running, &shutdown).await;
        }
        self.drain(running, W::JOBS).await;
    }

    /// Runs `periodic`'s rounds, the first now and each next `every` after the last ended,
    /// until `shutdown`; a round under way then has the grace to end.
    pub(crate) async fn every<P: Periodic>(
        self,
        every: Duration,
        periodic: Arc<P>,
        shutdown: CancellationToken,
    ) {
        let work = Arc::new(Every {
            periodic,
            clock: self.clock.clone(),
            every,
            next: Mutex::new(self.clock.now()),
        });
        self.run(work, shutdown).await;
    }

    /// Until the loop should look at the store again: a job ends (its slot is free), or, while
    /// a slot is free, this process stores work or the next wake time comes. Or shutdown.
    async fn wait<W: Work>(
        &self,
        work: &W,
        slots: &Semaphore,
        running: &mut JoinSet<()>,
        shutdown: &CancellationToken,
    ) {
        if slots.available_permits() == 0 {
            // Every slot is busy: nothing can be claimed until a job ends.
            tokio::select! {
                () = shutdown.cancelled() => {}
                Some(_) = running.join_next() => {}
            }
            return;
        }
        let deadline = work.next_wake().await;
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = work.stored() => {}
            Some(_) = running.join_next(), if !running.is_empty() => {}
            () = self.clock.sleep_until(deadline) => {}
        }
    }

    async fn pause(&self, shutdown: &CancellationToken) {
        let until = self.clock.now() + self.poll_interval;
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = self.clock.sleep_until(until) => {}
        }
    }

    /// Waits for running jobs until the grace is over, then stops those still running. Their
    /// leases are not released: they lapse, and the store hands the work on (another worker
    /// takes a turn over; a send's outcome counts as unknown).
    async fn drain(&self, mut running: JoinSet<()>, jobs: &'static str) {
        while running.try_join_next().is_some() {}
        if running.is_empty() {
            return;
        }
        tracing::info!(
            running = running.len(),
            work = jobs,
            "stopping: waiting for running work"
        );
        let grace = self
            .clock
            .sleep_until(self.clock.now() + self.shutdown_grace);
        tokio::select! {
            () = async { while running.join_next().await.is_some() {} } => {}
            () = grace => {
                tracing::warn!(
                    running = running.len(),
                    work = jobs,
                    "shutdown grace over: stopping what still runs; its leases will lapse"
                );
                running.abort_all();
            }
        }
    }
}

/// Runs each claimed job on a task of its own, holding a slot until it ends.
fn start<W: Work>(
    work: &Arc<W>,
    jobs: Vec<W::Job>,
    slots: &Arc<Semaphore>,
    running: &mut JoinSet<()>,
) {
    for job in jobs {
        // The claim took no more than the free slots, and only this loop takes them.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            break;
        };
        let work = work.clone();
        running.spawn(async move {
            work.perform(job).await;
            drop(slot);
        });
    }
}

/// When a loop looks at the store again, given what the store says is next due: that time, but
/// no later than the next poll (work other nodes store wakes nothing here); a tenth of a poll
/// from now when it is due already yet was not claimed (another node holds it, or a slot is
/// about to be free).
pub(crate) fn wake_time(
    now: At,
    poll_interval: Duration,
    next_due: store::Result<Option<At>>,
) -> At {
    let poll = now + poll_interval;
    match next_due {
        Ok(Some(due)) if due <= now => now + poll_interval / 10,
        Ok(Some(due)) => due.min(poll),
        Ok(None) => poll,
        Err(e) => {
            tracing::warn!(error.message = %e, "could not read when work is next due");
            poll
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::clock::ManualClock;

    struct Rounds(AtomicUsize);

    #[async_trait::async_trait]
    impl Periodic for Rounds {
        const JOBS: &'static str = "rounds";

        async fn round(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Lets the loop's task run until it waits again.
    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_periodic_loop_runs_at_start_and_then_as_the_clock_moves() {
        let clock = ManualClock::new(at(1_000));
        let rounds = Arc::new(Rounds(AtomicUsize::new(0)));
        let shutdown = CancellationToken::new();
        let runner = Runner {
            clock: clock.clone(),
            slots: 1,
            poll_interval: Duration::from_secs(1),
            shutdown_grace: Duration::ZERO,
        };
        let every = Duration::from_secs(60);
        let running = tokio::spawn(runner.every(every, rounds.clone(), shutdown.clone()));
        let count = || rounds.0.load(Ordering::SeqCst);
        settle().await;
        assert_eq!(count(), 1, "the first round at start");
        clock.advance(every - Duration::from_millis(1));
        settle().await;
        assert_eq!(count(), 1, "not before its time");
        clock.advance(Duration::from_millis(1));
        settle().await;
        assert_eq!(count(), 2, "the clock's advance runs the next");
        clock.advance(every * 3);
        settle().await;
        assert_eq!(
            count(),
            3,
            "one round however late: the next is `every` after it"
        );
        shutdown.cancel();
        running.await.expect("the loop ends at shutdown");
    }

    fn at(millis: i64) -> At {
        At::from_millis(millis)
    }

    #[test]
    fn the_loop_wakes_when_work_is_due_but_at_least_every_poll() {
        let poll = Duration::from_secs(1);
        assert_eq!(wake_time(at(10_000), poll, Ok(None)), at(11_000));
        assert_eq!(
            wake_time(at(10_000), poll, Ok(Some(at(10_400)))),
            at(10_400)
        );
        assert_eq!(
            wake_time(at(10_000), poll, Ok(Some(at(60_000)))),
            at(11_000)
        );
        assert_eq!(
            wake_time(at(10_000), poll, Ok(Some(at(9_000)))),
            at(10_100),
            "due, not claimed"
        );
        let away = Err(store::Error::Unavailable("down".into()));
        assert_eq!(wake_time(at(10_000), poll, away), at(11_000));
    }
}
