//! Sender benchmark: reply parts through the outbox to the fake Graph API with the rate limit
//! lifted, against the same sends made straight with the Graph client at the same concurrency.
//!
//! `cargo bench --bench sender` prints sends/s both ways and the outbox's overhead per send
//! (claim under a lease, the at-most-once bookkeeping, the commit of each outcome). The fake
//! runs in the same process. `SENDER_BENCH_PARTS` changes the count (default 5,000; 200 under
//! `cargo test`, as a smoke check).
//!
//! Then read receipts on a saturated number: a real `sabi serve` (`SABI_BIN` runs another
//! build, for a before-and-after in one run) answers 300 customers who wrote at once, on a
//! number paced at 20 a second; it prints the replies' rate and how many of the customers'
//! messages were marked read within 30 s of the last reply. `SENDER_BENCH_CUSTOMERS` changes the
//! count (30 under `cargo test`).

#[path = "support/node.rs"]
#[allow(dead_code, reason = "each bench uses part of the shared node")]
mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sabi::clock::{At, Clock, SystemClock, UnixSeconds};
use sabi::config::SenderSettings;
use sabi::domain::{BatchPolicy, Channel, ConversationKey, InboundItem, ItemKind, ReplyPart};
use sabi::sender::Sender;
use sabi::store::{Ending, Ingest, SqliteStore, Store};
use sabi::testing::graph::FakeGraph;
use sabi::testing::webhook::signed;
use sabi::whatsapp::graph::{Envelope, Graph, Message};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "bench-token";
const BUSINESS: &str = "100000000000001";
const IN_FLIGHT: usize = 64;

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let parts: usize = std::env::var("SENDER_BENCH_PARTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 5_000 } else { 200 });
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        println!("sender bench: {parts} parts to {parts} customers, {IN_FLIGHT} in flight, SQLite (fsync per commit), fake Graph API in process");
        let direct = direct(parts).await;
        let outbox = through_outbox(parts).await;
        let per_send = |d: Duration| d.as_secs_f64() / parts as f64 * 1e6;
        println!(
            "direct: {:.0} sends/s; through the outbox: {:.0} sends/s ({:.2}x the direct rate); overhead per send {:.0} µs",
            parts as f64 / direct.as_secs_f64(),
            parts as f64 / outbox.as_secs_f64(),
            direct.as_secs_f64() / outbox.as_secs_f64(),
            per_send(outbox) - per_send(direct),
        );
        let customers: usize = std::env::var("SENDER_BENCH_CUSTOMERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(if full { 300 } else { 30 });
        receipts(customers).await;
    });
}

const SECRET: &str = "bench-app-secret";
const RATE: u32 = 20;

/// Customers who all wrote at once to a number paced at [`RATE`]: the replies' rate, and the
/// share of their messages marked read within 30 s of the last reply.
async fn receipts(customers: usize) {
    let fake = FakeGraph::start(TOKEN).await;
    let base = fake.base_url();
    let rate = RATE.to_string();
    let node = support::Node::start(
        "all",
        "",
        SECRET,
        &[
            ("SABI_WHATSAPP_ACCESS_TOKEN", TOKEN),
            ("SABI_WHATSAPP_API_BASE", &base),
            ("SABI_OUTBOUND_RATE", &rate),
            ("SABI_TURNS", "32"),
        ],
        |_| false,
    );
    let client = reqwest::Client::new();
    let now = SystemClock.now().unix_seconds();
    for n in 0..customers {
        let value = sabi::whatsapp::wire::text_webhook(
            BUSINESS,
            &customer(n),
            "Bench",
            &format!("wamid.receipt{n}"),
            u64::try_from(now).unwrap_or(0),
            "hello",
        );
        let body = sabi::whatsapp::wire::encode(&value).into_bytes();
        let response = signed(&client, &node.url("/webhook/whatsapp"), SECRET, body)
            .send()
            .await
            .expect("webhook");
        assert!(response.status().is_success(), "webhook refused");
    }
    // Every customer answered, then 30 s more for the receipts.
    let started = Instant::now();
    while fake.accepted().len() < customers && started.elapsed() < Duration::from_secs(600) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let replies = fake.accepted();
    let last_reply = replies.iter().map(|r| r.at).max().expect("replies");
    let first_reply = replies.iter().map(|r| r.at).min().expect("replies");
    tokio::time::sleep_until(last_reply + Duration::from_secs(30)).await;
    let mut read_at: HashMap<String, tokio::time::Instant> = HashMap::new();
    for r in fake.received().iter().filter(|r| !r.is_message()) {
        if let Some(id) = r.body["message_id"].as_str() {
            read_at.entry(id.to_owned()).or_insert(r.at);
        }
    }
    let in_time = read_at
        .values()
        .filter(|at| **at <= last_reply + Duration::from_secs(30))
        .count();
    let span = last_reply.duration_since(first_reply).as_secs_f64();
    println!(
        "read receipts, {customers} customers on a {RATE}/s number: replies {:.1}/s from first to last ({} of {customers} in {span:.1} s); marked read within 30 s of the last reply: {in_time} of {customers} ({:.0} %)",
        (replies.len().saturating_sub(1)) as f64 / span.max(f64::EPSILON),
        replies.len(),
        in_time as f64 * 100.0 / customers as f64,
    );
}

