//! Wakes the scheduler when this process stores work due before the scheduler's planned wake.
//!
//! Notifying on every stored message would make a busy scheduler loop claim and query once per
//! message. Instead the scheduler publishes when it plans to wake next, and a new due time only
//! wakes it when it is earlier. The plan is lowered, never raised, while the scheduler looks at
//! the store, so a due time committed after its look is never missed.

use std::sync::atomic::{AtomicI64, Ordering};

use tokio::sync::Notify;

use crate::clock::At;

#[derive(Debug)]
pub struct Wakeup {
    notify: Notify,
    planned_ms: AtomicI64,
}

impl Default for Wakeup {
    fn default() -> Self {
        Wakeup {
            notify: Notify::new(),
            planned_ms: AtomicI64::new(i64::MIN),
        }
    }
}

impl Wakeup {
    /// Work becomes due at `due`: wake the scheduler if it planned to wake later.
    pub fn due_at(&self, due: At) {
        if self.planned_ms.fetch_min(due.millis(), Ordering::SeqCst) > due.millis() {
            self.notify.notify_one();
        }
    }

    /// The scheduler will wake by `deadline` at the latest. Called before it reads the store.
    pub(super) fn plan(&self, deadline: At) {
        self.planned_ms.store(deadline.millis(), Ordering::SeqCst);
    }

    /// Lowers the plan to what the store said; returns the deadline to sleep until.
    pub(super) fn lower(&self, deadline: At) -> At {
        let previous = self
            .planned_ms
            .fetch_min(deadline.millis(), Ordering::SeqCst);
        At::from_millis(previous).min(deadline)
    }

    pub(super) async fn notified(&self) {
        self.notify.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_earlier_work_wakes() {
        let wakeup = Wakeup::default();
        wakeup.plan(At::from_millis(1_000));
        wakeup.due_at(At::from_millis(5_000));
        let later =
            tokio::time::timeout(std::time::Duration::from_millis(20), wakeup.notified()).await;
        assert!(
            later.is_err(),
            "work due after the planned wake does not wake"
        );
        wakeup.due_at(At::from_millis(500));
        wakeup.notified().await;
        assert_eq!(
            wakeup.lower(At::from_millis(800)),
            At::from_millis(500),
            "the plan only moves earlier"
        );
    }
}
