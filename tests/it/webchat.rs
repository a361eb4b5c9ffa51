//! The web chat over real HTTP: submit, poll, server-sent events, history, double submits,
//! other sessions, backpressure, and the article's own polling client.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sabi::domain::{Batch, ReplyPart};
use sabi::turn::{TurnError, TurnHandler, TurnOutcome};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::helpers::{TestApp, eventually_some, ms, run_to_success};

async fn ask(
    app: &TestApp,
    session: &str,
    question: &str,
    message_id: Option<&str>,
) -> reqwest::Response {
    let mut body = json!({ "question": question, "session_id": session });
    if let Some(id) = message_id {
        body["message_id"] = json!(id);
    }
    app.client
        .post(app.url("/chat"))
        .json(&body)
        .send()
        .await
        .expect("posted")
}

async fn job(app: &TestApp, job_id: &str, session: &str) -> (u16, Value) {
    let response = app
        .client
        .get(app.url(&format!("/chat/{job_id}?session_id={session}")))
        .send()
        .await
        .expect("got");
    let status = response.status().as_u16();
    (status, response.json().await.expect("json"))
}

async fn job_id(response: reqwest::Response) -> String {
    assert_eq!(response.status(), 202);
    let location = response.headers()["location"]
        .to_str()
        .expect("location")
        .to_owned();
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["status"], "queued");
    assert_eq!(
        location,
        format!("/chat/{}", body["job_id"].as_str().expect("id"))
    );
    assert_eq!(body["status_url"], location);
    body["job_id"].as_str().expect("job id").to_owned()
}

#[tokio::test]
async fn a_question_is_answered_and_kept_in_the_history() {
    let app = TestApp::spawn().await;
    let session = "s-1-0123456789abcdef0123";
    let id = job_id(ask(&app, session, "I wan check my balance", Some("m-1")).await).await;
    assert_eq!(id.len(), 32, "128 random bits");
    let (status, body) = job(&app, &id, session).await;
    assert_eq!(
        (status, body["status"].as_str(), body["position"].as_u64()),
        (200, Some("queued"), Some(0))
    );

    assert_eq!(app.scheduler.drain().await.expect("drain"), 1);
    let response = app
        .client
        .get(app.url(&format!("/chat/{id}?session_id={session}")))
        .send()
        .await
        .expect("got");
    assert_eq!(response.headers()["cache-control"], "no-store");
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["status"], "finished");
    assert!(
        body["answer"]["text"]
            .as_str()
            .expect("answer")
            .contains("balance")
    );

    // Read by the session id alone (in a header, kept out of access logs), so it must be
    // unguessable: a short one is refused.
    let history: Value = app
        .client
        .get(app.url("/chat/history"))
        .header("x-sabi-session", session)
        .send()
        .await
        .expect("got")
        .json()
        .await
        .expect("json");
    assert_eq!(history["messages"][0]["question"], "I wan check my balance");
    assert_eq!(history["messages"][0]["answer"], body["answer"]["text"]);
    let short = app
        .client
        .get(app.url("/chat/history?session_id=s-1"))
        .send()
        .await
        .expect("got");
    assert_eq!(short.status(), 422);
}

#[tokio::test]
async fn a_double_submit_is_one_job_and_one_turn() {
    let app = TestApp::spawn().await;
    let mut submits = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let (client, url) = (app.client.clone(), app.url("/chat"));
        submits.spawn(async move {
            let body = json!({"question": "abeg where my order dey", "session_id": "s-2-0123456789abcdef01234", "message_id": "tap-1"});
            let response = client.post(url).json(&body).send().await.expect("posted");
            assert_eq!(response.status(), 202);
            let body: Value = response.json().await.expect("json");
            body["job_id"].as_str().expect("job id").to_owned()
        });
    }
    let mut ids = Vec::new();
    while let Some(id) = submits.join_next().await {
        ids.push(id.expect("task"));
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "one job for one message id: {ids:?}");
    assert_eq!(app.inbox().await.len(), 1, "one question stored");
    assert_eq!(app.scheduler.drain().await.expect("drain"), 1, "one turn");
    assert_eq!(app.store.outbox(None).await.expect("outbox").len(), 1);
}

