//! The programs outside Sabi that some tests need, found or started by the tests themselves.
//!
//! PostgreSQL and Redis: the server named by `SABI_TEST_POSTGRES` / `SABI_TEST_REDIS` (default:
//! the local one on its standard port) when it answers; otherwise a throwaway server started
//! from the installed binaries in a temporary folder on a free port, stopped and removed when
//! the test process ends. What cannot be had (no server, no binaries; no `openssl`, `node`, a
//! browser) is skipped, and one line on standard error says what was skipped and how to get it.
//! `SABI_TEST_REQUIRE_ALL=1` (set by `.ci/run`) turns every skip into a failure, so CI always
//! runs everything.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};

/// Skips the calling test when `what` cannot be had: one line per kind of skip, naming it and
/// how to get it, written past the test harness's capture so that it shows in every run. Under
/// `SABI_TEST_REQUIRE_ALL` the test fails instead.
pub fn skip(what: &str, how: &str) {
    if std::env::var_os("SABI_TEST_REQUIRE_ALL").is_some_and(|v| v != "0") {
        panic!("{what} is required (SABI_TEST_REQUIRE_ALL): {how}");
    }
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if said
        .get_or_insert_with(HashSet::new)
        .insert(what.to_owned())
    {
        // Not `eprintln!`: the harness captures that for tests that pass.
        let line = format!("\nSKIPPED: the tests that need {what}: {how}\n");
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

/// Whether `program` is installed (on `PATH`); when it is not, the test is skipped with a line
/// naming the Debian package that brings it.
pub fn program(program: &str, package: &str) -> bool {
    if on_path(program).is_some() {
        return true;
    }
    skip(
        &format!("`{program}`"),
        &format!("it is not installed (apt-get install {package})"),
    );
    false
}

fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// The PostgreSQL server for tests (a URL without a database), or `None` after the skip line.
pub fn postgres() -> Option<&'static str> {
    static SERVER: OnceLock<Option<String>> = OnceLock::new();
    let server = SERVER.get_or_init(|| {
        let named = std::env::var("SABI_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432".to_owned());
        if pg_answers(&format!("{named}/postgres")) {
            return Some(named);
        }
        match PgCluster::start(&PgOptions::default()) {
            Ok(cluster) => Some(cluster.keep()),
            Err(why) => {
                let how = format!(
                    "no server answers at {named} (SABI_TEST_POSTGRES) and {why} \
                     (apt-get install postgresql)"
                );
                skip("PostgreSQL", &how);
                None
            }
        }
    });
    server.as_deref()
}

/// The Redis server for tests, or `None` after the skip line.
pub fn redis() -> Option<&'static str> {
    static SERVER: OnceLock<Option<String>> = OnceLock::new();
    let server = SERVER.get_or_init(|| {
        let named = std::env::var("SABI_TEST_REDIS")
            .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
        if redis_answers(&named) {
            return Some(named);
        }
        match start_redis() {
            Ok(url) => Some(url),
            Err(why) => {
                let how = format!(
                    "no server answers at {named} (SABI_TEST_REDIS) and {why} \
                     (apt-get install redis-server)"
                );
                skip("Redis", &how);
                None
            }
        }
    });
    server.as_deref()
}

/// Runs `check` on a thread with a runtime of its own: the callers may be inside a runtime
/// already, where blocking on another is not allowed.
fn block_on_own_runtime<T: Send + 'static>(
    check: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(check)
    })
    .join()
    .expect("probe thread")
}

fn pg_answers(url: &str) -> bool {
    let url = url.to_owned();
    block_on_own_runtime(async move {
        let connect = PgConnection::connect(&url);
        matches!(
            tokio::time::timeout(Duration::from_secs(3), connect).await,
            Ok(Ok(_))
        )
    })
}

fn redis_answers(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    client
        .get_connection_with_timeout(Duration::from_secs(2))
        .and_then(|mut conn| redis::cmd("PING").query::<String>(&mut conn))
        .is_ok()
}

/// A free port on the loopback interface (free when asked; the server binds it a moment later).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A server under a guardian shell that stops it with SIGINT (a fast, clean shutdown for
/// PostgreSQL and Redis alike) and removes its folder once the guardian's input closes: when
/// this is dropped (which waits for both), or when the test process ends, however it ends. The
/// guardian has a process group of its own, so a Ctrl-C meant for the tests does not skip the
/// cleanup.
pub struct Guarded {
    input: Option<ChildStdin>,
    guardian: Child,
}

