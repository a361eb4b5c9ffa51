//! Sender: takes reply parts from the outbox and delivers them through the Graph API.
//!
//! Invariants (the store enforces the first two; this loop relies on them):
//! - a part is sent at most once: it is claimed with a fresh attempt number before the
//!   request leaves, and a send whose answer was lost is never repeated; it waits for the
//!   status webhook that names it (`biz_opaque_callback_data`), or goes to review;
//! - per recipient, parts leave in order, one at a time, at least `pair_spacing` apart;
//! - per business number, requests leave at most `rate` a second ([`pacer`]); throttling
//!   answers hold the number back, honouring Retry-After;
//! - outside the 24-hour customer service window only the configured template goes, or the
//!   part goes to review;
//! - an expired token (190) halts its number until restart: nothing more is tried from it,
//!   nothing is lost, and the alert is in the logs and `/metrics`.

pub mod graph;
mod pacer;
pub mod policy;
pub mod split;
mod typing;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use self::graph::{Envelope, Graph, Message, Template};
use self::pacer::Pacer;
use self::policy::Class;
pub use self::typing::Typing;
use crate::clock::SharedClock;
use crate::domain::ReviewReason;
use crate::metrics::Metrics;
use crate::store::{self, SendClaim, SendJob, SendResult, Store, send_callback};

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
}

pub struct Sender {
    store: Arc<dyn Store>,
    clock: SharedClock,
    graph: Graph,
    settings: SenderSettings,
    pacer: Pacer,
    halted: Mutex<HashSet<String>>,
    wakeup: Arc<Notify>,
    metrics: Arc<Metrics>,
}

impl Sender {
    pub fn new(
        store: Arc<dyn Store>,
        clock: SharedClock,
        graph: Graph,
        settings: SenderSettings,
        metrics: Arc<Metrics>,
    ) -> Arc<Sender> {
        Arc::new(Sender {
            store,
            clock,
            graph,
            pacer: Pacer::new(settings.rate),
            settings,
            halted: Mutex::new(HashSet::new()),
            wakeup: Arc::new(Notify::new()),
            metrics,
        })
    }

    /// Notified when a reply part is written (a turn ended, a person replied), so the loop
    /// looks at once.
    pub fn wakeup(&self) -> Arc<Notify> {
        self.wakeup.clone()
    }

    /// The Graph client, for read receipts and media.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The per-number pacing, shared with read receipts (they count against the rate too).
    pub(crate) fn pacer(&self) -> &Pacer {
        &self.pacer
    }

