//! The broadcast loop: claims recipients of running broadcasts, sends each its template through
//! the Graph API once, and records how it went by the rulebook.
//!
//! - At most once per recipient: the store hands a recipient out with a fresh attempt number
//!   before the request leaves, and a send whose answer was lost is never repeated (it stays
//!   `unknown`).
//! - Replies go first: broadcasts take their requests from the same per-number pacing as the
//!   reply sender, and only as many at once as a few slots, so a reply due meanwhile waits for
//!   at most a few of them. Each broadcast keeps to its own rate besides.
//! - Meta's answers: its marketing limit per user (131049) holds the recipient for a day, a few
//!   times at most; an opt-out (131050), and other refusals, fail it with the code; a paused or
//!   disabled template (132015, 132016) pauses every broadcast sending it and puts the recipient
//!   back in the queue; throttling holds the whole number back; an expired token stops the
//!   number's sends.
//! - Meta's Marketing Messages API, when turned on: a template whose latest category is
//!   MARKETING goes to `/marketing_messages`, every other (and one whose category Meta has not
//!   told) to `/messages`. The category is the store's, kept from Meta's template list (read
//!   here the first time a template is sent) and its `template_category_update` webhook.
//!
//! It runs in a `runner::Runner`, as the scheduler and the reply sender do.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::{At, SharedClock};
use crate::config::{BroadcastSettings, MarketingSettings, SenderSettings, Template};
use crate::metrics::Metrics;
use crate::runner::{Runner, Work};
use crate::sender::Sender;
use crate::sender::pacer::Pacer;
use crate::sender::policy::{self, Class, MarketingRefusal};
use crate::store::{
    self, Broadcasts, Limits, Outcome, RecipientClaim, RecipientJob, TemplateCategory, TemplateNews,
};
use crate::whatsapp::graph::{Endpoint, Envelope, GraphError, Message};

/// How long Meta's marketing limit per user (131049) holds a recipient before another try.
const HOLD: Duration = Duration::from_secs(24 * 60 * 60);
/// Meta's refusals of the template itself: paused (132015) or disabled (132016).
const TEMPLATE_STOPPED: [i64; 2] = [132_015, 132_016];
/// Recipients in flight at once: few, so that replies never wait behind many of them.
const SLOTS: usize = 4;
/// How long a node waits before asking Meta's template list again for a template whose
/// category it did not learn: its sends meanwhile go to `/messages`.
const ASK_AGAIN: Duration = Duration::from_secs(10 * 60);

/// Where broadcasts go.
pub(crate) enum Route {
    /// To Meta, through the reply sender: its per-number pacing is shared, and its halted
    /// numbers stop these sends too.
    Meta(Arc<Sender>),
    /// Nowhere (sandbox mode, no access token): each send passes every rule and is recorded as
    /// accepted under a `sandbox.` id, at the number's rate.
    Sandbox(Pacer),
}

impl Route {
    fn pacer(&self) -> &Pacer {
        match self {
            Route::Meta(replies) => replies.pacer(),
            Route::Sandbox(pacer) => pacer,
        }
    }

    fn replies(&self) -> Option<&Sender> {
        match self {
            Route::Meta(replies) => Some(replies),
            Route::Sandbox(_) => None,
        }
    }
}

pub struct Broadcaster {
    store: Arc<dyn Broadcasts>,
    clock: SharedClock,
    route: Route,
    settings: SenderSettings,
    broadcasts: BroadcastSettings,
    marketing: MarketingSettings,
    metrics: Arc<Metrics>,
    /// Each broadcast's own rate, keyed by its id.
    rates: Mutex<HashMap<i64, Arc<Pacer>>>,
    /// When this node last asked Meta's template list about a template, by name.
    asked: Mutex<HashMap<String, At>>,
    /// When the Marketing Messages API last refused a template from a number (131055), by
    /// number, name and language: its sends go straight to `/messages` for [`ASK_AGAIN`]
    /// rather than being refused once each.
    refused: Mutex<HashMap<(String, String, String), At>>,
}

