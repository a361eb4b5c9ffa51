//! Abuse bench: the attacks of the open-internet work replayed against `sabi serve` (the
//! binary this profile builds: release under `cargo bench`), each on a fresh store, printing
//! what they cost the node and what a signed webhook meanwhile saw.
//!
//! `cargo bench --bench abuse` runs them at full size: 300 stalled 3 MB bodies, 1,500
//! connections dribbling headers, 2,100 event streams (700 sessions from 700 addresses, 3
//! each, on queued jobs of an API node), a 300-question burst from one address, a WhatsApp
//! customer behind 300 queued web-chat questions, and web chat beside 60 WhatsApp messages a
//! second sent through a fake Graph API at Meta's default rate; a session's history as a
//! memory amplifier (300 long questions, 1,000 unread history reads), a verified user's session
//! joined by a stranger, a model asking for 2,000 tool calls in a round (`-- amplifiers` runs
//! these three alone); then the connection edge:
//! 10,200 connections from one address that pipeline requests and never read the answers,
//! 9,000 small bodies from one address that stall, and 16 stalled admin uploads beside signed
//! 70 KB webhooks. Under `cargo test` each runs small, as a smoke check.

use std::process::Command;
use std::time::{Duration, Instant};

use sabi::testing::webhook::signed;
use secrecy::SecretString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[path = "support/node.rs"]
#[allow(dead_code, reason = "each bench uses part of the shared node")]
mod support;

use support::Node;

const SECRET: &str = "abuse-bench-secret";

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    // The attackers' own sockets are open files too.
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let scale = |big: usize, small: usize| if full { big } else { small };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        println!("abuse bench: each attack against a fresh `sabi serve` (SQLite), webhooks sampled every 100 ms meanwhile");
        // The smoke run shortens Sabi's timeouts and the measuring window; the bench keeps the
        // defaults.
        let timeouts = if full {
            ""
        } else {
            "header_timeout = \"2s\"\nbody_timeout = \"2s\"\n"
        };
        let window = Duration::from_secs(if full { 10 } else { 2 });
        if std::env::args().any(|a| a == "edge") {
            connection_edge(full, window).await;
            return;
        }
        // `cargo bench --bench abuse -- amplifiers`: the history and tool fan-out alone.
        if std::env::args().any(|a| a == "amplifiers") {
            history_amplifier(scale(300, 20), scale(1_000, 50)).await;
            session_join().await;
            tool_fan_out(scale(2_000, 40)).await;
            return;
        }
        stalled_bodies(scale(300, 10), timeouts).await;
        dribbled_headers(scale(1_500, 20), timeouts).await;
        event_streams(scale(700, 10), window).await;
        one_address_burst(scale(300, 40)).await;
        whatsapp_behind_a_full_web_chat(scale(300, 10)).await;
        web_chat_beside_whatsapp_load(scale(60, 10), window * 2).await;
        history_amplifier(scale(300, 20), scale(1_000, 50)).await;
        session_join().await;
        tool_fan_out(scale(2_000, 40)).await;
        connection_edge(full, window).await;
    });
}

/// The connection edge's attacks; `cargo bench --bench abuse -- edge` runs them alone.
async fn connection_edge(full: bool, window: Duration) {
    let scale = |big: usize, small: usize| if full { big } else { small };
    // The smoke run shortens the write timeout; the bench keeps the default 30 s.
    let edge = if full { "" } else { "write_timeout = \"2s\"\n" };
    slow_readers(scale(10_200, 40), edge).await;
    small_stalled_bodies(scale(9_000, 300), edge).await;
    admin_uploads_beside_the_webhook(scale(16, 4), window).await;
}

/// `sabi serve --role <role>` with these `sabi.toml` lines, its log read and dropped.
fn node(role: &str, config: &str, env: &[(&str, &str)]) -> Node {
    Node::start(role, config, SECRET, env, |_| false)
}

/// Resident memory of `node`, MB.
fn rss_mb(node: &Node) -> f64 {
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", node.pid())).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// CPU time `node` used so far (user + system), seconds.
fn cpu_seconds(node: &Node) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", node.pid())).unwrap_or_default();
    // The fields after the command name (which may hold spaces) are space-separated.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
        .sum();
    ticks / 100.0
}

fn webhook(id: &str) -> Vec<u8> {
    webhook_from(id, "2348031234567")
}