#[tokio::test]
async fn another_session_unknown_and_expired_jobs_look_the_same() {
    let app = TestApp::spawn_with(None, &[]).await;
    let id = job_id(ask(&app, "owner-0123456789abcdef01234", "hello", None).await).await;
    let (status_other, other) = job(&app, &id, "intruder-0123456789abcdef01234").await;
    let (status_unknown, unknown) = job(
        &app,
        "0123456789abcdef0123456789abcdef",
        "owner-0123456789abcdef01234",
    )
    .await;
    assert_eq!((status_other, status_unknown), (404, 404));
    assert_eq!(other, unknown);
    app.clock.advance(Duration::from_secs(24 * 3600 + 1));
    let (status_expired, expired) = job(&app, &id, "owner-0123456789abcdef01234").await;
    assert_eq!((status_expired, &expired), (404, &unknown));
}

#[tokio::test]
async fn bad_input_gets_clear_errors_and_stores_nothing() {
    let app = TestApp::spawn().await;
    let cases = [
        (
            json!({"question": "   ", "session_id": "s-0123456789abcdef01234"}),
            422,
            "question",
        ),
        (
            json!({"question": "x".repeat(4001), "session_id": "s-0123456789abcdef01234"}),
            422,
            "question",
        ),
        (
            json!({"question": "hi", "session_id": "bad id!"}),
            422,
            "session_id",
        ),
        (
            json!({"question": "hi", "session_id": "s-0123456789abcdef01234", "message_id": ""}),
            422,
            "message_id",
        ),
        (
            json!({"session_id": "s-0123456789abcdef01234"}),
            422,
            "question",
        ),
    ];
    for (body, status, mentions) in cases {
        let response = app
            .client
            .post(app.url("/chat"))
            .json(&body)
            .send()
            .await
            .expect("posted");
        assert_eq!(response.status().as_u16(), status, "{body}");
        let error: Value = response.json().await.expect("json");
        assert!(
            error["message"]
                .as_str()
                .unwrap_or_default()
                .contains(mentions),
            "{error}"
        );
    }
    let not_json = app
        .client
        .post(app.url("/chat"))
        .header("content-type", "application/json")
        .body("{nope")
        .send()
        .await
        .expect("posted");
    assert_eq!(not_json.status(), 400);
    assert!(app.inbox().await.is_empty());
}

#[tokio::test]
async fn positions_count_down_and_questions_wait_for_a_worker() {
    let app = TestApp::spawn_with(None, &[("SABI_TURNS", "5")]).await;
    let mut ids = Vec::new();
    for n in 0..10 {
        ids.push(
            job_id(
                ask(
                    &app,
                    &format!("s-{n}-0123456789abcdef01234"),
                    "Who go win the league?",
                    None,
                )
                .await,
            )
            .await,
        );
    }
    let before = positions(&app, &ids).await;
    assert_eq!(before, (0..10).map(Some).collect::<Vec<_>>());
    // No worker runs: the questions wait, queued.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(positions(&app, &ids).await, before);
    // A worker returns: it takes three at a time (of its five slots, one stays for the turns
    // the router answers alone, and one of the other four for WhatsApp).
    assert_eq!(
        app.scheduler.tick().await.expect("tick"),
        sabi::worker::TickOutcome::Processed(3)
    );
    let after = positions(&app, &ids).await;
    assert_eq!(&after[..3], &[None; 3], "answered");
    assert_eq!(
        &after[3..],
        &[
            Some(0),
            Some(1),
            Some(2),
            Some(3),
            Some(4),
            Some(5),
            Some(6)
        ]
    );
    app.scheduler.drain().await.expect("drain");
    assert!(positions(&app, &ids).await.iter().all(Option::is_none));
}

async fn positions(app: &TestApp, ids: &[String]) -> Vec<Option<u64>> {
    let mut out = Vec::new();
    for (n, id) in ids.iter().enumerate() {
        let (_, body) = job(app, id, &format!("s-{n}-0123456789abcdef01234")).await;
        out.push(body["position"].as_u64());
    }
    out
}

/// Holds every turn until told to go on.
struct Held(Arc<Semaphore>);

#[async_trait]
impl TurnHandler for Held {
    async fn handle(&self, _batch: &Batch) -> Result<TurnOutcome, TurnError> {
        self.0.acquire().await.expect("open").forget();
        Ok(TurnOutcome::Reply(vec![ReplyPart::text("the answer")]))
    }
}

