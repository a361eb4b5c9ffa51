//! Sizing for a broadcast's surge of replies: "how many turns at once do we need on Diwali eve,
//! and what happens if we get it wrong?" ([`plan`]).
//!
//! A scenario is the audience, how many reply and when (the reply curve), how many turns a
//! replying customer takes, how many the router answers alone, and how long a model turn takes
//! within the provider's limits. [`plan`] plays it out for each number of turns at once
//! (`queue`) and reports what customers would see: waits, the longest queue, holding
//! messages, batches that would pass the review age, and the model calls and tokens a minute
//! against the budget; then the smallest number of turns at once that keeps the 95th
//! percentile wait within the holding threshold, and how long to take over the sends when even
//! that cannot (the model's limits bound it).
//!
//! The sends come first ([`sends`]): Meta's messaging limit splits a large audience into days,
//! each its own surge, and the number's pace, shared with the replies' messages, bounds their
//! rate. Around the surge: what it costs and what the model provider must allow ([`cost`]),
//! and the plan in an owner's words ([`words`]).
//!
//! Without measurements it uses documented priors ([`Scenario::prior`]): 15 % of customers
//! reply, 43 % of replies in the first 15 minutes, 3 turns per replying customer, 5 s per model
//! turn.

pub mod cost;
pub(crate) mod queue;
pub mod sends;
pub mod words;

use std::time::Duration;

use serde::Serialize;

pub use self::cost::{Costs, MessagePrice, Pricing, Provider};
pub use self::sends::{Asked, Pace, Sends};

/// When replies come after a send: shares of replies by span of time after it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Curve {
    /// (from, to, share) in seconds after the send; shares add up to 1.
    pub spans: Vec<(f64, f64, f64)>,
}

impl Curve {
    /// 43 % in the first 15 minutes (mostly at once), 27 % in the rest of the first hour,
    /// 20 % over the next five hours, 10 % over the rest of the day.
    pub fn prior() -> Curve {
        Curve {
            spans: vec![
                (0.0, 60.0, 0.12),
                (60.0, 300.0, 0.16),
                (300.0, 900.0, 0.15),
                (900.0, 3_600.0, 0.27),
                (3_600.0, 21_600.0, 0.20),
                (21_600.0, 86_400.0, 0.10),
            ],
        }
    }

    /// From first replies counted per minute after the send (a broadcast report's
    /// `reply_curve`), with those later spread over the next five hours.
    pub fn from_minutes(per_minute: &[f64], later: f64) -> Option<Curve> {
        let total: f64 = per_minute.iter().sum::<f64>() + later;
        if total <= 0.0 {
            return None;
        }
        let mut spans: Vec<(f64, f64, f64)> = per_minute
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0.0)
            .map(|(m, n)| (m as f64 * 60.0, (m + 1) as f64 * 60.0, n / total))
            .collect();
        let end = per_minute.len() as f64 * 60.0;
        if later > 0.0 {
            spans.push((end, end + 5.0 * 3_600.0, later / total));
        }
        Some(Curve { spans })
    }

    /// The share of replies within `seconds` of the send.
    pub fn within(&self, seconds: f64) -> f64 {
        self.spans
            .iter()
            .map(|(from, to, share)| share * ((seconds - from) / (to - from)).clamp(0.0, 1.0))
            .sum()
    }

    fn sample(&self, rng: &mut fastrand::Rng) -> f64 {
        let mut pick = rng.f64() * self.spans.iter().map(|s| s.2).sum::<f64>();
        for (from, to, share) in &self.spans {
            if pick < *share {
                return from + rng.f64() * (to - from);
            }
            pick -= share;
        }
        self.spans.last().map_or(0.0, |s| s.1)
    }
}

