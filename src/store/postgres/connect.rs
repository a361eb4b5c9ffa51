//! How a node reaches PostgreSQL: the store URL as libpq spells it (`sslmode`, `sslrootcert`,
//! `sslcert`, `sslkey`, …) plus Sabi's own settings, TLS through rustls, the connection pool,
//! the server-side timeouts, what a failover looks like, and plain words for what goes wrong.
//!
//! A failover leaves the old primary up and read-only, or drops its connections. Both are the
//! store being away, never a turn's or a send's failure: a read-only answer (SQLSTATE 25006)
//! makes the pool check every connection it hands out for a while and drop those to a
//! read-only server, and a new connection to one is refused, so the pool reconnects (through
//! DNS, to the new primary) instead of failing writes on the old one.

use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::{Connection, PgConnection, PgPool};

use crate::store::{Error, Result};

/// Connections each node opens at most: size `max_connections` on the server for every node.
const DEFAULT_POOL: u32 = 16;
/// A statement running longer is cancelled by the server, so a stuck server cannot hold a
/// webhook past Meta's patience.
const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Waiting this long for a row lock gives up (a claim never waits: it skips locked rows).
const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long after a read-only answer every connection is checked before it is handed out.
const FAILOVER_WATCH: Duration = Duration::from_secs(60);

/// What the store URL says, once read.
pub(super) struct Target {
    pub(super) connect: PgConnectOptions,
    pool_size: u32,
}

/// Reads a store URL. libpq's parameters go to the driver; Sabi's own are taken out first:
/// `max_connections` (the pool, 16), `statement_timeout` (10s) and `lock_timeout` (5s),
/// durations sent to the server at connect time, `0` to send none (behind a pooler that
/// refuses startup options: set them on the role instead).
///
/// # Errors
/// A URL that is not one, or a setting of the wrong shape, with what was expected.
pub(super) fn target(url: &str) -> Result<Target> {
    choose_crypto();
    let bad = |why: String| Error::Unavailable(format!("the store URL is not usable: {why}"));
    let mut parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
    let (mut pool_size, mut statement_timeout, mut lock_timeout) = (
        DEFAULT_POOL,
        DEFAULT_STATEMENT_TIMEOUT,
        DEFAULT_LOCK_TIMEOUT,
    );
    let mut driver = Vec::new();
    for (key, value) in parsed.query_pairs() {
        let duration = || {
            humantime::parse_duration(&value)
                .or_else(|_| value.parse::<u64>().map(Duration::from_secs))
                .map_err(|_| bad(format!("{key}={value}: expected a duration like 10s")))
        };
        match key.as_ref() {
            "max_connections" => {
                pool_size =
                    value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        bad(format!("max_connections={value}: expected 1 or more"))
                    })?;
            }
            "statement_timeout" => statement_timeout = duration()?,
            "lock_timeout" => lock_timeout = duration()?,
            _ => driver.push((key.into_owned(), value.into_owned())),
        }
    }
    if driver.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(driver);
    }
    let mut connect =
        PgConnectOptions::from_str(parsed.as_str()).map_err(|e| bad(e.to_string()))?;
    if connect.get_application_name().is_none() {
        connect = connect.application_name("sabi");
    }
    // Only text results need it, and Sabi reads none; poolers refuse it as a startup parameter.
    connect = connect.extra_float_digits(None);
    for (name, value) in [
        ("statement_timeout", statement_timeout),
        ("lock_timeout", lock_timeout),
    ] {
        if !value.is_zero() {
            connect = connect.options([(name, value.as_millis().to_string())]);
        }
    }
    Ok(Target { connect, pool_size })
}

impl Target {
    /// The pool: bounded waits, and no connection to a read-only server (see the module doc).
    ///
    /// # Errors
    /// When the server cannot be reached, with what to change when TLS is at fault.
    pub(super) async fn pool(self) -> Result<PgPool> {
        PgPoolOptions::new()
            .max_connections(self.pool_size)
            .acquire_timeout(Duration::from_secs(5))
            .after_connect(|conn, _| {
                Box::pin(async move {
                    if read_only(conn).await? {
                        return Err(sqlx::Error::Protocol(
                            "the server is read-only (a standby, or a primary being failed over)"
                                .into(),
                        ));
                    }
                    Ok(())
                })
            })
            .before_acquire(|conn, _| {
                Box::pin(async move {
                    if !failover_suspected() {
                        return Ok(true);
                    }
                    Ok(!read_only(conn).await?)
                })
            })
            .connect_with(self.connect)
            .await
            .map_err(unreachable)
    }

    /// One connection, outside any pool.
    pub(super) async fn connection(&self) -> Result<PgConnection> {
        PgConnection::connect_with(&self.connect)
            .await
            .map_err(unreachable)
    }

    pub(super) fn ssl_mode(&self) -> PgSslMode {
        self.connect.get_ssl_mode()
    }
}

