//! The web-chat API against its own OpenAPI document: schemathesis generates requests from
//! `/openapi.json` (valid and invalid), and every answer must match what the document says.

use std::process::Command;

use tokio_util::sync::CancellationToken;

use crate::helpers::{TestApp, run_to_success, test_python};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_matches_its_openapi_document() {
    let Some(venv) = test_python() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // Generated traffic must meet the API's rules, not its backpressure.
    std::fs::write(
        dir.path().join("sabi.toml"),
        "[webchat]\nmax_queue = 1000000\nper_session_per_minute = 1000000\n",
    )
    .expect("config");
    let app = TestApp::spawn_in(dir, None, &[]).await;
    let stop = CancellationToken::new();
    let worker = tokio::spawn(app.scheduler.clone().run(stop.clone()));

    let document: serde_json::Value = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .expect("openapi")
        .json()
        .await
        .expect("json");
    for path in [
        "/chat",
        "/chat/{job_id}",
        "/chat/{job_id}/events",
        "/chat/history",
    ] {
        assert!(
            document["paths"].get(path).is_some(),
            "{path} is documented"
        );
    }

    let url = app.url("/openapi.json");
    let mut schemathesis = Command::new(venv.join("bin/schemathesis"));
    schemathesis
        .args([
            "run",
            &url,
            "--checks",
            "all",
            "--max-examples",
            "30",
            "--seed",
            "1",
        ])
        .env("NO_COLOR", "1");
    let report = run_to_success(schemathesis).await;
    stop.cancel();
    worker.await.expect("worker");
    assert!(report.contains("No issues found"), "{report}");
}
