//! The rulebook walk: a reply part is driven into every state a store can put it in, and every
//! event is tried on it, through the `Store` interface; after each step every part the store
//! holds must be exactly where `sabi::store::rules::part::next` says. A model of the outbox
//! applies the rulebook to its own copy of each part, so a backend that decides on its own (a
//! Lua script, a claim in SQL) is compared with the table at every step, on every backend
//! (the conformance suite runs this case on each).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use sabi::clock::{At, UnixSeconds};
use sabi::domain::{
    BatchPolicy, Channel, ConversationKey, InboundItem, ItemKind, ReplyPart, ReviewReason,
};
use sabi::store::rules::part::{self, Delivery, Event, Part, PartState, Status, WINDOW_CLOSED};
use sabi::store::{
    Ending, Error, Ingest, Resolution, ReviewQuery, SendClaim, SendResult, Store, send_callback,
};

use crate::helpers::ms;

const T0: At = At::from_millis(1_790_000_000_000);
const LEASE: Duration = Duration::from_millis(1_000);
const WAIT: Duration = Duration::from_millis(5_000);
/// How long a status that settles a send under way holds its recipient.
const SPACING: Duration = Duration::from_millis(300);
const BUSINESS: &str = "100000000000009";

/// What the walk does to the store, each one through its interface.
#[derive(Debug, Clone)]
enum Op {
    /// `claim_sends` now.
    Claim,
    /// `claim_sends` this much later: lapsed leases and waits settle first.
    Later(Duration),
    /// `depart` with the part's latest attempt (or one before it: stale).
    Depart { stale: bool },
    /// `record_send` with the part's latest attempt (or one before it: stale).
    Outcome { result: SendResult, stale: bool },
    /// A status webhook naming the part, by its wamid when it has one, else by the callback
    /// data of its latest attempt.
    Status(Delivery, Option<i64>),
    /// A person requeues the part's open review item.
    Requeue,
}

fn outcomes() -> Vec<SendResult> {
    let error = || "walk".to_owned();
    vec![
        SendResult::Accepted {
            wamid: String::new(), // made unique per use
            template: false,
            next_send_at: At::default(), // set per use
        },
        SendResult::Retry {
            at: At::default(),
            failure: true,
            code: Some(131_000),
            error: error(),
            recipient_after: None,
        },
        SendResult::Untried,
        SendResult::WindowClosed {
            code: Some(WINDOW_CLOSED),
            error: error(),
        },
        SendResult::Unknown {
            error: error(),
            wait_until: At::default(),
        },
        SendResult::Review {
            reason: ReviewReason::SendFailed,
            code: Some(131_026),
            error: error(),
        },
        SendResult::Review {
            reason: ReviewReason::OutOfRetries,
            code: None,
            error: error(),
        },
    ]
}

/// Every event the walk tries on a part.
fn events() -> Vec<Op> {
    let mut ops = vec![
        Op::Claim,
        Op::Later(LEASE + ms(1)),
        Op::Later(WAIT + ms(1)),
        Op::Depart { stale: false },
        Op::Depart { stale: true },
    ];
    for result in outcomes() {
        ops.push(Op::Outcome {
            result,
            stale: false,
        });
    }
    ops.push(Op::Outcome {
        result: SendResult::Untried,
        stale: true,
    });
    for delivery in [
        Delivery::Sent,
        Delivery::Delivered,
        Delivery::Read,
        Delivery::Failed,
    ] {
        ops.push(Op::Status(delivery, None));
    }
    ops.push(Op::Status(Delivery::Failed, Some(WINDOW_CLOSED)));
    ops.push(Op::Requeue);
    ops
}

