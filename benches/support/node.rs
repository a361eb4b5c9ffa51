//! A release `sabi serve` of a bench's own: on a free port, its SQLite store in a temporary
//! folder, killed when dropped. Shared by the benches that drive the binary as users run it.
//! `SABI_BIN` runs another build instead (a previous one, for a before-and-after in one run).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// The erasure markers' secret every node of a bench is given (a store made with it needs it).
pub(crate) const MARKER_SECRET: &str = "bench-marker-secret-0123456789";

pub(crate) struct Node {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    shown: Arc<Mutex<Vec<String>>>,
}

impl Node {
    /// Starts `sabi serve --role <role>` with `config` as its `sabi.toml`, `secret` as the app
    /// secret, no batch window, and `env` on top; its log lines for which `shown` holds are
    /// echoed to stderr and kept ([`Node::shown`]), the rest are read and dropped (a full pipe
    /// would stall it).
    pub(crate) fn start(
        role: &str,
        config: &str,
        secret: &str,
        env: &[(&str, &str)],
        shown: fn(&str) -> bool,
    ) -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("sabi.toml");
        std::fs::write(&file, config).expect("sabi.toml");
        let mut child = Command::new(binary())
            .args(["serve", "--role", role])
            .current_dir(dir.path())
            .env("SABI_CONFIG", &file)
            .env("SABI_LISTEN", "127.0.0.1:0")
            .env(
                "SABI_STORE",
                format!("sqlite://{}", dir.path().join("sabi.db").display()),
            )
            .env("SABI_WHATSAPP_APP_SECRET", secret)
            .env("SABI_MARKER_SECRET", MARKER_SECRET)
            .env("SABI_BATCH_WINDOW", "0")
            .envs(env.iter().copied())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sabi serve starts");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let addr = loop {
            let line = lines.next().expect("sabi exited").expect("line");
            if let Some(addr) = line
                .split("addr=")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .filter(|_| line.contains("sabi listening"))
            {
                break addr.parse().expect("address");
            }
        };
        let kept = Arc::new(Mutex::new(Vec::new()));
        let keep = kept.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if shown(&line) {
                    eprintln!("    sabi: {line}");
                    keep.lock().unwrap_or_else(|p| p.into_inner()).push(line);
                }
            }
        });
        Node {
            child,
            addr,
            dir,
            shown: kept,
        }
    }

    /// The log lines shown so far, in order.
    pub(crate) fn shown(&self) -> Vec<String> {
        self.shown.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The process, for reading its memory and CPU under /proc.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its store, for `sabi inbox` and the like.
    pub(crate) fn store_url(&self) -> String {
        format!("sqlite://{}", self.dir.path().join("sabi.db").display())
    }
}

/// The `sabi` to run: `SABI_BIN` (a previous build, to compare in one run) or this build's.
pub(crate) fn binary() -> String {
    std::env::var("SABI_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_sabi").to_owned())
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
