//! Engine benchmark: 10,000 conversations with 3 messages each through the scheduler with a
//! handler that does nothing, on the SQLite store (durable commits), on the real clock.
//!
//! `cargo bench --bench engine` prints:
//! - backlog: all 30,000 messages stored first, then turns/s while the scheduler drains them;
//! - steady: conversations arriving at a fixed rate, and the delay from each batch's due time to
//!   its handler's start (p50/p99) — the in-process wake-up at work;
//! - store round trips per message (every store call counted, ingest included).
//!
//! Every figure comes for each backend in the same run: SQLite, then PostgreSQL (the local
//! server, or `ENGINE_BENCH_POSTGRES`), then Redis (a server of the bench's own with its
//! append-only file flushed on every write, or `ENGINE_BENCH_REDIS`), each on a fresh store.
//!
//! `ENGINE_BENCH_CONVERSATIONS` changes the conversation count, `ENGINE_BENCH_RATE` the steady
//! arrival rate (1,000 conversations/s). Under `cargo test` it runs
//! with 100 conversations, as a smoke check that the benchmark still works.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sabi::clock::{self, At, Clock, SystemClock, UnixSeconds};
use sabi::config::{EnginePolicy, EngineSettings};
use sabi::domain::{
    Batch, BatchPolicy, Channel, Claim, ConversationKey, InboundItem, ItemKind, LeaseToken,
    ReplyPart,
};
use sabi::store::{
    self, Ending, HistoryEntry, Holding, Ingest, RouteGuess, Store, TurnUsage, Turns,
};
use sabi::turn::{TurnError, TurnHandler, TurnOutcome};
use sabi::worker::Scheduler;
use tokio_util::sync::CancellationToken;

#[path = "support/stores.rs"]
mod stores;

use self::stores::{Backend, Place};

const MESSAGES_PER_CONVERSATION: usize = 3;

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this as a quick smoke check.
    let full = std::env::args().any(|a| a == "--bench");
    let conversations: usize = std::env::var("ENGINE_BENCH_CONVERSATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 10_000 } else { 100 });
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        println!("engine bench: {conversations} conversations x {MESSAGES_PER_CONVERSATION} messages, 5 turns at once, durable commits");
        let server = std::env::var("ENGINE_BENCH_POSTGRES")
            .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432".to_owned());
        let redis = std::env::var("ENGINE_BENCH_REDIS").ok();
        for backend in [Backend::Sqlite, Backend::Postgres(server), Backend::Redis(redis)] {
            println!("-- {}", backend.name());
            backlog(&backend, conversations).await;
            steady(&backend, conversations).await;
        }
    });
}

/// Everything stored first (timed: ingest throughput, 256 deliveries in flight); then how fast
/// the scheduler turns it over.
async fn backlog(backend: &Backend, conversations: usize) {
    let (store, _place) = CountingStore::open(backend).await;
    let ingest_started = Instant::now();
    ingest_all(&store, 0..conversations, Duration::ZERO).await;
    let ingest_took = ingest_started.elapsed();
    let (handler, scheduler) = scheduler_over(&store);
    let started = Instant::now();
    let stop = CancellationToken::new();
    let run = tokio::spawn(scheduler.clone().run(stop.clone()));
    handler.wait_for(conversations).await;
    let elapsed = started.elapsed();
    stop.cancel();
    run.await.expect("scheduler");
    let engine_calls = store.calls();
    // Each message went as its own delivery: one ingest call each.
    let ingest_calls = (conversations * MESSAGES_PER_CONVERSATION) as u64;
    let messages = (conversations * MESSAGES_PER_CONVERSATION) as f64;
    println!(
        "ingest: {:.0} deliveries/s (one message each, durable)",
        messages / ingest_took.as_secs_f64()
    );
    println!(
        "backlog: {} turns in {:.2} s = {:.0} turns/s; store round trips per message: {:.2} (ingest {:.2}, engine {:.2})",
        conversations,
        elapsed.as_secs_f64(),
        conversations as f64 / elapsed.as_secs_f64(),
        (ingest_calls + engine_calls) as f64 / messages,
        ingest_calls as f64 / messages,
        engine_calls as f64 / messages,
    );
}

