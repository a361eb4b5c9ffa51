//! The conversation engine on the SQLite store, driven with the injected clock: batching
//! windows and caps, one turn at a time, fencing, retries with backoff, review, shutdown.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sabi::clock::At;
use sabi::domain::{Batch, ReplyPart};
use sabi::store::{self, Ending, InboxQuery, ReviewQuery};
use sabi::turn::{TurnError, TurnHandler, TurnOutcome};
use sabi::worker::TickOutcome;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::helpers::{
    START_MS, StoreLock, TestApp, eventually, eventually_some, ms, text_webhook_at,
};

const CUSTOMER: &str = "2348031234567";

/// A handler that records every batch it sees (texts and the clock at start), fails on demand,
/// can be held mid-turn, and panics if two turns of one conversation ever overlap.
#[derive(Default)]
struct Recorder {
    turns: Mutex<Vec<(At, Vec<String>)>>,
    running: Mutex<HashSet<String>>,
    failures_left: Mutex<u32>,
    hold: Option<Arc<Semaphore>>,
    clock: Mutex<Option<Arc<sabi::clock::ManualClock>>>,
}

impl Recorder {
    fn new() -> Arc<Recorder> {
        Arc::new(Recorder::default())
    }

    fn failing(times: u32) -> Arc<Recorder> {
        Arc::new(Recorder {
            failures_left: Mutex::new(times),
            ..Recorder::default()
        })
    }

    /// Every turn waits for a permit of `hold` before it ends.
    fn held(hold: Arc<Semaphore>) -> Arc<Recorder> {
        Arc::new(Recorder {
            hold: Some(hold),
            ..Recorder::default()
        })
    }

    fn turns(&self) -> Vec<(At, Vec<String>)> {
        self.turns.lock().expect("lock").clone()
    }
}

#[async_trait]
impl TurnHandler for Recorder {
    async fn handle(&self, batch: &Batch) -> Result<TurnOutcome, TurnError> {
        let customer = batch.conversation.customer.clone();
        assert!(
            self.running.lock().expect("lock").insert(customer.clone()),
            "two turns at once for {customer}"
        );
        // Out of the running set on every exit, an aborted turn included.
        let _running = Running {
            set: &self.running,
            customer,
        };
        let now = self
            .clock
            .lock()
            .expect("lock")
            .as_ref()
            .map_or(At::default(), |c| {
                use sabi::clock::Clock;
                c.now()
            });
        let texts = batch
            .messages
            .iter()
            .map(|m| m.text.clone().unwrap_or_default())
            .collect();
        self.turns.lock().expect("lock").push((now, texts));
        if let Some(hold) = &self.hold {
            hold.acquire().await.expect("semaphore open").forget();
        }
        let mut failures = self.failures_left.lock().expect("lock");
        if *failures > 0 {
            *failures -= 1;
            return Err(TurnError("the model is down".into()));
        }
        Ok(TurnOutcome::Reply(vec![ReplyPart::text(format!(
            "answer to {} message(s)",
            batch.messages.len()
        ))]))
    }
}

struct Running<'a> {
    set: &'a Mutex<HashSet<String>>,
    customer: String,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.set.lock().expect("lock").remove(&self.customer);
    }
}

async fn app_with(recorder: &Arc<Recorder>, extra: &[(&str, &str)]) -> TestApp {
    let app = TestApp::spawn_with(Some(recorder.clone()), extra).await;
    *recorder.clock.lock().expect("lock") = Some(app.clock.clone());
    app
}

async fn post(app: &TestApp, id: &str, text: &str, sent_at_s: i64) {
    let response = app
        .post_whatsapp_webhook(text_webhook_at(id, CUSTOMER, text, sent_at_s))
        .await;
    assert_eq!(response.status(), 200);
}

async fn states(app: &TestApp) -> Vec<String> {
    app.store
        .inbox(InboxQuery::default())
        .await
        .expect("inbox")
        .into_iter()
        .map(|i| i.state.to_string())
        .collect()
}

