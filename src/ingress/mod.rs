//! Ingress: the HTTP edge. Nothing slow happens here.
//!
//! Each route reads its input, turns it into domain values, makes one store call and answers.
//! The WhatsApp webhook acknowledges only what the store has durably kept.

mod admin;
mod bodies;
mod broadcasts;
mod desk;
mod error;
mod headers;
mod health;
mod source;
mod webchat;
pub mod whatsapp;

pub use self::admin::{conversation_json, review_json};
pub use self::error::{AddressRule, ApiError};
pub use self::source::SourcePolicy;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{any, get, post};
use axum::{Router, middleware};
use secrecy::SecretString;
use tokio::sync::Notify;

use crate::broadcast::plan::Preflight;
use crate::clock::SharedClock;
use crate::config::{BroadcastSettings, Config, IngressConfig};
use crate::desk::HelpDesk;
use crate::domain::BatchPolicy;
use crate::metrics::Metrics;
use crate::store::Store;
use crate::worker::{ChatSignals, Wakeup};

/// What every route may use.
pub struct Ingress {
    pub store: Arc<dyn Store>,
    pub clock: SharedClock,
    pub whatsapp: whatsapp::Settings,
    pub webchat: WebchatSettings,
    /// Wakes this process's scheduler when new work is due sooner than it planned to look.
    pub wakeup: Arc<Wakeup>,
    /// Wakes this process's sender when a person's reply is queued.
    pub outbox: Arc<Notify>,
    pub metrics: Arc<Metrics>,
    pub admin: AdminSettings,
    /// Who may call the webhook.
    pub source: SourcePolicy,
    /// The help desk hand-offs go to (`[handoff]`), when there is one.
    pub desk: Option<HelpDesk>,
}

/// The admin API's settings.
pub struct AdminSettings {
    /// No token: the admin API is off.
    pub token: Option<SecretString>,
    /// Replies are kept, never sent (no access token).
    pub sandbox: bool,
    /// How long a person's reply holds the conversation (`engine.human_hold`).
    pub human_hold: std::time::Duration,
    /// Set: `/metrics` needs it as a bearer token.
    pub metrics_token: Option<SecretString>,
    /// What a person may label a turn's messages as: the router's intents (none when the
    /// router is off).
    pub intents: Vec<String>,
    /// Checks a broadcast's template with Meta; `None` in sandbox mode or without a business
    /// account id.
    pub preflight: Option<Preflight>,
    pub broadcasts: BroadcastSettings,
    /// A broadcast report's prices by country prefix, and their currency.
    pub prices: std::collections::BTreeMap<String, f64>,
    pub currency: String,
    /// The country code of numbers written the local way (`whatsapp.default_country`).
    pub default_country: Option<String>,
    /// What Meta charges per WhatsApp message (`whatsapp.prices`).
    pub message_prices: crate::config::MessagePrices,
}

pub type AppState = Arc<Ingress>;

/// How the routes reach this node's workers.
pub struct WorkerLinks {
    pub wakeup: Arc<Wakeup>,
    pub outbox: Arc<Notify>,
    pub chat: Arc<ChatSignals>,
}

impl Ingress {
    pub fn new(
        config: &Config,
        store: Arc<dyn Store>,
        clock: SharedClock,
        links: WorkerLinks,
        metrics: Arc<Metrics>,
        intents: Option<Arc<crate::router::Router>>,
        desk: Option<HelpDesk>,
    ) -> AppState {
        Arc::new(Ingress {
            store,
            clock,
            whatsapp: whatsapp::Settings::from_config(config, intents.clone()),
            webchat: WebchatSettings::from_config(config, links.chat, intents.clone()),
            wakeup: links.wakeup,
            outbox: links.outbox,
            metrics,
            admin: AdminSettings {
                token: config.admin.token.clone(),
                sandbox: config.whatsapp.sandbox(),
                human_hold: config.engine.human_hold,
                metrics_token: config.admin.metrics_token.clone(),
                intents: intents.as_ref().map(|r| r.labels()).unwrap_or_default(),
                preflight: Preflight::from_config(config).unwrap_or_else(|e| {
                    tracing::warn!(error.message = %e, "no Graph API client: broadcast templates go unchecked");
                    None
                }),
                broadcasts: config.broadcast_settings(),
                prices: config.broadcast.prices.clone(),
                currency: config.broadcast.currency.clone(),
                default_country: config.whatsapp.default_country.clone(),
                // Validated at start.
                message_prices: config.message_prices().unwrap_or_default(),
            },
            source: SourcePolicy {
                allow: config.ingress.webhook_allow.clone(),
                trusted_proxies: config.ingress.trusted_proxies.clone(),
            },
            desk,
        })
    }
}

