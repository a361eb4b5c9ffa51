//! The sender against the fake Graph API: pacing per number and per recipient, order, at most
//! once, throttling storms, lost answers, the 24-hour window, long texts, and expired tokens.
//! Sabi runs whole (ingress, scheduler, sender) on the real clock; the shutdown grace is tested
//! on the send loop alone, on a manual clock.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use sabi::app::{App, Role};
use sabi::clock::{At, Clock, ManualClock, SystemClock};
use sabi::config::SenderSettings;
use sabi::domain::{Batch, BatchPolicy, ReplyPart};
use sabi::sender::Sender;
use sabi::store::{
    self, Ending, Ingest, OutboxEntry, SendClaim, SendResult, SqliteStore, Store, send_callback,
};
use sabi::store::{BroadcastView, ReviewQuery};
use sabi::testing::graph::{FakeGraph, Received, Webhooks};
use sabi::turn::{TurnError, TurnHandler, TurnOutcome};
use sabi::whatsapp::graph::Graph;
use tokio_util::sync::CancellationToken;

use crate::conformance::message;
use crate::helpers::{
    PATIENCE, SECRET, StoreLock, config, eventually, eventually_seen, eventually_some, ms,
    post_webhook, text_webhook_at,
};

const TOKEN: &str = "it-graph-token";

/// Replies to every batch with `parts` numbered parts, naming the customer.
pub struct Parts(pub usize);

#[async_trait::async_trait]
impl TurnHandler for Parts {
    async fn handle(&self, batch: &Batch) -> Result<TurnOutcome, TurnError> {
        let customer = &batch.conversation.customer;
        Ok(TurnOutcome::Reply(
            (0..self.0)
                .map(|i| ReplyPart::text(format!("{customer} part {i}")))
                .collect(),
        ))
    }
}

/// Replies with a fixed text.
pub struct Says(pub String);

#[async_trait::async_trait]
impl TurnHandler for Says {
    async fn handle(&self, _batch: &Batch) -> Result<TurnOutcome, TurnError> {
        Ok(TurnOutcome::Reply(vec![ReplyPart::text(self.0.clone())]))
    }
}

/// Sabi with a sender, talking to a fake Graph API that sends status webhooks back.
pub struct Sending {
    pub fake: FakeGraph,
    pub store: Arc<dyn Store>,
    pub client: reqwest::Client,
    pub url: String,
    shutdown: CancellationToken,
    dir: tempfile::TempDir,
}

impl Sending {
    pub async fn start(handler: Arc<dyn TurnHandler>, extra: &[(&str, &str)]) -> Sending {
        let dir = tempfile::tempdir().expect("tempdir");
        Sending::launch(dir, Some(handler), extra, true).await
    }

    /// Sabi with its store (and `sabi.toml`, if the test wrote one) in `dir`; the fake sends
    /// status webhooks back when `statuses_to_sabi`.
    pub async fn launch(
        dir: tempfile::TempDir,
        handler: Option<Arc<dyn TurnHandler>>,
        extra: &[(&str, &str)],
        statuses_to_sabi: bool,
    ) -> Sending {
        let fake = FakeGraph::start(TOKEN).await;
        let base = fake.base_url();
        let mut env = vec![
            ("SABI_WHATSAPP_ACCESS_TOKEN", TOKEN),
            ("SABI_WHATSAPP_API_BASE", base.as_str()),
            ("SABI_BATCH_WINDOW", "0"),
            // These tests follow replies of several parts as several messages.
            ("SABI_MAX_REPLY_PARTS", "10"),
        ];
        env.extend_from_slice(extra);
        let config = config(dir.path(), &env);
        let app = App::build_with(&config, Role::All, Arc::new(SystemClock), handler)
            .await
            .expect("app builds");
        let url = format!("http://{}", app.addr().expect("bound"));
        if statuses_to_sabi {
            fake.deliver_statuses_to(Webhooks {
                url: format!("{url}/webhook/whatsapp"),
                app_secret: SECRET.into(),
            });
        }
        let store = app.store();
        let shutdown = app.shutdown_token();
        tokio::spawn(app.run_until_stopped());
        Sending {
            fake,
            store,
            client: reqwest::Client::new(),
            url,
            shutdown,
            dir,
        }
    }

    /// Where its store is: the CLI run with `sabi_command(dir)` reads the same.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// A customer's text message, sent `age_s` seconds ago.
    pub async fn customer_writes(&self, id: &str, from: &str, text: &str, age_s: i64) {
        let body = text_webhook_at(id, from, text, now_s() - age_s);
        self.post_webhook(body).await;
    }

    /// A customer writes to the business number `business`, now.
    pub async fn customer_writes_to(&self, business: &str, id: &str, from: &str, text: &str) {
        let at = u64::try_from(now_s()).expect("positive timestamp");
        let value =
            sabi::whatsapp::wire::text_webhook(business, from, "Test Customer", id, at, text);
        self.post_webhook(sabi::whatsapp::wire::encode(&value).into_bytes())
            .await;
    }

