//! Broadcast benchmark, in two parts.
//!
//! - Through the store: a broadcast's recipients claimed (64 at a time, under a lease, with the
//!   opt-out, cooldown and messaging-limit checks) and each send recorded, as fast as the store
//!   goes, on SQLite, PostgreSQL and Redis in one run (see `support/stores.rs`): recipients/s.
//! - Replies while a broadcast drains: Sabi whole (SQLite) against the fake Graph API, a
//!   broadcast going out at 200/s on a number allowed 260/s, and customers writing every 250 ms;
//!   the time from each customer's webhook to their reply reaching the Graph API (p50/p99),
//!   against the same customers with no broadcast.
//!
//! `BROADCAST_BENCH_RECIPIENTS` changes the store part's audience (10,000; 300 under
//! `cargo test`, as a smoke check, which also shortens the second part).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::future::join_all;
use sabi::app::{App, Role};
use sabi::clock::{Clock, SystemClock};
use sabi::config::Config;
use sabi::domain::{Batch, ReplyPart};
use sabi::store::{Limits, NewBroadcast, NewRecipient, Outcome, RecipientClaim, Store};
use sabi::testing::graph::FakeGraph;
use sabi::testing::webhook::signed;
use sabi::turn::{TurnError, TurnHandler, TurnOutcome};

#[path = "support/stores.rs"]
mod stores;

use self::stores::Backend;

const BUSINESS: &str = "100000000000001";
const TOKEN: &str = "bench-token";
const SECRET: &str = "bench-app-secret";

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let recipients: usize = std::env::var("BROADCAST_BENCH_RECIPIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 10_000 } else { 300 });
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        println!("broadcast bench: {recipients} recipients through the store, 64 claimed at a time");
        let server = std::env::var("ENGINE_BENCH_POSTGRES")
            .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432".to_owned());
        let redis = std::env::var("ENGINE_BENCH_REDIS").ok();
        for backend in [Backend::Sqlite, Backend::Postgres(server), Backend::Redis(redis)] {
            let rate = through_store(&backend, recipients).await;
            println!("{}: {rate:.0} recipients/s", backend.name());
        }
        let (writers, audience) = if full { (40, 4_000) } else { (4, 200) };
        let quiet = reply_latency(writers, 0).await;
        let busy = reply_latency(writers, audience).await;
        println!(
            "replies, {writers} customers writing 250 ms apart: p50 {} ms, p99 {} ms with no broadcast; \
             p50 {} ms, p99 {} ms while {audience} recipients drain at 200/s",
            quiet.0, quiet.1, busy.0, busy.1
        );
    });
}

fn audience(count: usize, offset: usize) -> Vec<NewRecipient> {
    (0..count)
        .map(|n| NewRecipient {
            to: format!("2348{:09}", n + offset),
            params: vec![format!("Customer {n}")],
            line: None,
            skipped: None,
            tz: None,
        })
        .collect()
}

fn broadcast(recipients: Vec<NewRecipient>, rate: u32) -> NewBroadcast {
    let now = SystemClock.now();
    NewBroadcast {
        key: None,
        name: "bench".into(),
        template: "diwali_offer".into(),
        language: "en".into(),
        business: BUSINESS.into(),
        now,
        start_at: now,
        until: None,
        rate,
        body: None,
        hours: None,
        recipients,
    }
}

