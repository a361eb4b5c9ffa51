//! Sabi on the open internet, tried with real sockets as an attacker would: a huge declared
//! body, a body that stalls, headers dribbled a byte at a time, more connections than a node
//! keeps, and large bodies crowding out the small webhooks Meta sends.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{TestApp, app_with_ingress, text_webhook, until_closed};

/// A test app with these `[ingress]` settings.
async fn app_with(ingress: &str) -> TestApp {
    app_with_ingress(ingress, &[]).await
}

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(app.addr).await.expect("connect")
}

#[tokio::test]
async fn a_declared_length_over_the_limit_is_refused_before_anything_is_read() {
    let app = TestApp::spawn().await;
    let mut stream = connect(&app).await;
    stream
        .write_all(
            b"POST /webhook/whatsapp HTTP/1.1\r\nHost: sabi\r\nContent-Type: application/json\r\n\
              Content-Length: 99999999999\r\n\r\n0123456789",
        )
        .await
        .expect("sent");
    let answer = until_closed(&mut stream, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(app.inbox().await.is_empty());
}

#[tokio::test]
async fn a_body_that_stalls_is_cut_off_at_the_body_timeout() {
    let app = app_with("body_timeout = \"1s\"").await;
    let mut stream = connect(&app).await;
    stream
        .write_all(
            b"POST /webhook/whatsapp HTTP/1.1\r\nHost: sabi\r\nContent-Type: application/json\r\n\
              Content-Length: 1000\r\n\r\n{\"object\":",
        )
        .await
        .expect("sent");
    let answer = until_closed(&mut stream, Duration::from_secs(15)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
}

#[tokio::test]
async fn a_client_dribbling_its_headers_is_dropped() {
    let app = app_with("header_timeout = \"1s\"").await;
    let mut stream = connect(&app).await;
    stream
        .write_all(b"POST /webhook/whatsapp HTTP/1.1\r\n")
        .await
        .expect("sent");
    let dribble = async {
        for _ in 0..100 {
            if stream.write_all(b"X").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let closed = tokio::time::timeout(Duration::from_secs(15), dribble).await;
    assert!(closed.is_ok(), "still dribbling after 15 s");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
    assert!(
        read.is_ok(),
        "the server closed the connection of a client that never finished its headers"
    );
}

#[tokio::test]
async fn beyond_the_connection_limit_new_connections_close_and_service_goes_on() {
    let app = app_with("max_connections = 3").await;
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(connect(&app).await);
    }
    // Let the server take the three before the fourth knocks.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut fourth = connect(&app).await;
    let answer = until_closed(&mut fourth, Duration::from_secs(5)).await;
    assert!(answer.is_empty(), "closed without an answer: {answer}");
    drop(idle);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let response = app
        .post_whatsapp_webhook(text_webhook("wamid.c1", "2348031234567", "hello"))
        .await;
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn large_bodies_wait_their_turn_and_small_webhooks_never_do() {
    let app = app_with("max_large_bodies = 1\nbody_timeout = \"30s\"").await;
    // One large body arrives slowly and holds the only large-body place.
    let mut slow = connect(&app).await;
    slow.write_all(
        b"POST /webhook/whatsapp HTTP/1.1\r\nHost: sabi\r\nContent-Type: application/json\r\n\
          Content-Length: 500000\r\n\r\n{\"object\":",
    )
    .await
    .expect("sent");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut second = connect(&app).await;
    second
        .write_all(
            b"POST /webhook/whatsapp HTTP/1.1\r\nHost: sabi\r\nContent-Type: application/json\r\n\
              Content-Length: 500000\r\n\r\n{",
        )
        .await
        .expect("sent");
    let answer = until_closed(&mut second, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.to_lowercase().contains("retry-after"), "{answer}");
    // A webhook of ordinary size goes straight through.
    let response = app
        .post_whatsapp_webhook(text_webhook("wamid.s1", "2348031234567", "hello"))
        .await;
    assert_eq!(response.status(), 200);
    drop(slow);
}

#[tokio::test]
async fn the_store_is_readable_by_its_owner_alone_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("sabi-data");
    let store = sabi::store::SqliteStore::open(&data.join("sabi.db"), crate::helpers::marks())
        .await
        .expect("store");
    drop(store);
    let mode =
        |p: &std::path::Path| std::fs::metadata(p).expect("exists").permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700);
    for name in ["sabi.db", "sabi.db-wal", "sabi.db-shm"] {
        let file = data.join(name);
        if file.exists() {
            assert_eq!(mode(&file), 0o600, "{name}");
        }
    }
    // A file left readable by an older version is closed at the next start.
    std::fs::set_permissions(data.join("sabi.db"), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    let _store = sabi::store::SqliteStore::open(&data.join("sabi.db"), crate::helpers::marks())
        .await
        .expect("store");
    assert_eq!(mode(&data.join("sabi.db")), 0o600);
}

#[test]
fn an_api_node_or_one_beyond_loopback_without_an_app_secret_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (role, listen) in [("api", "127.0.0.1:0"), ("all", "0.0.0.0:0")] {
        let output = crate::helpers::sabi_command(dir.path())
            .env_remove("SABI_WHATSAPP_APP_SECRET")
            .env("SABI_LISTEN", listen)
            .args(["serve", "--role", role])
            .output()
            .expect("sabi runs");
        assert!(!output.status.success(), "{role} on {listen} started");
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(said.contains("SABI_WHATSAPP_APP_SECRET"), "{said}");
    }
}

#[tokio::test]
async fn pages_carry_security_headers_and_metrics_can_need_a_token() {
    let app =
        TestApp::spawn_with(None, &[("SABI_METRICS_TOKEN", "metrics-token-0123456789")]).await;
    let page = app.client.get(app.url("/")).send().await.expect("page");
    let headers = page.headers().clone();
    let page_text = page.text().await.expect("text");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["referrer-policy"], "no-referrer");
    let policy = headers["content-security-policy"].to_str().expect("ascii");
    assert!(policy.contains("script-src 'sha256-"), "{policy}");
    assert!(policy.contains("frame-ancestors *"), "{policy}");
    assert!(!policy.contains("unsafe-inline"), "{policy}");
    assert!(page_text.contains("<script>"));

    let open = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("metrics");
    assert_eq!(open.status(), 401);
    let allowed = app
        .client
        .get(app.url("/metrics"))
        .bearer_auth("metrics-token-0123456789")
        .send()
        .await
        .expect("metrics");
    assert_eq!(allowed.status(), 200);
}

#[tokio::test]
async fn one_address_cannot_take_the_web_chat_queue_from_everyone_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("sabi.toml"),
        "[ingress]\ntrusted_proxies = [\"127.0.0.1/32\"]\n",
    )
    .expect("sabi.toml");
    let app = TestApp::spawn_in(dir, None, &[("SABI_WEBCHAT_PER_ADDRESS", "5")]).await;
    let ask = |from: &'static str, n: usize| {
        app.client
            .post(app.url("/chat"))
            .header("x-forwarded-for", from)
            .json(&serde_json::json!({"session_id": format!("flood-{n}-0123456789abcdef01234"), "question": "hello"}))
            .send()
    };
    let mut accepted = 0;
    for n in 0..20 {
        let response = ask("203.0.113.7", n).await.expect("posted");
        match response.status().as_u16() {
            202 => accepted += 1,
            429 => assert!(response.headers().contains_key("retry-after")),
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(
        accepted, 5,
        "a new session id per question does not get around it"
    );
    let neighbour = ask("198.51.100.20", 100).await.expect("posted");
    assert_eq!(neighbour.status(), 202, "another address is served");
}

#[tokio::test]
async fn a_session_keeps_only_a_few_event_streams_and_they_wake_on_their_turn() {
    let app = TestApp::spawn().await;
    let session = "streams-0123456789abcdef";
    let asked: serde_json::Value = app
        .client
        .post(app.url("/chat"))
        .json(&serde_json::json!({"session_id": session, "question": "I wan check my balance"}))
        .send()
        .await
        .expect("posted")
        .json()
        .await
        .expect("json");
    let job = asked["job_id"].as_str().expect("job").to_owned();
    let url = app.url(&format!("/chat/{job}/events?session_id={session}"));
    let mut open = Vec::new();
    for _ in 0..3 {
        let stream = app.client.get(&url).send().await.expect("stream");
        assert_eq!(stream.status(), 200);
        open.push(stream);
    }
    let fourth = app.client.get(&url).send().await.expect("stream");
    assert_eq!(fourth.status(), 429);
    let retry: u64 = fourth.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!(
        (240..=300).contains(&retry),
        "the real wait: until the oldest stream's 5 minutes end, {retry}"
    );
    // The turn runs on this node: its streams hear the answer as it is written.
    app.scheduler.drain().await.expect("turn");
    let mut first = open.remove(0);
    let mut seen = String::new();
    while !seen.contains("event: finished") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), first.chunk())
            .await
            .expect("the answer came")
            .expect("read")
            .expect("a chunk");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop((first, open));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let again = app.client.get(&url).send().await.expect("stream");
    assert_eq!(again.status(), 200, "closed streams give their places back");
}