fn graph(fake: &FakeGraph) -> Graph {
    Graph::new(
        &fake.base_url(),
        TOKEN.to_owned().into(),
        Duration::from_secs(10),
    )
    .expect("client")
}

fn customer(n: usize) -> String {
    format!("2348{n:09}")
}

/// The same sends straight through the client: the fake's and the HTTP stack's own cost.
async fn direct(parts: usize) -> Duration {
    let fake = FakeGraph::start(TOKEN).await;
    let graph = Arc::new(graph(&fake));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..IN_FLIGHT {
        let (graph, next) = (graph.clone(), next.clone());
        workers.spawn(async move {
            loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n >= parts {
                    return;
                }
                let to = customer(n);
                let envelope = Envelope {
                    from: BUSINESS,
                    to: &to,
                    quote: None,
                    callback: Some("sabi:outbox:0"),
                };
                let message = Message::Text {
                    body: "Your order ships tomorrow.",
                    options: &[],
                };
                graph.send(envelope, message).await.expect("sent");
            }
        });
    }
    while workers.join_next().await.is_some() {}
    started.elapsed()
}

async fn through_outbox(parts: usize) -> Duration {
    let fake = FakeGraph::start(TOKEN).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(
            &dir.path().join("sabi.db"),
            sabi::store::Marks::new(
                secrecy::SecretString::from("bench-marker-secret".to_owned()),
                Vec::new(),
            ),
        )
        .await
        .expect("store"),
    );
    fill_outbox(&store, parts).await;
    let settings = SenderSettings {
        rate: 1_000_000,
        pair_spacing: Duration::ZERO,
        lease: Duration::from_secs(60),
        send_lease: Duration::from_secs(60),
        unknown_wait: Duration::from_secs(600),
        max_failures: 6,
        retry_base: Duration::from_secs(2),
        window: Duration::from_secs(24 * 3600),
        template: None,
        in_flight: IN_FLIGHT,
        poll_interval: Duration::from_millis(100),
        shutdown_grace: Duration::from_secs(10),
    };
    let sender = Sender::new(
        store.clone(),
        Arc::new(SystemClock),
        graph(&fake),
        settings,
        sabi::metrics::Metrics::new(),
    );
    let stop = CancellationToken::new();
    let started = Instant::now();
    let run = tokio::spawn(sender.run(stop.clone()));
    while fake.request_count() < parts {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Every outcome recorded, too.
    while store
        .next_send_due(Vec::new())
        .await
        .expect("due")
        .is_some()
    {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    stop.cancel();
    run.await.expect("sender");
    let outbox = store.outbox(None).await.expect("outbox");
    assert!(
        outbox.iter().all(|e| e.state == "accepted"),
        "every part accepted once"
    );
    assert_eq!(fake.accepted().len(), parts, "nothing sent twice");
    elapsed
}

/// One reply part per customer, queued as a turn writes it.
async fn fill_outbox(store: &Arc<dyn Store>, parts: usize) {
    let now = SystemClock.now();
    for chunk in (0..parts).collect::<Vec<_>>().chunks(500) {
        let items = chunk.iter().map(|&n| message(n, now)).collect();
        let delivery = Ingest {
            routine: Default::default(),
            items,
            quarantined: Vec::new(),
            received_at: now,
            policy: BatchPolicy {
                window: Duration::ZERO,
                cap: Duration::ZERO,
            },
            pair_spacing: std::time::Duration::ZERO,
            human_hold: std::time::Duration::ZERO,
        };
        store.ingest(delivery).await.expect("ingest");
    }
    let claims = store
        .claim(now, Duration::from_secs(60), parts, None)
        .await
        .expect("claim");
    assert_eq!(claims.len(), parts);
    for claim in claims {
        let ending = Ending::Replied {
            parts: vec![ReplyPart::text("Your order ships tomorrow.")],
            sandbox: false,
        };
        store
            .finish(claim.batch.id, claim.token, now, ending)
            .await
            .expect("finish");
    }
}

fn message(n: usize, now: At) -> InboundItem {
    let customer = customer(n);
    InboundItem {
        kind: ItemKind::Message,
        channel: Channel::Whatsapp,
        dedupe_key: format!("wamid.sendbench{n}"),
        business: Some(BUSINESS.into()),
        customer: Some(customer.clone()),
        item_type: Some("text".into()),
        text: Some("where is my order".into()),
        media_id: None,
        provider_ts: Some(UnixSeconds(now.unix_seconds())),
        turn: Some(ConversationKey {
            channel: Channel::Whatsapp,
            business: BUSINESS.into(),
            customer,
        }),
        facts: serde_json::json!({}),
    }
}
