//! The WhatsApp webhook over real HTTP: verification, signatures, bad input, duplicates.

use sabi::clock::At;
use sabi::domain::ItemKind;

use crate::helpers::{
    START_MS, StoreLock, TestApp, VERIFY_TOKEN, signature, text_webhook, webhook_request,
};

#[tokio::test]
async fn verification_echoes_the_challenge_byte_for_byte() {
    let app = TestApp::spawn().await;
    let challenge = "1158201444-x_y.z%20";
    let url = app.url(&format!(
        "/webhook/whatsapp?hub.mode=subscribe&hub.verify_token={VERIFY_TOKEN}&hub.challenge={challenge}"
    ));
    let response = app.client.get(url).send().await.expect("get");
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.expect("body"), "1158201444-x_y.z ");
}

#[tokio::test]
async fn verification_refuses_anything_else() {
    let app = TestApp::spawn().await;
    for query in [
        "hub.mode=subscribe&hub.verify_token=wrong&hub.challenge=1".to_owned(),
        format!("hub.mode=unsubscribe&hub.verify_token={VERIFY_TOKEN}&hub.challenge=1"),
        format!("hub.verify_token={VERIFY_TOKEN}&hub.challenge=1"),
        format!("hub.mode=subscribe&hub.verify_token={VERIFY_TOKEN}"),
        "hub.mode=subscribe&hub.challenge=1".to_owned(),
        String::new(),
    ] {
        let response = app
            .client
            .get(app.url(&format!("/webhook/whatsapp?{query}")))
            .send()
            .await
            .expect("get");
        assert_eq!(response.status(), 403, "{query}");
    }
}

#[tokio::test]
async fn a_signed_message_is_stored_before_the_200() {
    let app = TestApp::spawn().await;
    let response = app
        .post_whatsapp_webhook(text_webhook("wamid.A", "2348031234567", "Abeg 🙏"))
        .await;
    assert_eq!(response.status(), 200);
    let inbox = app.inbox().await;
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].item.text.as_deref(), Some("Abeg 🙏"));
    assert_eq!(inbox[0].state, "pending");
    assert_eq!(
        inbox[0].received_at,
        At::from_millis(1_781_000_000_000),
        "time comes from the injected clock"
    );
    app.clock.advance(std::time::Duration::from_secs(5));
    assert_eq!(
        app.post_whatsapp_webhook(text_webhook("wamid.A2", "2348031234567", "more"))
            .await
            .status(),
        200
    );
    assert_eq!(
        app.inbox().await[1].received_at,
        At::from_millis(START_MS + 5_000)
    );
}

#[tokio::test]
async fn bad_signatures_get_401_and_store_nothing() {
    let app = TestApp::spawn().await;
    let body = text_webhook("wamid.B", "1", "hi");
    let good = signature(&body);
    let other_secret = sabi::whatsapp::sign(&"another-secret".to_owned().into(), &body);
    let mut altered = body.clone();
    let at = altered.iter().position(|b| *b == b'h').expect("an h");
    altered[at] = b'H';
    let cases: Vec<(&str, Vec<u8>, Option<String>)> = vec![
        ("wrong secret", body.clone(), Some(other_secret)),
        ("one altered byte", altered, Some(good.clone())),
        ("missing header", body.clone(), None),
        (
            "wrong prefix",
            body.clone(),
            Some(good.replace("sha256=", "sha1=")),
        ),
        ("no prefix", body.clone(), Some(good.replace("sha256=", ""))),
        (
            "truncated digest",
            body.clone(),
            Some(good[..good.len() - 2].to_owned()),
        ),
    ];
    for (name, body, header) in cases {
        let response = app.post_raw_webhook(body, header.as_deref()).await;
        assert_eq!(response.status(), 401, "{name}");
        let error: serde_json::Value = response.json().await.expect("json error body");
        assert_eq!(error["code"], "bad_signature", "{name}");
    }
    assert!(app.inbox().await.is_empty());
    assert!(
        app.store
            .quarantine(None)
            .await
            .expect("quarantine")
            .is_empty()
    );
}

#[tokio::test]
async fn signed_but_not_json_is_400_and_stores_nothing() {
    let app = TestApp::spawn().await;
    for body in [&b"not json"[..], b"{\"object\":", b"\xff\xfe\xfd", b""] {
        let response = app.post_whatsapp_webhook(body.to_vec()).await;
        assert_eq!(response.status(), 400, "{body:?}");
        let error: serde_json::Value = response.json().await.expect("json error body");
        assert_eq!(error["code"], "not_json");
    }
    assert!(app.inbox().await.is_empty());
}

#[tokio::test]
async fn unknown_shapes_are_acknowledged_and_quarantined_raw() {
    let app = TestApp::spawn().await;
    let bodies = [
        r#"{"object":"instagram","entry":[{"id":"1","changes":[]}]}"#,
        r#"{"object":"whatsapp_business_account","entry":"oops"}"#,
        r#"[{"object":"whatsapp_business_account"}]"#,
    ];
    // Twice each: Meta redelivers, and a redelivered part is kept once.
    for body in bodies.iter().chain(&bodies) {
        let response = app.post_whatsapp_webhook(*body).await;
        assert_eq!(response.status(), 200, "{body}");
    }
    let quarantined = app.store.quarantine(None).await.expect("quarantine");
    let raws: Vec<&str> = quarantined
        .iter()
        .map(|q| q.quarantined.raw.as_str())
        .collect();
    assert_eq!(raws, bodies);
    assert!(app.inbox().await.is_empty());
}

