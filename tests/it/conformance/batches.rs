//! The batch walk: a batch is driven into every state its lifecycle has (running, lapsed and
//! taken over, waiting for a retry, due again, answered, with a person) and every event is
//! tried on it through the `Store` interface: claims at later times, renewals and endings with
//! the latest token and with an older one. A model keeps every batch's `Lease` and applies
//! `sabi::store::rules::batch` to it; each step's outcome (what a claim takes and under which
//! token, whether a write is refused as a lost lease) must be what the rulebook says, on every
//! backend.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sabi::clock::At;
use sabi::domain::{LeaseToken, ReplyPart, ReviewReason};
use sabi::store::rules::batch::{self, BatchState, Lease};
use sabi::store::{Ending, Error, Store};

use super::{T0, ingest, message, reply};
use crate::helpers::ms;

const LEASE: Duration = Duration::from_millis(1_000);
const WAIT: Duration = Duration::from_millis(5_000);

#[derive(Debug, Clone, Copy)]
enum End {
    Replied,
    Retry,
    Review,
    Handoff,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    /// `claim` this much later.
    Later(Duration),
    /// `renew` with the latest token, or one before it.
    Renew { stale: bool },
    /// `finish` with the latest token, or one before it.
    Finish { end: End, stale: bool },
}

struct Walk {
    store: Arc<dyn Store>,
    now: At,
    /// Every batch the walk opened, as the rulebook says it stands.
    leases: BTreeMap<i64, Lease>,
    serial: usize,
}

impl Walk {
    /// A new conversation's first batch, claimed under its first token.
    async fn open(&mut self) -> i64 {
        self.serial += 1;
        let customer = format!("23480{:08}", self.serial);
        let id = format!("wamid.batch-walk-{}", self.serial);
        ingest(
            &self.store,
            vec![message(&id, &customer, "hi", self.now)],
            self.now,
        )
        .await;
        self.now = self.now + ms(20_000);
        let opened = self.claim().await;
        assert_eq!(opened.len(), 1, "one new batch: {opened:?}");
        let (batch, token) = opened[0];
        assert_eq!(token, LeaseToken(1), "a new batch's first token");
        self.leases.insert(
            batch,
            Lease {
                state: BatchState::Running,
                token,
                until: self.now + LEASE,
            },
        );
        batch
    }

    /// Claims now: the batches the rulebook calls reclaimable come back under their next token
    /// and run; what the model does not know (a new batch) is returned.
    async fn claim(&mut self) -> Vec<(i64, LeaseToken)> {
        let now = self.now;
        let claims = self
            .store
            .claim(now, LEASE, 1_000, None)
            .await
            .expect("claim");
        let mut taken: BTreeMap<i64, LeaseToken> =
            claims.iter().map(|c| (c.batch.id, c.token)).collect();
        for (id, lease) in self.leases.iter_mut() {
            let due = batch::reclaimable(lease, now);
            let token = taken.remove(id);
            assert_eq!(
                token.is_some(),
                due,
                "batch {id} in {lease:?} claimed at {now}"
            );
            if let Some(token) = token {
                assert_eq!(token, LeaseToken(lease.token.0 + 1), "the next token");
                *lease = Lease {
                    state: BatchState::Running,
                    token,
                    until: now + LEASE,
                };
            }
        }
        taken.into_iter().collect()
    }

    async fn run(&mut self, id: i64, op: Op, what: &str) {
        let lease = self.leases[&id];
        let token = |stale: bool| LeaseToken(lease.token.0 - i64::from(stale));
        match op {
            Op::Later(by) => {
                self.now = self.now + by;
                let new = self.claim().await;
                assert!(new.is_empty(), "{what}: no batch opens unasked: {new:?}");
            }
            Op::Renew { stale } => {
                let token = token(stale);
                let stored = self.store.renew(id, token, self.now, LEASE).await;
                let ruled = batch::renewed(&lease, token, self.now, LEASE);
                self.settle(id, what, stored, ruled);
            }
            Op::Finish { end, stale } => {
                let token = token(stale);
                let ending = ending(end, self.now);
                let stored = self.store.finish(id, token, self.now, ending.clone()).await;
                let ruled = batch::holds(&lease, token).then(|| Lease {
                    state: batch::ended(&ending),
                    until: match ending {
                        Ending::RetryAt { at, .. } => at,
                        _ => self.now,
                    },
                    ..lease
                });
                self.settle(id, what, stored, ruled);
            }
        }
    }

    /// The store's answer must be the rulebook's: done where it allows, a lost lease where not.
    fn settle(&mut self, id: i64, what: &str, stored: Result<(), Error>, ruled: Option<Lease>) {
        match (stored, ruled) {
            (Ok(()), Some(lease)) => {
                self.leases.insert(id, lease);
            }
            (Err(Error::LeaseLost), None) => {}
            (stored, ruled) => panic!("{what}: the store said {stored:?}, the rulebook {ruled:?}"),
        }
    }
}

fn ending(end: End, now: At) -> Ending {
    match end {
        End::Replied => reply("answered"),
        End::Retry => Ending::RetryAt {
            at: now + WAIT,
            error: "the model timed out".into(),
        },
        End::Review => Ending::Review {
            reason: ReviewReason::OutOfRetries,
            error: None,
        },
        End::Handoff => Ending::Handoff {
            parts: vec![ReplyPart::text("a person will answer")],
            sandbox: false,
            note: "asked for a person".into(),
        },
    }
}

/// The ways to each state a batch can be in.
fn paths() -> Vec<(&'static str, Vec<Op>)> {
    let finish = |end| Op::Finish { end, stale: false };
    vec![
        ("running", vec![]),
        ("taken over after a lapse", vec![Op::Later(LEASE)]),
        ("renewed", vec![Op::Renew { stale: false }]),
        ("waiting", vec![finish(End::Retry)]),
        ("due again", vec![finish(End::Retry), Op::Later(WAIT)]),
        ("answered", vec![finish(End::Replied)]),
        ("with a person", vec![finish(End::Review)]),
        ("handed off", vec![finish(End::Handoff)]),
    ]
}

fn events() -> Vec<Op> {
    let mut events = vec![
        Op::Later(Duration::ZERO),
        Op::Later(LEASE),
        Op::Later(WAIT),
        Op::Renew { stale: false },
        Op::Renew { stale: true },
    ];
    for end in [End::Replied, End::Retry, End::Review, End::Handoff] {
        for stale in [false, true] {
            events.push(Op::Finish { end, stale });
        }
    }
    events
}

pub async fn every_transition_of_a_batch_follows_the_rulebook(store: Arc<dyn Store>) {
    let mut walk = Walk {
        store,
        now: T0,
        leases: BTreeMap::new(),
        serial: 0,
    };
    for (name, path) in paths() {
        for event in events() {
            let id = walk.open().await;
            for op in &path {
                walk.run(id, *op, &format!("{op:?} on the way to {name}"))
                    .await;
            }
            walk.run(id, event, &format!("{event:?} on {name}")).await;
        }
    }
}
