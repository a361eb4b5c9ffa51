//! A customer's data from the outside: export and forget through the admin API and the CLI,
//! by the number as people write it (local with a country, or formatted), their refusals of
//! what cannot name a customer, and on SQLite, the erased words gone from the store's files
//! after a clean stop.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::{
    SabiProcess, TestApp, eventually, inbox_json, json_lines, post_webhook, run_to_success,
    sabi_command, text_webhook_at,
};

const TOKEN: &str = "admin-secret-token";
const ADA: &str = "2348031234567";
const BO: &str = "2348030000002";
const SECRET: &str = "my BVN is 22233344455 and my PIN is 4321";

async fn call(app: &TestApp, method: reqwest::Method, path: &str) -> (u16, Value) {
    let response = app
        .client
        .request(method, app.url(path))
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .expect("sent");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

#[tokio::test]
async fn the_admin_api_exports_and_forgets_a_customer_once() {
    let app = TestApp::spawn_with(None, &[("SABI_ADMIN_TOKEN", TOKEN)]).await;
    for (id, from, text) in [("wamid.a1", ADA, SECRET), ("wamid.b1", BO, "hello")] {
        let body = text_webhook_at(id, from, text, 0);
        assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    }
    app.clock.advance(Duration::from_secs(20));
    app.scheduler.drain().await.expect("turns");

    let path = format!("/admin/customers/whatsapp/{ADA}");
    let (status, record) = call(&app, reqwest::Method::GET, &path).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["customer"], ADA);
    assert_eq!(record["items"][0]["text"], SECRET);
    // Sent long ago: too old for an automatic answer, so handed to a person.
    assert_eq!(record["hand_offs"][0]["reason"], "too_old");

    let (status, forgotten) = call(&app, reqwest::Method::DELETE, &path).await;
    assert_eq!(status, 200, "{forgotten}");
    assert_eq!(forgotten["erased"]["messages"], 1);
    assert_eq!(forgotten["erased"]["reviews"], 1);
    let (_, queue) = call(&app, reqwest::Method::GET, "/admin/review").await;
    assert!(!queue.to_string().contains("22233344455"), "{queue}");
    let (_, again) = call(&app, reqwest::Method::DELETE, &path).await;
    assert!(
        again["erased"]
            .as_object()
            .expect("counts")
            .values()
            .all(|n| n == 0),
        "nothing more to forget: {again}"
    );
    let (_, record) = call(&app, reqwest::Method::GET, &path).await;
    for kind in ["items", "replies", "hand_offs", "broadcasts"] {
        assert_eq!(record[kind], Value::Array(Vec::new()), "{kind}: {record}");
    }
    let inbox = format!("{:?}", app.inbox().await);
    assert!(!inbox.contains("22233344455") && inbox.contains("hello"));

    // Meta retries the erased message: acknowledged, not taken in again.
    let retry = text_webhook_at("wamid.a1", ADA, SECRET, 0);
    assert_eq!(app.post_whatsapp_webhook(retry).await.status(), 200);
    assert!(!format!("{:?}", app.inbox().await).contains("22233344455"));

    for (bad, field) in [
        ("/admin/customers/whatsapp/0803-CALL-ME", "customer"),
        ("/admin/customers/fax/2348031234567", "channel"),
        ("/admin/customers/webchat/a%20b", "customer"),
    ] {
        for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
            let (status, body) = call(&app, method.clone(), bad).await;
            assert_eq!(status, 422, "{method} {bad}: {body}");
            assert!(
                body["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with(field)),
                "{body}"
            );
        }
    }
}