/// Reads server-sent events as (id, event, data) until the stream ends or `limit` arrive.
async fn read_events(
    mut response: reqwest::Response,
    limit: usize,
) -> Vec<(String, String, Value)> {
    let mut events = Vec::new();
    let mut buffer = String::new();
    while events.len() < limit {
        let chunk = match tokio::time::timeout(Duration::from_secs(10), response.chunk()).await {
            Ok(Ok(Some(chunk))) => chunk,
            _ => break,
        };
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let field = |name: &str| {
                block.lines().find_map(|l| {
                    l.strip_prefix(&format!("{name}:"))
                        .map(|v| v.trim().to_owned())
                })
            };
            if let (Some(id), Some(event), Some(data)) =
                (field("id"), field("event"), field("data"))
            {
                events.push((
                    id,
                    event,
                    serde_json::from_str(&data).expect("data is JSON"),
                ));
            }
        }
    }
    events
}

#[tokio::test]
async fn events_arrive_in_order_and_resume_after_last_event_id() {
    let hold = Arc::new(Semaphore::new(0));
    let app = TestApp::spawn_with(Some(Arc::new(Held(hold.clone()))), &[]).await;
    let id = job_id(ask(&app, "s-sse-0123456789abcdef01234", "hello there", None).await).await;
    let url = app.url(&format!(
        "/chat/{id}/events?session_id=s-sse-0123456789abcdef01234"
    ));
    let stream = app.client.get(&url).send().await.expect("stream");
    assert_eq!(stream.headers()["content-type"], "text/event-stream");

    let scheduler = app.scheduler.clone();
    let turn = tokio::spawn(async move { scheduler.tick().await });
    let releaser = {
        let hold = hold.clone();
        tokio::spawn(async move {
            // Long enough for the stream to see the turn start.
            tokio::time::sleep(Duration::from_millis(800)).await;
            hold.add_permits(1);
        })
    };
    let events = read_events(stream, 3).await;
    turn.await.expect("turn").expect("tick");
    releaser.await.expect("released");
    let seen: Vec<(&str, &str)> = events
        .iter()
        .map(|(i, e, _)| (i.as_str(), e.as_str()))
        .collect();
    assert_eq!(
        seen,
        vec![("1", "queued"), ("2", "started"), ("3", "finished")]
    );
    assert_eq!(events[2].2["answer"]["text"], "the answer");

    let resumed = app
        .client
        .get(&url)
        .header("last-event-id", "2")
        .send()
        .await
        .expect("stream");
    let events = read_events(resumed, 3).await;
    let seen: Vec<&str> = events.iter().map(|(i, _, _)| i.as_str()).collect();
    assert_eq!(seen, vec!["3"], "only what came after event 2");

    let finished = app
        .client
        .get(&url)
        .header("last-event-id", "3")
        .send()
        .await
        .expect("stream");
    assert!(
        read_events(finished, 1).await.is_empty(),
        "nothing after the last event"
    );

    let other = app
        .client
        .get(app.url(&format!(
            "/chat/{id}/events?session_id=nope-0123456789abcdef01234"
        )))
        .send()
        .await
        .expect("got");
    assert_eq!(other.status(), 404);
}

#[tokio::test]
async fn past_the_queue_limit_questions_are_refused_and_nothing_is_stored() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("sabi.toml"),
        "[webchat]\nmax_queue = 2\nper_session_per_minute = 3\n",
    )
    .expect("config");
    let app = TestApp::spawn_in(dir, None, &[]).await;
    job_id(ask(&app, "a-0123456789abcdef01234", "one", None).await).await;
    job_id(ask(&app, "b-0123456789abcdef01234", "two", None).await).await;
    // The queue is counted again once the last count is 200 ms old.
    app.clock.advance(Duration::from_secs(1));
    let refused = ask(&app, "c-0123456789abcdef01234", "three", None).await;
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let error: Value = refused.json().await.expect("json");
    assert_eq!(error["code"], "busy");
    assert_eq!(
        app.inbox().await.len(),
        2,
        "the refused question was not stored"
    );

    // WhatsApp is never refused for the web chat's load.
    let body = crate::helpers::text_webhook("wamid.busy", "2348000000001", "hello");
    assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);

    // One session, three questions in a minute (none left waiting): the fourth is too fast.
    for n in 0..2 {
        app.scheduler.drain().await.expect("drain");
        app.clock.advance(Duration::from_secs(1));
        job_id(ask(&app, "a-0123456789abcdef01234", &format!("again {n}"), None).await).await;
    }
    app.scheduler.drain().await.expect("drain");
    app.clock.advance(Duration::from_secs(1));
    let too_fast = ask(&app, "a-0123456789abcdef01234", "and again", None).await;
    assert_eq!(too_fast.status(), 429);
    // The real wait: the session's first question ("one", 4 s ago) leaves its minute in 56 s.
    assert_eq!(too_fast.headers()["retry-after"], "56");
}

