//! The HTTP server's own defences, below the routes: how long a client may take to send its
//! headers, how many connections a node keeps open, and a graceful stop.
//!
//! `axum::serve` sets no timeouts and accepts until the process runs out of file descriptors,
//! so a few hundred clients that dribble header bytes can take a node off the air. Here every
//! connection holds a permit (none left: the new connection is closed at once and a warning
//! says so), and a request whose headers take longer than the header timeout is dropped. The
//! body's own deadline and size rules are the routes' (`ingress::bodies`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::Service;

/// What a connection may cost a node.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// From accepting a connection (or the end of its last request) to the end of the next
    /// request's headers; slower clients are dropped.
    pub header_timeout: Duration,
    /// Connections open at once; beyond, new ones are closed at once.
    pub max_connections: usize,
    /// How long a stop waits for open requests (event streams end on their own).
    pub grace: Duration,
}

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
    let graceful = GracefulShutdown::new();
    let mut full_since: Option<tokio::time::Instant> = None;
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
        let router = router.clone();
        let hyper_service =
            hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                let response = router.clone().call(request.map(axum::body::Body::new));
                async move { Ok::<_, Infallible>(response.await.unwrap_or_else(|e| match e {})) }
            });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .keep_alive(true)
            .serve_connection(TokioIo::new(stream), hyper_service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error.message = %e, %peer, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("some connections were still open at the end of the grace period");
    }
    Ok(())
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