#[tokio::test]
async fn a_customer_named_by_their_local_number_is_the_one_kept_under_the_e164_number() {
    let app = TestApp::spawn_with(None, &[("SABI_ADMIN_TOKEN", TOKEN)]).await;
    for (id, from, text) in [("wamid.l1", ADA, SECRET), ("wamid.l2", BO, "hello")] {
        let body = text_webhook_at(id, from, text, 0);
        assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    }
    app.clock.advance(Duration::from_secs(20));
    app.scheduler.drain().await.expect("turns");

    // A local number without a country is not taken for a customer Sabi never held.
    let local = "/admin/customers/whatsapp/0803%20123%204567";
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let (status, refused) = call(&app, method, local).await;
        assert_eq!(status, 422, "{refused}");
        let message = refused["message"].as_str().unwrap_or_default();
        assert!(message.contains("?country="), "{message}");
    }
    let (status, refused) = call(&app, reqwest::Method::GET, &format!("{local}?country=0")).await;
    assert_eq!(status, 422, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("country")
    );
    for path in [
        format!("{local}?country=234"),
        format!("{local}?country=%2B234"),
        "/admin/customers/whatsapp/%2B234%20803-123-4567".to_owned(),
    ] {
        let (status, record) = call(&app, reqwest::Method::GET, &path).await;
        assert_eq!(status, 200, "{path}: {record}");
        assert_eq!(record["customer"], ADA, "{path}");
        assert_eq!(record["items"][0]["text"], SECRET, "{path}");
    }

    // The CLI the same: refused without a country, naming --country, and nothing erased...
    let refused = tokio::task::spawn_blocking({
        let mut command = sabi_command(app.dir.path());
        command.args(["forget", "0803 123 4567"]);
        move || command.output()
    })
    .await
    .expect("joined")
    .expect("sabi runs");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--country"), "{stderr}");
    // ...then, with the country, the E.164 customer's words erased and the other's kept.
    let mut forget = sabi_command(app.dir.path());
    forget.args(["forget", "0803 123 4567", "--country", "234", "--json"]);
    let forgot: Value = serde_json::from_str(&run_to_success(forget).await).expect("JSON");
    assert_eq!(forgot["customer"], ADA);
    assert_eq!(forgot["erased"]["messages"], 1);
    let inbox = format!("{:?}", app.inbox().await);
    assert!(!inbox.contains("22233344455") && inbox.contains("hello"));

    // whatsapp.default_country stands in for --country.
    let mut export = sabi_command(app.dir.path());
    export
        .env("SABI_DEFAULT_COUNTRY", "234")
        .args(["export", "0803 000 0002", "--json"]);
    let record: Value = serde_json::from_str(&run_to_success(export).await).expect("JSON");
    assert_eq!(record["customer"], BO);
    assert_eq!(record["items"][0]["text"], "hello");
    let path = "/admin/customers/whatsapp/0803-000-0002?country=234";
    let (status, forgotten) = call(&app, reqwest::Method::DELETE, path).await;
    assert_eq!(status, 200, "{forgotten}");
    assert_eq!(forgotten["customer"], BO);
    assert_eq!(forgotten["erased"]["messages"], 1);
    assert!(app.inbox().await.is_empty(), "both customers are forgotten");
}

/// A 2026 webhook: a text from a customer Meta names by `number` (when it shows it) and BSUID.
fn from_bsuid(id: &str, number: Option<&str>, bsuid: &str, text: &str) -> Vec<u8> {
    let mut contact = serde_json::json!({"profile": {"name": "Amaka"}, "user_id": bsuid});
    let mut message = serde_json::json!({
        "from_user_id": bsuid, "id": id, "timestamp": "0", "type": "text", "text": {"body": text}
    });
    if let Some(number) = number {
        contact["wa_id"] = number.into();
        message["from"] = number.into();
    }
    let value = serde_json::json!({
        "object": "whatsapp_business_account",
        "entry": [{"id": "1", "changes": [{"field": "messages", "value": {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "15550000000", "phone_number_id": "100000000000001"},
            "contacts": [contact],
            "messages": [message],
        }}]}]
    });
    sabi::whatsapp::wire::encode(&value).into_bytes()
}

#[tokio::test]
async fn a_customer_named_by_number_then_by_bsuid_alone_is_exported_and_forgotten_by_either() {
    const BSUID: &str = "NG.5530912874410021";
    let app = TestApp::spawn_with(None, &[("SABI_ADMIN_TOKEN", TOKEN)]).await;
    for body in [
        from_bsuid("wamid.n1", Some(ADA), BSUID, "hello"),
        from_bsuid("wamid.n2", None, BSUID, SECRET),
    ] {
        assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    }
    app.clock.advance(Duration::from_secs(20));
    app.scheduler.drain().await.expect("turns");

    // One customer: the BSUID alone finds the number's conversation, and both ids are shown.
    let (status, record) = call(
        &app,
        reqwest::Method::GET,
        &format!("/admin/customers/whatsapp/{BSUID}"),
    )
    .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["customer"], ADA);
    assert_eq!(record["ids"], serde_json::json!([ADA, BSUID]));
    let texts: Vec<&str> = record["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["text"].as_str())
        .collect();
    assert_eq!(texts, ["hello", SECRET]);
    let mut export = sabi_command(app.dir.path());
    export.args(["export", BSUID, "--json"]);
    let exported: Value = serde_json::from_str(&run_to_success(export).await).expect("JSON");
    assert_eq!(exported["ids"], serde_json::json!([ADA, BSUID]));

    // Forgotten by the BSUID: the number's messages go too, and neither id is held any more.
    let mut forget = sabi_command(app.dir.path());
    forget.args(["forget", BSUID, "--json"]);
    let forgot: Value = serde_json::from_str(&run_to_success(forget).await).expect("JSON");
    assert_eq!(forgot["erased"]["messages"], 2, "{forgot}");
    let inbox = format!("{:?}", app.inbox().await);
    for word in ["22233344455", ADA, BSUID] {
        assert!(!inbox.contains(word), "{word} in {inbox}");
    }
}