fn webhook_from(id: &str, from: &str) -> Vec<u8> {
    let value = sabi::whatsapp::wire::text_webhook(
        "100000000000001",
        from,
        "Bench",
        id,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        "hello",
    );
    sabi::whatsapp::wire::encode(&value).into_bytes()
}

/// Signed webhooks sent beside an attack, every 100 ms from its start until
/// [`Sampler::summary`], each padded (with spaces, as JSON allows) to `bytes`.
struct Sampler {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<(Vec<Duration>, usize)>,
}

impl Sampler {
    fn start(node: &Node, bytes: usize) -> Sampler {
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(sample_webhooks(
            node.url("/webhook/whatsapp"),
            stop.clone(),
            bytes,
        ));
        Sampler { stop, task }
    }

    /// Stops the sampling; what the webhooks met meanwhile.
    async fn summary(self) -> String {
        self.stop.cancel();
        let (mut latencies, failed) = self.task.await.expect("sampler");
        summary(&mut latencies, failed)
    }
}

/// Signed webhooks every 100 ms until `stop`; their latencies, and how many were not 200.
async fn sample_webhooks(
    url: String,
    stop: tokio_util::sync::CancellationToken,
    bytes: usize,
) -> (Vec<Duration>, usize) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let (mut latencies, mut failed) = (Vec::new(), 0);
    let mut n = 0;
    while !stop.is_cancelled() {
        n += 1;
        let mut body = webhook(&format!("wamid.sample{n}-{}", rand_id()));
        if body.len() < bytes {
            body.resize(bytes, b' ');
        }
        let started = Instant::now();
        let sent = signed(&client, &url, SECRET, body).send().await;
        match sent {
            Ok(r) if r.status() == 200 => latencies.push(started.elapsed()),
            _ => failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (latencies, failed)
}

fn rand_id() -> String {
    let mut bytes = [0u8; 6];
    let _ = getrandom::fill(&mut bytes);
    hex::encode(bytes)
}

fn summary(latencies: &mut [Duration], failed: usize) -> String {
    latencies.sort();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
    };
    format!(
        "webhooks meanwhile: {} answered 200 (p50 {:.1} ms, p95 {:.1} ms, max {:.1} ms), {failed} not",
        latencies.len(),
        at(0.5),
        at(0.95),
        at(1.0)
    )
}

/// Until the server closes `stream` (or `limit` passes); when it did.
async fn closed_after(
    mut stream: TcpStream,
    started: Instant,
    limit: Duration,
) -> Option<Duration> {
    let mut buffer = [0u8; 1024];
    let read = tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    read.ok().map(|()| started.elapsed())
}

async fn stalled_bodies(connections: usize, timeouts: &str) {
    let node = node("all", &format!("[ingress]\n{timeouts}"), &[]);
    let sampler = Sampler::start(&node, 0);
    let started = Instant::now();
    let mut attackers = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let addr = node.addr();
        attackers.spawn(async move {
            let mut stream = TcpStream::connect(addr).await.ok()?;
            let head = "POST /webhook/whatsapp HTTP/1.1\r\nHost: sabi\r\nContent-Type: application/json\r\nContent-Length: 3400000\r\n\r\n";
            stream.write_all(head.as_bytes()).await.ok()?;
            let chunk = vec![b' '; 64 * 1024];
            for _ in 0..46 {
                if stream.write_all(&chunk).await.is_err() {
                    break;
                }
            }
            // ...and never the rest.
            closed_after(stream, started, Duration::from_secs(90)).await
        });
    }
    let mut peak_rss = rss_mb(&node);
    while !attackers.is_empty() {
        peak_rss = peak_rss.max(rss_mb(&node));
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            Some(_) = attackers.join_next() => {
                // Drain every finished one before sampling again.
                while attackers.try_join_next().is_some() {}
            }
        }
    }
    let all_closed = started.elapsed();
    let meanwhile = sampler.summary().await;
    println!(
        "stalled bodies: {connections} connections x 3 MB that stop: peak RSS {peak_rss:.0} MB, all closed within {:.1} s; {}",
        all_closed.as_secs_f64(),
        meanwhile
    );
}

