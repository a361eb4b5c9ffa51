//! Test support: Sabi in-process on a random port, or as a child process that can be killed.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use sabi::app::{App, Role};
use sabi::clock::{At, ManualClock};
use sabi::config::Config;
use sabi::store::{InboxQuery, Store, StoredItem};
use sabi::turn::TurnHandler;
use sabi::worker::Scheduler;
use sabi::worker::holder::Holder;
use tokio_util::sync::CancellationToken;

pub const SECRET: &str = "it-app-secret";
pub const VERIFY_TOKEN: &str = "it-verify-token";

/// The store of the test that owns `dir`: SQLite in `dir`; with `SABI_TEST_STORE=redis://…` a
/// key prefix of the dir's own on that server, with `SABI_TEST_STORE=postgres://…` a database of
/// its own (whole-suite runs on Redis and PostgreSQL).
pub fn store_url(dir: &Path) -> String {
    match std::env::var("SABI_TEST_STORE") {
        Ok(server) if server.starts_with("redis://") => {
            let name = dir
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into());
            format!(
                "{server}?prefix=sabi_it{}",
                name.replace(['{', '}', '.'], "_")
            )
        }
        Ok(server) if server.starts_with("postgres") => postgres_database(&server, dir),
        _ => format!("sqlite://{}", dir.join("sabi.db").display()),
    }
}

/// A database of the dir's own on the PostgreSQL server `server` (a whole-suite run on
/// PostgreSQL), made on first use. `.ci/run` drops them all after the run.
fn postgres_database(server: &str, dir: &Path) -> String {
    use sqlx::{AssertSqlSafe, Connection, PgConnection};
    let name = dir.file_name().map_or_else(String::new, |n| {
        n.to_string_lossy()
            .to_ascii_lowercase()
            .replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    });
    let name = format!("sabi_it{name}");
    let admin = format!("{server}/postgres");
    let create = format!("CREATE DATABASE {name}");
    // Called from sync and async code alike: a thread of its own runs the async client.
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(async {
                let mut conn = PgConnection::connect(&admin)
                    .await
                    .expect("SABI_TEST_STORE's PostgreSQL server is reachable");
                // A second call for the same dir finds the database made by the first.
                let _ = sqlx::query(AssertSqlSafe(create)).execute(&mut conn).await;
            });
    })
    .join()
    .expect("database made");
    // Tests run side by side, some with several nodes: a small pool each stays under the
    // server's connection limit.
    format!("{server}/{name}?max_connections=8")
}

/// The marker secret every test's store is under (`privacy.marker_secret`).
pub const MARKER_SECRET: &str = "marker-secret-for-tests";

/// [`MARKER_SECRET`] as a store takes it.
pub fn marks() -> sabi::store::Marks {
    sabi::store::Marks::new(
        secrecy::SecretString::from(MARKER_SECRET.to_owned()),
        Vec::new(),
    )
}

/// A config for tests: port 0, a store in `dir`, a known app secret and verify token.
pub fn config(dir: &Path, extra: &[(&str, &str)]) -> Config {
    let store = store_url(dir);
    let mut env = vec![
        ("SABI_LISTEN", "127.0.0.1:0"),
        ("SABI_STORE", store.as_str()),
        ("SABI_WHATSAPP_APP_SECRET", SECRET),
        ("SABI_WHATSAPP_VERIFY_TOKEN", VERIFY_TOKEN),
        ("SABI_MARKER_SECRET", MARKER_SECRET),
        // Every test client is 127.0.0.1: the per-address limits have tests of their own.
        ("SABI_WEBCHAT_PER_ADDRESS", "0"),
        ("SABI_WEBCHAT_SESSIONS_PER_ADDRESS", "0"),
        ("SABI_WEBCHAT_HANDOFFS_PER_ADDRESS", "0"),
    ];
    env.extend_from_slice(extra);
    let env = env.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned()));
    // A test that needs a configuration file writes `sabi.toml` into `dir` first.
    let file = dir.join("sabi.toml");
    let file = if file.exists() {
        file
    } else {
        PathBuf::from("/dev/null")
    };
    Config::load(Some(&file), env).expect("test config is valid")
}

/// The manual clock's start: the corpus's era, so provider timestamps look recent.
pub const START_MS: i64 = 1_781_000_000_000;

