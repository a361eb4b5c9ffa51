//! Stores made by an older build, opened by this one: PostgreSQL's schema and Redis's key
//! layout are upgraded in place at start with their data intact and usable, also when two
//! nodes start at once; `sabi check` (the probe) says an upgrade is due without making it; and
//! a store that a newer build upgraded is refused, never downgraded.
//!
//! The older stores are `tests/data/upgrades/`: a dump of each, made by the previous build
//! (see the README there).

use sabi::config::StoreConfig;
use sabi::domain::{Channel, Horizons};
use sabi::store::{
    self, Error, Health, InboxQuery, Ingest, JobStatus, PgStore, RedisStore, ReviewQuery,
    SendClaim, Store, Subject, Swept,
};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

use crate::conformance::{PgDatabase, RedisPrefix, T0, message};
use crate::helpers::ms;

/// A database exactly as the previous build (schema version 1) left it.
const POSTGRES_V1: &str = include_str!("../data/upgrades/postgres-v1.sql");
/// A prefix's keys exactly as the previous build (key layout 1) left them, one key a line.
const REDIS_V1: &str = include_str!("../data/upgrades/redis-v1.jsonl");

/// A fresh database holding the previous build's store; `None` (skipped) without PostgreSQL.
async fn postgres_v1() -> Option<PgDatabase> {
    let db = PgDatabase::create().await?;
    // A connection of its own: the dump empties the session's search_path.
    let mut conn = PgConnection::connect(&db.url).await.expect("connect");
    sqlx::raw_sql(AssertSqlSafe(POSTGRES_V1))
        .execute(&mut conn)
        .await
        .expect("the v1 dump loads");
    conn.close().await.expect("close");
    Some(db)
}

#[tokio::test]
async fn a_postgres_store_of_the_previous_build_is_upgraded_in_place() {
    let Some(db) = postgres_v1().await else {
        return;
    };
    let config = StoreConfig::Postgres {
        url: db.url.clone(),
    };
    let said = store::probe(&config).await.expect("probe");
    assert!(
        said.ends_with("schema version 1, this build upgrades it to 18 at start"),
        "{said}"
    );
    let mut conn = PgConnection::connect(&db.url).await.expect("connect");
    let versions = || sqlx::query_scalar("SELECT version FROM sabi_schema ORDER BY version");
    let before: Vec<i32> = versions().fetch_all(&mut conn).await.expect("versions");
    assert_eq!(before, [1]);

    let (one, other) = tokio::join!(
        PgStore::open(&db.url, crate::helpers::marks()),
        PgStore::open(&db.url, crate::helpers::marks())
    );
    let (store, _other) = (one.expect("upgraded"), other.expect("opened"));
    let after: Vec<i32> = versions().fetch_all(&mut conn).await.expect("versions");
    assert_eq!(
        after,
        [
            1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18
        ],
        "each migration ran once"
    );
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes
         WHERE indexname IN ('conversations_claimable', 'conversations_due')",
    )
    .fetch_all(&mut conn)
    .await
    .expect("indexes");
    assert_eq!(indexes, ["conversations_claimable"]);
    let said = store::probe(&config).await.expect("probe");
    assert!(said.ends_with("schema current"), "{said}");
    store.ready().await.expect("ready");
    what_the_previous_build_stored_is_intact(&store).await;
}

#[tokio::test]
async fn a_postgres_schema_newer_than_the_build_is_refused() {
    let Some(db) = PgDatabase::create().await else {
        return;
    };
    drop(
        PgStore::open(&db.url, crate::helpers::marks())
            .await
            .expect("created"),
    );
    let mut conn = PgConnection::connect(&db.url).await.expect("connect");
    sqlx::query("INSERT INTO sabi_schema (version) SELECT max(version) + 1 FROM sabi_schema")
        .execute(&mut conn)
        .await
        .expect("a newer build's version");

    let Err(Error::Schema(why)) = PgStore::open(&db.url, crate::helpers::marks()).await else {
        panic!("a newer schema is refused");
    };
    assert!(why.contains("newer than this build's"), "{why}");
    let config = StoreConfig::Postgres {
        url: db.url.clone(),
    };
    let Err(Error::Schema(why)) = store::probe(&config).await else {
        panic!("the probe says it is refused");
    };
    assert!(why.contains("newer than this build's"), "{why}");
}

