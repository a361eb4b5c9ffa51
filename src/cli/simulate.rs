//! `sabi simulate`: the surge `sabi plan` sizes, played against the real engine on virtual
//! time (see [`crate::simulate`]), or in real time against running nodes (`--webhook`).

use std::net::SocketAddr;

use anyhow::Context;
use clap::Args;
use serde_json::json;

use super::plan::{ScenarioArgs, inputs, latencies, print_recommended, print_rows};
use crate::config::Config;
use crate::plan::{self, Sizing, shown, words};
use crate::simulate::{self, Customers, Remote};

#[derive(Debug, Args)]
pub(super) struct SimulateArgs {
    #[command(flatten)]
    scenario: ScenarioArgs,
    #[arg(long)]
    json: bool,
    /// Play the crowd in real time against nodes already running, posting to this WhatsApp
    /// webhook URL (signed with the configured app secret); the nodes must send through
    /// --graph-listen and ask the model at --model-listen.
    #[arg(long, requires_all = ["graph_listen", "model_listen"])]
    webhook: Option<String>,
    /// With --webhook: where the fake Graph API listens.
    #[arg(long, requires = "webhook")]
    graph_listen: Option<SocketAddr>,
    /// With --webhook: where the fake model listens.
    #[arg(long, requires = "webhook")]
    model_listen: Option<SocketAddr>,
    /// With --webhook: how long the fake Graph API takes to answer a send, seconds as P50,P95
    /// (like 0.3,1.5; at once by default). A node killed meanwhile leaves the send unknown.
    #[arg(long, requires = "webhook")]
    graph_latency: Option<String>,
    /// With --webhook: the fake Graph API sends Meta's `sent` status webhook for each accepted
    /// send a second after its answer, as Meta does, to the same webhook URL.
    #[arg(long, requires = "webhook")]
    graph_statuses: bool,
}

pub(super) async fn run(config: &Config, args: SimulateArgs) -> anyhow::Result<()> {
    // The plan paces the sends: the crowd is one surge's, as the plan plays it.
    let planned = plan::plan(
        inputs(config, &args.scenario, None).await?,
        &args.scenario.slots,
    );
    let (scenario, sizing) = (planned.scenario.clone(), planned.sizing.clone());
    if let Some(webhook) = args.webhook {
        let remote = Remote {
            webhook,
            app_secret: config
                .whatsapp
                .app_secrets()
                .into_iter()
                .next()
                .context("no app secret")?,
            graph: args.graph_listen.context("--graph-listen")?,
            model: args.model_listen.context("--model-listen")?,
            graph_latency: args
                .graph_latency
                .as_deref()
                .map(|l| latencies("--graph-latency", l))
                .transpose()?,
            graph_statuses: args.graph_statuses,
        };
        let seen = simulate::against(config, &scenario, &sizing, remote).await?;
        match args.json {
            true => println!("{}", serde_json::to_string(&seen)?),
            false => print_customers(&[(args.scenario.slots.first().copied().unwrap_or(0), &seen)]),
        }
        return Ok(());
    }
    let mut rows = Vec::new();
    for row in &planned.rows {
        let sized = Sizing {
            slots: row.slots,
            ..sizing.clone()
        };
        let config = config.clone();
        let scenario = scenario.clone();
        // Each run has a runtime of its own on its own thread.
        rows.push(tokio::task::spawn_blocking(move || {
            simulate::simulate(&config, &scenario, &sized)
        }));
    }
    let mut measured = Vec::new();
    for row in rows {
        measured.push(row.await.context("a simulation stopped")??);
    }
    if args.json {
        let out = json!({
            "scenario": planned.scenario,
            "sizing": planned.sizing,
            "sends": planned.sends,
            "rows": measured,
            "planned": planned.rows,
            "recommended": planned.recommended,
            "warnings": planned.warnings,
        });
        println!("{out}");
        return Ok(());
    }
    print!("{}", words::audience(&planned.scenario));
    for line in words::sends(&planned.sends) {
        println!("{line}");
    }
    println!("measured:");
    let rows: Vec<_> = measured.iter().map(|m| m.row.clone()).collect();
    print_rows(&rows, &planned.sizing);
    let seen: Vec<(usize, &Customers)> = measured
        .iter()
        .map(|m| (m.row.slots, &m.customers))
        .collect();
    print_customers(&seen);
    println!("planned:");
    print_rows(&planned.rows, &planned.sizing);
    print_recommended(&planned.recommended);
    for m in &measured {
        println!(
            "({} slots simulated in {:.0} s)",
            m.row.slots, m.real_seconds
        );
    }
    Ok(())
}

fn print_customers(rows: &[(usize, &Customers)]) {
    println!(
        "{:>6} {:>9} {:>9} {:>10} {:>10} {:>10} {:>8} {:>8} {:>10}",
        "slots", "messages", "answered", "reply p50", "p95", "max", "holding", "calls", "throttled"
    );
    for (slots, c) in rows {
        println!(
            "{:>6} {:>9} {:>9} {:>10} {:>10} {:>10} {:>8} {:>8} {:>10}",
            slots,
            c.messages,
            c.answered,
            shown(c.p50_reply_s),
            shown(c.p95_reply_s),
            shown(c.max_reply_s),
            c.holding_messages,
            c.model_calls,
            c.throttled_calls,
        );
    }
}