/// Sabi running inside the test process: HTTP served, turns driven by hand with `scheduler`.
pub struct TestApp {
    pub addr: SocketAddr,
    pub client: reqwest::Client,
    pub store: Arc<dyn Store>,
    pub clock: Arc<ManualClock>,
    pub scheduler: Arc<Scheduler>,
    pub holder: Arc<Holder>,
    /// The help desk's mirror, driven by hand; none without a `[handoff]` desk.
    pub desk: Option<Arc<sabi::desk::Mirror>>,
    pub dir: tempfile::TempDir,
    shutdown: CancellationToken,
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        TestApp::spawn_with(None, &[]).await
    }

    /// A test app with a turn handler of the test's own and more settings.
    pub async fn spawn_with(
        handler: Option<Arc<dyn TurnHandler>>,
        extra: &[(&str, &str)],
    ) -> TestApp {
        TestApp::spawn_in(tempfile::tempdir().expect("tempdir"), handler, extra).await
    }

    /// A test app whose store (and `sabi.toml`, if the test wrote one) is in `dir`.
    pub async fn spawn_in(
        dir: tempfile::TempDir,
        handler: Option<Arc<dyn TurnHandler>>,
        extra: &[(&str, &str)],
    ) -> TestApp {
        let config = config(dir.path(), extra);
        let clock = ManualClock::new(At::from_millis(START_MS));
        let app = App::build_with(&config, Role::Api, clock.clone(), handler)
            .await
            .expect("app builds");
        let addr = app.addr().expect("bound");
        let store = app.store();
        let scheduler = app.scheduler();
        let holder = app.holder();
        let desk = app.desk();
        let shutdown = app.shutdown_token();
        tokio::spawn(app.run_until_stopped());
        TestApp {
            addr,
            client: reqwest::Client::new(),
            store,
            clock,
            scheduler,
            holder,
            desk,
            dir,
            shutdown,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Posts `body` signed with the test secret.
    pub async fn post_whatsapp_webhook(&self, body: impl Into<Vec<u8>>) -> reqwest::Response {
        post_webhook(&self.client, &self.url(""), body).await
    }

    /// Posts `body` with the given signature header (or none).
    pub async fn post_raw_webhook(
        &self,
        body: Vec<u8>,
        signature: Option<&str>,
    ) -> reqwest::Response {
        let mut request = self
            .client
            .post(self.url("/webhook/whatsapp"))
            .header("content-type", "application/json");
        if let Some(signature) = signature {
            request = request.header("x-hub-signature-256", signature);
        }
        request.body(body).send().await.expect("request sent")
    }

    pub async fn inbox(&self) -> Vec<StoredItem> {
        self.store
            .inbox(InboxQuery::default())
            .await
            .expect("inbox")
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The signature Meta would send with `body`, under the test secret.
pub fn signature(body: &[u8]) -> String {
    sabi::testing::webhook::signature(SECRET, body)
}

/// A POST of `body` to the WhatsApp webhook of the Sabi at `base` (`http://host:port`), signed
/// with the test secret as Meta signs it; the caller may add headers before it sends.
pub fn webhook_request(
    client: &reqwest::Client,
    base: &str,
    body: impl Into<Vec<u8>>,
) -> reqwest::RequestBuilder {
    sabi::testing::webhook::signed(client, &format!("{base}/webhook/whatsapp"), SECRET, body)
}

/// `POST /admin/broadcasts` to the Sabi at `base` with the admin `token`: the status and the
/// JSON answer.
pub async fn post_broadcast(
    client: &reqwest::Client,
    base: &str,
    token: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let response = client
        .post(format!("{base}/admin/broadcasts"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("answered");
    let status = response.status().as_u16();
    (status, response.json().await.expect("json"))
}

/// The JSON answer to `GET path` on the test app.
pub async fn get_json(app: &TestApp, path: &str) -> serde_json::Value {
    app.client
        .get(app.url(path))
        .send()
        .await
        .expect("got")
        .json()
        .await
        .expect("json")
}

/// A test app with these `[ingress]` settings (in a `sabi.toml` of its own) and environment.
pub async fn app_with_ingress(ingress: &str, env: &[(&str, &str)]) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("sabi.toml"),
        format!("[ingress]\n{ingress}\n"),
    )
    .expect("sabi.toml");
    TestApp::spawn_in(dir, None, env).await
}

/// Everything the server sends on `stream` until it closes the connection; the test fails if
/// it never does within `patience`.
pub async fn until_closed(
    stream: &mut tokio::net::TcpStream,
    patience: std::time::Duration,
) -> String {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let read = tokio::time::timeout(patience, async {
        let mut buffer = [0u8; 16 * 1024];
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
        "the server kept the connection open: {}",
        String::from_utf8_lossy(&seen)
    );
    String::from_utf8_lossy(&seen).into_owned()
}

/// Posts `body`, signed with the test secret, to the WhatsApp webhook of the Sabi at `base`;
/// the response (the test fails if the request cannot be sent at all).
pub async fn post_webhook(
    client: &reqwest::Client,
    base: &str,
    body: impl Into<Vec<u8>>,
) -> reqwest::Response {
    webhook_request(client, base, body)
        .send()
        .await
        .expect("webhook sent")
}

/// A realistic one-text-message webhook in wire format, sent at the clock's start.
pub fn text_webhook(id: &str, from: &str, text: &str) -> Vec<u8> {
    text_webhook_at(id, from, text, START_MS / 1000)
}

/// [`text_webhook`] with the provider timestamp (Unix seconds) the customer sent it at.
pub fn text_webhook_at(id: &str, from: &str, text: &str, sent_at_s: i64) -> Vec<u8> {
    let sent_at = u64::try_from(sent_at_s).expect("positive timestamp");
    let value = sabi::whatsapp::wire::text_webhook(
        "100000000000001",
        from,
        "Test Customer",
        id,
        sent_at,
        text,
    );
    sabi::whatsapp::wire::encode(&value).into_bytes()
}

/// `sabi serve` as a child process, so tests can kill it for real.
pub struct SabiProcess {
    child: Child,
    pub addr: SocketAddr,
    logs: Arc<std::sync::Mutex<Vec<String>>>,
}

impl SabiProcess {
    /// Starts `sabi serve` on a free port with the store in `dir` and waits until it listens.
    pub fn start(dir: &Path) -> SabiProcess {
        SabiProcess::start_with(dir, &[])
    }

    /// [`SabiProcess::start`] with more environment variables.
    pub fn start_with(dir: &Path, env: &[(&str, &str)]) -> SabiProcess {
        SabiProcess::spawn(dir, "all", env)
    }

    /// `sabi serve --role ROLE`; waits until it listens (all, api) or its scheduler runs (worker).
    pub fn spawn(dir: &Path, role: &str, env: &[(&str, &str)]) -> SabiProcess {
        let mut child = sabi_command(dir)
            .args(["serve", "--role", role])
            .env("SABI_LISTEN", "127.0.0.1:0")
            .env("SABI_LOG", "sabi=debug,info")
            .envs(env.iter().copied())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sabi serve starts");
        let stderr = child.stderr.take().expect("stderr piped");
        let mut lines = BufReader::new(stderr).lines();
        let logs = Arc::new(std::sync::Mutex::new(Vec::new()));
        let addr = loop {
            let line = lines
                .next()
                .expect("sabi serve exited before it was ready")
                .expect("stderr line");
            logs.lock().expect("logs").push(line.clone());
            // Text logs say `addr=...`, JSON logs `"addr":"..."`.
            let addr = line
                .split("addr=")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .or_else(|| {
                    line.split("\"addr\":\"")
                        .nth(1)
                        .and_then(|rest| rest.split('"').next())
                });
            if let Some(addr) = addr.filter(|_| line.contains("sabi listening")) {
                break addr.parse().expect("listen address");
            }
            if role == "worker" && line.contains("scheduler started") {
                break SocketAddr::from(([127, 0, 0, 1], 0));
            }
        };
        // Keep draining stderr so the child never blocks on a full pipe, and keep the lines.
        let kept = logs.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                kept.lock().expect("logs").push(line);
            }
        });
        SabiProcess { child, addr, logs }
    }

    /// Every log line so far.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().expect("logs").clone()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// SIGTERM, and the wait for its clean exit.
    pub fn terminate(mut self) {
        let killed = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(killed.success());
        let started = std::time::Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(15),
                "sabi serve did not stop on SIGTERM"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        assert!(status.success(), "exit status {status}");
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill9(mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reaped");
    }
}

impl Drop for SabiProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `sabi` binary with a test config pointing at the store in `dir`.
pub fn sabi_command(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sabi"));
    command
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("SABI_CONFIG", "/dev/null")
        .env("SABI_STORE", store_url(dir))
        .env("SABI_WHATSAPP_APP_SECRET", SECRET)
        .env("SABI_WHATSAPP_VERIFY_TOKEN", VERIFY_TOKEN)
        .env("SABI_MARKER_SECRET", MARKER_SECRET)
        .env("SABI_WEBCHAT_PER_ADDRESS", "0")
        .env("SABI_WEBCHAT_SESSIONS_PER_ADDRESS", "0")
        .env("SABI_WEBCHAT_HANDOFFS_PER_ADDRESS", "0");
    command
}

/// `sabi inbox --json`, parsed: what an outside test sees.
pub fn inbox_json(dir: &Path) -> Vec<serde_json::Value> {
    json_lines(dir, &["inbox", "--json"])
}

/// A `sabi` command's JSON-lines output, parsed.
pub fn json_lines(dir: &Path, args: &[&str]) -> Vec<serde_json::Value> {
    let output = sabi_command(dir).args(args).output().expect("sabi runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

/// The webhook corpus: `SABI_WEBHOOK_CORPUS`, or the repository's own (`tests/data/webhooks`).
pub fn corpus_dir() -> PathBuf {
    std::env::var_os("SABI_WEBHOOK_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/webhooks"))
}

/// Cargo's target folder (`CARGO_TARGET_DIR`, or `target/` here): where tests keep the tools
/// they install for themselves.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// A Python environment with httpx and schemathesis, made once under `target/` by the tests
/// themselves (`SABI_TEST_PYTHON_ENV` names another). Returns the environment's directory, or
/// `None` (the test skipped) where Python's venv or the package index cannot be had.
pub fn test_python() -> Option<PathBuf> {
    static READY: std::sync::Mutex<Option<bool>> = std::sync::Mutex::new(None);
    let venv = std::env::var_os("SABI_TEST_PYTHON_ENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("test-python"));
    let mut ready = READY.lock().unwrap_or_else(|e| e.into_inner());
    let made = *ready.get_or_insert_with(|| make_python_env(&venv));
    made.then_some(venv)
}

fn make_python_env(venv: &Path) -> bool {
    let succeeds = |command: &mut Command| command.status().is_ok_and(|s| s.success());
    if succeeds(Command::new(venv.join("bin/python")).args(["-c", "import httpx, schemathesis"])) {
        return true;
    }
    if !crate::services::program("python3", "python3") {
        return false;
    }
    if !succeeds(Command::new("python3").args(["-m", "venv"]).arg(venv)) {
        crate::services::skip("a Python venv", "apt-get install python3-venv");
        return false;
    }
    let pip = venv.join("bin/pip");
    if !succeeds(Command::new(pip).args(["install", "--quiet", "httpx", "schemathesis"])) {
        crate::services::skip(
            "httpx and schemathesis",
            "pip could not install them from the package index (offline?)",
        );
        return false;
    }
    true
}

/// Runs `command` off the async threads and returns its standard output; the test fails with
/// both outputs when the command does not succeed.
pub async fn run_to_success(mut command: Command) -> String {
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("joined")
        .expect("the command runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Another writer holding SQLite's write lock on a store file, as a stuck process would: Sabi
/// cannot commit until it is released (or dropped).
pub struct StoreLock {
    release: Option<std::sync::mpsc::Sender<()>>,
    holder: Option<std::thread::JoinHandle<()>>,
}

impl StoreLock {
    /// Takes the lock on `dir`'s store and returns once it is held.
    pub fn take(dir: &Path) -> StoreLock {
        let path = dir.join("sabi.db");
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let conn = rusqlite::Connection::open(path).expect("open");
            conn.execute_batch("BEGIN EXCLUSIVE").expect("lock");
            locked_tx.send(()).expect("signal");
            let _ = release_rx.recv();
            conn.execute_batch("COMMIT").expect("unlock");
        });
        locked_rx.recv().expect("locked");
        StoreLock {
            release: Some(release),
            holder: Some(holder),
        }
    }

    /// Lets go of the lock and waits until it is free.
    pub fn release(mut self) {
        self.free();
    }

    fn free(&mut self) {
        drop(self.release.take());
        if let Some(holder) = self.holder.take() {
            holder.join().expect("lock holder");
        }
    }
}

impl Drop for StoreLock {
    fn drop(&mut self) {
        self.free();
    }
}

/// A span of `millis` milliseconds, for the times tests add to instants.
pub fn ms(millis: u64) -> std::time::Duration {
    std::time::Duration::from_millis(millis)
}

/// How long [`eventually`] waits before it fails the test.
pub const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits until `holds` answers true, asking again and again (every 10 ms at first, every
/// 200 ms at most); after half a minute the test fails, saying it waited for `what`.
pub async fn eventually<F, Fut>(what: &str, mut holds: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually_some(what, PATIENCE, || {
        let holds = holds();
        async move { holds.await.then_some(()) }
    })
    .await;
}

/// Waits until `found` answers `Some` and returns what it found, asking as [`eventually`]
/// does; fails the test, saying it waited for `what`, once `patience` has passed.
pub async fn eventually_some<T, F, Fut>(
    what: &str,
    patience: std::time::Duration,
    mut found: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_seen(what, patience, || {
        let found = found();
        async move { found.await.ok_or_else(|| "not yet".to_owned()) }
    })
    .await
}

/// The one polling loop of the tests: asks `seen` until it answers `Ok` and returns that; an
/// `Err` says what it saw instead, and the last one is in the failure once `patience` has
/// passed. Asks every 10 ms at first, then less often (every 200 ms at most), so that a slow
/// question (a CLI run, a scrape) does not crowd out what it waits for.
pub async fn eventually_seen<T, F, Fut>(what: &str, patience: std::time::Duration, mut seen: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(10);
    loop {
        let instead = match seen().await {
            Ok(found) => return found,
            Err(instead) => instead,
        };
        assert!(
            start.elapsed() < patience,
            "gave up after {patience:?} waiting for {what}; seen: {instead}"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(200));
    }
}
