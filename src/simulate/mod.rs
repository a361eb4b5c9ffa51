//! `sabi simulate`: a broadcast's surge of replies played against the real engine.
//!
//! The nodes `sabi plan` sizes (`engine.turns_per_node` turns each) run as `sabi serve` would
//! (ingress, scheduler, holder, sender, the router with the configured intents, the agent) on
//! one temporary SQLite store. Their Graph API and model are
//! local fakes (`fakes`): the model answers after a log-normal time with the scenario's
//! median and 95th percentile and refuses calls over the provider's per-minute limits.
//! Simulated customers ([`crowd`]) write through the signed webhook along the reply curve and
//! write again after each answer.
//!
//! Time is virtual: the run has a current-thread runtime of its own whose clock is paused, so
//! tokio moves it to the next timer whenever every task waits. A day of replies takes
//! seconds, and what takes time in the figures is what takes time in the engine's own
//! clock: batch windows, queues, model calls, pacing. SQLite's writes are awaited on blocking
//! threads, which keeps the clock still while a commit is on disk.
//!
//! [`against`] plays the same crowd in real time against nodes running elsewhere, with the
//! fakes on given ports (`bench/surge.sh`).

pub mod crowd;
mod fakes;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::FutureExt;
use secrecy::SecretString;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::crowd::{Crowd, Messages, Seen};
use self::fakes::{Call, GraphShape, ModelLog, ModelShape, StatusSink};
use crate::app::{App, Role};
use crate::clock::{At, Clock, SharedClock, SystemClock, TokioClock};
use crate::config::Config;
use crate::plan::{self, Row, Scenario, Sizing, Turn, percentile};
use crate::router::Router;
use crate::store::{SqliteStore, Store};

/// What customers saw, measured at the fakes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Customers {
    /// Messages customers wrote, and how many were answered before the run ended.
    pub messages: usize,
    pub answered: usize,
    /// From a customer's message to its answer (a holding message is not one).
    pub p50_reply_s: f64,
    pub p95_reply_s: f64,
    pub max_reply_s: f64,
    pub holding_messages: usize,
    pub model_calls: usize,
    /// Calls the model refused as over the provider's limits (429).
    pub throttled_calls: usize,
    pub peak_model_calls_per_min: usize,
    pub peak_tokens_per_min: u64,
}

/// One simulated run: the plan's row, measured.
#[derive(Debug, Clone, Serialize)]
pub struct Simulated {
    #[serde(flatten)]
    pub row: Row,
    pub customers: Customers,
    /// How long the run took on this machine.
    pub real_seconds: f64,
}

/// The business number the crowd writes to.
const BUSINESS: &str = "100000000000001";
/// How often the simulated node looks for work it was not told of.
const NODE_POLL: Duration = Duration::from_secs(60);
/// How long a customer waits for an answer before the run gives up on it.
const PATIENCE: Duration = Duration::from_secs(3_600);

/// Plays `scenario` against one node with `sizing.slots` turns at once, on virtual time.
///
/// # Errors
/// When the node cannot start (its configuration, the temporary store).
pub fn simulate(
    config: &Config,
    scenario: &Scenario,
    sizing: &Sizing,
) -> anyhow::Result<Simulated> {
    let (config, scenario, sizing) = (config.clone(), scenario.clone(), sizing.clone());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .context("building the simulation's runtime")?;
        runtime.block_on(run_virtual(&config, &scenario, &sizing))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the simulation panicked"))?
}

/// Where the engine under test is, for [`against`].
#[derive(Debug, Clone)]
pub struct Remote {
    /// The WhatsApp webhook URL of the nodes' ingress.
    pub webhook: String,
    pub app_secret: SecretString,
    /// Where the fake Graph API and the fake model listen (the nodes are configured with them).
    pub graph: SocketAddr,
    pub model: SocketAddr,
    /// The fake Graph API's answer time, seconds: median and 95th percentile (at once if none).
    pub graph_latency: Option<(f64, f64)>,
    /// Whether the fake Graph API sends Meta's `sent` status webhook for each accepted send.
    pub graph_statuses: bool,
}

/// Plays `scenario` in real time against nodes running elsewhere; only what customers saw is
/// measured.
///
/// # Errors
/// When a fake cannot listen, or the router cannot be trained.
pub async fn against(
    config: &Config,
    scenario: &Scenario,
    sizing: &Sizing,
    remote: Remote,
) -> anyhow::Result<Customers> {
    let clock: SharedClock = Arc::new(SystemClock);
    let started = clock.now();
    let shape = GraphShape {
        latency: remote.graph_latency,
        statuses: remote.graph_statuses.then(|| StatusSink {
            webhook: remote.webhook.clone(),
            secret: remote.app_secret.clone(),
        }),
    };
    let listen = (Some(remote.graph), Some(remote.model));
    let (log, delivered) = start_fakes(config, scenario, &clock, listen, shape)
        .await?
        .into_parts();
    let seen = crowd(config, scenario, clock, remote.webhook, remote.app_secret)?
        .run(started, &repliers(scenario, sizing), delivered)
        .await;
    Ok(customers(&seen, &log.calls()))
}