impl Broadcaster {
    pub(crate) fn new(
        store: Arc<dyn Broadcasts>,
        clock: SharedClock,
        route: Route,
        settings: SenderSettings,
        broadcasts: BroadcastSettings,
        marketing: MarketingSettings,
        metrics: Arc<Metrics>,
    ) -> Arc<Broadcaster> {
        Arc::new(Broadcaster {
            store,
            clock,
            route,
            settings,
            broadcasts,
            marketing,
            metrics,
            rates: Mutex::new(HashMap::new()),
            asked: Mutex::new(HashMap::new()),
            refused: Mutex::new(HashMap::new()),
        })
    }

    /// Sends until `shutdown`, then gives sends in flight the grace period to end.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        if self.marketing.on && self.route.replies().is_some() {
            tracing::info!(
                ttl_seconds = ?self.marketing.ttl_seconds,
                "broadcasts send MARKETING templates through Meta's Marketing Messages API (/marketing_messages)"
            );
        }
        let runner = Runner {
            clock: self.clock.clone(),
            slots: SLOTS,
            poll_interval: self.settings.poll_interval,
            shutdown_grace: self.settings.shutdown_grace,
        };
        runner.run(self, shutdown).await;
    }

    fn limits(&self) -> Limits {
        Limits {
            max_failures: self.settings.max_failures,
            max_holds: self.broadcasts.max_holds,
        }
    }

    /// The broadcast's own pacing, made at its rate the first time it is asked for.
    fn rate_of(&self, job: &RecipientJob) -> Arc<Pacer> {
        let mut rates = self.rates.lock().unwrap_or_else(|p| p.into_inner());
        rates
            .entry(job.broadcast_id)
            .or_insert_with(|| Arc::new(Pacer::new(job.rate, self.clock.clone())))
            .clone()
    }

    async fn deliver(&self, job: RecipientJob) {
        let key = job.broadcast_id.to_string();
        self.rate_of(&job).acquire(&key).await;
        self.route.pacer().acquire(&job.business).await;
        let outcome = match self.route.replies() {
            None => Outcome::Accepted {
                wamid: format!("sandbox.{}.{}", job.id, job.attempt),
            },
            Some(replies) if replies.halts(&job.business) => Outcome::Untried,
            Some(replies) => self.attempt(replies, &job).await,
        };
        Metrics::count(&self.metrics.broadcast_sends, outcome_name(&outcome));
        let lease = self.settings.lease;
        let deadline = self.clock.now() + (lease - lease / 8);
        let recorded = store::write_through_outage(
            &self.clock,
            || self.clock.now() < deadline,
            |now| {
                self.store.record_recipient(
                    job.id,
                    job.attempt,
                    now,
                    outcome.clone(),
                    self.limits(),
                )
            },
        )
        .await;
        if let Err(e) = recorded {
            tracing::error!(
                recipient = job.id,
                broadcast = job.broadcast_id,
                error.message = %e,
                "could not record a broadcast send; it will count as unknown when its lease lapses"
            );
        }
    }

    async fn attempt(&self, replies: &Sender, job: &RecipientJob) -> Outcome {
        let template = Template {
            name: job.template.clone(),
            language: job.language.clone(),
            parameters: job.params.clone(),
        };
        let callback = store::broadcast_callback(job.id, job.attempt);
        let envelope = Envelope {
            from: &job.business,
            to: &job.to,
            quote: None,
            callback: Some(&callback),
        };
        let endpoint = self.endpoint(replies, job).await;
        let sent = match endpoint {
            Endpoint::MarketingMessages => self.send_marketing(replies, envelope, &template).await,
            Endpoint::Messages => {
                replies
                    .graph()
                    .send(envelope, Message::Template(&template))
                    .await
            }
        };
        match sent {
            Ok(wamid) => Outcome::Accepted { wamid },
            Err(error)
                if endpoint == Endpoint::MarketingMessages
                    && policy::marketing_refusal(&error) == Some(MarketingRefusal::NotSynced) =>
            {
                self.not_synced(error)
            }
            Err(error) if policy::code(&error).is_some_and(|c| TEMPLATE_STOPPED.contains(&c)) => {
                self.template_stopped(job, &error).await;
                Outcome::Untried
            }
            Err(error) => self.after_error(replies, job, &error),
        }
    }

    /// Where the job's template goes: `/marketing_messages` only when the Marketing Messages
    /// API is on and the template's latest category is MARKETING.
    async fn endpoint(&self, replies: &Sender, job: &RecipientJob) -> Endpoint {
        if !self.marketing.on {
            return Endpoint::Messages;
        }
        let kept = self
            .store
            .template_category(&job.template, &job.language)
            .await;
        let category = match kept {
            Ok(Some(category)) => Some(category),
            Ok(None) => self.ask_category(replies, job).await,
            Err(e) => {
                tracing::warn!(
                    template = %job.template,
                    error.message = %e,
                    "could not read a template's category; this send goes to /messages"
                );
                None
            }
        };
        Endpoint::for_template(category.as_deref(), true)
    }

    /// Reads the template's categories, in every language, from Meta's template list and
    /// keeps them; the job's language's, if Meta lists it. A node asks about a template at
    /// most once per [`ASK_AGAIN`], so a template Meta does not list costs no call per send.
    async fn ask_category(&self, replies: &Sender, job: &RecipientJob) -> Option<String> {
        let account = self.marketing.account.as_deref()?;
        let now = self.clock.now();
        {
            let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
            if asked
                .get(&job.template)
                .is_some_and(|at| now.since(*at) < ASK_AGAIN)
            {
                return None;
            }
            asked.insert(job.template.clone(), now);
        }
        let listed = match replies.graph().templates(account, &job.template).await {
            Ok(listed) => listed,
            Err(error) => {
                tracing::warn!(
                    template = %job.template,
                    error.message = %error,
                    "could not read a template's category from Meta; its sends go to /messages until it can be"
                );
                return None;
            }
        };
        let mut found = None;
        for t in listed {
            let Some(category) = t.category else { continue };
            let kept = TemplateCategory::new(&t.name, &t.language, &category, now);
            if t.language == job.language {
                found = Some(kept.category.clone());
            }
            if let Err(e) = self.store.keep_category(kept).await {
                tracing::warn!(template = %t.name, error.message = %e, "could not keep a template's category");
            }
        }
        found
    }

    /// Sends through the Marketing Messages API. Meta's 131055 says it does not take this
    /// template there: nothing was sent, so it goes through `/messages` at once.
    async fn send_marketing(
        &self,
        replies: &Sender,
        envelope: Envelope<'_>,
        template: &Template,
    ) -> Result<String, GraphError> {
        let graph = replies.graph();
        let key = (
            envelope.from.to_owned(),
            template.name.clone(),
            template.language.clone(),
        );
        let now = self.clock.now();
        let recently_refused = {
            let refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
            refused
                .get(&key)
                .is_some_and(|at| now.since(*at) < ASK_AGAIN)
        };
        if recently_refused {
            return graph.send(envelope, Message::Template(template)).await;
        }
        match graph
            .send_marketing(envelope, template, self.marketing.ttl_seconds)
            .await
        {
            Err(error)
                if policy::marketing_refusal(&error) == Some(MarketingRefusal::NotMarketing) =>
            {
                tracing::warn!(
                    template = %template.name,
                    error.message = %error,
                    "Meta does not take this template through the Marketing Messages API; it goes through /messages"
                );
                self.refused
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, now);
                graph.send(envelope, Message::Template(template)).await
            }
            sent => sent,
        }
    }

    /// Meta has not finished syncing the template for marketing sends: another try after the
    /// usual wait, counted as a failure so that it ends.
    fn not_synced(&self, error: GraphError) -> Outcome {
        let wait = policy::jitter(
            policy::wait(Class::Transient, 1, self.settings.retry_base),
            getrandom::u32().unwrap_or(u32::MAX / 2),
        );
        retry(
            self.clock.now() + wait,
            true,
            policy::code(&error),
            error.to_string(),
        )
    }

    /// Meta refused the template itself (paused or disabled): every broadcast sending it
    /// pauses, and this recipient waits in the queue for it to be approved again.
    async fn template_stopped(&self, job: &RecipientJob, error: &GraphError) {
        let news = TemplateNews {
            name: job.template.clone(),
            language: Some(job.language.clone()),
            approved: false,
            why: format!("Meta refused template {}: {error}", job.template),
        };
        match self.store.hear_template(news).await {
            Ok(paused) => tracing::warn!(
                template = %job.template,
                broadcasts = ?paused,
                error.message = %error,
                "Meta refused a broadcast's template: its broadcasts are paused until it is approved again"
            ),
            Err(e) => tracing::error!(
                template = %job.template,
                error.message = %e,
                "could not pause the broadcasts of a refused template; its next send will try again"
            ),
        }
    }

    fn after_error(&self, replies: &Sender, job: &RecipientJob, error: &GraphError) -> Outcome {
        let code = policy::code(error);
        let now = self.clock.now();
        let message = error.to_string();
        match (policy::classify(error), code) {
            (_, Some(131_049)) => Outcome::Held {
                until: now + HOLD,
                code: 131_049,
                error: message,
            },
            (Class::Throttled { .. }, _) => {
                let wait = policy::wait(policy::classify(error), 1, self.settings.retry_base);
                replies.pacer().hold(&job.business, wait);
                retry(now + wait, false, code, message)
            }
            (Class::PairLimited | Class::Transient, _) => {
                let wait = policy::jitter(
                    policy::wait(Class::Transient, 1, self.settings.retry_base),
                    getrandom::u32().unwrap_or(u32::MAX / 2),
                );
                retry(now + wait, true, code, message)
            }
            (Class::TokenExpired, _) => {
                replies.halt(&job.business);
                Outcome::Untried
            }
            (Class::Unknown, _) => Outcome::Unknown { error: message },
            (Class::WindowClosed | Class::Permanent, _) => Outcome::Failed {
                code,
                error: message,
            },
        }
    }
}

