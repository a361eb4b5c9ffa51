//! `sabi plan`: how a broadcast's sends go, how many turns at once their surges of replies
//! need, what customers see with fewer, what it costs and what the model provider must allow
//! (see [`crate::plan`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde_json::Value;

use crate::broadcast::report::{self, Prices};
use crate::clock::{At, Clock, SystemClock};
use crate::config::{Config, MessagingLimit, StoreConfig};
use crate::plan::{
    self, Asked, Curve, Inputs, MessagePrice, Pace, Pricing, Recommended, Row, Scenario, Sizing,
    shown, words,
};
use crate::store::{self, BroadcastState, Inspection, Store};

/// What `sabi plan` takes.
#[derive(Debug, Args)]
pub(super) struct PlanArgs {
    #[command(flatten)]
    scenario: ScenarioArgs,
    /// The audience's country calling code, like 234: Meta's price per message is
    /// broadcast.prices' for it (whatsapp.default_country, else the prices' only entry).
    #[arg(long)]
    country: Option<String>,
    #[arg(long)]
    json: bool,
}

/// A broadcast's surge, as `sabi plan` and `sabi simulate` take it; every input left out is
/// a documented prior or the configuration's.
#[derive(Debug, Args)]
pub(super) struct ScenarioArgs {
    /// Customers the broadcast goes to.
    #[arg(long)]
    audience: usize,
    /// Share of them who reply (0.15: 15 %).
    #[arg(long)]
    reply_rate: Option<f64>,
    /// When replies come: a JSON array of first replies per minute after the send (a report's
    /// reply_curve), a broadcast report (JSON), or `auto` for this store's latest finished
    /// broadcast, whose reply rate it also reads.
    #[arg(long, value_name = "FILE|auto")]
    reply_curve: Option<String>,
    /// Turns a replying customer takes, on average.
    #[arg(long)]
    turns_per_customer: Option<f64>,
    /// Share of turns the router answers alone, or `auto`: this store's last week.
    #[arg(long, value_name = "S|auto")]
    local_share: Option<String>,
    /// A model turn's time in seconds: median and 95th percentile, like 5,12.
    #[arg(long, value_name = "P50,P95")]
    llm_latency: Option<String>,
    /// Tokens a model turn's calls send and receive together, like 2700,300.
    #[arg(long, value_name = "PROMPT,COMPLETION")]
    llm_tokens: Option<String>,
    /// The provider's requests per minute (llm.requests_per_minute by default).
    #[arg(long)]
    llm_rpm: Option<u32>,
    /// The provider's tokens per minute (llm.tokens_per_minute by default).
    #[arg(long)]
    llm_tpm: Option<u32>,
    /// Meta's messaging limit: customers a day, or unlimited (whatsapp.messaging_limit by
    /// default).
    #[arg(long, value_name = "N|unlimited", value_parser = messaging_limit)]
    messaging_limit: Option<MessagingLimit>,
    /// Broadcast messages per second (20, a broadcast's default rate), at most what the
    /// number leaves beside the replies (whatsapp.outbound_rate)...
    #[arg(long, conflicts_with = "send_over")]
    send_rate: Option<f64>,
    /// ...or the time a day's sends take, like 2h.
    #[arg(long, value_parser = humantime::parse_duration)]
    send_over: Option<Duration>,
    /// Turns at once to try, over every node, like 5,20,40 (5, the recommendation and twice it
    /// by default).
    #[arg(long, value_delimiter = ',')]
    pub(super) slots: Vec<usize>,
}

pub(super) async fn run(config: &Config, args: PlanArgs) -> anyhow::Result<()> {
    let inputs = inputs(config, &args.scenario, args.country.as_deref()).await?;
    let made = plan::plan(inputs, &args.scenario.slots);
    match args.json {
        true => println!("{}", serde_json::to_string(&made)?),
        false => print!("{}", words::text(&made, shared_store(config))),
    }
    Ok(())
}