/// Recipients/s: claim 64, record each as accepted, until none is left.
async fn through_store(backend: &Backend, recipients: usize) -> f64 {
    let (store, _place) = backend.open().await;
    store
        .create_broadcast(broadcast(audience(recipients, 0), 1_000))
        .await
        .expect("kept");
    let started = Instant::now();
    let mut done = 0;
    while done < recipients {
        let now = SystemClock.now();
        let claim = RecipientClaim {
            now,
            lease: Duration::from_secs(60),
            limit: 64,
            halted: Vec::new(),
            cooldown: Duration::from_secs(24 * 3600),
            daily_limit: None,
        };
        let jobs = store.claim_recipients(claim).await.expect("claimed");
        assert!(
            !jobs.is_empty(),
            "{done} of {recipients} claimed, then none"
        );
        let records = jobs.iter().map(|job| {
            let outcome = Outcome::Accepted {
                wamid: format!("wamid.bench{}", job.id),
            };
            store.record_recipient(job.id, job.attempt, now, outcome, Limits::NONE)
        });
        for recorded in join_all(records).await {
            recorded.expect("recorded");
        }
        done += jobs.len();
    }
    recipients as f64 / started.elapsed().as_secs_f64()
}

/// Answers every batch at once.
struct Answer;

#[async_trait]
impl TurnHandler for Answer {
    async fn handle(&self, _batch: &Batch) -> Result<TurnOutcome, TurnError> {
        Ok(TurnOutcome::Reply(vec![ReplyPart::text("Thanks, on it.")]))
    }
}

/// Webhook to reply, p50 and p99 in ms, for `writers` customers writing 250 ms apart while a
/// broadcast of `audience` drains (none when 0).
async fn reply_latency(writers: usize, audience_size: usize) -> (u128, u128) {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeGraph::start(TOKEN).await;
    let store_url = format!("sqlite://{}", dir.path().join("sabi.db").display());
    let base = fake.base_url();
    let env = [
        ("SABI_LISTEN", "127.0.0.1:0"),
        ("SABI_STORE", store_url.as_str()),
        ("SABI_WHATSAPP_APP_SECRET", SECRET),
        ("SABI_WHATSAPP_ACCESS_TOKEN", TOKEN),
        ("SABI_MARKER_SECRET", "bench-marker-secret-0123456789"),
        ("SABI_WHATSAPP_API_BASE", base.as_str()),
        ("SABI_BATCH_WINDOW", "0"),
        ("SABI_OUTBOUND_RATE", "260"),
        ("SABI_MESSAGING_LIMIT", "unlimited"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    let config = Config::load(Some(std::path::Path::new("/dev/null")), env).expect("config");
    let app = App::build_with(
        &config,
        Role::All,
        Arc::new(SystemClock),
        Some(Arc::new(Answer)),
    )
    .await
    .expect("app");
    let url = format!("http://{}/webhook/whatsapp", app.addr().expect("bound"));
    let store: Arc<dyn Store> = app.store();
    let shutdown = app.shutdown_token();
    tokio::spawn(app.run_until_stopped());
    if audience_size > 0 {
        store
            .create_broadcast(broadcast(audience(audience_size, 0), 200))
            .await
            .expect("kept");
        // Let it get going.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let client = reqwest::Client::new();
    let mut wrote = Vec::with_capacity(writers);
    for n in 0..writers {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let customer = format!("2347{n:09}");
        let now = SystemClock.now().unix_seconds().unsigned_abs();
        let body = sabi::whatsapp::wire::text_webhook(
            BUSINESS,
            &customer,
            "Bench",
            &format!("wamid.w{n}"),
            now,
            "hello",
        );
        let body = sabi::whatsapp::wire::encode(&body).into_bytes();
        let started = tokio::time::Instant::now();
        let response = signed(&client, &url, SECRET, body)
            .send()
            .await
            .expect("posted");
        assert_eq!(response.status(), 200);
        wrote.push((customer, started));
    }
    let mut waits = Vec::with_capacity(writers);
    for (customer, started) in wrote {
        let reply = loop {
            let found = fake
                .accepted()
                .into_iter()
                .find(|r| r.body["type"] == "text" && r.recipient() == Some(customer.as_str()));
            if let Some(reply) = found {
                break reply;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        waits.push(reply.at.duration_since(started).as_millis());
    }
    shutdown.cancel();
    waits.sort_unstable();
    let at = |q: f64| waits[((waits.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}
