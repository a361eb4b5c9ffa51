//! Sender: takes reply parts from the outbox and delivers them through the Graph API.
//!
//! Invariants (the store enforces the first two; this loop relies on them):
//! - a part is sent at most once: it is claimed with a fresh attempt number, and departs
//!   (counts as possibly sent) only once its pacing slot is taken, right before its request
//!   leaves; a send whose answer was lost is never repeated: it waits for the status webhook
//!   that names it (`biz_opaque_callback_data`), or goes to review. A sender that dies leaves
//!   unknown only its requests on the wire; what it had claimed goes to another sender when
//!   the claim lapses;
//! - per recipient, parts leave in order, one at a time, at least `pair_spacing` apart;
//! - per business number, requests leave at most `rate` a second (`pacer`); throttling
//!   answers hold the number back, honouring Retry-After;
//! - outside the 24-hour customer service window only the configured template goes, or the
//!   part goes to review;
//! - an expired token (190) halts its number until restart: nothing more is tried from it,
//!   nothing is lost, and the alert is in the logs and `/metrics`.
//!
//! The loop is a `runner::Runner`, as the scheduler's is: at shutdown it stops claiming and
//! gives sends in flight the grace period; a send still in flight then is stopped, and its part
//! counts as unknown once its lease lapses (a status webhook settles it, or a person).

pub(crate) mod pacer;
pub mod policy;
mod receipts;
pub mod split;
mod typing;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use self::pacer::Pacer;
use self::policy::Class;
use self::receipts::Receipts;
pub use self::typing::Typing;
use crate::clock::{At, SharedClock};
use crate::config::SenderSettings;
use crate::domain::{Channel, ReviewReason};
use crate::metrics::Metrics;
use crate::runner::{self, Runner, Work};
use crate::store::rules::identity;
use crate::store::{self, SendClaim, SendJob, SendResult, Store, Subject, send_callback};
use crate::whatsapp::graph::{Envelope, Graph, GraphError, Message};

pub struct Sender {
    store: Arc<dyn Store>,
    clock: SharedClock,
    graph: Graph,
    settings: SenderSettings,
    pacer: Pacer,
    receipts: Receipts,
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
            pacer: Pacer::new(settings.rate, clock.clone()),
            receipts: Receipts::default(),
            clock,
            graph,
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
    pub(crate) fn clock(&self) -> &SharedClock {
        &self.clock
    }

    pub(crate) fn pacer(&self) -> &Pacer {
        &self.pacer
    }

    /// Read receipts owed while the number had no slot to spare.
    pub(crate) fn receipts(&self) -> &Receipts {
        &self.receipts
    }

