//! The HTTP server's own defences, below the routes: how long a client may take to send its
//! headers and to read its answers, how long a connection lives, how many requests it carries,
//! how many connections a node and one client address keep open, and a graceful stop.
//!
//! `axum::serve` sets no timeouts and accepts until the process runs out of file descriptors,
//! so a few hundred clients that dribble header bytes can take a node off the air. Here every
//! connection holds a permit (none left: the new connection is closed at once and a warning
//! says so), and one of its address's places (a client's IPv4 address or IPv6 /64; a trusted
//! proxy has none, as it speaks for many clients: its own limit applies). A request whose
//! headers take longer than the header timeout is dropped; so is a connection whose answer
//! the client stops reading (no byte written for the write timeout), which otherwise holds its
//! permit for good while the client pipelines requests it never reads. A connection older
//! than its maximum age takes no new request, and one that has carried its maximum number of
//! requests closes after the last answer; an event stream is exempt from the age (it ends when
//! the client leaves or the node stops, and its connection with it). The body's own deadline
//! and size rules are the routes' (`ingress::bodies`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use ipnet::IpNet;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::Service;

/// What a connection may cost a node.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// From accepting a connection (or the end of its last request) to the end of the next
    /// request's headers; slower clients are dropped.
    pub header_timeout: Duration,
    /// An answer of which the client reads nothing for this long: the connection is dropped.
    pub write_timeout: Duration,
    /// A connection this old takes no new request (event streams excepted); what it is
    /// answering gets `grace` more.
    pub max_age: Duration,
    /// Requests one connection carries; the last answer closes it.
    pub max_requests: usize,
    /// Connections open at once; beyond, new ones are closed at once.
    pub max_connections: usize,
    /// Connections open at once from one address (an IPv6 client's /64); beyond, new ones from
    /// it are closed at once.
    pub per_address: usize,
    /// Peers that speak for many clients: no per-address cap.
    pub trusted_proxies: Vec<IpNet>,
    /// How long a stop waits for open requests (event streams end on their own).
    pub grace: Duration,
}

/// The most a connection buffers of what the client sends ahead (pipelined requests): room
/// for any honest request's headers.
const READ_BUFFER: usize = 64 * 1024;

/// Serves `router` on `listener` until `shutdown` is cancelled.
///
/// # Errors
/// Never for one client's failure; only when the listener itself cannot go on.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let addresses = Arc::new(AddressCounts::default());
    let mut full_since: Option<tokio::time::Instant> = None;
    let mut address_full_since: Option<tokio::time::Instant> = None;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was accepted:
                    // wait a moment rather than spin.
                    tracing::warn!(error.message = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // At most one warning a minute while the node stays full.
            if full_since.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    "connection limit reached: new connections are closed until some end \
                     (ingress.max_connections)"
                );
                full_since = Some(tokio::time::Instant::now());
            }
            drop(stream);
            continue;
        };
        let ip = peer.ip().to_canonical();
        let place = if limits.trusted_proxies.iter().any(|net| net.contains(&ip)) {
            None
        } else {
            match addresses.take(network(ip), limits.per_address) {
                Some(place) => Some(place),
                None => {
                    if address_full_since.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                        tracing::warn!(
                            address = %network(ip),
                            per_address = limits.per_address,
                            "an address holds as many connections as one may: its new ones \
                             are closed (ingress.max_connections_per_address; a proxy in front \
                             belongs in ingress.trusted_proxies)"
                        );
                        address_full_since = Some(tokio::time::Instant::now());
                    }
                    drop(stream);
                    continue;
                }
            }
        };
        let connection = Connection {
            router: router.clone(),
            limits: limits.clone(),
            shutdown: shutdown.clone(),
        };
        tokio::spawn(async move {
            connection.run(stream, peer).await;
            drop((permit, place));
        });
    }
    drop(listener);
    // Every connection holds a permit until it ends: all of them back means all ended.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(limits.grace, permits.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!("some connections were still open at the end of the grace period");
    }
    Ok(())
}

/// One accepted connection and the rules it lives by.
struct Connection {
    router: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
}