fn outcome_name(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Accepted { wamid } if wamid.starts_with("sandbox.") => "sandbox",
        Outcome::Accepted { .. } => "accepted",
        Outcome::Retry { .. } => "retry",
        Outcome::Untried => "untried",
        Outcome::Held { .. } => "held",
        Outcome::Failed { .. } => "failed",
        Outcome::Unknown { .. } => "unknown",
    }
}

fn retry(at: At, failure: bool, code: Option<i64>, error: String) -> Outcome {
    Outcome::Retry {
        at,
        failure,
        code,
        error,
    }
}

#[async_trait::async_trait]
impl Work for Broadcaster {
    type Job = RecipientJob;
    const JOBS: &'static str = "broadcast sends";

    async fn claim(&self, free: usize) -> store::Result<Vec<RecipientJob>> {
        if free == 0 {
            return Ok(Vec::new());
        }
        self.store
            .claim_recipients(RecipientClaim {
                now: self.clock.now(),
                lease: self.settings.lease,
                limit: free,
                halted: self
                    .route
                    .replies()
                    .map(Sender::skipped_numbers)
                    .unwrap_or_default(),
                cooldown: self.broadcasts.cooldown,
                daily_limit: self.broadcasts.messaging_limit.0,
            })
            .await
    }

    async fn perform(self: Arc<Self>, job: RecipientJob) {
        self.deliver(job).await;
    }

    async fn next_wake(&self) -> At {
        self.clock.now() + self.settings.poll_interval
    }

    async fn stored(&self) {
        std::future::pending::<()>().await;
    }
}