async fn run_virtual(
    config: &Config,
    scenario: &Scenario,
    sizing: &Sizing,
) -> anyhow::Result<Simulated> {
    let real = Instant::now();
    let origin = SystemClock.now();
    let clock: SharedClock = Arc::new(TokioClock::starting_at(origin));
    let fakes = start_fakes(
        config,
        scenario,
        &clock,
        (None, None),
        GraphShape::default(),
    )
    .await?;
    let secret = SecretString::from(format!("simulated-{:x}", fastrand::u64(..)));
    let dir = TempDir::new()?;
    let store: Arc<dyn Store> = Arc::new(
        // A throwaway store: its markers need no lasting secret.
        SqliteStore::open_on_paused_time(
            &dir.0.join("sabi.db"),
            crate::store::Marks::new(
                SecretString::from(format!("simulated-{:x}", fastrand::u64(..))),
                Vec::new(),
            ),
        )
        .await
        .context("opening the simulation's store")?,
    );
    // The slots take as many nodes as `sabi plan` says, sharing the store: the first serves
    // the webhook too.
    let per_node = sizing.slots_per_node.max(1);
    let nodes = sizing.slots.div_ceil(per_node).max(1);
    let (mut left, mut addr, mut running) = (sizing.slots.max(1), None, Vec::new());
    let shutdown = CancellationToken::new();
    for n in 0..nodes {
        let turns = left.min(per_node);
        left -= turns;
        let node = node_config(config, scenario, (nodes, turns), &fakes, &secret);
        let role = if n == 0 { Role::All } else { Role::Worker };
        let app = App::build_on(&node, role, clock.clone(), store.clone(), None).await?;
        addr = addr.or(app.addr());
        let stop = app.shutdown_token();
        tokio::spawn(
            shutdown
                .clone()
                .cancelled_owned()
                .map(move |()| stop.cancel()),
        );
        running.push(tokio::spawn(app.run_until_stopped()));
    }
    let addr = addr.context("the node has no address")?;
    let (log, delivered) = fakes.into_parts();
    let webhook = format!("http://{addr}/webhook/whatsapp");
    let seen = crowd(config, scenario, clock, webhook, secret)?
        .run(origin, &repliers(scenario, sizing), delivered)
        .await;
    shutdown.cancel();
    for node in running {
        node.await.context("a node panicked")??;
    }
    drop(store);
    let turns = timings(&dir.0.join("sabi.db"), origin)?;
    let customers = customers(&seen, &log.calls());
    let mut row = plan::measure(&turns, scenario, sizing);
    row.p95_reply_s = customers.p95_reply_s;
    row.holding_messages = customers.holding_messages;
    row.model_calls = customers.model_calls;
    row.peak_model_calls_per_min = customers.peak_model_calls_per_min;
    row.peak_tokens_per_min = customers.peak_tokens_per_min;
    row.review_spill = review_count(&dir.0.join("sabi.db"))?;
    Ok(Simulated {
        row,
        customers,
        real_seconds: real.elapsed().as_secs_f64(),
    })
}

/// The fakes, running.
struct Fakes {
    graph: SocketAddr,
    model: SocketAddr,
    log: ModelLog,
    delivered: mpsc::UnboundedReceiver<fakes::Delivered>,
}

impl Fakes {
    fn into_parts(self) -> (ModelLog, mpsc::UnboundedReceiver<fakes::Delivered>) {
        (self.log, self.delivered)
    }
}

async fn start_fakes(
    config: &Config,
    scenario: &Scenario,
    clock: &SharedClock,
    (graph, model): (Option<SocketAddr>, Option<SocketAddr>),
    shape: GraphShape,
) -> anyhow::Result<Fakes> {
    let graph_listener = fakes::listen(graph).await.context("the fake Graph API")?;
    let model_listener = fakes::listen(model).await.context("the fake model")?;
    let (graph, model) = (graph_listener.local_addr()?, model_listener.local_addr()?);
    let (tell, delivered) = mpsc::unbounded_channel();
    fakes::serve_graph(
        graph_listener,
        clock.clone(),
        &config.engine.hold_message,
        shape,
        tell,
    );
    let shape = ModelShape {
        p50: scenario.llm_p50,
        p95: scenario.llm_p95,
        requests_per_minute: scenario.llm_rpm,
        tokens_per_minute: scenario.llm_tpm,
        seed: scenario.seed,
    };
    let log = fakes::serve_model(model_listener, clock.clone(), shape);
    Ok(Fakes {
        graph,
        model,
        log,
        delivered,
    })
}

