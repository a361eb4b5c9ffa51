//! A batch's lifecycle: the turn that answers a conversation's pending messages. It runs under a
//! lease whose fencing token every write carries; a conversation has at most one batch open.

use std::time::Duration;

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

    /// The SQL stores' column that keeps [`Lease::until`] in this state: the lease's end while
    /// running, the retry time while waiting; an ended batch has none.
    pub fn until_column(self) -> Option<&'static str> {
        match self {
            BatchState::Running => Some("lease_until"),
            BatchState::Waiting => Some("next_attempt_at"),
            BatchState::Done | BatchState::Review => None,
        }
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

/// A renewal by the holder of `token` at `now`: the lease runs `span` from now; `None` when the
/// writer no longer holds the batch (see [`holds`]).
pub fn renewed(lease: &Lease, token: LeaseToken, now: At, span: Duration) -> Option<Lease> {
    holds(lease, token).then_some(Lease {
        until: now + span,
        ..*lease
    })
}

/// [`reclaimable`] as an SQL condition on the `batches` row aliased `b`, `now` naming the
/// instant's parameter (`?1`, `$1`): each open state with the column its `until` is kept in.
pub fn reclaimable_sql(now: &str) -> String {
    let states: Vec<String> = BatchState::ALL
        .iter()
        .filter(|state| state.open())
        .filter_map(|state| {
            let column = state.until_column()?;
            Some(format!("(b.state = '{state}' AND b.{column} <= {now})"))
        })
        .collect();
    format!("({})", states.join(" OR "))
}

/// For each state whose lease or wait runs out, an SQL subquery of its earliest end (each reads
/// the state's own index): for the stores' "when is a turn next due".
pub fn lease_ends_sql() -> Vec<String> {
    BatchState::ALL
        .iter()
        .filter_map(|state| {
            let column = state.until_column()?;
            Some(format!(
                "SELECT min({column}) FROM batches WHERE state = '{state}'"
            ))
        })
        .collect()
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
    fn a_renewal_extends_only_the_holders_lease() {
        let span = Duration::from_millis(50);
        for state in BatchState::ALL {
            let lease = Lease {
                state: *state,
                token: LeaseToken(3),
                until: At::from_millis(100),
            };
            let renewed = renewed(&lease, LeaseToken(3), At::from_millis(90), span);
            assert_eq!(renewed.is_some(), *state == BatchState::Running, "{state}");
            if let Some(renewed) = renewed {
                assert_eq!(renewed.until, At::from_millis(140));
                assert_eq!((renewed.state, renewed.token), (lease.state, lease.token));
            }
            assert!(renewed_by_another(&lease, span).is_none());
        }
    }

    fn renewed_by_another(lease: &Lease, span: Duration) -> Option<Lease> {
        renewed(lease, LeaseToken(2), At::from_millis(90), span)
    }

    /// The SQL the stores claim with picks exactly the batches `reclaimable` picks: every state,
    /// with `until` before, at and after `now`, in a real SQLite table.
    #[test]
    fn the_reclaim_sql_is_the_rule() {
        let db = rusqlite::Connection::open_in_memory().expect("sqlite");
        db.execute_batch(
            "CREATE TABLE batches (id INTEGER PRIMARY KEY, state TEXT, lease_until INTEGER,
                                   next_attempt_at INTEGER)",
        )
        .expect("table");
        let mut leases = Vec::new();
        for state in BatchState::ALL {
            for until in [99, 100, 101] {
                let until = At::from_millis(until);
                let id = leases.len() as i64;
                let column = |name| (state.until_column() == Some(name)).then_some(until);
                db.execute(
                    "INSERT INTO batches VALUES (?1, ?2, ?3, ?4)",
                    rusqlite::params![
                        id,
                        state.as_str(),
                        column("lease_until"),
                        column("next_attempt_at")
                    ],
                )
                .expect("insert");
                leases.push(Lease {
                    state: *state,
                    token: LeaseToken(1),
                    until,
                });
            }
        }
        let now = At::from_millis(100);
        let sql = format!(
            "SELECT id FROM batches b WHERE {} ORDER BY id",
            reclaimable_sql("?1")
        );
        let picked: Vec<i64> = db
            .prepare(&sql)
            .and_then(|mut s| s.query_map([now], |r| r.get(0))?.collect())
            .expect("query");
        let expected: Vec<i64> = (0..leases.len() as i64)
            .filter(|id| reclaimable(&leases[*id as usize], now))
            .collect();
        assert_eq!(picked, expected);
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
