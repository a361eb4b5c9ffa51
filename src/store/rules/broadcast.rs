//! A broadcast's lifecycle and its recipients': each recipient from its audience row to Meta's
//! last word on the template message it was sent.
//!
//! At most once per recipient per broadcast: a recipient is claimed with a fresh attempt number
//! its outcome must carry, and a send that may have left is never claimed again; it waits for a
//! status webhook instead. Meta's marketing limit per user (131049) holds a recipient for a
//! later try, a few times at most; an opt-out (131050) ends it and opts the customer out.
//! [`next`] is every rule of that in one place, as [`super::part::next`] is for reply parts.

use std::time::Duration;

use super::hours::Turn;
use super::named;
use super::part::{Delivery, Status};
use crate::clock::At;
use crate::domain::{InboundItem, ItemKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecipientState {
    /// Waiting for its turn under the broadcast's rate.
    Queued,
    /// Claimed by a sender under a lease.
    Sending,
    /// Meta took it.
    Accepted,
    Delivered,
    Read,
    /// Meta refused it for good, or it ran out of tries.
    Failed,
    /// Meta's marketing limit for this user: tried again after the hold.
    Held,
    /// Left out before any send (opted out, invalid, a duplicate, in its cooldown; `over_limit`
    /// is named for outside readers but never given: beyond Meta's messaging limit, recipients
    /// wait for headroom instead).
    Skipped,
    /// The request may have left and no status said so: never sent again.
    Unknown,
    /// The broadcast was cancelled, or its deadline passed, before it went.
    Cancelled,
}

named!(RecipientState {
    Queued => "queued",
    Sending => "sending",
    Accepted => "accepted",
    Delivered => "delivered",
    Read => "read",
    Failed => "failed",
    Held => "held",
    Skipped => "skipped",
    Unknown => "unknown",
    Cancelled => "cancelled",
});

impl RecipientState {
    /// A sender may claim it once its time has come.
    pub fn claimable(self) -> bool {
        matches!(self, RecipientState::Queued | RecipientState::Held)
    }

    /// Nothing will be sent to it any more (a status may still move a sent one forward).
    pub fn settled(self) -> bool {
        !matches!(
            self,
            RecipientState::Queued | RecipientState::Held | RecipientState::Sending
        )
    }
}

/// Why a recipient was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    OptedOut,
    Invalid,
    Duplicate,
    Cooldown,
    OverLimit,
}

named!(SkipReason {
    OptedOut => "opted_out",
    Invalid => "invalid",
    Duplicate => "duplicate",
    Cooldown => "cooldown",
    OverLimit => "over_limit",
});

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BroadcastState {
    /// Waiting for its start time.
    Scheduled,
    Running,
    /// Stopped by a person or by Meta (a template paused or disabled, quality red); resumable.
    Paused,
    /// Every recipient settled.
    Finished,
    Cancelled,
}

named!(BroadcastState {
    Scheduled => "scheduled",
    Running => "running",
    Paused => "paused",
    Finished => "finished",
    Cancelled => "cancelled",
});

impl BroadcastState {
    /// Time and people may still move it on: it is scheduled, running or paused.
    pub fn live(self) -> bool {
        matches!(
            self,
            BroadcastState::Scheduled | BroadcastState::Running | BroadcastState::Paused
        )
    }
}

/// A new broadcast runs at once, or waits for its start.
pub fn initial(now: At, start_at: At) -> BroadcastState {
    match start_at > now {
        true => BroadcastState::Scheduled,
        false => BroadcastState::Running,
    }
}

/// What time alone does to a broadcast at `now`: a scheduled one whose start came runs, and a
/// running one whose start has not come (resumed after a pause before it) waits for it; a live
/// one past its deadline is cancelled (its waiting recipients with it).
pub fn at_time(
    state: BroadcastState,
    now: At,
    start_at: At,
    deadline: Option<At>,
) -> BroadcastState {
    use BroadcastState::{Cancelled, Running, Scheduled};
    match state {
        live if live.live() && deadline.is_some_and(|d| d <= now) => Cancelled,
        Scheduled if start_at <= now => Running,
        Running if start_at > now => Scheduled,
        other => other,
    }
}