#[tokio::test]
async fn a_burst_inside_the_window_is_one_turn_in_the_order_sent() {
    let recorder = Recorder::new();
    let app = app_with(&recorder, &[]).await;
    let t = START_MS / 1000;
    // Delivered in reverse: the provider timestamps put them right.
    post(&app, "wamid.3", "third", t + 2).await;
    app.clock.advance(Duration::from_secs(1));
    post(&app, "wamid.2", "second", t + 1).await;
    app.clock.advance(Duration::from_secs(1));
    post(&app, "wamid.1", "first", t).await;

    app.clock.advance(Duration::from_millis(19_999));
    assert_eq!(
        app.scheduler.tick().await.expect("tick"),
        TickOutcome::Idle,
        "the window is still open"
    );
    app.clock.advance(Duration::from_millis(1));
    assert_eq!(app.scheduler.drain().await.expect("drain"), 1);
    let turns = recorder.turns();
    assert_eq!(turns.len(), 1);
    assert_eq!(turns[0].1, vec!["first", "second", "third"]);
    assert_eq!(states(&app).await, vec!["answered"; 3]);
    let outbox = app.store.outbox(None).await.expect("outbox");
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].state, "sandbox");
}

#[tokio::test]
async fn a_non_stop_typer_is_answered_at_the_cap_and_nothing_is_lost() {
    let recorder = Recorder::new();
    let app = app_with(&recorder, &[]).await;
    let t0 = START_MS / 1000;
    // A message every 5 s for 2 minutes; the window (20 s) never closes, the cap (60 s) does.
    for n in 0..24 {
        post(
            &app,
            &format!("wamid.typer{n}"),
            &format!("m{n}"),
            t0 + n * 5,
        )
        .await;
        app.scheduler.drain().await.expect("drain");
        app.clock.advance(Duration::from_secs(5));
    }
    app.clock.advance(Duration::from_secs(60));
    app.scheduler.drain().await.expect("drain");

    let turns = recorder.turns();
    assert_eq!(
        turns[0].0,
        At::from_millis(START_MS + 60_000),
        "the first turn runs at the cap"
    );
    assert_eq!(
        turns[0].1.len(),
        13,
        "everything sent in the first minute, the cap included"
    );
    let all: Vec<String> = turns.iter().flat_map(|(_, texts)| texts.clone()).collect();
    let expected: Vec<String> = (0..24).map(|n| format!("m{n}")).collect();
    assert_eq!(all, expected, "every message answered once, in order");
    assert_eq!(states(&app).await, vec!["answered"; 24]);
    assert_eq!(
        app.store.outbox(None).await.expect("outbox").len(),
        turns.len()
    );
}

#[tokio::test]
async fn a_message_during_a_turn_waits_for_the_next_one() {
    let hold = Arc::new(Semaphore::new(0));
    let recorder = Recorder::held(hold.clone());
    let app = app_with(&recorder, &[("SABI_BATCH_WINDOW", "0s")]).await;
    let t = START_MS / 1000;
    post(&app, "wamid.a", "before", t).await;
    let first = {
        let scheduler = app.scheduler.clone();
        tokio::spawn(async move { scheduler.tick().await })
    };
    while recorder.turns().is_empty() {
        tokio::task::yield_now().await;
    }
    post(&app, "wamid.b", "during", t + 1).await;
    app.clock.advance(Duration::from_secs(30));
    assert_eq!(
        app.scheduler.tick().await.expect("tick"),
        TickOutcome::Idle,
        "no second turn while the first runs"
    );
    hold.add_permits(1);
    assert_eq!(
        first.await.expect("join").expect("tick"),
        TickOutcome::Processed(1)
    );
    hold.add_permits(1);
    assert_eq!(app.scheduler.drain().await.expect("drain"), 1);
    let texts: Vec<Vec<String>> = recorder.turns().into_iter().map(|(_, t)| t).collect();
    assert_eq!(
        texts,
        vec![vec!["before".to_owned()], vec!["during".to_owned()]]
    );
}

