//! The connection edge, tried with real sockets as an attacker would: clients that pipeline
//! requests and never read the answers, connections kept busy for ever, one address opening
//! many connections, many small bodies that stall, and admin uploads beside the webhook.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::helpers::{
    TestApp, app_with_ingress, eventually_some, post_broadcast, text_webhook, until_closed,
};

const TOKEN: &str = "edge-admin-token-0123456789";

/// A connection to `app` from the loopback address `from` (127.0.0.x: each is another client).
async fn connect_from(app: &TestApp, from: Ipv4Addr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(IpAddr::V4(from), 0))
        .expect("bind");
    socket.connect(app.addr).await.expect("connect")
}

const HOME: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const NEIGHBOUR: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// Whether the server still holds `stream` open after `wait` (whatever it sends meanwhile).
async fn still_open_after(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut buffer = [0u8; 4096];
    tokio::time::timeout(wait, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_err()
}

/// `GET /healthz` on a new connection from `from`, closing after: its status line, or `None`
/// when the server closed the connection without an answer.
async fn health_from(app: &TestApp, from: Ipv4Addr) -> Option<String> {
    let mut stream = connect_from(app, from).await;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: sabi\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let answer = until_closed(&mut stream, Duration::from_secs(10)).await;
    answer.lines().next().map(str::to_owned)
}

/// Polls `health_from` until it is answered 200; fails the test after `patience`.
async fn served_within(app: &TestApp, from: Ipv4Addr, patience: Duration) {
    eventually_some(&format!("an answer to {from}"), patience, || async {
        health_from(app, from)
            .await
            .is_some_and(|status| status.starts_with("HTTP/1.1 200"))
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_client_that_pipelines_requests_and_never_reads_loses_its_connection() {
    let app = app_with_ingress(
        "max_connections = 1\nwrite_timeout = \"1s\"\nheader_timeout = \"60s\"\n\
         max_requests_per_connection = 100000",
        &[],
    )
    .await;
    // A small receive window: the answers pile up on the server's side at once.
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("buffer");
    let stream = socket.connect(app.addr).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    // Five thousand requests for the chat page (13 KB each): 65 MB of answers never read.
    let requests = b"GET / HTTP/1.1\r\nHost: sabi\r\n\r\n".repeat(5_000);
    let flood = tokio::spawn(async move {
        let _ = writer.write_all(&requests).await;
        writer
    });
    // It holds the node's only connection until the write timeout drops it.
    served_within(&app, HOME, Duration::from_secs(20)).await;
    let mut buffer = vec![0u8; 64 * 1024];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the stalled connection was closed");
    flood.abort();
}

#[tokio::test]
async fn a_connection_past_its_age_takes_no_new_request() {
    let app = app_with_ingress("max_connection_age = \"1s\"\nheader_timeout = \"60s\"", &[]).await;
    let mut stream = connect_from(&app, HOME).await;
    let started = Instant::now();
    let mut answered = 0;
    // An honest-looking client: a request, its answer read, again and again.
    while started.elapsed() < Duration::from_secs(20) {
        if stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: sabi\r\n\r\n")
            .await
            .is_err()
        {
            break;
        }
        let mut buffer = [0u8; 4096];
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer)).await {
            Ok(Ok(n)) if n > 0 => answered += 1,
            _ => break,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the connection was still taking requests after 20 s"
    );
    assert!(answered >= 2, "it was served while young: {answered}");
}

#[tokio::test]
async fn an_event_stream_outlives_the_connection_age() {
    // A connection past its age gets the grace to finish what it is answering: 1 s here.
    let app = app_with_ingress(
        "max_connection_age = \"1s\"\nheader_timeout = \"60s\"\n\
         [engine]\nshutdown_grace = \"1s\"",
        &[],
    )
    .await;
    let session = "edge-stream-0123456789abcdef0123456789abcdef";
    let asked: serde_json::Value = app
        .client
        .post(app.url("/chat"))
        .json(&serde_json::json!({"session_id": session, "question": "hello"}))
        .send()
        .await
        .expect("posted")
        .json()
        .await
        .expect("json");
    let job = asked["job_id"].as_str().expect("job");
    let mut stream = connect_from(&app, HOME).await;
    stream
        .write_all(
            format!("GET /chat/{job}/events?session_id={session} HTTP/1.1\r\nHost: sabi\r\n\r\n")
                .as_bytes(),
        )
        .await
        .expect("sent");
    let mut head = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut head))
        .await
        .expect("an answer")
        .expect("read");
    let head = String::from_utf8_lossy(&head[..n]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
    // The question is queued on an API node: the stream waits for its answer, past the age.
    assert!(
        still_open_after(&mut stream, Duration::from_secs(4)).await,
        "an event stream was cut at the connection age"
    );
    // Its answer ends the stream, and the connection with it: it carries nothing after.
    app.scheduler.drain().await.expect("turn");
    until_closed(&mut stream, Duration::from_secs(10)).await;
}

#[tokio::test]
async fn pipelined_requests_beyond_the_limit_close_the_connection() {
    let app = app_with_ingress("max_requests_per_connection = 3", &[]).await;
    let mut stream = connect_from(&app, HOME).await;
    stream
        .write_all(&b"GET /healthz HTTP/1.1\r\nHost: sabi\r\n\r\n".repeat(5))
        .await
        .expect("sent");
    let answers = until_closed(&mut stream, Duration::from_secs(10)).await;
    assert_eq!(answers.matches("HTTP/1.1 200").count(), 3, "{answers}");
    assert!(
        answers.to_lowercase().contains("connection: close"),
        "{answers}"
    );
}

#[tokio::test]
async fn one_address_gets_its_share_of_connections_and_a_trusted_proxy_is_not_capped() {
    let app = app_with_ingress(
        "max_connections_per_address = 2\nheader_timeout = \"60s\"",
        &[],
    )
    .await;
    let first = connect_from(&app, HOME).await;
    let _second = connect_from(&app, HOME).await;
    assert_eq!(
        health_from(&app, HOME).await,
        None,
        "a third connection from one address is closed unanswered"
    );
    served_within(&app, NEIGHBOUR, Duration::from_secs(5)).await;
    drop(first);
    served_within(&app, HOME, Duration::from_secs(10)).await;

    let behind_proxy = app_with_ingress(
        "max_connections_per_address = 2\nheader_timeout = \"60s\"\n\
         trusted_proxies = [\"127.0.0.1/32\"]",
        &[],
    )
    .await;
    let _open = [
        connect_from(&behind_proxy, HOME).await,
        connect_from(&behind_proxy, HOME).await,
    ];
    served_within(&behind_proxy, HOME, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn small_bodies_that_stall_count_against_their_addresss_budget() {
    // The smallest budget allowed: the largest body (3.5 MiB); 61 bodies of 60,000 bytes.
    let app = app_with_ingress(
        "max_body_bytes_per_address = 3670016\nbody_timeout = \"60s\"",
        &[],
    )
    .await;
    let mut stalled = Vec::new();
    for _ in 0..100 {
        let mut stream = connect_from(&app, HOME).await;
        stream
            .write_all(
                b"POST /chat HTTP/1.1\r\nHost: sabi\r\nContent-Type: application/json\r\n\
                  Content-Length: 60000\r\n\r\n{",
            )
            .await
            .expect("sent");
        stalled.push(stream);
    }
    // A refusal comes at once; a body being read says nothing until it times out.
    let answers = futures_util::future::join_all(stalled.iter_mut().map(|stream| async {
        let mut buffer = [0u8; 1024];
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer)).await {
            Ok(Ok(n)) => Some(String::from_utf8_lossy(&buffer[..n]).into_owned()),
            _ => None,
        }
    }))
    .await;
    let refused: Vec<&String> = answers.iter().flatten().collect();
    for answer in &refused {
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("address_bodies_busy"), "{answer}");
    }
    assert_eq!(refused.len(), 39, "61 bodies fit in the budget");
    // Another address is read as usual.
    let mut neighbour = connect_from(&app, NEIGHBOUR).await;
    let question = br#"{"session_id":"edge-neighbour-0123456789abcdef0123","question":"hello"}"#;
    neighbour
        .write_all(
            format!(
                "POST /chat HTTP/1.1\r\nHost: sabi\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                question.len()
            )
            .as_bytes(),
        )
        .await
        .expect("sent");
    neighbour.write_all(question).await.expect("sent");
    let answer = until_closed(&mut neighbour, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
}

#[tokio::test]
async fn the_admin_api_checks_its_token_before_reading_a_body() {
    let app = app_with_ingress("", &[("SABI_ADMIN_TOKEN", TOKEN)]).await;
    let mut stream = connect_from(&app, HOME).await;
    stream
        .write_all(
            b"POST /admin/broadcasts HTTP/1.1\r\nHost: sabi\r\nContent-Type: application/json\r\n\
              Content-Length: 16000000\r\n\r\n{\"name\":",
        )
        .await
        .expect("sent");
    // Answered at once, long before the body timeout (10 s).
    let answer = until_closed(&mut stream, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
}

#[tokio::test]
async fn stalled_admin_uploads_leave_the_webhook_its_large_body_places() {
    let app = app_with_ingress(
        "max_large_bodies = 1\nbody_timeout = \"60s\"",
        &[("SABI_ADMIN_TOKEN", TOKEN)],
    )
    .await;
    let upload = format!(
        "POST /admin/broadcasts HTTP/1.1\r\nHost: sabi\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{{\"name\":"
    );
    let mut first = connect_from(&app, HOME).await;
    first.write_all(upload.as_bytes()).await.expect("sent");
    // The second upload finds the place taken: the first holds it.
    let mut second = connect_from(&app, HOME).await;
    second.write_all(upload.as_bytes()).await.expect("sent");
    let answer = until_closed(&mut second, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    // A signed webhook of 70 KB is large too, and has places of its own.
    let mut body = text_webhook("wamid.edge-large", "2348031234567", "hello");
    body.resize(70 * 1024, b' ');
    assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    drop(first);
}

#[tokio::test]
async fn broadcast_parameters_meta_would_refuse_are_refused_when_the_audience_is_read() {
    let app = app_with_ingress("", &[("SABI_ADMIN_TOKEN", TOKEN)]).await;
    let app = &app;
    let base = app.url("");
    let post = |body: serde_json::Value| post_broadcast(&app.client, &base, TOKEN, body);
    let template = serde_json::json!({"name": "diwali_offer", "language": "en"});
    let (status, said) = post(serde_json::json!({
        "name": "From a file", "template": template, "from": "100000000000001",
        "params": ["name", "city"],
        "audience_csv": "phone,name,city\n2348031234567,Ada,Lagos\n2348039999999,Bola,\"Ikeja\nLagos\"\n",
    }))
    .await;
    assert_eq!(status, 422, "{said}");
    let message = said["message"].as_str().expect("message");
    assert!(message.contains("line 3, column city"), "{message}");
    assert!(message.contains("line break"), "{message}");
    let (status, said) = post(serde_json::json!({
        "name": "Listed", "template": template, "from": "100000000000001",
        "recipients": [{"to": "2348031234567", "params": ["a     b"]}],
    }))
    .await;
    assert_eq!(status, 422, "{said}");
    let message = said["message"].as_str().expect("message");
    assert!(
        message.contains("recipient 1, parameter {{1}}"),
        "{message}"
    );
    // Nothing was kept.
    let (status, list) = {
        let response = app
            .client
            .get(app.url("/admin/broadcasts"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("listed");
        (
            response.status().as_u16(),
            response.json::<serde_json::Value>().await.expect("json"),
        )
    };
    assert_eq!(status, 200);
    assert_eq!(
        list["broadcasts"].as_array().map(Vec::len),
        Some(0),
        "{list}"
    );
}

#[tokio::test]
async fn a_customers_export_comes_a_page_at_a_time() {
    let app = app_with_ingress("", &[("SABI_ADMIN_TOKEN", TOKEN)]).await;
    let customer = "2348031234567";
    for n in 0..5 {
        let sent = app
            .post_whatsapp_webhook(text_webhook(&format!("wamid.page{n}"), customer, "hello"))
            .await;
        assert_eq!(sent.status(), 200);
    }
    let (mut items, mut pages) = (Vec::new(), 0);
    let mut query = "limit=2".to_owned();
    loop {
        let page: serde_json::Value = app
            .client
            .get(app.url(&format!("/admin/customers/whatsapp/{customer}?{query}")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("export")
            .json()
            .await
            .expect("json");
        pages += 1;
        let page_items = page["items"].as_array().expect("items");
        assert!(page_items.len() <= 2, "{page}");
        items.extend(page_items.iter().map(|i| i["external_id"].clone()));
        let next = &page["next"];
        if next.is_null() {
            break;
        }
        query = format!(
            "limit=2&items_after={}&replies_after={}",
            next["items_after"], next["replies_after"]
        );
        assert!(pages < 10, "the pages never end");
    }
    let expected: Vec<serde_json::Value> =
        (0..5).map(|n| format!("wamid.page{n}").into()).collect();
    assert_eq!(items, expected, "every item once, in order");
    assert_eq!(pages, 3);
}