async fn redis_connection(prefix: &RedisPrefix) -> redis::aio::MultiplexedConnection {
    let server = prefix.url.split('?').next().expect("server");
    redis::Client::open(server)
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connection")
}

/// Writes the previous build's keys under `prefix`.
async fn redis_v1(prefix: &RedisPrefix) -> redis::aio::MultiplexedConnection {
    let mut conn = redis_connection(prefix).await;
    for line in REDIS_V1.lines() {
        let entry: serde_json::Value = serde_json::from_str(line).expect("a fixture line");
        let key = format!("{}:{}", prefix.tag(), entry["key"].as_str().expect("key"));
        let mut cmd = redis::Cmd::new();
        if let Some(value) = entry["string"].as_str() {
            cmd.arg("SET").arg(&key).arg(value);
        } else if let Some(fields) = entry["hash"].as_object() {
            cmd.arg("HSET").arg(&key);
            for (field, value) in fields {
                cmd.arg(field).arg(value.as_str().expect("a hash value"));
            }
        } else {
            cmd.arg("ZADD").arg(&key);
            for pair in entry["zset"].as_array().expect("a sorted set") {
                cmd.arg(pair[1].as_i64().expect("score"))
                    .arg(pair[0].as_str().expect("member"));
            }
        }
        let () = cmd.query_async(&mut conn).await.expect("written");
    }
    conn
}

#[tokio::test]
async fn a_redis_store_of_the_previous_build_is_upgraded_in_place() {
    let Some(prefix) = RedisPrefix::new() else {
        return;
    };
    let mut conn = redis_v1(&prefix).await;
    let get = |name: &str| {
        redis::cmd("GET")
            .arg(format!("{}:{name}", prefix.tag()))
            .clone()
    };
    let epoch: String = get("epoch").query_async(&mut conn).await.expect("epoch");
    let config = StoreConfig::Redis {
        url: prefix.url.clone(),
    };
    let said = store::probe(&config).await.expect("probe");
    assert!(
        said.contains("key layout 1, this build upgrades it to 4 at start"),
        "{said}"
    );

    let (one, other) = tokio::join!(
        RedisStore::open(&prefix.url, crate::helpers::marks()),
        RedisStore::open(&prefix.url, crate::helpers::marks())
    );
    let (store, other) = (one.expect("upgraded"), other.expect("opened"));
    let layout: String = get("schema").query_async(&mut conn).await.expect("layout");
    assert_eq!(layout, "4");
    let kept: String = get("epoch").query_async(&mut conn).await.expect("epoch");
    assert_eq!(kept, epoch, "the store is the same store");
    // Layout 2 keeps a session's questions of the last minute only: this one is months old.
    let recent: u64 = redis::cmd("ZCARD")
        .arg(format!("{}:sr:session-1", prefix.tag()))
        .query_async(&mut conn)
        .await
        .expect("zcard");
    assert_eq!(recent, 0);
    let said = store::probe(&config).await.expect("probe");
    assert!(said.contains("layout current"), "{said}");
    store.ready().await.expect("ready");
    other.ready().await.expect("the other node is ready too");
    what_the_previous_build_stored_is_intact(&store).await;
}

#[tokio::test]
async fn a_redis_layout_newer_than_the_build_is_refused() {
    let Some(prefix) = RedisPrefix::new() else {
        return;
    };
    drop(
        RedisStore::open(&prefix.url, crate::helpers::marks())
            .await
            .expect("written"),
    );
    let mut conn = redis_connection(&prefix).await;
    let _: u64 = redis::cmd("INCR")
        .arg(format!("{}:schema", prefix.tag()))
        .query_async(&mut conn)
        .await
        .expect("a newer build's layout");

    let Err(Error::Schema(why)) = RedisStore::open(&prefix.url, crate::helpers::marks()).await
    else {
        panic!("a newer layout is refused");
    };
    assert!(why.contains("newer than this build's"), "{why}");
    let config = StoreConfig::Redis {
        url: prefix.url.clone(),
    };
    let Err(Error::Schema(why)) = store::probe(&config).await else {
        panic!("the probe says it is refused");
    };
    assert!(why.contains("newer than this build's"), "{why}");
}