impl Guarded {
    /// Leaves the server running until the test process ends.
    pub fn keep(self) {
        Box::leak(Box::new(self));
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        drop(self.input.take());
        let _ = self.guardian.wait();
    }
}

/// Starts `command` under a guardian (see [`Guarded`]) that removes `dir` after it.
pub fn guarded(command: &Command, dir: &Path) -> Guarded {
    const GUARDIAN: &str = r#"dir=$1; shift
"$@" </dev/null >>"$dir/server.log" 2>&1 &
pid=$!
read -r _ || true
kill -INT "$pid" 2>/dev/null
wait "$pid"
rm -rf "$dir""#;
    let mut guardian = Command::new("sh");
    guardian
        .arg("-c")
        .arg(GUARDIAN)
        .arg("guardian")
        .arg(dir)
        .arg(command.get_program())
        .args(command.get_args())
        .envs(
            command
                .get_envs()
                .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v.to_owned()))),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut guardian, 0);
    let mut guardian = guardian.spawn().expect("sh runs");
    Guarded {
        input: guardian.stdin.take(),
        guardian,
    }
}

/// Waits until `ready` holds, or fails the test after `patience`, naming `what` and the log.
pub fn wait_until(what: &str, log: &Path, patience: Duration, ready: impl Fn() -> bool) {
    let start = Instant::now();
    while !ready() {
        if start.elapsed() > patience {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("{what} did not start within {patience:?}:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A throwaway `redis-server` keeping nothing on disk, as CI runs its own.
fn start_redis() -> Result<String, String> {
    let binary = on_path("redis-server").ok_or("redis-server is not installed")?;
    let dir = tempfile::tempdir()
        .map_err(|e| format!("no temporary folder: {e}"))?
        .keep();
    let port = free_port();
    let mut command = Command::new(binary);
    command
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&dir);
    let guard = guarded(&command, &dir);
    let url = format!("redis://127.0.0.1:{port}");
    wait_until(
        "redis-server",
        &dir.join("server.log"),
        Duration::from_secs(20),
        || redis_answers(&url),
    );
    guard.keep();
    Ok(url)
}

/// How a throwaway PostgreSQL cluster is set up beyond the defaults.
#[derive(Default)]
pub struct PgOptions {
    /// Server settings, `-c name=value` each.
    pub settings: Vec<(String, String)>,
    /// Replaces `pg_hba.conf` (trust for local and loopback connections by default).
    pub hba: Option<String>,
    /// Files copied into the data folder before start (certificates, keys).
    pub files: Vec<(String, PathBuf)>,
}

/// A PostgreSQL cluster of the tests' own: `initdb` into a temporary folder, the server on a
/// free port, run as an unprivileged user when the tests run as root (PostgreSQL refuses
/// root). Stopped and removed when dropped (or, once kept, when the test process ends): its
/// guardian does that.
pub struct PgCluster {
    pub port: u16,
    pub dir: PathBuf,
    guard: Option<Guarded>,
}

impl PgCluster {
    /// A new cluster (`initdb`).
    ///
    /// # Errors
    /// Why no cluster could be made: the binaries are missing, or `initdb` failed.
    pub fn start(options: &PgOptions) -> Result<PgCluster, String> {
        let initdb = pg_binary("initdb").ok_or("initdb is not installed")?;
        PgCluster::make(options, |user, data| {
            let mut init = user.command(&initdb);
            init.arg("-D")
                .arg(data)
                .args(["-U", "sabi", "--auth=trust", "-E", "UTF8", "--locale=C"])
                .args(["--no-sync", "--no-instructions"]);
            init
        })
    }

    /// A streaming-replication standby of `primary` (`pg_basebackup -R`): read-only until
    /// promoted.
    ///
    /// # Errors
    /// As [`PgCluster::start`], or `pg_basebackup` failed.
    pub fn standby_of(primary: &PgCluster, options: &PgOptions) -> Result<PgCluster, String> {
        let basebackup = pg_binary("pg_basebackup").ok_or("pg_basebackup is not installed")?;
        PgCluster::make(options, |user, data| {
            let mut copy = user.command(&basebackup);
            copy.arg("-D")
                .arg(data)
                .args([
                    "-R",
                    "-X",
                    "stream",
                    "--checkpoint=fast",
                    "-U",
                    "sabi",
                    "-p",
                ])
                .arg(primary.port.to_string())
                .arg("-h")
                .arg(&primary.dir);
            copy
        })
    }

    /// A data folder made by `make_data`, the options applied, and the server started on it.
    fn make(
        options: &PgOptions,
        make_data: impl FnOnce(&Unprivileged, &Path) -> Command,
    ) -> Result<PgCluster, String> {
        let postgres = pg_binary("postgres").ok_or("postgres is not installed")?;
        let dir = tempfile::tempdir()
            .map_err(|e| format!("no temporary folder: {e}"))?
            .keep();
        let user = Unprivileged::when_root(&dir)?;
        let data = dir.join("data");
        let made = make_data(&user, &data)
            .output()
            .map_err(|e| format!("making the data folder: {e}"))?;
        if !made.status.success() {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(format!(
                "making the data folder failed: {}",
                String::from_utf8_lossy(&made.stderr)
            ));
        }
        for (name, source) in &options.files {
            let target = data.join(name);
            std::fs::copy(source, &target).map_err(|e| format!("copying {name}: {e}"))?;
            user.own(&target, 0o600)?;
        }
        if let Some(hba) = &options.hba {
            std::fs::write(data.join("pg_hba.conf"), hba).map_err(|e| e.to_string())?;
            user.own(&data.join("pg_hba.conf"), 0o600)?;
        }
        let port = free_port();
        let mut server = user.command(&postgres);
        server
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.display()))
            .args(["-c", "fsync=off", "-c", "max_connections=300"]);
        for (name, value) in &options.settings {
            server.arg("-c").arg(format!("{name}={value}"));
        }
        let guard = guarded(&server, &dir);
        let cluster = PgCluster {
            port,
            dir,
            guard: Some(guard),
        };
        // Ready once it says so (a standby says it accepts read-only connections).
        let log = cluster.dir.join("server.log");
        wait_until("PostgreSQL", &log, Duration::from_secs(60), || {
            std::fs::read_to_string(&log).is_ok_and(|l| l.contains("ready to accept"))
        });
        Ok(cluster)
    }

    /// The superuser's URL over TCP (no database).
    pub fn url(&self) -> String {
        format!("postgres://sabi@127.0.0.1:{}", self.port)
    }

    /// The superuser's URL over the cluster's Unix socket (no TLS, whatever the TCP rules).
    pub fn socket_url(&self, database: &str) -> String {
        format!(
            "postgres://sabi@localhost/{database}?host={}&port={}",
            self.dir.display(),
            self.port
        )
    }

    /// Keeps the cluster until the test process ends; returns its URL.
    fn keep(mut self) -> String {
        let url = self.url();
        if let Some(guard) = self.guard.take() {
            guard.keep();
        }
        url
    }
}

/// [`PgCluster::start`], or `None` after the skip line where PostgreSQL's programs are missing.
pub fn pg_cluster(options: &PgOptions) -> Option<PgCluster> {
    match PgCluster::start(options) {
        Ok(cluster) => Some(cluster),
        Err(why) => {
            skip(
                "a PostgreSQL cluster of their own",
                &format!("{why} (apt-get install postgresql)"),
            );
            None
        }
    }
}

/// A TCP proxy the test controls: it forwards to a target that can be switched (a DNS name
/// moving to a new primary) and can be cut (every connection dropped and new ones refused, as
/// if the server had died).
pub struct Cable {
    pub port: u16,
    up: Arc<AtomicBool>,
    target: Arc<Mutex<String>>,
    cut: Arc<tokio::sync::Notify>,
}

impl Cable {
    pub async fn to(target: String) -> Cable {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let up = Arc::new(AtomicBool::new(true));
        let target = Arc::new(Mutex::new(target));
        let cut = Arc::new(tokio::sync::Notify::new());
        let (state, to, cutter) = (up.clone(), target.clone(), cut.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !state.load(Ordering::SeqCst) {
                    continue; // dropped: refused
                }
                let target = to.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let cutter = cutter.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        () = cutter.notified() => {}
                    }
                });
            }
        });
        Cable {
            port,
            up,
            target,
            cut,
        }
    }

    /// New connections go to `target`; the open ones stay where they are.
    pub fn switch(&self, target: String) {
        *self.target.lock().unwrap_or_else(|e| e.into_inner()) = target;
    }

    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.cut.notify_waiters();
    }

    pub fn mend(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

/// PgBouncer in front of `server` (a `postgres://user@host:port` URL), in `mode` (`session` or
/// `transaction`), on a free port; `None` after the skip line where it is not installed.
pub struct Pooler {
    pub port: u16,
    _guard: Guarded,
}

impl Pooler {
    pub fn start(server: &str, mode: &str) -> Option<Pooler> {
        let binary = on_path("pgbouncer")
            .or_else(|| Some(PathBuf::from("/usr/sbin/pgbouncer")).filter(|p| p.is_file()));
        let Some(binary) = binary else {
            skip(
                "PgBouncer",
                "it is not installed (apt-get install pgbouncer)",
            );
            return None;
        };
        let target = url::Url::parse(server).expect("server URL");
        let dir = tempfile::tempdir().expect("tempdir").keep();
        let user = Unprivileged::when_root(&dir).expect("a user for pgbouncer");
        let port = free_port();
        let ini = format!(
            "[databases]\n* = host={} port={}\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
             listen_port = {port}\nunix_socket_dir =\nauth_type = trust\n\
             auth_file = {dir}/users.txt\npool_mode = {mode}\n",
            target.host_str().expect("host"),
            target.port().unwrap_or(5432),
            dir = dir.display(),
        );
        for (name, text) in [
            ("pgbouncer.ini", ini),
            ("users.txt", format!("\"{}\" \"\"\n", target.username())),
        ] {
            std::fs::write(dir.join(name), text).expect("pgbouncer files");
            user.own(&dir.join(name), 0o600).expect("owned");
        }
        let mut command = user.command(&binary);
        command.arg(dir.join("pgbouncer.ini"));
        let guard = guarded(&command, &dir);
        wait_until(
            "pgbouncer",
            &dir.join("server.log"),
            Duration::from_secs(20),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        Some(Pooler {
            port,
            _guard: guard,
        })
    }
}

/// `initdb`, `postgres`: on `PATH`, or in the newest of Debian's `/usr/lib/postgresql/*/bin`.
fn pg_binary(name: &str) -> Option<PathBuf> {
    on_path(name).or_else(|| {
        let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path().join("bin").join(name))
            .filter(|p| p.is_file())
            .collect();
        versions.sort_by_key(|p| {
            let version = p.components().nth(4).map(|c| c.as_os_str().to_owned());
            version
                .and_then(|v| v.to_str().and_then(|v| v.parse::<u32>().ok()))
                .unwrap_or(0)
        });
        versions.pop()
    })
}

/// The user a server runs as: the tests' own, or, when they run as root, `postgres` (or
/// `nobody`), with the folder handed over to it.
struct Unprivileged {
    ids: Option<(u32, u32)>,
}

impl Unprivileged {
    fn when_root(dir: &Path) -> Result<Unprivileged, String> {
        if id(&["-u"]).as_deref() != Some("0") {
            return Ok(Unprivileged { ids: None });
        }
        let user = if id(&["-u", "postgres"]).is_some() {
            "postgres"
        } else {
            "nobody"
        };
        let parse = |flag: &str| {
            id(&[flag, user])
                .and_then(|v| v.parse::<u32>().ok())
                .ok_or(format!("no id for user {user}"))
        };
        let unprivileged = Unprivileged {
            ids: Some((parse("-u")?, parse("-g")?)),
        };
        unprivileged.own(dir, 0o700)?;
        Ok(unprivileged)
    }

    fn own(&self, path: &Path, mode: u32) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("chmod {}: {e}", path.display()))?;
        if let Some((uid, gid)) = self.ids {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", path.display()))?;
        }
        Ok(())
    }

    /// `program`, run as this user (`setpriv` execs it, so the pid is the program's own).
    fn command(&self, program: &Path) -> Command {
        match self.ids {
            None => Command::new(program),
            Some((uid, gid)) => {
                let mut command = Command::new("setpriv");
                command
                    .arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .arg("--clear-groups")
                    .arg("--")
                    .arg(program);
                command
            }
        }
    }
}

fn id(args: &[&str]) -> Option<String> {
    let output = Command::new("id").args(args).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
