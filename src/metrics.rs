//! Metrics: counters and histograms of what flows through Sabi, in Prometheus text format at
//! `GET /metrics`. One registry per process, shared by the ingress and the scheduler.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub outcome: String,
}

pub struct Metrics {
    registry: Registry,
    /// Webhook requests by how they were answered (stored, bad_signature, not_json, ...).
    pub webhooks: Family<Outcome, Counter>,
    /// Inbound items stored for the first time, duplicates, and quarantined parts.
    pub items_stored: Counter,
    pub duplicates: Counter,
    pub quarantined: Counter,
    /// Seconds from a webhook's arrival to its acknowledgement (store commit included).
    pub ack_seconds: Histogram,
    /// Web-chat questions by outcome (accepted, duplicate, busy, too_fast, invalid).
    pub chat_questions: Family<Outcome, Counter>,
    /// Turns by how they ended (replied, handoff, retry, too_old, out_of_retries, lease_lost).
    pub turns: Family<Outcome, Counter>,
    /// Batches claimed again after a lapsed lease or a failure (attempt > 1).
    pub reclaims: Counter,
    /// Sends by result (accepted, accepted_template, throttled, retry, unknown, review, halted).
    pub sends: Family<Outcome, Counter>,
    /// Graph API errors by Meta's code.
    pub send_errors: Family<Outcome, Counter>,
    /// Sends that waited for their number's rate.
    pub rate_limit_waits: Counter,
    /// Business numbers halted because their token was refused (190): an alert.
    pub halted_numbers: Gauge,
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        let mut registry = Registry::default();
        let webhooks = Family::<Outcome, Counter>::default();
        let items_stored = Counter::default();
        let duplicates = Counter::default();
        let quarantined = Counter::default();
        // 100 µs to ~3 s.
        let ack_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        let chat_questions = Family::<Outcome, Counter>::default();
        let turns = Family::<Outcome, Counter>::default();
        let reclaims = Counter::default();
        let sends = Family::<Outcome, Counter>::default();
        let send_errors = Family::<Outcome, Counter>::default();
        let rate_limit_waits = Counter::default();
        let halted_numbers = Gauge::default();
        registry.register("sabi_sends", "Sends by result", sends.clone());
        registry.register(
            "sabi_send_errors",
            "Graph API errors by Meta's code",
            send_errors.clone(),
        );
        registry.register(
            "sabi_rate_limit_waits",
            "Sends that waited for their number's rate",
            rate_limit_waits.clone(),
        );
        registry.register(
            "sabi_halted_numbers",
            "Business numbers halted because the access token was refused (alert when above 0)",
            halted_numbers.clone(),
        );
        registry.register(
            "sabi_webhook_requests",
            "Webhook requests by outcome",
            webhooks.clone(),
        );
        registry.register(
            "sabi_items_stored",
            "Inbound items stored for the first time",
            items_stored.clone(),
        );
        registry.register(
            "sabi_duplicates",
            "Redelivered items that changed nothing",
            duplicates.clone(),
        );
        registry.register(
            "sabi_quarantined",
            "Parts of unknown shape kept raw",
            quarantined.clone(),
        );
        registry.register(
            "sabi_ingest_ack_seconds",
            "Webhook arrival to acknowledgement, store commit included",
            ack_seconds.clone(),
        );
        registry.register(
            "sabi_chat_questions",
            "Web-chat questions by outcome",
            chat_questions.clone(),
        );
        registry.register("sabi_turns", "Turns by how they ended", turns.clone());
        registry.register(
            "sabi_reclaims",
            "Batches claimed again after a lapsed lease or a failure",
            reclaims.clone(),
        );
        Arc::new(Metrics {
            registry,
            webhooks,
            items_stored,
            duplicates,
            quarantined,
            ack_seconds,
            chat_questions,
            turns,
            reclaims,
            sends,
            send_errors,
            rate_limit_waits,
            halted_numbers,
        })
    }

    /// Counts one more of `outcome` in `family`.
    pub fn count(family: &Family<Outcome, Counter>, outcome: &str) {
        family
            .get_or_create(&Outcome {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
