//! Erasure's markers and erased keys' hashes are keyed by the deployment's marker secret, kept
//! outside the store: a store made before the secret (unkeyed hashes) or under a secret since
//! replaced moves under the configured one at start, and an erased customer stays opted out
//! and their message's retry stays known. A store under a secret the configuration does not
//! list is refused. On every backend there is.

use std::sync::Arc;

use sabi::domain::Channel;
use sabi::store::{Error, Marks, PgStore, RedisStore, SqliteStore, Store, Subject};
use secrecy::SecretString;
use sha2::{Digest, Sha256};
use sqlx::{Connection, PgConnection};

use crate::conformance::{PgDatabase, RedisPrefix, T0, ingest, message};
use crate::helpers::ms;

const ADA: &str = "2348031234567";

/// Where a store lives, to open it again under other secrets.
enum Place {
    Sqlite(tempfile::TempDir),
    Postgres(PgDatabase),
    Redis(RedisPrefix),
}

impl Place {
    async fn every() -> Vec<Place> {
        let mut places = vec![Place::Sqlite(tempfile::tempdir().expect("tempdir"))];
        if let Some(db) = PgDatabase::create().await {
            places.push(Place::Postgres(db));
        }
        if let Some(prefix) = RedisPrefix::new() {
            places.push(Place::Redis(prefix));
        }
        places
    }

    async fn open(&self, marks: Marks) -> Result<Arc<dyn Store>, Error> {
        Ok(match self {
            Place::Sqlite(dir) => {
                Arc::new(SqliteStore::open(&dir.path().join("sabi.db"), marks).await?)
            }
            Place::Postgres(db) => Arc::new(PgStore::open(&db.url, marks).await?),
            Place::Redis(prefix) => Arc::new(RedisStore::open(&prefix.url, marks).await?),
        })
    }

    /// Rewrites a marker and a key hash as the build before the marker secret wrote them, and
    /// forgets which secret the store was under.
    async fn unkey(
        &self,
        (marker, legacy_marker): (&str, &str),
        (hash, legacy_hash): (&str, &str),
    ) {
        match self {
            Place::Sqlite(dir) => {
                let conn = rusqlite::Connection::open(dir.path().join("sabi.db")).expect("open");
                conn.execute(
                    "UPDATE consents SET customer = ?2 WHERE customer = ?1",
                    [marker, legacy_marker],
                )
                .expect("consents");
                conn.execute(
                    "UPDATE erased_keys SET key_hash = ?2 WHERE key_hash = ?1",
                    [hash, legacy_hash],
                )
                .expect("keys");
                conn.execute("DELETE FROM marker_key", [])
                    .expect("fingerprint");
            }
            Place::Postgres(db) => {
                let mut conn = PgConnection::connect(&db.url).await.expect("connect");
                for (sql, old, new) in [
                    (
                        "UPDATE consents SET customer = $2 WHERE customer = $1",
                        marker,
                        legacy_marker,
                    ),
                    (
                        "UPDATE erased_keys SET key_hash = $2 WHERE key_hash = $1",
                        hash,
                        legacy_hash,
                    ),
                ] {
                    let done = sqlx::query(sql)
                        .bind(old)
                        .bind(new)
                        .execute(&mut conn)
                        .await
                        .expect("unkey");
                    assert_eq!(done.rows_affected(), 1, "{sql}");
                }
                sqlx::query("DELETE FROM marker_key")
                    .execute(&mut conn)
                    .await
                    .expect("fingerprint");
            }
            Place::Redis(prefix) => {
                let server = prefix.url.split('?').next().expect("server");
                let mut conn = redis::Client::open(server)
                    .expect("client")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connection");
                let k = |name: &str| format!("{}:{name}", prefix.tag());
                let choice: String = redis::cmd("HGET")
                    .arg(k("consent"))
                    .arg(marker)
                    .query_async(&mut conn)
                    .await
                    .expect("choice");
                let at: String = redis::cmd("HGET")
                    .arg(k("erased"))
                    .arg(hash)
                    .query_async(&mut conn)
                    .await
                    .expect("at");
                let () = redis::pipe()
                    .cmd("HDEL")
                    .arg(k("consent"))
                    .arg(marker)
                    .ignore()
                    .cmd("HSET")
                    .arg(k("consent"))
                    .arg(legacy_marker)
                    .arg(choice)
                    .ignore()
                    .cmd("HDEL")
                    .arg(k("erased"))
                    .arg(hash)
                    .ignore()
                    .cmd("HSET")
                    .arg(k("erased"))
                    .arg(legacy_hash)
                    .arg(&at)
                    .ignore()
                    .cmd("ZREM")
                    .arg(k("erasedt"))
                    .arg(hash)
                    .ignore()
                    .cmd("ZADD")
                    .arg(k("erasedt"))
                    .arg(&at)
                    .arg(legacy_hash)
                    .ignore()
                    .cmd("DEL")
                    .arg(k("markerkey"))
                    .ignore()
                    .query_async(&mut conn)
                    .await
                    .expect("unkeyed");
            }
        }
    }
}