/// The third article's polling client (`ask_crumb`, Python with httpx), unchanged, gets its
/// answer from Sabi. The test sets up its own Python environment under `target/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_articles_polling_client_gets_its_answer() {
    let Some(venv) = crate::helpers::test_python() else {
        return;
    };
    let python = venv.join("bin/python");
    let app = TestApp::spawn().await;
    let stop = CancellationToken::new();
    let worker = tokio::spawn(app.scheduler.clone().run(stop.clone()));
    let script = format!(
        r#"
import time, httpx
BASE = "http://{addr}"
SESSION = "crumb-session-1-0123456789abcdef01234"

def ask_crumb(question: str, max_wait: float = 90.0) -> dict:
    r = httpx.post(f"{{BASE}}/chat", json={{"question": question, "session_id": SESSION}})
    job_id = r.json()["job_id"]
    delay, waited = 0.5, 0.0
    while waited < max_wait:
        time.sleep(delay)
        waited += delay
        s = httpx.get(f"{{BASE}}/chat/{{job_id}}", params={{"session_id": SESSION}}).json()
        print(f"{{waited:5.2f}}s  {{s['status']:9}}  {{s.get('stage')}}  {{s.get('position', '')}}")
        if s["status"] in ("finished", "failed"):
            return s
        delay = min(delay * 1.5, 3.0)          # back off: 0.5, 0.75, 1.1, 1.7, 2.5, 3.0 ...
    return {{"status": "timeout"}}

print(ask_crumb("Does the Belgian chocolate cake contain nuts?")["answer"])
"#,
        addr = app.addr
    );
    let mut client = std::process::Command::new(&python);
    client.args(["-c", &script]);
    let stdout = run_to_success(client).await;
    stop.cancel();
    worker.await.expect("worker");
    assert!(stdout.contains("finished"), "{stdout}");
    assert!(
        stdout.contains("'text':"),
        "the answer is printed: {stdout}"
    );
}

#[tokio::test]
async fn sessions_and_message_ids_never_share_a_job() {
    let app = TestApp::spawn().await;
    let first = job_id(ask(&app, "a-0123456789abcdef01234:b", "one", Some("c")).await).await;
    let second = job_id(ask(&app, "a-0123456789abcdef01234", "two", Some("b:c")).await).await;
    assert_ne!(first, second);
    assert_eq!(app.inbox().await.len(), 2);
}

#[tokio::test]
async fn a_resend_gets_its_job_even_when_the_queue_is_full() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("sabi.toml"), "[webchat]\nmax_queue = 1\n").expect("config");
    let app = TestApp::spawn_in(dir, None, &[]).await;
    let id = job_id(ask(&app, "s-0123456789abcdef01234", "one", Some("m-1")).await).await;
    app.clock.advance(Duration::from_secs(1));
    assert_eq!(
        ask(&app, "t-0123456789abcdef01234", "two", Some("m-2"))
            .await
            .status(),
        503
    );
    assert_eq!(
        job_id(ask(&app, "s-0123456789abcdef01234", "one", Some("m-1")).await).await,
        id
    );
}

