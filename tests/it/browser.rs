//! The chat page and the desk in a real browser: Debian's Chromium, driven by Playwright
//! (`tests/browser/`).
//! The test installs `playwright-core` from npm under `target/` when it is missing, and is
//! skipped where Chromium, Node.js or npm is not installed (`.ci/run` installs Chromium).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sabi::domain::{Batch, ReplyPart};
use sabi::turn::{TurnError, TurnHandler, TurnOutcome};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::helpers::{TestApp, run_to_success, target_dir};
use crate::services;

/// Answers after a pause, so that the page has a turn in progress to show.
struct Thoughtful;

#[async_trait]
impl TurnHandler for Thoughtful {
    async fn handle(&self, batch: &Batch) -> Result<TurnOutcome, TurnError> {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let question = batch
            .messages
            .iter()
            .filter_map(|m| m.text.as_deref())
            .collect::<Vec<_>>()
            .join(" ");
        Ok(TurnOutcome::Reply(vec![ReplyPart::text(format!(
            "Answer to: {question}"
        ))]))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_asks_on_the_chat_page_and_sees_the_answer() {
    let Some(script) = page_script("chat.mjs") else {
        return;
    };
    let app = TestApp::spawn_with(Some(Arc::new(Thoughtful)), &[]).await;
    let stop = CancellationToken::new();
    let worker = tokio::spawn(app.scheduler.clone().run(stop.clone()));

    let screenshot = target_dir().join("chat-page.png");
    let base = format!("http://{}", app.addr);
    let mut node = Command::new("node");
    node.arg(script).arg(base).arg(screenshot);
    let stdout = run_to_success(node).await;
    stop.cancel();
    worker.await.expect("worker");
    let seen: Value = last_line(&stdout);

    assert_eq!(
        seen["first"]["answers"][0],
        "Answer to: I wan check my balance"
    );
    let stages: Vec<&str> = seen["first"]["seen"]
        .as_array()
        .expect("stages")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        stages.iter().any(|s| s.starts_with("Checking")),
        "{stages:?}"
    );
    assert!(
        stages.iter().any(|s| s.contains("checking your message")),
        "the turn's stage is shown: {stages:?}"
    );
    assert_eq!(seen["mine"], 2, "a double click shows one question");
    assert_eq!(seen["asked"], 2, "and the server has one question for it");
    assert_eq!(
        seen["reloaded"]["mine"],
        serde_json::json!(["I wan check my balance", "Where is my order?"]),
        "a reload shows the history in order"
    );
    assert_eq!(
        seen["reloaded"]["answers"][0],
        "Answer to: I wan check my balance"
    );
}

/// Offers two choices for "menu", and answers anything else by naming it.
struct Chooser;

#[async_trait]
impl TurnHandler for Chooser {
    async fn handle(&self, batch: &Batch) -> Result<TurnOutcome, TurnError> {
        let question = batch
            .messages
            .iter()
            .filter_map(|m| m.text.as_deref())
            .collect::<Vec<_>>()
            .join(" ");
        let part = match question.as_str() {
            "menu" => ReplyPart {
                options: vec!["Check my balance".into(), "Talk to a person".into()],
                ..ReplyPart::text("What would you like to do?")
            },
            _ => ReplyPart::text(format!("Answer to: {question}")),
        };
        Ok(TurnOutcome::Reply(vec![part]))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_on_an_answers_choice_asks_it_like_typed_text() {
    let Some(script) = page_script("choices.mjs") else {
        return;
    };
    let app = TestApp::spawn_with(Some(Arc::new(Chooser)), &[]).await;
    let stop = CancellationToken::new();
    let worker = tokio::spawn(app.scheduler.clone().run(stop.clone()));
    let mut node = Command::new("node");
    node.arg(script).arg(format!("http://{}", app.addr));
    let stdout = run_to_success(node).await;
    stop.cancel();
    worker.await.expect("worker");
    let seen: Value = last_line(&stdout);
    assert_eq!(
        seen["buttons"],
        serde_json::json!(["Check my balance", "Talk to a person"])
    );
    assert_eq!(
        seen["mine"],
        serde_json::json!(["menu", "Check my balance"])
    );
    assert_eq!(
        seen["answers"],
        serde_json::json!(["What would you like to do?", "Answer to: Check my balance"])
    );
    assert_eq!(seen["left"], 0, "a tap takes the choices away");
}

/// Hands a question that asks for a person to one, and answers the others.
struct PersonOnRequest(std::sync::atomic::AtomicUsize);

#[async_trait]
impl TurnHandler for PersonOnRequest {
    async fn handle(&self, batch: &Batch) -> Result<TurnOutcome, TurnError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let asks_for_one = batch
            .messages
            .iter()
            .any(|m| m.text.as_deref().is_some_and(|t| t.contains("person")));
        if asks_for_one {
            return Ok(TurnOutcome::Handoff {
                parts: vec![ReplyPart::text("A colleague will answer.")],
                note: "asked for a person".into(),
            });
        }
        Ok(TurnOutcome::Reply(vec![ReplyPart::text("An answer.")]))
    }
}

/// A hand-off in a browser: a person's reply through the admin API shows on the open page
/// without a reload, with "a person has joined"; the visitor's next message goes to that person,
/// not to a new turn; and the console shows no error all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persons_reply_reaches_the_open_chat_page_live() {
    use std::sync::atomic::Ordering;
    const TOKEN: &str = "desk-token-for-handoffs";
    let Some(script) = page_script("handoff.mjs") else {
        return;
    };
    let handler = Arc::new(PersonOnRequest(Default::default()));
    let app = TestApp::spawn_with(Some(handler.clone()), &[("SABI_ADMIN_TOKEN", TOKEN)]).await;
    let stop = CancellationToken::new();
    let worker = tokio::spawn(app.scheduler.clone().run(stop.clone()));