fn marks(current: &str, previous: &[&str]) -> Marks {
    let secret = |s: &str| SecretString::from(s.to_owned());
    Marks::new(
        secret(current),
        previous.iter().map(|s| secret(s)).collect(),
    )
}

/// The unkeyed SHA-256 the build before the marker secret wrote.
fn unkeyed(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update(b"\n");
    }
    hex::encode(hasher.finalize())
}

/// Ada wrote and was forgotten: her message's key and her marker stay, keyed.
async fn ada_forgotten(store: &Arc<dyn Store>) {
    let receipt = ingest(store, vec![message("wamid.ada-1", ADA, "hello", T0)], T0).await;
    assert_eq!(receipt.stored, 1);
    let ada = Subject::parse(Channel::Whatsapp, ADA).expect("number");
    store
        .forget_customer(&ada, T0 + ms(1_000))
        .await
        .expect("forget");
}

/// Ada stays opted out and her message's retry is known, not taken in again.
async fn ada_stays_forgotten(store: &Arc<dyn Store>) {
    let opted_out = store.opted_out(&[ADA.to_owned()]).await.expect("opt-outs");
    assert!(opted_out.contains(ADA), "her marker is still found");
    let retry = ingest(
        store,
        vec![message("wamid.ada-1", ADA, "hello", T0)],
        T0 + ms(2_000),
    )
    .await;
    assert_eq!(retry.stored, 0, "the retry of her erased message is known");
}

#[tokio::test]
async fn unkeyed_markers_move_under_the_marker_secret_at_start() {
    let secret = marks("the-marker-secret-1", &[]);
    for place in Place::every().await {
        let store = place.open(secret.clone()).await.expect("store");
        ada_forgotten(&store).await;
        drop(store);
        let marker = secret.marker(Channel::Whatsapp, ADA);
        let hash = secret.key_hash(Channel::Whatsapp, "wamid.ada-1");
        let legacy_marker = format!("erased:{}", unkeyed(&["customer", "whatsapp", ADA]));
        let legacy_hash = unkeyed(&["key", "whatsapp", "wamid.ada-1"]);
        assert_ne!(marker, legacy_marker, "keyed");
        place
            .unkey((&marker, &legacy_marker), (&hash, &legacy_hash))
            .await;

        let store = place.open(secret.clone()).await.expect("migrated");
        ada_stays_forgotten(&store).await;
        drop(store);
        // Moved for good: under the same secret again nothing moves twice.
        let store = place.open(secret.clone()).await.expect("again");
        ada_stays_forgotten(&store).await;
    }
}

#[tokio::test]
async fn a_new_marker_secret_takes_over_and_an_unknown_one_is_refused() {
    for place in Place::every().await {
        let store = place
            .open(marks("the-old-marker-secret", &[]))
            .await
            .expect("store");
        ada_forgotten(&store).await;
        drop(store);

        let Err(Error::Schema(why)) = place.open(marks("another-marker-secret", &[])).await else {
            panic!("a store under a secret the configuration lacks is refused");
        };
        assert!(why.contains("privacy.previous_marker_secrets"), "{why}");

        let rotated = marks("the-new-marker-secret", &["the-old-marker-secret"]);
        let store = place.open(rotated.clone()).await.expect("rotated");
        ada_stays_forgotten(&store).await;
        drop(store);
        let store = place.open(rotated).await.expect("again");
        ada_stays_forgotten(&store).await;
    }
}
