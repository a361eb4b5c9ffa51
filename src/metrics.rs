//! Metrics: counters and histograms of what flows through Sabi, in Prometheus text format at
//! `GET /metrics`. One registry per process, shared by the ingress and the scheduler.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::store::{BroadcastState, BroadcastView, Gauges};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub outcome: String,
}

/// What kind of data a sweep removed (`turns`, `messages`, `statuses`, ...).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Swept {
    pub kind: String,
}

/// How the router decided: its tier, and who answers (`local`, `agent`, `handoff`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Routed {
    pub tier: String,
    pub decision: String,
}

/// A broadcast's recipients in one state.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BroadcastRecipients {
    pub broadcast: String,
    pub state: String,
}

/// Meta's pricing category and type of a message (`regular`, `free_customer_service`,
/// `free_entry_point`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Priced {
    pub category: String,
    pub r#type: String,
}

/// `prompt` or `completion`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenKind {
    pub kind: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

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
    /// Sends whose lease lapsed with no outcome (their sender died or hung mid-request).
    pub sends_lapsed: Counter,
    /// Read receipts by result (sent, coalesced, failed).
    pub receipts: Family<Outcome, Counter>,
    /// Conversations whose latest answered message waits to be marked read.
    pub receipts_waiting: Gauge,
    /// Business numbers halted because their token was refused (190): an alert.
    pub halted_numbers: Gauge,
    /// Messages per batch.
    pub batch_messages: Histogram,
    /// A turn's time from claim to its recorded end, by how it ended.
    pub turn_seconds: HistogramFamily<Outcome>,
    /// Batches routed, by tier and decision.
    pub routed: Family<Routed, Counter>,
    /// Model tokens, and their estimated cost.
    pub llm_tokens: Family<TokenKind, Counter>,
    pub llm_cost: Counter<f64, AtomicU64>,
    /// Model answers the guard stopped, by the check that failed (empty, markup, json,
    /// cut_off, too_long), and tool calls it read from an answer's text (tool_call_in_text).
    pub llm_guard: Family<Outcome, Counter>,
    /// The pipeline's counts, read from the store at each scrape.
    pub due: Gauge,
    pub running: Gauge,
    pub waiting: Gauge,
    pub review_open: Gauge,
    pub sends_queued: Gauge,
    pub sends_unknown: Gauge,
    /// Broadcast sends by how they ended (accepted, sandbox, held, retry, failed, unknown,
    /// untried): their rate is the broadcast send rate.
    pub broadcast_sends: Family<Outcome, Counter>,
    /// Live broadcasts' recipients by state, read from the store at each scrape.
    pub broadcast_recipients: Family<BroadcastRecipients, Gauge>,
    /// Broadcasts paused, by a person or for their template: an alert.
    pub broadcasts_paused: Gauge,
    /// Seconds a model call waited for its provider's budget (calls at once, per-minute
    /// limits, a 429's pause).
    pub llm_budget_wait_seconds: Histogram,
    /// Model calls in flight, and whether the provider is paused by a 429 now.
    pub llm_in_flight: Gauge,
    pub llm_paused: Gauge,
    /// 429 answers from model providers.
    pub llm_throttled: Counter,
    /// Seconds from a batch falling due to its turn starting: the queue wait.
    pub queue_wait_seconds: Histogram,
    /// How long a batch falling due now is expected to wait for its turn.
    pub expected_wait_seconds: Gauge,
    /// Holding messages sent ("we'll answer in about N minutes").
    pub holding_messages: Counter,
    /// Rows past their retention horizon that the sweeper removed, by kind.
    pub swept: Family<Swept, Counter>,
    /// WhatsApp messages Meta priced, by category and type: each once, at its first priced
    /// status.
    pub priced: Family<Priced, Counter>,
    /// The help desk (`[handoff]`): items mirrored or failed, replies sent or unsent, threads
    /// resolved, webhooks refused.
    pub desk: Family<Outcome, Counter>,
    /// 1 while the help desk's last round failed for some hand-off (they wait on Sabi's desk).
    pub desk_failing: Gauge,
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
        let sends_lapsed = Counter::default();
        let receipts = Family::<Outcome, Counter>::default();
        let receipts_waiting = Gauge::default();
        let halted_numbers = Gauge::default();
        registry.register("sabi_sends", "Sends by result", sends.clone());
        let batch_messages = Histogram::new([1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0]);
        registry.register(
            "sabi_batch_messages",
            "Messages per batch",
            batch_messages.clone(),
        );
        let turn_seconds: HistogramFamily<Outcome> =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 18)));
        registry.register(
            "sabi_turn_seconds",
            "Turn time from claim to its recorded end, by outcome",
            turn_seconds.clone(),
        );
        let routed = Family::<Routed, Counter>::default();
        registry.register(
            "sabi_routed",
            "Batches routed, by tier and decision",
            routed.clone(),
        );
        let llm_tokens = Family::<TokenKind, Counter>::default();
        registry.register("sabi_llm_tokens", "Model tokens", llm_tokens.clone());
        let llm_cost = Counter::<f64, AtomicU64>::default();
        registry.register(
            "sabi_llm_cost",
            "Estimated model cost, in the configured prices' currency",
            llm_cost.clone(),
        );
        let llm_guard = Family::<Outcome, Counter>::default();
        registry.register(
            "sabi_llm_guard",
            "Model answers stopped before a customer saw them, by check; tool calls read from text",
            llm_guard.clone(),
        );
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let gauge = Gauge::default();
            registry.register(name, help, gauge.clone());
            gauge
        };
        let due = gauge(
            &mut registry,
            "sabi_due",
            "Conversations due and not yet claimed",
        );
        let running = gauge(&mut registry, "sabi_running", "Batches held by a worker");
        let waiting = gauge(
            &mut registry,
            "sabi_waiting",
            "Batches waiting for a retry, or held after a holding message",
        );
        let review_open = gauge(&mut registry, "sabi_review_open", "Open review items");
        let sends_queued = gauge(
            &mut registry,
            "sabi_sends_queued",
            "Reply parts waiting to be sent",
        );
        let sends_unknown = gauge(
            &mut registry,
            "sabi_sends_unknown",
            "Sends whose outcome is unknown",
        );
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
            "sabi_sends_lapsed",
            "Sends whose lease lapsed with no outcome (their sender died or hung): each waits as unknown for a status webhook",
            sends_lapsed.clone(),
        );
        registry.register(
            "sabi_read_receipts",
            "Read receipts by result (sent, coalesced into a later one, failed)",
            receipts.clone(),
        );
        registry.register(
            "sabi_read_receipts_waiting",
            "Conversations whose latest answered message waits to be marked read",
            receipts_waiting.clone(),
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
        let broadcast_sends = Family::<Outcome, Counter>::default();
        registry.register(
            "sabi_broadcast_sends",
            "Broadcast sends by how they ended",
            broadcast_sends.clone(),
        );
        let broadcast_recipients = Family::<BroadcastRecipients, Gauge>::default();
        registry.register(
            "sabi_broadcast_recipients",
            "Recipients of live broadcasts by state",
            broadcast_recipients.clone(),
        );
        let broadcasts_paused = gauge(
            &mut registry,
            "sabi_broadcasts_paused",
            "Broadcasts paused by a person or for their template (alert when above 0)",
        );
        // 10 ms to ~45 min.
        let llm_budget_wait_seconds = Histogram::new(exponential_buckets(0.01, 2.0, 18));
        registry.register(
            "sabi_llm_budget_wait_seconds",
            "Seconds a model call waited for its provider's budget",
            llm_budget_wait_seconds.clone(),
        );
        let llm_in_flight = gauge(&mut registry, "sabi_llm_in_flight", "Model calls in flight");
        let llm_paused = gauge(
            &mut registry,
            "sabi_llm_paused",
            "1 while the model provider is paused by a 429",
        );
        let llm_throttled = Counter::default();
        registry.register(
            "sabi_llm_throttled",
            "429 answers from model providers",
            llm_throttled.clone(),
        );
        let queue_wait_seconds = Histogram::new(exponential_buckets(0.01, 2.0, 18));
        registry.register(
            "sabi_queue_wait_seconds",
            "Seconds from a batch falling due to its turn starting",
            queue_wait_seconds.clone(),
        );
        let expected_wait_seconds = gauge(
            &mut registry,
            "sabi_expected_wait_seconds",
            "How long a batch falling due now is expected to wait for its turn (autoscale on it)",
        );
        let holding_messages = Counter::default();
        registry.register(
            "sabi_holding_messages",
            "Holding messages sent to customers whose turn is far off",
            holding_messages.clone(),
        );
        let swept = Family::<Swept, Counter>::default();
        registry.register(
            "sabi_swept",
            "Rows past their retention horizon the sweeper removed, by kind",
            swept.clone(),
        );
        let priced = Family::<Priced, Counter>::default();
        registry.register(
            "sabi_whatsapp_priced",
            "WhatsApp messages Meta priced, by category and type (each once)",
            priced.clone(),
        );
        let desk_failing = gauge(
            &mut registry,
            "sabi_desk_failing",
            "1 while the help desk refuses or cannot be reached (hand-offs wait on Sabi's desk)",
        );
        let desk = Family::<Outcome, Counter>::default();
        registry.register(
            "sabi_desk",
            "Hand-offs mirrored to the help desk, and what came back, by outcome",
            desk.clone(),
        );
        Arc::new(Metrics {
            registry,
            swept,
            priced,
            desk,
            desk_failing,
            llm_budget_wait_seconds,
            llm_in_flight,
            llm_paused,
            llm_throttled,
            queue_wait_seconds,
            expected_wait_seconds,
            holding_messages,
            broadcast_sends,
            broadcast_recipients,
            broadcasts_paused,
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
            sends_lapsed,
            receipts,
            receipts_waiting,
            halted_numbers,
            batch_messages,
            turn_seconds,
            routed,
            llm_tokens,
            llm_cost,
            llm_guard,
            due,
            running,
            waiting,
            review_open,
            sends_queued,
            sends_unknown,
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

    /// The store's counts, as of now.
    pub fn observe_store(&self, gauges: &Gauges) {
        let set = |gauge: &Gauge, n: u64| {
            gauge.set(i64::try_from(n).unwrap_or(i64::MAX));
        };
        set(&self.due, gauges.due);
        set(&self.running, gauges.running);
        set(&self.waiting, gauges.waiting);
        set(&self.review_open, gauges.review);
        set(&self.sends_queued, gauges.queued_sends);
        set(&self.sends_unknown, gauges.unknown_sends);
    }

    /// The live broadcasts' counts, as of now: those no longer live leave the family.
    pub fn observe_broadcasts(&self, broadcasts: &[BroadcastView]) {
        self.broadcast_recipients.clear();
        let live = broadcasts.iter().filter(|b| b.state.live());
        for b in live {
            for (state, n) in &b.counts {
                let labels = BroadcastRecipients {
                    broadcast: b.id.to_string(),
                    state: (*state).to_owned(),
                };
                self.broadcast_recipients
                    .get_or_create(&labels)
                    .set(i64::try_from(*n).unwrap_or(i64::MAX));
            }
        }
        let paused = broadcasts
            .iter()
            .filter(|b| b.state == BroadcastState::Paused)
            .count();
        self.broadcasts_paused
            .set(i64::try_from(paused).unwrap_or(i64::MAX));
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
