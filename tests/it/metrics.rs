//! `/metrics`: Prometheus text that parses, and counters that move as messages flow.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;

use crate::helpers::{TestApp, text_webhook};

/// `name{labels}` -> value, for every sample line; panics on a line that is not a sample.
fn parse(text: &str) -> HashMap<String, f64> {
    let mut samples = HashMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("not a sample: {line}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("not a number: {line}"));
        samples.insert(name.to_owned(), value);
    }
    samples
}

async fn scrape(app: &TestApp) -> HashMap<String, f64> {
    let response = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("scraped");
    assert_eq!(response.status(), 200);
    let text = response.text().await.expect("text");
    assert!(
        text.trim_end().ends_with("# EOF"),
        "OpenMetrics text ends with # EOF"
    );
    parse(&text)
}

#[tokio::test]
async fn counters_move_as_messages_flow() {
    let app = TestApp::spawn().await;
    let before = scrape(&app).await;
    assert_eq!(before.get("sabi_items_stored_total"), Some(&0.0));

    let body = text_webhook("wamid.m1", "2348000000001", "I wan check my balance");
    assert_eq!(app.post_whatsapp_webhook(body.clone()).await.status(), 200);
    assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    assert_eq!(
        app.post_raw_webhook(b"{}".to_vec(), Some("sha256=00"))
            .await
            .status(),
        401
    );
    let chat = json!({"question": "hello", "session_id": "metrics-1-0123456789abcdef01234", "message_id": "a"});
    for _ in 0..2 {
        app.client
            .post(app.url("/chat"))
            .json(&chat)
            .send()
            .await
            .expect("posted");
    }
    app.clock.advance(Duration::from_secs(20));
    assert_eq!(app.scheduler.drain().await.expect("drain"), 2);

    let after = scrape(&app).await;
    let get = |name: &str| after.get(name).copied().unwrap_or_default();
    assert_eq!(get(r#"sabi_webhook_requests_total{outcome="stored"}"#), 2.0);
    assert_eq!(
        get(r#"sabi_webhook_requests_total{outcome="bad_signature"}"#),
        1.0
    );
    assert_eq!(get("sabi_items_stored_total"), 1.0);
    assert_eq!(get("sabi_duplicates_total"), 1.0);
    assert_eq!(get("sabi_ingest_ack_seconds_count"), 2.0);
    assert_eq!(get(r#"sabi_chat_questions_total{outcome="accepted"}"#), 1.0);
    assert_eq!(
        get(r#"sabi_chat_questions_total{outcome="duplicate"}"#),
        1.0
    );
    assert_eq!(get(r#"sabi_turns_total{outcome="replied"}"#), 2.0);
    assert_eq!(get("sabi_batch_messages_count"), 2.0);
    assert_eq!(get(r#"sabi_turn_seconds_count{outcome="replied"}"#), 2.0);
    let routed: f64 = after
        .iter()
        .filter(|(name, _)| name.starts_with("sabi_routed_total{"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(routed, 2.0, "both batches went through the router");
    for gauge in [
        "sabi_due",
        "sabi_running",
        "sabi_waiting",
        "sabi_review_open",
        "sabi_sends_queued",
    ] {
        assert_eq!(after.get(gauge), Some(&0.0), "{gauge} is exposed");
    }
}

#[tokio::test]
async fn store_gauges_follow_the_pipeline() {
    let app = TestApp::spawn().await;
    for i in 0..3 {
        let body = text_webhook(&format!("wamid.g{i}"), &format!("23480000000{i}"), "hello");
        assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    }
    app.clock.advance(Duration::from_secs(20));
    assert_eq!(scrape(&app).await.get("sabi_due"), Some(&3.0));
    app.scheduler.drain().await.expect("drain");
    assert_eq!(scrape(&app).await.get("sabi_due"), Some(&0.0));
}