/// What the arguments, the configuration and the priors give; `country` names the audience's
/// for Meta's price.
pub(super) async fn inputs(
    config: &Config,
    args: &ScenarioArgs,
    country: Option<&str>,
) -> anyhow::Result<Inputs> {
    counts(args)?;
    let mut scenario = Scenario::prior(args.audience);
    let needs_store =
        args.reply_curve.as_deref() == Some("auto") || args.local_share.as_deref() == Some("auto");
    let store = match needs_store {
        true => Some(store::open(config).await?),
        false => None,
    };
    if let Some(curve) = &args.reply_curve {
        read_curve(&mut scenario, curve, store.as_deref()).await?;
    }
    if let Some(rate) = args.reply_rate {
        anyhow::ensure!(
            (0.0..=1.0).contains(&rate),
            "--reply-rate: a share from 0 to 1; found {rate}"
        );
        scenario.reply_rate = rate;
    }
    if let Some(turns) = args.turns_per_customer {
        anyhow::ensure!(
            turns >= 1.0,
            "--turns-per-customer: at least 1; found {turns}"
        );
        scenario.turns_per_customer = turns;
    }
    match (args.local_share.as_deref(), store.as_deref()) {
        (Some("auto"), Some(store)) => scenario.local_share = measured_local_share(store).await?,
        (Some(share), _) => {
            let share: f64 = share
                .parse()
                .with_context(|| format!("--local-share: a share, or auto; found {share:?}"))?;
            anyhow::ensure!(
                (0.0..=1.0).contains(&share),
                "--local-share: from 0 to 1; found {share}"
            );
            scenario.local_share = share;
        }
        (None, _) => {}
    }
    if let Some(latency) = &args.llm_latency {
        (scenario.llm_p50, scenario.llm_p95) = latencies("--llm-latency", latency)?;
    }
    if let Some(tokens) = &args.llm_tokens {
        let (prompt, completion) = tokens_of(tokens)?;
        scenario.tokens_per_model_turn = prompt + completion;
        scenario.completion_tokens_per_model_turn = completion;
    }
    scenario.llm_rpm = args.llm_rpm.or(config.llm.budget.requests_per_minute);
    scenario.llm_tpm = args.llm_tpm.or(config.llm.budget.tokens_per_minute);
    scenario.llm_concurrent = Some(config.llm.budget.max_concurrent);
    let engine = &config.engine;
    let sizing = Sizing {
        slots: 0,
        slots_per_node: engine.turns_per_node,
        // The plan fills these once the sends are paced.
        recipients: 0,
        send_over: 0.0,
        batch_window: plan::seconds(config.whatsapp.batch_window),
        hold_after: plan::seconds(engine.hold_after),
        review_after: plan::seconds(engine.review_after),
        queued_review_after: engine.queued_review_after.map(plan::seconds),
    };
    let pace = Pace {
        asked: asked(args)?,
        number_rate: config.whatsapp.outbound_rate,
        messaging_limit: args
            .messaging_limit
            .unwrap_or(config.whatsapp.messaging_limit)
            .0,
    };
    let pricing = Pricing {
        currency: config.broadcast.currency.clone(),
        per_message: message_price(
            &config.broadcast.prices,
            country.or(config.whatsapp.default_country.as_deref()),
        )?,
        prompt_price: config.llm.prompt_price,
        completion_price: config.llm.completion_price,
    };
    Ok(Inputs {
        scenario,
        sizing,
        pace,
        pricing,
    })
}

/// The counts that must not be 0: the audience, the provider's limits, the turns at once.
fn counts(args: &ScenarioArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.audience > 0,
        "--audience: at least 1 customer; found 0"
    );
    for (flag, limit) in [("--llm-rpm", args.llm_rpm), ("--llm-tpm", args.llm_tpm)] {
        anyhow::ensure!(limit != Some(0), "{flag}: more than 0 a minute; found 0");
    }
    anyhow::ensure!(
        !args.slots.contains(&0),
        "--slots: at least 1 turn at once each; found 0"
    );
    Ok(())
}

/// The sends' pace as asked: a rate, a span, or a broadcast's default.
fn asked(args: &ScenarioArgs) -> anyhow::Result<Asked> {
    match (args.send_rate, args.send_over) {
        (Some(rate), _) => {
            anyhow::ensure!(
                rate.is_finite() && rate > 0.0,
                "--send-rate: messages a second, more than 0; found {rate}"
            );
            Ok(Asked::Rate(rate))
        }
        (None, Some(over)) => {
            anyhow::ensure!(
                !over.is_zero(),
                "--send-over: a time the sends take, like 2h; found 0s"
            );
            Ok(Asked::Over(over.as_secs_f64()))
        }
        (None, None) => Ok(Asked::Default),
    }
}

/// `--messaging-limit`: customers a day, or `unlimited`.
fn messaging_limit(given: &str) -> Result<MessagingLimit, String> {
    match given.trim() {
        text if text.eq_ignore_ascii_case("unlimited") => Ok(MessagingLimit(None)),
        text => match text.parse::<u64>() {
            Ok(n) if n > 0 => Ok(MessagingLimit(Some(n))),
            _ => Err(format!(
                "customers a day (like 250, 2000, 10000, 100000), or unlimited; found {given:?}"
            )),
        },
    }
}