    /// Posts `body`, signed as Meta signs it; Sabi must acknowledge it.
    pub async fn post_webhook(&self, body: Vec<u8>) {
        let response = post_webhook(&self.client, &self.url, body).await;
        assert_eq!(response.status(), 200);
    }

    pub async fn outbox(&self) -> Vec<OutboxEntry> {
        self.store.outbox(None).await.expect("outbox")
    }

    /// Waits until `done` holds for the outbox (or fails after `limit`).
    pub async fn wait_for(&self, limit: Duration, done: impl Fn(&[OutboxEntry]) -> bool) {
        eventually_seen("the outbox", limit, || async {
            let outbox = self.outbox().await;
            if done(&outbox) {
                Ok(())
            } else {
                Err(format!("outbox states {:?}", states(&outbox)))
            }
        })
        .await;
    }

    /// Waits until broadcast `id` is as `done` says and returns it; the test fails after
    /// `patience`, showing the broadcast as it last was.
    pub async fn broadcast_when(
        &self,
        id: i64,
        patience: Duration,
        done: impl Fn(&BroadcastView) -> bool,
    ) -> BroadcastView {
        eventually_seen("the broadcast", patience, || async {
            let b = self.store.broadcast(id).await.expect("read").expect("kept");
            if done(&b) {
                Ok(b)
            } else {
                Err(format!("{b:?}"))
            }
        })
        .await
    }

    /// `POST /admin/broadcasts` with the admin `token`: the status and the JSON answer.
    pub async fn post_broadcast(
        &self,
        token: &str,
        body: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        crate::helpers::post_broadcast(&self.client, &self.url, token, body).await
    }

