//! The admin API: its token, the review queue settled by people (a reply that goes out once
//! through the fake Graph API, a requeue back to the agent, a close), and the webhook's
//! source allow-list.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{
    SabiProcess, TestApp, eventually_seen, post_webhook, text_webhook, webhook_request,
};
use crate::sender::{Says, Sending, customer};

const TOKEN: &str = "admin-secret-token";

const ROUTES: &[(&str, &str)] = &[
    ("GET", "/admin/review"),
    ("GET", "/admin/review/1"),
    ("POST", "/admin/review/1/reply"),
    ("POST", "/admin/review/1/requeue"),
    ("POST", "/admin/review/1/close"),
    ("POST", "/admin/review/1/label"),
    ("GET", "/admin/broadcasts"),
    ("POST", "/admin/broadcasts"),
    ("GET", "/admin/broadcasts/1"),
    ("GET", "/admin/broadcasts/1/recipients"),
    ("POST", "/admin/broadcasts/1/cancel"),
    ("GET", "/admin/conversations?customer=2348031234567"),
    ("GET", "/admin/stats"),
    ("GET", "/admin/customers/whatsapp/2348031234567"),
    ("DELETE", "/admin/customers/whatsapp/2348031234567"),
];

async fn call(
    client: &reqwest::Client,
    url: &str,
    method: &str,
    auth: Option<&str>,
    body: Option<Value>,
) -> (u16, String) {
    let mut request = match method {
        "POST" => client.post(url),
        "DELETE" => client.delete(url),
        _ => client.get(url),
    };
    if let Some(auth) = auth {
        request = request.header("authorization", auth);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("sent");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

#[tokio::test]
async fn every_admin_route_wants_the_token_and_says_nothing_without_it() {
    let app = TestApp::spawn_with(None, &[("SABI_ADMIN_TOKEN", TOKEN)]).await;
    // Something to leak: a review item with the customer's words.
    let old = crate::helpers::text_webhook_at("wamid.a1", "2348031234567", "my secret words", 0);
    assert_eq!(app.post_whatsapp_webhook(old).await.status(), 200);
    app.clock.advance(Duration::from_secs(20));
    app.scheduler.drain().await.expect("turn");
    let good = format!("Bearer {TOKEN}");
    let wrong = [
        None,
        Some("Bearer wrong".to_owned()),
        Some(TOKEN.to_owned()),
        Some(format!("Bearer {TOKEN}x")),
        Some(format!("bearer {TOKEN}")),
    ];
    for (method, path) in ROUTES {
        for auth in &wrong {
            let body = (*method == "POST").then(|| json!({"text": "hi"}));
            let (status, text) =
                call(&app.client, &app.url(path), method, auth.as_deref(), body).await;
            assert_eq!(status, 401, "{method} {path} with {auth:?}");
            assert!(
                !text.contains("secret words") && !text.contains("2348031234567"),
                "{text}"
            );
        }
    }
    let (status, text) = call(
        &app.client,
        &app.url("/admin/review"),
        "GET",
        Some(&good),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert!(text.contains("my secret words"));

    // No token configured: there is no admin API at all, and every path of it says so.
    let off = TestApp::spawn().await;
    for (method, path) in ROUTES.iter().chain(&[("GET", "/admin"), ("GET", "/desk")]) {
        let (status, text) = call(&off.client, &off.url(path), method, Some(&good), None).await;
        assert_eq!(status, 404, "{method} {path}");
        assert_admin_disabled(&text);
    }
}

/// The answer of an admin path while the admin API is off.
fn assert_admin_disabled(text: &str) {
    let body: Value = serde_json::from_str(text).expect("a JSON error");
    assert_eq!(body["code"], "admin_disabled", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("admin.token") && message.contains("SABI_ADMIN_TOKEN"),
        "{message}"
    );
}

#[tokio::test]
async fn a_node_without_an_admin_token_says_at_start_that_the_admin_api_is_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let off = SabiProcess::start(dir.path());
    let client = reqwest::Client::new();
    let (status, text) = call(&client, &off.url("/desk"), "GET", None, None).await;
    assert_eq!(status, 404);
    assert_admin_disabled(&text);
    let said = |sabi: &SabiProcess| {
        sabi.logs().iter().any(|l| {
            l.contains("admin API") && l.contains("are off") && l.contains("SABI_ADMIN_TOKEN")
        })
    };
    assert!(said(&off), "{:?}", off.logs());
    off.terminate();

    let on = SabiProcess::start_with(dir.path(), &[("SABI_ADMIN_TOKEN", TOKEN)]);
    assert!(!said(&on), "{:?}", on.logs());
}

async fn admin(sabi: &Sending, method: &str, path: &str, body: Option<Value>) -> Value {
    let auth = format!("Bearer {TOKEN}");
    let url = format!("{}{path}", sabi.url);
    let (status, text) = call(&sabi.client, &url, method, Some(&auth), body).await;
    assert_eq!(status, 200, "{method} {path}: {text}");
    serde_json::from_str(&text).expect("json")
}

async fn review_ids(sabi: &Sending) -> Vec<i64> {
    review_ids_for(sabi, "too_old").await
}

async fn review_ids_for(sabi: &Sending, reason: &str) -> Vec<i64> {
    let queue = admin(sabi, "GET", &format!("/admin/review?reason={reason}"), None).await;
    queue["items"]
        .as_array()
        .map(|items| items.iter().filter_map(|i| i["id"].as_i64()).collect())
        .unwrap_or_default()
}

/// Waits until the queue has `n` items.
async fn wait_for_review(sabi: &Sending, n: usize) -> Vec<i64> {
    eventually_seen("the review queue", Duration::from_secs(10), || async {
        let ids = review_ids(sabi).await;
        if ids.len() == n {
            Ok(ids)
        } else {
            Err(format!("{} items, not {n}", ids.len()))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_reply_requeue_and_close_review_items() {
    let sabi = Sending::start(
        Arc::new(Says("The agent's answer.".into())),
        &[("SABI_ADMIN_TOKEN", TOKEN), ("SABI_PAIR_SPACING", "0")],
    )
    .await;
    // Three customers wrote an hour ago: too old for an automatic reply.
    for i in 1..=3 {
        sabi.customer_writes(
            &format!("wamid.old{i}"),
            &customer(i),
            "are you there?",
            3600,
        )
        .await;
    }
    let ids = wait_for_review(&sabi, 3).await;
    assert!(
        sabi.fake.accepted().is_empty(),
        "nothing automatic went out"
    );

    // One item, with its conversation.
    let shown = admin(&sabi, "GET", &format!("/admin/review/{}", ids[0]), None).await;
    assert_eq!(shown["item"]["reason"], "too_old");
    assert_eq!(
        shown["conversation"]["history"][0]["text"],
        "are you there?"
    );

    // A person's reply goes out once, through the sender.
    let reply = json!({"text": "Sorry for the wait, how can we help?"});
    let settled = admin(
        &sabi,
        "POST",
        &format!("/admin/review/{}/reply", ids[0]),
        Some(reply),
    )
    .await;
    assert_eq!(settled["state"], "replied");
    sabi.wait_for(Duration::from_secs(30), |outbox| {
        outbox.iter().any(|e| e.state == "accepted")
    })
    .await;
    // Settling twice is refused: an item is settled once.
    let auth = format!("Bearer {TOKEN}");
    let again = format!("{}/admin/review/{}/reply", sabi.url, ids[0]);
    let (status, _) = call(
        &sabi.client,
        &again,
        "POST",
        Some(&auth),
        Some(json!({"text": "x"})),
    )
    .await;
    assert_eq!(status, 404);

    // Back to the agent: answered now, however old.
    admin(
        &sabi,
        "POST",
        &format!("/admin/review/{}/requeue", ids[1]),
        None,
    )
    .await;
    sabi.wait_for(Duration::from_secs(30), |outbox| {
        outbox.iter().filter(|e| e.state == "accepted").count() == 2
    })
    .await;

    // Closed: gone from the queue, nothing sent.
    admin(
        &sabi,
        "POST",
        &format!("/admin/review/{}/close", ids[2]),
        None,
    )
    .await;
    assert!(review_ids(&sabi).await.is_empty());
    // A closed item sends nothing: no event to wait for, a short quiet is the proof.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let texts: Vec<String> = sabi
        .fake
        .accepted()
        .iter()
        .filter_map(|r| r.text().map(str::to_owned))
        .collect();
    assert_eq!(
        texts,
        [
            "Sorry for the wait, how can we help?",
            "The agent's answer."
        ],
        "one person's reply and one agent answer, each once"
    );

    // The replied item's customer (items are made in whatever order the turns ended).
    let replied = shown["item"]["customer"]
        .as_str()
        .expect("customer")
        .to_owned();
    let found = admin(
        &sabi,
        "GET",
        &format!("/admin/conversations?customer={replied}"),
        None,
    )
    .await;
    let history = &found["conversations"][0]["history"];
    assert_eq!(history[1]["text"], "Sorry for the wait, how can we help?");
}

/// What the owner typed in the WhatsApp Business app to `to`, as Meta echoes it (coexistence).
fn echo_webhook(id: &str, to: &str, text: &str) -> Vec<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let value = json!({
        "object": "whatsapp_business_account",
        "entry": [{
            "id": "100000000000000",
            "changes": [{
                "field": "smb_message_echoes",
                "value": {
                    "messaging_product": "whatsapp",
                    "metadata": {"display_phone_number": "15550000000", "phone_number_id": "100000000000001"},
                    "message_echoes": [{
                        "from": "15550000000", "to": to, "id": id,
                        "timestamp": now.to_string(), "type": "text", "text": {"body": text}
                    }]
                }
            }]
        }]
    });
    sabi::whatsapp::wire::encode(&value).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_owner_answers_from_the_app_the_assistant_stands_down_for_the_hold() {
    let sabi = Sending::start(
        Arc::new(Says("The agent's answer.".into())),
        &[("SABI_ADMIN_TOKEN", TOKEN), ("SABI_PAIR_SPACING", "0")],
    )
    .await;
    let (held, free) = (customer(1), customer(2));
    sabi.post_webhook(echo_webhook(
        "wamid.APP1",
        &held,
        "Na me, Tunde. Your order dey come today.",
    ))
    .await;
    sabi.customer_writes("wamid.h1", &held, "Thank you! What time?", 0)
        .await;
    // Another customer of the number is answered as ever: the proof the turn ran.
    sabi.customer_writes("wamid.f1", &free, "Hello", 0).await;
    sabi.wait_for(Duration::from_secs(30), |outbox| {
        outbox.iter().any(|e| e.state == "accepted")
    })
    .await;
    let items = eventually_seen("the person's item", Duration::from_secs(10), || async {
        match review_ids_for(&sabi, "person_answering").await.as_slice() {
            [one] => Ok(*one),
            other => Err(format!("items {other:?}")),
        }
    })
    .await;
    let shown = admin(&sabi, "GET", &format!("/admin/review/{items}"), None).await;
    assert_eq!(shown["item"]["customer"], held.as_str());
    assert_eq!(shown["ids"], json!([held.as_str()]));
    let history = &shown["conversation"]["history"];
    assert_eq!(history[0]["speaker"], "business", "{history}");
    assert_eq!(
        history[0]["text"],
        "Na me, Tunde. Your order dey come today."
    );
    assert_eq!(history[1]["text"], "Thank you! What time?");
    let sent: Vec<String> = sabi
        .fake
        .accepted()
        .iter()
        .filter(|r| r.is_message())
        .filter_map(|r| r.recipient().map(str::to_owned))
        .collect();
    assert_eq!(sent, [free], "nothing automatic went to the held customer");
}

#[tokio::test]
async fn the_webhook_allow_list_refuses_outsiders_even_with_a_valid_signature() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Sabi is reached from 127.0.0.1, outside the list, and 127.0.0.1 is no trusted proxy.
    let config = dir.path().join("allow.toml");
    std::fs::write(
        &config,
        "[ingress]\nwebhook_allow = [\"31.13.24.0/21\"]\ntrusted_proxies = [\"10.0.0.0/8\"]\n",
    )
    .expect("write");
    let config = config.to_str().expect("utf-8 path").to_owned();
    let sabi = SabiProcess::start_with(dir.path(), &[("SABI_CONFIG", config.as_str())]);
    let body = text_webhook("wamid.allow1", "2348031234567", "hello");
    let client = reqwest::Client::new();
    for forwarded in [None, Some("31.13.24.9")] {
        let mut request = webhook_request(&client, &sabi.url(""), body.clone());
        if let Some(ip) = forwarded {
            // A spoofed header from an untrusted peer changes nothing.
            request = request.header("x-forwarded-for", ip);
        }
        let response = request.send().await.expect("sent");
        assert_eq!(response.status(), 403, "forwarded {forwarded:?}");
    }
    let metrics = client
        .get(sabi.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains(r#"sabi_webhook_requests_total{outcome="forbidden_source"} 2"#),
        "{metrics}"
    );
    drop(sabi);
    assert!(
        crate::helpers::inbox_json(dir.path()).is_empty(),
        "nothing stored"
    );
}

/// A full turn through a child `sabi serve`, its logs kept.
async fn logged_turn(env: &[(&str, &str)]) -> Vec<String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut all = vec![("SABI_BATCH_WINDOW", "0")];
    all.extend_from_slice(env);
    let sabi = SabiProcess::start_with(dir.path(), &all);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let body = crate::helpers::text_webhook_at(
        "wamid.log1",
        "2348031234567",
        "Abeg wetin be my balance for 0123456789?",
        now,
    );
    let response = post_webhook(&reqwest::Client::new(), &sabi.url(""), body).await;
    assert_eq!(response.status(), 200);
    eventually_seen("a turn to end", Duration::from_secs(10), || async {
        let logs = sabi.logs();
        if logs.iter().any(|l| l.contains("turn ended")) {
            Ok(logs)
        } else {
            Err(format!("{logs:?}"))
        }
    })
    .await
}

#[tokio::test]
async fn logs_of_a_full_turn_hold_no_phone_number_or_message_text_by_default() {
    let logs = logged_turn(&[]).await.join("\n");
    for secret in ["2348031234567", "Abeg", "balance for", "0123456789"] {
        assert!(
            !logs.contains(secret),
            "{secret:?} leaked into the logs:\n{logs}"
        );
    }
    assert!(
        logs.contains("conversation="),
        "the turn line names the conversation by a tag"
    );

    let json = logged_turn(&[("SABI_LOG_FORMAT", "json")]).await;
    let turn = json
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["message"] == "turn ended")
        .expect("a JSON line for the turn");
    assert_eq!(turn["outcome"], "replied");
    assert!(turn["took_ms"].is_number() && turn["delay_ms"].is_number());
}