#[tokio::test]
async fn event_streams_are_bounded_and_a_closed_one_frees_its_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("sabi.toml"), "[webchat]\nmax_streams = 1\n").expect("write");
    let app = TestApp::spawn_in(dir, None, &[]).await;
    let id = job_id(
        ask(
            &app,
            "s-streams-0123456789abcdef01234",
            "hello",
            Some("m-1"),
        )
        .await,
    )
    .await;
    let url = app.url(&format!(
        "/chat/{id}/events?session_id=s-streams-0123456789abcdef01234"
    ));
    let first = app.client.get(&url).send().await.expect("stream");
    assert_eq!(first.status(), 200);
    let second = app.client.get(&url).send().await.expect("refused");
    assert_eq!(second.status(), 503, "one stream per node here");
    drop(first);
    eventually_some("a closed stream to free its place", ms(5000), || async {
        let reopened = app.client.get(&url).send().await.expect("stream");
        (reopened.status() == 200).then_some(())
    })
    .await;
}

/// Hands every turn to a person, and counts the turns.
struct HandsOff(std::sync::atomic::AtomicUsize);

#[async_trait]
impl TurnHandler for HandsOff {
    async fn handle(&self, _batch: &Batch) -> Result<TurnOutcome, TurnError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(TurnOutcome::Handoff {
            parts: vec![ReplyPart::text("A colleague will answer.")],
            note: "asked for a person".into(),
        })
    }
}

const ADMIN: &str = "admin-token-for-webchat-tests";
/// 128 bits, as the page makes them: long enough to read a session by its id alone.
const LONG_SESSION: &str = "0123456789abcdef0123456789abcdef";

/// Asks with the session in `X-Sabi-Session` only.
async fn ask_with_header(app: &TestApp, question: &str) -> reqwest::Response {
    app.client
        .post(app.url("/chat"))
        .header("x-sabi-session", LONG_SESSION)
        .json(&json!({ "question": question }))
        .send()
        .await
        .expect("posted")
}

/// A person's reply through the admin API.
async fn person_says(app: &TestApp, item: i64, text: &str) -> Value {
    let response = app
        .client
        .post(app.url(&format!("/admin/review/{item}/reply")))
        .bearer_auth(ADMIN)
        .json(&json!({ "text": text }))
        .send()
        .await
        .expect("replied");
    assert_eq!(response.status(), 200);
    response.json().await.expect("json")
}

async fn open_items(app: &TestApp) -> Vec<sabi::store::ReviewEntry> {
    app.store
        .review_queue(sabi::store::ReviewQuery::default())
        .await
        .expect("queue")
}

/// A stream opened after the person already wrote still says first that a person holds the
/// chat, then their line: the order never depends on when the stream's first look ran.
#[tokio::test]
async fn a_stream_opened_after_the_persons_reply_says_the_hold_before_the_line() {
    let handler = Arc::new(HandsOff(Default::default()));
    let app = TestApp::spawn_with(Some(handler.clone()), &[("SABI_ADMIN_TOKEN", ADMIN)]).await;
    let asked = ask_with_header(&app, "I want to talk to a person").await;
    assert_eq!(asked.status(), 202);
    app.scheduler.tick().await.expect("tick");
    let item = open_items(&app).await.remove(0);
    person_says(&app, item.id, "Hello, I am Ada.").await;
    let stream = app
        .client
        .get(app.url("/chat/session/events"))
        .header("x-sabi-session", LONG_SESSION)
        .send()
        .await
        .expect("stream");
    let events = read_events(stream, 2).await;
    let seen: Vec<&str> = events.iter().map(|(_, e, _)| e.as_str()).collect();
    assert_eq!(seen, ["state", "person"], "{events:?}");
    assert_eq!(events[0].2["held"], true);
}