/// What a recipient read: the template's body with its placeholders filled in, in order; or,
/// when its body was not kept, the template's name and the parameters it was sent with.
pub fn sent_text(template: &str, body: Option<&str>, params: &[String]) -> String {
    let Some(body) = body else {
        return format!("[template {template}: {}]", params.join(", "));
    };
    // One pass over the body: a parameter's own text is never read as a placeholder.
    let mut text = String::with_capacity(body.len());
    let mut rest = body;
    while let Some(open) = rest.find("{{") {
        text.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let filled = after.split_once("}}").and_then(|(name, tail)| {
            let n: usize = name.trim().parse().ok()?;
            Some((params.get(n.checked_sub(1)?)?, tail))
        });
        match filled {
            Some((value, tail)) => {
                text.push_str(value);
                rest = tail;
            }
            None => {
                text.push_str("{{");
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text
}

/// The states a sender may still claim from, as an SQL list.
pub static WAITING_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    super::sql_list(
        RecipientState::ALL,
        RecipientState::as_str,
        RecipientState::claimable,
    )
});

/// The live broadcast states, as an SQL list.
pub static LIVE_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    super::sql_list(
        BroadcastState::ALL,
        BroadcastState::as_str,
        BroadcastState::live,
    )
});

/// What a person (or Meta, through a template's status) asks of a broadcast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    Pause,
    Resume,
    Cancel,
}

/// The broadcast's state after `control`; `None` when it does not apply (a finished or
/// cancelled broadcast stays so; only a paused one resumes). Cancelling also cancels every
/// recipient still waiting ([`Event::Cancel`]).
pub fn control(state: BroadcastState, control: Control) -> Option<BroadcastState> {
    use BroadcastState::{Cancelled, Paused, Running, Scheduled};
    match (state, control) {
        (Scheduled | Running, Control::Pause) => Some(Paused),
        (Paused, Control::Resume) => Some(Running),
        (Scheduled | Running | Paused, Control::Cancel) => Some(Cancelled),
        _ => None,
    }
}

/// Who paused a broadcast: a person resumes it; one paused for its template also resumes when
/// Meta approves the template again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PausedBy {
    Person,
    Template,
}

named!(PausedBy {
    Person => "person",
    Template => "template",
});

/// Meta's word on a template, from its webhooks or a send's refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateNews {
    pub name: String,
    /// The language it is about; `None`: every language of the template.
    pub language: Option<String>,
    /// `true`: it may be sent again; `false`: it may not (paused, disabled, rated RED...).
    pub approved: bool,
    /// In words, for the pause's reason.
    pub why: String,
}

impl TemplateNews {
    /// Whether it is about a broadcast's template.
    pub fn names(&self, template: &str, language: &str) -> bool {
        self.name == template && self.language.as_deref().is_none_or(|l| l == language)
    }
}

/// What Meta's word on its template does to a broadcast: a scheduled or running one pauses when
/// its template may no longer be sent; one paused for its template (never one a person paused)
/// resumes when it is approved again. `None`: nothing.
pub fn on_template(
    state: BroadcastState,
    paused_by: Option<PausedBy>,
    approved: bool,
) -> Option<(BroadcastState, Option<PausedBy>)> {
    match (state, approved) {
        (BroadcastState::Scheduled | BroadcastState::Running, false) => {
            control(state, Control::Pause).map(|s| (s, Some(PausedBy::Template)))
        }
        (BroadcastState::Paused, true) if paused_by == Some(PausedBy::Template) => {
            control(state, Control::Resume).map(|s| (s, None))
        }
        _ => None,
    }
}

/// Meta's word on a template in a stored webhook item: its status
/// (`message_template_status_update`) or its quality (`message_template_quality_update`,
/// where RED stops it).
pub fn template_news(item: &InboundItem) -> Option<TemplateNews> {
    if item.kind != ItemKind::FieldEvent {
        return None;
    }
    let value = &item.facts["value"];
    let name = value["message_template_name"].as_str()?.to_owned();
    let language = value["message_template_language"]
        .as_str()
        .map(str::to_owned);
    let (approved, why) = match item.facts["field"].as_str()? {
        "message_template_status_update" => {
            let event = value["event"].as_str()?;
            let approved = match event {
                "APPROVED" | "REINSTATED" | "UNARCHIVED" => true,
                "PAUSED" | "DISABLED" | "LOCKED" | "DELETED" | "PENDING_DELETION" | "ARCHIVED"
                | "REJECTED" | "LIMIT_EXCEEDED" => false,
                _ => return None,
            };
            let reason = value["reason"].as_str().filter(|r| *r != "NONE");
            let why = match reason {
                Some(reason) => format!("Meta: template {name} {event} ({reason})"),
                None => format!("Meta: template {name} {event}"),
            };
            (approved, why)
        }
        "message_template_quality_update" if value["new_quality_score"] == "RED" => {
            (false, format!("Meta: template {name} rated RED"))
        }
        _ => return None,
    };
    Some(TemplateNews {
        name,
        language,
        approved,
        why,
    })
}