/// A test app behind a trusted local proxy (so `X-Forwarded-For` names each client), with
/// these settings.
async fn app_behind_proxy(env: &[(&str, &str)]) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("sabi.toml"),
        "[ingress]\ntrusted_proxies = [\"127.0.0.1/32\"]\n",
    )
    .expect("sabi.toml");
    TestApp::spawn_in(dir, None, env).await
}

/// An IPv6 subscriber holds a whole /64: taking a new address per stream does not get past the
/// per-address cap of event streams, and its refusal says when the first of them ends.
#[tokio::test]
async fn event_streams_are_capped_per_ipv6_64_not_per_address() {
    let app = app_behind_proxy(&[]).await;
    let mut open = Vec::new();
    let stream_from = |n: usize, address: String| {
        let app = &app;
        async move {
            let session = format!("v6-{n}-0123456789abcdef01234");
            let body = serde_json::json!({"session_id": session, "question": "hello"});
            let (status, _, asked) = ask_from(app, &address, body).await;
            assert_eq!(status, 202, "{asked}");
            let job = asked["job_id"].as_str().expect("job").to_owned();
            app.client
                .get(app.url(&format!("/chat/{job}/events?session_id={session}")))
                .header("x-forwarded-for", address)
                .send()
                .await
                .expect("stream")
        }
    };
    for n in 0..12 {
        let stream = stream_from(n, format!("2001:db8:1:2::{:x}", n + 1)).await;
        assert_eq!(stream.status(), 200);
        open.push(stream);
    }
    let refused = stream_from(12, "2001:db8:1:2:ffff:1:2:3".into()).await;
    assert_eq!(refused.status(), 429, "the same /64");
    let retry: u64 = refused.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((240..=300).contains(&retry), "{retry}");
    let elsewhere = stream_from(13, "2001:db8:1:3::1".into()).await;
    assert_eq!(elsewhere.status(), 200, "another /64 is another subscriber");
}