/// `--llm-tokens PROMPT,COMPLETION`.
fn tokens_of(given: &str) -> anyhow::Result<(u32, u32)> {
    let bad = || {
        anyhow::anyhow!(
            "--llm-tokens: tokens a model turn sends and receives, like 2700,300; found {given:?}"
        )
    };
    let (prompt, completion) = given.split_once(',').ok_or_else(bad)?;
    let prompt: u32 = prompt.trim().parse().map_err(|_| bad())?;
    let completion: u32 = completion.trim().parse().map_err(|_| bad())?;
    anyhow::ensure!(
        prompt.checked_add(completion).is_some_and(|all| all > 0),
        "--llm-tokens: more than 0 tokens in all; found {given:?}"
    );
    Ok((prompt, completion))
}

/// Meta's price of one template message in the audience's country (`--country`, else
/// `broadcast.prices`' only entry), or why there is none.
///
/// # Errors
/// When `--country` is not a country calling code.
fn message_price(
    prices: &BTreeMap<String, f64>,
    country: Option<&str>,
) -> anyhow::Result<Result<MessagePrice, String>> {
    let listed = || prices.keys().cloned().collect::<Vec<_>>().join(", ");
    let Some(given) = country else {
        return Ok(match prices.iter().collect::<Vec<_>>()[..] {
            [] => Err("broadcast.prices is empty".into()),
            [(country, price)] => Ok(MessagePrice {
                country: country.clone(),
                price: *price,
            }),
            _ => Err(format!(
                "broadcast.prices has several countries ({}): name the audience's with --country",
                listed()
            )),
        });
    };
    let code = given.trim().trim_start_matches('+');
    anyhow::ensure!(
        (1..=3).contains(&code.len()) && code.bytes().all(|b| b.is_ascii_digit()),
        "--country: a country calling code, like 234; found {given:?}"
    );
    // The longest prefix priced, as a report prices a number.
    let price = (1..=code.len())
        .rev()
        .find_map(|n| prices.get_key_value(&code[..n]));
    Ok(match price {
        Some((_, price)) => Ok(MessagePrice {
            country: code.to_owned(),
            price: *price,
        }),
        None if prices.is_empty() => Err("broadcast.prices is empty".into()),
        None => Err(format!(
            "broadcast.prices has no price for country {code} (it has {})",
            listed()
        )),
    })
}

/// The store the nodes would share, by name; `None` for SQLite.
fn shared_store(config: &Config) -> words::SharedStore {
    match config.store {
        StoreConfig::Sqlite { .. } => None,
        StoreConfig::Postgres { .. } => Some("PostgreSQL"),
        StoreConfig::Redis { .. } => Some("Redis"),
    }
}

/// The curve (and, from a store, the reply rate) of earlier replies.
async fn read_curve(
    scenario: &mut Scenario,
    given: &str,
    store: Option<&dyn Store>,
) -> anyhow::Result<()> {
    let report: Value = match (given, store) {
        ("auto", Some(store)) => latest_report(store).await?,
        (path, _) => {
            let text = std::fs::read_to_string(PathBuf::from(path))
                .with_context(|| format!("--reply-curve: reading {path}"))?;
            serde_json::from_str(&text).with_context(|| format!("--reply-curve: {path}"))?
        }
    };
    let (minutes, later) = match &report {
        Value::Array(_) => (&report, 0.0),
        _ => (
            &report["reply_curve"],
            report["replies_later"].as_f64().unwrap_or(0.0),
        ),
    };
    let per_minute: Vec<f64> = minutes
        .as_array()
        .context("--reply-curve: a JSON array of replies per minute, or a broadcast report")?
        .iter()
        .map(|n| n.as_f64().context("--reply-curve: numbers only"))
        .collect::<anyhow::Result<_>>()?;
    scenario.curve =
        Curve::from_minutes(&per_minute, later).context("--reply-curve: it counts no replies")?;
    if given == "auto"
        && let Some(rate) = report["rates"]["replied"].as_f64()
    {
        scenario.reply_rate = rate;
    }
    Ok(())
}

/// The report of the latest finished broadcast that someone replied to.
async fn latest_report(store: &dyn Store) -> anyhow::Result<Value> {
    let prices = Prices {
        by_prefix: &Default::default(),
        currency: "",
    };
    for b in store.broadcasts(50).await? {
        if b.state != BroadcastState::Finished {
            continue;
        }
        let Some(report) = report::report(store, b.id, &prices).await? else {
            continue;
        };
        if report.rates.replied > 0.0 {
            return Ok(serde_json::to_value(report)?);
        }
    }
    anyhow::bail!("--reply-curve auto: no finished broadcast in this store has replies yet")
}

/// The share of the last week's turns the router answered without the model.
async fn measured_local_share(store: &dyn Inspection) -> anyhow::Result<f64> {
    let since = SystemClock.now() - Duration::from_secs(7 * 24 * 3_600);
    let stats = store.turn_stats(At::max(since, At::default())).await?;
    let answered = stats.local + stats.agent;
    anyhow::ensure!(
        answered > 0,
        "--local-share auto: this store has no answered turns in the last week"
    );
    Ok(stats.local as f64 / answered as f64)
}