/// A visitor asks for a person (the session in the header only), the status URL works as
/// returned, and the session's stream shows the person's reply, resumes after Last-Event-ID,
/// and the polling fallback has it too.
#[tokio::test]
async fn a_persons_reply_reaches_the_sessions_stream_and_resumes_after_last_event_id() {
    let handler = Arc::new(HandsOff(Default::default()));
    let app = TestApp::spawn_with(Some(handler.clone()), &[("SABI_ADMIN_TOKEN", ADMIN)]).await;
    let asked = ask_with_header(&app, "I want to talk to a person").await;
    assert_eq!(asked.status(), 202);
    let body: Value = asked.json().await.expect("json");
    let status_url = body["status_url"].as_str().expect("status url");
    let followed = app
        .client
        .get(app.url(status_url))
        .header("x-sabi-session", LONG_SESSION)
        .send()
        .await
        .expect("followed");
    assert_eq!(followed.status(), 200, "the status URL works as returned");
    app.scheduler.tick().await.expect("tick");
    let (_, handed) = job(&app, body["job_id"].as_str().expect("id"), LONG_SESSION).await;
    assert_eq!(handed["status"], "failed");

    let events_url = app.url("/chat/session/events");
    let stream = app
        .client
        .get(&events_url)
        .header("x-sabi-session", LONG_SESSION)
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    let item = open_items(&app).await.remove(0);
    let settled = person_says(&app, item.id, "Hello, I am Ada. How can I help?").await;
    assert_eq!(
        settled["state"], "open",
        "a person answering a chat holds it"
    );
    let events = read_events(stream, 2).await;
    let seen: Vec<&str> = events.iter().map(|(_, e, _)| e.as_str()).collect();
    assert_eq!(seen, ["state", "person"], "{events:?}");
    assert_eq!(events[0].2["held"], true);
    assert_eq!(events[1].2["text"], "Hello, I am Ada. How can I help?");
    let first: i64 = events[1].0.parse().expect("a numeric id");

    person_says(&app, item.id, "Are you still there?").await;
    let resumed = app
        .client
        .get(&events_url)
        .header("x-sabi-session", LONG_SESSION)
        .header("last-event-id", first.to_string())
        .send()
        .await
        .expect("stream");
    let events = read_events(resumed, 2).await;
    let texts: Vec<&str> = events
        .iter()
        .filter(|(_, e, _)| e == "person")
        .filter_map(|(_, _, d)| d["text"].as_str())
        .collect();
    assert_eq!(texts, ["Are you still there?"], "only what came after it");

    let polled: Value = app
        .client
        .get(app.url("/chat/session?after=0"))
        .header("x-sabi-session", LONG_SESSION)
        .send()
        .await
        .expect("polled")
        .json()
        .await
        .expect("json");
    assert_eq!(polled["held"], true);
    assert_eq!(
        polled["lines"][0]["text"],
        "Hello, I am Ada. How can I help?"
    );
    assert_eq!(polled["lines"].as_array().map(Vec::len), Some(2));
    let short = app
        .client
        .get(app.url("/chat/session/events"))
        .header("x-sabi-session", "short")
        .send()
        .await
        .expect("refused");
    assert_eq!(
        short.status(),
        422,
        "a session read by its id alone is long"
    );
}

/// While a person holds the chat, the visitor's next message goes to the person's item, not to
/// a new turn; once the person closes it, the assistant answers again.
#[tokio::test]
async fn the_visitors_next_message_goes_to_the_person_holding_the_chat() {
    use std::sync::atomic::Ordering;
    let handler = Arc::new(HandsOff(Default::default()));
    let app = TestApp::spawn_with(Some(handler.clone()), &[("SABI_ADMIN_TOKEN", ADMIN)]).await;
    job_id(ask_with_header(&app, "A person, please").await).await;
    app.scheduler.tick().await.expect("tick");
    assert_eq!(handler.0.load(Ordering::SeqCst), 1);
    let item = open_items(&app).await.remove(0);
    person_says(&app, item.id, "Hi, Ada here.").await;

    let next = job_id(ask_with_header(&app, "My order 1234 never came").await).await;
    app.scheduler.tick().await.expect("tick");
    assert_eq!(handler.0.load(Ordering::SeqCst), 1, "no new turn for it");
    let held = app
        .store
        .review_item(item.id)
        .await
        .expect("read")
        .expect("kept");
    let texts: Vec<_> = held
        .messages
        .iter()
        .filter_map(|m| m.text.as_deref())
        .collect();
    assert_eq!(texts, ["A person, please", "My order 1234 never came"]);
    assert_eq!(
        open_items(&app).await.len(),
        1,
        "still one item, the person's"
    );
    let (status, _) = job(&app, &next, LONG_SESSION).await;
    assert_eq!(status, 200);

    let closed = app
        .client
        .post(app.url(&format!("/admin/review/{}/close", item.id)))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("closed");
    assert_eq!(closed.status(), 200);
    let after_close = app
        .client
        .get(app.url("/chat/session/events"))
        .header("x-sabi-session", LONG_SESSION)
        .send()
        .await
        .expect("stream");
    let events = read_events(after_close, 5).await;
    let seen: Vec<_> = events
        .iter()
        .map(|(_, e, d)| (e.as_str(), d.clone()))
        .collect();
    assert_eq!(
        seen.last(),
        Some(&("state", json!({"held": false}))),
        "the replies so far, nobody holds the chat, and the stream ends: {events:?}"
    );
    assert_eq!(events.len(), 2);
    job_id(ask_with_header(&app, "One more thing").await).await;
    app.scheduler.tick().await.expect("tick");
    assert_eq!(handler.0.load(Ordering::SeqCst), 2, "the assistant again");
}