#[test]
fn the_cli_refuses_what_is_not_a_customer_and_says_when_it_held_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let refused = sabi_command(dir.path())
        .args(["forget", "0803-CALL-ME"])
        .output()
        .expect("sabi runs");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("not a WhatsApp number"), "{stderr}");

    let unknown = sabi_command(dir.path())
        .args(["forget", "+234 803 000 9999"])
        .output()
        .expect("sabi runs");
    assert!(unknown.status.success());
    let said = String::from_utf8_lossy(&unknown.stdout);
    assert!(said.contains("held nothing about 2348030009999"), "{said}");

    let export = sabi_command(dir.path())
        .args(["export", "s-1", "--channel", "webchat", "--json"])
        .output()
        .expect("sabi runs");
    assert!(export.status.success());
    let record: Value = serde_json::from_slice(&export.stdout).expect("one JSON document");
    assert_eq!(record["channel"], "webchat");
    assert_eq!(record["items"], Value::Array(Vec::new()));
}

/// A text message from `from`, sent now, as Meta delivers it.
fn text_sent_now(id: &str, from: &str, text: &str) -> Vec<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    text_webhook_at(id, from, text, i64::try_from(now).expect("time"))
}

/// Every byte of every file in `dir`.
fn files_of(dir: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(dir).expect("dir") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            bytes.extend(std::fs::read(&path).expect("readable"));
        }
    }
    bytes
}

fn holds(bytes: &[u8], word: &str) -> bool {
    bytes.windows(word.len()).any(|w| w == word.as_bytes())
}

#[tokio::test]
async fn after_forget_and_a_clean_stop_the_erased_words_are_in_no_sqlite_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("sqlite://{}", dir.path().join("sabi.db").display());
    let env = [
        ("SABI_STORE", store.as_str()),
        ("SABI_BATCH_WINDOW", "100ms"),
    ];
    let sabi = SabiProcess::start_with(dir.path(), &env);
    let client = reqwest::Client::new();
    for (id, from, text) in [("wamid.s1", ADA, SECRET), ("wamid.s2", BO, "hello Sabi")] {
        let body = text_sent_now(id, from, text);
        assert_eq!(
            post_webhook(&client, &sabi.url(""), body).await.status(),
            200
        );
    }
    let answered = || {
        let inbox = sabi_command(dir.path())
            .env("SABI_STORE", &store)
            .args(["inbox", "--json"])
            .output()
            .expect("sabi runs");
        let lines = String::from_utf8_lossy(&inbox.stdout).into_owned();
        lines.lines().count() == 2 && lines.lines().all(|l| l.contains(r#""state":"answered""#))
    };
    eventually("both messages answered", || async { answered() }).await;
    assert!(
        holds(&files_of(dir.path()), "22233344455"),
        "the words are on disk before"
    );

    let forgot = sabi_command(dir.path())
        .env("SABI_STORE", &store)
        .args(["forget", ADA])
        .output()
        .expect("sabi runs");
    assert!(
        forgot.status.success(),
        "{}",
        String::from_utf8_lossy(&forgot.stderr)
    );
    let said = String::from_utf8_lossy(&forgot.stdout);
    assert!(said.contains("1 messages"), "{said}");

    sabi.terminate();
    let bytes = files_of(dir.path());
    for word in ["22233344455", "my PIN is", ADA] {
        assert!(
            !holds(&bytes, word),
            "{word:?} survived in the store's files"
        );
    }
    assert!(holds(&bytes, "hello Sabi"), "the others' words are kept");
}

#[tokio::test]
async fn a_node_with_short_horizons_forgets_on_its_own_and_takes_no_retry_in() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = [
        ("SABI_BATCH_WINDOW", "100ms"),
        ("SABI_RETENTION_MESSAGES", "2s"),
        ("SABI_RETENTION_DEDUPE", "1h"),
        ("SABI_SWEEP_EVERY", "1s"),
    ];
    let sabi = SabiProcess::start_with(dir.path(), &env);
    let client = reqwest::Client::new();
    let body = text_sent_now("wamid.r1", ADA, SECRET);
    assert_eq!(
        post_webhook(&client, &sabi.url(""), body.clone())
            .await
            .status(),
        200
    );
    let answered = || {
        let inbox = inbox_json(dir.path());
        inbox.len() == 1 && inbox[0]["state"] == "answered"
    };
    eventually("the message answered", || async { answered() }).await;
    assert_eq!(
        json_lines(dir.path(), &["outbox", "--json"]).len(),
        1,
        "the sandbox reply"
    );

    // Past the horizon the sweeper takes the message, its turn and its reply.
    eventually("the sweeper to take the message and its reply", || async {
        inbox_json(dir.path()).is_empty()
            && json_lines(dir.path(), &["outbox", "--json"]).is_empty()
    })
    .await;
    // Meta's retry is acknowledged and known: nothing is stored, nothing answered.
    assert_eq!(
        post_webhook(&client, &sabi.url(""), body).await.status(),
        200
    );
    assert!(
        inbox_json(dir.path()).is_empty(),
        "the retry was not taken in"
    );
    assert!(
        sabi.logs()
            .iter()
            .any(|l| l.contains("deleted what was past its retention")),
        "the sweep says what it did"
    );
}
