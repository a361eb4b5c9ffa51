//! Store before acknowledge, through a real crash: `sabi serve` takes a stream of distinct
//! signed webhooks from many concurrent clients and is killed with SIGKILL at a random moment.
//! After a restart, every message that got a 200 must be in the store, once.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::helpers::{SabiProcess, inbox_json, signature, text_webhook};

const CLIENTS: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_message_survives_kill_9() {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("time")
        .as_nanos() as u64;
    for round in 0..3u64 {
        // A different kill moment each round, between 150 and 1,150 ms into the stream.
        let kill_after = Duration::from_millis(150 + (seed.wrapping_mul(round + 7) >> 7) % 1000);
        eprintln!("round {round}: kill -9 after {kill_after:?} (seed {seed})");
        crash_round(round, kill_after).await;
    }
}

async fn crash_round(round: u64, kill_after: Duration) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sabi = SabiProcess::start(dir.path());
    let url = sabi.url("/webhook/whatsapp");
    let acked = Arc::new(Mutex::new(Vec::new()));
    let client = reqwest::Client::new();
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..CLIENTS {
        let (client, url, acked) = (client.clone(), url.clone(), acked.clone());
        clients.spawn(async move {
            for n in 0.. {
                let id = format!("wamid.crash{round}-{c}-{n}");
                let body = text_webhook(&id, &format!("234800{c:07}"), &format!("message {n}"));
                let sent = client
                    .post(&url)
                    .header("x-hub-signature-256", signature(&body))
                    .body(body)
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await;
                match sent {
                    Ok(response) if response.status() == 200 => {
                        acked.lock().expect("lock").push(id)
                    }
                    Ok(response) => panic!("unexpected status {}", response.status()),
                    // The server is gone: this client stops.
                    Err(_) => break,
                }
            }
        });
    }
    tokio::time::sleep(kill_after).await;
    sabi.kill9();
    while clients.join_next().await.is_some() {}

    let acked = acked.lock().expect("lock").clone();
    assert!(
        !acked.is_empty(),
        "round {round}: no webhook was acknowledged before the kill"
    );
    let restarted = SabiProcess::start(dir.path());
    let ready = reqwest::get(restarted.url("/readyz"))
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200);

    let stored: Vec<String> = inbox_json(dir.path())
        .iter()
        .map(|item| {
            item["external_id"]
                .as_str()
                .expect("external_id")
                .to_owned()
        })
        .collect();
    let unique: HashSet<&String> = stored.iter().collect();
    assert_eq!(
        unique.len(),
        stored.len(),
        "round {round}: a message was stored twice"
    );
    let missing: Vec<&String> = acked.iter().filter(|id| !unique.contains(id)).collect();
    assert!(
        missing.is_empty(),
        "round {round}: {} of {} acknowledged messages lost, e.g. {:?}",
        missing.len(),
        acked.len(),
        missing.first()
    );
    eprintln!(
        "round {round}: {} acknowledged, {} stored",
        acked.len(),
        stored.len()
    );
}