/// Whether Meta charges for a message, by a status's `pricing`: its `type` (`regular` is
/// charged; `free_customer_service` and `free_entry_point` are not), else the older `billable`.
pub fn billed(pricing_type: Option<&str>, billable: Option<bool>) -> Option<bool> {
    match pricing_type {
        Some("regular") => Some(true),
        Some(kind) if kind.starts_with("free") => Some(false),
        _ => billable,
    }
}

/// Passes a claim makes over the due recipients while those it finds wait, are left out or are
/// cancelled rather than taken: a night's quiet hours are written off hundreds of recipients
/// per claim, not a claim's few, and never hold back those who may go.
pub const CLAIM_PASSES: usize = 32;

/// What a claim does with a due recipient: cancels it past its deadline on its own clock, lets
/// it wait for its start or for its quiet hours to end, leaves it out, or takes it.
pub fn on_claim(turn: Turn, opted_out: bool, in_cooldown: bool, lease: Duration) -> Event<'static> {
    match (turn, left_out(opted_out, in_cooldown)) {
        (Turn::Expired, _) => Event::Cancel,
        (Turn::Wait(until), _) => Event::Wait { until },
        (Turn::Go, Some(reason)) => Event::Skip(reason),
        (Turn::Go, None) => Event::Claim { lease },
    }
}

/// Whether a recipient whose turn came is left out, and why: its customer opted out of
/// broadcasts, or got another within the cooldown.
pub fn left_out(opted_out: bool, in_cooldown: bool) -> Option<SkipReason> {
    match (opted_out, in_cooldown) {
        (true, _) => Some(SkipReason::OptedOut),
        (false, true) => Some(SkipReason::Cooldown),
        (false, false) => None,
    }
}

/// How many more customers broadcasts may reach now under Meta's messaging limit (unique
/// customers per rolling 24 hours; `None`: unlimited), given those reached or being sent to in
/// that time. The rest wait for headroom.
pub fn headroom(limit: Option<u64>, reached: u64) -> usize {
    limit.map_or(usize::MAX, |limit| {
        usize::try_from(limit.saturating_sub(reached)).unwrap_or(usize::MAX)
    })
}

/// The span Meta's messaging limit counts customers over.
pub const LIMIT_SPAN: Duration = Duration::from_secs(24 * 60 * 60);

/// Meta's answer that the user stopped marketing messages.
pub const OPTED_OUT: i64 = 131_050;

/// A recipient's fields that its lifecycle reads and writes, as a backend keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipient {
    pub state: RecipientState,
    /// Claims so far: the latest is the fencing token of the send under way.
    pub attempts: u32,
    /// Failed tries so far (throttling not counted).
    pub failures: u32,
    /// Holds for Meta's marketing limit so far.
    pub holds: u32,
    pub wamid: Option<String>,
    pub delivery: Option<Delivery>,
    pub skipped: Option<SkipReason>,
    pub error_code: Option<i64>,
    pub error: Option<String>,
    /// Not to be claimed before this.
    pub next_attempt_at: Option<At>,
    /// While sending: when the send lease lapses.
    pub until: Option<At>,
    /// When Meta took it.
    pub sent_at: Option<At>,
}

impl Recipient {
    /// A recipient as the audience gives it: queued, or skipped for `reason`.
    pub fn listed(skipped: Option<SkipReason>) -> Recipient {
        Recipient {
            state: match skipped {
                Some(_) => RecipientState::Skipped,
                None => RecipientState::Queued,
            },
            attempts: 0,
            failures: 0,
            holds: 0,
            wamid: None,
            delivery: None,
            skipped,
            error_code: None,
            error: None,
            next_attempt_at: None,
            until: None,
            sent_at: None,
        }
    }
}

/// How a send to a recipient ended, as the broadcast sender reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Accepted {
        wamid: String,
    },
    /// Try again from `at`; `failure` counts it against the recipient's tries (throttling
    /// does not).
    Retry {
        at: At,
        failure: bool,
        code: Option<i64>,
        error: String,
    },
    /// Not tried at all (its number halted): back to the queue, its attempt number spent.
    Untried,
    /// Meta's marketing limit for this user (131049): try again after `until`.
    Held {
        until: At,
        code: i64,
        error: String,
    },
    /// Refused for good: 131050 (the user stopped marketing messages) also opts them out.
    Failed {
        code: Option<i64>,
        error: String,
    },
    /// The request may have left: never sent again.
    Unknown {
        error: String,
    },
}