/// `POST /chat` from `address`.
async fn ask_from(
    app: &TestApp,
    address: &str,
    body: serde_json::Value,
) -> (u16, Option<String>, serde_json::Value) {
    let response = app
        .client
        .post(app.url("/chat"))
        .header("x-forwarded-for", address)
        .json(&body)
        .send()
        .await
        .expect("posted");
    let status = response.status().as_u16();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().expect("ascii").to_owned());
    (status, retry, response.json().await.expect("json"))
}

#[tokio::test]
async fn one_address_gets_a_few_new_sessions_and_hand_offs_an_hour() {
    const SECRET: &str = "identity-secret-for-the-site";
    let app = app_behind_proxy(&[
        ("SABI_WEBCHAT_SESSIONS_PER_ADDRESS", "3"),
        ("SABI_WEBCHAT_HANDOFFS_PER_ADDRESS", "2"),
        ("SABI_WEBCHAT_IDENTITY_SECRET", SECRET),
    ])
    .await;
    // Sessions of 128 bits, as every route wants them.
    let hello = |session: &str| serde_json::json!({"session_id": format!("{session}-0123456789abcdef01234"), "question": "hello"});
    for n in 0..3 {
        let (status, _, _) = ask_from(&app, "203.0.113.7", hello(&format!("new-{n}"))).await;
        assert_eq!(status, 202);
    }
    let (status, retry, body) = ask_from(&app, "203.0.113.7", hello("new-3")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (429, Some("too_many_sessions"))
    );
    let retry: u64 = retry.expect("Retry-After").parse().expect("seconds");
    assert!(retry > 60, "the bucket refills by the hour: {retry}");
    let (status, _, _) = ask_from(&app, "203.0.113.7", hello("new-0")).await;
    assert_eq!(status, 202, "an open session goes on");
    let (status, _, _) = ask_from(&app, "198.51.100.20", hello("next-door")).await;
    assert_eq!(status, 202, "another address starts its own");

    let person = |session: &str| serde_json::json!({"session_id": format!("{session}-0123456789abcdef01234"), "question": "I want to speak to a human"});
    for _ in 0..2 {
        let (status, _, _) = ask_from(&app, "198.51.100.20", person("next-door")).await;
        assert_eq!(status, 202);
    }
    let (status, retry, body) = ask_from(&app, "198.51.100.20", person("next-door")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (429, Some("handoff_pending"))
    );
    assert!(retry.is_some());
    let (status, _, _) = ask_from(&app, "198.51.100.20", hello("next-door")).await;
    assert_eq!(status, 202, "other questions go on");
    // A visitor the site vouches for is known: their requests for a person are not capped.
    let hash = sabi::whatsapp::sign(&secrecy::SecretString::from(SECRET.to_owned()), b"user-7");
    let mut signed = person("next-door-signed-in");
    signed["user_id"] = "user-7".into();
    signed["user_hash"] = hash.trim_start_matches("sha256=").into();
    let (status, _, body) = ask_from(&app, "198.51.100.20", signed).await;
    assert_eq!(status, 202, "{body}");
}