/// What is expected of a broadcast's audience and of the model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scenario {
    pub audience: usize,
    /// Share of recipients who reply.
    pub reply_rate: f64,
    #[serde(skip)]
    pub curve: Curve,
    /// Turns a replying customer takes, on average.
    pub turns_per_customer: f64,
    /// Share of turns the router answers without the model.
    pub local_share: f64,
    /// A model turn's time: median and 95th percentile, seconds.
    pub llm_p50: f64,
    pub llm_p95: f64,
    pub llm_rpm: Option<u32>,
    pub llm_tpm: Option<u32>,
    /// Model calls in flight at once per node (`llm.max_concurrent`); `None`: no bound.
    pub llm_concurrent: Option<usize>,
    pub calls_per_model_turn: u32,
    /// Tokens a model turn's calls take together, and of them those the model writes.
    pub tokens_per_model_turn: u32,
    pub completion_tokens_per_model_turn: u32,
    /// A local turn's time, seconds.
    pub local_seconds: f64,
    /// How long a customer takes to read an answer and write again, seconds (on average).
    pub think_seconds: f64,
    pub seed: u64,
}

impl Scenario {
    /// The documented priors, for `audience` customers.
    pub fn prior(audience: usize) -> Scenario {
        Scenario {
            audience,
            reply_rate: 0.15,
            curve: Curve::prior(),
            turns_per_customer: 3.0,
            local_share: 0.4,
            llm_p50: 5.0,
            llm_p95: 12.0,
            llm_rpm: None,
            llm_tpm: None,
            llm_concurrent: None,
            calls_per_model_turn: 2,
            tokens_per_model_turn: 3_000,
            completion_tokens_per_model_turn: 300,
            local_seconds: 0.02,
            think_seconds: 40.0,
            seed: 2026,
        }
    }

    /// Tokens a model turn's calls send.
    pub fn prompt_tokens_per_model_turn(&self) -> u32 {
        self.tokens_per_model_turn
            .saturating_sub(self.completion_tokens_per_model_turn)
    }
}

/// How Sabi would run it: turns at once (over every node), the send's span, and the engine's
/// thresholds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sizing {
    /// Turns at once over every node...
    pub slots: usize,
    /// ...and on one node (`engine.turns_per_node`): the slots take this many nodes, each
    /// with its model budget.
    pub slots_per_node: usize,
    /// Recipients whose replies make the surge (a day's sends under Meta's messaging limit),
    /// and the seconds their sends take.
    pub recipients: usize,
    pub send_over: f64,
    /// Seconds a customer's messages are collected before their turn falls due.
    pub batch_window: f64,
    /// A turn expected to wait longer gets a holding message (seconds).
    pub hold_after: f64,
    /// A batch that reached Sabi this late goes to review (seconds): shown, not applied to
    /// queue waits.
    pub review_after: f64,
    /// A batch that waited longer in the queue goes to review (seconds), when set.
    pub queued_review_after: Option<f64>,
}

/// One turn as it went, in seconds from the first send: when it fell due, started and ended,
/// and whether it used the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Turn {
    pub due: f64,
    pub start: f64,
    pub end: f64,
    pub model: bool,
}

/// What customers would see with one number of turns at once.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub slots: usize,
    pub turns: usize,
    /// The most turns falling due in one minute, per second.
    pub peak_arrivals_per_s: f64,
    /// The replies' messages on the number in their busiest minute, per second: customers'
    /// messages (one a turn at least), answers and holding messages.
    pub peak_messages_per_s: f64,
    /// Busy share of the slots in the busiest hour.
    pub utilisation: f64,
    pub p50_wait_s: f64,
    pub p95_wait_s: f64,
    pub max_wait_s: f64,
    /// A reply, from the customer's message: the batch window, the wait and the turn.
    pub p95_reply_s: f64,
    pub max_queue: usize,
    /// Turns that wait longer than `hold_after`: each gets one holding message.
    pub holding_messages: usize,
    /// Turns that wait longer than `review_after`: they would go to people if the queue's wait
    /// counted as lateness (it does not, unless `queued_review_after` is set)...
    pub over_review_age: usize,
    /// ...and those that do go to people, by `queued_review_after`.
    pub review_spill: usize,
    pub model_calls: usize,
    pub peak_model_calls_per_min: usize,
    pub peak_tokens_per_min: u64,
    /// The provider's limits the scenario was given.
    pub rpm_budget: Option<u32>,
    pub tpm_budget: Option<u32>,
}