    pub async fn metrics(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn states(outbox: &[OutboxEntry]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for entry in outbox {
        *counts.entry(entry.state.to_string()).or_default() += 1;
    }
    counts
}

fn all_accepted(count: usize) -> impl Fn(&[OutboxEntry]) -> bool {
    move |outbox| outbox.len() == count && outbox.iter().all(|e| e.state == "accepted")
}

pub fn customer(i: usize) -> String {
    format!("23480{i:08}")
}

/// The most requests seen in any one-second window.
fn busiest_second(sends: &[Received]) -> usize {
    let mut times: Vec<_> = sends.iter().map(|r| r.at).collect();
    times.sort();
    let mut most = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end] - times[start] >= Duration::from_secs(1) {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

/// Checks the invariants of delivered load: every part once, in order per customer, spaced.
fn check_delivery(sends: &[Received], customers: usize, parts: usize, spacing: Duration) {
    let texts: Vec<&str> = sends.iter().filter_map(Received::text).collect();
    let unique: HashSet<&str> = texts.iter().copied().collect();
    assert_eq!(texts.len(), unique.len(), "a part was sent twice");
    assert_eq!(texts.len(), customers * parts, "every part is sent");
    let mut per_customer: HashMap<&str, Vec<&Received>> = HashMap::new();
    for send in sends {
        per_customer
            .entry(send.recipient().expect("recipient"))
            .or_default()
            .push(send);
    }
    for (to, sends) in per_customer {
        let order: Vec<&str> = sends.iter().filter_map(|s| s.text()).collect();
        let expected: Vec<String> = (0..parts).map(|i| format!("{to} part {i}")).collect();
        assert_eq!(order, expected, "order for {to}");
        for pair in sends.windows(2) {
            let gap = pair[1].at - pair[0].at;
            assert!(gap >= spacing, "{to} got two messages {gap:?} apart");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_keep_the_rate_the_spacing_and_the_order_and_go_once() {
    let (customers, parts, rate) = (500, 10, 400);
    let sabi = Sending::start(
        Arc::new(Parts(parts)),
        &[
            ("SABI_OUTBOUND_RATE", "400"),
            ("SABI_PAIR_SPACING", "200ms"),
            ("SABI_TURNS", "20"),
        ],
    )
    .await;
    // Status webhooks race the send answers, as they may with Meta.
    sabi.fake.send_statuses(true);
    for i in 0..customers {
        sabi.customer_writes(&format!("wamid.in{i}"), &customer(i), "hello", 0)
            .await;
    }
    // A give-up, not a speed check: alone this takes about half a minute on any store, but a CI
    // pass on a loaded PostgreSQL has taken over two minutes.
    sabi.wait_for(Duration::from_secs(360), all_accepted(customers * parts))
        .await;
    let sends = sabi.fake.accepted();
    let busiest = busiest_second(&sends);
    assert!(
        busiest <= rate,
        "{busiest} sends in one second, over {rate}"
    );
    check_delivery(&sends, customers, parts, Duration::from_millis(200));
}

#[tokio::test]
async fn a_reply_in_several_parts_goes_as_one_message_by_default() {
    let sabi = Sending::start(Arc::new(Parts(3)), &[("SABI_MAX_REPLY_PARTS", "1")]).await;
    let to = customer(7);
    sabi.customer_writes("wamid.in7", &to, "hello", 0).await;
    sabi.wait_for(Duration::from_secs(30), all_accepted(1))
        .await;
    let sends = sabi.fake.accepted();
    let texts: Vec<&str> = sends.iter().filter_map(|s| s.text()).collect();
    assert_eq!(
        texts,
        [format!("{to} part 0\n\n{to} part 1\n\n{to} part 2")],
        "Meta bills each message"
    );
}

/// A customer's message naming them by `bsuid`, and by `number` once Meta shows it.
fn named_webhook(id: &str, number: Option<&str>, bsuid: &str) -> Vec<u8> {
    let at = u64::try_from(now_s()).expect("positive timestamp");
    let mut value =
        sabi::whatsapp::wire::text_webhook("100000000000001", bsuid, "Ada", id, at, "hello");
    let change = &mut value["entry"][0]["changes"][0]["value"];
    change["contacts"][0] = serde_json::json!({"profile": {"name": "Ada"}, "user_id": bsuid});
    let message = &mut change["messages"][0];
    message["from_user_id"] = bsuid.into();
    match number {
        Some(number) => {
            message["from"] = number.into();
            change["contacts"][0]["wa_id"] = number.into();
        }
        None => {
            message.as_object_mut().expect("object").remove("from");
        }
    }
    sabi::whatsapp::wire::encode(&value).into_bytes()
}

#[tokio::test]
async fn a_reply_goes_to_the_number_once_meta_has_shown_one_else_to_the_bsuid() {
    let sabi = Sending::start(Arc::new(Parts(1)), &[]).await;
    let bsuid = "NG.8812734650192837";
    sabi.post_webhook(named_webhook("wamid.b1", None, bsuid))
        .await;
    sabi.wait_for(Duration::from_secs(30), all_accepted(1))
        .await;
    // The customer shows their number: the same customer, now sent to by number.
    sabi.post_webhook(named_webhook("wamid.b2", Some("2348031234567"), bsuid))
        .await;
    sabi.wait_for(Duration::from_secs(30), all_accepted(2))
        .await;
    let sends = sabi.fake.accepted();
    let addressed: Vec<(&str, &serde_json::Value)> = sends
        .iter()
        .map(|s| {
            let key = if s.body.get("to").is_some() {
                "to"
            } else {
                "recipient"
            };
            (key, &s.body[key])
        })
        .collect();
    assert_eq!(
        addressed,
        [
            ("recipient", &bsuid.into()),
            ("to", &"2348031234567".into())
        ]
    );
    let conversations: Vec<String> = sabi
        .outbox()
        .await
        .iter()
        .map(|o| o.conversation.customer.clone())
        .collect();
    assert_eq!(
        conversations,
        [bsuid, bsuid],
        "one customer, keyed as first met"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttling_storm_delays_but_loses_and_doubles_nothing() {
    let (customers, parts) = (100, 5);
    let sabi = Sending::start(
        Arc::new(Parts(parts)),
        &[
            ("SABI_OUTBOUND_RATE", "200"),
            ("SABI_PAIR_SPACING", "50ms"),
            ("SABI_TURNS", "20"),
        ],
    )
    .await;
    for i in 0..customers {
        sabi.customer_writes(&format!("wamid.in{i}"), &customer(i), "hello", 0)
            .await;
    }
    sabi.wait_for(Duration::from_secs(60), |outbox| {
        outbox.iter().filter(|e| e.state == "accepted").count() >= 100
    })
    .await;
    // Meta's 130429, then plain HTTP 429 with Retry-After.
    sabi.fake.throttle_storm(&[
        (Duration::from_secs(1), false),
        (Duration::from_secs(1), true),
    ]);
    sabi.wait_for(Duration::from_secs(120), all_accepted(customers * parts))
        .await;
    let sends = sabi
        .fake
        .received()
        .iter()
        .filter(|r| r.is_message())
        .count();
    assert!(
        sends > sabi.fake.accepted().len(),
        "the storm refused sends"
    );
    check_delivery(
        &sabi.fake.accepted(),
        customers,
        parts,
        Duration::from_millis(50),
    );
    assert!(sabi.metrics().await.contains("outcome=\"throttled\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_never_resent_and_the_status_webhook_settles_it() {
    let sabi = Sending::start(
        Arc::new(Parts(2)),
        &[
            ("SABI_SEND_TIMEOUT", "300ms"),
            ("SABI_PAIR_SPACING", "200ms"),
        ],
    )
    .await;
    sabi.fake.stall_next(1);
    let from = customer(1);
    sabi.customer_writes("wamid.in1", &from, "hello", 0).await;
    sabi.wait_for(Duration::from_secs(30), |outbox| {
        outbox.len() == 2
            && outbox.iter().all(|e| e.state == "accepted")
            && outbox[0].delivery.map(|d| d.as_str()) == Some("delivered")
    })
    .await;
    let sends = sabi.fake.accepted();
    assert_eq!(sends.len(), 2, "the stalled part was not sent again");
    let outbox = sabi.outbox().await;
    assert_eq!(
        outbox[0].wamid, sends[0].wamid,
        "the status webhook named it"
    );
    assert_eq!(outbox[0].attempts, 1);
    assert_eq!(sends[1].text(), Some(format!("{from} part 1").as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_without_a_status_goes_to_review() {
    let sabi = Sending::launch(
        tempfile::tempdir().expect("tempdir"),
        Some(Arc::new(Parts(1))),
        &[
            ("SABI_SEND_TIMEOUT", "300ms"),
            ("SABI_UNKNOWN_OUTCOME_WAIT", "1s"),
        ],
        false,
    )
    .await;
    sabi.fake.stall_next(1);
    sabi.customer_writes("wamid.in1", &customer(1), "hello", 0)
        .await;
    sabi.wait_for(Duration::from_secs(30), |outbox| {
        outbox.len() == 1 && outbox[0].state == "review"
    })
    .await;
    let review = sabi
        .store
        .review_queue(ReviewQuery::default())
        .await
        .expect("review");
    assert_eq!(review.len(), 1);
    assert_eq!(review[0].reason.as_str(), "unknown_outcome");
    assert_eq!(review[0].outbox_id, Some(sabi.outbox().await[0].id));
    assert_eq!(sabi.fake.accepted().len(), 1, "never sent twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_the_window_the_template_goes_or_the_reply_waits_for_a_person() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("sabi.toml"),
        "[whatsapp.window_template]\nname = \"reply_waiting\"\nlanguage = \"en_US\"\nparameters = [\"Sabi\"]\n",
    )
    .expect("write sabi.toml");
    // Batches may be answered a day late here, so the window can close before the reply.
    let late = [("SABI_REVIEW_AFTER", "48h")];
    let sabi = Sending::launch(dir, Some(Arc::new(Parts(2))), &late, true).await;
    sabi.fake.send_statuses(true);
    sabi.customer_writes("wamid.old", &customer(1), "hello?", 25 * 3600)
        .await;
    // Meta fails texts outside the window asynchronously (131047): the first part goes again
    // as the template.
    sabi.fake.close_window(&customer(2));
    sabi.customer_writes("wamid.new", &customer(2), "hello", 0)
        .await;
    let settled = |e: &OutboxEntry| {
        (e.part == 0
            && e.state == "accepted"
            && e.delivery.map(|d| d.as_str()) == Some("delivered"))
            || (e.part == 1 && e.state == "review")
    };
    sabi.wait_for(Duration::from_secs(30), |outbox| {
        outbox.len() == 4 && outbox.iter().all(settled)
    })
    .await;
    let outbox = sabi.outbox().await;
    // One template per reply, and its own statuses; the rest waits for a person.
    assert!(
        outbox
            .iter()
            .filter(|e| e.part == 0)
            .all(|e| e.kind == "template"),
        "{outbox:?}"
    );
    let review = sabi
        .store
        .review_queue(ReviewQuery::default())
        .await
        .expect("review");
    assert_eq!(review.len(), 2);
    assert!(review.iter().all(|r| r.reason.as_str() == "window_closed"));
    let kinds: Vec<String> = sabi
        .fake
        .received()
        .iter()
        .filter(|r| r.is_message())
        .filter_map(|r| r.body["type"].as_str().map(str::to_owned))
        .collect();
    let count = |kind: &str| kinds.iter().filter(|k| *k == kind).count();
    assert_eq!(count("template"), 2, "{kinds:?}");
    // Only the new conversation's texts went, and Meta failed them.
    assert!(count("text") <= 2, "{kinds:?}");

    // Meta refuses a text at once with 131047 although Sabi thought the window open.
    sabi.fake.fail_next(&[(400, 131_047)]);
    sabi.customer_writes("wamid.third", &customer(3), "hello", 0)
        .await;
    sabi.wait_for(Duration::from_secs(30), |outbox| {
        outbox.len() == 6 && outbox[4].state == "accepted" && outbox[4].kind == "template"
    })
    .await;

    let no_template = Sending::start(Arc::new(Says("hi".into())), &late).await;
    no_template
        .customer_writes("wamid.old", &customer(1), "hello?", 25 * 3600)
        .await;
    no_template
        .wait_for(Duration::from_secs(30), |outbox| {
            outbox.len() == 1 && outbox[0].state == "review"
        })
        .await;
    let review = no_template
        .store
        .review_queue(ReviewQuery::default())
        .await
        .expect("review");
    assert_eq!(review[0].reason.as_str(), "window_closed");
    assert!(no_template.fake.accepted().is_empty(), "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_replies_are_split_whole_and_in_order() {
    let paragraph = "Your transfer of ₦25,000 to Ada 👩🏽‍💻 is on its way. ".repeat(40);
    let text = format!("{paragraph}\n\n{paragraph}\n\n{paragraph}🇳🇬");
    let sabi = Sending::start(Arc::new(Says(text.clone())), &[("SABI_PAIR_SPACING", "0")]).await;
    sabi.customer_writes("wamid.in1", &customer(1), "status?", 0)
        .await;
    sabi.wait_for(Duration::from_secs(30), |outbox| {
        !outbox.is_empty() && outbox.iter().all(|e| e.state == "accepted")
    })
    .await;
    let parts: Vec<String> = sabi
        .fake
        .accepted()
        .iter()
        .filter_map(|r| r.text().map(str::to_owned))
        .collect();
    assert!(parts.len() >= 2, "{} parts", parts.len());
    for part in &parts {
        assert!(part.encode_utf16().count() <= 4096);
    }
    let squash = |s: &str| s.split_whitespace().collect::<String>();
    assert_eq!(
        squash(&parts.concat()),
        squash(&text),
        "nothing lost or cut apart"
    );
    assert!(parts.concat().matches("👩🏽‍💻").count() == 120);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_halts_the_number_loses_nothing_and_raises_the_alert() {
    let sabi = Sending::start(Arc::new(Parts(3)), &[("SABI_PAIR_SPACING", "0")]).await;
    sabi.fake.expire_token();
    for i in 0..5 {
        sabi.customer_writes(&format!("wamid.in{i}"), &customer(i), "hello", 0)
            .await;
    }
    sabi.wait_for(Duration::from_secs(30), |outbox| outbox.len() == 15)
        .await;
    // Halted: the alert raised and every part back in the queue.
    eventually_seen("the number halted on its dead token", PATIENCE, || async {
        let outbox = sabi.outbox().await;
        let halted = sabi.metrics().await.contains("sabi_halted_numbers 1");
        if halted && outbox.iter().all(|e| e.state == "queued") {
            Ok(())
        } else {
            Err(format!(
                "halted: {halted}, outbox states {:?}",
                states(&outbox)
            ))
        }
    })
    .await;
    let tried = sabi
        .fake
        .received()
        .iter()
        .filter(|r| r.is_message())
        .count();
    assert!(
        (1..=5).contains(&tried),
        "{tried} sends tried with a dead token"
    );
    let outbox = sabi.outbox().await;
    assert!(
        outbox
            .iter()
            .all(|e| e.state == "queued" && e.wamid.is_none()),
        "{:?}",
        states(&outbox)
    );
    // Nothing happens for a halted number, so there is nothing to wait for: a second of quiet
    // is the proof that no send is tried.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        sabi.fake
            .received()
            .iter()
            .filter(|r| r.is_message())
            .count(),
        tried,
        "nothing more is tried once halted"
    );
    let metrics = sabi.metrics().await;
    assert!(
        metrics.contains("sabi_halted_numbers 1"),
        "the alert is visible in /metrics"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typing_indicator_shows_for_answered_batches_only() {
    let sabi = Sending::start(Arc::new(Says("hi".into())), &[]).await;
    sabi.customer_writes("wamid.fresh", &customer(1), "hello", 0)
        .await;
    // Older than the 15-minute limit: a person answers it, so no indicator.
    sabi.customer_writes("wamid.stale", &customer(2), "hello", 3600)
        .await;
    sabi.wait_for(Duration::from_secs(30), |outbox| {
        outbox.len() == 1 && outbox[0].state == "accepted"
    })
    .await;
    let receipts: Vec<Received> = sabi
        .fake
        .received()
        .into_iter()
        .filter(|r| !r.is_message())
        .collect();
    assert_eq!(receipts.len(), 1, "{receipts:?}");
    assert_eq!(receipts[0].body["message_id"], "wamid.fresh");
    assert_eq!(receipts[0].body["typing_indicator"]["type"], "text");
    let first_message = sabi.fake.accepted()[0].at;
    assert!(
        receipts[0].at <= first_message,
        "typing shows before the reply"
    );
}

/// With the typing indicator turned off, an answered message is still marked read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_typing_indicator_messages_are_still_marked_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("sabi.toml"),
        "[whatsapp]\ntyping_indicator = false\n",
    )
    .expect("write sabi.toml");
    let sabi = Sending::launch(dir, Some(Arc::new(Says("hi".into()))), &[], true).await;
    sabi.customer_writes("wamid.quiet", &customer(1), "hello", 0)
        .await;
    sabi.wait_for(Duration::from_secs(30), all_accepted(1))
        .await;
    let marked = |r: &Received| !r.is_message() && r.body["message_id"] == "wamid.quiet";
    eventually("the read receipt", || async {
        sabi.fake.received().iter().any(marked)
    })
    .await;
    let receipt = sabi
        .fake
        .received()
        .into_iter()
        .find(marked)
        .expect("receipt");
    assert_eq!(receipt.body["status"], "read");
    assert!(
        receipt.body.get("typing_indicator").is_none(),
        "no indicator"
    );
}

/// Read receipts are never dropped: 300 customers on a 20-a-second number saturate it with
/// replies, and every one of their messages is still marked read; while replies wait, receipts
/// take no more than about a tenth of the number's calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answered_message_is_marked_read_while_replies_keep_the_number() {
    let customers = 300;
    let sabi = Sending::start(
        Arc::new(Says("hi".into())),
        &[("SABI_OUTBOUND_RATE", "20"), ("SABI_TURNS", "32")],
    )
    .await;
    for i in 0..customers {
        sabi.customer_writes(&format!("wamid.in{i}"), &customer(i), "hello", 0)
            .await;
    }
    sabi.wait_for(Duration::from_secs(120), all_accepted(customers))
        .await;
    let read = |received: &[Received]| -> HashSet<String> {
        received
            .iter()
            .filter(|r| !r.is_message() && r.body["status"] == "read")
            .filter_map(|r| r.body["message_id"].as_str().map(str::to_owned))
            .collect()
    };
    eventually_seen(
        "every message marked read",
        Duration::from_secs(120),
        || async {
            let marked = read(&sabi.fake.received()).len();
            if marked < customers {
                Err(format!("{marked} of {customers} messages marked read"))
            } else {
                Ok(())
            }
        },
    )
    .await;
    // While replies still waited (from the first reply to the last), receipts kept to their
    // share of the number's calls.
    let received = sabi.fake.received();
    let replies = sabi.fake.accepted();
    let first = replies.iter().map(|r| r.at).min().expect("replies");
    let last = replies.iter().map(|r| r.at).max().expect("replies");
    let during: Vec<&Received> = received
        .iter()
        .filter(|r| r.at >= first && r.at <= last)
        .collect();
    let receipts = during.iter().filter(|r| !r.is_message()).count();
    assert!(
        receipts * 100 <= during.len() * 15,
        "{receipts} of {} calls were receipts while replies waited",
        during.len()
    );
}

/// Each number's receipts drain on their own: a number whose replies keep it busy (one
/// request a second, 90 customers answered at once) never keeps another number's customer
/// waiting for their read receipt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_number_never_holds_back_another_numbers_read_receipts() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("sabi.toml"),
        "[whatsapp]\ntyping_indicator = false\n",
    )
    .expect("write sabi.toml");
    let rate = [("SABI_OUTBOUND_RATE", "1"), ("SABI_TURNS", "32")];
    let sabi = Sending::launch(dir, Some(Arc::new(Says("hi".into()))), &rate, true).await;
    // Enough that the busy number's replies and receipts take minutes to drain: the other
    // number's receipt must come first even on a machine loaded enough to slow its turn.
    for i in 0..90 {
        sabi.customer_writes(&format!("wamid.busy{i}"), &customer(i), "hello", 0)
            .await;
    }
    // Their receipts wait behind the busy number's replies, a slot in ten.
    let receipt = |id: &str| {
        sabi.fake
            .received()
            .iter()
            .position(|r| !r.is_message() && r.body["message_id"] == id)
    };
    eventually("two of the busy number's replies", || async {
        sabi.fake.accepted().len() >= 2
    })
    .await;
    sabi.customer_writes_to("100000000000002", "wamid.other", &customer(99), "hello")
        .await;
    // The other number is idle: its customer's message is marked read as soon as it is
    // answered, not after the busy number's 90 receipts (three minutes once its replies are out).
    // What counts is the order of the receipts, not how long a loaded machine took.
    let other = eventually_some(
        "the other number's receipt",
        Duration::from_secs(120),
        || async { receipt("wamid.other") },
    )
    .await;
    assert!(
        receipt("wamid.busy89").is_none_or(|busy| busy > other),
        "the other number's customer waited behind the busy number's receipts"
    );
}

/// A status webhook for a message Sabi sent, as Meta writes it.
fn status_webhook(
    wamid: &str,
    status: &str,
    callback: Option<&str>,
    error: Option<i64>,
) -> Vec<u8> {
    let mut item = serde_json::json!({
        "id": wamid, "status": status, "timestamp": "1781000000", "recipient_id": customer(1),
    });
    if let Some(callback) = callback {
        item["biz_opaque_callback_data"] = callback.into();
    }
    if let Some(code) = error {
        item["errors"] = serde_json::json!([{"code": code, "title": "failed"}]);
    }
    let body = serde_json::json!({"object": "whatsapp_business_account", "entry": [{"id": "1",
        "changes": [{"field": "messages", "value": {"messaging_product": "whatsapp",
            "metadata": {"phone_number_id": "100000000000001"}, "statuses": [item]}}]}]});
    sabi::whatsapp::wire::encode(&body).into_bytes()
}

#[tokio::test]
async fn the_outbox_holds_order_fences_sends_and_never_downgrades_statuses() {
    let fake = FakeGraph::start(TOKEN).await;
    let base = fake.base_url();
    let app = crate::helpers::TestApp::spawn_with(
        Some(Arc::new(Parts(2))),
        &[
            ("SABI_WHATSAPP_ACCESS_TOKEN", TOKEN),
            ("SABI_WHATSAPP_API_BASE", base.as_str()),
            ("SABI_BATCH_WINDOW", "0"),
            ("SABI_MAX_REPLY_PARTS", "2"),
        ],
    )
    .await;
    let webhook = crate::helpers::text_webhook("wamid.in1", &customer(1), "hello");
    assert_eq!(app.post_whatsapp_webhook(webhook).await.status(), 200);
    app.scheduler.drain().await.expect("turn");
    let claim = |now: At| SendClaim {
        now,
        lease: ms(1_000),
        unknown_wait: ms(60_000),
        limit: 10,
        halted: Vec::new(),
    };
    let now = app.clock.now();

    // Only the head of the customer's queue is claimable.
    let jobs = app.store.claim_sends(claim(now)).await.expect("claim").jobs;
    assert_eq!(jobs.len(), 1);
    let head = &jobs[0];
    assert_eq!(head.part, 0);
    app.store
        .depart(head.id, head.attempt, now, ms(1_000))
        .await
        .expect("departed");
    let stale = app
        .store
        .record_send(head.id, head.attempt + 1, now, SendResult::Untried)
        .await;
    assert!(matches!(stale, Err(store::Error::LeaseLost)));

    // The sender vanished mid-send: the part may have left, so it is never claimed again,
    // and it still blocks the part after it.
    let later = now + ms(5_000);
    assert!(
        app.store
            .claim_sends(claim(later))
            .await
            .expect("claim")
            .jobs
            .is_empty()
    );
    assert_eq!(
        app.store.outbox(None).await.expect("outbox")[0].state,
        "unknown"
    );

    // Its status webhook settles it; statuses never go backwards.
    let callback = send_callback(head.id, head.attempt);
    for status in ["read", "delivered", "sent"] {
        let body = status_webhook("wamid.OUT1", status, Some(&callback), None);
        assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    }
    let outbox = app.store.outbox(None).await.expect("outbox");
    assert_eq!(outbox[0].state, "accepted");
    assert_eq!(outbox[0].wamid.as_deref(), Some("wamid.OUT1"));
    assert_eq!(outbox[0].delivery.map(|d| d.as_str()), Some("read"));

    // Now the next part goes; Meta fails it later for good: a person is told.
    let jobs = app
        .store
        .claim_sends(claim(later))
        .await
        .expect("claim")
        .jobs;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].part, 1);
    app.store
        .depart(jobs[0].id, jobs[0].attempt, later, ms(10_000))
        .await
        .expect("departed");
    let accepted = SendResult::Accepted {
        wamid: "wamid.OUT2".into(),
        template: false,
        next_send_at: later,
    };
    app.store
        .record_send(jobs[0].id, jobs[0].attempt, later, accepted)
        .await
        .expect("recorded");
    let retry = SendResult::Retry {
        at: later,
        failure: true,
        code: None,
        error: "a second answer".into(),
        recipient_after: None,
    };
    let twice = app
        .store
        .record_send(jobs[0].id, jobs[0].attempt, later, retry)
        .await;
    assert!(
        matches!(twice, Err(store::Error::LeaseLost)),
        "recorded once"
    );
    let body = status_webhook("wamid.OUT2", "failed", None, Some(131_026));
    assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    let outbox = app.store.outbox(None).await.expect("outbox");
    assert_eq!(outbox[1].state, "failed");
    assert_eq!(outbox[1].error_code, Some(131_026));
    let review = app
        .store
        .review_queue(ReviewQuery::default())
        .await
        .expect("review");
    assert_eq!(review.len(), 1);
    assert_eq!(review[0].reason.as_str(), "send_failed");
    assert_eq!(review[0].outbox_id, Some(outbox[1].id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_offers_quick_replies_as_buttons_and_a_tap_routes_on_its_own() {
    let sabi = Sending::launch(tempfile::tempdir().expect("tempdir"), None, &[], true).await;
    sabi.customer_writes("wamid.hi", &customer(1), "good morning", 0)
        .await;
    sabi.wait_for(Duration::from_secs(30), |outbox| {
        outbox.len() == 1 && outbox[0].state == "accepted"
    })
    .await;
    let greeting = &sabi.fake.accepted()[0];
    assert_eq!(greeting.body["type"], "interactive");
    let buttons = greeting.body["interactive"]["action"]["buttons"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(buttons.len(), 3);
    let title = buttons[1]["reply"]["title"].as_str().unwrap_or_default();
    assert_eq!(title, "Track my order");
    // The customer taps it: it arrives as a text with the button's title, and routes.
    sabi.customer_writes("wamid.tap", &customer(1), title, 0)
        .await;
    sabi.wait_for(Duration::from_secs(30), |outbox| {
        outbox.len() == 2 && outbox[1].state == "accepted"
    })
    .await;
    let answer = sabi.fake.accepted()[1]
        .text()
        .unwrap_or_default()
        .to_owned();
    assert!(answer.to_lowercase().contains("order"), "{answer}");
}

#[tokio::test]
async fn media_is_looked_up_and_downloaded_with_the_token_within_a_size_limit() {
    use sabi::whatsapp::graph::{Graph, GraphError};
    let fake = FakeGraph::start(TOKEN).await;
    fake.add_media("media.1", "audio/ogg; codecs=opus", vec![7u8; 2048]);
    let graph = Graph::new(
        &fake.base_url(),
        TOKEN.to_owned().into(),
        Duration::from_secs(5),
    )
    .expect("client");
    let info = graph.media("media.1").await.expect("media info");
    assert_eq!(info.mime_type, "audio/ogg; codecs=opus");
    assert_eq!(
        graph.download(&info.url, 4096).await.expect("bytes").len(),
        2048
    );
    assert!(matches!(
        graph.download(&info.url, 1024).await,
        Err(GraphError::TooLarge(1024))
    ));
    let stranger = Graph::new(
        &fake.base_url(),
        "wrong".to_owned().into(),
        Duration::from_secs(5),
    )
    .expect("client");
    assert!(matches!(
        stranger.download(&info.url, 4096).await,
        Err(GraphError::Api { status: 401, .. })
    ));
}

/// Meta's answer comes while the store cannot commit: the sender keeps trying to record it
/// within its lease, and the part ends accepted with Meta's id, not left to wait as unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_comes_while_the_store_is_away_is_recorded_when_it_is_back() {
    let sabi = Sending::launch(
        tempfile::tempdir().expect("tempdir"),
        Some(Arc::new(Parts(1))),
        &[("SABI_SEND_TIMEOUT", "30s")],
        false,
    )
    .await;
    sabi.fake.answer_after(Duration::from_millis(500));
    sabi.customer_writes("wamid.in1", &customer(1), "hello", 0)
        .await;
    eventually_some("a send", Duration::from_secs(10), || async {
        (!sabi.fake.accepted().is_empty()).then_some(())
    })
    .await;

    // Meta has the send; the store is locked before its answer comes, for longer than the
    // store waits for a lock, so the first record fails. A failed write leaves no trace to
    // wait for: the lock is held for a fixed time past the store's wait.
    let lock = StoreLock::take(sabi.dir.path());
    tokio::time::sleep(Duration::from_millis(6500)).await;
    lock.release();

    sabi.wait_for(Duration::from_secs(10), |outbox| {
        outbox.len() == 1 && outbox[0].state == "accepted"
    })
    .await;
    let outbox = sabi.outbox().await;
    assert_eq!(outbox[0].wamid, sabi.fake.accepted()[0].wamid);
    assert_eq!(outbox[0].attempts, 1, "sent once");
    assert_eq!(sabi.fake.accepted().len(), 1);
}

/// The send loop alone, on a manual clock, with one reply part queued for a customer who
/// wrote just now.
struct LoneSender {
    sender: Arc<Sender>,
    store: Arc<dyn Store>,
    clock: Arc<ManualClock>,
    fake: FakeGraph,
    _dir: tempfile::TempDir,
}

impl LoneSender {
    async fn start() -> LoneSender {
        let now = SystemClock.now();
        let clock = ManualClock::new(now);
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::open(&dir.path().join("sabi.db"), crate::helpers::marks())
                .await
                .expect("store"),
        );
        let delivery = Ingest {
            routine: Default::default(),
            items: vec![message("wamid.g1", &customer(1), "hello", now)],
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
        let claim = store.claim(now, ms(60_000), 1, None).await.expect("claim");
        let reply = Ending::Replied {
            parts: vec![ReplyPart::text("hi")],
            sandbox: false,
        };
        store
            .finish(claim[0].batch.id, claim[0].token, now, reply)
            .await
            .expect("finish");
        let fake = FakeGraph::start(TOKEN).await;
        let graph = Graph::new(
            &fake.base_url(),
            TOKEN.to_owned().into(),
            Duration::from_secs(60),
        )
        .expect("client");
        let settings = SenderSettings {
            rate: 80,
            pair_spacing: Duration::ZERO,
            lease: Duration::from_secs(10),
            send_lease: Duration::from_secs(180),
            unknown_wait: Duration::from_secs(600),
            max_failures: 6,
            retry_base: Duration::from_secs(2),
            window: Duration::from_secs(24 * 3600),
            template: None,
            in_flight: 4,
            poll_interval: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(10),
        };
        let sender = Sender::new(
            store.clone(),
            clock.clone(),
            graph,
            settings,
            sabi::metrics::Metrics::new(),
        );
        LoneSender {
            sender,
            store,
            clock,
            fake,
            _dir: dir,
        }
    }

    /// Runs the loop until its part is on the wire, then tells it to stop.
    async fn stop_while_sending(&self) -> tokio::task::JoinHandle<()> {
        let stop = CancellationToken::new();
        let run = tokio::spawn(self.sender.clone().run(stop.clone()));
        eventually_some("a send", Duration::from_secs(10), || async {
            (self.fake.request_count() > 0).then_some(())
        })
        .await;
        stop.cancel();
        run
    }

    async fn state(&self) -> String {
        self.store.outbox(None).await.expect("outbox")[0]
            .state
            .to_string()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_shutdown_a_send_in_flight_ends_within_the_grace() {
    let sabi = LoneSender::start().await;
    sabi.fake.answer_after(Duration::from_millis(300));
    let run = sabi.stop_while_sending().await;
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the sender stopped once its send ended")
        .expect("sender");
    assert_eq!(sabi.state().await, "accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_shutdown_a_send_in_flight_past_the_grace_is_stopped() {
    let sabi = LoneSender::start().await;
    sabi.fake.stall_next(1);
    let run = sabi.stop_while_sending().await;
    // The grace runs on the sender's clock: move it on until the sender has stopped.
    eventually_some("the sender to stop", Duration::from_secs(10), || async {
        sabi.clock.advance(Duration::from_secs(11));
        run.is_finished().then_some(())
    })
    .await;
    run.await.expect("sender");
    assert_eq!(
        sabi.state().await,
        "sending",
        "nothing recorded: the part counts as unknown once its lease lapses"
    );
}