/// One of `nodes` nodes as `sabi serve` would run it with `turns` turns, sending through the
/// fakes.
fn node_config(
    config: &Config,
    scenario: &Scenario,
    (nodes, turns): (usize, usize),
    fakes: &Fakes,
    secret: &SecretString,
) -> Config {
    let mut node = config.clone();
    node.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    node.external_agent = None;
    node.whatsapp.app_secret = Some(secret.clone());
    node.whatsapp.previous_app_secret = None;
    node.whatsapp.access_token = Some(SecretString::from("simulated".to_owned()));
    node.whatsapp.api_base = format!("http://{}/v23.0", fakes.graph);
    node.llm.base_url = Some(format!("http://{}/v1", fakes.model));
    node.llm.model = Some("simulated".into());
    node.llm.api_key = None;
    node.llm.fallback = None;
    // Each node has its share of the provider's limits, as the README says to give them.
    let share = |limit: u32| (limit / u32::try_from(nodes).unwrap_or(u32::MAX)).max(1);
    node.llm.budget.requests_per_minute = scenario.llm_rpm.map(share);
    node.llm.budget.tokens_per_minute = scenario.llm_tpm.map(share);
    node.engine.turns_per_node = turns;
    // A lone node wakes its own loops whenever it stores work; polls look for other nodes'
    // work, and over a virtual day each would cost a store read a second.
    if nodes == 1 {
        node.engine.poll_interval = NODE_POLL;
    }
    node
}

fn crowd(
    config: &Config,
    scenario: &Scenario,
    clock: SharedClock,
    webhook: String,
    secret: SecretString,
) -> anyhow::Result<Crowd> {
    let source = config.router.intents_source()?;
    let router = match config.router.enabled {
        true => Some(Router::shared(&source)?),
        false => None,
    };
    let messages = Messages::from_intents(&source, router.as_deref())?;
    anyhow::ensure!(
        scenario.local_share == 0.0 || !messages.local.is_empty(),
        "--local-share: the router answers none of the intents' examples itself"
    );
    anyhow::ensure!(
        scenario.local_share == 1.0 || !messages.model.is_empty(),
        "--local-share: the intents file has no example the router hands to the model"
    );
    Ok(Crowd {
        clock,
        webhook,
        secret,
        business: BUSINESS.into(),
        messages,
        local_share: scenario.local_share,
        think: Duration::from_secs_f64(scenario.think_seconds),
        patience: PATIENCE,
        seed: scenario.seed,
    })
}

/// The same customers `sabi plan` plays out.
fn repliers(scenario: &Scenario, sizing: &Sizing) -> Vec<plan::queue::Replier> {
    let mut rng = fastrand::Rng::with_seed(scenario.seed);
    plan::queue::repliers(scenario, sizing, &mut rng)
}

fn customers(seen: &Seen, calls: &[Call]) -> Customers {
    let mut replies: Vec<f64> = seen
        .exchanges
        .iter()
        .filter_map(|e| e.answered.map(|at| at.since(e.sent).as_secs_f64()))
        .collect();
    replies.sort_by(f64::total_cmp);
    let accepted: Vec<&Call> = calls.iter().filter(|c| !c.throttled).collect();
    Customers {
        messages: seen.exchanges.len(),
        answered: replies.len(),
        p50_reply_s: percentile(&replies, 0.5),
        p95_reply_s: percentile(&replies, 0.95),
        max_reply_s: replies.last().copied().unwrap_or(0.0),
        holding_messages: seen.holding_messages,
        model_calls: accepted.len(),
        throttled_calls: calls.len() - accepted.len(),
        peak_model_calls_per_min: peak_per_minute(accepted.iter().map(|c| (c.at, 1))) as usize,
        peak_tokens_per_min: peak_per_minute(accepted.iter().map(|c| (c.at, c.tokens))),
    }
}

/// The most of a count within any one minute.
fn peak_per_minute(events: impl Iterator<Item = (At, u64)>) -> u64 {
    let mut events: Vec<(At, u64)> = events.collect();
    events.sort_by_key(|e| e.0);
    let (mut first, mut sum, mut peak) = (0, 0, 0);
    for i in 0..events.len() {
        sum += events[i].1;
        while events[i].0.since(events[first].0) >= Duration::from_secs(60) {
            sum -= events[first].1;
            first += 1;
        }
        peak = peak.max(sum);
    }
    peak
}

/// Every turn the engine ran, from its store: when its batch fell due, when a slot took it,
/// when it ended, and whether the model answered it.
fn timings(db: &Path, origin: At) -> anyhow::Result<Vec<Turn>> {
    let conn = rusqlite::Connection::open(db)?;
    let seconds = |millis: i64| (millis - origin.millis()) as f64 / 1_000.0;
    let mut statement = conn.prepare(
        "SELECT due_at, started_at, finished_at, coalesce(route_local, 0) FROM batches
         WHERE state = 'done' AND finished_at IS NOT NULL",
    )?;
    let turns = statement
        .query_map([], |r| {
            Ok(Turn {
                due: seconds(r.get(0)?),
                start: seconds(r.get(1)?),
                end: seconds(r.get(2)?),
                model: r.get::<_, i64>(3)? == 0,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(turns)
}

/// Batches that went to people instead of an answer.
fn review_count(db: &Path) -> anyhow::Result<usize> {
    let conn = rusqlite::Connection::open(db)?;
    let count: i64 = conn.query_row(
        "SELECT count(*) FROM batches WHERE state = 'review'",
        [],
        |r| r.get(0),
    )?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// A directory of the run's own, removed after it.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<TempDir> {
        let dir = std::env::temp_dir().join(format!(
            "sabi-simulate-{}-{:x}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