/// A question is what a person types: lines and tabs, no other control characters (each
/// would come back six bytes long in the history); every route wants a session of 128 bits;
/// a `user_id` is visible ASCII, since it travels raw in the tools' `X-Sabi-Customer` header.
#[tokio::test]
async fn control_characters_short_sessions_and_unprintable_user_ids_are_refused() {
    const SECRET: &str = "identity-secret-for-the-site";
    let app = TestApp::spawn_with(None, &[("SABI_WEBCHAT_IDENTITY_SECRET", SECRET)]).await;
    let session = "ctl-0123456789abcdef01234";
    let post = |body: Value| {
        let app = &app;
        async move {
            let response = app.client.post(app.url("/chat")).json(&body).send().await;
            let response = response.expect("posted");
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.expect("json"))
        }
    };
    for question in [
        "\u{1}".repeat(4000),
        "hi\u{7}".into(),
        "a\u{85}b".into(),
        "a\rb".into(),
    ] {
        let (status, error) = post(json!({"question": question, "session_id": session})).await;
        assert_eq!(status, 422, "{question:?}");
        assert!(
            error["message"]
                .as_str()
                .unwrap_or_default()
                .contains("control")
        );
    }
    let typed = json!({"question": "line one\nline\ttwo", "session_id": session});
    assert_eq!(post(typed).await.0, 202, "new lines and tabs are typed");

    let short = json!({"question": "hi", "session_id": "s-1"});
    let (status, error) = post(short).await;
    assert_eq!(status, 422);
    assert!(
        error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("session_id")
    );
    let job = app
        .client
        .get(app.url("/chat/0123456789abcdef0123456789abcdef?session_id=s-1"))
        .send()
        .await
        .expect("got");
    assert_eq!(job.status(), 422, "polling too");

    let sign = |user: &str| {
        let hash = sabi::whatsapp::sign(
            &secrecy::SecretString::from(SECRET.to_owned()),
            user.as_bytes(),
        );
        hash.trim_start_matches("sha256=").to_owned()
    };
    for user in [
        "user\u{202e}42",
        "user\u{2028}42",
        "user 42",
        "usér",
        "a\nb",
    ] {
        let body = json!({"question": "hi", "session_id": session, "user_id": user, "user_hash": sign(user)});
        let (status, error) = post(body).await;
        assert_eq!(status, 422, "{user:?}: {error}");
        assert!(
            error["message"]
                .as_str()
                .unwrap_or_default()
                .contains("user_id")
        );
    }
    let encoded = "us%C3%A9r-42";
    let body = json!({"question": "hi", "session_id": "enc-0123456789abcdef01234", "user_id": encoded, "user_hash": sign(encoded)});
    assert_eq!(post(body).await.0, 202, "percent-encoded is visible ASCII");
}

