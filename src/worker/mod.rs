//! Scheduler: claims due batches from the store and runs one turn per batch, at most N at once
//! on this node.
//!
//! Invariants (the store enforces them; the worker relies on them):
//! - a conversation has at most one batch open, so its turns never overlap and stay in order;
//! - every claim carries a fresh fencing token and every write of the turn carries it, so a
//!   worker that paused past its lease cannot reply;
//! - nothing is held in memory between turns: any node can take any batch.
//!
//! The loop is a `runner::Runner`: it wakes at once when this process stores work
//! ([`Wakeup`]), when a turn ends, and when the earliest known due time comes; it polls the
//! store for work from other nodes too.

pub mod holder;
mod lease;
pub mod policy;
mod signals;
mod wakeup;

use std::sync::Arc;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use self::lease::LeaseGuard;
use self::policy::Decision;
pub use self::signals::{ChatSignals, Subscription};
pub use self::wakeup::Wakeup;
use crate::clock::{self, At, SharedClock};
use crate::config::{EngineSettings, queue_slots, web_chat_slots};
use crate::domain::{Batch, Channel, Claim, LeaseToken, ReplyPart};
use crate::metrics::Metrics;
use crate::runner::{self, Runner, Work};
use crate::sender::split;
use crate::store::{self, Ending, Turns};
use crate::turn::{TurnHandler, TurnOutcome};

/// What one [`Scheduler::tick`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickOutcome {
    Idle,
    Processed(usize),
}

pub struct Scheduler {
    store: Arc<dyn Turns>,
    clock: SharedClock,
    handler: Arc<dyn TurnHandler>,
    settings: EngineSettings,
    wakeup: Arc<Wakeup>,
    /// Told when a turn writes reply parts, so the sender looks at once.
    outbox: Arc<Notify>,
    metrics: Arc<Metrics>,
    chat: Arc<ChatSignals>,
    /// The running loop's turns outside the routine lane: at most [`queue_slots`] at once.
    queue_slots: Arc<Semaphore>,
    /// The running loop's web-chat turns: at most [`web_chat_slots`] at once.
    web_slots: Arc<Semaphore>,
}

/// A claimed batch, with the slots it holds while its turn runs.
pub(crate) struct Turn {
    claim: Claim,
    /// None for a routine turn: those have every slot.
    queue_slot: Option<OwnedSemaphorePermit>,
    web_slot: Option<OwnedSemaphorePermit>,
}

/// What one claim took: routine turns (the router answers them alone), and the others.
struct Claimed {
    routine: Vec<Claim>,
    queued: Vec<Claim>,
}

impl Scheduler {
    pub fn new(
        store: Arc<dyn Turns>,
        clock: SharedClock,
        handler: Arc<dyn TurnHandler>,
        settings: EngineSettings,
        metrics: Arc<Metrics>,
        outbox: Arc<Notify>,
    ) -> Arc<Scheduler> {
        Arc::new(Scheduler {
            store,
            clock,
            handler,
            queue_slots: Arc::new(Semaphore::new(queue_slots(settings.turns))),
            web_slots: Arc::new(Semaphore::new(web_chat_slots(settings.turns))),
            settings,
            wakeup: Arc::new(Wakeup::default()),
            outbox,
            metrics,
            chat: Arc::new(ChatSignals::default()),
        })
    }

    /// Told when a web-chat turn starts or ends here, for the sessions' event streams.
    pub fn chat_signals(&self) -> Arc<ChatSignals> {
        self.chat.clone()
    }

    /// Told when this process stores work, so the loop looks at once when it is due earlier
    /// than planned.
    pub fn wakeup(&self) -> Arc<Wakeup> {
        self.wakeup.clone()
    }

    /// Claims every batch due now (up to the per-node limit) and runs those turns to their end.
    ///
    /// # Errors
    /// When the store cannot claim.
    pub async fn tick(self: &Arc<Self>) -> Result<TickOutcome, store::Error> {
        let turns = self.settings.turns;
        let Claimed { routine, queued } = self
            .claim_due(turns, queue_slots(turns), web_chat_slots(turns))
            .await?;
        let claims: Vec<Claim> = routine.into_iter().chain(queued).collect();
        if claims.is_empty() {
            return Ok(TickOutcome::Idle);
        }
        let count = claims.len();
        let mut turns = JoinSet::new();
        for claim in claims {
            let this = self.clone();
            turns.spawn(async move { this.run_turn(claim).await });
        }
        while turns.join_next().await.is_some() {}
        Ok(TickOutcome::Processed(count))
    }

    /// Ticks until nothing is due now.
    ///
    /// # Errors
    /// When the store cannot claim.
    pub async fn drain(self: &Arc<Self>) -> Result<usize, store::Error> {
        let mut total = 0;
        while let TickOutcome::Processed(n) = self.tick().await? {
            total += n;
        }
        Ok(total)
    }