/// How far a broadcast insists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Tries that fail before the recipient fails.
    pub max_failures: u32,
    /// Holds for Meta's marketing limit before the recipient fails.
    pub max_holds: u32,
}

impl Limits {
    /// For the events that read no limits: claims, lapses and statuses.
    pub const NONE: Limits = Limits {
        max_failures: u32::MAX,
        max_holds: u32::MAX,
    };
}

/// What can happen to a recipient.
#[derive(Debug, Clone, PartialEq)]
pub enum Event<'a> {
    /// A sender claims it, holding it until `now + lease`.
    Claim { lease: Duration },
    /// The sender of `attempt` says how the send ended.
    Outcome { attempt: u32, outcome: &'a Outcome },
    /// The send lease lapsed with no outcome: it may have left.
    LeaseLapsed,
    /// A status webhook named its message.
    Status(Status<'a>),
    /// The broadcast was cancelled or its deadline passed.
    Cancel,
    /// Left out when its turn came (see [`left_out`]).
    Skip(SkipReason),
    /// Not to go before `until`, by its own clock (see [`super::hours::LocalHours::turn`]).
    Wait { until: At },
}

/// The recipient after a step, and whether its customer opted out of broadcasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub recipient: Recipient,
    pub opted_out: bool,
}

/// Why a step was refused: nothing is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The recipient is not in a state this event applies to.
    State,
    /// An outcome carried an attempt that is not the recipient's latest.
    Attempt,
    /// Its time (a retry, a hold, the lease) has not come yet.
    NotYet,
    /// A status that changes nothing.
    Stale,
}

/// Every rule of a recipient's life: the recipient after `event` at `now`, or why not.
///
/// # Errors
/// [`Refused`] when the event does not apply to the recipient as it is.
pub fn next(r: &Recipient, event: &Event<'_>, now: At, limits: Limits) -> Result<Step, Refused> {
    match event {
        Event::Claim { lease } => claim(r, now, *lease),
        Event::Outcome { attempt, outcome } => outcome_of(r, *attempt, outcome, now, limits),
        Event::LeaseLapsed => lapse(r, now),
        Event::Status(status) => status_of(r, status, now),
        Event::Cancel => cancel(r),
        Event::Skip(reason) => skip(r, *reason),
        Event::Wait { until } => wait(r, *until),
    }
}

fn moved(recipient: Recipient) -> Result<Step, Refused> {
    Ok(Step {
        recipient,
        opted_out: false,
    })
}

fn claim(r: &Recipient, now: At, lease: Duration) -> Result<Step, Refused> {
    if !r.state.claimable() {
        return Err(Refused::State);
    }
    if r.next_attempt_at.is_some_and(|at| at > now) {
        return Err(Refused::NotYet);
    }
    moved(Recipient {
        state: RecipientState::Sending,
        attempts: r.attempts + 1,
        next_attempt_at: None,
        until: Some(now + lease),
        ..r.clone()
    })
}

fn outcome_of(
    r: &Recipient,
    attempt: u32,
    outcome: &Outcome,
    now: At,
    limits: Limits,
) -> Result<Step, Refused> {
    if r.state != RecipientState::Sending {
        return Err(Refused::State);
    }
    if attempt != r.attempts {
        return Err(Refused::Attempt);
    }
    let failed = |code: Option<i64>, error: &str| Recipient {
        state: RecipientState::Failed,
        error_code: code,
        error: Some(error.to_owned()),
        until: None,
        ..r.clone()
    };
    let again = |at: At, failures: u32, holds: u32, code: Option<i64>, error: &str| Recipient {
        state: RecipientState::Queued,
        failures,
        holds,
        error_code: code,
        error: Some(error.to_owned()),
        next_attempt_at: Some(at),
        until: None,
        ..r.clone()
    };
    match outcome {
        Outcome::Accepted { wamid } => moved(Recipient {
            state: RecipientState::Accepted,
            wamid: Some(wamid.clone()),
            delivery: r.delivery.or(Some(Delivery::Sent)),
            until: None,
            sent_at: Some(now),
            ..r.clone()
        }),
        Outcome::Retry {
            failure: true,
            code,
            error,
            ..
        } if r.failures + 1 >= limits.max_failures => {
            moved(failed(*code, &format!("out of tries: {error}")))
        }
        Outcome::Retry {
            at,
            failure,
            code,
            error,
        } => moved(again(
            *at,
            r.failures + u32::from(*failure),
            r.holds,
            *code,
            error,
        )),
        Outcome::Untried => moved(Recipient {
            state: RecipientState::Queued,
            until: None,
            ..r.clone()
        }),
        Outcome::Held { code, error, .. } if r.holds + 1 > limits.max_holds => moved(failed(
            Some(*code),
            &format!("held {} times: {error}", r.holds),
        )),
        Outcome::Held { until, code, error } => moved(Recipient {
            state: RecipientState::Held,
            ..again(*until, r.failures, r.holds + 1, Some(*code), error)
        }),
        Outcome::Failed { code, error } => Ok(Step {
            recipient: failed(*code, error),
            opted_out: *code == Some(OPTED_OUT),
        }),
        Outcome::Unknown { error } => moved(Recipient {
            state: RecipientState::Unknown,
            error: Some(error.clone()),
            until: None,
            ..r.clone()
        }),
    }
}

