//! Router benchmark: start-up (training the built-in intents), and routing speed on one core.
//!
//! `cargo bench --bench router` routes every message of the intents corpus
//! (`tests/data/intents/dev.jsonl`, or `ROUTER_BENCH_FILE`) many times on one thread and
//! prints messages per second and the p50/p99/p99.9 time per message. `ROUTER_BENCH_INTENTS`
//! names an intents file to measure instead of the built-in one. Under `cargo test` it runs
//! briefly, as a smoke check.

use std::time::{Duration, Instant};

use sabi::router::Router;

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let rounds = if full { 200 } else { 2 };

    let mut startups: Vec<Duration> = (0..if full { 9 } else { 1 })
        .map(|_| {
            let started = Instant::now();
            router();
            started.elapsed()
        })
        .collect();
    startups.sort();
    println!(
        "router start-up (training the built-in intents): median {:?}",
        startups[startups.len() / 2]
    );

    let router = router();
    let messages = messages();
    let mut times = Vec::with_capacity(messages.len() * rounds);
    let started = Instant::now();
    for _ in 0..rounds {
        for message in &messages {
            let t = Instant::now();
            std::hint::black_box(router.route(std::hint::black_box(message)));
            times.push(t.elapsed());
        }
    }
    let total = started.elapsed();
    times.sort();
    let pct = |p: f64| times[((times.len() - 1) as f64 * p) as usize];
    println!(
        "routing {} messages x {rounds} rounds on one thread: {:.0} messages/s; per message p50 {:?}, p99 {:?}, p99.9 {:?}",
        messages.len(),
        times.len() as f64 / total.as_secs_f64(),
        pct(0.5),
        pct(0.99),
        pct(0.999),
    );
}

fn router() -> Router {
    match std::env::var("ROUTER_BENCH_INTENTS") {
        Ok(path) => {
            let source = std::fs::read_to_string(&path).expect("ROUTER_BENCH_INTENTS is readable");
            Router::trained(&source).expect("the intents file builds")
        }
        Err(_) => Router::builtin().expect("built-in intents"),
    }
}

fn messages() -> Vec<String> {
    let path = std::env::var("ROUTER_BENCH_FILE").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/intents/dev.jsonl").to_owned()
    });
    match std::fs::read_to_string(&path) {
        Ok(text) => text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["text"].as_str().map(str::to_owned))
            .collect(),
        Err(_) => [
            "I wan check my balance",
            "money never enter",
            "abeg load 5k data for my Airtel line",
            "hello",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect(),
    }
}
