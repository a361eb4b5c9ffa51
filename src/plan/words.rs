//! A plan in an owner's words: what customers see, what to run, what the model provider must
//! allow, what it costs, and what to act on. The engine's own terms (slots, utilisation, the
//! rows' field names) stay in the JSON.
//!
//! PURE: text from a [`Plan`], no IO.

use std::fmt::Write;

use super::{Plan, Recommended, Scenario, Sends, shown};

/// The store the nodes share, as the owner names it; `None`: SQLite, one machine's.
pub type SharedStore = Option<&'static str>;

/// The whole plan as text.
pub fn text(plan: &Plan, store: SharedStore) -> String {
    let mut out = String::new();
    out.push_str(&audience(&plan.scenario));
    out.push('\n');
    section(&mut out, "The sends", &sends(&plan.sends));
    section(&mut out, "What customers see", &customers(plan));
    section(&mut out, "What to run", &to_run(plan, store));
    section(
        &mut out,
        "What the model provider must allow",
        &provider(plan),
    );
    section(
        &mut out,
        &format!("What it costs ({})", plan.costs.currency),
        &costs(plan),
    );
    section(
        &mut out,
        "With more or fewer customers answered at once",
        &table(plan),
    );
    if !plan.warnings.is_empty() {
        let said: Vec<String> = plan
            .warnings
            .iter()
            .map(|w| format!("{}: {}", w.code, w.message))
            .collect();
        section(&mut out, "Warnings", &said);
    }
    out
}

/// Who the broadcast goes to and what they are expected to do.
pub fn audience(s: &Scenario) -> String {
    format!(
        "{} customers; about {} will write back ({:.0} %), {} times each on average; {:.0} % \
         of answers need no model, the model's take about {} ({} for the slowest 5 %).\n",
        count(s.audience as f64),
        count(s.audience as f64 * s.reply_rate),
        s.reply_rate * 100.0,
        decimal(s.turns_per_customer),
        s.local_share * 100.0,
        shown(s.llm_p50),
        shown(s.llm_p95),
    )
}

/// How the sends go: by day under the messaging limit, at the rate the number leaves them.
pub fn sends(s: &Sends) -> Vec<String> {
    let pace = format!(
        "at {} a second (the number takes {} in and out, whatsapp.outbound_rate; the replies \
         need up to {} of them)",
        decimal(s.rate),
        s.number_rate,
        s.replies_rate.ceil(),
    );
    if !s.limited {
        return vec![format!(
            "All {} go {pace}: {}; the replies below are theirs.",
            count(s.audience as f64),
            shown(s.day_s)
        )];
    }
    let limit = s.messaging_limit.map_or(0.0, |l| l as f64);
    vec![
        format!(
            "{} a day: Meta lets the business reach {} customers a day (whatsapp.messaging_limit), \
             so the broadcast takes {} days; the last customer gets it {} after the first.",
            count(s.per_day as f64),
            count(limit),
            s.days,
            shown(s.last_send_s),
        ),
        format!(
            "Each day's {} go {pace}: {}. Each day has its own replies: the figures below are \
             one day's.",
            count(s.per_day as f64),
            shown(s.day_s)
        ),
    ]
}

fn customers(plan: &Plan) -> Vec<String> {
    let row = &plan.recommended.row;
    let z = &plan.sizing;
    let day = per_day(&plan.sends);
    let mut said = vec![format!(
        "95 % of answers come within {} of the customer's message; nobody waits in line more \
         than {}.",
        shown(row.p95_reply_s),
        shown(row.max_wait_s),
    )];
    said.push(match (z.hold_after > 0.0, row.holding_messages) {
        (false, _) => "Holding messages are off (engine.hold_after is 0).".into(),
        (true, 0) => format!(
            "Nobody waits more than {}, so nobody needs a holding message.",
            shown(z.hold_after)
        ),
        (true, n) => format!(
            "{} answers{day} are more than {} off: the customer is told so first (one holding \
             message, engine.hold_after), then answered.",
            count(n as f64),
            shown(z.hold_after),
        ),
    });
    said.push(match (z.queued_review_after, row.review_spill) {
        (None, _) => "Nobody is handed to a person for waiting: a wait in line is not lateness \
                      (engine.queued_review_after is unset)."
            .into(),
        (Some(_), 0) => "Nobody waits long enough to be handed to a person.".into(),
        (Some(after), n) => format!(
            "{} conversations{day} wait more than {} and go to a person \
             (engine.queued_review_after).",
            count(n as f64),
            shown(after),
        ),
    });
    said
}

