//! The chat page in a real browser: Debian's Chromium, driven by Playwright (`tests/browser/`).
//! The test installs what it needs (the `chromium` package, `playwright-core` from npm) when
//! it is missing; CI runs as root on a machine that may have neither.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sabi::domain::{Batch, ReplyPart};
use sabi::worker::{TurnError, TurnHandler, TurnOutcome};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::helpers::{TestApp, run_to_success};

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
    let browser_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    let prefix = install_browser_tools(&browser_dir);
    // ES modules resolve packages next to the script: run it from beside node_modules.
    let script = prefix.join("chat.mjs");
    std::fs::copy(browser_dir.join("chat.mjs"), &script).expect("script copied");
    let app = TestApp::spawn_with(Some(Arc::new(Thoughtful)), &[]).await;
    let stop = CancellationToken::new();
    let worker = tokio::spawn(app.scheduler.clone().run(stop.clone()));

    let screenshot = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/chat-page.png");
    let base = format!("http://{}", app.addr);
    let mut node = Command::new("node");
    node.arg(script).arg(base).arg(screenshot);
    let stdout = run_to_success(node).await;
    stop.cancel();
    worker.await.expect("worker");
    let seen: Value =
        serde_json::from_str(stdout.trim().lines().last().unwrap_or("{}")).expect("one JSON line");

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
}

/// A directory whose `node_modules` has playwright-core, and Debian's Chromium, installed when
/// missing.
fn install_browser_tools(browser_dir: &Path) -> PathBuf {
    if !Path::new("/usr/bin/chromium").exists() {
        let installed = Command::new("apt-get")
            .args(["install", "-y", "-qq", "chromium"])
            .status();
        if !installed.is_ok_and(|s| s.success()) {
            let _ = Command::new("apt-get").args(["update", "-qq"]).status();
            let installed = Command::new("apt-get")
                .args(["install", "-y", "-qq", "chromium"])
                .status();
            assert!(
                installed.is_ok_and(|s| s.success()),
                "could not install chromium (apt-get, as root)"
            );
        }
    }
    let prefix = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-node");
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
        assert!(
            installed.is_ok_and(|s| s.success()),
            "npm install playwright-core failed"
        );
    }
    modules
}