fn lapse(r: &Recipient, now: At) -> Result<Step, Refused> {
    if r.state != RecipientState::Sending {
        return Err(Refused::State);
    }
    if r.until.is_some_and(|until| until > now) {
        return Err(Refused::NotYet);
    }
    moved(Recipient {
        state: RecipientState::Unknown,
        error: Some("the sender stopped mid-send: it may have left".into()),
        until: None,
        ..r.clone()
    })
}

/// Meta's statuses move a sent recipient forward, never back; one for a send that may have
/// left settles it.
fn status_of(r: &Recipient, status: &Status<'_>, now: At) -> Result<Step, Refused> {
    let sent = matches!(
        r.state,
        RecipientState::Sending
            | RecipientState::Unknown
            | RecipientState::Accepted
            | RecipientState::Delivered
            | RecipientState::Read
            | RecipientState::Failed
    );
    if !sent || r.wamid.as_deref().is_some_and(|w| w != status.wamid) {
        return Err(Refused::State);
    }
    let forward = match (r.delivery, status.delivery) {
        (Some(Delivery::Failed), _) => false,
        (_, Delivery::Failed) => Delivery::rank(r.delivery) <= Delivery::rank(Some(Delivery::Sent)),
        (current, new) => Delivery::rank(Some(new)) > Delivery::rank(current),
    };
    if !forward {
        return Err(Refused::Stale);
    }
    let state = match status.delivery {
        Delivery::Sent => RecipientState::Accepted,
        Delivery::Failed => RecipientState::Failed,
        Delivery::Delivered => RecipientState::Delivered,
        Delivery::Read | Delivery::Played => RecipientState::Read,
    };
    Ok(Step {
        recipient: Recipient {
            state,
            wamid: Some(status.wamid.to_owned()),
            delivery: Some(status.delivery),
            error_code: status.code.or(r.error_code),
            until: None,
            sent_at: r.sent_at.or(Some(now)),
            ..r.clone()
        },
        opted_out: status.code == Some(OPTED_OUT),
    })
}

fn skip(r: &Recipient, reason: SkipReason) -> Result<Step, Refused> {
    if !r.state.claimable() {
        return Err(Refused::State);
    }
    moved(Recipient {
        state: RecipientState::Skipped,
        skipped: Some(reason),
        next_attempt_at: None,
        ..r.clone()
    })
}

fn wait(r: &Recipient, until: At) -> Result<Step, Refused> {
    if !r.state.claimable() {
        return Err(Refused::State);
    }
    moved(Recipient {
        next_attempt_at: Some(r.next_attempt_at.map_or(until, |at| at.max(until))),
        ..r.clone()
    })
}