    let screenshot = target_dir().join("chat-handoff.png");
    let mut node = Command::new("node");
    node.arg(script)
        .arg(format!("http://{}", app.addr))
        .arg(TOKEN)
        .arg(screenshot);
    let stdout = run_to_success(node).await;
    stop.cancel();
    worker.await.expect("worker");
    let seen: Value = last_line(&stdout);

    assert!(
        seen["handedOff"]
            .as_str()
            .is_some_and(|t| t.contains("A person from our team will reply here")),
        "{seen}"
    );
    assert_eq!(
        seen["person"],
        serde_json::json!(["Hello, I am Ada from the team."]),
        "{seen}"
    );
    assert_eq!(
        seen["joined"],
        serde_json::json!(["A person from our team has joined the chat."]),
        "{seen}"
    );
    assert!(
        seen["shownAfterMs"].as_u64().is_some_and(|ms| ms < 3000),
        "shown within about a second: {seen}"
    );
    assert_eq!(
        seen["errors"],
        serde_json::json!([]),
        "no console errors: {seen}"
    );
    assert_eq!(
        handler.0.load(Ordering::SeqCst),
        1,
        "one turn: the hand-off"
    );
    let item = app
        .store
        .review_item(seen["item"].as_i64().expect("item id"))
        .await
        .expect("read")
        .expect("kept");
    let texts: Vec<_> = item
        .messages
        .iter()
        .filter_map(|m| m.text.as_deref())
        .collect();
    assert_eq!(
        texts,
        ["I want to talk to a person", "My order 1234 never came"]
    );
}

/// The desk's broadcasts in a browser: a broadcast's progress shows, and its Pause button
/// pauses it in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_desk_shows_a_broadcasts_progress_and_pauses_it() {
    use sabi::clock::Clock;
    use sabi::store::{BroadcastState, NewBroadcast, NewRecipient, PausedBy};
    const TOKEN: &str = "desk-token-for-broadcasts";
    let Some(script) = page_script("desk.mjs") else {
        return;
    };
    let app = TestApp::spawn_with(None, &[("SABI_ADMIN_TOKEN", TOKEN)]).await;
    let now = app.clock.now();
    let (b, _) = app
        .store
        .create_broadcast(NewBroadcast {
            key: None,
            name: "Diwali eve".into(),
            template: "diwali_offer".into(),
            language: "en".into(),
            business: "100000000000001".into(),
            now,
            start_at: now,
            until: None,
            rate: 20,
            body: None,
            hours: None,
            recipients: (0..3)
                .map(|n| NewRecipient {
                    to: format!("23480300000{n:02}"),
                    params: vec![format!("Customer {n}")],
                    line: None,
                    skipped: None,
                    tz: None,
                })
                .collect(),
        })
        .await
        .expect("kept");

    let screenshot = target_dir().join("desk-broadcasts.png");
    let mut node = Command::new("node");
    node.arg(script)
        .arg(format!("http://{}", app.addr))
        .arg(TOKEN)
        .arg(screenshot);
    let stdout = run_to_success(node).await;
    let seen: Value = last_line(&stdout);
    assert_eq!(
        seen["before"]["progress"], "Diwali eve: 0 of 3 done",
        "{seen}"
    );
    let card = seen["after"]["card"].as_str().unwrap_or_default();
    assert!(card.contains("Paused: paused at the desk"), "{seen}");
    assert_eq!(
        seen["after"]["buttons"],
        serde_json::json!(["Resume", "Cancel"]),
        "{seen}"
    );
    let paused = app
        .store
        .broadcast(b.id)
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(
        (paused.state, paused.paused_by),
        (BroadcastState::Paused, Some(PausedBy::Person))
    );
}

/// A directory whose `node_modules` has playwright-core (installed there with npm when
/// missing), or `None` (the test skipped) where Chromium, Node.js or npm is not installed.
/// Nothing is installed system-wide from here: `.ci/run` installs Chromium.
/// `name` from tests/browser, copied beside the installed `node_modules` (ES modules resolve
/// packages next to the script); `None` where the browser tools cannot be had (skipped).
fn page_script(name: &str) -> Option<PathBuf> {
    let browser_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    let script = install_browser_tools(&browser_dir)?.join(name);
    std::fs::copy(browser_dir.join(name), &script).expect("script copied");
    Some(script)
}

/// What a page script saw: the one JSON line it printed last.
fn last_line(stdout: &str) -> Value {
    serde_json::from_str(stdout.trim().lines().last().unwrap_or("{}")).expect("one JSON line")
}

fn install_browser_tools(browser_dir: &Path) -> Option<PathBuf> {
    if !(services::program("chromium", "chromium")
        && services::program("node", "nodejs")
        && services::program("npm", "npm"))
    {
        return None;
    }
    let prefix = target_dir().join("test-node");
    let modules = prefix.join("node_modules");
    if !modules.join("playwright-core").exists() {
        std::fs::create_dir_all(&prefix).expect("target/test-node");
        std::fs::copy(
            browser_dir.join("package.json"),
            prefix.join("package.json"),
        )
        .expect("package.json");
        let installed = Command::new("npm")
            .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
            .arg(&prefix)
            .status();
        if !installed.is_ok_and(|s| s.success()) {
            services::skip(
                "playwright-core",
                "npm could not install it from the npm registry (offline?)",
            );
            return None;
        }
    }
    Some(modules)
}
