//! Hand-offs into any help desk through signed JSON (`[handoff.webhook]`), against a desk
//! server started here that checks each event's signature as a desk would: the thread opens
//! with the transcript, the hand-off and the customer's messages follow while Sabi stays
//! silent, the desk's reply goes to the customer once however often it is posted, forged and
//! stale replies are refused, resolving gives the customer back to the assistant, and a desk
//! that is down loses nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use sabi::desk::{Mirror, check, signature};
use sabi::store::ReviewQuery;
use secrecy::SecretString;
use serde_json::{Value, json};

use crate::helpers::{START_MS, TestApp, text_webhook};

const SECRET: &str = "desk-webhook-secret-for-tests";
const CUSTOMER: &str = "2348031234567";

/// A desk: every event Sabi posts, with whether its signature held; down answers 503.
#[derive(Default)]
struct Desk {
    events: Mutex<Vec<(bool, Value)>>,
    down: AtomicBool,
    /// Refuses `message` events only (503): a failure after the thread opened.
    refusing_messages: AtomicBool,
}

impl Desk {
    async fn start() -> (Arc<Desk>, String) {
        let desk = Arc::new(Desk::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the desk");
        let url = format!(
            "http://{}/sabi-events",
            listener.local_addr().expect("addr")
        );
        let app = axum::Router::new()
            .route("/sabi-events", axum::routing::post(take))
            .with_state(desk.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (desk, url)
    }

    fn events(&self) -> Vec<(bool, Value)> {
        self.events.lock().expect("events").clone()
    }

    fn of(&self, kind: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|(_, e)| e["event"] == kind)
            .map(|(_, e)| e)
            .collect()
    }
}

async fn take(State(desk): State<Arc<Desk>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    if desk.down.load(Ordering::SeqCst) {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let secret = SecretString::from(SECRET.to_owned());
    let at = sabi::clock::At::from_millis(START_MS);
    let signed = check(
        &secret,
        header("x-sabi-timestamp"),
        header("x-sabi-signature").map(str::as_bytes),
        &body,
        at,
    )
    .is_ok();
    let event: Value = serde_json::from_slice(&body).expect("JSON");
    if desk.refusing_messages.load(Ordering::SeqCst) && event["event"] == "message" {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    desk.events.lock().expect("events").push((signed, event));
    StatusCode::OK
}

async fn app(url: &str) -> (TestApp, Arc<Mirror>) {
    let app = TestApp::spawn_with(
        None,
        &[
            ("SABI_BATCH_WINDOW", "0"),
            ("SABI_DESK_WEBHOOK_URL", url),
            ("SABI_DESK_WEBHOOK_SECRET", SECRET),
        ],
    )
    .await;
    let mirror = app.desk.clone().expect("a mirror with [handoff.webhook]");
    (app, mirror)
}

async fn writes(app: &TestApp, id: &str, text: &str) {
    let response = app
        .post_whatsapp_webhook(text_webhook(id, CUSTOMER, text))
        .await;
    assert_eq!(response.status(), 200);
    app.scheduler.drain().await.expect("turns");
}

/// Posts `event` to `/webhook/desk`, signed with `secret` `age_s` seconds before the clock.
async fn desk_posts(app: &TestApp, event: Value, secret: &str, age_s: i64) -> u16 {
    let body = event.to_string().into_bytes();
    let secret = SecretString::from(secret.to_owned());
    let (timestamp, signed) = signature(&secret, START_MS / 1000 - age_s, &body);
    app.client
        .post(app.url("/webhook/desk"))
        .header("content-type", "application/json")
        .header("x-sabi-timestamp", timestamp)
        .header("x-sabi-signature", signed)
        .body(body)
        .send()
        .await
        .expect("sent")
        .status()
        .as_u16()
}

async fn sent(app: &TestApp) -> Vec<String> {
    let parts = app.store.outbox(None).await.expect("outbox");
    parts.into_iter().map(|p| p.text).collect()
}

async fn open_items(app: &TestApp) -> usize {
    let queue = app.store.review_queue(ReviewQuery::default()).await;
    queue.expect("queue").len()
}

#[tokio::test]
async fn a_hand_off_goes_to_the_desk_as_signed_events_and_its_reply_comes_back_once() {
    let (desk, url) = Desk::start().await;
    let (app, mirror) = app(&url).await;
    writes(&app, "wamid.dw1", "good morning").await;
    writes(&app, "wamid.dw2", "I want to speak to a human agent").await;
    let before = sent(&app).await.len();
    assert_eq!(mirror.mirror().await.expect("round"), Some(1));

    assert!(desk.events().iter().all(|(signed, _)| *signed), "signed");
    let [opened] = &desk.of("opened")[..] else {
        panic!("one thread: {:?}", desk.events());
    };
    let thread = opened["thread"].as_str().expect("thread").to_owned();
    assert_eq!(opened["conversation"]["customer"], CUSTOMER);
    assert_eq!(opened["contact"]["phone"], CUSTOMER);
    let transcript = opened["transcript"].as_array().expect("transcript");
    assert_eq!(
        transcript[0],
        json!({"from": "customer", "text": "good morning"})
    );
    assert_eq!(transcript[1]["from"], "sabi", "{transcript:?}");
    let handed = desk.of("handed_over");
    assert_eq!(handed.len(), 1);
    assert_eq!(handed[0]["reason"], "handoff_asked");
    let said: Vec<Value> = desk
        .of("message")
        .iter()
        .map(|m| m["text"].clone())
        .collect();
    assert_eq!(said, [json!("I want to speak to a human agent")]);

    // The customer writes while the desk holds them: it goes to the desk, Sabi says nothing.
    writes(&app, "wamid.dw3", "hello? anyone there").await;
    assert_eq!(mirror.mirror().await.expect("round"), Some(1));
    assert_eq!(sent(&app).await.len(), before);
    let last = desk.of("message").pop().expect("a message");
    assert_eq!(
        (last["thread"].as_str(), last["text"].as_str()),
        (Some(thread.as_str()), Some("hello? anyone there"))
    );
    let mut ids: Vec<String> = desk
        .events()
        .iter()
        .map(|(_, e)| e["id"].to_string())
        .collect();
    let events = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), events, "every event has its own id");

    // The desk's reply, posted twice, goes once; forged and stale ones are refused.
    let reply = json!({"event": "reply", "thread": thread, "id": "r-1", "text": "Ada here."});
    assert_eq!(desk_posts(&app, reply.clone(), SECRET, 0).await, 200);
    assert_eq!(desk_posts(&app, reply, SECRET, 2).await, 200);
    let forged = json!({"event": "reply", "thread": thread, "id": "r-2", "text": "Your PIN?"});
    assert_eq!(
        desk_posts(&app, forged.clone(), "wrong-secret-wrong", 0).await,
        401
    );
    assert_eq!(desk_posts(&app, forged, SECRET, 900).await, 401);
    let sent_now = sent(&app).await;
    assert_eq!(sent_now[before..], ["Ada here."]);
    let bad = json!({"event": "reply", "thread": thread, "id": "r-3"});
    assert_eq!(
        desk_posts(&app, bad, SECRET, 0).await,
        400,
        "a reply without text"
    );

    // Resolved: the customer is the assistant's again.
    let resolved = json!({"event": "resolved", "thread": thread});
    assert_eq!(desk_posts(&app, resolved, SECRET, 0).await, 200);
    assert_eq!(open_items(&app).await, 0);
    writes(&app, "wamid.dw4", "good morning").await;
    assert_eq!(sent(&app).await.len(), before + 2, "answered by Sabi");
}

#[tokio::test]
async fn while_the_desk_is_down_the_hand_off_waits_and_goes_once() {
    let (desk, url) = Desk::start().await;
    let (app, mirror) = app(&url).await;
    writes(&app, "wamid.dd1", "I want to speak to a human agent").await;
    desk.down.store(true, Ordering::SeqCst);
    assert_eq!(mirror.mirror().await.expect("round"), Some(0));
    assert_eq!(open_items(&app).await, 1, "still on Sabi's desk");
    let ready = app.client.get(app.url("/readyz")).send().await;
    let said = ready.expect("readyz").text().await.expect("text");
    assert!(said.contains("(handoff.webhook) is failing"), "{said}");
    desk.down.store(false, Ordering::SeqCst);
    app.clock.advance(std::time::Duration::from_secs(5));
    assert_eq!(mirror.mirror().await.expect("round"), Some(1));
    assert_eq!(mirror.mirror().await.expect("round"), Some(0));
    assert_eq!(desk.of("opened").len(), 1);
    assert_eq!(desk.of("handed_over").len(), 1);
    assert_eq!(desk.of("message").len(), 1);
}

#[tokio::test]
async fn a_failure_after_the_hand_off_was_told_repeats_nothing() {
    let (desk, url) = Desk::start().await;
    let (app, mirror) = app(&url).await;
    writes(&app, "wamid.df1", "I want to speak to a human agent").await;
    desk.refusing_messages.store(true, Ordering::SeqCst);
    assert_eq!(mirror.mirror().await.expect("round"), Some(0));
    assert_eq!(desk.of("handed_over").len(), 1);
    assert!(desk.of("message").is_empty());
    desk.refusing_messages.store(false, Ordering::SeqCst);
    app.clock.advance(std::time::Duration::from_secs(5));
    assert_eq!(mirror.mirror().await.expect("round"), Some(1));
    assert_eq!(desk.of("opened").len(), 1, "one thread");
    assert_eq!(desk.of("handed_over").len(), 1, "told once");
    assert_eq!(desk.of("message").len(), 1);
}
