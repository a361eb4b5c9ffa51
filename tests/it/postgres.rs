//! PostgreSQL as it runs in production, against clusters the tests start themselves: a server
//! that accepts only TLS (a CA and certificates made by the test), a client certificate, a
//! failover to a promoted standby while the old primary stays up read-only, and a lock held
//! past the store's lock timeout; and the intake's server-side functions (functions.sql) on a
//! store that grew under them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sabi::store::{Health, PgStore};
use serde_json::Value;
use sqlx::{AssertSqlSafe, Connection, PgConnection};

use crate::conformance::PgDatabase;
use crate::helpers::{
    SabiProcess, eventually, eventually_seen, eventually_some, ms, post_webhook, sabi_command,
    text_webhook_at, webhook_request,
};
use crate::nodes::{json_lines, now_s};
use crate::services::{self, Cable, PgCluster, PgOptions};

/// Makes a CA (`ca.pem`), another that vouches for nothing here (`other-ca.pem`), the server's
/// certificate for the name `localhost` only (`server.pem`, `server.key`), and a client
/// certificate for the role `clientuser` (`client.pem`, `client.key`).
const PKI_SCRIPT: &str = "set -e
for ca in ca other-ca; do
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -keyout $ca.key -out $ca.pem \\
    -subj /CN=sabi-test-$ca -addext basicConstraints=critical,CA:TRUE \\
    -addext keyUsage=critical,keyCertSign
done
openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost
printf 'subjectAltName=DNS:localhost\\nbasicConstraints=CA:FALSE\\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \\
  -extfile server.ext -out server.pem
openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=clientuser
printf 'basicConstraints=CA:FALSE\\n' > client.ext
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \\
  -extfile client.ext -out client.pem
";

/// Only TLS over TCP (a client certificate for `clientuser`); the socket stays open to the
/// test's own administration.
const TLS_ONLY_HBA: &str = "local all all trust
hostssl all clientuser 127.0.0.1/32 cert
hostssl all clientuser ::1/128 cert
hostssl all all 127.0.0.1/32 trust
hostssl all all ::1/128 trust
";

struct TlsServer {
    cluster: PgCluster,
    pki: tempfile::TempDir,
}