async fn dribbled_headers(connections: usize, timeouts: &str) {
    let node = node("all", &format!("[ingress]\n{timeouts}"), &[]);
    let sampler = Sampler::start(&node, 0);
    let started = Instant::now();
    let mut attackers = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let addr = node.addr();
        attackers.spawn(async move {
            let mut stream = TcpStream::connect(addr).await.ok()?;
            stream
                .write_all(b"POST /webhook/whatsapp HTTP/1.1\r\n")
                .await
                .ok()?;
            for _ in 0..120 {
                if stream.write_all(b"X").await.is_err() {
                    return Some(started.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            None
        });
    }
    let mut closed = 0;
    let mut last = Duration::ZERO;
    while let Some(done) = attackers.join_next().await {
        if let Ok(Some(at)) = done {
            closed += 1;
            last = last.max(at);
        }
    }
    let meanwhile = sampler.summary().await;
    println!(
        "dribbled headers: {connections} connections, {closed} closed by Sabi, the last after {:.1} s; {}",
        last.as_secs_f64(),
        meanwhile
    );
}

async fn event_streams(sessions: usize, window: Duration) {
    // An API node: the questions stay queued, their streams stay open.
    let node = node(
        "api",
        "[ingress]\ntrusted_proxies = [\"127.0.0.1/32\"]\n",
        &[],
    );
    let client = reqwest::Client::new();
    let mut jobs = Vec::new();
    for n in 0..sessions {
        let session = format!("bench-session-{n:08}-0123456789");
        let address = format!("10.{}.{}.{}", n / 65_536 % 256, n / 256 % 256, n % 256);
        let asked: serde_json::Value = client
            .post(node.url("/chat"))
            .header("x-forwarded-for", &address)
            .json(&serde_json::json!({"session_id": session, "question": "hello"}))
            .send()
            .await
            .expect("asked")
            .json()
            .await
            .expect("json");
        let job = asked["job_id"].as_str().expect("job").to_owned();
        jobs.push((session, address, job));
    }
    let mut streams = Vec::new();
    for (session, address, job) in &jobs {
        for _ in 0..3 {
            let stream = client
                .get(node.url(&format!("/chat/{job}/events?session_id={session}")))
                .header("x-forwarded-for", address)
                .send()
                .await
                .expect("stream");
            assert_eq!(stream.status(), 200, "a stream opened");
            streams.push(stream);
        }
    }
    let sampler = Sampler::start(&node, 0);
    let (cpu_before, wall) = (cpu_seconds(&node), Instant::now());
    tokio::time::sleep(window).await;
    let cpu = (cpu_seconds(&node) - cpu_before) / wall.elapsed().as_secs_f64();
    let meanwhile = sampler.summary().await;
    println!(
        "event streams: {} open ({sessions} sessions from {sessions} addresses, 3 each, queued jobs): {:.1} % of a core; {}",
        streams.len(),
        cpu * 100.0,
        meanwhile
    );
}

async fn one_address_burst(questions: usize) {
    let node = node(
        "api",
        "[ingress]\ntrusted_proxies = [\"127.0.0.1/32\"]\n",
        &[],
    );
    let client = reqwest::Client::new();
    let ask = |address: &'static str, n: usize| {
        client
            .post(node.url("/chat"))
            .header("x-forwarded-for", address)
            .json(&serde_json::json!({"session_id": format!("burst-{n}-0123456789abcdef01234"), "question": "hello"}))
            .send()
    };
    let answers =
        futures_util::future::join_all((0..questions).map(|n| ask("203.0.113.9", n))).await;
    let accepted = answers
        .iter()
        .filter(|a| a.as_ref().is_ok_and(|r| r.status() == 202))
        .count();
    let neighbour = ask("198.51.100.1", questions)
        .await
        .map_or(0, |r| r.status().as_u16());
    println!(
        "one address: {accepted} of a {questions}-question burst accepted; another address then got {neighbour}"
    );
}

/// Web-chat questions whose turns each take 2 s (the sandbox stands in for a slow model) fill
/// the queue; then a WhatsApp customer writes. How long until their answer is stored?
async fn whatsapp_behind_a_full_web_chat(questions: usize) {
    let node = node(
        "all",
        "",
        &[
            ("SABI_SANDBOX_REPLY_DELAY", "2s"),
            ("SABI_WEBCHAT_PER_ADDRESS", "0"),
            ("SABI_WEBCHAT_SESSIONS_PER_ADDRESS", "0"),
        ],
    );
    let client = reqwest::Client::new();
    for n in 0..questions {
        let asked = client
            .post(node.url("/chat"))
            .json(&serde_json::json!({"session_id": format!("queue-{n}-0123456789abcdef01234"), "question": "Who go win the league?"}))
            .send()
            .await
            .expect("asked");
        assert_eq!(asked.status(), 202);
    }
    let body = webhook("wamid.behind-the-queue");
    let started = Instant::now();
    let sent = signed(&client, &node.url("/webhook/whatsapp"), SECRET, body)
        .send()
        .await
        .expect("webhook");
    assert_eq!(sent.status(), 200);
    let store = node.store_url();
    let answered = loop {
        let out = Command::new(env!("CARGO_BIN_EXE_sabi"))
            .args(["inbox", "--json"])
            .env("SABI_CONFIG", "/dev/null")
            .env("SABI_MARKER_SECRET", support::MARKER_SECRET)
            .env("SABI_STORE", &store)
            .output()
            .expect("sabi inbox");
        let done = String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.contains("wamid.behind-the-queue") && l.contains("\"state\":\"answered\""));
        if done || started.elapsed() > Duration::from_secs(120) {
            break done.then(|| started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    match answered {
        Some(after) => println!(
            "a full web chat: {questions} questions of 2 s turns waiting; a WhatsApp customer answered after {} ms",
            after.as_millis()
        ),
        None => println!(
            "a full web chat: {questions} questions waiting; the WhatsApp customer was not answered within 120 s"
        ),
    }
}

/// 3,000 WhatsApp customers write 60 messages a second to a node that sends through a fake
/// Graph API at Meta's default 80 messages a second (replies and typing indicators share that
/// budget); meanwhile a web visitor asks a question every 250 ms. Web answers need none of
/// Meta's budget: how long do they take?
async fn web_chat_beside_whatsapp_load(rate: usize, duration: Duration) {
    const TOKEN: &str = "abuse-bench-graph-token";
    let graph = sabi::testing::graph::FakeGraph::start(TOKEN).await;
    let node = node(
        "all",
        "",
        &[
            ("SABI_WHATSAPP_ACCESS_TOKEN", TOKEN),
            ("SABI_WHATSAPP_API_BASE", &graph.base_url()),
            ("SABI_WEBCHAT_PER_ADDRESS", "0"),
            ("SABI_WEBCHAT_SESSIONS_PER_ADDRESS", "0"),
        ],
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let load = tokio::spawn(whatsapp_load(
        node.url("/webhook/whatsapp"),
        rate,
        stop.clone(),
    ));
    let client = reqwest::Client::new();
    let mut visitors = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let started = Instant::now();
    while started.elapsed() < duration {
        tick.tick().await;
        visitors.spawn(web_answer(client.clone(), node.url(""), rand_id()));
    }
    let mut latencies: Vec<Duration> = Vec::new();
    let mut unanswered = 0;
    while let Some(answer) = visitors.join_next().await {
        match answer.expect("visitor") {
            Some(took) => latencies.push(took),
            None => unanswered += 1,
        }
    }
    stop.cancel();
    let sent = load.await.expect("load");
    latencies.sort();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
    };
    println!(
        "web chat beside {rate} WhatsApp messages/s ({sent} sent, {} replies reached the Graph API): {} web answers, median {:.0} ms, p95 {:.0} ms, {unanswered} not within 30 s",
        graph
            .accepted()
            .iter()
            .filter(|r| r.text().is_some())
            .count(),
        latencies.len(),
        at(0.5),
        at(0.95),
    );
}

/// Signed webhooks at `rate` a second from 3,000 customers, until `stop`; how many were sent.
async fn whatsapp_load(url: String, rate: usize, stop: tokio_util::sync::CancellationToken) -> u64 {
    let client = reqwest::Client::new();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    let mut sent = 0u64;
    while !stop.is_cancelled() {
        tick.tick().await;
        let from = format!("23480{:08}", sent % 3_000);
        let body = webhook_from(&format!("wamid.load{sent}-{}", rand_id()), &from);
        let request = signed(&client, &url, SECRET, body);
        tokio::spawn(request.send());
        sent += 1;
    }
    sent
}

/// One web visitor's question, and how long its answer took (polling as the page does when it
/// has no event stream); `None` when none came within 30 s.
async fn web_answer(client: reqwest::Client, base: String, session: String) -> Option<Duration> {
    let session = format!("bench-visitor-{session}-0123456789");
    let started = Instant::now();
    let asked: serde_json::Value = client
        .post(format!("{base}/chat"))
        .json(&serde_json::json!({"session_id": session, "question": "hello"}))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let job = asked["job_id"].as_str()?.to_owned();
    while started.elapsed() < Duration::from_secs(30) {
        let job: serde_json::Value = client
            .get(format!("{base}/chat/{job}?session_id={session}"))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        if job["status"] == "finished" {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Open files of `node` now (its connections among them).
fn open_files(node: &Node) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", node.pid())).map_or(0, Iterator::count)
}

/// A connection to `node` from another loopback address (127.0.0.x), so that the webhooks
/// sampled from 127.0.0.1 meanwhile are another client.
async fn connect_from(node: &Node, from: std::net::Ipv4Addr) -> Option<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket
        .bind(std::net::SocketAddr::new(from.into(), 0))
        .ok()?;
    socket.connect(node.addr()).await.ok()
}

/// Peak resident memory and open files of `node` until every attacker ends; their answers.
async fn watch<T: 'static>(
    node: &Node,
    mut attackers: tokio::task::JoinSet<T>,
) -> (f64, usize, Vec<T>) {
    let (mut peak_rss, mut peak_files) = (rss_mb(node), open_files(node));
    let mut done = Vec::new();
    while !attackers.is_empty() {
        peak_rss = peak_rss.max(rss_mb(node));
        peak_files = peak_files.max(open_files(node));
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            Some(Ok(one)) = attackers.join_next() => {
                done.push(one);
                while let Some(Ok(one)) = attackers.try_join_next() {
                    done.push(one);
                }
            }
        }
    }
    (peak_rss, peak_files, done)
}

/// Connections from one address that pipeline requests for the chat page and never read the
/// answers (finding: 10,200 of them took every connection for a minute and more). Each keeps
/// sending until Sabi closes it; when did it?
async fn slow_readers(connections: usize, edge: &str) {
    let node = node("all", &format!("[ingress]\n{edge}"), &[]);
    let sampler = Sampler::start(&node, 0);
    let started = Instant::now();
    let mut attackers = tokio::task::JoinSet::new();
    let from = std::net::Ipv4Addr::new(127, 0, 0, 2);
    for _ in 0..connections {
        let Some(mut stream) = connect_from(&node, from).await else {
            continue;
        };
        attackers.spawn(async move {
            let connected = Instant::now();
            let requests = b"GET / HTTP/1.1\r\nHost: sabi\r\n\r\n".repeat(200);
            // Writes fail once Sabi has closed the connection; one blocked on a full window
            // fails then too.
            while connected.elapsed() < Duration::from_secs(120) {
                match tokio::time::timeout(Duration::from_millis(500), stream.write_all(&requests))
                    .await
                {
                    Ok(Err(_)) => return Some(connected.elapsed()),
                    Ok(Ok(())) => tokio::time::sleep(Duration::from_millis(500)).await,
                    Err(_) => {}
                }
            }
            None
        });
    }
    let (peak_rss, peak_files, closed) = watch(&node, attackers).await;
    let meanwhile = sampler.summary().await;
    let at_once = closed
        .iter()
        .filter(|c| c.is_some_and(|at| at < Duration::from_secs(2)))
        .count();
    let last = closed.iter().flatten().max().copied().unwrap_or_default();
    let open = closed.iter().filter(|c| c.is_none()).count();
    println!(
        "slow readers: {} of {connections} connections from one address made, pipelining 200 requests each, never reading: {at_once} closed within 2 s of connecting, the last after {:.1} s, {open} still open after 120 s; all gone {:.1} s after the first; node peak {peak_files} open files, RSS {peak_rss:.0} MB; {}",
        closed.len(),
        last.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        meanwhile
    );
}

/// Small bodies (60,000 bytes declared, most of it sent) from one address that stop before
/// the end (finding: 9,000 of them held 760 MB).
async fn small_stalled_bodies(connections: usize, edge: &str) {
    let node = node("all", &format!("[ingress]\n{edge}"), &[]);
    let sampler = Sampler::start(&node, 0);
    let mut attackers = tokio::task::JoinSet::new();
    let from = std::net::Ipv4Addr::new(127, 0, 0, 2);
    for _ in 0..connections {
        let Some(mut stream) = connect_from(&node, from).await else {
            continue;
        };
        attackers.spawn(async move {
            let head = "POST /chat HTTP/1.1\r\nHost: sabi\r\nContent-Type: application/json\r\nContent-Length: 60000\r\n\r\n";
            let mut sent = head.as_bytes().to_vec();
            sent.extend_from_slice(&[b' '; 50_000]);
            if stream.write_all(&sent).await.is_err() {
                return "closed";
            }
            let mut answer = [0u8; 512];
            match tokio::time::timeout(Duration::from_secs(90), stream.read(&mut answer)).await {
                Ok(Ok(n)) if answer[..n].starts_with(b"HTTP/1.1 503") => "503",
                Ok(Ok(n)) if answer[..n].starts_with(b"HTTP/1.1 408") => "408",
                Ok(Ok(0) | Err(_)) => "closed",
                Ok(Ok(_)) => "other",
                Err(_) => "open",
            }
        });
    }
    let (peak_rss, peak_files, answers) = watch(&node, attackers).await;
    let meanwhile = sampler.summary().await;
    let count = |what: &str| answers.iter().filter(|a| **a == what).count();
    println!(
        "small stalled bodies: {connections} x 60 KB declared from one address: {} closed unanswered, {} refused 503, {} read until the body timeout (408), {} still open; node peak {peak_files} open files, RSS {peak_rss:.0} MB, {:.0} MB after; {}",
        count("closed"),
        count("503"),
        count("408"),
        count("open"),
        rss_mb(&node),
        meanwhile
    );
}

/// Admin uploads (16 MB declared) that stall, with the token, beside signed webhooks of 70 KB
/// (finding: 16 of them made the webhook answer 503).
async fn admin_uploads_beside_the_webhook(uploads: usize, window: Duration) {
    const TOKEN: &str = "abuse-bench-admin-token";
    let node = node("all", "", &[("SABI_ADMIN_TOKEN", TOKEN)]);
    let mut stalled = Vec::new();
    for _ in 0..uploads {
        let Ok(mut stream) = TcpStream::connect(node.addr()).await else {
            continue;
        };
        let head = format!(
            "POST /admin/broadcasts HTTP/1.1\r\nHost: sabi\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 16000000\r\n\r\n{{\"name\":"
        );
        if stream.write_all(head.as_bytes()).await.is_ok() {
            stalled.push(stream);
        }
    }
    let sampler = Sampler::start(&node, 70 * 1024);
    tokio::time::sleep(window).await;
    let meanwhile = sampler.summary().await;
    println!(
        "admin uploads: {} stalled 16 MB uploads with the token; signed 70 KB {}",
        stalled.len(),
        meanwhile
    );
}

/// A history as a memory amplifier: a question of control characters (6 bytes each as JSON),
/// then `questions` long questions in one session and `readers` connections asking for its
/// history without reading the answers.
async fn history_amplifier(questions: usize, readers: usize) {
    let node = node(
        "all",
        "[webchat]\nper_session_per_minute = 100000\nper_address_per_minute = 100000\n",
        &[],
    );
    let client = reqwest::Client::new();
    let session = format!("amplifier-{}-0123456789", rand_id());
    let controls: String = "\u{1}".repeat(4_000);
    let refused = client
        .post(node.url("/chat"))
        .json(&serde_json::json!({"session_id": session, "question": controls}))
        .send()
        .await
        .map_or(0, |r| r.status().as_u16());
    let long = "a".repeat(3_900);
    for n in 0..questions {
        let _ = client
            .post(node.url("/chat"))
            .json(&serde_json::json!({"session_id": session, "question": long, "message_id": format!("q{n}")}))
            .send()
            .await;
    }
    let page = client
        .get(node.url(&format!("/chat/history?session_id={session}")))
        .send()
        .await
        .expect("history");
    let page_bytes = page.bytes().await.map_or(0, |b| b.len());
    let before = rss_mb(&node);
    let request = format!("GET /chat/history?session_id={session} HTTP/1.1\r\nhost: x\r\n\r\n");
    let mut held = Vec::new();
    for _ in 0..readers {
        if let Ok(mut stream) = TcpStream::connect(node.addr()).await {
            let _ = stream.set_nodelay(true);
            let _ = stream.write_all(request.as_bytes()).await;
            held.push(stream);
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!(
        "history amplifier: a 4,000-control-character question got {refused}; {questions} questions of 3,900 characters, then a history page of {:.1} KB; {} unread history reads: RSS {before:.0} MB before, {:.0} MB after",
        page_bytes as f64 / 1e3,
        held.len(),
        rss_mb(&node)
    );
}

/// One question whose model asks for `calls` tool calls in one round, each answered with
/// 200 KB: how many reach the business's API, and how big the next prompt is.
async fn tool_fan_out(calls: usize) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let api = axum::Router::new().route(
        "/orders/{id}",
        axum::routing::get(move || {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                axum::Json(serde_json::json!({"status": "shipped", "log": "x".repeat(200_000)}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let api_url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, api).await });
    let llm = sabi::testing::llm::FakeLlm::start().await;
    let asked = (0..calls)
        .map(|n| {
            (
                "order_status".to_owned(),
                serde_json::json!({"order_id": n.to_string()}),
            )
        })
        .collect();
    llm.script([
        sabi::testing::llm::Answer::ToolCalls(asked),
        sabi::testing::llm::Answer::Text("Your orders are on their way.".into()),
    ]);
    let config = format!(
        r#"[llm]
base_url = "{}"
model = "fan-out"
api_key = "none"

[router]
enabled = false

[[tools]]
name = "order_status"
description = "Where an order is"
parameters = {{ type = "object", properties = {{ order_id = {{ type = "string" }} }}, required = ["order_id"] }}
url = "{api_url}/orders/{{order_id}}"
timeout = "5s"
"#,
        llm.base_url()
    );
    let node = node("all", &config, &[]);
    let body = webhook("wamid.fan-out");
    let sent = signed(
        &reqwest::Client::new(),
        &node.url("/webhook/whatsapp"),
        SECRET,
        body,
    )
    .send()
    .await
    .expect("webhook");
    assert_eq!(sent.status(), 200);
    let started = Instant::now();
    // The turn ends with a second model call, or with a person when that call's prompt would
    // pass the turn's budget.
    while llm.completions().len() < 2 && started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let prompts = llm.completions();
    let next = match prompts.get(1) {
        Some(prompt) => format!(
            "the next prompt {:.0} KB",
            prompt.to_string().len() as f64 / 1e3
        ),
        None => "no next model call (its prompt would pass the turn's budget: to a person)".into(),
    };
    println!(
        "tool fan-out: a model asking for {calls} tool calls in one round: {} reached the business's API (answers of 200 KB each), {next}; RSS {:.0} MB",
        hits.load(Ordering::SeqCst),
        rss_mb(&node)
    );
}

/// A verified user's session, joined by someone else: asking in it, resending the user's
/// message id, reading its history; and a session id too short to be secret.
async fn session_join() {
    const IDENTITY: &str = "abuse-bench-identity-secret";
    let node = node(
        "all",
        &format!("[webchat]\nidentity_secret = \"{IDENTITY}\"\n"),
        &[],
    );
    let client = reqwest::Client::new();
    let session = format!("joined-{}-0123456789abcdef", rand_id());
    let hash = sabi::whatsapp::sign(&SecretString::from(IDENTITY.to_owned()), b"user-42");
    let hash = hash.trim_start_matches("sha256=");
    let ask = |body: serde_json::Value| client.post(node.url("/chat")).json(&body).send();
    let status = |r: reqwest::Result<reqwest::Response>| r.map_or(0, |r| r.status().as_u16());
    let owner = status(
        ask(
            serde_json::json!({"session_id": session, "question": "my BVN is 22212345678",
            "message_id": "m1", "user_id": "user-42", "user_hash": hash}),
        )
        .await,
    );
    let anonymous = status(
        ask(serde_json::json!({"session_id": session, "question": "what did I say?"})).await,
    );
    let resend = status(
        ask(serde_json::json!({"session_id": session, "question": "again", "message_id": "m1"}))
            .await,
    );
    let history = status(
        client
            .get(node.url(&format!("/chat/history?session_id={session}")))
            .send()
            .await,
    );
    let short = status(ask(serde_json::json!({"session_id": "a", "question": "hello"})).await);
    println!(
        "session join: the user's question {owner}; in their session an anonymous question got {anonymous}, a resend of their message id {resend}, a history read {history}; a 1-character session id {short}"
    );
}