fn to_run(plan: &Plan, store: SharedStore) -> Vec<String> {
    let r = &plan.recommended;
    let per_node = plan.sizing.slots_per_node;
    let mut said = match r.nodes {
        1 => vec![format!(
            "One node (sabi serve) is enough: it answers up to {per_node} customers at once \
             (engine.turns_per_node), and the busiest moment needs {} at once.",
            r.slots
        )],
        nodes => vec![
            format!(
                "{nodes} worker nodes (sabi serve --role worker), each answering up to \
                 {per_node} customers at once (engine.turns_per_node): the busiest moment \
                 needs {} at once.",
                r.slots
            ),
            match store {
                Some(name) => format!("More than one node shares one store: yours is {name}."),
                None => "More than one node needs a shared store, PostgreSQL or Redis \
                         (SABI_STORE); SQLite serves one machine."
                    .into(),
            },
        ],
    };
    said.push(send_at(r, &plan.sends));
    if !r.meets_target {
        said.push(format!(
            "Even so, the model provider's limits keep some customers waiting more than {}.",
            shown(plan.sizing.hold_after.max(60.0))
        ));
    }
    said
}

/// The rate to give the broadcast: slower than asked when the model's limits need it.
fn send_at(r: &Recommended, sends: &Sends) -> String {
    let rate = r.send_rate.min(sends.rate);
    let flag = rate.floor().max(1.0);
    match rate < sends.rate {
        true => format!(
            "Send slower than {} a second, at {} (sabi broadcast create --rate {flag}): the \
             model provider's limits cannot answer faster replies in time.",
            decimal(sends.rate),
            decimal(rate),
        ),
        false => format!(
            "Send at {} a second (sabi broadcast create --rate {flag}).",
            decimal(rate)
        ),
    }
}

fn provider(plan: &Plan) -> Vec<String> {
    let p = &plan.provider;
    let mut said = vec![format!(
        "At the busiest minute: {} requests and {} tokens a minute.",
        count(p.requests_per_minute as f64),
        count(p.tokens_per_minute as f64),
    )];
    let limit = |n: Option<u32>, what: &str| {
        n.map_or(format!("{what} unlimited"), |n| {
            format!("{} {what} a minute", count(f64::from(n)))
        })
    };
    if p.rpm_limit.is_some() || p.tpm_limit.is_some() {
        said.push(format!(
            "Its limits, as given: {}, {} (--llm-rpm and --llm-tpm, else \
             llm.requests_per_minute and llm.tokens_per_minute).",
            limit(p.rpm_limit, "requests"),
            limit(p.tpm_limit, "tokens"),
        ));
    }
    said
}

fn costs(plan: &Plan) -> Vec<String> {
    let c = &plan.costs;
    let meta = match (c.meta, &c.country, c.per_message, &c.meta_unpriced) {
        (Some(total), Some(country), Some(price), _) => format!(
            "Meta: {} marketing messages at {price} (broadcast.prices, country {country}): {}; \
             the answers, service messages, are not counted here.",
            count(c.messages as f64),
            money(total),
        ),
        (_, _, _, why) => format!(
            "Meta: not priced: {}.",
            why.as_deref().unwrap_or("no price")
        ),
    };
    let tokens = format!(
        "about {} answers by the model, {} tokens in and {} out",
        count(c.model_turns),
        count(c.prompt_tokens),
        count(c.completion_tokens),
    );
    let model = match c.model {
        Some(total) => format!(
            "The model: {tokens} (llm.prompt_price and llm.completion_price, per million \
             tokens): {}.",
            money(total)
        ),
        None => format!(
            "The model: {tokens}; not priced: set llm.prompt_price and llm.completion_price \
             (per million tokens)."
        ),
    };
    let mut said = vec![meta, model];
    if let Some(total) = c.total {
        said.push(format!("In all: {}.", money(total)));
    }
    said
}