#[tokio::test]
async fn a_worker_whose_lease_was_taken_over_cannot_reply() {
    let app = TestApp::spawn().await;
    post(&app, "wamid.f", "hello", START_MS / 1000).await;
    app.clock.advance(Duration::from_secs(20));
    let lease = ms(120_000);
    let now = app.clock_now();
    let stale = app
        .store
        .claim(now, lease, 10, None)
        .await
        .expect("claim")
        .remove(0);
    assert!(
        app.store
            .claim(now, lease, 10, None)
            .await
            .expect("claim")
            .is_empty(),
        "one claimer wins"
    );

    app.clock.advance(Duration::from_secs(121));
    let fresh = app
        .store
        .claim(app.clock_now(), lease, 10, None)
        .await
        .expect("claim")
        .remove(0);
    assert_eq!(fresh.batch.id, stale.batch.id);
    assert_eq!(fresh.attempt, 2);
    assert_ne!(fresh.token, stale.token);

    let reply = |text: &str| Ending::Replied {
        parts: vec![ReplyPart::text(text)],
        sandbox: true,
    };
    let refused = app
        .store
        .finish(stale.batch.id, stale.token, app.clock_now(), reply("stale"))
        .await;
    assert!(
        matches!(refused, Err(store::Error::LeaseLost)),
        "{refused:?}"
    );
    let renewed = app
        .store
        .renew(stale.batch.id, stale.token, app.clock_now(), lease)
        .await;
    assert!(matches!(renewed, Err(store::Error::LeaseLost)));
    app.store
        .finish(fresh.batch.id, fresh.token, app.clock_now(), reply("fresh"))
        .await
        .expect("finish");
    let again = app
        .store
        .finish(fresh.batch.id, fresh.token, app.clock_now(), reply("twice"))
        .await;
    assert!(
        matches!(again, Err(store::Error::LeaseLost)),
        "an ended batch takes no second reply"
    );

    let outbox = app.store.outbox(None).await.expect("outbox");
    let texts: Vec<&str> = outbox.iter().map(|o| o.text.as_str()).collect();
    assert_eq!(texts, vec!["fresh"]);
}

#[tokio::test]
async fn a_lapsed_lease_lets_another_worker_finish_the_batch() {
    let recorder = Recorder::new();
    let app = app_with(&recorder, &[]).await;
    post(&app, "wamid.l", "hello", START_MS / 1000).await;
    app.clock.advance(Duration::from_secs(20));
    // A worker claims and dies without a word.
    let dead = app
        .store
        .claim(app.clock_now(), ms(120_000), 1, None)
        .await
        .expect("claim");
    assert_eq!(dead.len(), 1);
    assert_eq!(
        app.scheduler.tick().await.expect("tick"),
        TickOutcome::Idle,
        "the lease still holds"
    );
    app.clock.advance(Duration::from_secs(120));
    assert_eq!(app.scheduler.drain().await.expect("drain"), 1);
    assert_eq!(recorder.turns().len(), 1);
    assert_eq!(app.store.outbox(None).await.expect("outbox").len(), 1);
}