/// The smallest sizing that keeps customers' 95th percentile wait within the holding threshold.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recommended {
    /// Turns at once, over every node.
    pub slots: usize,
    pub slots_per_node: usize,
    pub nodes: usize,
    /// Seconds to take over a surge's sends, and their rate: slower than asked when the
    /// model's limits, not the slots, bound the waits.
    pub send_over_s: f64,
    pub send_rate: f64,
    pub p95_wait_s: f64,
    /// Whether the target is met at all (within a day's send).
    pub meets_target: bool,
    /// What customers see with it.
    pub row: Row,
}

/// Something the owner should act on before the day.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Warning {
    /// `messaging_limit`, `send_rate` or `llm_budget`.
    pub code: &'static str,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub scenario: Scenario,
    pub sizing: Sizing,
    pub sends: Sends,
    pub rows: Vec<Row>,
    pub recommended: Recommended,
    pub provider: Provider,
    pub costs: Costs,
    pub warnings: Vec<Warning>,
}

/// What a plan is made from: the scenario, the engine's sizing (its slots and sends are the
/// plan's to fill), the sends' pace and the prices.
#[derive(Debug, Clone, PartialEq)]
pub struct Inputs {
    pub scenario: Scenario,
    pub sizing: Sizing,
    pub pace: Pace,
    pub pricing: Pricing,
}

/// The most turns at once tried when searching for the recommendation.
const MOST_SLOTS: usize = 4_096;
/// The longest send tried: a day.
const LONGEST_SEND: f64 = 86_400.0;

/// Paces the sends, plays a surge out for each of `slots` (see `tried`), recommends a sizing,
/// and prices it.
pub fn plan(inputs: Inputs, slots: &[usize]) -> Plan {
    let Inputs {
        scenario,
        sizing,
        pace,
        pricing,
    } = inputs;
    let (sends, sizing) = paced(&scenario, sizing, &pace);
    let recommended = recommend(&scenario, &sizing);
    let provider = cost::provider(&scenario, &unbounded_peak(&scenario, &sizing, &recommended));
    let mut warnings = sends::warnings(&sends, &pace);
    let slower = (recommended.send_over_s > sizing.send_over).then_some(recommended.send_rate);
    warnings.extend(cost::warnings(&provider, slower));
    let rows = tried(slots, &recommended)
        .into_iter()
        .map(|slots| {
            row(
                &scenario,
                &Sizing {
                    slots,
                    ..sizing.clone()
                },
            )
        })
        .collect();
    Plan {
        costs: cost::costs(&scenario, &pricing),
        scenario,
        sizing,
        sends,
        rows,
        recommended,
        provider,
        warnings,
    }
}

/// The turns at once to show: those given, else the seed's 5, the recommendation and twice it.
fn tried(slots: &[usize], recommended: &Recommended) -> Vec<usize> {
    match slots {
        [] => {
            let mut counts = vec![5, recommended.slots, recommended.slots * 2];
            counts.sort_unstable();
            counts.dedup();
            counts
        }
        given => given.to_vec(),
    }
}

/// The sends at the pace the number leaves them, and the sizing of their surge. The replies'
/// share of the number is measured on a surge sent at the rate first asked, with every turn
/// at once: the most messages they can make.
fn paced(scenario: &Scenario, sizing: Sizing, pace: &Pace) -> (Sends, Sizing) {
    let first = sends::sends(scenario.audience, pace, 0.0);
    let busiest = row(
        scenario,
        &Sizing {
            slots: MOST_SLOTS,
            recipients: first.surge(),
            send_over: first.day_s,
            ..sizing.clone()
        },
    );
    let sends = sends::sends(scenario.audience, pace, busiest.peak_messages_per_s);
    let sizing = Sizing {
        recipients: sends.surge(),
        send_over: sends.day_s,
        ..sizing
    };
    (sends, sizing)
}

