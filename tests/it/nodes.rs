//! Several nodes on one shared store (PostgreSQL, and Redis): two `--role api` nodes and two
//! `--role worker` nodes take a stream of webhooks and web-chat questions while processes are
//! killed with SIGKILL at random moments. Nothing acknowledged is lost, nothing is answered
//! twice, and no conversation has two turns at once. With the store down, webhooks get 503 and
//! everything resumes when it is back.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::conformance::{PgDatabase, RedisPrefix};
use crate::helpers::{
    PATIENCE, SabiProcess, eventually, eventually_seen, eventually_some, ms, sabi_command,
    text_webhook_at, webhook_request,
};
use crate::services::{self, Cable};
use sabi::clock::At;

const CONVERSATIONS: usize = 150;
const BURST: usize = 3;
const QUESTIONS: usize = 60;
const CLIENTS: usize = 8;

/// A `sabi` command's JSON lines, on the given store.
pub fn json_lines(dir: &Path, store: &str, args: &[&str]) -> Vec<Value> {
    let output = sabi_command(dir)
        .env("SABI_STORE", store)
        .args(args)
        .output()
        .expect("sabi runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

pub fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn random_below(n: u64) -> u64 {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("random");
    u64::from_le_bytes(bytes) % n.max(1)
}

/// Posts to the first node that acknowledges; a killed node's refusals are not acknowledgements.
async fn deliver(client: &reqwest::Client, urls: &[String], body: Vec<u8>) {
    let mut attempt = 0;
    eventually_some("a node to acknowledge a webhook", PATIENCE, || {
        let url = &urls[attempt % urls.len()];
        attempt += 1;
        // A killed node's refusals are not acknowledgements.
        let sent = webhook_request(client, url, body.clone()).send();
        async move { sent.await.is_ok_and(|r| r.status() == 200).then_some(()) }
    })
    .await;
}

async fn ask(client: &reqwest::Client, urls: &[String], n: usize) {
    let body = json!({"session_id": format!("s-{n}-0123456789abcdef01234"), "message_id": "m-1", "question": "hello"});
    let mut attempt = 0;
    eventually_some("a node to accept a question", PATIENCE, || {
        let url = &urls[attempt % urls.len()];
        attempt += 1;
        let sent = client.post(format!("{url}/chat")).json(&body).send();
        async move { sent.await.is_ok_and(|r| r.status() == 202).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_on_postgres_lose_nothing_and_answer_once_while_killed() {
    let Some(db) = PgDatabase::create().await else {
        return;
    };
    nodes_lose_nothing_and_answer_once_while_killed(&db.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_on_redis_lose_nothing_and_answer_once_while_killed() {
    let Some(prefix) = RedisPrefix::new() else {
        return;
    };
    nodes_lose_nothing_and_answer_once_while_killed(&prefix.url).await;
}

async fn nodes_lose_nothing_and_answer_once_while_killed(store: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = [
        ("SABI_STORE", store),
        ("SABI_BATCH_WINDOW", "200ms"),
        ("SABI_BATCH_MAX_WAIT", "1s"),
        ("SABI_LEASE", "2s"),
    ];
    let mut apis = vec![
        SabiProcess::spawn(dir.path(), "api", &env),
        SabiProcess::spawn(dir.path(), "api", &env),
    ];
    let mut workers = vec![
        SabiProcess::spawn(dir.path(), "worker", &env),
        SabiProcess::spawn(dir.path(), "worker", &env),
    ];
    let urls: Arc<Vec<String>> = Arc::new(apis.iter().map(|a| a.url("")).collect());
    let client = reqwest::Client::new();
    let sent = Arc::new(AtomicUsize::new(0));
    let mut senders = tokio::task::JoinSet::new();
    for c in 0..CLIENTS {
        let (client, urls, sent) = (client.clone(), urls.clone(), sent.clone());
        senders.spawn(async move {
            for n in (c..CONVERSATIONS).step_by(CLIENTS) {
                for m in 0..BURST {
                    let id = format!("wamid.n{n}-{m}");
                    let body =
                        text_webhook_at(&id, &format!("2348{n:09}"), &format!("{n}-{m}"), now_s());
                    deliver(&client, &urls, body).await;
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            }
            for n in (c..QUESTIONS).step_by(CLIENTS) {
                ask(&client, &urls, n).await;
            }
        });
    }
    // Kill one API node and one worker at random moments of the stream; a new worker joins.
    let total = CONVERSATIONS * BURST;
    let kill_api_at = total / 4 + random_below(total as u64 / 2) as usize;
    let kill_worker_at = total / 4 + random_below(total as u64 / 2) as usize;
    let (mut api_killed, mut worker_killed) = (false, false);
    while !(senders.is_empty() || api_killed && worker_killed) {
        let so_far = sent.load(Ordering::Relaxed);
        if !api_killed && so_far >= kill_api_at {
            apis.remove(random_below(2) as usize).kill9();
            api_killed = true;
        }
        if !worker_killed && so_far >= kill_worker_at {
            workers.remove(random_below(2) as usize).kill9();
            workers.push(SabiProcess::spawn(dir.path(), "worker", &env));
            worker_killed = true;
        }
        if so_far >= total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while let Some(done) = senders.join_next().await {
        done.expect("sender");
    }

    // Everything acknowledged is stored, and answered.
    let expected = total + QUESTIONS;
    let inbox = eventually_seen("every message answered", ms(90_000), || async {
        let inbox = json_lines(dir.path(), store, &["inbox", "--json"]);
        let answered = inbox.iter().filter(|i| i["state"] == "answered").count();
        if answered == expected {
            Ok(inbox)
        } else {
            Err(format!(
                "{answered} of {expected} answered, {} stored",
                inbox.len()
            ))
        }
    })
    .await;
    assert_eq!(
        inbox.len(),
        expected,
        "every acknowledged message is stored, once"
    );
    let unanswered: Vec<_> = inbox.iter().filter(|i| i["state"] != "answered").collect();
    assert!(unanswered.is_empty(), "unanswered: {unanswered:?}");

    // One reply per batch, and per conversation no two turns at once.
    let outbox = json_lines(dir.path(), store, &["outbox", "--json"]);
    let mut per_batch: HashMap<i64, usize> = HashMap::new();
    let mut turns: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for reply in &outbox {
        *per_batch
            .entry(reply["batch"].as_i64().expect("batch"))
            .or_default() += 1;
        turns
            .entry(reply["customer"].as_str().expect("customer").to_owned())
            .or_default()
            .push((
                reply["turn_started_at_ms"].as_i64().expect("start"),
                reply["turn_finished_at_ms"].as_i64().expect("end"),
            ));
    }
    assert!(
        per_batch.values().all(|n| *n == 1),
        "no batch answered twice"
    );
    for (customer, mut intervals) in turns {
        intervals.sort();
        for pair in intervals.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "{customer}: {pair:?} overlap");
        }
    }
    drop((apis, workers));
}

/// A way to take the store away from Sabi and give it back.
trait Outage {
    fn down(&mut self);
    fn up(&mut self);
}

impl Outage for Cable {
    fn down(&mut self) {
        self.cut();
    }

    fn up(&mut self) {
        self.mend();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_postgres_down_webhooks_get_503_and_everything_resumes_after() {
    let Some(db) = PgDatabase::create().await else {
        return;
    };
    let server = db
        .url
        .rsplit_once('/')
        .map(|(s, _)| s.to_owned())
        .expect("server");
    let host = server
        .rsplit_once('@')
        .map_or(server.as_str(), |(_, h)| h)
        .to_owned();
    let cable = Cable::to(host.clone()).await;
    let through = db.url.replace(&host, &format!("127.0.0.1:{}", cable.port));
    store_down_then_back(&through, &db.url, cable).await;
}

/// A Redis server of the test's own, keeping an append-only file flushed on every write, that
/// the test can kill with SIGKILL and start again on the same port and files; over TLS, with a
/// certificate from a CA of its own, when asked.
struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<std::process::Child>,
    tls: bool,
}

/// Makes `ca.pem`, and `cert.pem` + `key.pem` for 127.0.0.1 signed by it.
const TEST_CA_SCRIPT: &str = "set -e
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -keyout ca.key -out ca.pem \\
  -subj /CN=sabi-test-ca -addext basicConstraints=critical,CA:TRUE \\
  -addext keyUsage=critical,keyCertSign
openssl req -newkey rsa:2048 -nodes -keyout key.pem -out server.csr -subj /CN=127.0.0.1
printf 'subjectAltName=IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\n' > ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \\
  -extfile ext -out cert.pem
";

impl RedisServer {
    /// `None` (the test skipped) where `redis-server`, or for TLS `openssl`, is not installed.
    fn start() -> Option<RedisServer> {
        RedisServer::start_with(false)
    }

    fn start_with(tls: bool) -> Option<RedisServer> {
        if !services::program("redis-server", "redis-server")
            || (tls && !services::program("openssl", "openssl"))
        {
            return None;
        }
        let port = services::free_port();
        let mut server = RedisServer {
            port,
            dir: tempfile::tempdir().expect("tempdir"),
            child: None,
            tls,
        };
        if tls {
            // A CA of the test's own (`ca.pem`) and the server's certificate signed by it.
            let made = std::process::Command::new("sh")
                .arg("-c")
                .arg(TEST_CA_SCRIPT)
                .current_dir(server.dir.path())
                .output()
                .expect("openssl runs");
            assert!(made.status.success(), "openssl: {made:?}");
        }
        server.up();
        Some(server)
    }

    /// The CA that signed the server's certificate.
    fn ca(&self) -> std::path::PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Outage for RedisServer {
    fn up(&mut self) {
        let port = self.port.to_string();
        let mut command = std::process::Command::new("redis-server");
        if self.tls {
            command
                .args([
                    "--port",
                    "0",
                    "--tls-port",
                    &port,
                    "--tls-auth-clients",
                    "no",
                ])
                .args(["--tls-cert-file", "cert.pem", "--tls-key-file", "key.pem"]);
        } else {
            command.args(["--port", &port]);
        }
        let child = command
            .args(["--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .arg("--dir")
            .arg(self.dir.path())
            .current_dir(self.dir.path())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server runs (it is on PATH where Redis is installed)");
        self.child = Some(child);
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn down(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.down();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_killed_webhooks_get_503_and_everything_resumes_after() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = format!("{}?durability=require", server.url());
    store_down_then_back(&url, &url, server).await;
}

#[test]
fn a_redis_that_could_lose_acknowledged_messages_is_refused_on_request() {
    // The shared test server keeps nothing on disk, as CI runs it.
    let Some(prefix) = RedisPrefix::new() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let output = sabi_command(dir.path())
        .env("SABI_STORE", format!("{}&durability=require", prefix.url))
        .env("SABI_LISTEN", "127.0.0.1:0")
        .args(["serve"])
        .output()
        .expect("sabi runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stderr.contains("append-only file, flushed") {
        return; // this server does keep an append-only file: nothing to refuse
    }
    assert!(!output.status.success(), "refused to start");
    assert!(stderr.contains("refusing to start"), "{stderr}");
}

/// Sabi on a store that goes away: webhooks answer 503 (never 200), readiness fails, the
/// worker pauses and says so, and when the store is back what Meta redelivers is kept and
/// everything is answered, the message acknowledged before the outage included.
async fn store_down_then_back(store: &str, cli_store: &str, mut outage: impl Outage) {
    let dir = tempfile::tempdir().expect("tempdir");
    // A claim the store made just as it went away, whose answer never came back, is taken
    // again once its lease lapses: a short lease keeps that within the test's patience.
    let env = [
        ("SABI_STORE", store),
        ("SABI_BATCH_WINDOW", "0"),
        ("SABI_LEASE", "3s"),
    ];
    let sabi = SabiProcess::spawn(dir.path(), "all", &env);
    let client = reqwest::Client::new();
    let post = |id: &str| {
        let body = text_webhook_at(id, "2348031234567", "hello", now_s());
        webhook_request(&client, &sabi.url(""), body).send()
    };
    assert_eq!(post("wamid.up1").await.expect("sent").status(), 200);

    outage.down();
    let refused = post("wamid.down1").await.expect("sent");
    assert_eq!(refused.status(), 503, "never a 200 for what was not kept");
    assert!(refused.headers().contains_key("retry-after"));
    let ready = client
        .get(sabi.url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 503);
    eventually("the worker to try its store and pause", || async {
        sabi.logs().iter().any(|l| l.contains("claiming failed"))
    })
    .await;

    outage.up();
    // Meta retries; now it is kept, and both messages are answered.
    eventually("the store to come back", || async {
        post("wamid.down1").await.is_ok_and(|r| r.status() == 200)
    })
    .await;
    eventually_seen("both messages answered", ms(30_000), || async {
        let inbox = json_lines(dir.path(), cli_store, &["inbox", "--json"]);
        if inbox.len() == 2 && inbox.iter().all(|i| i["state"] == "answered") {
            Ok(())
        } else {
            Err(format!("{inbox:?}\nlogs:\n{}", sabi.logs().join("\n")))
        }
    })
    .await;
    assert!(
        sabi.logs().iter().any(|l| l.contains("claiming failed")),
        "the worker paused and said so"
    );
}

/// Redis lost its keys (a restart without an append-only file, a flush): a node that started
/// before refuses every call (503s, not ready) rather than fence with ids and tokens that may
/// now name other work; a node started after works on the new, empty store.
#[tokio::test]
async fn a_redis_that_lost_its_keys_is_refused_until_the_node_restarts() {
    use sabi::store::{Health, InboxQuery, Inspection, Turns};
    let Some(prefix) = RedisPrefix::new() else {
        return;
    };
    let before = sabi::store::RedisStore::open(&prefix.url, crate::helpers::marks())
        .await
        .expect("store");
    let server =
        redis::Client::open(prefix.url.split('?').next().expect("server")).expect("client");
    let mut conn = server
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", prefix.tag()))
        .query_async(&mut conn)
        .await
        .expect("keys");
    assert!(!keys.is_empty());
    let () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut conn)
        .await
        .expect("del");

    assert!(matches!(
        before.ready().await,
        Err(sabi::store::Error::Schema(_))
    ));
    assert!(
        before
            .claim(At::default(), ms(1_000), 5, None)
            .await
            .is_err(),
        "no claims"
    );
    let after = sabi::store::RedisStore::open(&prefix.url, crate::helpers::marks())
        .await
        .expect("a restarted node");
    after.ready().await.expect("ready");
    assert!(
        after
            .inbox(InboxQuery::default())
            .await
            .expect("inbox")
            .is_empty()
    );
    assert!(
        before.inbox(InboxQuery::default()).await.is_err(),
        "the node that started before still refuses"
    );
}

/// `rediss://`: the store over TLS, trusting the CA given with `ca=`; a server whose certificate
/// nobody vouches for is refused.
#[tokio::test]
async fn redis_over_tls_trusts_the_given_ca_and_refuses_an_unknown_one() {
    use sabi::store::{Health, InboxQuery, Inspection, RedisStore};
    let Some(server) = RedisServer::start_with(true) else {
        return;
    };
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let trusted = format!("{url}?ca={}&durability=require", server.ca().display());
    let store = RedisStore::open(&trusted, crate::helpers::marks())
        .await
        .expect("over TLS");
    store.ready().await.expect("ready");
    assert!(
        store
            .inbox(InboxQuery::default())
            .await
            .expect("inbox")
            .is_empty()
    );
    let Err(refused) = RedisStore::open(&url, crate::helpers::marks()).await else {
        panic!("a self-signed certificate was trusted without its CA");
    };
    assert!(
        refused.to_string().to_lowercase().contains("certificate"),
        "{refused}"
    );
}