#[tokio::test]
async fn failed_turns_back_off_then_go_to_review() {
    let recorder = Recorder::failing(u32::MAX);
    let app = app_with(&recorder, &[]).await;
    post(&app, "wamid.r", "hello", START_MS / 1000).await;
    app.clock.advance(Duration::from_secs(20));
    for (attempt, wait_s) in [(1, 5), (2, 10), (3, 20)] {
        assert_eq!(
            app.scheduler.tick().await.expect("tick"),
            TickOutcome::Processed(1),
            "attempt {attempt}"
        );
        app.clock.advance(Duration::from_millis(wait_s * 1000 - 1));
        assert_eq!(
            app.scheduler.tick().await.expect("tick"),
            TickOutcome::Idle,
            "backoff after {attempt}"
        );
        app.clock.advance(Duration::from_millis(1));
    }
    assert_eq!(
        app.scheduler.tick().await.expect("tick"),
        TickOutcome::Processed(1),
        "attempt 4"
    );
    assert_eq!(recorder.turns().len(), 4);
    app.clock.advance(Duration::from_secs(3600));
    assert_eq!(
        app.scheduler.tick().await.expect("tick"),
        TickOutcome::Idle,
        "nothing after the last attempt"
    );

    let review = app
        .store
        .review_queue(ReviewQuery::default())
        .await
        .expect("review");
    assert_eq!(review.len(), 1);
    assert_eq!(review[0].reason.as_str(), "out_of_retries");
    assert_eq!(review[0].error.as_deref(), Some("the model is down"));
    assert_eq!(review[0].messages[0].text.as_deref(), Some("hello"));
    assert!(app.store.outbox(None).await.expect("outbox").is_empty());
    assert_eq!(states(&app).await, vec!["review"]);
}

#[tokio::test]
async fn a_turn_that_succeeds_on_retry_replies_once() {
    let recorder = Recorder::failing(2);
    let app = app_with(&recorder, &[]).await;
    post(&app, "wamid.s", "hello", START_MS / 1000).await;
    app.clock.advance(Duration::from_secs(20));
    for wait in [5, 10] {
        app.scheduler.drain().await.expect("drain");
        app.clock.advance(Duration::from_secs(wait));
    }
    app.scheduler.drain().await.expect("drain");
    assert_eq!(recorder.turns().len(), 3);
    assert_eq!(app.store.outbox(None).await.expect("outbox").len(), 1);
    assert!(
        app.store
            .review_queue(ReviewQuery::default())
            .await
            .expect("review")
            .is_empty()
    );
}

#[tokio::test]
async fn a_batch_too_old_for_an_automatic_reply_goes_to_review() {
    let recorder = Recorder::new();
    let app = app_with(&recorder, &[]).await;
    // Sent 16 minutes ago, delivered now (Meta retried while Sabi was unreachable).
    post(
        &app,
        "wamid.old",
        "are you there?",
        START_MS / 1000 - 16 * 60,
    )
    .await;
    app.clock.advance(Duration::from_secs(20));
    assert_eq!(app.scheduler.drain().await.expect("drain"), 1);
    assert!(recorder.turns().is_empty(), "no automatic reply");
    let review = app
        .store
        .review_queue(ReviewQuery::default())
        .await
        .expect("review");
    assert_eq!(review.len(), 1);
    assert_eq!(review[0].reason.as_str(), "too_old");
    assert!(app.store.outbox(None).await.expect("outbox").is_empty());
}

#[tokio::test]
async fn shutdown_lets_a_running_turn_finish_within_the_grace() {
    let hold = Arc::new(Semaphore::new(0));
    let recorder = Recorder::held(hold.clone());
    let app = app_with(&recorder, &[("SABI_BATCH_WINDOW", "0s")]).await;
    post(&app, "wamid.g", "hello", START_MS / 1000).await;
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(app.scheduler.clone().run(shutdown.clone()));
    while recorder.turns().is_empty() {
        tokio::task::yield_now().await;
    }
    shutdown.cancel();
    app.clock.advance(Duration::from_secs(9));
    hold.add_permits(1);
    run.await.expect("scheduler stopped");
    assert_eq!(app.store.outbox(None).await.expect("outbox").len(), 1);
}

