//! The sender's settings: pacing, retries, and the customer service window.

use std::time::Duration;

use serde::Deserialize;

/// How the sender runs, typed once from configuration.
#[derive(Debug, Clone)]
pub struct SenderSettings {
    /// Requests per second per business number.
    pub rate: u32,
    /// The least time between two messages to one customer.
    pub pair_spacing: Duration,
    /// How long a claimed part is held; a sender that dies mid-send leaves it unknown after.
    pub lease: Duration,
    /// How long an unknown outcome waits for its status webhook before review.
    pub unknown_wait: Duration,
    /// Failed tries before a part goes to review (throttling answers do not count).
    pub max_failures: u32,
    /// The first wait after a failure; doubled after each further one.
    pub retry_base: Duration,
    /// The customer service window: 24 hours.
    pub window: Duration,
    /// Sent instead of a reply outside the window; review when unset.
    pub template: Option<Template>,
    /// Sends in flight at once on this node.
    pub in_flight: usize,
    /// How often the store is asked for parts other nodes wrote.
    pub poll_interval: Duration,
    /// How long sends in flight may take to end at shutdown.
    pub shutdown_grace: Duration,
}

/// A template, sent when the customer service window has closed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Template {
    pub name: String,
    /// Its language code, like `en_US`.
    pub language: String,
    /// Body parameters, in order (positional).
    #[serde(default)]
    pub parameters: Vec<String>,
}
