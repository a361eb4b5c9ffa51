//! Sabi on the open internet, tried with real sockets as an attacker would: a huge declared
//! body, a body that stalls, headers dribbled a byte at a time, more connections than a node
//! keeps, and large bodies crowding out the small webhooks Meta sends.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{TestApp, text_webhook};

/// A test app with these `[ingress]` settings.
async fn app_with(ingress: &str) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("sabi.toml"),
        format!("[ingress]\n{ingress}\n"),
    )
    .expect("sabi.toml");
    TestApp::spawn_in(dir, None, &[]).await
}

/// Everything the server sends until it closes the connection; the test fails if it never
/// does within `patience`.
async fn until_closed(stream: &mut TcpStream, patience: Duration) -> String {
    let mut seen = Vec::new();
    let read = tokio::time::timeout(patience, async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the server kept the connection open: {seen:?}"
    );
    String::from_utf8_lossy(&seen).into_owned()
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
