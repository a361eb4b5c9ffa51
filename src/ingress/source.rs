//! Defence in depth for the webhook: an allow-list of source networks (Meta publishes its
//! webhook ranges; the list is configuration), checked against the peer's address, or, only
//! when the peer is a configured trusted proxy, against the client it names in
//! `X-Forwarded-For`. A refused request answers 403 and is counted; the signature check still
//! follows for everything allowed.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use ipnet::IpNet;

use super::AppState;
use crate::ingress::ApiError;
use crate::metrics::Metrics;

/// Who may call the webhook.
#[derive(Debug, Clone, Default)]
pub struct SourcePolicy {
    pub allow: Vec<IpNet>,
    pub trusted_proxies: Vec<IpNet>,
}

impl SourcePolicy {
    /// The address the request comes from: the peer, unless the peer is a trusted proxy; then
    /// the right-most `X-Forwarded-For` entry that is not itself a trusted proxy.
    pub fn client(&self, peer: IpAddr, forwarded_for: Option<&str>) -> Option<IpAddr> {
        let peer = peer.to_canonical();
        if !self.trusted(peer) {
            return Some(peer);
        }
        let Some(chain) = forwarded_for else {
            return Some(peer);
        };
        for hop in chain.rsplit(',').map(str::trim) {
            // An entry that is not an address makes the whole chain untrustworthy.
            let ip = hop_address(hop)?;
            if !self.trusted(ip) {
                return Some(ip);
            }
        }
        Some(peer)
    }

    pub fn allows(&self, peer: IpAddr, forwarded_for: Option<&str>) -> bool {
        self.allow.is_empty()
            || self
                .client(peer, forwarded_for)
                .is_some_and(|ip| self.allow.iter().any(|net| net.contains(&ip)))
    }

    fn trusted(&self, ip: IpAddr) -> bool {
        self.trusted_proxies.iter().any(|net| net.contains(&ip))
    }
}

/// One `X-Forwarded-For` entry: an address, possibly with a port (`1.2.3.4:5678`,
/// `[2001:db8::1]:443`).
fn hop_address(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    hop.parse::<SocketAddr>()
        .ok()
        .map(|addr| addr.ip().to_canonical())
}

/// Every `X-Forwarded-For` line, in order, as one chain: a proxy may add its own line after
/// one the client sent.
pub(super) fn forwarded_for(headers: &HeaderMap) -> Option<String> {
    let lines: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!lines.is_empty()).then(|| lines.join(","))
}

pub(super) async fn guard(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let chain = forwarded_for(request.headers());
    if !state.source.allows(peer.ip(), chain.as_deref()) {
        Metrics::count(&state.metrics.webhooks, "forbidden_source");
        return Err(ApiError::ForbiddenSource);
    }
    Ok(next.run(request).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> SourcePolicy {
        let nets = |list: &[&str]| list.iter().filter_map(|n| n.parse().ok()).collect();
        SourcePolicy {
            allow: nets(&["31.13.24.0/21", "2a03:2880::/29"]),
            trusted_proxies: nets(&["10.0.0.0/8"]),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn the_peer_decides_unless_it_is_a_trusted_proxy() {
        let p = policy();
        assert!(p.allows(ip("31.13.24.9"), None));
        assert!(!p.allows(ip("8.8.8.8"), None));
        // An untrusted peer's header changes nothing.
        assert!(!p.allows(ip("8.8.8.8"), Some("31.13.24.9")));
        // Behind a trusted proxy, the right-most untrusted hop is the client.
        assert!(p.allows(ip("10.1.2.3"), Some("8.8.8.8, 31.13.24.9")));
        assert!(!p.allows(ip("10.1.2.3"), Some("31.13.24.9, 8.8.8.8")));
        assert!(p.allows(ip("10.1.2.3"), Some("31.13.24.9, 10.9.9.9")));
        assert!(!p.allows(ip("10.1.2.3"), Some("31.13.24.9, junk")));
        assert!(p.allows(ip("2a03:2880::1"), None));
        assert!(p.allows(ip("::ffff:31.13.24.9"), None), "IPv4-mapped peers");
        assert!(
            p.allows(ip("10.1.2.3"), Some("8.8.8.8, 31.13.24.9:443")),
            "ports"
        );
        assert!(p.allows(ip("::ffff:10.1.2.3"), Some("31.13.24.9")));
        assert!(SourcePolicy::default().allows(ip("8.8.8.8"), None));
    }
}
