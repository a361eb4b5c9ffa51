//! The way to Redis: what `SABI_STORE` names, and one clonable connection that pipelines every
//! caller's commands: to one server (a primary, or a proxy in front of one), made again in the
//! background after it drops; or to a Redis Cluster, following its slot map.

use std::path::PathBuf;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, TlsCertificates, Value};

use super::unavailable;
use crate::store::{Error, Result};

/// Commands fail fast while the server is away (the ingress answers 503).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// What `SABI_STORE=redis://…` (or `rediss://…`, over TLS) says: the server, and Sabi's own
/// options in its query, which the driver does not see: `prefix=NAME` for the keys,
/// `durability=warn|require`, `ca=PATH` for a CA certificate to trust instead of the system's,
/// and `cluster=true` when the server is a node of a Redis Cluster.
#[derive(Debug, PartialEq)]
pub(super) struct Target {
    pub(super) server: String,
    pub(super) tag: String,
    pub(super) require_durable: bool,
    pub(super) ca: Option<PathBuf>,
    pub(super) cluster: bool,
}

impl Target {
    pub(super) fn parse(url: &str) -> Result<Target> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept = Vec::new();
        let mut prefix = "sabi";
        let (mut require_durable, mut cluster, mut ca) = (false, false, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("prefix", name)) => prefix = name,
                Some(("ca", path)) => ca = Some(path.into()),
                Some(("durability", "warn")) => require_durable = false,
                Some(("durability", "require")) => require_durable = true,
                Some(("cluster", flag)) => cluster = yes(flag, "cluster")?,
                Some(("durability", other)) => {
                    return Err(Error::Unavailable(format!(
                        "durability={other:?}: expected warn or require"
                    )));
                }
                _ => kept.push(pair),
            }
        }
        if prefix.is_empty() || prefix.contains(['{', '}']) {
            return Err(Error::Unavailable(format!(
                "prefix={prefix:?}: a key prefix is a non-empty name without braces"
            )));
        }
        let server = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok(Target {
            server,
            tag: format!("{{{prefix}}}"),
            require_durable,
            ca,
            cluster,
        })
    }

    /// A client of the named server alone (for its settings, or the single-server mode).
    pub(super) fn client(&self) -> Result<redis::Client> {
        match self.certificates()? {
            None => redis::Client::open(self.server.as_str()).map_err(unavailable),
            Some(certificates) => redis::Client::build_with_tls(self.server.as_str(), certificates)
                .map_err(unavailable),
        }
    }

    /// Over TLS: the CA to trust instead of the system's, when one is named.
    fn certificates(&self) -> Result<Option<TlsCertificates>> {
        let Some(ca) = &self.ca else {
            return Ok(None);
        };
        let root = std::fs::read(ca).map_err(|e| {
            Error::Unavailable(format!("reading the CA certificate {}: {e}", ca.display()))
        })?;
        Ok(Some(TlsCertificates {
            client_tls: None,
            root_cert: Some(root),
        }))
    }
}

fn yes(flag: &str, name: &str) -> Result<bool> {
    match flag {
        "true" | "yes" | "1" => Ok(true),
        "false" | "no" | "0" => Ok(false),
        other => Err(Error::Unavailable(format!(
            "{name}={other:?}: expected true or false"
        ))),
    }
}

#[derive(Clone)]
pub(super) enum Connection {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connection {
    pub(super) async fn open(target: &Target) -> Result<Connection> {
        choose_crypto();
        if !target.cluster {
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_secs(1));
            let manager = ConnectionManager::new_with_config(target.client()?, config)
                .await
                .map_err(unavailable)?;
            return Ok(Connection::Server(manager));
        }
        // The node named is where the cluster's map is first read; the rest are found there.
        let mut builder = ClusterClient::builder(vec![target.server.as_str()])
            .connection_timeout(CONNECT_TIMEOUT)
            .response_timeout(RESPONSE_TIMEOUT)
            .retries(2);
        if let Some(certificates) = target.certificates()? {
            builder = builder.certs(certificates);
        }
        let client = builder.build().map_err(unavailable)?;
        let cluster = client.get_async_connection().await.map_err(unavailable)?;
        Ok(Connection::Cluster(cluster))
    }
}

/// The driver's TLS asks rustls for the process's default provider, and this build has two
/// (the PostgreSQL driver's ring and the HTTP client's aws-lc-rs): name one, the same the rest
/// of Sabi uses. A default chosen earlier stays.
fn choose_crypto() {
    static CHOSEN: std::sync::Once = std::sync::Once::new();
    CHOSEN.call_once(|| {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    });
}

impl Connection {
    /// `CONFIG GET name` on the server, or in a cluster on the primary of `key`'s slot (the
    /// node that holds the deployment's keys). `None` when the server does not allow it.
    pub(super) async fn config_get(&mut self, key: &str, name: &str) -> Option<String> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(name);
        let reply: Value = match self {
            Connection::Server(c) => cmd.query_async(c).await.ok()?,
            Connection::Cluster(c) => {
                let slot: u16 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(key)
                    .query_async(c)
                    .await
                    .ok()?;
                let owner = Route::new(slot, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(owner));
                c.route_command(cmd, routing).await.ok()?
            }
        };
        let pair: Vec<String> = redis::from_redis_value(reply).ok()?;
        pair.into_iter().nth(1)
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Server(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Server(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Server(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sabi_options_are_taken_out_of_the_url() {
        let url =
            "redis://:pw@host:6380/2?prefix=shop&durability=require&protocol=resp3&cluster=true";
        let t = Target::parse(url).expect("parses");
        assert_eq!(
            t,
            Target {
                server: "redis://:pw@host:6380/2?protocol=resp3".into(),
                tag: "{shop}".into(),
                require_durable: true,
                ca: None,
                cluster: true,
            }
        );
        let plain = Target::parse("redis://127.0.0.1").expect("parses");
        assert_eq!(plain.tag, "{sabi}");
        assert!(!plain.require_durable && !plain.cluster);
        assert!(Target::parse("redis://h?durability=maybe").is_err());
        assert!(Target::parse("redis://h?cluster=perhaps").is_err());
        assert!(Target::parse("redis://h?prefix={x}").is_err());
    }
}