/// The ways into each state a store can put a part in.
fn paths() -> Vec<(&'static str, bool, Vec<Op>)> {
    let outcome = |i: usize| Op::Outcome {
        result: outcomes()[i].clone(),
        stale: false,
    };
    let sent = |then: Vec<Op>| {
        let mut ops = vec![Op::Claim, Op::Depart { stale: false }];
        ops.extend(then);
        ops
    };
    vec![
        ("sandbox", true, vec![]),
        ("queued", false, vec![]),
        ("claimed", false, vec![Op::Claim]),
        (
            "queued again after a lapsed claim",
            false,
            vec![Op::Claim, Op::Later(LEASE + ms(1))],
        ),
        ("sending", false, sent(vec![])),
        (
            "sending, named by a status",
            false,
            sent(vec![Op::Status(Delivery::Sent, None)]),
        ),
        ("accepted", false, sent(vec![outcome(0)])),
        ("retrying", false, sent(vec![outcome(1)])),
        ("window_closed", false, sent(vec![outcome(3)])),
        (
            "window_closed, claimed",
            false,
            sent(vec![outcome(3), Op::Claim]),
        ),
        ("unknown", false, sent(vec![outcome(4)])),
        (
            "unknown after a lapse",
            false,
            sent(vec![Op::Later(LEASE + ms(1))]),
        ),
        ("failed", false, sent(vec![outcome(5)])),
        ("review", false, sent(vec![outcome(6)])),
        ("requeued", false, sent(vec![outcome(5), Op::Requeue])),
        (
            "delivered",
            false,
            sent(vec![outcome(0), Op::Status(Delivery::Delivered, None)]),
        ),
    ]
}

/// The outbox as the rulebook says it must be.
#[derive(Default)]
struct Model {
    parts: BTreeMap<i64, Part>,
    conversation: HashMap<i64, String>,
    /// Per recipient: nothing is claimed before this.
    hold: HashMap<String, At>,
    /// Parts with an open review item.
    review: BTreeSet<i64>,
}

impl Model {
    fn apply(&mut self, id: i64, event: &Event<'_>, now: At) -> bool {
        let Ok(step) = part::next(&self.parts[&id], event, now) else {
            return false;
        };
        if let Some(until) = step.effects.hold_recipient_until {
            let hold = self.hold.entry(self.conversation[&id].clone()).or_default();
            *hold = (*hold).max(until);
        }
        if step.effects.review.is_some() {
            self.review.insert(id);
        }
        if step.effects.close_review {
            self.review.remove(&id);
        }
        self.parts.insert(id, step.part);
        true
    }

    /// What `claim_sends` at `now` does: lapsed leases, then waits past, then the heads.
    fn claim(&mut self, now: At) -> BTreeSet<i64> {
        let ids: Vec<i64> = self.parts.keys().copied().collect();
        let lapse = Event::LeaseLapsed { unknown_wait: WAIT };
        for id in &ids {
            if matches!(
                self.parts[id].state,
                PartState::Claimed | PartState::Sending
            ) {
                self.apply(*id, &lapse, now);
            }
        }
        for id in &ids {
            if self.parts[id].state == PartState::Unknown {
                self.apply(*id, &Event::WaitOver, now);
            }
        }
        let mut claimed = BTreeSet::new();
        for id in &ids {
            let held = self
                .hold
                .get(&self.conversation[id])
                .copied()
                .unwrap_or_default();
            if held <= now && self.apply(*id, &Event::Claim { lease: LEASE }, now) {
                claimed.insert(*id);
            }
        }
        claimed
    }
}

struct Walk {
    store: Arc<dyn Store>,
    model: Model,
    now: At,
    serial: u32,
}

impl Walk {
    fn fresh(&mut self, what: &str) -> String {
        self.serial += 1;
        format!("{what}{}", self.serial)
    }

