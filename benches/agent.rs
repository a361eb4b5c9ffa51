//! Agent benchmark: the turn's own overhead around the model call. The fake LLM answers at
//! once, so a turn's time is everything but the model's: reading the history from the store,
//! routing for context, building the prompt, the HTTP round trip, recording usage and stages.
//!
//! `cargo bench --bench agent` prints, per turn, p50/p99 of the agent's whole turn and of a
//! bare call to the same fake with the same client, and the difference. `AGENT_BENCH_TURNS`
//! changes the count (default 2,000; 20 under `cargo test`, as a smoke check).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sabi::agent::budget::Limits;
use sabi::agent::llm::{ChatMessage, Llm, LlmContext, Provider, Providers, Retries, Sampling};
use sabi::agent::{Agent, AgentSettings};
use sabi::clock::{At, Clock, SystemClock, UnixSeconds};
use sabi::domain::{BatchPolicy, Channel, ConversationKey, InboundItem, ItemKind, ReplyPart};
use sabi::router::Router;
use sabi::store::{Ending, Ingest, SqliteStore, Store};
use sabi::testing::llm::FakeLlm;
use sabi::tools::Tools;
use sabi::turn::TurnHandler;

const CONVERSATIONS: usize = 50;

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let turns: usize = std::env::var("AGENT_BENCH_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 2_000 } else { 20 });
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        println!("agent bench: {turns} turns over {CONVERSATIONS} conversations (history grows), SQLite (fsync per commit), fake LLM answering at once");
        let fake = FakeLlm::start().await;
        let bare = bare_calls(&fake, turns).await;
        let whole = agent_turns(&fake, turns).await;
        let overhead: Vec<Duration> = whole.iter().zip(&bare).map(|(w, b)| w.saturating_sub(*b)).collect();
        println!(
            "agent turn p50 {} µs, p99 {} µs; bare model call p50 {} µs, p99 {} µs; overhead p50 {} µs, p99 {} µs",
            micros(&whole, 0.5), micros(&whole, 0.99), micros(&bare, 0.5), micros(&bare, 0.99),
            micros(&overhead, 0.5), micros(&overhead, 0.99),
        );
    });
}

fn micros(samples: &[Duration], p: f64) -> u128 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    sorted[((sorted.len() as f64 - 1.0) * p) as usize].as_micros()
}

fn llm(fake: &FakeLlm) -> Llm {
    let provider = Provider {
        base_url: fake.base_url(),
        api_key: None,
        model: "fake".into(),
    };
    let retries = Retries {
        attempts: 1,
        backoff: Duration::from_millis(10),
    };
    let context = LlmContext {
        timeout: Duration::from_secs(10),
        retries,
        sampling: Sampling::default(),
        clock: Arc::new(SystemClock),
        metrics: sabi::metrics::Metrics::new(),
    };
    let limits = Limits {
        concurrent: 64,
        requests_per_minute: None,
        tokens_per_minute: None,
    };
    Llm::new((provider, limits), None, context).expect("client")
}

/// The same model call made bare, with a prompt of the same shape.
async fn bare_calls(fake: &FakeLlm, turns: usize) -> Vec<Duration> {
    let client = llm(fake);
    let messages = vec![
        ChatMessage::new("system", "You are the assistant."),
        ChatMessage::new("user", "Which restaurant in Lekki would you recommend?"),
    ];
    let mut samples = Vec::with_capacity(turns);
    for _ in 0..turns {
        let started = Instant::now();
        client
            .complete(&messages, &[], Providers::All, &client.waits())
            .await
            .expect("answer");
        samples.push(started.elapsed());
    }
    samples
}

async fn agent_turns(fake: &FakeLlm, turns: usize) -> Vec<Duration> {
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
    let router = Router::builtin().expect("router");
    let tools = Tools::new(&[], &|_| None, None).expect("no tools");
    let settings = AgentSettings {
        system_prompt: "You are the assistant.".into(),
        max_tool_rounds: 4,
        history_tokens: 2000,
        redact: false,
        turn_timeout: Duration::from_secs(30),
        prompt_price: 0.15,
        completion_price: 0.6,
        max_tool_calls: 8,
        max_tool_answer_bytes: 32 * 1024,
        turn_prompt_tokens: 100_000,
        allowed_link_hosts: Vec::new(),
    };
    let metrics = sabi::metrics::Metrics::new();
    let agent = Agent::new(
        llm(fake),
        Arc::new(tools),
        store.clone(),
        Some(Arc::new(router)),
        settings,
        metrics,
    );
    let mut samples = Vec::with_capacity(turns);
    for n in 0..turns {
        let now = SystemClock.now();
        let delivery = Ingest {
            routine: Default::default(),
            items: vec![message(n, now)],
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
        let claim = store
            .claim(now, Duration::from_secs(60), 1, None)
            .await
            .expect("claim")
            .pop()
            .expect("a batch");
        let started = Instant::now();
        agent.handle(&claim.batch).await.expect("answered");
        samples.push(started.elapsed());
        let ending = Ending::Replied {
            parts: vec![ReplyPart::text("ok")],
            sandbox: true,
        };
        store
            .finish(claim.batch.id, claim.token, now, ending)
            .await
            .expect("finish");
    }
    samples
}

fn message(n: usize, now: At) -> InboundItem {
    let customer = format!("2348{:09}", n % CONVERSATIONS);
    InboundItem {
        kind: ItemKind::Message,
        channel: Channel::Whatsapp,
        dedupe_key: format!("wamid.agentbench{n}"),
        business: Some("100000000000001".into()),
        customer: Some(customer.clone()),
        item_type: Some("text".into()),
        text: Some("Which restaurant in Lekki would you recommend for a birthday?".into()),
        media_id: None,
        provider_ts: Some(UnixSeconds(now.unix_seconds())),
        turn: Some(ConversationKey {
            channel: Channel::Whatsapp,
            business: "100000000000001".into(),
            customer,
        }),
        facts: serde_json::json!({}),
    }
}