/// A verified user's session is theirs: an anonymous visitor or another user asking in it is
/// refused (403), also when resending one of its message ids, and never gets their job.
#[tokio::test]
async fn a_verified_users_session_cannot_be_joined() {
    const SECRET: &str = "identity-secret-for-the-site";
    let app = TestApp::spawn_with(None, &[("SABI_WEBCHAT_IDENTITY_SECRET", SECRET)]).await;
    let session = "user-42-0123456789abcdef01234";
    let ask_as = |user: Option<&str>, message_id: &str, question: &str| {
        let mut body =
            json!({"question": question, "session_id": session, "message_id": message_id});
        if let Some(user) = user {
            let hash = sabi::whatsapp::sign(
                &secrecy::SecretString::from(SECRET.to_owned()),
                user.as_bytes(),
            );
            body["user_id"] = user.into();
            body["user_hash"] = hash.trim_start_matches("sha256=").into();
        }
        let app = &app;
        async move {
            let response = app.client.post(app.url("/chat")).json(&body).send().await;
            let response = response.expect("posted");
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.expect("json"))
        }
    };
    let (status, mine) = ask_as(Some("user-42"), "m-1", "my BVN is 22212345678").await;
    assert_eq!(status, 202, "{mine}");
    for (user, message_id) in [
        (None, "m-2"),
        (None, "m-1"),
        (Some("user-7"), "m-3"),
        (Some("user-7"), "m-1"),
    ] {
        let (status, refused) = ask_as(user, message_id, "what did I say before?").await;
        assert_eq!(status, 403, "{user:?} {message_id}: {refused}");
        assert_eq!(refused["code"], "not_your_session");
        assert!(refused.get("job_id").is_none());
    }
    assert_eq!(app.inbox().await.len(), 1, "nothing of theirs was kept");
    let (status, again) = ask_as(Some("user-42"), "m-1", "my BVN is 22212345678").await;
    assert_eq!(
        (status, &again["job_id"]),
        (202, &mine["job_id"]),
        "the owner's resend"
    );

    // Reading it is theirs alone too: the history, the job, the person's replies.
    let job_id = mine["job_id"].as_str().expect("job");
    let hash = sabi::whatsapp::sign(&secrecy::SecretString::from(SECRET.to_owned()), b"user-42");
    let hash = hash.trim_start_matches("sha256=").to_owned();
    for path in [
        "/chat/history".to_owned(),
        format!("/chat/{job_id}"),
        "/chat/session".to_owned(),
    ] {
        let read = |user: Option<(&str, &str)>| {
            let mut request = app
                .client
                .get(app.url(&path))
                .header("x-sabi-session", session);
            if let Some((user, hash)) = user {
                request = request
                    .header("x-sabi-user", user)
                    .header("x-sabi-user-hash", hash);
            }
            async move { request.send().await.expect("got").status().as_u16() }
        };
        assert_eq!(read(None).await, 403, "{path}: anonymous");
        assert_eq!(
            read(Some(("user-7", &hash))).await,
            403,
            "{path}: another user"
        );
        assert_eq!(
            read(Some(("user-42", &hash))).await,
            200,
            "{path}: the owner"
        );
    }
}

/// A history is read a page at a time, the latest first, each page within 64 KiB (however
/// its text is escaped), and paging back by `before` gives every exchange once, in order.
#[tokio::test]
async fn the_history_comes_in_pages_bounded_in_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("sabi.toml"),
        "[webchat]\nper_session_per_minute = 1000\nper_address_per_minute = 0\n",
    )
    .expect("config");
    let app = TestApp::spawn_in(dir, None, &[]).await;
    let session = "pages-0123456789abcdef01234";
    // 4,000 characters, 3 bytes each in UTF-8, and quotes written back as two.
    let long = |n: usize| format!("{n:02} {}", "€\"".repeat(1998));
    for n in 0..20 {
        job_id(ask(&app, session, &long(n), None).await).await;
    }
    let mut asked = Vec::new();
    let mut before: Option<String> = None;
    let mut pages = 0;
    loop {
        let url = match &before {
            Some(cursor) => format!("/chat/history?before={cursor}"),
            None => "/chat/history".into(),
        };
        let response = app
            .client
            .get(app.url(&url))
            .header("x-sabi-session", session)
            .send()
            .await
            .expect("got");
        assert_eq!(response.status(), 200);
        let bytes = response.bytes().await.expect("body");
        assert!(
            bytes.len() <= 64 * 1024 + 1024,
            "a page is bounded: {}",
            bytes.len()
        );
        let page: Value = serde_json::from_slice(&bytes).expect("json");
        let questions: Vec<String> = page["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| m["question"].as_str().expect("question").to_owned())
            .collect();
        assert!(!questions.is_empty());
        asked.splice(0..0, questions);
        pages += 1;
        match page["before"].as_str() {
            Some(cursor) => before = Some(cursor.to_owned()),
            None => break,
        }
    }
    assert!(pages >= 3, "{pages} pages");
    assert_eq!(asked, (0..20).map(long).collect::<Vec<_>>());
    let bad = app
        .client
        .get(app.url("/chat/history?before=x"))
        .header("x-sabi-session", session)
        .send()
        .await
        .expect("got");
    assert_eq!(bad.status(), 422);
}