/// The rows, with the engine's terms left out.
fn table(plan: &Plan) -> Vec<String> {
    let recommended = &plan.recommended;
    // The rows send as asked: the recommendation is among them only when it does too.
    let same_sends = recommended.send_over_s == plan.sizing.send_over;
    let mut lines = vec![format!(
        "{:>8}  {:>22}  {:>13}  {:>17}  {:>12}",
        "at once", "95 % answered within", "longest wait", "holding messages", "to a person"
    )];
    for r in &plan.rows {
        lines.push(format!(
            "{:>8}  {:>22}  {:>13}  {:>17}  {:>12}{}",
            r.slots,
            shown(r.p95_reply_s),
            shown(r.max_wait_s),
            count(r.holding_messages as f64),
            count(r.review_spill as f64),
            if same_sends && r.slots == recommended.slots {
                "  (recommended)"
            } else {
                ""
            },
        ));
    }
    if !same_sends {
        lines.push(format!(
            "(each sending at {} a second, as asked: faster than the recommendation)",
            decimal(plan.sends.rate)
        ));
    }
    lines
}

/// " a day" when the figures are one day's.
fn per_day(sends: &Sends) -> &'static str {
    match sends.limited {
        true => " a day",
        false => "",
    }
}

fn section(out: &mut String, title: &str, lines: &[String]) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "{title}");
    for line in lines {
        let _ = writeln!(out, "  {line}");
    }
    out.push('\n');
}

/// A whole number with thousands separators: `18,000`.
pub fn count(n: f64) -> String {
    thousands(n.max(0.0).round() as u64)
}

/// 18000 as `18,000`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// An amount of money: `1,234.50`.
fn money(amount: f64) -> String {
    let cents = (amount * 100.0).round();
    format!(
        "{}.{:02}",
        count((cents / 100.0).trunc()),
        (cents % 100.0) as u64
    )
}

/// A figure with one decimal when it has one: `3`, `2.5`.
fn decimal(n: f64) -> String {
    match n.fract() == 0.0 || n >= 100.0 {
        true => format!("{n:.0}"),
        false => format!("{n:.1}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Asked, Inputs, MessagePrice, Pace, Pricing, Sizing, plan};

    /// 18,000 customers on nodes of `per_node` turns, priced in naira.
    fn planned(per_node: usize, limit: Option<u64>) -> Plan {
        let inputs = Inputs {
            scenario: crate::plan::Scenario::prior(18_000),
            sizing: Sizing {
                slots: 0,
                slots_per_node: per_node,
                recipients: 0,
                send_over: 0.0,
                batch_window: 20.0,
                hold_after: 60.0,
                review_after: 900.0,
                queued_review_after: None,
            },
            pace: Pace {
                asked: Asked::Default,
                number_rate: 80,
                messaging_limit: limit,
            },
            pricing: Pricing {
                currency: "NGN".into(),
                per_message: Ok(MessagePrice {
                    country: "234".into(),
                    price: 38.5,
                }),
                prompt_price: 150.0,
                completion_price: 600.0,
            },
        };
        plan(inputs, &[])
    }

    #[test]
    fn the_text_speaks_an_owners_words_not_the_engines() {
        let made = planned(4, None);
        assert!(made.recommended.nodes > 1, "{:?}", made.recommended);
        let said = text(&made, None);
        for jargon in ["slot", "utilisation", "seed", "p95", "busy"] {
            assert!(
                !said.to_lowercase().contains(jargon),
                "{jargon} in:\n{said}"
            );
        }
        for part in [
            "What customers see",
            "What to run",
            "What the model provider must allow",
            "What it costs (NGN)",
            "holding message",
            "693,000.00",
            "PostgreSQL or Redis",
        ] {
            assert!(said.contains(part), "{part} missing from:\n{said}");
        }
        let shared = text(&made, Some("PostgreSQL"));
        assert!(shared.contains("yours is PostgreSQL"), "{shared}");
    }

    #[test]
    fn a_limited_broadcast_is_told_by_the_day_with_its_warning() {
        let said = text(&planned(32, Some(250)), None);
        assert!(said.contains("250 a day"), "{said}");
        assert!(said.contains("takes 72 days"), "{said}");
        assert!(said.contains("71.0 days after the first"), "{said}");
        assert!(said.contains("messaging_limit: 18,000 customers"), "{said}");
        assert!(said.contains("One node (sabi serve) is enough"), "{said}");
        assert!(
            !said.contains("PostgreSQL"),
            "one node needs no shared store: {said}"
        );
    }

    #[test]
    fn figures_read_as_people_write_them() {
        assert_eq!(count(18_000.0), "18,000");
        assert_eq!(count(999.0), "999");
        assert_eq!(count(1_234_567.4), "1,234,567");
        assert_eq!(money(693_000.0), "693,000.00");
        assert_eq!(money(2.8431), "2.84");
        assert_eq!(decimal(2.5), "2.5");
        assert_eq!(decimal(20.0), "20");
    }
}