/// The web chat's settings, typed once at start.
pub struct WebchatSettings {
    pub policy: BatchPolicy,
    pub site: String,
    pub result_ttl: std::time::Duration,
    pub max_queue: usize,
    pub per_session_per_minute: usize,
    /// Questions per client address; `None`: no limit.
    pub per_address: Option<webchat::AddressLimit>,
    /// New sessions per client address; `None`: no limit.
    pub new_sessions: Option<webchat::AddressLimit>,
    /// Anonymous requests for a person per client address, and every anonymous review item
    /// of any reason (the worker spends its tokens); `None`: no limit.
    pub handoffs: Option<Arc<webchat::AddressLimit>>,
    /// Tells which questions ask for a person; `None` when the router is off.
    pub router: Option<Arc<crate::router::Router>>,
    pub queue: webchat::QueueGauge,
    /// One permit per open event stream.
    pub streams: Arc<tokio::sync::Semaphore>,
    /// Open event streams per session and per client address.
    pub stream_counts: Arc<webchat::StreamCounts>,
    /// Told when this node starts or ends a session's turn.
    pub signals: Arc<ChatSignals>,
    /// Checks a signed-in visitor's `user_hash`; unset: every visitor is anonymous.
    pub identity_secret: Option<secrecy::SecretString>,
    /// Who may frame the chat page.
    pub frame_ancestors: String,
}

impl WebchatSettings {
    fn from_config(
        config: &Config,
        signals: Arc<ChatSignals>,
        router: Option<Arc<crate::router::Router>>,
    ) -> WebchatSettings {
        let webchat = &config.webchat;
        let handoffs =
            webchat::AddressLimit::per_hour(webchat.handoffs_per_address_per_hour).map(Arc::new);
        // Every anonymous review item this node's turns make counts against its address's
        // hand-off bucket, whatever its reason (a model's unfit answers too).
        if let Some(handoffs) = &handoffs {
            let handoffs = handoffs.clone();
            signals.on_anonymous_item(move |address| handoffs.spend(address));
        }
        WebchatSettings {
            policy: webchat.batch_policy(),
            site: webchat.site.clone(),
            result_ttl: webchat.result_ttl,
            max_queue: webchat.max_queue,
            per_session_per_minute: webchat.per_session_per_minute,
            per_address: webchat::AddressLimit::per_minute(webchat.per_address_per_minute),
            new_sessions: webchat::AddressLimit::per_hour(
                webchat.new_sessions_per_address_per_hour,
            ),
            handoffs,
            router,
            queue: webchat::QueueGauge::default(),
            // Each stream is an open connection: never more than the open files allow.
            streams: Arc::new(tokio::sync::Semaphore::new(
                crate::http::serve::connections_within(
                    crate::http::serve::fd_limit(),
                    webchat.max_streams,
                ),
            )),
            stream_counts: Arc::default(),
            signals,
            identity_secret: webchat.identity_secret.clone(),
            frame_ancestors: webchat.frame_ancestors.clone(),
        }
    }
}