#[tokio::test]
async fn shutdown_past_the_grace_leaves_the_lease_to_lapse() {
    let hold = Arc::new(Semaphore::new(0));
    let recorder = Recorder::held(hold.clone());
    let app = app_with(&recorder, &[("SABI_BATCH_WINDOW", "0s")]).await;
    post(&app, "wamid.h", "hello", START_MS / 1000).await;
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(app.scheduler.clone().run(shutdown.clone()));
    while recorder.turns().is_empty() {
        tokio::task::yield_now().await;
    }
    shutdown.cancel();
    // The grace starts when the scheduler stops claiming, which on a loaded machine may be
    // after any fixed wait: move its clock past a grace until it has stopped.
    eventually("the scheduler to stop", || async {
        let stopped = run.is_finished();
        if !stopped {
            app.clock.advance(Duration::from_secs(11));
        }
        stopped
    })
    .await;
    run.await.expect("scheduler stopped");
    assert!(app.store.outbox(None).await.expect("outbox").is_empty());
    assert_eq!(
        states(&app).await,
        vec!["batched"],
        "the lease was not released"
    );

    // Another worker takes the batch once the lease has lapsed.
    hold.add_permits(10);
    assert_eq!(app.scheduler.tick().await.expect("tick"), TickOutcome::Idle);
    app.clock.advance(Duration::from_secs(120));
    assert_eq!(app.scheduler.drain().await.expect("drain"), 1);
    assert_eq!(app.store.outbox(None).await.expect("outbox").len(), 1);
}

#[tokio::test]
async fn conversations_are_batched_apart_and_statuses_are_not_turns() {
    let recorder = Recorder::new();
    let app = app_with(&recorder, &[]).await;
    let t = START_MS / 1000;
    for (n, customer) in ["2341", "2342", "2341", "2343"].iter().enumerate() {
        let body = text_webhook_at(
            &format!("wamid.c{n}"),
            customer,
            &format!("m{n}"),
            t + n as i64,
        );
        assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    }
    let status = r#"{"object":"whatsapp_business_account","entry":[{"id":"1","changes":[{"field":"messages","value":{
        "metadata":{"phone_number_id":"100000000000001"},"statuses":[{"id":"wamid.out","status":"read","timestamp":"5","recipient_id":"2341"}]}}]}]}"#;
    assert_eq!(app.post_whatsapp_webhook(status).await.status(), 200);
    app.clock.advance(Duration::from_secs(20));
    assert_eq!(app.scheduler.drain().await.expect("drain"), 3);
    let mut batches: HashMap<usize, Vec<String>> = HashMap::new();
    for (_, texts) in recorder.turns() {
        batches.insert(texts.len(), texts);
    }
    assert_eq!(batches[&2], vec!["m0", "m2"]);
    assert_eq!(app.store.outbox(None).await.expect("outbox").len(), 3);
}

impl TestApp {
    fn clock_now(&self) -> At {
        use sabi::clock::Clock;
        self.clock.now()
    }
}

/// A turn under way, its handler held until `hold` gets a permit; `first` is its tick.
struct HeldTurn {
    app: TestApp,
    recorder: Arc<Recorder>,
    hold: Arc<Semaphore>,
    first: tokio::task::JoinHandle<Result<TickOutcome, store::Error>>,
}

impl HeldTurn {
    async fn start(id: &str) -> HeldTurn {
        let hold = Arc::new(Semaphore::new(0));
        let recorder = Recorder::held(hold.clone());
        let app = app_with(&recorder, &[("SABI_BATCH_WINDOW", "0s")]).await;
        post(&app, id, "hello", START_MS / 1000).await;
        let first = {
            let scheduler = app.scheduler.clone();
            tokio::spawn(async move { scheduler.tick().await })
        };
        while recorder.turns().is_empty() {
            tokio::task::yield_now().await;
        }
        HeldTurn {
            app,
            recorder,
            hold,
            first,
        }
    }
}