impl Connection {
    async fn run(self, stream: tokio::net::TcpStream, peer: std::net::SocketAddr) {
        let Connection {
            router,
            limits,
            shutdown,
        } = self;
        let served = Arc::new(AtomicUsize::new(0));
        let streaming = Arc::new(AtomicBool::new(false));
        let hyper_service = {
            let (served, streaming) = (served.clone(), streaming.clone());
            let max_requests = limits.max_requests;
            hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                let last = served.fetch_add(1, Ordering::Relaxed) + 1 >= max_requests;
                let response = router.clone().call(request.map(axum::body::Body::new));
                let streaming = streaming.clone();
                async move {
                    let Ok(mut response) = response.await;
                    let is_stream = response
                        .headers()
                        .get(header::CONTENT_TYPE)
                        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
                    if is_stream {
                        streaming.store(true, Ordering::Relaxed);
                    }
                    // An event stream's connection ends with it: exempt from the age, it
                    // carries nothing after.
                    if last || is_stream {
                        response
                            .headers_mut()
                            .insert(header::CONNECTION, HeaderValue::from_static("close"));
                    }
                    Ok::<_, Infallible>(response)
                }
            })
        };
        let io = TokioIo::new(WriteDeadline::new(stream, limits.write_timeout));
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_buf_size(READ_BUFFER)
            .keep_alive(true)
            .serve_connection(io, hyper_service);
        let mut connection = std::pin::pin!(connection);
        let aged = tokio::time::sleep(limits.max_age);
        let stopping = tokio::select! {
            ended = connection.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(error.message = %e, %peer, "connection ended with an error");
                }
                return;
            }
            () = shutdown.cancelled() => true,
            () = aged => false,
        };
        // No new request; the one under way is answered.
        connection.as_mut().graceful_shutdown();
        if stopping {
            // The node's grace period bounds this; event streams end on their own.
            let _ = connection.await;
            return;
        }
        loop {
            match tokio::time::timeout(limits.grace, connection.as_mut()).await {
                Ok(_) => return,
                // An event stream lives until its client leaves or the node stops.
                Err(_) if streaming.load(Ordering::Relaxed) => {}
                Err(_) => {
                    tracing::debug!(%peer, "a connection past its age was cut off");
                    return;
                }
            }
        }
    }
}

/// The key a per-address count is kept under: an IPv6 client's /64, since one subscriber
/// holds a whole /64 and could take a new address per connection.
pub fn network(client: IpAddr) -> IpAddr {
    match client.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(std::net::Ipv6Addr::from(prefix))
        }
        v4 => v4,
    }
}

/// Open connections per address.
#[derive(Default)]
struct AddressCounts {
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl AddressCounts {
    /// A place for one more connection from `key`, if it has fewer than `cap`.
    fn take(self: &Arc<Self>, key: IpAddr, cap: usize) -> Option<AddressPlace> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(key).or_default();
        if *count >= cap {
            return None;
        }
        *count += 1;
        Some(AddressPlace {
            counts: self.clone(),
            key,
        })
    }
}

/// One connection's place among its address's; given back when dropped.
struct AddressPlace {
    counts: Arc<AddressCounts>,
    key: IpAddr,
}

impl Drop for AddressPlace {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// A socket on which a write that makes no progress for `timeout` fails: the client stopped
/// reading its answers.
struct WriteDeadline<S> {
    io: S,
    timeout: Duration,
    /// Running since the first write that could not go on.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    fn new(io: S, timeout: Duration) -> Self {
        WriteDeadline {
            io,
            timeout,
            stalled: None,
        }
    }

    fn progress<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => {
                let timeout = self.timeout;
                let stalled = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match stalled.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client read none of its answer within ingress.write_timeout",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.progress(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.progress(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.progress(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_shutdown(cx);
        this.progress(cx, polled)
    }
}

/// Raises this process's open-file limit to its hard limit (each connection is one), and
/// returns the limit now in force.
pub fn raise_fd_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(e) => {
            tracing::warn!(error.message = %e, "could not raise the open-file limit");
            fd_limit()
        }
    }
}

/// This process's open-file limit now.
pub fn fd_limit() -> u64 {
    rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft)
}

/// How many connections fit in `fd_limit` open files, keeping room for the store, the logs and
/// the node's own outgoing connections.
pub fn connections_within(fd_limit: u64, wanted: usize) -> usize {
    const RESERVED: u64 = 256;
    let budget = usize::try_from(fd_limit.saturating_sub(RESERVED).max(64)).unwrap_or(usize::MAX);
    wanted.min(budget)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_client_is_counted_by_its_64() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("address");
        assert_eq!(network(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(
            network(ip("2001:db8:1:2:ffff::9")),
            network(ip("2001:db8:1:2::1"))
        );
        assert_ne!(
            network(ip("2001:db8:1:3::1")),
            network(ip("2001:db8:1:2::1"))
        );
        assert_eq!(network(ip("203.0.113.7")), ip("203.0.113.7"));
        assert_eq!(network(ip("::ffff:203.0.113.7")), ip("203.0.113.7"));
    }

    #[test]
    fn an_address_gets_its_places_back_when_its_connections_end() {
        let counts = Arc::new(AddressCounts::default());
        let a = "203.0.113.7".parse().expect("address");
        let b = "198.51.100.1".parse().expect("address");
        let first = counts.take(a, 2).expect("first");
        let _second = counts.take(a, 2).expect("second");
        assert!(counts.take(a, 2).is_none());
        assert!(counts.take(b, 2).is_some(), "another address has its own");
        drop(first);
        assert!(counts.take(a, 2).is_some());
    }
}