    /// Sends until `shutdown`, then lets sends in flight finish.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let permits = Arc::new(Semaphore::new(self.settings.in_flight));
        let mut running = JoinSet::new();
        tracing::info!(rate = self.settings.rate, "sender started");
        while !shutdown.is_cancelled() {
            let free = permits.available_permits();
            let claimed_at = self.clock.now_ms();
            let jobs = match self.claim(claimed_at, free).await {
                Ok(jobs) => jobs,
                Err(e) => {
                    tracing::error!(error.message = %e, "claiming sends failed; pausing before the next try");
                    self.pause(&shutdown, self.settings.poll_interval).await;
                    continue;
                }
            };
            let claimed = jobs.len();
            for job in jobs {
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    break;
                };
                let this = self.clone();
                running.spawn(async move {
                    this.deliver(job, claimed_at).await;
                    drop(permit);
                });
            }
            while running.try_join_next().is_some() {}
            if claimed > 0 && permits.available_permits() > 0 {
                continue;
            }
            let deadline = self.next_wake().await;
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = self.wakeup.notified() => {}
                Some(_) = running.join_next(), if !running.is_empty() => {}
                () = self.clock.sleep_until(deadline) => {}
            }
        }
        // Sends in flight finish: cutting them off would only make their outcome unknown.
        while running.join_next().await.is_some() {}
    }

    async fn claim(&self, now_ms: i64, limit: usize) -> Result<Vec<SendJob>, store::Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.store
            .claim_sends(SendClaim {
                now_ms,
                lease_ms: millis(self.settings.lease),
                unknown_wait_ms: millis(self.settings.unknown_wait),
                limit,
                halted: self.skipped_numbers(),
            })
            .await
    }

    async fn next_wake(&self) -> i64 {
        let now = self.clock.now_ms();
        let poll = now.saturating_add(millis(self.settings.poll_interval));
        match self.store.next_send_due(self.skipped_numbers()).await {
            // Due now but not claimed: every slot is busy, or another node has it.
            Ok(Some(due)) if due <= now => {
                now.saturating_add(millis(self.settings.poll_interval) / 10)
            }
            Ok(Some(due)) => due.min(poll),
            Ok(None) => poll,
            Err(e) => {
                tracing::warn!(error.message = %e, "could not read the next send time");
                poll
            }
        }
    }

    async fn pause(&self, shutdown: &CancellationToken, wait: Duration) {
        let until = self.clock.now_ms().saturating_add(millis(wait));
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = self.clock.sleep_until(until) => {}
        }
    }

    /// Numbers not to claim for now: halted ones, and those a throttling answer holds back
    /// (their parts would only wait in the pacer, holding a lease).
    fn skipped_numbers(&self) -> Vec<String> {
        let mut numbers = self.pacer.held(Duration::from_secs(1));
        numbers.extend(
            self.halted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned(),
        );
        numbers
    }

    /// One part (claimed at `claimed_at`): paced, checked against the window, sent once, and its
    /// outcome recorded.
    async fn deliver(&self, job: SendJob, claimed_at: i64) {
        let number = job.conversation.business.clone();
        let waited = self.pacer.acquire(&number).await;
        if !waited.is_zero() {
            self.metrics.rate_limit_waits.inc();
        }
        let result = if self
            .halted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&number)
        {
            SendResult::Untried
        } else {
            self.attempt(&job).await
        };
        Metrics::count(&self.metrics.sends, result_name(&result));
        if let SendResult::Retry {
            code: Some(code), ..
        }
        | SendResult::Review {
            code: Some(code), ..
        } = &result
        {
            Metrics::count(&self.metrics.send_errors, &code.to_string());
        }
        let lease_ms = millis(self.settings.lease);
        // Stop trying before the lease lapses: past it the part counts as unknown anyway.
        let deadline = claimed_at.saturating_add(lease_ms - lease_ms / 8);
        match self.record(&job, &result, deadline).await {
            Ok(()) => tracing::debug!(
                outbox = job.id,
                result = result_name(&result),
                "send recorded"
            ),
            Err(store::Error::LeaseLost) => tracing::info!(
                outbox = job.id,
                "a status webhook settled this send first; nothing more to record"
            ),
            Err(e) => tracing::error!(
                outbox = job.id,
                error.message = %e,
                "could not record a send; its lease will lapse and it will wait as unknown"
            ),
        }
    }

    /// Records a send's outcome; through a short store outage until `deadline`, so that a send
    /// Meta accepted does not become an unknown one.
    async fn record(&self, job: &SendJob, result: &SendResult, deadline: i64) -> store::Result<()> {
        store::write_through_outage(
            &self.clock,
            || self.clock.now_ms() < deadline,
            |now| {
                self.store
                    .record_send(job.id, job.attempt, now, result.clone())
            },
        )
        .await
    }

    async fn attempt(&self, job: &SendJob) -> SendResult {
        let now = self.clock.now_ms();
        let window_open = !job.window_closed
            && job
                .last_inbound_at_ms
                .is_some_and(|at| now < at.saturating_add(millis(self.settings.window)));
        let message = match (&self.settings.template, window_open) {
            (_, true) => Message::Text {
                body: &job.text,
                options: &job.options,
            },
            // One template per reply: it invites the customer back; a person sends the rest.
            (Some(template), false) if job.part == 0 => Message::Template(template),
            (Some(_), false) => {
                return SendResult::Review {
                    reason: ReviewReason::WindowClosed,
                    code: None,
                    error: "the 24-hour window had closed; the template went with the first part"
                        .into(),
                };
            }
            (None, false) => {
                return SendResult::Review {
                    reason: ReviewReason::WindowClosed,
                    code: None,
                    error: "the 24-hour customer service window has closed and no template is configured".into(),
                };
            }
        };
        let callback = send_callback(job.id, job.attempt);
        let envelope = Envelope {
            from: &job.conversation.business,
            to: &job.conversation.customer,
            quote: job.quote.as_deref(),
            callback: Some(&callback),
        };
        match self.graph.send(envelope, message).await {
            Ok(wamid) => SendResult::Accepted {
                wamid,
                template: matches!(message, Message::Template(_)),
                next_send_at_ms: self
                    .clock
                    .now_ms()
                    .saturating_add(millis(self.settings.pair_spacing)),
            },
            Err(error) => self.after_error(job, &error, window_open),
        }
    }

    fn after_error(&self, job: &SendJob, error: &graph::GraphError, as_text: bool) -> SendResult {
        let class = policy::classify(error);
        let code = policy::code(error);
        let now = self.clock.now_ms();
        let number = &job.conversation.business;
        let retry = |failure: bool, n: u32, recipient: bool| {
            let wait = policy::jitter(
                policy::wait(class, n, self.settings.retry_base),
                getrandom::u32().unwrap_or(u32::MAX / 2),
            );
            let at = now.saturating_add(millis(wait));
            SendResult::Retry {
                at_ms: at,
                failure,
                code,
                error: error.to_string(),
                recipient_after_ms: recipient.then_some(at),
            }
        };
        match class {
            Class::Throttled { .. } => {
                let result = retry(false, job.attempt.saturating_sub(job.failures), false);
                if let SendResult::Retry { at_ms, .. } = &result {
                    self.pacer.hold(
                        number,
                        Duration::from_millis(at_ms.saturating_sub(now).max(0) as u64),
                    );
                }
                tracing::warn!(number = %number, code, "throttled by Meta; holding this number back");
                result
            }
            Class::PairLimited => retry(false, job.attempt.saturating_sub(job.failures), true),
            Class::Transient if job.failures + 1 >= self.settings.max_failures => {
                SendResult::Review {
                    reason: ReviewReason::SendFailed,
                    code,
                    error: format!("out of tries: {error}"),
                }
            }
            Class::Transient => retry(true, job.failures + 1, false),
            Class::TokenExpired => {
                self.halt(number);
                SendResult::Untried
            }
            // Meta says the window closed, whatever Sabi's clock said: the template goes next.
            Class::WindowClosed if as_text && self.settings.template.is_some() && job.part == 0 => {
                SendResult::WindowClosed {
                    code,
                    error: error.to_string(),
                }
            }
            Class::WindowClosed => SendResult::Review {
                reason: ReviewReason::WindowClosed,
                code,
                error: error.to_string(),
            },
            Class::Permanent => SendResult::Review {
                reason: ReviewReason::SendFailed,
                code,
                error: error.to_string(),
            },
            Class::Unknown => SendResult::Unknown {
                error: error.to_string(),
                wait_until_ms: now.saturating_add(millis(self.settings.unknown_wait)),
            },
        }
    }

    fn halt(&self, number: &str) {
        let newly = self
            .halted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(number.to_owned());
        if newly {
            self.metrics.halted_numbers.inc();
            tracing::error!(
                number,
                alert = "token_expired",
                "ALERT: the Graph API access token was refused (190); sending from this number is halted until Sabi restarts with a valid token. Replies wait in the outbox."
            );
        }
    }
}

fn result_name(result: &SendResult) -> &'static str {
    match result {
        SendResult::Accepted {
            template: false, ..
        } => "accepted",
        SendResult::Accepted { template: true, .. } => "accepted_template",
        SendResult::Retry { failure: false, .. } => "throttled",
        SendResult::Retry { failure: true, .. } => "retry",
        SendResult::Untried => "halted",
        SendResult::WindowClosed { .. } => "window_closed",
        SendResult::Unknown { .. } => "unknown",
        SendResult::Review { .. } => "review",
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