    /// A new conversation whose turn wrote one reply part: its id.
    async fn part(&mut self, sandbox: bool) -> i64 {
        let customer = self.fresh("23480");
        let conversation = ConversationKey {
            channel: Channel::Whatsapp,
            business: BUSINESS.into(),
            customer: customer.clone(),
        };
        let message = InboundItem {
            kind: ItemKind::Message,
            channel: Channel::Whatsapp,
            dedupe_key: self.fresh("wamid.in"),
            business: Some(BUSINESS.into()),
            customer: Some(customer.clone()),
            item_type: Some("text".into()),
            text: Some("hello".into()),
            media_id: None,
            provider_ts: Some(UnixSeconds(self.now.unix_seconds())),
            turn: Some(conversation),
            facts: serde_json::json!({}),
        };
        self.ingest(message).await;
        let claims = self
            .store
            .claim(self.now, ms(60_000), 10, None)
            .await
            .expect("claim");
        assert_eq!(claims.len(), 1, "one turn due");
        let ending = Ending::Replied {
            parts: vec![ReplyPart::text("walk")],
            sandbox,
        };
        let claim = &claims[0];
        self.store
            .finish(claim.batch.id, claim.token, self.now, ending)
            .await
            .expect("finish");
        let outbox = self.store.outbox(None).await.expect("outbox");
        let id = outbox.last().expect("the part").id;
        let state = if sandbox {
            PartState::Sandbox
        } else {
            PartState::Queued
        };
        self.model.parts.insert(id, Part::written(state));
        self.model.conversation.insert(id, customer);
        id
    }

    async fn ingest(&self, item: InboundItem) {
        let delivery = Ingest {
            routine: Default::default(),
            items: vec![item],
            quarantined: Vec::new(),
            received_at: self.now,
            policy: BatchPolicy {
                window: Duration::ZERO,
                cap: Duration::ZERO,
            },
            pair_spacing: SPACING,
            human_hold: std::time::Duration::ZERO,
        };
        self.store.ingest(delivery).await.expect("ingest");
    }

    async fn run(&mut self, id: i64, op: &Op) {
        self.now = self.now + ms(10);
        match op {
            Op::Claim => self.claim().await,
            Op::Later(later) => {
                self.now = self.now + *later;
                self.claim().await;
            }
            Op::Depart { stale } => self.depart(id, *stale).await,
            Op::Outcome { result, stale } => self.outcome(id, result, *stale).await,
            Op::Status(delivery, code) => self.status(id, *delivery, *code).await,
            Op::Requeue => self.requeue(id).await,
        }
    }

    async fn claim(&mut self) {
        let claim = SendClaim {
            now: self.now,
            lease: LEASE,
            unknown_wait: WAIT,
            limit: 1_000,
            halted: Vec::new(),
        };
        let jobs = self
            .store
            .claim_sends(claim)
            .await
            .expect("claim sends")
            .jobs;
        let got: BTreeSet<i64> = jobs.iter().map(|j| j.id).collect();
        assert_eq!(got, self.model.claim(self.now), "claimed");
    }

    async fn depart(&mut self, id: i64, stale: bool) {
        let attempt = self.model.parts[&id]
            .attempts
            .wrapping_sub(u32::from(stale));
        let departed = self.store.depart(id, attempt, self.now, LEASE).await;
        let event = Event::Depart {
            attempt,
            lease: LEASE,
        };
        let allowed = self.model.apply(id, &event, self.now);
        match departed {
            Ok(()) => assert!(allowed, "the store departed what the rulebook refuses"),
            Err(Error::LeaseLost) => {
                assert!(!allowed, "the store refused what the rulebook allows")
            }
            Err(e) => panic!("depart: {e}"),
        }
    }

    async fn outcome(&mut self, id: i64, result: &SendResult, stale: bool) {
        let result = match result.clone() {
            SendResult::Accepted { template, .. } => SendResult::Accepted {
                wamid: self.fresh("wamid.out"),
                template,
                next_send_at: self.now + ms(50),
            },
            SendResult::Retry {
                failure,
                code,
                error,
                ..
            } => SendResult::Retry {
                at: self.now + ms(20),
                failure,
                code,
                error,
                recipient_after: Some(self.now + ms(30)),
            },
            SendResult::Unknown { error, .. } => SendResult::Unknown {
                error,
                wait_until: self.now + WAIT,
            },
            other => other,
        };
        let attempt = self.model.parts[&id]
            .attempts
            .wrapping_sub(u32::from(stale));
        let recorded = self
            .store
            .record_send(id, attempt, self.now, result.clone())
            .await;
        let event = Event::Outcome {
            attempt,
            result: &result,
        };
        let allowed = self.model.apply(id, &event, self.now);
        match recorded {
            Ok(()) => assert!(allowed, "the store recorded what the rulebook refuses"),
            Err(Error::LeaseLost) => {
                assert!(!allowed, "the store refused what the rulebook allows")
            }
            Err(e) => panic!("record_send: {e}"),
        }
    }