/// Every route of the HTTP server.
pub fn router(state: AppState, limits: &IngressConfig) -> Router {
    // The webhook's large bodies have places of their own: nothing posted elsewhere (an
    // admin's audience upload) can make Meta's webhooks wait.
    let webhook_large = Arc::new(tokio::sync::Semaphore::new(limits.max_large_bodies));
    let large = Arc::new(tokio::sync::Semaphore::new(limits.max_large_bodies));
    let per_address = Arc::new(bodies::AddressBudget::new(
        limits.max_body_bytes_per_address,
        state.source.clone(),
    ));
    let bodies = |max_bytes: usize, large: &Arc<tokio::sync::Semaphore>, counted: bool| {
        let rules = Arc::new(bodies::BodyRules {
            max_bytes,
            timeout: limits.body_timeout,
            large: large.clone(),
            per_address: counted.then(|| per_address.clone()),
        });
        middleware::from_fn_with_state(rules, bodies::guard)
    };
    let max_body_bytes = limits.max_body_bytes;
    let mut webhook = Router::new()
        .route(
            "/webhook/whatsapp",
            get(whatsapp::verify).post(whatsapp::receive),
        )
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(bodies(max_body_bytes, &webhook_large, true));
    if !state.source.allow.is_empty() {
        webhook = webhook.layer(middleware::from_fn_with_state(state.clone(), source::guard));
    }
    // The help desk's webhook is signed, and comes from the desk's servers, not Meta's.
    let desk_hook = Router::new()
        .route("/webhook/chatwoot", post(desk::chatwoot))
        .route("/webhook/desk", post(desk::webhook))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(bodies(max_body_bytes, &large, true));
    let webchat = Router::new()
        .route("/", get(webchat::page))
        .route("/chat", post(webchat::submit))
        .route("/chat/history", get(webchat::history))
        .route("/chat/session", get(webchat::feed))
        .route("/chat/session/events", get(webchat::session_events))
        .route("/chat/{job_id}", get(webchat::status))
        .route("/chat/{job_id}/events", get(webchat::events))
        .route("/openapi.json", get(webchat::openapi))
        .layer(DefaultBodyLimit::max(WEBCHAT_MAX_BODY))
        .layer(bodies(WEBCHAT_MAX_BODY, &large, true));
    let mut routes = Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route(
            "/metrics",
            get(health::metrics).layer(middleware::from_fn_with_state(
                state.clone(),
                admin::require_metrics_token,
            )),
        )
        .merge(webhook)
        .merge(desk_hook)
        .merge(webchat);
    if state.admin.token.is_some() {
        let api = Router::new()
            .route("/admin/review", get(admin::list))
            .route("/admin/review/{id}", get(admin::show))
            .route("/admin/review/{id}/reply", post(admin::reply))
            .route("/admin/review/{id}/requeue", post(admin::requeue))
            .route("/admin/review/{id}/close", post(admin::close))
            .route("/admin/review/{id}/label", post(admin::label))
            .route("/admin/conversations", get(admin::conversations))
            .route("/admin/stats", get(admin::stats))
            .route(
                "/admin/customers/{channel}/{id}",
                get(admin::export_customer).delete(admin::forget_customer),
            )
            .route("/admin/broadcasts/{id}", get(broadcasts::show))
            .route(
                "/admin/broadcasts/{id}/recipients",
                get(broadcasts::recipients),
            )
            .route("/admin/broadcasts/{id}/report", get(broadcasts::report))
            .route("/admin/broadcasts/{id}/pause", post(broadcasts::pause))
            .route("/admin/broadcasts/{id}/resume", post(broadcasts::resume))
            .route("/admin/broadcasts/{id}/cancel", post(broadcasts::cancel))
            // The token first, then the body: nobody without it makes Sabi read a byte.
            .route_layer(bodies(WEBCHAT_MAX_BODY, &large, false))
            // Only on the admin routes: a layer would also guard the fallback, and every
            // unknown path (a browser's /favicon.ico) would answer 401 instead of 404.
            .route_layer(middleware::from_fn_with_state(
                state.clone(),
                admin::require_token,
            ))
            .layer(DefaultBodyLimit::max(WEBCHAT_MAX_BODY));
        // An audience file is larger than anything else a person posts.
        let audiences = Router::new()
            .route(
                "/admin/broadcasts",
                get(broadcasts::list).post(broadcasts::create),
            )
            .route_layer(bodies(AUDIENCE_MAX_BODY, &large, false))
            .route_layer(middleware::from_fn_with_state(
                state.clone(),
                admin::require_token,
            ))
            .layer(DefaultBodyLimit::max(AUDIENCE_MAX_BODY));
        routes = routes
            .merge(api)
            .merge(audiences)
            .route("/desk", get(admin::desk));
    } else {
        // Off, said as the API's errors are said, rather than an empty 404.
        routes = routes
            .route("/admin", any(admin::disabled))
            .route("/admin/{*path}", any(admin::disabled))
            .route("/desk", any(admin::disabled));
    }
    let policies = Arc::new(headers::Policies::new(&state.webchat.frame_ancestors));
    routes
        .with_state(state)
        .layer(middleware::from_fn_with_state(policies, headers::secure))
}

/// A chat question is at most a few kilobytes.
const WEBCHAT_MAX_BODY: usize = 64 * 1024;
/// An audience of 100,000 customers with a few parameters each.
const AUDIENCE_MAX_BODY: usize = 16 * 1024 * 1024;