/// The surge with the recommended slots were the provider's limits lifted: what it would ask
/// of the provider.
fn unbounded_peak(scenario: &Scenario, sizing: &Sizing, recommended: &Recommended) -> Row {
    if scenario.llm_rpm.is_none() && scenario.llm_tpm.is_none() {
        return recommended.row.clone();
    }
    let unbounded = Scenario {
        llm_rpm: None,
        llm_tpm: None,
        ..scenario.clone()
    };
    recommend(&unbounded, sizing).row
}

/// One row: the scenario played out with `sizing`.
pub fn row(scenario: &Scenario, sizing: &Sizing) -> Row {
    measure(&queue::play(scenario, sizing), scenario, sizing)
}

/// What customers saw in `turns`, played out or measured (`sabi simulate`).
pub fn measure(turns: &[Turn], scenario: &Scenario, sizing: &Sizing) -> Row {
    let mut waits: Vec<f64> = turns.iter().map(|t| t.start - t.due).collect();
    waits.sort_by(f64::total_cmp);
    let replies: Vec<f64> = {
        let mut r: Vec<f64> = turns
            .iter()
            .map(|t| t.end - t.due + sizing.batch_window)
            .collect();
        r.sort_by(f64::total_cmp);
        r
    };
    let over = |limit: f64| waits.iter().filter(|w| **w > limit).count();
    let model: Vec<f64> = turns.iter().filter(|t| t.model).map(|t| t.start).collect();
    let peak_calls = peak_per_minute(&model) * scenario.calls_per_model_turn as usize;
    Row {
        slots: sizing.slots,
        turns: turns.len(),
        peak_arrivals_per_s: peak_per_minute(&turns.iter().map(|t| t.due).collect::<Vec<_>>())
            as f64
            / 60.0,
        peak_messages_per_s: peak_per_minute(&messages(turns, sizing.hold_after)) as f64 / 60.0,
        utilisation: busiest_hour(turns) / (3_600.0 * sizing.slots.max(1) as f64),
        p50_wait_s: percentile(&waits, 0.5),
        p95_wait_s: percentile(&waits, 0.95),
        max_wait_s: waits.last().copied().unwrap_or(0.0),
        p95_reply_s: percentile(&replies, 0.95),
        max_queue: longest_queue(turns),
        holding_messages: over(sizing.hold_after),
        over_review_age: over(sizing.review_after),
        review_spill: sizing.queued_review_after.map_or(0, over),
        model_calls: model.len() * scenario.calls_per_model_turn as usize,
        peak_model_calls_per_min: peak_calls,
        peak_tokens_per_min: (peak_per_minute(&model) as u64)
            * u64::from(scenario.tokens_per_model_turn),
        rpm_budget: scenario.llm_rpm,
        tpm_budget: scenario.llm_tpm,
    }
}

/// When the replies' messages cross the number: each turn's customer message when it falls
/// due, its answer when it ends, and a holding message when it waits past `hold_after`.
fn messages(turns: &[Turn], hold_after: f64) -> Vec<f64> {
    let holding = turns
        .iter()
        .filter(|t| hold_after > 0.0 && t.start - t.due > hold_after)
        .map(|t| t.due + hold_after);
    turns
        .iter()
        .flat_map(|t| [t.due, t.end])
        .chain(holding)
        .collect()
}

