//! Ingress: the HTTP edge. Nothing slow happens here.
//!
//! Each route reads its input, turns it into domain values, makes one store call and answers.
//! The WhatsApp webhook acknowledges only what the store has durably kept.

mod health;
pub mod whatsapp;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::get;

use crate::clock::SharedClock;
use crate::config::Config;
use crate::store::Store;
use crate::worker::Wakeup;

/// What every route may use.
pub struct Ingress {
    pub store: Arc<dyn Store>,
    pub clock: SharedClock,
    pub whatsapp: whatsapp::Settings,
    /// Wakes this process's scheduler when new work is due sooner than it planned to look.
    pub wakeup: Arc<Wakeup>,
}

pub type AppState = Arc<Ingress>;

impl Ingress {
    pub fn new(
        config: &Config,
        store: Arc<dyn Store>,
        clock: SharedClock,
        wakeup: Arc<Wakeup>,
    ) -> AppState {
        Arc::new(Ingress {
            store,
            clock,
            whatsapp: whatsapp::Settings::from_config(config),
            wakeup,
        })
    }
}

/// Every route of the HTTP server.
pub fn router(state: AppState, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route(
            "/webhook/whatsapp",
            get(whatsapp::verify).post(whatsapp::receive),
        )
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
}