    /// Sends until `shutdown`, then gives sends in flight the grace period to end; read
    /// receipts go meanwhile, as the number has room.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        tracing::info!(rate = self.settings.rate, "sender started");
        let runner = Runner {
            clock: self.clock.clone(),
            slots: self.settings.in_flight,
            poll_interval: self.settings.poll_interval,
            shutdown_grace: self.settings.shutdown_grace,
        };
        let receipts = self.receipts.run(self.clone(), shutdown.clone());
        tokio::join!(runner.run(self.clone(), shutdown), receipts);
    }

    /// Numbers not to claim for now: halted ones, and those a throttling answer holds back
    /// (their parts would only wait in the pacer, holding a lease).
    pub(crate) fn skipped_numbers(&self) -> Vec<String> {
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

    /// One claimed part: paced, departed, checked against the window, sent once, and its
    /// outcome recorded.
    async fn deliver(&self, job: SendJob) {
        let number = job.conversation.business.clone();
        let waited = self.pacer.acquire(&number).await;
        if !waited.is_zero() {
            self.metrics.rate_limit_waits.inc();
        }
        let departed_at = self.clock.now();
        let result = if self.halts(&number) {
            SendResult::Untried
        } else if self.depart(&job, departed_at).await {
            self.attempt(&job).await
        } else {
            return;
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
        // Stop trying before the lease lapses: past it the part counts as unknown anyway.
        let lease = self.settings.send_lease;
        let deadline = departed_at + (lease - lease / 8);
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

    /// Marks the part as leaving, now that its slot is taken; whether it may be sent. A claim
    /// that lapsed while it waited belongs to another sender now; a store that cannot say
    /// means no send (the claim lapses and the part goes again).
    async fn depart(&self, job: &SendJob, now: At) -> bool {
        match self
            .store
            .depart(job.id, job.attempt, now, self.settings.send_lease)
            .await
        {
            Ok(()) => true,
            Err(store::Error::LeaseLost) => {
                tracing::info!(
                    outbox = job.id,
                    "the claim lapsed while the part waited for its slot; another claim sends it"
                );
                false
            }
            Err(e) => {
                tracing::warn!(outbox = job.id, error.message = %e, "could not mark a send as leaving; it goes again once its claim lapses");
                false
            }
        }
    }

    /// Records a send's outcome; through a short store outage until `deadline`, so that a send
    /// Meta accepted does not become an unknown one.
    async fn record(&self, job: &SendJob, result: &SendResult, deadline: At) -> store::Result<()> {
        store::write_through_outage(
            &self.clock,
            || self.clock.now() < deadline,
            |now| {
                self.store
                    .record_send(job.id, job.attempt, now, result.clone())
            },
        )
        .await
    }

    async fn attempt(&self, job: &SendJob) -> SendResult {
        let now = self.clock.now();
        let window_open = !job.window_closed
            && job
                .last_inbound_at
                .is_some_and(|at| now < at + self.settings.window);
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
        let linked = self.linked_ids(&job.conversation.customer).await;
        let envelope = Envelope {
            from: &job.conversation.business,
            to: identity::address(&job.conversation.customer, &linked),
            quote: job.quote.as_deref(),
            callback: Some(&callback),
        };
        match self.graph.send(envelope, message).await {
            Ok(wamid) => SendResult::Accepted {
                wamid,
                template: matches!(message, Message::Template(_)),
                next_send_at: self.clock.now() + self.settings.pair_spacing,
            },
            Err(error) => self.after_error(job, &error, window_open),
        }
    }

    /// The ids linked to a customer keyed by a BSUID, among them the number Meta may have
    /// shown since; nothing to read for one keyed by their number. A failed read sends to the
    /// BSUID, which Meta takes too.
    async fn linked_ids(&self, customer: &str) -> Vec<String> {
        if !identity::is_bsuid(customer) {
            return Vec::new();
        }
        let subject = Subject {
            channel: Channel::Whatsapp,
            customer: customer.to_owned(),
        };
        self.store
            .linked_ids(&subject)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error.message = %e, "reading a customer's linked ids failed; sending to their BSUID");
                Vec::new()
            })
    }

    fn after_error(&self, job: &SendJob, error: &GraphError, as_text: bool) -> SendResult {
        let class = policy::classify(error);
        let code = policy::code(error);
        let now = self.clock.now();
        let number = &job.conversation.business;
        let retry = |failure: bool, n: u32, recipient: bool| {
            let wait = policy::jitter(
                policy::wait(class, n, self.settings.retry_base),
                getrandom::u32().unwrap_or(u32::MAX / 2),
            );
            let at = now + wait;
            SendResult::Retry {
                at,
                failure,
                code,
                error: error.to_string(),
                recipient_after: recipient.then_some(at),
            }
        };
        match class {
            Class::Throttled { .. } => {
                let result = retry(false, job.attempt.saturating_sub(job.failures), false);
                if let SendResult::Retry { at, .. } = &result {
                    self.pacer.hold(number, at.since(now));
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
                wait_until: now + self.settings.unknown_wait,
            },
        }
    }

    /// Whether an expired token stopped this number's sends.
    pub(crate) fn halts(&self, number: &str) -> bool {
        self.halted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(number)
    }

    /// Stops this number's sends until restart: its token expired.
    pub(crate) fn halt(&self, number: &str) {
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

#[async_trait::async_trait]
impl Work for Sender {
    type Job = SendJob;
    const JOBS: &'static str = "sends";

    async fn claim(&self, free: usize) -> store::Result<Vec<SendJob>> {
        if free == 0 {
            return Ok(Vec::new());
        }
        let claims = self
            .store
            .claim_sends(SendClaim {
                now: self.clock.now(),
                lease: self.settings.lease,
                unknown_wait: self.settings.unknown_wait,
                limit: free,
                halted: self.skipped_numbers(),
            })
            .await?;
        for id in &claims.unknown {
            self.metrics.sends_lapsed.inc();
            tracing::warn!(
                outbox = id,
                "a send's lease lapsed with no outcome (its sender stopped mid-request): it may have reached Meta, and waits as unknown for a status webhook"
            );
        }
        Ok(claims.jobs)
    }

    async fn perform(self: Arc<Self>, job: SendJob) {
        self.deliver(job).await;
    }

    async fn next_wake(&self) -> At {
        let now = self.clock.now();
        let next_due = self.store.next_send_due(self.skipped_numbers()).await;
        runner::wake_time(now, self.settings.poll_interval, next_due)
    }

    async fn stored(&self) {
        self.wakeup.notified().await;
    }

    /// After any claim that took parts, not only a full one: a claim passes over parts that a
    /// status webhook or another node holds locked for a moment, and settles lapsed sends a
    /// page at a time, so taking fewer than asked does not show that none are due.
    fn claim_again(&self, _asked: usize, claimed: usize) -> bool {
        claimed > 0
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
