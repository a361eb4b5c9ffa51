//! App: opens the store, binds the listener, and runs the HTTP server until told to stop.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::clock::{SharedClock, SystemClock};
use crate::config::Config;
use crate::ingress::{self, Ingress};
use crate::store::{self, Store};

pub struct App {
    listener: TcpListener,
    router: axum::Router,
    store: Arc<dyn Store>,
    shutdown: CancellationToken,
}

impl App {
    /// Opens the configured store and binds the configured address (port 0 picks a free one).
    ///
    /// # Errors
    /// When the store cannot be opened or the address cannot be bound.
    pub async fn build(config: &Config) -> anyhow::Result<App> {
        App::build_with_clock(config, Arc::new(SystemClock)).await
    }

    /// [`App::build`] with a given clock, for tests that drive time.
    ///
    /// # Errors
    /// As [`App::build`].
    pub async fn build_with_clock(config: &Config, clock: SharedClock) -> anyhow::Result<App> {
        let store = store::open(&config.store)
            .await
            .context("opening the store")?;
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        let state = Ingress::new(config, store.clone(), clock);
        let router = ingress::router(state, config.ingress.max_body_bytes);
        if config.whatsapp.app_secret.is_none() {
            tracing::warn!(
                "no WhatsApp app secret configured: sandbox mode accepts webhooks signed with the sandbox secret"
            );
        }
        Ok(App {
            listener,
            router,
            store,
            shutdown: CancellationToken::new(),
        })
    }

    /// The address actually bound.
    ///
    /// # Errors
    /// When the socket has no local address (it always has once bound).
    pub fn addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// Cancelling this token stops the app gracefully.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Serves until the shutdown token is cancelled, then lets in-flight requests finish.
    ///
    /// # Errors
    /// When the server fails.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let addr = self.addr()?;
        tracing::info!(%addr, "sabi listening");
        let shutdown = self.shutdown.clone();
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await
            .context("serving HTTP")?;
        tracing::info!("sabi stopped");
        Ok(())
    }
}