/// The store stays unreachable (locked by another writer) past the lease: the turn stops on its
/// own rather than run beside the worker that may take the batch over, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_stops_when_its_lease_runs_out_unrenewed() {
    let HeldTurn {
        app,
        recorder,
        hold,
        first,
    } = HeldTurn::start("wamid.lapse").await;

    let lock = StoreLock::take(app.dir.path());
    // Renewals fail (the store is locked) until the lease has run out.
    app.clock.advance(Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(100)).await;
    app.clock.advance(Duration::from_secs(80));
    let outcome = tokio::time::timeout(Duration::from_secs(30), first).await;
    assert!(
        outcome.is_ok(),
        "the turn did not stop when its lease ran out"
    );
    lock.release();
    assert!(
        app.store.outbox(None).await.expect("outbox").is_empty(),
        "the abandoned turn wrote nothing"
    );

    // Once the lease has lapsed, the batch is claimed again and answered once.
    hold.add_permits(10);
    app.clock.advance(Duration::from_secs(20));
    assert_eq!(app.scheduler.drain().await.expect("drain"), 1);
    assert_eq!(app.store.outbox(None).await.expect("outbox").len(), 1);
    assert_eq!(recorder.turns().len(), 2);
}

/// The store is away just when a turn ends: the worker keeps trying to record the ending while
/// its lease holds, and the reply is kept once the store is back, without running the turn again
/// or waiting for the lease to lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_ends_while_the_store_is_away_is_recorded_when_it_is_back() {
    let HeldTurn {
        app,
        recorder,
        hold,
        first,
    } = HeldTurn::start("wamid.away").await;

    let lock = StoreLock::take(app.dir.path());
    // The turn ends now, while the store cannot commit.
    hold.add_permits(1);
    let post_503 = app
        .post_whatsapp_webhook(text_webhook_at("wamid.probe", "2348000000009", "x", 1))
        .await;
    assert_eq!(post_503.status(), 503, "the store is away");
    lock.release();

    // Seconds, not the 120 s lease: the worker's next try records the reply.
    let mut first = first;
    for _ in 0..100 {
        app.clock.advance(Duration::from_millis(500));
        if let Ok(done) = tokio::time::timeout(Duration::from_millis(50), &mut first).await {
            done.expect("tick").expect("tick ran");
            break;
        }
    }
    assert!(first.is_finished(), "the ending was never recorded");
    let outbox = app.store.outbox(None).await.expect("outbox");
    assert_eq!(outbox.len(), 1, "one reply");
    assert_eq!(recorder.turns().len(), 1, "the turn ran once");
    assert_eq!(states(&app).await, vec!["answered"]);
}

/// A webhook of one message object as Meta sends it, with the change's `contacts`.
fn raw_webhook(contacts: serde_json::Value, message: serde_json::Value) -> Vec<u8> {
    serde_json::json!({
        "object": "whatsapp_business_account",
        "entry": [{"id": "240011223344556", "changes": [{"field": "messages", "value": {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "2347000000001", "phone_number_id": "100000000000001"},
            "contacts": contacts,
            "messages": [message],
        }}]}],
    })
    .to_string()
    .into_bytes()
}

#[tokio::test]
async fn deleted_messages_are_not_answered_and_edits_are_read_as_edited() {
    let recorder = Recorder::new();
    let app = app_with(&recorder, &[]).await;
    let sent = START_MS / 1000;
    post(&app, "wamid.e1", "what is my balance", sent).await;
    post(&app, "wamid.e2", "send 5k to my sistr", sent + 1).await;
    let contact = serde_json::json!([{"wa_id": CUSTOMER, "profile": {"name": "Test Customer"}}]);
    let amendments = [
        serde_json::json!({"from": CUSTOMER, "id": "wamid.e3", "timestamp": (sent + 2).to_string(),
            "type": "revoke", "revoke": {"original_message_id": "wamid.e1"}}),
        serde_json::json!({"from": CUSTOMER, "id": "wamid.e4", "timestamp": (sent + 3).to_string(),
            "type": "edit", "edit": {"original_message_id": "wamid.e2",
                "message": {"type": "text", "text": {"body": "send 5k to my sister"}}}}),
    ];
    for amendment in amendments {
        let response = app
            .post_whatsapp_webhook(raw_webhook(contact.clone(), amendment))
            .await;
        assert_eq!(response.status(), 200);
    }
    // Someone who deleted the only message they sent is not answered at all.
    let other = text_webhook_at("wamid.f1", "2348099999999", "oops", sent);
    assert_eq!(app.post_whatsapp_webhook(other).await.status(), 200);
    let revoke = serde_json::json!({"from": "2348099999999", "id": "wamid.f2",
        "timestamp": (sent + 1).to_string(), "type": "revoke", "revoke": {"original_message_id": "wamid.f1"}});
    let response = app
        .post_whatsapp_webhook(raw_webhook(serde_json::json!([]), revoke))
        .await;
    assert_eq!(response.status(), 200);

    app.clock.advance(Duration::from_secs(120));
    app.scheduler.drain().await.expect("drain");
    let texts: Vec<Vec<String>> = recorder.turns().into_iter().map(|(_, t)| t).collect();
    assert_eq!(texts, [vec!["send 5k to my sister".to_owned()]]);
}