/// What the previous build stored (see the README of `tests/data/upgrades`) reads back as it
/// was, and the work it left goes on: the waiting conversations are claimed with their
/// messages, the queued reply is sent, a redelivered message is not stored twice.
async fn what_the_previous_build_stored_is_intact(store: &dyn Store) {
    let inbox = store.inbox(InboxQuery::default()).await.expect("inbox");
    let rows: Vec<_> = inbox
        .iter()
        .map(|i| {
            (
                i.seq,
                i.item.text.as_deref().unwrap_or(""),
                i.state.as_str(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (1, "Abeg, wetin be my account balance?", "answered"),
            (2, "and my last transfer", "answered"),
            (3, "I wan talk to person", "review"),
            (4, "thank you", "pending"),
            (5, "Do you open on Saturday?", "pending"),
        ]
    );
    assert_eq!(store.quarantine(None).await.expect("quarantine").len(), 1);
    let review = store
        .review_queue(ReviewQuery::default())
        .await
        .expect("review");
    assert_eq!(review.len(), 1);
    assert_eq!(
        (
            review[0].reason.as_str(),
            review[0].conversation.customer.as_str()
        ),
        ("handoff_asked", "2348022222222")
    );
    let job = store
        .chat_job("job-1", T0 + ms(40_000))
        .await
        .expect("chat job")
        .expect("kept");
    assert_eq!(job.status, JobStatus::Queued);
    let before_guesses = sabi::clock::At::default();
    let routed = store
        .routed_turns(before_guesses, 10)
        .await
        .expect("routed");
    assert_eq!(routed, [], "the previous build kept no router guesses");
    store
        .label_turn(review[0].batch_id, "agent_escalation")
        .await
        .expect("an upgraded turn takes a label");

    let again = Ingest {
        routine: Default::default(),
        items: vec![message(
            "wamid.A1",
            "2348011111111",
            "Abeg, wetin be my account balance?",
            T0 - ms(2_000),
        )],
        quarantined: Vec::new(),
        received_at: T0 + ms(50_000),
        policy: sabi::domain::BatchPolicy {
            window: ms(10_000),
            cap: ms(12_000),
        },
        pair_spacing: std::time::Duration::ZERO,
        human_hold: std::time::Duration::ZERO,
    };
    assert_eq!(store.ingest(again).await.expect("ingest").stored, 0);

    // What the previous build stored is a customer's to export: indexed by the upgrade.
    let ada = Subject::parse(Channel::Whatsapp, "2348011111111").expect("a number");
    let record = store.export_customer(&ada).await.expect("export");
    let seqs: Vec<i64> = record.items.iter().map(|i| i.seq).collect();
    assert_eq!(seqs, [1, 2, 4]);

    let mut claims = store
        .claim(T0 + ms(100_000), ms(120_000), 10, None)
        .await
        .expect("claim");
    claims.sort_by_key(|c| c.batch.id);
    let claimed: Vec<_> = claims
        .iter()
        .map(|c| {
            let texts: Vec<_> = c.batch.messages.iter().map(|m| m.text.as_deref()).collect();
            (c.batch.id, texts)
        })
        .collect();
    assert_eq!(
        claimed,
        [
            (3, vec![Some("Do you open on Saturday?")]),
            (4, vec![Some("thank you")]),
        ],
        "due first, claimed first; new batches number on from the stored ones"
    );
    let sends = store
        .claim_sends(SendClaim {
            now: T0 + ms(100_000),
            lease: ms(30_000),
            unknown_wait: ms(60_000),
            limit: 10,
            halted: Vec::new(),
        })
        .await
        .expect("claim sends")
        .jobs;
    let texts: Vec<_> = sends.iter().map(|s| s.text.as_str()).collect();
    assert_eq!(texts, ["Your balance is NGN 5,000."], "one part at a time");

    // Retention reaches what the previous build stored: its quarantined part, long past.
    let mut swept = Swept::default();
    let a_year_on = T0 + ms(365 * 86_400_000);
    loop {
        let batch = store
            .sweep(&Horizons::default(), a_year_on, 100)
            .await
            .expect("sweep");
        if batch.is_empty() {
            break;
        }
        swept.add(&batch);
    }
    assert_eq!(swept.quarantined, 1, "{swept:?}");
    assert!(store.quarantine(None).await.expect("quarantine").is_empty());
}
