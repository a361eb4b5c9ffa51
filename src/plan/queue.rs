//! The queue a broadcast's replies make, played out in one pass: every turn in the order it
//! falls due; turns the router answers alone at once (their lane never waits), model turns on
//! the slots outside that lane, first in first out, model calls spaced within the
//! provider's per-minute limits. A customer's next turn falls due after their answer, the time
//! they take to read and write, and the batch window.
//!
//! PURE: no IO; the same inputs and seed give the same figures.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{Scenario, Sizing, Turn};
use crate::config::queue_slots;

/// A turn due at a time (seconds from the first send), for one customer.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Due {
    at: f64,
    customer: usize,
    /// Turns left after this one.
    left: u32,
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.at
            .total_cmp(&other.at)
            .then(self.customer.cmp(&other.customer))
    }
}

/// Every turn of the scenario on `slots` turns at once.
pub(super) fn play(scenario: &Scenario, sizing: &Sizing) -> Vec<Turn> {
    let mut rng = fastrand::Rng::with_seed(scenario.seed);
    let mut dues: BinaryHeap<Reverse<Due>> = first_turns(scenario, sizing, &mut rng)
        .into_iter()
        .map(Reverse)
        .collect();
    // Model turns hold the slots outside the routine lane; routine turns start when due.
    let mut free: BinaryHeap<Reverse<Seconds>> = (0..model_slots(sizing).max(1))
        .map(|_| Reverse(Seconds(0.0)))
        .collect();
    // Each node's model budget: calls in flight at once, over the nodes these slots take.
    let permits = scenario.llm_concurrent.map_or(usize::MAX, |per_node| {
        per_node.max(1) * sizing.slots.div_ceil(sizing.slots_per_node.max(1))
    });
    let mut model_free: BinaryHeap<Reverse<Seconds>> = (0..permits.min(sizing.slots.max(1)))
        .map(|_| Reverse(Seconds(0.0)))
        .collect();
    let mut next_model_call = 0.0_f64;
    let call_spacing = scenario
        .llm_rpm
        .map_or(0.0, |rpm| 60.0 / f64::from(rpm.max(1)));
    let token_spacing = scenario
        .llm_tpm
        .map_or(0.0, |tpm| 60.0 / f64::from(tpm.max(1)));
    let mut turns = Vec::new();
    while let Some(Reverse(due)) = dues.pop() {
        let model = rng.f64() >= scenario.local_share;
        let slot_free = match model {
            true => match free.pop() {
                Some(Reverse(Seconds(at))) => at,
                None => break,
            },
            false => due.at,
        };
        let mut start = due.at.max(slot_free);
        let service = if model {
            // The turn's calls leave within the provider's limits: its first waits for the
            // next free call time, and holds the next turn's back by its share.
            // It also waits for a free call of its node's budget, holding its slot meanwhile.
            let Some(Reverse(Seconds(permit_free))) = model_free.pop() else {
                break;
            };
            start = start.max(next_model_call).max(permit_free);
            let calls = f64::from(scenario.calls_per_model_turn);
            let tokens = f64::from(scenario.tokens_per_model_turn);
            next_model_call = start + (calls * call_spacing).max(tokens * token_spacing);
            let service = lognormal(&mut rng, scenario.llm_p50, scenario.llm_p95);
            model_free.push(Reverse(Seconds(start + service)));
            service
        } else {
            scenario.local_seconds
        };
        let end = start + service;
        if model {
            free.push(Reverse(Seconds(end)));
        }
        turns.push(Turn {
            due: due.at,
            start,
            end,
            model,
        });
        if due.left > 0 {
            let next = end + scenario.think_seconds * (0.5 + rng.f64()) + sizing.batch_window;
            dues.push(Reverse(Due {
                at: next,
                customer: due.customer,
                left: due.left - 1,
            }));
        }
    }
    turns
}

/// The slots model turns may hold over every node: each node's outside the routine lane.
fn model_slots(sizing: &Sizing) -> usize {
    let per_node = sizing.slots_per_node.max(1);
    let (full, rest) = (sizing.slots / per_node, sizing.slots % per_node);
    full * queue_slots(per_node) + queue_slots(rest)
}

/// When each replying customer's first turn falls due: their first message, and the batch
/// window.
fn first_turns(scenario: &Scenario, sizing: &Sizing, rng: &mut fastrand::Rng) -> Vec<Due> {
    repliers(scenario, sizing, rng)
        .into_iter()
        .map(|r| Due {
            at: r.first + sizing.batch_window,
            customer: r.customer,
            left: r.turns - 1,
        })
        .collect()
}

/// A customer who replies to the broadcast.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Replier {
    pub customer: usize,
    /// Their first message, seconds from the first send: their send, and their reply delay
    /// along the curve.
    pub first: f64,
    /// Turns they take, at least one.
    pub turns: u32,
}

/// Every customer of the surge's sends who replies, in the order of the sends.
pub(crate) fn repliers(
    scenario: &Scenario,
    sizing: &Sizing,
    rng: &mut fastrand::Rng,
) -> Vec<Replier> {
    let recipients = sizing.recipients.min(scenario.audience);
    let send_spacing = sizing.send_over / (recipients.max(1) as f64);
    let mut repliers = Vec::new();
    for customer in 0..recipients {
        if rng.f64() >= scenario.reply_rate {
            continue;
        }
        let sent = customer as f64 * send_spacing;
        let delay = scenario.curve.sample(rng);
        repliers.push(Replier {
            customer,
            first: sent + delay,
            turns: turns_of(scenario.turns_per_customer, rng),
        });
    }
    repliers
}

/// Turns one replying customer takes: at least one, `mean` on average (geometric).
fn turns_of(mean: f64, rng: &mut fastrand::Rng) -> u32 {
    let more = 1.0 - 1.0 / mean.max(1.0);
    let mut turns = 1;
    while turns < 50 && rng.f64() < more {
        turns += 1;
    }
    turns
}

/// A model turn's time: log-normal with this median and 95th percentile.
pub(crate) fn lognormal(rng: &mut fastrand::Rng, p50: f64, p95: f64) -> f64 {
    let mu = p50.max(1e-3).ln();
    let sigma = (p95.max(p50) / p50.max(1e-3)).ln() / 1.645;
    // Box-Muller.
    let (u1, u2) = (rng.f64().max(1e-12), rng.f64());
    let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    (mu + sigma * normal).exp()
}

/// Seconds, ordered.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Seconds(f64);

impl Eq for Seconds {}

impl PartialOrd for Seconds {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Seconds {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}