#[tokio::test]
async fn a_message_of_wrong_types_is_quarantined_and_its_neighbours_stored() {
    let app = TestApp::spawn().await;
    let body = r#"{"object":"whatsapp_business_account","entry":[{"id":"1","changes":[{"field":"messages","value":{
        "metadata":{"phone_number_id":"9"},
        "messages":[{"from":"1","id":"wamid.good","timestamp":"1","type":"text","text":{"body":"ok"}},
                    {"from":"1","id":"wamid.bad","timestamp":"not a time","type":"text","text":{"body":"?"}}]}}]}]}"#;
    assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    let inbox = app.inbox().await;
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].item.dedupe_key, "wamid.good");
    let quarantined = app.store.quarantine(None).await.expect("quarantine");
    assert_eq!(quarantined.len(), 1);
    assert!(quarantined[0].quarantined.raw.contains("wamid.bad"));
}

#[tokio::test]
async fn oversized_bodies_get_413_and_store_nothing() {
    let app = TestApp::spawn().await;
    let text = "x".repeat(4 * 1024 * 1024);
    let body = text_webhook("wamid.big", "1", &text);
    let response = app.post_whatsapp_webhook(body).await;
    assert_eq!(response.status(), 413);
    assert!(app.inbox().await.is_empty());
}

#[tokio::test]
async fn a_three_megabyte_webhook_is_accepted() {
    let app = TestApp::spawn().await;
    let text = "y".repeat(3 * 1000 * 1000 - 600);
    let response = app
        .post_whatsapp_webhook(text_webhook("wamid.3mb", "1", &text))
        .await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        app.inbox().await[0].item.text.as_deref().map(str::len),
        Some(text.len())
    );
}

#[tokio::test]
async fn twenty_concurrent_duplicates_store_one_copy() {
    let app = TestApp::spawn().await;
    let body = text_webhook("wamid.dup", "2348000000009", "same");
    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let request = webhook_request(&app.client, &app.url(""), body.clone());
        requests.spawn(request.send());
    }
    while let Some(response) = requests.join_next().await {
        assert_eq!(response.expect("task").expect("sent").status(), 200);
    }
    let inbox = app.inbox().await;
    assert_eq!(inbox.len(), 1);
}

#[tokio::test]
async fn a_redelivered_id_with_other_content_keeps_the_first_copy() {
    let app = TestApp::spawn().await;
    assert_eq!(
        app.post_whatsapp_webhook(text_webhook("wamid.C", "1", "first"))
            .await
            .status(),
        200
    );
    assert_eq!(
        app.post_whatsapp_webhook(text_webhook("wamid.C", "1", "second"))
            .await
            .status(),
        200
    );
    let inbox = app.inbox().await;
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].item.text.as_deref(), Some("first"));
}

#[tokio::test]
async fn statuses_dedupe_on_id_and_status_and_are_not_turns() {
    let app = TestApp::spawn().await;
    let status = |s: &str| {
        format!(
            r#"{{"object":"whatsapp_business_account","entry":[{{"id":"1","changes":[{{"field":"messages","value":{{
            "metadata":{{"phone_number_id":"9"}},"statuses":[{{"id":"wamid.out","status":"{s}","timestamp":"5","recipient_id":"1"}}]}}}}]}}]}}"#
        )
    };
    for s in ["sent", "delivered", "sent", "read", "delivered"] {
        assert_eq!(app.post_whatsapp_webhook(status(s)).await.status(), 200);
    }
    let inbox = app.inbox().await;
    let kinds: Vec<_> = inbox
        .iter()
        .map(|i| (i.item.kind, i.item.item_type.clone(), i.state.to_string()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (ItemKind::Status, Some("sent".into()), "recorded".into()),
            (
                ItemKind::Status,
                Some("delivered".into()),
                "recorded".into()
            ),
            (ItemKind::Status, Some("read".into()), "recorded".into()),
        ]
    );
}

#[tokio::test]
async fn many_messages_in_one_post_are_all_stored() {
    let app = TestApp::spawn().await;
    let messages: Vec<String> = (0..50)
        .map(|i| format!(r#"{{"from":"{}","id":"wamid.m{i}","timestamp":"{i}","type":"text","text":{{"body":"n{i}"}}}}"#, i % 7))
        .collect();
    let body = format!(
        r#"{{"object":"whatsapp_business_account","entry":[{{"id":"1","changes":[{{"field":"messages","value":{{
        "metadata":{{"phone_number_id":"9"}},"messages":[{}]}}}}]}}]}}"#,
        messages.join(",")
    );
    assert_eq!(app.post_whatsapp_webhook(body.clone()).await.status(), 200);
    assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    let inbox = app.inbox().await;
    assert_eq!(inbox.len(), 50);
    assert!(
        inbox
            .iter()
            .enumerate()
            .all(|(i, item)| item.item.dedupe_key == format!("wamid.m{i}"))
    );
}

/// With the database locked by another writer past the busy timeout, the webhook answers 503
/// (so Meta retries) and keeps nothing; once the lock is gone the retry is stored.
#[tokio::test]
async fn a_store_that_cannot_commit_answers_503() {
    let app = TestApp::spawn().await;
    let lock = StoreLock::take(app.dir.path());
    let body = text_webhook("wamid.locked", "1", "hello");
    let response = app.post_whatsapp_webhook(body.clone()).await;
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    let error: serde_json::Value = response.json().await.expect("json");
    assert_eq!(error["code"], "store_unavailable");
    assert!(
        !error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("lock"),
        "no internals leak"
    );
    lock.release();
    assert!(app.inbox().await.is_empty());
    assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    assert_eq!(app.inbox().await.len(), 1);
}

#[tokio::test]
async fn health_and_readiness() {
    let app = TestApp::spawn().await;
    let health = app
        .client
        .get(app.url("/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);
    let ready = app
        .client
        .get(app.url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200);
}