fn cancel(r: &Recipient) -> Result<Step, Refused> {
    if !r.state.claimable() {
        return Err(Refused::State);
    }
    moved(Recipient {
        state: RecipientState::Cancelled,
        next_attempt_at: None,
        ..r.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: At = At::from_millis(1_000_000);
    const LIMITS: Limits = Limits {
        max_failures: 3,
        max_holds: 2,
    };

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    fn outcomes() -> Vec<Outcome> {
        let error = || "boom".to_owned();
        vec![
            Outcome::Accepted {
                wamid: "wamid.b".into(),
            },
            Outcome::Retry {
                at: NOW + ms(10),
                failure: true,
                code: Some(131_000),
                error: error(),
            },
            Outcome::Retry {
                at: NOW + ms(10),
                failure: false,
                code: Some(130_429),
                error: error(),
            },
            Outcome::Untried,
            Outcome::Held {
                until: NOW + ms(86_400_000),
                code: 131_049,
                error: error(),
            },
            Outcome::Failed {
                code: Some(OPTED_OUT),
                error: error(),
            },
            Outcome::Failed {
                code: Some(132_001),
                error: error(),
            },
            Outcome::Unknown { error: error() },
        ]
    }

    /// Every recipient the fields can describe, in every state.
    fn recipients() -> Vec<Recipient> {
        let mut all = Vec::new();
        for state in RecipientState::ALL {
            for wamid in [None, Some("wamid.a".to_owned())] {
                for delivery in [None, Some(Delivery::Sent), Some(Delivery::Read)] {
                    for (failures, holds) in [(0, 0), (2, 2)] {
                        for until in [None, Some(NOW - ms(1)), Some(NOW + ms(1))] {
                            all.push(Recipient {
                                state: *state,
                                attempts: 2,
                                failures,
                                holds,
                                wamid: wamid.clone(),
                                delivery,
                                until,
                                next_attempt_at: until,
                                ..Recipient::listed(None)
                            });
                        }
                    }
                }
            }
        }
        all
    }

    fn walk(mut check: impl FnMut(&Recipient, &Event<'_>, Result<Step, Refused>)) {
        let outcomes = outcomes();
        for r in recipients() {
            let mut events = vec![
                Event::Claim { lease: ms(50) },
                Event::LeaseLapsed,
                Event::Cancel,
                Event::Skip(SkipReason::OptedOut),
                Event::Skip(SkipReason::Cooldown),
                Event::Wait {
                    until: NOW + ms(100),
                },
            ];
            for outcome in &outcomes {
                for attempt in [2, 1] {
                    events.push(Event::Outcome { attempt, outcome });
                }
            }
            for delivery in Delivery::ALL {
                for code in [None, Some(OPTED_OUT)] {
                    for wamid in ["wamid.a", "wamid.b"] {
                        events.push(Event::Status(Status {
                            wamid,
                            delivery: *delivery,
                            code,
                        }));
                    }
                }
            }
            for event in &events {
                check(&r, event, next(&r, event, NOW, LIMITS));
            }
        }
    }

    #[test]
    fn a_send_that_may_have_left_is_never_claimed_again() {
        walk(|r, event, step| {
            if let (Ok(step), Event::Claim { .. }) = (&step, event) {
                assert!(r.state.claimable(), "{r:?}");
                assert_eq!(step.recipient.attempts, r.attempts + 1);
            }
            if r.state.settled() || r.state == RecipientState::Sending {
                assert!(
                    !matches!(
                        (event, &step),
                        (
                            Event::Claim { .. }
                                | Event::Cancel
                                | Event::Skip(_)
                                | Event::Wait { .. },
                            Ok(_)
                        )
                    ),
                    "{r:?} {event:?}"
                );
            }
        });
    }

    #[test]
    fn only_the_latest_attempt_of_a_send_under_way_records_an_outcome() {
        walk(|r, event, step| {
            if let Event::Outcome { attempt, .. } = event {
                let fresh = r.state == RecipientState::Sending && *attempt == r.attempts;
                assert_eq!(step.is_ok(), fresh, "{r:?} {event:?}");
            }
        });
    }

    #[test]
    fn delivery_never_goes_down_and_opt_outs_are_told() {
        walk(|r, event, step| {
            let Ok(step) = step else { return };
            assert!(
                Delivery::rank(step.recipient.delivery) >= Delivery::rank(r.delivery)
                    || step.recipient.delivery == Some(Delivery::Failed),
                "{r:?} {event:?}"
            );
            let opted = match event {
                Event::Outcome {
                    outcome: Outcome::Failed { code, .. },
                    ..
                } => *code == Some(OPTED_OUT),
                Event::Status(s) => s.code == Some(OPTED_OUT),
                _ => false,
            };
            assert_eq!(step.opted_out, opted, "{r:?} {event:?}");
        });
    }

    #[test]
    fn metas_pricing_says_whether_a_message_is_charged() {
        assert_eq!(
            billed(Some("regular"), Some(false)),
            Some(true),
            "type wins"
        );
        assert_eq!(billed(Some("free_entry_point"), Some(true)), Some(false));
        assert_eq!(billed(Some("free_customer_service"), None), Some(false));
        assert_eq!(billed(None, Some(true)), Some(true), "older statuses");
        assert_eq!(billed(Some("something_new"), None), None);
        assert_eq!(billed(None, None), None);
    }

    #[test]
    fn what_a_recipient_read_is_the_body_filled_in_order() {
        let params = ["Ada".to_owned(), "20%".to_owned()];
        assert_eq!(
            sent_text(
                "diwali_offer",
                Some("Happy Diwali, {{1}}! {{2}} off, {{1}}."),
                &params
            ),
            "Happy Diwali, Ada! 20% off, Ada."
        );
        assert_eq!(
            sent_text("diwali_offer", None, &params),
            "[template diwali_offer: Ada, 20%]"
        );
        let tricky = ["{{2}}".to_owned(), "x".to_owned()];
        assert_eq!(
            sent_text("t", Some("a {{1}} b {{2}} c {{3}}"), &tricky),
            "a {{2}} b x c {{3}}",
            "a parameter's text stays as it is; a placeholder without a value stays too"
        );
    }

    #[test]
    fn a_broadcast_resumed_before_its_start_waits_for_it() {
        use BroadcastState::{Running, Scheduled};
        let start = NOW + ms(60_000);
        assert_eq!(at_time(Running, NOW, start, None), Scheduled);
        assert_eq!(at_time(Scheduled, start, start, None), Running);
        assert_eq!(at_time(Running, start, start, None), Running);
    }

    #[test]
    fn a_template_stop_pauses_and_its_approval_resumes_only_what_it_paused() {
        use BroadcastState::{Cancelled, Finished, Paused, Running, Scheduled};
        let stop = |state, by| on_template(state, by, false);
        let approve = |state, by| on_template(state, by, true);
        assert_eq!(
            stop(Running, None),
            Some((Paused, Some(PausedBy::Template)))
        );
        assert_eq!(
            stop(Scheduled, None),
            Some((Paused, Some(PausedBy::Template)))
        );
        assert_eq!(stop(Paused, Some(PausedBy::Person)), None);
        assert_eq!(
            approve(Paused, Some(PausedBy::Template)),
            Some((Running, None))
        );
        assert_eq!(
            approve(Paused, Some(PausedBy::Person)),
            None,
            "a person's pause"
        );
        for ended in [Finished, Cancelled] {
            assert_eq!(stop(ended, None), None);
            assert_eq!(approve(ended, None), None);
        }
        assert_eq!(approve(Running, None), None);
    }

    #[test]
    fn holds_and_failures_run_out_into_failed() {
        let sending = |failures, holds| Recipient {
            state: RecipientState::Sending,
            attempts: 1,
            failures,
            holds,
            ..Recipient::listed(None)
        };
        let held = Outcome::Held {
            until: NOW + ms(86_400_000),
            code: 131_049,
            error: "limit".into(),
        };
        let event = Event::Outcome {
            attempt: 1,
            outcome: &held,
        };
        let once = next(&sending(0, 0), &event, NOW, LIMITS).expect("held");
        assert_eq!(once.recipient.state, RecipientState::Held);
        assert_eq!(once.recipient.next_attempt_at, Some(NOW + ms(86_400_000)));
        assert_eq!(
            next(&once.recipient, &Event::Claim { lease: ms(5) }, NOW, LIMITS),
            Err(Refused::NotYet),
            "not before the hold is over"
        );
        let last = next(&sending(0, 2), &event, NOW, LIMITS).expect("failed");
        assert_eq!(last.recipient.state, RecipientState::Failed);
        let transient = Outcome::Retry {
            at: NOW,
            failure: true,
            code: None,
            error: "503".into(),
        };
        let event = Event::Outcome {
            attempt: 1,
            outcome: &transient,
        };
        let retried = next(&sending(1, 0), &event, NOW, LIMITS).expect("queued");
        assert_eq!(
            (retried.recipient.state, retried.recipient.failures),
            (RecipientState::Queued, 2)
        );
        let out = next(&sending(2, 0), &event, NOW, LIMITS).expect("failed");
        assert_eq!(out.recipient.state, RecipientState::Failed);
    }

    #[test]
    fn a_lapsed_send_is_unknown_and_a_status_settles_it() {
        let sending = Recipient {
            state: RecipientState::Sending,
            attempts: 1,
            until: Some(NOW),
            ..Recipient::listed(None)
        };
        let lapsed = next(&sending, &Event::LeaseLapsed, NOW, LIMITS).expect("lapsed");
        assert_eq!(lapsed.recipient.state, RecipientState::Unknown);
        let delivered = Status {
            wamid: "wamid.x",
            delivery: Delivery::Delivered,
            code: None,
        };
        let settled =
            next(&lapsed.recipient, &Event::Status(delivered), NOW, LIMITS).expect("settled");
        assert_eq!(settled.recipient.state, RecipientState::Delivered);
        assert_eq!(settled.recipient.wamid.as_deref(), Some("wamid.x"));
    }

    #[test]
    fn only_a_live_broadcast_is_paused_or_cancelled_and_only_a_paused_one_resumes() {
        use BroadcastState::{Cancelled, Finished, Paused, Running, Scheduled};
        for state in BroadcastState::ALL {
            let live = matches!(state, Scheduled | Running | Paused);
            assert_eq!(control(*state, Control::Cancel).is_some(), live, "{state}");
            assert_eq!(
                control(*state, Control::Pause),
                matches!(state, Scheduled | Running).then_some(Paused)
            );
            assert_eq!(
                control(*state, Control::Resume),
                (*state == Paused).then_some(Running)
            );
        }
        assert_eq!(control(Finished, Control::Cancel), None);
        assert_eq!(control(Cancelled, Control::Resume), None);
    }

    #[test]
    fn names_are_distinct() {
        let names: std::collections::HashSet<_> =
            RecipientState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names.len(), RecipientState::ALL.len());
        assert_eq!(SkipReason::parse("over_limit"), Some(SkipReason::OverLimit));
        assert_eq!(
            BroadcastState::parse("paused"),
            Some(BroadcastState::Paused)
        );
    }

    /// One event of a generated history, owned so that proptest can make and shrink it.
    #[derive(Debug, Clone)]
    enum Happening {
        Claim,
        Lapse,
        Cancel,
        Skip,
        Wait,
        Outcome { outcome: usize, stale: bool },
        Status { delivery: usize, opted_out: bool },
    }

    fn happening() -> impl Strategy<Value = Happening> {
        prop_oneof![
            3 => Just(Happening::Claim),
            1 => Just(Happening::Lapse),
            1 => Just(Happening::Cancel),
            1 => Just(Happening::Skip),
            1 => Just(Happening::Wait),
            4 => (0..outcomes().len(), any::<bool>())
                .prop_map(|(outcome, stale)| Happening::Outcome { outcome, stale }),
            2 => (0..Delivery::ALL.len(), any::<bool>())
                .prop_map(|(delivery, opted_out)| Happening::Status { delivery, opted_out }),
        ]
    }

    use proptest::prelude::*;

    proptest! {
        /// Whole lives of a recipient: whatever happens in whatever order, once the template
        /// may have left (accepted, or its outcome unknown) it is never claimed again, every
        /// claim spends one attempt, and holds and failures stay within the broadcast's limits.
        #[test]
        fn no_history_sends_a_recipient_twice(
            history in proptest::collection::vec((happening(), 0u64..100_000_000), 1..60),
        ) {
            let outcomes = outcomes();
            let mut r = Recipient::listed(None);
            let mut now = NOW;
            let mut may_have_left = false;
            for (happening, wait) in history {
                now = now + ms(wait);
                let status;
                let event = match happening {
                    Happening::Claim => Event::Claim { lease: ms(50) },
                    Happening::Lapse => Event::LeaseLapsed,
                    Happening::Cancel => Event::Cancel,
                    Happening::Skip => Event::Skip(SkipReason::OptedOut),
                    Happening::Wait => Event::Wait { until: now + ms(3_600_000) },
                    Happening::Outcome { outcome, stale } => {
                        let attempt = r.attempts - u32::from(stale && r.attempts > 0);
                        Event::Outcome { attempt, outcome: &outcomes[outcome] }
                    }
                    Happening::Status { delivery, opted_out } => {
                        status = Status {
                            wamid: "wamid.b",
                            delivery: Delivery::ALL[delivery],
                            code: opted_out.then_some(OPTED_OUT),
                        };
                        Event::Status(status.clone())
                    }
                };
                let Ok(step) = next(&r, &event, now, LIMITS) else { continue };
                if let Event::Claim { .. } = event {
                    prop_assert!(!may_have_left, "claimed again after it may have left: {r:?}");
                    prop_assert_eq!(step.recipient.attempts, r.attempts + 1);
                } else {
                    prop_assert_eq!(step.recipient.attempts, r.attempts);
                }
                prop_assert!(step.recipient.failures < LIMITS.max_failures);
                prop_assert!(step.recipient.holds <= LIMITS.max_holds);
                may_have_left |= matches!(
                    step.recipient.state,
                    RecipientState::Accepted
                        | RecipientState::Delivered
                        | RecipientState::Read
                        | RecipientState::Unknown
                );
                r = step.recipient;
            }
        }
    }
}
