//! Where a bench's store lives, on each backend: a fresh SQLite file, a fresh database on a
//! PostgreSQL server, or a fresh key prefix on a Redis server (one of the bench's own, its
//! append-only file flushed on every write, unless one is named). Shared by the benches that
//! compare the backends side by side.

use std::sync::Arc;
use std::time::Duration;

use sabi::store::{PgStore, RedisStore, SqliteStore, Store};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

/// The marker secret a bench's store is under.
fn marks() -> sabi::store::Marks {
    sabi::store::Marks::new(
        secrecy::SecretString::from("bench-marker-secret".to_owned()),
        Vec::new(),
    )
}

/// Where the bench's store lives: a fresh SQLite file, or a fresh database on a server.
pub(crate) enum Backend {
    Sqlite,
    Postgres(String),
    /// A server's URL, or none: the bench starts its own.
    Redis(Option<String>),
}

impl Backend {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite => "SQLite (fsync per commit)",
            Backend::Postgres(_) => "PostgreSQL (local server, synchronous_commit on)",
            Backend::Redis(Some(_)) => "Redis (ENGINE_BENCH_REDIS, its own persistence)",
            Backend::Redis(None) => "Redis (own server, appendfsync always)",
        }
    }

    /// A fresh store on this backend, and what keeps it alive until dropped.
    pub(crate) async fn open(&self) -> (Arc<dyn Store>, Place) {
        match self {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("tempdir");
                let store = SqliteStore::open(&dir.path().join("bench.db"), marks())
                    .await
                    .expect("store");
                let place = Place {
                    _dir: Some(dir),
                    database: None,
                    server: None,
                };
                (Arc::new(store), place)
            }
            Backend::Postgres(server) => {
                let mut id = [0u8; 6];
                getrandom::fill(&mut id).expect("random");
                let name = format!("sabi_bench_{}", hex::encode(id));
                let mut admin = PgConnection::connect(&format!("{server}/postgres"))
                    .await
                    .expect("the PostgreSQL server is reachable (ENGINE_BENCH_POSTGRES)");
                sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&mut admin)
                    .await
                    .expect("create database");
                let store = PgStore::open(&format!("{server}/{name}"), marks())
                    .await
                    .expect("store");
                let place = Place {
                    _dir: None,
                    database: Some((server.clone(), name)),
                    server: None,
                };
                (Arc::new(store), place)
            }
            Backend::Redis(Some(url)) => {
                let mut id = [0u8; 6];
                getrandom::fill(&mut id).expect("random");
                let url = format!("{url}?prefix=sabi_bench_{}", hex::encode(id));
                let store = RedisStore::open(&url, marks()).await.expect("redis store");
                let place = Place {
                    _dir: None,
                    database: None,
                    server: None,
                };
                (Arc::new(store), place)
            }
            Backend::Redis(None) => {
                let (child, dir, url) = redis_server().await;
                let store = RedisStore::open(&url, marks()).await.expect("redis store");
                let place = Place {
                    _dir: Some(dir),
                    database: None,
                    server: Some(child),
                };
                (Arc::new(store), place)
            }
        }
    }
}

/// Keeps the bench's store alive (its directory, its Redis server), and drops its database
/// after.
pub(crate) struct Place {
    _dir: Option<tempfile::TempDir>,
    database: Option<(String, String)>,
    server: Option<std::process::Child>,
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(server) = &mut self.server {
            let _ = server.kill();
            let _ = server.wait();
        }
        if let Some((server, name)) = &self.database {
            let (server, name) = (server.clone(), name.clone());
            let _ = std::thread::spawn(move || {
                let runtime = tokio::runtime::Runtime::new().expect("runtime");
                runtime.block_on(async {
                    if let Ok(mut admin) =
                        PgConnection::connect(&format!("{server}/postgres")).await
                    {
                        let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                        let _ = sqlx::query(AssertSqlSafe(sql)).execute(&mut admin).await;
                    }
                });
            })
            .join();
        }
    }
}

/// A Redis server of the bench's own on a free port, keeping an append-only file flushed on
/// every write: acknowledgements as durable as the other backends'.
async fn redis_server() -> (std::process::Child, tempfile::TempDir, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let dir = tempfile::tempdir().expect("tempdir");
    let child = std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "yes", "--appendfsync", "always"])
        .arg("--dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server runs (or set ENGINE_BENCH_REDIS)");
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (child, dir, format!("redis://127.0.0.1:{port}"))
}
