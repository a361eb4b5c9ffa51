//! Retention: how long Sabi keeps what it holds, the same on every backend.
//!
//! What a sweep takes, oldest first, each kind in batches of a few hundred rows so that ingest
//! and turns go on between them:
//!
//! - **Turns** ended (done, or handed to a person whose review is settled) before the
//!   `messages` horizon, with no reply part still on its way: the turn's messages, its reply
//!   parts (Sabi's and people's), its review items and web-chat jobs go with it. A turn still
//!   running, waiting for a retry, or in an open review keeps everything.
//! - **Messages** that never had a turn (reactions, system notices, ones withdrawn before their
//!   turn) past `messages`. A message waiting for its turn never expires.
//! - **Statuses** and the other recorded items (errors, field events) past `statuses`.
//! - **Quarantined** raw bodies past `quarantine`.
//! - **Conversations** left with nothing (no turn, no message) whose customer last wrote before
//!   the `messages` horizon: the last place their number stays.
//! - **Keys**: an expired or erased message's deduplication key stays as a hash
//!   ([`Marks::key_hash`](super::erasure::Marks::key_hash)) for `dedupe` after its content goes, so Meta's late retry
//!   of it is recognised and never answered again; then it goes too.
//!
//! One node sweeps at a time, under a lease ([`LEASE`]); two at once would only repeat work,
//! but every backend's sweep is safe against one racing it, and against ingest and turns.

use serde::{Deserialize, Serialize};

use super::batch::BatchState;
use super::item::ItemState;
use crate::clock::At;
pub use crate::domain::Horizons;

/// The sweeper's lease: which node sweeps now.
pub const LEASE: &str = "sweeper";

impl Horizons {
    /// The times before which each kind is past its horizon at `now`.
    pub fn cutoffs(&self, now: At) -> Cutoffs {
        Cutoffs {
            messages: now - self.messages,
            statuses: now - self.statuses,
            quarantine: now - self.quarantine,
            keys: now - self.dedupe,
        }
    }
}

/// The times before which each kind is past its horizon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cutoffs {
    /// Turns ended, and messages without a turn received, before this.
    pub messages: At,
    /// Recorded items received before this.
    pub statuses: At,
    /// Quarantined bodies received before this.
    pub quarantine: At,
    /// Keys whose content went before this.
    pub keys: At,
}

/// A turn that may expire with everything it holds: it ended. Still running or waiting for a
/// retry, its messages are not answered yet. (An open review or a reply part still on its way
/// also keeps it; backends ask those of the turn's rows.)
pub fn turn_ended(state: BatchState) -> bool {
    matches!(state, BatchState::Done | BatchState::Review)
}

/// Messages that never had a turn and never will: they expire by their own age.
pub const TURNLESS: &[ItemState] = &[ItemState::Skipped, ItemState::Withdrawn];

/// What a sweep removed, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Swept {
    /// Ended turns, with their messages, replies, review items and web-chat jobs.
    pub turns: u64,
    /// Customer messages (in those turns or without one).
    pub messages: u64,
    /// Reply parts.
    pub replies: u64,
    /// Review items.
    pub reviews: u64,
    /// Web-chat jobs.
    pub chat_jobs: u64,
    /// Statuses and the other recorded items.
    pub statuses: u64,
    /// Quarantined raw bodies.
    pub quarantined: u64,
    /// Conversations left with nothing.
    pub conversations: u64,
    /// Deduplication keys past `dedupe`.
    pub keys: u64,
    /// Priced messages in the ledger, counted in hours past `messages`.
    pub prices: u64,
}

impl Swept {
    /// Nothing was past its horizon.
    pub fn is_empty(&self) -> bool {
        *self == Swept::default()
    }

    pub fn add(&mut self, other: &Swept) {
        let Swept {
            turns,
            messages,
            replies,
            reviews,
            chat_jobs,
            statuses,
            quarantined,
            conversations,
            keys,
            prices,
        } = *other;
        self.turns += turns;
        self.messages += messages;
        self.replies += replies;
        self.reviews += reviews;
        self.chat_jobs += chat_jobs;
        self.statuses += statuses;
        self.quarantined += quarantined;
        self.conversations += conversations;
        self.keys += keys;
        self.prices += prices;
    }
}

/// May `holder` hold the lease at `now`, given who holds it and until when? It may when no
/// one does, the holder's time is up, or it is the holder already (renewing).
pub fn may_hold(held: Option<(&str, At)>, holder: &str, now: At) -> bool {
    match held {
        None => true,
        Some((by, until)) => by == holder || until <= now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutoffs_lie_one_horizon_back() {
        let now = At::from_millis(100 * 86_400_000);
        let cut = Horizons::default().cutoffs(now);
        assert_eq!(cut.messages, At::from_millis(10 * 86_400_000));
        assert_eq!(cut.keys, At::from_millis(92 * 86_400_000));
    }

    #[test]
    fn the_lease_passes_only_when_free_lapsed_or_already_held() {
        let now = At::from_millis(1_000);
        assert!(may_hold(None, "a", now));
        assert!(may_hold(Some(("a", At::from_millis(5_000))), "a", now));
        assert!(!may_hold(Some(("b", At::from_millis(5_000))), "a", now));
        assert!(may_hold(Some(("b", At::from_millis(1_000))), "a", now));
    }

    #[test]
    fn only_ended_turns_expire() {
        assert!(turn_ended(BatchState::Done));
        assert!(turn_ended(BatchState::Review));
        assert!(!turn_ended(BatchState::Running));
        assert!(!turn_ended(BatchState::Waiting));
    }
}