/// The driver verifies some certificates with the process's default rustls provider, and
/// this build has two (the driver's ring and the HTTP client's aws-lc-rs): name one, the same
/// the rest of Sabi uses. A default chosen earlier stays.
fn choose_crypto() {
    static CHOSEN: std::sync::Once = std::sync::Once::new();
    CHOSEN.call_once(|| {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    });
}

async fn read_only(conn: &mut PgConnection) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'",
    )
    .fetch_one(conn)
    .await
}

/// When a read-only answer was last seen, process-wide: every pool of the process checks its
/// connections for a while after, which costs one query per hand-out during that time only.
static READ_ONLY_SEEN: Mutex<Option<Instant>> = Mutex::new(None);

/// Notes an error that says the server is read-only (SQLSTATE 25006).
pub(super) fn note_read_only(e: &sqlx::Error) {
    let read_only = e
        .as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code == "25006");
    if read_only {
        tracing::warn!("the store answered read-only (a failover?): reconnecting to a primary");
        *READ_ONLY_SEEN.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }
}

fn failover_suspected() -> bool {
    READ_ONLY_SEEN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some_and(|seen| seen.elapsed() < FAILOVER_WATCH)
}

/// A failed connection attempt, with the setting to change when TLS is at fault.
pub(super) fn unreachable(e: sqlx::Error) -> Error {
    let said = e.to_string();
    match hint(&said) {
        Some(hint) => Error::Unavailable(format!("{said} ({hint})")),
        None => Error::Unavailable(said),
    }
}

/// What to do about a connection error, in plain words.
fn hint(said: &str) -> Option<&'static str> {
    let table: [(&[&str], &str); 8] = [
        (
            &["UnknownIssuer", "unknown issuer"],
            "the server's certificate is not signed by a CA Sabi trusts: name its CA with sslrootcert=/path/to/ca.pem",
        ),
        (
            &["NotValidForName", "not valid for name"],
            "the server's certificate does not carry the host name in the URL: connect by a name it carries, or use sslmode=verify-ca to check the CA only",
        ),
        (
            &["Expired", "expired"],
            "the server's certificate has expired (or this machine's clock is wrong): renew the certificate",
        ),
        (
            &["NotValidYet"],
            "the server's certificate is not valid yet: check this machine's clock",
        ),
        (
            &["no encryption"],
            "the server accepts only TLS connections: use sslmode=require, or verify-full with sslrootcert",
        ),
        (
            &["does not support TLS", "TLS upgrade required"],
            "the server does not offer TLS: enable ssl on the server, or lower sslmode",
        ),
        (
            &["unsupported startup parameter: options"],
            "a pooler refuses startup options: add statement_timeout=0&lock_timeout=0 to the URL and set the timeouts on the role (ALTER ROLE … SET statement_timeout = '10s')",
        ),
        (
            &[
                "certificate required",
                "CertificateRequired",
                "requires a valid client certificate",
            ],
            "the server asks for a client certificate: give sslcert= and sslkey=",
        ),
    ];
    table
        .iter()
        .find(|(signs, _)| signs.iter().any(|sign| said.contains(sign)))
        .map(|(_, hint)| *hint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sabi_settings_are_taken_out_and_libpq_ones_kept() {
        let target = target(
            "postgres://u:p@db.example.com:6432/sabi?sslmode=verify-full&sslrootcert=/ca.pem&max_connections=4&statement_timeout=2s&lock_timeout=0",
        )
        .expect("valid");
        assert_eq!(target.pool_size, 4);
        assert!(matches!(target.ssl_mode(), PgSslMode::VerifyFull));
        assert_eq!(target.connect.get_host(), "db.example.com");
        assert_eq!(target.connect.get_port(), 6432);
        assert_eq!(
            target.connect.get_options(),
            Some("-c statement_timeout=2000")
        );
    }

    #[test]
    fn defaults_prefer_tls_and_bound_statements_and_locks() {
        let target = target("postgres://db/sabi").expect("valid");
        assert_eq!(target.pool_size, DEFAULT_POOL);
        assert!(matches!(target.ssl_mode(), PgSslMode::Prefer));
        assert_eq!(
            target.connect.get_options(),
            Some("-c statement_timeout=10000 -c lock_timeout=5000")
        );
    }

    #[test]
    fn bad_settings_are_refused_with_what_was_expected() {
        for url in [
            "postgres://db/sabi?sslmode=sometimes",
            "postgres://db/sabi?max_connections=0",
            "postgres://db/sabi?statement_timeout=soon",
        ] {
            assert!(target(url).is_err(), "{url}");
        }
    }

    #[test]
    fn certificate_failures_name_the_setting_to_fix() {
        let said = "error communicating with database: invalid peer certificate: UnknownIssuer";
        assert!(hint(said).is_some_and(|h| h.contains("sslrootcert")));
        let said = "invalid peer certificate: certificate not valid for name \"127.0.0.1\"";
        assert!(hint(said).is_some_and(|h| h.contains("verify-ca")));
        assert!(hint("connection refused").is_none());
    }
}