#[tokio::test]
async fn a_sender_named_only_by_its_contact_is_answered() {
    let recorder = Recorder::new();
    let app = app_with(&recorder, &[]).await;
    let contact =
        serde_json::json!([{"user_id": "NG.8812734650192837", "profile": {"name": "Chidi"}}]);
    let message = serde_json::json!({"id": "wamid.g1", "timestamp": (START_MS / 1000).to_string(),
        "type": "text", "text": {"body": "hello"}});
    let response = app
        .post_whatsapp_webhook(raw_webhook(contact, message))
        .await;
    assert_eq!(response.status(), 200);
    app.clock.advance(Duration::from_secs(120));
    assert_eq!(app.scheduler.drain().await.expect("drain"), 1);
    let inbox = app.inbox().await;
    assert_eq!(
        inbox[0].item.customer.as_deref(),
        Some("NG.8812734650192837")
    );
    assert_eq!(inbox[0].state, "answered");
}

/// Web-chat turns that never end until released; WhatsApp turns answer at once.
struct StuckWeb(Arc<Semaphore>);

#[async_trait]
impl TurnHandler for StuckWeb {
    async fn handle(&self, batch: &Batch) -> Result<TurnOutcome, TurnError> {
        if batch.conversation.channel == sabi::domain::Channel::Webchat {
            let _ = self.0.acquire().await;
        }
        Ok(TurnOutcome::Reply(vec![ReplyPart::text("answered")]))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooded_web_chat_never_takes_every_slot_from_whatsapp() {
    let release = Arc::new(Semaphore::new(0));
    let app = TestApp::spawn_with(
        Some(Arc::new(StuckWeb(release.clone()))),
        &[("SABI_TURNS", "3")],
    )
    .await;
    for n in 0..10 {
        let asked = app
            .client
            .post(app.url("/chat"))
            .json(&serde_json::json!({"session_id": format!("flood-{n}-0123456789abcdef01234"), "question": "hello"}))
            .send()
            .await
            .expect("posted");
        assert_eq!(asked.status(), 202);
    }
    let stop = CancellationToken::new();
    let worker = tokio::spawn(app.scheduler.clone().run(stop.clone()));
    post(&app, "wamid.fair1", "hello", START_MS / 1000).await;
    app.clock.advance(Duration::from_secs(30));
    let answer = "the WhatsApp customer answered while web chat held its slots";
    eventually_some(answer, Duration::from_secs(20), || async {
        // The scheduler sleeps on the manual clock: nudge it as a stored message would.
        app.scheduler.wakeup().due_at(At::default());
        let inbox = app.store.inbox(InboxQuery::default()).await.expect("inbox");
        inbox
            .iter()
            .any(|i| i.item.dedupe_key == "wamid.fair1" && i.state == "answered")
            .then_some(())
    })
    .await;
    release.add_permits(100);
    stop.cancel();
    worker.await.expect("scheduler");
}
