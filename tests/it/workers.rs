//! Several `sabi serve` processes on one SQLite store: an API node and two worker nodes. Every
//! batch is handled exactly once, no conversation ever has two turns at once, and a worker
//! killed in the middle of a turn is taken over once its lease lapses.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::{
    SabiProcess, eventually, eventually_seen, inbox_json, json_lines, post_webhook, text_webhook_at,
};

const CONVERSATIONS: usize = 1000;
const BURST: usize = 3;
const CLIENTS: usize = 16;

fn outbox_json(dir: &Path) -> Vec<Value> {
    json_lines(dir, &["outbox", "--json"])
}

/// Waits until `expected` inbox messages are answered (the test fails after `patience`), and
/// returns the inbox.
async fn wait_until_answered(dir: &Path, expected: usize, patience: Duration) -> Vec<Value> {
    eventually_seen("every message answered", patience, || async {
        let inbox = inbox_json(dir);
        let answered = inbox.iter().filter(|i| i["state"] == "answered").count();
        if answered == expected {
            Ok(inbox)
        } else {
            Err(format!("{answered} of {expected} answered"))
        }
    })
    .await
}

/// A message sent now: these processes run on the real clock, and old messages go to review.
fn message(id: &str, customer: &str, text: &str) -> Vec<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time");
    text_webhook_at(
        id,
        customer,
        text,
        i64::try_from(now.as_secs()).expect("seconds"),
    )
}

/// Posts a webhook signed with the test secret; Sabi must acknowledge it.
async fn post_signed(client: &reqwest::Client, base: &str, body: Vec<u8>) {
    assert_eq!(post_webhook(client, base, body).await.status(), 200);
}

fn customer(n: usize) -> String {
    format!("2348{n:09}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_handle_every_batch_once_and_never_overlap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = [
        ("SABI_BATCH_WINDOW", "200ms"),
        ("SABI_BATCH_MAX_WAIT", "1s"),
    ];
    let api = SabiProcess::spawn(dir.path(), "api", &env);
    let _workers = [
        SabiProcess::spawn(dir.path(), "worker", &env),
        SabiProcess::spawn(dir.path(), "worker", &env),
    ];

    let client = reqwest::Client::new();
    let mut senders = tokio::task::JoinSet::new();
    for c in 0..CLIENTS {
        let (client, url) = (client.clone(), api.url(""));
        senders.spawn(async move {
            for n in (c..CONVERSATIONS).step_by(CLIENTS) {
                for m in 0..BURST {
                    let body = message(
                        &format!("wamid.w{n}-{m}"),
                        &customer(n),
                        &format!("{n}-{m}"),
                    );
                    post_signed(&client, &url, body).await;
                }
            }
        });
    }
    while let Some(sent) = senders.join_next().await {
        sent.expect("sender");
    }

    let total = CONVERSATIONS * BURST;
    let inbox = wait_until_answered(dir.path(), total, Duration::from_secs(120)).await;
    let answered = inbox.iter().filter(|i| i["state"] == "answered").count();
    assert_eq!(answered, total, "every message answered");

    let outbox = outbox_json(dir.path());
    let mut replies_per_batch: HashMap<i64, usize> = HashMap::new();
    for reply in &outbox {
        *replies_per_batch
            .entry(reply["batch"].as_i64().expect("batch"))
            .or_default() += 1;
    }
    let batches: HashSet<i64> = inbox
        .iter()
        .map(|i| i["batch"].as_i64().expect("batched"))
        .collect();
    assert_eq!(
        replies_per_batch.len(),
        batches.len(),
        "one reply per batch"
    );
    assert!(
        replies_per_batch.values().all(|n| *n == 1),
        "no batch answered twice"
    );

    // Per conversation: turn intervals never overlap.
    let mut turns: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for reply in &outbox {
        let interval = (
            reply["turn_started_at_ms"].as_i64().expect("start"),
            reply["turn_finished_at_ms"].as_i64().expect("end"),
        );
        turns
            .entry(reply["customer"].as_str().expect("customer").to_owned())
            .or_default()
            .push(interval);
    }
    assert_eq!(turns.len(), CONVERSATIONS);
    for (customer, mut intervals) in turns {
        intervals.sort();
        for pair in intervals.windows(2) {
            assert!(
                pair[0].1 <= pair[1].0,
                "{customer}: turns {:?} and {:?} overlap",
                pair[0],
                pair[1]
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_turn_is_taken_over_and_one_reply_recorded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = [("SABI_BATCH_WINDOW", "0s"), ("SABI_LEASE", "2s")];
    let api = SabiProcess::spawn(dir.path(), "api", &env);
    // This worker thinks for a long time: it will be killed while it does.
    let slow = SabiProcess::spawn(
        dir.path(),
        "worker",
        &[env[0], env[1], ("SABI_SANDBOX_REPLY_DELAY", "30s")],
    );

    // A question the router hands to the agent: the sandbox stands in for it, slowly.
    let body = message("wamid.k1", &customer(1), "Who go win the league this year?");
    post_signed(&reqwest::Client::new(), &api.url(""), body).await;

    eventually("the slow worker to claim the batch", || async {
        inbox_json(dir.path())[0]["state"] == "batched"
    })
    .await;
    slow.kill9();

    let _rescuer = SabiProcess::spawn(dir.path(), "worker", &env);
    let inbox = wait_until_answered(dir.path(), 1, Duration::from_secs(30)).await;
    assert_eq!(inbox[0]["state"], "answered");
    let outbox = outbox_json(dir.path());
    assert_eq!(outbox.len(), 1, "exactly one reply: {outbox:?}");
    assert_eq!(outbox[0]["batch"], inbox[0]["batch"]);
}