impl TlsServer {
    /// `None` (the test skipped) where openssl or PostgreSQL's programs are missing.
    fn start() -> Option<TlsServer> {
        if !services::program("openssl", "openssl") {
            return None;
        }
        let pki = tempfile::tempdir().expect("tempdir");
        let made = std::process::Command::new("sh")
            .args(["-c", PKI_SCRIPT])
            .current_dir(pki.path())
            .output()
            .expect("openssl runs");
        assert!(made.status.success(), "openssl: {made:?}");
        let file = |name: &str| pki.path().join(name);
        let options = PgOptions {
            settings: [
                ("ssl", "on"),
                ("ssl_cert_file", "server.pem"),
                ("ssl_key_file", "server.key"),
                ("ssl_ca_file", "ca.pem"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .to_vec(),
            hba: Some(TLS_ONLY_HBA.to_owned()),
            files: ["server.pem", "server.key", "ca.pem"]
                .map(|name| (name.to_owned(), file(name)))
                .to_vec(),
        };
        let cluster = services::pg_cluster(&options)?;
        Some(TlsServer { cluster, pki })
    }

    fn file(&self, name: &str) -> PathBuf {
        self.pki.path().join(name)
    }

    /// `postgres://USER@HOST:PORT/DATABASE?QUERY`.
    fn url(&self, user: &str, host: &str, database: &str, query: &str) -> String {
        format!(
            "postgres://{user}@{host}:{}/{database}?{query}",
            self.cluster.port
        )
    }

    /// A connection over the Unix socket, for the test's own administration.
    async fn admin(&self) -> PgConnection {
        PgConnection::connect(&self.cluster.socket_url("postgres"))
            .await
            .expect("admin over the socket")
    }
}

async fn execute(conn: &mut PgConnection, sql: &'static str) {
    sqlx::raw_sql(sql).execute(conn).await.expect(sql);
}

/// The error of a store that did not open.
async fn refusal(url: &str) -> String {
    match PgStore::open(url, crate::helpers::marks()).await {
        Ok(_) => panic!("{url} was accepted"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_reaches_a_tls_only_server_in_every_command() {
    let Some(server) = TlsServer::start() else {
        return;
    };
    let mut admin = server.admin().await;
    execute(&mut admin, "CREATE DATABASE sabi").await;
    let ca = server.file("ca.pem");
    let url = server.url(
        "sabi",
        "localhost",
        "sabi",
        &format!("sslmode=verify-full&sslrootcert={}", ca.display()),
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let check = sabi_command(dir.path())
        .env("SABI_STORE", &url)
        .arg("check")
        .output()
        .expect("sabi check");
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(
        said.contains("over TLSv1.3") && said.contains("sslmode=verify-full"),
        "{said}"
    );
    assert!(said.contains("`sabi serve` creates it"), "{said}");

    let sabi = SabiProcess::spawn(dir.path(), "all", &[("SABI_STORE", &url)]);
    let body = text_webhook_at("wamid.tls1", "2348031234567", "hello", now_s());
    let acknowledged = post_webhook(&reqwest::Client::new(), &sabi.url(""), body).await;
    assert_eq!(acknowledged.status(), 200);
    let tls: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
         WHERE a.application_name = 'sabi' AND s.ssl AND s.version = 'TLSv1.3'",
    )
    .fetch_one(&mut admin)
    .await
    .expect("pg_stat_ssl");
    assert!(tls >= 1, "the server sees Sabi's connections over TLS");
    let plain: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
         WHERE a.application_name = 'sabi' AND NOT s.ssl",
    )
    .fetch_one(&mut admin)
    .await
    .expect("pg_stat_ssl");
    assert_eq!(plain, 0);
    let inbox = json_lines(dir.path(), &url, &["inbox", "--json"]);
    assert_eq!(inbox.len(), 1, "the CLI reads the same store over TLS");
    drop(sabi);

    // A client certificate where the server asks for one: with it in, without it out.
    execute(&mut admin, "CREATE ROLE clientuser LOGIN").await;
    execute(&mut admin, "CREATE DATABASE client OWNER clientuser").await;
    let with_cert = format!(
        "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        ca.display(),
        server.file("client.pem").display(),
        server.file("client.key").display()
    );
    let store = PgStore::open(
        &server.url("clientuser", "localhost", "client", &with_cert),
        crate::helpers::marks(),
    )
    .await
    .expect("a client certificate is accepted");
    store.ready().await.expect("ready");
    let without = format!("sslmode=verify-full&sslrootcert={}", ca.display());
    let refused = refusal(&server.url("clientuser", "localhost", "client", &without)).await;
    assert!(refused.contains("sslcert="), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_host_name_or_plain_connection_is_refused_with_what_to_fix() {
    let Some(server) = TlsServer::start() else {
        return;
    };
    execute(&mut server.admin().await, "CREATE DATABASE sabi").await;
    let ca = server.file("ca.pem").display().to_string();
    let other = server.file("other-ca.pem").display().to_string();

    let unknown = refusal(&server.url(
        "sabi",
        "localhost",
        "sabi",
        &format!("sslmode=verify-full&sslrootcert={other}"),
    ))
    .await;
    assert!(unknown.contains("sslrootcert="), "{unknown}");
    // `require` encrypts without checking the certificate, as libpq does.
    let url = server.url("sabi", "localhost", "sabi", "sslmode=require");
    PgStore::open(&url, crate::helpers::marks())
        .await
        .expect("require");

    let by_address = format!("sslmode=verify-full&sslrootcert={ca}");
    let wrong_name = refusal(&server.url("sabi", "127.0.0.1", "sabi", &by_address)).await;
    assert!(wrong_name.contains("verify-ca"), "{wrong_name}");
    let ca_only = format!("sslmode=verify-ca&sslrootcert={ca}");
    PgStore::open(
        &server.url("sabi", "127.0.0.1", "sabi", &ca_only),
        crate::helpers::marks(),
    )
    .await
    .expect("verify-ca checks the CA, not the name");

    let plain = refusal(&server.url("sabi", "localhost", "sabi", "sslmode=disable")).await;
    assert!(plain.contains("only TLS"), "{plain}");

    let dir = tempfile::tempdir().expect("tempdir");
    let check = sabi_command(dir.path())
        .env(
            "SABI_STORE",
            server.url(
                "sabi",
                "localhost",
                "sabi",
                &format!("sslmode=verify-full&sslrootcert={other}"),
            ),
        )
        .arg("check")
        .output()
        .expect("sabi check");
    assert!(!check.status.success());
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(said.contains("sslrootcert="), "{said}");
}

/// A primary with a synchronous standby (nothing acknowledged exists only on the primary),
/// reached through a proxy that plays the part of the database's DNS name.
struct Replicated {
    primary: PgCluster,
    standby: PgCluster,
    cable: Cable,
}

impl Replicated {
    async fn start() -> Option<Replicated> {
        let primary = services::pg_cluster(&PgOptions::default())?;
        let mut admin = PgConnection::connect(&primary.socket_url("postgres"))
            .await
            .expect("admin");
        execute(&mut admin, "CREATE DATABASE sabi").await;
        let standby = match PgCluster::standby_of(&primary, &PgOptions::default()) {
            Ok(standby) => standby,
            Err(why) => panic!("a standby: {why}"),
        };
        eventually("a streaming standby", || async {
            let mut admin = PgConnection::connect(&primary.socket_url("postgres"))
                .await
                .expect("admin");
            let streaming: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
            )
            .fetch_one(&mut admin)
            .await
            .expect("pg_stat_replication");
            streaming == 1
        })
        .await;
        execute(
            &mut admin,
            "ALTER SYSTEM SET synchronous_standby_names = '*'",
        )
        .await;
        execute(&mut admin, "SELECT pg_reload_conf()").await;
        let cable = Cable::to(format!("127.0.0.1:{}", primary.port)).await;
        Some(Replicated {
            primary,
            standby,
            cable,
        })
    }

    /// The store's URL through the proxy.
    fn url(&self) -> String {
        format!("postgres://sabi@127.0.0.1:{}/sabi", self.cable.port)
    }

    /// The old primary stays up and turns read-only; once `met` says a writer was refused
    /// there (or after ten seconds), the standby is promoted and the name moves to it.
    /// Connections already open stay with the old primary.
    async fn fail_over(&self, met: impl Fn() -> bool) {
        let mut old = PgConnection::connect(&self.primary.socket_url("postgres"))
            .await
            .expect("old primary");
        execute(
            &mut old,
            "ALTER SYSTEM SET default_transaction_read_only = on",
        )
        .await;
        execute(&mut old, "SELECT pg_reload_conf()").await;
        let read_only = Instant::now();
        while !met() && read_only.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut new = PgConnection::connect(&self.standby.socket_url("postgres"))
            .await
            .expect("standby");
        execute(&mut new, "SELECT pg_promote(true, 60)").await;
        self.cable
            .switch(format!("127.0.0.1:{}", self.standby.port));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_loses_nothing_sends_nothing_twice_and_reviews_nothing() {
    let Some(db) = Replicated::start().await else {
        return;
    };
    let url = db.url();
    let dir = tempfile::tempdir().expect("tempdir");
    let env = [
        ("SABI_STORE", url.as_str()),
        ("SABI_BATCH_WINDOW", "200ms"),
        ("SABI_BATCH_MAX_WAIT", "1s"),
        ("SABI_LEASE", "4s"),
    ];
    let sabi = Arc::new(SabiProcess::spawn(dir.path(), "all", &env));
    let client = reqwest::Client::new();
    let stop = Arc::new(AtomicBool::new(false));
    let (acknowledged, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut senders = tokio::task::JoinSet::new();
    for c in 0..4 {
        let (client, sabi, stop) = (client.clone(), sabi.clone(), stop.clone());
        let (acknowledged, refused) = (acknowledged.clone(), refused.clone());
        senders.spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let id = format!("wamid.f{c}-{n}");
                let body = text_webhook_at(&id, &format!("2348{c:04}{:05}", n / 3), "hi", now_s());
                // Meta's way: the same delivery again until it is acknowledged.
                loop {
                    let sent = webhook_request(&client, &sabi.url(""), body.clone())
                        .timeout(Duration::from_secs(30))
                        .send()
                        .await
                        .expect("an answer, never a hang");
                    if sent.status() == 200 {
                        acknowledged.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    assert_eq!(sent.status(), 503, "only ever 200 or 503");
                    refused.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                n += 1;
            }
        });
    }
    // Traffic flows before the failover, and goes on flowing after it.
    let acknowledged_more = |than: usize| {
        let acknowledged = acknowledged.clone();
        move || {
            let now = acknowledged.load(Ordering::Relaxed);
            let more = now >= than + 20;
            async move { more.then_some(now) }
        }
    };
    let before = eventually_some("webhooks acknowledged", ms(30_000), acknowledged_more(0)).await;
    db.fail_over(|| refused.load(Ordering::Relaxed) > 0).await;
    let back = eventually_seen("service back on the new primary", ms(30_000), || async {
        let now = acknowledged.load(Ordering::Relaxed);
        if now >= before + 20 {
            Ok(now)
        } else {
            Err(sabi.logs().join("\n"))
        }
    })
    .await;
    eventually_some(
        "more webhooks acknowledged",
        ms(30_000),
        acknowledged_more(back),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    while let Some(done) = senders.join_next().await {
        done.expect("sender");
    }
    assert!(
        refused.load(Ordering::Relaxed) > 0,
        "the read-only primary was met"
    );

    // On the new primary: everything acknowledged, once, answered once; nothing in review.
    let total = acknowledged.load(Ordering::Relaxed);
    let inbox = eventually_seen("every message answered", ms(60_000), || async {
        let inbox = json_lines(dir.path(), &url, &["inbox", "--json"]);
        let unanswered = inbox.iter().filter(|i| i["state"] != "answered").count();
        if unanswered == 0 && inbox.len() >= total {
            Ok(inbox)
        } else {
            Err(format!(
                "{} of {total} stored, {unanswered} unanswered",
                inbox.len()
            ))
        }
    })
    .await;
    assert_eq!(inbox.len(), total, "every acknowledged message, once");
    let unanswered: Vec<&Value> = inbox.iter().filter(|i| i["state"] != "answered").collect();
    let logs = sabi.logs();
    assert!(
        unanswered.is_empty(),
        "{} unanswered, the first {:?}; the last logs:\n{}",
        unanswered.len(),
        unanswered.first(),
        logs[logs.len().saturating_sub(60)..].join("\n")
    );
    let outbox = json_lines(dir.path(), &url, &["outbox", "--json"]);
    let mut per_batch: HashMap<i64, usize> = HashMap::new();
    for reply in &outbox {
        *per_batch
            .entry(reply["batch"].as_i64().expect("batch"))
            .or_default() += 1;
    }
    assert!(
        per_batch.values().all(|n| *n == 1),
        "no batch answered twice"
    );
    let review = json_lines(dir.path(), &url, &["review", "ls", "--json"]);
    assert!(review.is_empty(), "nothing went to review: {review:?}");
    assert!(
        sabi.logs().iter().any(|l| l.contains("answered read-only")),
        "the failover was seen for what it is"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_past_the_lock_timeout_answers_503_in_time() {
    let Some(cluster) = services::pg_cluster(&PgOptions::default()) else {
        return;
    };
    let mut admin = PgConnection::connect(&cluster.socket_url("postgres"))
        .await
        .expect("admin");
    execute(&mut admin, "CREATE DATABASE sabi").await;
    let url = format!("{}/sabi?lock_timeout=1s", cluster.url());
    let dir = tempfile::tempdir().expect("tempdir");
    let sabi = SabiProcess::spawn(dir.path(), "api", &[("SABI_STORE", &url)]);
    // A stuck session holds the inbox.
    let mut stuck = PgConnection::connect(&cluster.socket_url("sabi"))
        .await
        .expect("a session");
    execute(
        &mut stuck,
        "BEGIN; LOCK TABLE inbox IN ACCESS EXCLUSIVE MODE",
    )
    .await;
    let body = text_webhook_at("wamid.l1", "2348031234567", "hello", now_s());
    let answer = webhook_request(&reqwest::Client::new(), &sabi.url(""), body.clone())
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .expect("an answer before Meta gives up");
    assert_eq!(answer.status(), 503);
    execute(&mut stuck, "ROLLBACK").await;
    let answer = post_webhook(&reqwest::Client::new(), &sabi.url(""), body).await;
    assert_eq!(answer.status(), 200, "kept once the lock is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_pgbouncer_the_timeouts_move_to_the_role_and_everything_works() {
    let Some(db) = PgDatabase::create().await else {
        return;
    };
    let (server, name) = db.url.rsplit_once('/').expect("server/database");
    let Some(pooler) = services::Pooler::start(server, "session") else {
        return;
    };
    let user = url::Url::parse(server).expect("url").username().to_owned();
    let through = format!("postgres://{user}@127.0.0.1:{}/{name}", pooler.port);
    // The timeouts go as startup options by default, which PgBouncer refuses: the error says
    // what to do instead.
    let refused = refusal(&through).await;
    assert!(refused.contains("statement_timeout=0"), "{refused}");

    let url = format!("{through}?statement_timeout=0&lock_timeout=0");
    let dir = tempfile::tempdir().expect("tempdir");
    let env = [("SABI_STORE", url.as_str()), ("SABI_BATCH_WINDOW", "0")];
    let sabi = SabiProcess::spawn(dir.path(), "all", &env);
    let client = reqwest::Client::new();
    for n in 0..10 {
        let body = text_webhook_at(&format!("wamid.p{n}"), "2348031234567", "hi", now_s());
        let answer = post_webhook(&client, &sabi.url(""), body).await;
        assert_eq!(answer.status(), 200);
    }
    eventually_seen("answers through the pooler", ms(30_000), || async {
        let inbox = json_lines(dir.path(), &url, &["inbox", "--json"]);
        if inbox.len() == 10 && inbox.iter().all(|i| i["state"] == "answered") {
            Ok(())
        } else {
            Err(format!("{inbox:?}\n{}", sabi.logs().join("\n")))
        }
    })
    .await;
}

/// Finding a WhatsApp customer's key reads their own ids, not every customer's, whatever the
/// planner's statistics say: the message path's lookup (`sabi_identify_v2`), planned once for
/// all customers as PostgreSQL does for a function's statements, read the channel's whole index
/// of ids for each message while the statistics still described a small table (a new store
/// under load, until autovacuum analyzes it): ingest at under half its speed with 10,000
/// customers. The table is left unanalyzed here, as then. Counted in index entries read, in
/// one transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_is_found_by_their_own_ids_however_many_customers_there_are() {
    const CUSTOMERS: usize = 3_000;
    const LOOKUPS: usize = 20;
    let Some(db) = PgDatabase::create().await else {
        return;
    };
    let store = PgStore::open(&db.url, crate::helpers::marks())
        .await
        .expect("the store opens");
    drop(store);
    let mut conn = PgConnection::connect(&db.url).await.expect("connect");
    sqlx::query(
        "INSERT INTO customer_ids (channel, alias, customer, linked_at)
         SELECT 'whatsapp', n::TEXT, n::TEXT, 0 FROM generate_series(2348000000000, $1) AS n",
    )
    .bind(2_348_000_000_000_i64 + CUSTOMERS as i64 - 1)
    .execute(&mut conn)
    .await
    .expect("customers");
    let mut tx = conn.begin().await.expect("begin");
    // As a function's statements run after their first calls: one plan for any arguments.
    execute(&mut tx, "SET LOCAL plan_cache_mode = force_generic_plan").await;
    for n in 0..LOOKUPS {
        let id = (2_348_000_000_000_i64 + (n * 97) as i64).to_string();
        let key: Option<String> =
            sqlx::query_scalar("SELECT sabi_identify_v2('whatsapp', ARRAY[$1], 0, true)")
                .bind(&id)
                .fetch_one(&mut *tx)
                .await
                .expect("identified");
        assert_eq!(key.as_deref(), Some(id.as_str()));
    }
    let read: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(indexrelid)), 0)::BIGINT
         FROM pg_index WHERE indrelid = 'customer_ids'::regclass",
    )
    .fetch_one(&mut *tx)
    .await
    .expect("index statistics");
    assert!(
        read <= (LOOKUPS * 4) as i64,
        "{LOOKUPS} lookups read {read} index entries of customer_ids ({CUSTOMERS} customers)"
    );
}

/// A message as both intake functions take it (functions.sql).
struct Sent<'a> {
    channel: &'a str,
    key: &'a str,
    customer: &'a str,
    ids: &'a [&'a str],
    model: bool,
    key_hash: &'a str,
}

const WINDOW: i64 = 5_000;
const CAP: i64 = 20_000;

/// Stored as a one-message delivery is: `sabi_ingest_message_v6`, received at `at`.
async fn ingest_alone(conn: &mut PgConnection, m: &Sent<'_>, at: i64) {
    let business = if m.channel == "webchat" {
        "site"
    } else {
        "1000"
    };
    sqlx::query(
        "SELECT * FROM sabi_ingest_message_v6($1, $2, $3, $4, 'text', $2, NULL, 1, $5, '\\x00',
             '{}', $1, $3, $4, $6, $7, $5, NULL, 0, $8, $9, $10)",
    )
    .bind(m.channel)
    .bind(m.key)
    .bind(business)
    .bind(m.customer)
    .bind(at)
    .bind(WINDOW)
    .bind(CAP)
    .bind(m.model)
    .bind(m.key_hash)
    .bind(m.ids)
    .execute(conn)
    .await
    .expect("stored alone");
}

/// Stored in one call of `sabi_ingest_messages_v1`, the nth received at `at(n)`.
async fn ingest_together(conn: &mut PgConnection, group: &[Sent<'_>], at: impl Fn(usize) -> i64) {
    let column = |f: for<'a> fn(&'a Sent<'a>) -> &'a str| group.iter().map(f).collect::<Vec<_>>();
    let business = column(|m| {
        if m.channel == "webchat" {
            "site"
        } else {
            "1000"
        }
    });
    let received: Vec<i64> = (0..group.len()).map(at).collect();
    let (mut id_of, mut ids) = (Vec::new(), Vec::new());
    for (n, m) in group.iter().enumerate() {
        id_of.extend(m.ids.iter().map(|_| n as i32 + 1));
        ids.extend(m.ids.iter().copied());
    }
    sqlx::query(
        "SELECT * FROM sabi_ingest_messages_v1($1, $2, $3, $4, $5, $2, $6, $7, $8, $9, $10, $1,
             $3, $4, $8, $11, $12, $13, $14, $15, $16, $17)",
    )
    .bind(column(|m| m.channel))
    .bind(column(|m| m.key))
    .bind(&business)
    .bind(column(|m| m.customer))
    .bind(vec!["text"; group.len()])
    .bind(vec![None::<&str>; group.len()])
    .bind(vec![1_i64; group.len()])
    .bind(&received)
    .bind(vec![vec![0_u8]; group.len()])
    .bind(vec!["{}"; group.len()])
    .bind(vec![0_i64; group.len()])
    .bind(group.iter().map(|m| m.model).collect::<Vec<_>>())
    .bind(column(|m| m.key_hash))
    .bind(id_of)
    .bind(ids)
    .bind(WINDOW)
    .bind(CAP)
    .execute(conn)
    .await
    .expect("stored together");
}

/// What the intake leaves behind, as text to compare: the inbox in seq order (seqs as ranks),
/// the conversations, the links, and the broadcasts' replies.
async fn intake_tables(conn: &mut PgConnection) -> Vec<String> {
    let mut tables = Vec::new();
    for sql in [
        "SELECT i.channel, i.dedupe_key, i.customer, i.state, i.received_at, c.customer AS thread,
                rank() OVER (ORDER BY i.seq) AS place
         FROM inbox i LEFT JOIN conversations c ON c.id = i.conversation_id ORDER BY i.seq",
        "SELECT channel, business, customer, first_pending_at, last_pending_at, due_at,
                last_inbound_at, model_pending
         FROM conversations ORDER BY channel, business, customer",
        "SELECT channel, alias, customer, linked_at FROM customer_ids ORDER BY channel, alias",
        "SELECT recipient, replied_at FROM broadcast_recipients ORDER BY id",
    ] {
        let rows: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT row_to_json(t)::TEXT FROM ({sql}) t"
        )))
        .fetch_all(&mut *conn)
        .await
        .expect("read back");
        tables.push(rows.join("\n"));
    }
    tables
}

/// Many one-message deliveries stored in one call leave the store exactly as the same
/// deliveries stored one after the other: a new customer, one named by a BSUID linked to a
/// number, one with a conversation already waiting, an erased message, a redelivery, a reply
/// to a broadcast, two messages of one web chat session, a customer named by number and BSUID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_messages_is_stored_as_each_would_be_alone() {
    let wa = |key, customer, ids| Sent {
        channel: "whatsapp",
        key,
        customer,
        ids,
        model: true,
        key_hash: "kept",
    };
    let chat = |key, model| Sent {
        channel: "webchat",
        key,
        customer: "s-1",
        ids: &[],
        model,
        key_hash: "kept",
    };
    let earlier = [
        wa("g.0", "2348050000003", &["2348050000003"]),
        wa("g.5", "2348050000005", &["2348050000005"]),
    ];
    let group = [
        wa("g.1", "2348050000001", &["2348050000001"]),
        wa("g.2", "NG.2", &["NG.2"]),
        wa("g.3", "2348050000003", &["2348050000003"]),
        Sent {
            key_hash: "erased",
            ..wa("g.4", "2348050000004", &["2348050000004"])
        },
        wa("g.5", "2348050000005", &["2348050000005"]),
        wa("g.6", "2348050000006", &["2348050000006"]),
        chat("g.7", false),
        chat("g.8", true),
        wa("g.9", "2348050000009", &["2348050000009", "NG.9"]),
    ];
    let at = |n: usize| 1_000 + 10 * n as i64;
    let mut tables = Vec::new();
    for together in [false, true] {
        let Some(db) = PgDatabase::create().await else {
            return;
        };
        drop(
            PgStore::open(&db.url, crate::helpers::marks())
                .await
                .expect("the store opens"),
        );
        let mut conn = PgConnection::connect(&db.url).await.expect("connect");
        for sql in [
            "INSERT INTO customer_ids VALUES ('whatsapp', 'NG.2', '2348050000002', 0)",
            "INSERT INTO erased_keys VALUES ('erased', 0)",
            "INSERT INTO broadcasts (name, template, language, business, state, created_at,
                                     start_at, rate)
             VALUES ('offer', 'offer', 'en', '1000', 'done', 0, 0, 1)",
            "INSERT INTO broadcast_recipients (broadcast_id, recipient, params, state, sent_at)
             SELECT id, '2348050000006', '[]', 'sent', 900 FROM broadcasts",
        ] {
            execute(&mut conn, sql).await;
        }
        for m in &earlier {
            ingest_alone(&mut conn, m, 500).await;
        }
        if together {
            ingest_together(&mut conn, &group, at).await;
        } else {
            for (n, m) in group.iter().enumerate() {
                ingest_alone(&mut conn, m, at(n)).await;
            }
        }
        tables.push(intake_tables(&mut conn).await);
    }
    let (alone, together) = (&tables[0], &tables[1]);
    for (alone, together) in alone.iter().zip(together) {
        assert_eq!(together, alone);
    }
    // The case the comparison rests on did happen.
    assert!(alone[0].contains(r#""dedupe_key":"g.2","customer":"2348050000002""#));
    assert!(
        !alone[0].contains(r#""g.4""#),
        "the erased message is not kept"
    );
    assert!(
        alone[1].contains(r#""customer":"s-1","first_pending_at":1060,"last_pending_at":1070"#)
    );
    assert!(alone[2].contains(r#""alias":"NG.9","customer":"2348050000009""#));
    assert!(alone[3].contains(r#""replied_at":1050"#));
}

/// A group's statements read the rows they name through an index, even on a connection whose
/// plans were made while the tables were empty (a new store under load): a plan made then, kept
/// as the inbox grew, read the whole inbox for every group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_reads_only_its_own_rows_however_the_tables_grew() {
    const GROUP: usize = 20;
    const GROWN: i64 = 20_000;
    let Some(db) = PgDatabase::create().await else {
        return;
    };
    drop(
        PgStore::open(&db.url, crate::helpers::marks())
            .await
            .expect("the store opens"),
    );
    let mut conn = PgConnection::connect(&db.url).await.expect("connect");
    // As a function's statements run after their first calls: one plan for any arguments.
    execute(&mut conn, "SET plan_cache_mode = force_generic_plan").await;
    let group = |round: usize| -> (Vec<String>, Vec<String>) {
        let keys = (0..GROUP).map(|n| format!("r{round}.{n}")).collect();
        let customers = (0..GROUP).map(|n| format!("23490{round}{n:05}")).collect();
        (keys, customers)
    };
    let mut read = Vec::new();
    for round in 0..2 {
        let (keys, customers) = group(round);
        let ids: Vec<[&str; 1]> = customers.iter().map(|c| [c.as_str()]).collect();
        let sent: Vec<Sent<'_>> = (0..GROUP)
            .map(|n| Sent {
                channel: "whatsapp",
                key: &keys[n],
                customer: &customers[n],
                ids: &ids[n],
                model: true,
                key_hash: "kept",
            })
            .collect();
        execute(&mut conn, "BEGIN").await;
        ingest_together(&mut conn, &sent, |n| 1_000 + n as i64).await;
        let rows: i64 = sqlx::query_scalar(
            "SELECT sum(pg_stat_get_xact_tuples_returned(c.oid))::BIGINT
             FROM pg_class c
             WHERE c.relname IN ('inbox', 'conversations', 'customer_ids')
                OR c.oid IN (SELECT indexrelid FROM pg_index
                             WHERE indrelid IN ('inbox'::regclass, 'conversations'::regclass,
                                                'customer_ids'::regclass))",
        )
        .fetch_one(&mut conn)
        .await
        .expect("statistics");
        execute(&mut conn, "COMMIT").await;
        read.push(rows);
        if round > 0 {
            break;
        }
        // The store grows after the plans were made, its statistics never read again.
        sqlx::query(
            "INSERT INTO inbox (channel, dedupe_key, kind, received_at, state, content_hash, facts)
             SELECT 'whatsapp', 'old.' || n, 'message', 0, 'done', '\\x00', '{}'
             FROM generate_series(1, $1) AS n",
        )
        .bind(GROWN)
        .execute(&mut conn)
        .await
        .expect("grown");
    }
    assert!(
        read[1] <= (GROUP * 8) as i64,
        "a group of {GROUP} read {read:?} rows and index entries before and after the inbox \
         grew by {GROWN}"
    );
}

/// A message PostgreSQL refuses (text with a NUL byte) arriving among others fails its own
/// delivery only: a group whose call fails is stored again one message at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_server_refuses_fails_only_its_own_delivery() {
    use crate::conformance::{HUMAN_HOLD, PAIR_SPACING, POLICY, T0, message};
    use sabi::store::{Ingest, Intake};
    let Some(db) = PgDatabase::create().await else {
        return;
    };
    let store = PgStore::open(&db.url, crate::helpers::marks())
        .await
        .expect("the store opens");
    let delivery = |n: usize| {
        let text = if n == 7 { "bad\0text" } else { "hello" };
        let customer = format!("2348060000{n:03}");
        Ingest {
            items: vec![message(&format!("wamid.nul-{n}"), &customer, text, T0)],
            quarantined: Vec::new(),
            received_at: T0,
            policy: POLICY,
            routine: Default::default(),
            pair_spacing: PAIR_SPACING,
            human_hold: HUMAN_HOLD,
        }
    };
    let outcomes = futures_util::future::join_all((0..40).map(|n| store.ingest(delivery(n)))).await;
    for (n, outcome) in outcomes.iter().enumerate() {
        match outcome {
            Ok(receipt) => assert!(n != 7 && receipt.stored == 1, "{n}: {receipt:?}"),
            Err(e) => assert_eq!(n, 7, "only the refused message fails: {e}"),
        }
    }
    assert!(outcomes[7].is_err());
}