/// The fewest turns at once whose 95th percentile wait stays within `hold_after`; when no
/// number does (the model's limits bound the waits), the shortest send, doubled from the one
/// asked, that lets it.
fn recommend(scenario: &Scenario, sizing: &Sizing) -> Recommended {
    // Holding messages off, customers should still hear within a minute.
    let target = if sizing.hold_after > 0.0 {
        sizing.hold_after
    } else {
        60.0
    };
    let mut send_over = sizing.send_over;
    loop {
        let played = |slots: usize| {
            row(
                scenario,
                &Sizing {
                    slots,
                    send_over,
                    ..sizing.clone()
                },
            )
        };
        let found = smallest(1, MOST_SLOTS, |slots| played(slots).p95_wait_s <= target);
        if found.is_some() || send_over >= LONGEST_SEND {
            let slots = found.unwrap_or(MOST_SLOTS);
            let per_node = sizing.slots_per_node.max(1);
            let row = played(slots);
            return Recommended {
                slots,
                slots_per_node: per_node.min(slots),
                nodes: slots.div_ceil(per_node),
                send_over_s: send_over,
                send_rate: sizing.recipients as f64 / send_over,
                p95_wait_s: row.p95_wait_s,
                meets_target: found.is_some(),
                row,
            };
        }
        send_over = (send_over.max(60.0) * 2.0).min(LONGEST_SEND);
    }
}

/// The smallest `n` in `low..=high` for which `enough(n)`, when waits only shrink with more
/// slots: doubling, then halving the gap.
fn smallest(low: usize, high: usize, enough: impl Fn(usize) -> bool) -> Option<usize> {
    let mut top = low;
    while !enough(top) {
        if top >= high {
            return None;
        }
        top = (top * 2).min(high);
    }
    let mut bottom = top / 2;
    while bottom + 1 < top {
        let mid = (bottom + top) / 2;
        match enough(mid) {
            true => top = mid,
            false => bottom = mid,
        }
    }
    Some(top.max(low))
}

/// The most of `times` (seconds) in any one minute.
fn peak_per_minute(times: &[f64]) -> usize {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut peak = 0;
    let mut first = 0;
    for (i, t) in sorted.iter().enumerate() {
        while sorted[first] <= t - 60.0 {
            first += 1;
        }
        peak = peak.max(i + 1 - first);
    }
    peak
}

/// The most slot time turns starting within one hour take, seconds.
fn busiest_hour(turns: &[Turn]) -> f64 {
    let mut started: Vec<(f64, f64)> = turns.iter().map(|t| (t.start, t.end - t.start)).collect();
    started.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut first, mut busy, mut most) = (0, 0.0, 0.0_f64);
    for &(start, service) in &started {
        busy += service;
        while started[first].0 <= start - 3_600.0 {
            busy -= started[first].1;
            first += 1;
        }
        most = most.max(busy);
    }
    most
}

/// The most turns due and not yet started at once.
fn longest_queue(turns: &[Turn]) -> usize {
    // +1 when a turn falls due, -1 when it starts; a start at its due time never queues.
    let mut events: Vec<(f64, i64)> = turns
        .iter()
        .filter(|t| t.start > t.due)
        .flat_map(|t| [(t.due, 1), (t.start, -1)])
        .collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut most) = (0_i64, 0_i64);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Seconds as a person reads them: `45 s`, `12 min`, `3.5 h`, `71.0 days`.
pub fn shown(seconds: f64) -> String {
    match seconds {
        s if s < 90.0 => format!("{s:.0} s"),
        s if s < 5_400.0 => format!("{:.0} min", s / 60.0),
        s if s < 2.0 * 86_400.0 => format!("{:.1} h", s / 3_600.0),
        s => format!("{:.1} days", s / 86_400.0),
    }
}

