//! Store before acknowledge, through a real crash: `sabi serve` takes a stream of distinct
//! signed webhooks from many concurrent clients and is killed with SIGKILL at a random moment.
//! After a restart, every message that got a 200 must be in the store, once.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::helpers::{
    SabiProcess, eventually_seen, inbox_json, post_webhook, text_webhook, webhook_request,
};

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
    let url = sabi.url("");
    let acked = Arc::new(Mutex::new(Vec::new()));
    let client = reqwest::Client::new();
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..CLIENTS {
        let (client, url, acked) = (client.clone(), url.clone(), acked.clone());
        clients.spawn(async move {
            for n in 0.. {
                let id = format!("wamid.crash{round}-{c}-{n}");
                let body = text_webhook(&id, &format!("234800{c:07}"), &format!("message {n}"));
                let sent = webhook_request(&client, &url, body)
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

/// At most once per recipient, through real crashes: `sabi serve` sends a broadcast to the fake
/// Graph API and is killed with SIGKILL three times at random moments. After the last restart
/// everyone else is sent to, and no recipient was sent the template twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_broadcast_recipient_gets_it_twice_through_kill_9() {
    use sabi::testing::graph::FakeGraph;
    const RECIPIENTS: usize = 400;
    const TOKEN: &str = "crash-graph-token";
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("time")
        .as_nanos() as u64;
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeGraph::start(TOKEN).await;
    let base = fake.base_url();
    let env = [
        ("SABI_WHATSAPP_ACCESS_TOKEN", TOKEN),
        ("SABI_WHATSAPP_API_BASE", base.as_str()),
        ("SABI_MESSAGING_LIMIT", "unlimited"),
    ];
    let mut csv = String::from("phone,name\n");
    for n in 0..RECIPIENTS {
        csv.push_str(&format!("+23480{n:08},Customer {n}\n"));
    }
    std::fs::write(dir.path().join("audience.csv"), csv).expect("written");
    let created = crate::helpers::json_lines(
        dir.path(),
        &[
            "broadcast",
            "create",
            "--name",
            "Diwali eve",
            "--template",
            "diwali_offer",
            "--language",
            "en",
            "--audience",
            "audience.csv",
            "--param",
            "name",
            "--from",
            "100000000000001",
            "--rate",
            "80",
            "--json",
        ],
    );
    let id = created[0]["id"].as_i64().expect("id").to_string();

    for round in 0..3u64 {
        let kill_after = Duration::from_millis(300 + (seed.wrapping_mul(round + 3) >> 9) % 900);
        eprintln!("round {round}: kill -9 after {kill_after:?} (seed {seed})");
        let sabi = crate::helpers::SabiProcess::start_with(dir.path(), &env);
        tokio::time::sleep(kill_after).await;
        sabi.kill9();
    }
    let _sabi = crate::helpers::SabiProcess::start_with(dir.path(), &env);
    // Sends cut off by a kill stay `sending` until their lease lapses, then `unknown`: never
    // sent again. Everyone else is sent to.
    // Settled: nobody queued, and nothing moved for a second (the live sends ended).
    let counts_now = || {
        crate::helpers::json_lines(dir.path(), &["broadcast", "show", &id, "--json"])[0]["counts"]
            .clone()
    };
    let settled = "the broadcast to settle";
    let counts = eventually_seen(settled, Duration::from_secs(300), || async {
        let before = counts_now();
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let counts = counts_now();
        if counts["queued"] == 0 && counts == before {
            Ok(counts)
        } else {
            Err(counts.to_string())
        }
    })
    .await;
    let templates: Vec<String> = fake
        .received()
        .iter()
        .filter(|r| r.body["type"] == "template")
        .filter_map(|r| r.recipient().map(str::to_owned))
        .collect();
    let unique: HashSet<&String> = templates.iter().collect();
    assert_eq!(unique.len(), templates.len(), "a recipient got it twice");
    let count = |state: &str| counts[state].as_u64().unwrap_or(0);
    assert_eq!(
        count("accepted") + count("sending") + count("unknown"),
        RECIPIENTS as u64,
        "{counts}"
    );
    let cut_off = count("sending") + count("unknown");
    assert!(
        cut_off <= 3 * 4,
        "at most the sends in flight at each kill are cut off: {counts}"
    );
    assert!(
        unique.len() as u64 >= RECIPIENTS as u64 - cut_off,
        "{} of {RECIPIENTS} sent: {counts}",
        unique.len()
    );
    eprintln!(
        "{} sent, {cut_off} cut off by the kills: {counts}",
        unique.len()
    );
}

/// No silence after a crash: a worker answering 100 customers on a 10-a-second number is
/// killed with SIGKILL mid-stream, while each Graph call takes 300 ms. Its claimed parts
/// (up to 32 waiting for their pacing slot) never left, so after a restart they go out; only
/// the requests that were on the wire (about 3) may be left unknown, and nobody gets a reply
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sender_leaves_unknown_only_what_was_on_the_wire() {
    use sabi::testing::graph::FakeGraph;
    const CUSTOMERS: usize = 100;
    const TOKEN: &str = "crash-graph-token";
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeGraph::start(TOKEN).await;
    fake.answer_after(Duration::from_millis(300));
    let base = fake.base_url();
    let env = [
        ("SABI_WHATSAPP_ACCESS_TOKEN", TOKEN),
        ("SABI_WHATSAPP_API_BASE", base.as_str()),
        ("SABI_OUTBOUND_RATE", "10"),
        ("SABI_TURNS", "32"),
        ("SABI_BATCH_WINDOW", "0s"),
        ("SABI_BATCH_MAX_WAIT", "0s"),
        ("SABI_SEND_TIMEOUT", "2s"),
    ];
    let sabi = SabiProcess::start_with(dir.path(), &env);
    let client = reqwest::Client::new();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("time")
        .as_secs() as i64;
    for n in 0..CUSTOMERS {
        let (id, from) = (format!("wamid.crash-{n}"), format!("23480{n:08}"));
        let body = crate::helpers::text_webhook_at(&id, &from, "hello", now);
        let response = post_webhook(&client, &sabi.url(""), body).await;
        assert_eq!(response.status(), 200);
    }
    eventually_seen("twenty replies out", Duration::from_secs(60), || async {
        if fake.accepted().len() >= 20 {
            Ok(())
        } else {
            Err(format!(
                "{:?} {:?}",
                fake.received().len(),
                sabi.logs().iter().rev().take(30).collect::<Vec<_>>()
            ))
        }
    })
    .await;
    sabi.kill9();
    let _sabi = SabiProcess::start_with(dir.path(), &env);

    // Settled: nothing waits to be sent or is under way.
    let outbox = eventually_seen("the outbox to settle", Duration::from_secs(300), || async {
        let outbox = crate::helpers::json_lines(dir.path(), &["outbox", "--json"]);
        let moving = outbox.iter().any(|part| {
            matches!(
                part["state"].as_str(),
                Some("queued" | "claimed" | "sending")
            )
        });
        if outbox.len() == CUSTOMERS && !moving {
            Ok(outbox)
        } else {
            Err(format!("{outbox:?}"))
        }
    })
    .await;
    let in_state = |state: &str| outbox.iter().filter(|p| p["state"] == state).count();
    let texts: Vec<String> = fake
        .accepted()
        .iter()
        .filter_map(|r| r.recipient().map(str::to_owned))
        .collect();
    let unique: HashSet<&String> = texts.iter().collect();
    assert_eq!(unique.len(), texts.len(), "a customer got a reply twice");
    let unknown = in_state("unknown");
    assert!(
        unknown <= 6,
        "{unknown} parts left unknown: more than the requests on the wire"
    );
    assert_eq!(in_state("accepted") + unknown, CUSTOMERS, "{outbox:?}");
}