    /// Runs turns until `shutdown`, then gives running turns the grace period to end. A turn
    /// still working after it is stopped without releasing its lease: the lease lapses and
    /// another worker takes the batch over.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        tracing::info!(turns = self.settings.turns, "scheduler started");
        let runner = Runner {
            clock: self.clock.clone(),
            slots: self.settings.turns,
            poll_interval: self.settings.poll_interval,
            shutdown_grace: self.settings.shutdown_grace,
        };
        runner.run(self, shutdown).await;
    }

    /// Up to `free` batches. Routine ones first: the router answers them in microseconds, so a
    /// surge of model turns never keeps them waiting. Then, within `queue_free`, WhatsApp's,
    /// then web chat's, at most `web_free` of them, so a flood of web-chat questions can never
    /// take every slot from WhatsApp customers.
    async fn claim_due(
        &self,
        free: usize,
        queue_free: usize,
        web_free: usize,
    ) -> Result<Claimed, store::Error> {
        let mut claimed = Claimed {
            routine: Vec::new(),
            queued: Vec::new(),
        };
        if free == 0 {
            return Ok(claimed);
        }
        let lease = self.settings.lease;
        let now = self.clock.now();
        claimed.routine = self.store.claim_routine(now, lease, free).await?;
        let queue_free = queue_free.min(free - claimed.routine.len());
        if queue_free == 0 {
            return Ok(claimed);
        }
        claimed.queued = self
            .store
            .claim(now, lease, queue_free, Some(Channel::Whatsapp))
            .await?;
        let web = web_free.min(queue_free - claimed.queued.len());
        if web > 0 {
            let web_claims = self
                .store
                .claim(now, lease, web, Some(Channel::Webchat))
                .await?;
            claimed.queued.extend(web_claims);
        }
        Ok(claimed)
    }

    /// One turn: decide, run the handler under a renewed lease, and record how it ended.
    async fn run_turn(&self, claim: Claim) {
        let session = (claim.batch.conversation.channel == Channel::Webchat)
            .then(|| claim.batch.conversation.customer.clone());
        if let Some(session) = &session {
            self.chat.changed(session);
        }
        self.turn(claim).await;
        if let Some(session) = &session {
            self.chat.changed(session);
        }
    }

    async fn turn(&self, claim: Claim) {
        let started = self.clock.now();
        if claim.attempt == 1 {
            let waited = started.since(claim.batch.due_at);
            self.metrics
                .queue_wait_seconds
                .observe(waited.as_secs_f64());
        }
        let decision = policy::decide(&claim, started, &self.settings.policy);
        let Claim {
            batch,
            token,
            attempt,
            ..
        } = claim;
        let guard = LeaseGuard::spawn(
            self.store.clone(),
            self.clock.clone(),
            batch.id,
            token,
            self.settings.lease,
        );
        let ending = match decision {
            Decision::Review(reason) => Ending::Review {
                reason,
                error: None,
            },
            Decision::Run => {
                let lost = guard.lost();
                let outcome = tokio::select! {
                    outcome = self.handler.handle(&batch) => outcome,
                    () = lost.cancelled() => return,
                };
                match outcome {
                    Ok(TurnOutcome::Reply(parts)) => Ending::Replied {
                        parts: self.outgoing(&batch, parts),
                        sandbox: self.settings.sandbox,
                    },
                    Ok(TurnOutcome::Handoff { parts, note }) => Ending::Handoff {
                        parts: self.outgoing(&batch, parts),
                        sandbox: self.settings.sandbox,
                        note,
                    },
                    Ok(TurnOutcome::Review { reason, note }) => Ending::Review {
                        reason,
                        error: Some(note),
                    },
                    Err(e) => {
                        policy::after_failure(attempt, self.clock.now(), &self.settings.policy, e.0)
                    }
                }
            }
        };
        let outcome = ending_name(&ending);
        // An anonymous visitor's question that ends in review (any reason: a hand-off the
        // router foresaw was counted when it was asked) spends its address's hand-off token.
        let anonymous_item = match (&ending, batch.conversation.channel) {
            (Ending::Review { .. }, Channel::Webchat) => batch
                .messages
                .iter()
                .find(|m| m.user.is_none())
                .and_then(|m| m.address.clone()),
            _ => None,
        };
        if attempt > 1 {
            self.metrics.reclaims.inc();
        }
        self.metrics
            .batch_messages
            .observe(batch.messages.len() as f64);
        match self.record_ending(batch.id, token, ending, &guard).await {
            Ok(()) => {
                if matches!(outcome, "replied" | "handoff") {
                    self.outbox.notify_one();
                }
                if let Some(address) = &anonymous_item {
                    self.chat.anonymous_item(address);
                }
                Metrics::count(&self.metrics.turns, outcome);
                let took = self.clock.now().since(started).as_secs_f64();
                self.metrics
                    .turn_seconds
                    .get_or_create(&crate::metrics::Outcome {
                        outcome: outcome.to_owned(),
                    })
                    .observe(took);
                self.log_turn(&batch, attempt, outcome, started);
            }
            Err(store::Error::LeaseLost) => {
                Metrics::count(&self.metrics.turns, "lease_lost");
                tracing::warn!(
                    batch = batch.id,
                    attempt,
                    "lease lost: another worker owns the batch; nothing written"
                );
            }
            Err(e) => tracing::error!(
                batch = batch.id,
                error.message = %e,
                "could not record the end of the turn; the lease will lapse and the batch be retried"
            ),
        }
        drop(guard);
    }
}