/// A latency option's `P50,P95` in seconds; `flag` names the option in errors.
pub(super) fn latencies(flag: &str, given: &str) -> anyhow::Result<(f64, f64)> {
    let bad = || anyhow::anyhow!("{flag}: seconds as P50,P95, like 5,12; found {given:?}");
    let (p50, p95) = given.split_once(',').ok_or_else(bad)?;
    let (p50, p95): (f64, f64) = (
        p50.trim().parse().map_err(|_| bad())?,
        p95.trim().parse().map_err(|_| bad())?,
    );
    anyhow::ensure!(
        p50 > 0.0 && p95 >= p50,
        "{flag}: 0 < P50 <= P95; found {given:?}"
    );
    Ok((p50, p95))
}

pub(super) fn print_rows(rows: &[Row], sizing: &Sizing) {
    let late = format!("late{}", shown(sizing.review_after).replace(' ', ""));
    println!(
        "{:>6} {:>10} {:>5} {:>9} {:>9} {:>9} {:>12} {:>6} {:>8} {:>8} {:>9} {:>10} {:>11}",
        "slots",
        "arrivals/s",
        "busy",
        "wait p50",
        "p95",
        "max",
        "reply p95",
        "queue",
        "holding",
        late,
        "to review",
        "calls/min",
        "tokens/min"
    );
    for r in rows {
        println!(
            "{:>6} {:>10.2} {:>4.0}% {:>9} {:>9} {:>9} {:>12} {:>6} {:>8} {:>8} {:>9} {:>10} {:>11}",
            r.slots,
            r.peak_arrivals_per_s,
            r.utilisation * 100.0,
            shown(r.p50_wait_s),
            shown(r.p95_wait_s),
            shown(r.max_wait_s),
            shown(r.p95_reply_s),
            r.max_queue,
            r.holding_messages,
            r.over_review_age,
            r.review_spill,
            budgeted(r.peak_model_calls_per_min as u64, r.rpm_budget),
            budgeted(r.peak_tokens_per_min, r.tpm_budget),
        );
    }
}

pub(super) fn print_recommended(rec: &Recommended) {
    println!(
        "recommended: {} turns at once ({} node{} of {}), sends over {}: p95 wait {}{}",
        rec.slots,
        rec.nodes,
        if rec.nodes == 1 { "" } else { "s" },
        rec.slots_per_node,
        shown(rec.send_over_s),
        shown(rec.p95_wait_s),
        if rec.meets_target {
            ""
        } else {
            " (the model's limits keep it above engine.hold_after even so)"
        },
    );
}

/// A peak a minute, with the budget it is held to.
fn budgeted(peak: u64, budget: Option<u32>) -> String {
    match budget {
        Some(budget) => format!("{peak}/{budget}"),
        None => peak.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prices(entries: &[(&str, f64)]) -> BTreeMap<String, f64> {
        entries.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    #[test]
    fn metas_price_is_the_audiences_country_or_the_only_one() {
        let one = prices(&[("234", 0.05)]);
        let several = prices(&[("234", 0.05), ("44", 0.07), ("1", 0.025)]);
        let priced = |p: &BTreeMap<String, f64>, c: Option<&str>| {
            message_price(p, c)
                .expect("a country code")
                .map(|m| (m.country, m.price))
        };
        assert_eq!(priced(&one, None), Ok(("234".into(), 0.05)));
        assert_eq!(priced(&several, Some("+44")), Ok(("44".into(), 0.07)));
        // The longest prefix priced: 1 prices 1 and every code under it.
        assert_eq!(priced(&several, Some("1")), Ok(("1".into(), 0.025)));
        let unpriced = |p, c| priced(p, c).expect_err("no price");
        assert!(unpriced(&several, None).contains("--country"));
        assert!(unpriced(&several, Some("91")).contains("no price for country 91"));
        assert!(unpriced(&prices(&[]), None).contains("broadcast.prices is empty"));
        let bad = message_price(&one, Some("0803")).expect_err("not a code");
        assert!(bad.to_string().contains("--country"), "{bad}");
    }

    #[test]
    fn a_messaging_limit_is_customers_a_day_or_unlimited() {
        assert_eq!(messaging_limit("250"), Ok(MessagingLimit(Some(250))));
        assert_eq!(messaging_limit(" Unlimited"), Ok(MessagingLimit(None)));
        for bad in ["0", "-5", "lots", ""] {
            let said = messaging_limit(bad).expect_err("refused");
            assert!(said.contains(&format!("found {bad:?}")), "{said}");
        }
    }
}