/// Conversations arrive at a fixed rate while the scheduler runs: the delay from due to start.
async fn steady(backend: &Backend, conversations: usize) {
    let (store, _place) = CountingStore::open(backend).await;
    let (handler, scheduler) = scheduler_over(&store);
    let stop = CancellationToken::new();
    let run = tokio::spawn(scheduler.clone().run(stop.clone()));
    // New conversations per second.
    let rate: f64 = std::env::var("ENGINE_BENCH_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000.0);
    let window = Duration::from_millis(50);
    let started = Instant::now();
    let mut senders = tokio::task::JoinSet::new();
    for n in 0..conversations {
        let due = started + Duration::from_secs_f64(n as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
        let (store, wakeup) = (store.clone(), scheduler.wakeup());
        senders.spawn(async move {
            if let Some(due) = ingest_all(&store, n..n + 1, window).await {
                wakeup.due_at(due);
            }
        });
    }
    while senders.join_next().await.is_some() {}
    handler.wait_for(conversations).await;
    stop.cancel();
    run.await.expect("scheduler");
    let mut delays = handler.delays();
    delays.sort_unstable();
    let pct = |p: f64| delays[((delays.len() as f64 - 1.0) * p) as usize];
    println!(
        "steady: {conversations} conversations at {rate:.0}/s, window {} ms: due-to-start delay p50 {} ms, p99 {} ms, max {} ms",
        window.as_millis(),
        pct(0.50),
        pct(0.99),
        delays.last().copied().unwrap_or_default()
    );
}

/// A scheduler with the product's defaults over `store`, and its do-nothing handler.
fn scheduler_over(store: &Arc<CountingStore>) -> (Arc<NoOp>, Arc<Scheduler>) {
    let handler = NoOp::new();
    let scheduler = Scheduler::new(
        store.clone(),
        Arc::new(SystemClock),
        handler.clone(),
        settings(),
        sabi::metrics::Metrics::new(),
        Arc::new(tokio::sync::Notify::new()),
    );
    (handler, scheduler)
}

fn settings() -> EngineSettings {
    EngineSettings {
        turns: 5,
        lease: Duration::from_secs(120),
        poll_interval: Duration::from_secs(1),
        shutdown_grace: Duration::from_secs(10),
        sandbox: true,
        quote_replies: false,
        max_reply_parts: 1,
        log_customer_data: false,
        policy: EnginePolicy {
            max_attempts: 4,
            retry_base: Duration::from_secs(5),
            review_after: Duration::from_secs(15 * 60),
            queued_review_after: None,
        },
    }
}

/// Stores each message as its own delivery, many at once, as webhooks arrive; returns the
/// earliest due time they scheduled.
async fn ingest_all(
    store: &Arc<CountingStore>,
    conversations: std::ops::Range<usize>,
    window: Duration,
) -> Option<At> {
    let mut deliveries = tokio::task::JoinSet::new();
    let mut earliest = None;
    for n in conversations {
        for m in 0..MESSAGES_PER_CONVERSATION {
            let store = store.clone();
            deliveries.spawn(async move {
                let now = SystemClock.now();
                let delivery = Ingest {
                    routine: Default::default(),
                    items: vec![message(n, m, now)],
                    quarantined: Vec::new(),
                    received_at: now,
                    policy: BatchPolicy {
                        window,
                        cap: Duration::from_secs(60),
                    },
                    pair_spacing: std::time::Duration::ZERO,
                    human_hold: std::time::Duration::ZERO,
                };
                store
                    .inner
                    .ingest(delivery)
                    .await
                    .expect("ingest")
                    .earliest_due
            });
        }
        if deliveries.len() >= 256 {
            earliest = earliest_of(earliest, join(&mut deliveries).await);
        }
    }
    earliest_of(earliest, join(&mut deliveries).await)
}

async fn join(deliveries: &mut tokio::task::JoinSet<Option<At>>) -> Option<At> {
    let mut earliest = None;
    while let Some(due) = deliveries.join_next().await {
        earliest = earliest_of(earliest, due.expect("ingest task"));
    }
    earliest
}

fn earliest_of(a: Option<At>, b: Option<At>) -> Option<At> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn message(n: usize, m: usize, now: At) -> InboundItem {
    let customer = format!("2348{n:09}");
    InboundItem {
        kind: ItemKind::Message,
        channel: Channel::Whatsapp,
        dedupe_key: format!("wamid.bench{n}-{m}"),
        business: Some("100000000000001".into()),
        customer: Some(customer.clone()),
        item_type: Some("text".into()),
        text: Some(format!("message {m} of conversation {n}")),
        media_id: None,
        provider_ts: Some(UnixSeconds(now.unix_seconds())),
        turn: Some(ConversationKey {
            channel: Channel::Whatsapp,
            business: "100000000000001".into(),
            customer,
        }),
        facts: serde_json::json!({"kind": "message", "type": "text"}),
    }
}

/// Answers at once and records how late each batch started.
struct NoOp {
    delays: Mutex<Vec<i64>>,
    done: tokio::sync::Notify,
}

impl NoOp {
    fn new() -> Arc<NoOp> {
        Arc::new(NoOp {
            delays: Mutex::new(Vec::new()),
            done: tokio::sync::Notify::new(),
        })
    }

    async fn wait_for(&self, turns: usize) {
        loop {
            let notified = self.done.notified();
            if self.delays.lock().expect("lock").len() >= turns {
                return;
            }
            notified.await;
        }
    }

    fn delays(&self) -> Vec<i64> {
        self.delays.lock().expect("lock").clone()
    }
}

#[async_trait]
impl TurnHandler for NoOp {
    async fn handle(&self, batch: &Batch) -> Result<TurnOutcome, TurnError> {
        let delay = clock::millis(SystemClock.now().since(batch.due_at));
        self.delays.lock().expect("lock").push(delay);
        self.done.notify_waiters();
        Ok(TurnOutcome::Reply(vec![ReplyPart::text("ok")]))
    }
}

/// The scheduler's side of a store, counting every call the scheduler makes; deliveries go to
/// `inner` uncounted.
struct CountingStore {
    inner: Arc<dyn Store>,
    calls: AtomicU64,
}

impl CountingStore {
    async fn open(backend: &Backend) -> (Arc<CountingStore>, Place) {
        let (inner, place) = backend.open().await;
        let store = Arc::new(CountingStore {
            inner,
            calls: AtomicU64::new(0),
        });
        (store, place)
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl Turns for CountingStore {
    async fn claim(
        &self,
        now: At,
        lease: Duration,
        limit: usize,
        channel: Option<Channel>,
    ) -> store::Result<Vec<Claim>> {
        self.count();
        self.inner.claim(now, lease, limit, channel).await
    }
    async fn claim_routine(
        &self,
        now: At,
        lease: Duration,
        limit: usize,
    ) -> store::Result<Vec<Claim>> {
        self.count();
        self.inner.claim_routine(now, lease, limit).await
    }
    async fn renew(
        &self,
        batch: i64,
        token: LeaseToken,
        now: At,
        lease: Duration,
    ) -> store::Result<()> {
        self.count();
        self.inner.renew(batch, token, now, lease).await
    }
    async fn finish(
        &self,
        batch: i64,
        token: LeaseToken,
        now: At,
        ending: Ending,
    ) -> store::Result<()> {
        self.count();
        self.inner.finish(batch, token, now, ending).await
    }
    async fn hold(&self, now: At, holding: Holding) -> store::Result<Vec<i64>> {
        self.count();
        self.inner.hold(now, holding).await
    }
    async fn next_due(&self) -> store::Result<Option<At>> {
        self.count();
        self.inner.next_due().await
    }
    async fn set_transcript(
        &self,
        channel: Channel,
        external_id: &str,
        text: &str,
    ) -> store::Result<()> {
        self.count();
        self.inner.set_transcript(channel, external_id, text).await
    }
    async fn set_stage(&self, batch: i64, stage: &str) -> store::Result<()> {
        self.count();
        self.inner.set_stage(batch, stage).await
    }
    async fn add_usage(&self, batch: i64, usage: TurnUsage) -> store::Result<()> {
        self.count();
        self.inner.add_usage(batch, usage).await
    }
    async fn set_route(&self, batch: i64, guess: RouteGuess) -> store::Result<()> {
        self.count();
        self.inner.set_route(batch, guess).await
    }
    async fn history(&self, batch: i64, turns: usize) -> store::Result<Vec<HistoryEntry>> {
        self.count();
        self.inner.history(batch, turns).await
    }
    async fn last_broadcast(
        &self,
        conversation: &ConversationKey,
        since: At,
        until: At,
    ) -> store::Result<Option<HistoryEntry>> {
        self.count();
        self.inner.last_broadcast(conversation, since, until).await
    }
}