#[async_trait::async_trait]
impl Work for Scheduler {
    type Job = Turn;
    const JOBS: &'static str = "turns";

    /// Routine batches into any free slot; the others into their own slots, web chat's into
    /// its own of those.
    async fn claim(&self, free: usize) -> store::Result<Vec<Turn>> {
        let queue_free = self.queue_slots.available_permits().min(free);
        let web_free = self.web_slots.available_permits().min(free);
        let Claimed { routine, queued } = self.claim_due(free, queue_free, web_free).await?;
        let routine = routine.into_iter().map(|claim| Turn {
            claim,
            queue_slot: None,
            web_slot: None,
        });
        let queued = queued.into_iter().map(|claim| {
            let web_slot = match claim.batch.conversation.channel {
                Channel::Webchat => self.web_slots.clone().try_acquire_owned().ok(),
                Channel::Whatsapp => None,
            };
            Turn {
                claim,
                queue_slot: self.queue_slots.clone().try_acquire_owned().ok(),
                web_slot,
            }
        });
        Ok(routine.chain(queued).collect())
    }

    async fn perform(self: Arc<Self>, turn: Turn) {
        let Turn {
            claim,
            queue_slot,
            web_slot,
        } = turn;
        self.run_turn(claim).await;
        drop((queue_slot, web_slot));
    }

    /// The earliest due time the store knows of, but no later than the next poll; published
    /// to the [`Wakeup`] before the store is read, so work stored meanwhile still wakes us.
    async fn next_wake(&self) -> At {
        let now = self.clock.now();
        let poll = now + self.settings.poll_interval;
        self.wakeup.plan(poll);
        let next_due = self.store.next_due().await;
        let deadline = runner::wake_time(now, self.settings.poll_interval, next_due);
        self.wakeup.lower(deadline)
    }

    async fn stored(&self) {
        self.wakeup.notified().await;
    }
}

impl Scheduler {
    /// Records how a turn ended; through a short store outage while the lease holds.
    async fn record_ending(
        &self,
        batch: i64,
        token: LeaseToken,
        ending: Ending,
        guard: &LeaseGuard,
    ) -> store::Result<()> {
        let lost = guard.lost();
        store::write_through_outage(
            &self.clock,
            || !lost.is_cancelled(),
            |now| self.store.finish(batch, token, now, ending.clone()),
        )
        .await
    }

    /// One line per turn: its outcome and timings; the customer only when configured.
    fn log_turn(&self, batch: &Batch, attempt: u32, outcome: &str, started: At) {
        let conversation = crate::telemetry::conversation_tag(&batch.conversation);
        let delay_ms = clock::millis(started.since(batch.due_at));
        let took_ms = clock::millis(self.clock.now().since(started));
        let messages = batch.messages.len();
        if self.settings.log_customer_data {
            let texts: Vec<&str> = batch
                .messages
                .iter()
                .filter_map(|m| m.text.as_deref())
                .collect();
            tracing::info!(batch = batch.id, %conversation, customer = %batch.conversation.customer,
                ?texts, attempt, messages, outcome, delay_ms, took_ms, "turn ended");
        } else {
            tracing::info!(batch = batch.id, %conversation, attempt, messages, outcome, delay_ms,
                took_ms, "turn ended");
        }
    }

    /// A reply as its channel takes it: WhatsApp parts within Meta's limits, the first quoting
    /// the customer when configured, packed when they are more than `max_reply_parts`.
    fn outgoing(&self, batch: &Batch, mut parts: Vec<ReplyPart>) -> Vec<ReplyPart> {
        if batch.conversation.channel != Channel::Whatsapp {
            return parts;
        }
        if self.settings.quote_replies {
            if let (Some(first), Some(last)) = (parts.first_mut(), batch.messages.last()) {
                first.quote.get_or_insert_with(|| last.external_id.clone());
            }
        }
        split::for_whatsapp(parts, self.settings.max_reply_parts)
    }
}

fn ending_name(ending: &Ending) -> &'static str {
    match ending {
        Ending::Replied { .. } => "replied",
        Ending::Handoff { .. } => "handoff",
        Ending::RetryAt { .. } => "retry",
        Ending::Review { reason, .. } => reason.as_str(),
    }
}
