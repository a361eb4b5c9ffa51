//! A batch's lifecycle: the turn that answers a conversation's pending messages. It runs under a
//! lease whose fencing token every write carries; a conversation has at most one batch open.

use super::named;
use super::turn::Ending;
use crate::clock::At;
use crate::domain::LeaseToken;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BatchState {
    /// A worker holds it under a lease.
    Running,
    /// Its turn failed; it may be claimed again at its retry time.
    Waiting,
    /// Answered.
    Done,
    /// Handed to a person.
    Review,
}

named!(BatchState {
    Running => "running",
    Waiting => "waiting",
    Done => "done",
    Review => "review",
});

impl BatchState {
    /// The batch still holds its conversation: no other batch of it may open.
    pub fn open(self) -> bool {
        matches!(self, BatchState::Running | BatchState::Waiting)
    }
}

/// A batch's fields its lifecycle reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub state: BatchState,
    /// The latest token handed out.
    pub token: LeaseToken,
    /// While running: when the lease lapses; while waiting: the retry time.
    pub until: At,
}

/// May the batch be claimed again at `now` (a lapsed lease, or its retry time came)?
pub fn reclaimable(lease: &Lease, now: At) -> bool {
    lease.state.open() && lease.until <= now
}

/// Does a write carrying `token` still speak for the batch? Only the latest token of a running
/// batch does: a lapsed lease taken over, or a batch that ended, refuses every older writer.
pub fn holds(lease: &Lease, token: LeaseToken) -> bool {
    lease.state == BatchState::Running && lease.token == token
}

/// Who answered an ended turn: what learning from use compares the router's guess with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnsweredBy {
    /// Answered without a model call: the router's reply.
    Router,
    /// Answered with the model's help.
    Agent,
    /// Handed to a person (asked for, too old, out of tries, or the agent could not).
    Person,
}

named!(AnsweredBy {
    Router => "router",
    Agent => "agent",
    Person => "person",
});

/// Who answered a batch in `state`, given whether its turn used the model and whether the
/// router meant to answer it; `None` while it has not ended. A reply with neither is the
/// agent's side without a model (the sandbox's acknowledgement).
pub fn answered_by(
    state: BatchState,
    used_model: bool,
    routed_locally: bool,
) -> Option<AnsweredBy> {
    match state {
        BatchState::Done if routed_locally && !used_model => Some(AnsweredBy::Router),
        BatchState::Done => Some(AnsweredBy::Agent),
        BatchState::Review => Some(AnsweredBy::Person),
        BatchState::Running | BatchState::Waiting => None,
    }
}

/// The state a turn's ending leaves the batch in.
pub fn ended(ending: &Ending) -> BatchState {
    match ending {
        Ending::Replied { .. } => BatchState::Done,
        Ending::RetryAt { .. } => BatchState::Waiting,
        Ending::Review { .. } | Ending::Handoff { .. } => BatchState::Review,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ReviewReason;

    #[test]
    fn only_the_latest_token_of_a_running_batch_writes() {
        for state in BatchState::ALL {
            let lease = Lease {
                state: *state,
                token: LeaseToken(3),
                until: At::from_millis(100),
            };
            assert_eq!(holds(&lease, LeaseToken(3)), *state == BatchState::Running);
            assert!(!holds(&lease, LeaseToken(2)));
            assert!(!holds(&lease, LeaseToken(4)));
        }
    }

    #[test]
    fn an_ended_batch_is_never_claimed_again() {
        for state in BatchState::ALL {
            let lease = Lease {
                state: *state,
                token: LeaseToken(1),
                until: At::from_millis(100),
            };
            assert_eq!(reclaimable(&lease, At::from_millis(100)), state.open());
            assert!(!reclaimable(&lease, At::from_millis(99)));
        }
    }

    #[test]
    fn an_ended_turn_was_answered_by_the_router_the_agent_or_a_person() {
        use AnsweredBy::{Agent, Person, Router};
        let cases = [
            (BatchState::Done, false, true, Some(Router)),
            (BatchState::Done, true, true, Some(Agent)),
            (BatchState::Done, true, false, Some(Agent)),
            (BatchState::Done, false, false, Some(Agent)),
            (BatchState::Review, false, true, Some(Person)),
            (BatchState::Review, true, false, Some(Person)),
            (BatchState::Running, true, true, None),
            (BatchState::Waiting, false, false, None),
        ];
        for (state, used_model, local, who) in cases {
            assert_eq!(
                answered_by(state, used_model, local),
                who,
                "{state} {used_model} {local}"
            );
        }
    }

    #[test]
    fn every_ending_closes_the_turn_but_a_retry() {
        let endings = [
            Ending::Replied {
                parts: vec![],
                sandbox: false,
            },
            Ending::RetryAt {
                at: At::from_millis(1),
                error: String::new(),
            },
            Ending::Review {
                reason: ReviewReason::TooOld,
                error: None,
            },
            Ending::Handoff {
                parts: vec![],
                sandbox: false,
                note: String::new(),
            },
        ];
        let open: Vec<bool> = endings.iter().map(|e| ended(e).open()).collect();
        assert_eq!(open, [false, true, false, false]);
    }
}