#[tokio::test]
async fn the_desk_folds_one_addresss_repeated_anonymous_hand_offs_into_one() {
    const TOKEN: &str = "desk-token-for-tests";
    let app = app_behind_proxy(&[("SABI_ADMIN_TOKEN", TOKEN)]).await;
    let person = |n: usize| serde_json::json!({"session_id": format!("flood-{n}-0123456789abcdef01234"), "question": "I want to speak to a human"});
    for n in 0..4 {
        assert_eq!(ask_from(&app, "203.0.113.7", person(n)).await.0, 202);
    }
    // Handed over first: turns at once may end in any order, and the desk lists by hand-off.
    app.scheduler.drain().await.expect("turns");
    assert_eq!(ask_from(&app, "198.51.100.20", person(9)).await.0, 202);
    app.scheduler.drain().await.expect("turns");
    let review = || async {
        app.client
            .get(app.url("/admin/review"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("review")
            .json::<serde_json::Value>()
            .await
            .expect("json")["items"]
            .as_array()
            .expect("items")
            .clone()
    };
    let items = review().await;
    assert_eq!(items.len(), 2, "{items:#?}");
    assert_eq!(items[0]["address"], "203.0.113.7");
    let repeats = items[0]["repeats"].as_array().expect("repeats");
    assert_eq!(repeats.len(), 3);
    assert_eq!(items[1]["address"], "198.51.100.20");
    assert_eq!(items[1]["repeats"], serde_json::json!([]));
    // Settling the item brings up the next of its repeats: one address may be many people.
    let closed = app
        .client
        .post(app.url(&format!("/admin/review/{}/close", items[0]["id"])))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("close");
    assert_eq!(closed.status(), 200);
    let left = review().await;
    assert_eq!(left.len(), 2);
    assert_eq!(left[0]["id"], repeats[0]);
    assert_eq!(left[0]["repeats"].as_array().map(Vec::len), Some(2));
    // The neighbour keeps its place even on a page of two, which the flood would fill unfolded.
    let page: serde_json::Value = app
        .client
        .get(app.url("/admin/review?limit=2"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("review")
        .json()
        .await
        .expect("json");
    assert_eq!(page["items"][1]["address"], "198.51.100.20");
}

/// A script whose questions make the model answer unfitly floods the desk as surely as one
/// asking for a person: every anonymous review item, whatever its reason, folds by address
/// (an IPv6 client's /64) and spends the address's hand-off bucket.
#[tokio::test]
async fn anonymous_model_output_items_fold_by_address_and_spend_its_hand_offs() {
    const TOKEN: &str = "desk-token-for-tests";
    let llm = sabi::testing::llm::FakeLlm::start().await;
    let base = llm.base_url();
    let app = app_behind_proxy(&[
        ("SABI_ADMIN_TOKEN", TOKEN),
        ("SABI_WEBCHAT_HANDOFFS_PER_ADDRESS", "2"),
        ("SABI_LLM_BASE_URL", base.as_str()),
        ("SABI_LLM_MODEL", "fake-model"),
    ])
    .await;
    let unfit = || sabi::testing::llm::Answer::Text("<|im_start|>".into());
    llm.script([unfit(), unfit(), unfit(), unfit()]);
    let question = |n: usize| serde_json::json!({"session_id": format!("unfit-{n}-0123456789abcdef01234"), "question": "Which restaurant in Lekki would you recommend for a birthday?"});
    for (n, address) in ["2001:db8:1:2::1", "2001:db8:1:2::ffff"]
        .into_iter()
        .enumerate()
    {
        assert_eq!(ask_from(&app, address, question(n)).await.0, 202);
        app.scheduler.drain().await.expect("turn");
    }
    let items: serde_json::Value = app
        .client
        .get(app.url("/admin/review"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("review")
        .json()
        .await
        .expect("json");
    let items = items["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "one /64, one row: {items:#?}");
    assert_eq!(items[0]["reason"], "model_output");
    assert_eq!(items[0]["repeats"].as_array().map(Vec::len), Some(1));

    let person = serde_json::json!({"session_id": "unfit-9-0123456789abcdef01234", "question": "I want to speak to a human"});
    let (status, retry, body) = ask_from(&app, "2001:db8:1:2::2", person.clone()).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (429, Some("handoff_pending")),
        "the two items spent the address's hand-offs"
    );
    assert!(retry.is_some());
    let (status, _, _) = ask_from(&app, "198.51.100.20", person).await;
    assert_eq!(status, 202, "another address has its own");
}