/// `d` in seconds.
pub fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizing(slots: usize) -> Sizing {
        Sizing {
            slots,
            slots_per_node: 32,
            recipients: 18_000,
            send_over: 18_000.0 / 80.0,
            batch_window: 20.0,
            hold_after: 60.0,
            review_after: 900.0,
            queued_review_after: None,
        }
    }

    /// The scenario sent at 80 a second on a number that takes 1,000, with no messaging limit.
    fn inputs(scenario: Scenario) -> Inputs {
        Inputs {
            scenario,
            sizing: sizing(0),
            pace: Pace {
                asked: Asked::Rate(80.0),
                number_rate: 1_000,
                messaging_limit: None,
            },
            pricing: Pricing {
                currency: "USD".into(),
                per_message: Err("broadcast.prices is empty".into()),
                prompt_price: 0.0,
                completion_price: 0.0,
            },
        }
    }

    fn codes(plan: &Plan) -> Vec<&'static str> {
        plan.warnings.iter().map(|w| w.code).collect()
    }

    #[test]
    fn a_messaging_limit_makes_one_surge_a_day_not_one_of_everybody() {
        let unlimited = plan(inputs(Scenario::prior(18_000)), &[5]);
        let mut limited = inputs(Scenario::prior(18_000));
        limited.pace.messaging_limit = Some(250);
        let limited = plan(limited, &[5]);
        assert_eq!(limited.sizing.recipients, 250);
        assert_eq!((limited.sends.per_day, limited.sends.days), (250, 72));
        // A day's 250 at 80 a second take 3 s, not the 225 s of 18,000.
        assert_eq!(limited.sizing.send_over, 250.0 / 80.0);
        assert!(
            limited.rows[0].turns * 40 < unlimited.rows[0].turns,
            "{} turns a day against {}",
            limited.rows[0].turns,
            unlimited.rows[0].turns
        );
        assert!(limited.rows[0].p95_wait_s < unlimited.rows[0].p95_wait_s);
        assert_eq!(codes(&limited), ["messaging_limit"]);
        assert!(codes(&unlimited).is_empty());
        // The costs are the whole audience's, every day's.
        assert_eq!(limited.costs.messages, 18_000);
        assert_eq!(limited.costs.model_turns, unlimited.costs.model_turns);
    }

    #[test]
    fn the_sends_leave_the_replies_their_share_of_the_number() {
        let mut asked = inputs(Scenario::prior(18_000));
        asked.pace = Pace {
            asked: Asked::Rate(1_000.0),
            number_rate: 80,
            messaging_limit: None,
        };
        let made = plan(asked, &[5]);
        let replies = made.sends.replies_rate;
        assert!(replies > 1.0, "18,000 customers' replies: {replies}");
        assert_eq!(made.sends.rate, 80.0 - replies.ceil());
        assert_eq!(made.sizing.send_over, 18_000.0 / made.sends.rate);
        assert_eq!(codes(&made), ["send_rate"]);
    }

    #[test]
    fn a_provider_limit_below_the_peak_is_warned_of_and_slows_the_sends() {
        let free = plan(inputs(Scenario::prior(18_000)), &[5]);
        let need = free.provider.requests_per_minute;
        assert_eq!(need, free.recommended.row.peak_model_calls_per_min);
        let tight = Scenario {
            llm_rpm: Some(u32::try_from(need / 2).expect("small")),
            ..Scenario::prior(18_000)
        };
        let limited = plan(inputs(tight), &[5]);
        assert_eq!(limited.provider.requests_per_minute, need, "the same peak");
        assert_eq!(codes(&limited), ["llm_budget"]);
        assert!(limited.recommended.send_rate < free.recommended.send_rate);
        let roomy = Scenario {
            llm_rpm: Some(u32::try_from(need).expect("small")),
            ..Scenario::prior(18_000)
        };
        assert!(codes(&plan(inputs(roomy), &[5])).is_empty());
    }

    #[test]
    fn the_prior_curve_has_43_percent_in_15_minutes_and_adds_up() {
        let curve = Curve::prior();
        assert!((curve.within(900.0) - 0.43).abs() < 1e-9);
        assert!((curve.within(86_400.0) - 1.0).abs() < 1e-9);
        let measured = Curve::from_minutes(&[6.0, 2.0, 0.0, 1.0], 1.0).expect("some");
        assert!((measured.within(60.0) - 0.6).abs() < 1e-9);
        assert!((measured.within(1e9) - 1.0).abs() < 1e-9);
        assert_eq!(Curve::from_minutes(&[0.0], 0.0), None);
    }

    #[test]
    fn more_slots_never_make_customers_wait_longer() {
        let scenario = Scenario::prior(18_000);
        let waits: Vec<f64> = [5, 20, 80]
            .iter()
            .map(|slots| row(&scenario, &sizing(*slots)).p95_wait_s)
            .collect();
        assert!(waits[0] > waits[1] && waits[1] >= waits[2], "{waits:?}");
        // At 5 at once, 15 % of 18,000 replying build a queue of hundreds, and most model
        // turns wait long enough for a holding message; the router's turns never queue.
        let five = row(&scenario, &sizing(5));
        assert!(five.max_queue > 300, "{five:?}");
        let model_turns = five.model_calls / scenario.calls_per_model_turn as usize;
        assert!(five.holding_messages > model_turns / 2, "{five:?}");
        assert!(five.holding_messages < model_turns, "{five:?}");
        assert_eq!(five.p50_wait_s, 0.0, "the router's 40 % wait for nothing");
        assert_eq!(five.review_spill, 0, "the queue's wait is not lateness");
        assert!(
            five.turns > 2_700 * 2,
            "about 3 turns per replying customer"
        );
    }

    #[test]
    fn the_recommendation_keeps_the_95th_percentile_within_the_holding_threshold() {
        let scenario = Scenario::prior(18_000);
        let plan = plan(inputs(scenario), &[]);
        let r = &plan.recommended;
        assert!(r.meets_target && r.p95_wait_s <= 60.0, "{r:?}");
        assert_eq!(r.nodes, r.slots.div_ceil(32));
        let slots: Vec<usize> = plan.rows.iter().map(|row| row.slots).collect();
        assert_eq!(slots, [5, r.slots, r.slots * 2]);
        let fewer = row(&plan.scenario, &sizing(r.slots - 1));
        assert!(fewer.p95_wait_s > 60.0, "the fewest that do: {fewer:?}");
    }

    #[test]
    fn a_model_limit_no_slot_count_beats_asks_for_a_longer_send() {
        let scenario = Scenario {
            local_share: 0.0,
            llm_rpm: Some(60),
            ..Scenario::prior(18_000)
        };
        let plan = plan(inputs(scenario), &[5]);
        let r = &plan.recommended;
        assert!(r.send_over_s > 18_000.0 / 80.0, "{r:?}");
        assert!(
            plan.rows[0].peak_model_calls_per_min <= 62,
            "{:?}",
            plan.rows[0]
        );
    }

    #[test]
    fn a_nodes_model_budget_bounds_its_model_turns() {
        let unbounded = Scenario {
            local_share: 0.0,
            ..Scenario::prior(18_000)
        };
        let bounded = Scenario {
            llm_concurrent: Some(4),
            ..unbounded.clone()
        };
        let free = row(&unbounded, &sizing(16));
        let budgeted = row(&bounded, &sizing(16));
        assert!(
            budgeted.p95_wait_s > free.p95_wait_s,
            "{budgeted:?} {free:?}"
        );
        // Two nodes of 8 have twice the budget of one node of 16.
        let two_nodes = Sizing {
            slots_per_node: 8,
            ..sizing(16)
        };
        assert!(row(&bounded, &two_nodes).p95_wait_s < budgeted.p95_wait_s);
    }

    #[test]
    fn the_same_inputs_give_the_same_figures() {
        let a = row(&Scenario::prior(2_000), &sizing(8));
        let b = row(&Scenario::prior(2_000), &sizing(8));
        assert_eq!(a, b);
    }
}