    async fn status(&mut self, id: i64, delivery: Delivery, code: Option<i64>) {
        let held = self.model.parts[&id].clone();
        let (wamid, callback) = match held.wamid {
            Some(wamid) => (wamid, None),
            None => (
                self.fresh("wamid.status"),
                Some(send_callback(id, held.attempts)),
            ),
        };
        let item = InboundItem {
            kind: ItemKind::Status,
            channel: Channel::Whatsapp,
            dedupe_key: format!("{wamid}:{}:{}", delivery.as_str(), self.fresh("")),
            business: Some(BUSINESS.into()),
            customer: Some(self.model.conversation[&id].clone()),
            item_type: Some(delivery.as_str().into()),
            text: None,
            media_id: None,
            provider_ts: Some(UnixSeconds(self.now.unix_seconds())),
            turn: None,
            facts: serde_json::json!({
                "kind": "status",
                "id": wamid,
                "status": delivery.as_str(),
                "biz_opaque_callback_data": callback,
                "error_codes": code.into_iter().collect::<Vec<_>>(),
            }),
        };
        self.ingest(item).await;
        // Found by its wamid, or by the callback of its latest attempt before it has one.
        let status = Status {
            wamid: &wamid,
            delivery,
            code,
        };
        self.model
            .apply(id, &Event::Status(status, SPACING), self.now);
    }

    async fn requeue(&mut self, id: i64) {
        let open = self
            .store
            .review_queue(ReviewQuery::default())
            .await
            .expect("review queue");
        let Some(item) = open.iter().find(|r| r.outbox_id == Some(id)) else {
            return; // nothing for a person to requeue
        };
        self.store
            .resolve_review(item.id, self.now, Resolution::Requeue)
            .await
            .expect("requeue");
        self.model.review.remove(&id);
        self.model.apply(id, &Event::Requeue, self.now);
    }

    /// Every part in the store where the model has it.
    async fn compare(&self, what: &str) {
        let outbox = self.store.outbox(None).await.expect("outbox");
        let stored: BTreeMap<i64, _> = outbox
            .iter()
            .map(|e| {
                let seen = (e.state, e.kind, e.attempts, e.wamid.clone(), e.delivery);
                (e.id, seen)
            })
            .collect();
        let modelled: BTreeMap<i64, _> = self
            .model
            .parts
            .iter()
            .map(|(id, p)| {
                let seen = (p.state, p.kind, p.attempts, p.wamid.clone(), p.delivery);
                (*id, seen)
            })
            .collect();
        assert_eq!(stored, modelled, "after {what}");
        let open: BTreeSet<i64> = self
            .store
            .review_queue(ReviewQuery::default())
            .await
            .expect("review queue")
            .iter()
            .filter_map(|r| r.outbox_id)
            .collect();
        assert_eq!(open, self.model.review, "open review items after {what}");
    }
}

pub async fn every_transition_of_a_reply_part_follows_the_rulebook(store: Arc<dyn Store>) {
    let mut walk = Walk {
        store,
        model: Model::default(),
        now: T0,
        serial: 0,
    };
    for (name, sandbox, path) in paths() {
        for event in events() {
            let id = walk.part(sandbox).await;
            for op in &path {
                walk.run(id, op).await;
                walk.compare(&format!("{op:?} on the way to {name}")).await;
            }
            walk.run(id, &event).await;
            walk.compare(&format!("{event:?} on {name}")).await;
        }
    }
}
