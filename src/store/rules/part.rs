//! A reply part's lifecycle, from the turn that writes it to Meta's last word on it.
//!
//! A part is claimed only when it is the oldest unsettled part of its recipient (the backends
//! select that), with a fresh attempt number its outcome must carry. A claimed part has not
//! left: only once its pacing slot is taken does it depart, and only from then may its request
//! reach Meta. A part that departed is never claimed again: it waits for a status webhook, and
//! goes to a person when none comes. So a sender that dies leaves unknown only the requests it
//! had on the wire; what it had claimed goes back to the queue when the claim lapses.
//!
//! An unknown part holds back the rest of its own reply (its parts go in order) but never a
//! later reply to the same customer.
//! [`next`] is every rule of that in one place; a backend loads a [`Part`], asks `next`, and
//! writes the part it returns with its [`Effects`].

use std::sync::LazyLock;
use std::time::Duration;

use super::{named, sql_list};
use crate::clock::At;
use crate::domain::ReviewReason;

/// Meta's error code for a message sent outside the customer service window: a text part that
/// fails with it goes again as the configured template.
pub const WINDOW_CLOSED: i64 = 131_047;

/// Where a reply part is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PartState {
    /// Kept, never sent (sandbox mode).
    Sandbox,
    /// A web-chat answer: the browser reads it from the store.
    Served,
    /// Waiting for a sender.
    Queued,
    /// A sender holds it while it waits for its pacing slot: nothing has left.
    Claimed,
    /// Its request may be on the wire, under a send lease.
    Sending,
    /// The request may have left; waiting for a status webhook to say.
    Unknown,
    /// Meta refused the text because the customer service window had closed: only the template
    /// may go now.
    WindowClosed,
    /// Meta took it.
    Accepted,
    /// Meta refused it for good, or reported it failed: a person has it.
    Failed,
    /// A person has it for another reason (unknown outcome, out of tries, no template).
    Review,
}

named!(PartState {
    Sandbox => "sandbox",
    Served => "served",
    Queued => "queued",
    Claimed => "claimed",
    Sending => "sending",
    Unknown => "unknown",
    WindowClosed => "window_closed",
    Accepted => "accepted",
    Failed => "failed",
    Review => "review",
});

impl PartState {
    /// A sender may claim it (once it heads its recipient's queue).
    pub fn claimable(self) -> bool {
        matches!(self, PartState::Queued | PartState::WindowClosed)
    }

    /// It still holds its recipient's queue: a later part waits until it settles.
    pub fn unsettled(self) -> bool {
        matches!(
            self,
            PartState::Queued
                | PartState::Claimed
                | PartState::Sending
                | PartState::Unknown
                | PartState::WindowClosed
        )
    }

    /// It holds back every later part to its recipient, of any reply. An unknown part holds
    /// back only the rest of its own reply: a customer's next answer does not wait for Meta's
    /// word on an earlier one.
    pub fn holds_later_replies(self) -> bool {
        self.unsettled() && self != PartState::Unknown
    }

    /// A lease or wait runs out in this state (`until`).
    pub fn times_out(self) -> bool {
        matches!(
            self,
            PartState::Claimed | PartState::Sending | PartState::Unknown
        )
    }

    /// The states a status webhook may find by the callback data of the send it names: the
    /// send of that attempt may be under way, unanswered, recorded, or with a person because
    /// no status came in time.
    pub fn named_by_callback(self) -> bool {
        matches!(
            self,
            PartState::Sending | PartState::Unknown | PartState::Accepted | PartState::Review
        )
    }
}

/// Meta's statuses of a sent message. They only move forward: a late `sent` never hides a
/// `read`; `failed` overrides only `sent` (Meta may accept, then fail to deliver). A status
/// that says nothing of delivery (`deleted`, ...) has no `Delivery` and changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Delivery {
    Sent,
    Failed,
    Delivered,
    Read,
    /// A voice message was played: as far as a status goes.
    Played,
}

named!(Delivery {
    Sent => "sent",
    Failed => "failed",
    Delivered => "delivered",
    Read => "read",
    Played => "played",
});

impl Delivery {
    pub fn rank(delivery: Option<Delivery>) -> u8 {
        match delivery {
            None => 0,
            Some(Delivery::Sent) => 1,
            Some(Delivery::Failed) => 2,
            Some(Delivery::Delivered) => 3,
            Some(Delivery::Read | Delivery::Played) => 4,
        }
    }
}

/// What went out for a part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartKind {
    /// The reply's own text (or interactive message, with options).
    Text,
    /// The configured template, because the window had closed.
    Template,
}

named!(PartKind {
    Text => "text",
    Template => "template",
});

/// The claimable states as an SQL list, for the backends' claim queries.
pub static CLAIMABLE_SQL: LazyLock<String> =
    LazyLock::new(|| sql_list(PartState::ALL, PartState::as_str, PartState::claimable));

/// The unsettled states as an SQL list: a part in one holds the rest of its reply.
pub static UNSETTLED_SQL: LazyLock<String> =
    LazyLock::new(|| sql_list(PartState::ALL, PartState::as_str, PartState::unsettled));

/// The states that hold back later replies to the recipient, as an SQL list.
pub static HOLDING_SQL: LazyLock<String> = LazyLock::new(|| {
    sql_list(
        PartState::ALL,
        PartState::as_str,
        PartState::holds_later_replies,
    )
});

/// For each state whose lease or wait runs out, an SQL scalar subquery of its earliest end
/// (each reads the state's own partial index): for the backends' "when is a send next due".
pub fn lease_ends_sql() -> Vec<String> {
    PartState::ALL
        .iter()
        .filter(|state| state.times_out())
        .map(|state| format!("(SELECT min(send_until) FROM outbox WHERE state = '{state}')"))
        .collect()
}

/// An SQL condition, true when the part `o` of the outbox is held back: by an unsettled earlier
/// part `p` of its own reply, or by one of an earlier reply that holds every later reply and
/// is not itself waiting behind an unknown part `u` of its reply (that reply is out of the
/// recipient's queue until Meta or a person settles it).
pub static HELD_BACK_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "EXISTS (SELECT 1 FROM outbox p WHERE p.conversation_id = o.conversation_id
                 AND p.id < o.id AND p.state IN {unsettled}
                 AND (p.batch_id = o.batch_id
                      OR p.state IN {holding}
                         AND NOT EXISTS (SELECT 1 FROM outbox u WHERE u.batch_id = p.batch_id
                                         AND u.id < p.id AND u.state = '{unknown}')))",
        unsettled = *UNSETTLED_SQL,
        holding = *HOLDING_SQL,
        unknown = PartState::Unknown,
    )
});

/// A reply part's fields that its lifecycle reads and writes, as a backend keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub state: PartState,
    /// Claims so far: the latest is the fencing token of the send under way.
    pub attempts: u32,
    /// Failed tries so far (throttling not counted).
    pub failures: u32,
    /// Claimed for the template: only the template may go.
    pub window_closed: bool,
    /// Meta's id, once a send answer or a status webhook named it.
    pub wamid: Option<String>,
    pub kind: PartKind,
    pub delivery: Option<Delivery>,
    pub error_code: Option<i64>,
    pub error: Option<String>,
    /// Not to be claimed before this.
    pub next_attempt_at: Option<At>,
    /// While claimed or sending: when the lease lapses; while unknown: when the wait for a
    /// status ends.
    pub until: Option<At>,
    /// When Meta took it.
    pub sent_at: Option<At>,
}

impl Part {
    /// A part as a turn writes it.
    pub fn written(state: PartState) -> Part {
        Part {
            state,
            attempts: 0,
            failures: 0,
            window_closed: false,
            wamid: None,
            kind: PartKind::Text,
            delivery: None,
            error_code: None,
            error: None,
            next_attempt_at: None,
            until: None,
            sent_at: None,
        }
    }
}

/// A status webhook about a part Sabi sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status<'a> {
    pub wamid: &'a str,
    pub delivery: Delivery,
    /// Meta's error code, for a failure.
    pub code: Option<i64>,
}

/// What can happen to a part.
#[derive(Debug, Clone, PartialEq)]
pub enum Event<'a> {
    /// A sender claims it, holding it until `now + lease` while it waits for its pacing slot.
    Claim { lease: Duration },
    /// The sender of `attempt` took the pacing slot: its request may leave from now on, under a
    /// send lease until `now + lease`.
    Depart { attempt: u32, lease: Duration },
    /// The sender of `attempt` says how the send ended.
    Outcome {
        attempt: u32,
        result: &'a SendResult,
    },
    /// The lease lapsed with no outcome (the sender died or hung): a claimed part goes back to
    /// the queue; a departed one may have left.
    LeaseLapsed { unknown_wait: Duration },
    /// The wait for a status webhook ended with none.
    WaitOver,
    /// A status webhook named it, by Meta's id or by the send's callback data. A send it
    /// settles before its sender answered holds the recipient for this spacing from now:
    /// the status came after Meta took the message, so the next one cannot follow too soon.
    Status(Status<'a>, Duration),
    /// A person sent it back to the queue from review: it may go again.
    Requeue,
}

/// What else a step asks for, beside writing the part.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Effects {
    /// Open (or open again) the part's review item, with this reason and error.
    pub review: Option<(ReviewReason, String)>,
    /// Hold back every part to this recipient until then.
    pub hold_recipient_until: Option<At>,
    /// Close the part's open review item, with [`SETTLED_BY_STATUS`] as its note: Meta's word
    /// came after a person was asked.
    pub close_review: bool,
}

/// The note on a review item a late status webhook closed.
pub const SETTLED_BY_STATUS: &str =
    "Meta's status webhook came late and says the message was sent: nothing for a person to do";

/// The part after a step, and what else to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub part: Part,
    pub effects: Effects,
}

/// Why a step was refused: nothing is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The part is not in a state this event applies to.
    State,
    /// An outcome carried an attempt that is not the part's latest: the lease was lost.
    Attempt,
    /// The lease or wait has not run out yet.
    NotYet,
    /// A status that changes nothing (an older or repeated one).
    Stale,
}

/// Every rule of a reply part's life: the part after `event` at `now`, or why it is refused.
///
/// # Errors
/// [`Refused`] when the event does not apply to the part as it is.
pub fn next(part: &Part, event: &Event<'_>, now: At) -> Result<Step, Refused> {
    match event {
        Event::Claim { lease } => claim(part, now, *lease),
        Event::Depart { attempt, lease } => depart(part, *attempt, now, *lease),
        Event::Outcome { attempt, result } => outcome(part, *attempt, result, now),
        Event::LeaseLapsed { unknown_wait } => lapse(part, now, *unknown_wait),
        Event::WaitOver => wait_over(part, now),
        Event::Status(status, spacing) => status_of(part, status, now, *spacing),
        Event::Requeue => requeue(part),
    }
}

fn moved(part: Part) -> Result<Step, Refused> {
    Ok(Step {
        part,
        effects: Effects::default(),
    })
}

fn claim(part: &Part, now: At, lease: Duration) -> Result<Step, Refused> {
    if !part.state.claimable() {
        return Err(Refused::State);
    }
    if part.next_attempt_at.is_some_and(|at| at > now) {
        return Err(Refused::NotYet);
    }
    moved(Part {
        state: PartState::Claimed,
        attempts: part.attempts + 1,
        window_closed: part.state == PartState::WindowClosed,
        until: Some(now + lease),
        ..part.clone()
    })
}

fn depart(part: &Part, attempt: u32, now: At, lease: Duration) -> Result<Step, Refused> {
    if part.state != PartState::Claimed {
        return Err(Refused::State);
    }
    if part.attempts != attempt {
        return Err(Refused::Attempt);
    }
    moved(Part {
        state: PartState::Sending,
        until: Some(now + lease),
        ..part.clone()
    })
}

/// Where a send that did not go returns: the template's queue when it was claimed for it.
fn back(part: &Part) -> PartState {
    if part.window_closed {
        PartState::WindowClosed
    } else {
        PartState::Queued
    }
}

fn outcome(part: &Part, attempt: u32, result: &SendResult, now: At) -> Result<Step, Refused> {
    if part.state == PartState::Accepted {
        return accepted_again(part, attempt, result, now);
    }
    // A claimed part never left: only "not tried" may end it (its number was halted).
    let applies = match part.state {
        PartState::Sending => true,
        PartState::Claimed => matches!(result, SendResult::Untried),
        _ => false,
    };
    if !applies {
        return Err(Refused::State);
    }
    if part.attempts != attempt {
        return Err(Refused::Attempt);
    }
    // A status webhook already named this send: Meta has it, whatever the sender saw.
    let noted = part
        .wamid
        .as_ref()
        .filter(|_| !matches!(result, SendResult::Accepted { .. }));
    if let Some(wamid) = noted {
        return accepted(part, wamid, false, now, now);
    }
    let mut effects = Effects::default();
    let part = match result {
        SendResult::Accepted {
            wamid,
            template,
            next_send_at,
        } => return accepted(part, wamid, *template, *next_send_at, now),
        SendResult::Retry {
            at,
            failure,
            code,
            error,
            recipient_after,
        } => {
            effects.hold_recipient_until = *recipient_after;
            Part {
                state: back(part),
                next_attempt_at: Some(*at),
                failures: part.failures + u32::from(*failure),
                error_code: *code,
                error: Some(error.clone()),
                until: None,
                ..part.clone()
            }
        }
        SendResult::Untried => Part {
            state: back(part),
            until: None,
            ..part.clone()
        },
        SendResult::WindowClosed { code, error } => closed_window(part, *code, error.clone()),
        SendResult::Unknown { error, wait_until } => Part {
            state: PartState::Unknown,
            until: Some(*wait_until),
            error: Some(error.clone()),
            ..part.clone()
        },
        SendResult::Review {
            reason,
            code,
            error,
        } => {
            effects.review = Some((*reason, error.clone()));
            Part {
                state: if *reason == ReviewReason::SendFailed {
                    PartState::Failed
                } else {
                    PartState::Review
                },
                error_code: *code,
                error: Some(error.clone()),
                until: None,
                ..part.clone()
            }
        }
    };
    Ok(Step { part, effects })
}

fn accepted(
    part: &Part,
    wamid: &str,
    template: bool,
    next_send_at: At,
    now: At,
) -> Result<Step, Refused> {
    Ok(Step {
        part: Part {
            state: PartState::Accepted,
            wamid: Some(wamid.to_owned()),
            kind: if template || part.window_closed {
                PartKind::Template
            } else {
                PartKind::Text
            },
            sent_at: Some(now),
            until: None,
            ..part.clone()
        },
        effects: Effects {
            hold_recipient_until: Some(next_send_at),
            ..Effects::default()
        },
    })
}

/// The sender's answer for a part a status webhook settled first: Meta's own word on the same
/// send, so only what the status could not tell is kept (whether the template went, and the
/// recipient's spacing from the answer). Any other answer is refused: Meta has the part.
fn accepted_again(
    part: &Part,
    attempt: u32,
    result: &SendResult,
    now: At,
) -> Result<Step, Refused> {
    let SendResult::Accepted {
        wamid,
        template,
        next_send_at,
    } = result
    else {
        return Err(Refused::State);
    };
    if part.attempts != attempt {
        return Err(Refused::Attempt);
    }
    if part.wamid.as_deref() != Some(wamid) {
        return Err(Refused::State);
    }
    accepted(
        part,
        wamid,
        *template,
        *next_send_at,
        part.sent_at.unwrap_or(now),
    )
}

/// From now on only the template may go for this part, at once: a new message, with its own
/// id and statuses.
fn closed_window(part: &Part, code: Option<i64>, error: String) -> Part {
    Part {
        state: PartState::WindowClosed,
        window_closed: true,
        wamid: None,
        delivery: None,
        error_code: code,
        error: Some(error),
        next_attempt_at: None,
        until: None,
        ..part.clone()
    }
}

fn lapse(part: &Part, now: At, unknown_wait: Duration) -> Result<Step, Refused> {
    if !matches!(part.state, PartState::Claimed | PartState::Sending) {
        return Err(Refused::State);
    }
    if part.until.is_some_and(|until| until > now) {
        return Err(Refused::NotYet);
    }
    // Nothing left: it goes again, to whichever sender claims it next.
    if part.state == PartState::Claimed && part.wamid.is_none() {
        return moved(Part {
            state: back(part),
            until: None,
            ..part.clone()
        });
    }
    // A status webhook named it meanwhile: it left after all.
    let part = if part.wamid.is_some() {
        Part {
            state: PartState::Accepted,
            sent_at: Some(part.sent_at.unwrap_or(now)),
            until: None,
            ..part.clone()
        }
    } else {
        Part {
            state: PartState::Unknown,
            until: Some(now + unknown_wait),
            error: Some(
                part.error
                    .clone()
                    .unwrap_or_else(|| "the sender stopped while sending".to_owned()),
            ),
            ..part.clone()
        }
    };
    moved(part)
}

fn wait_over(part: &Part, now: At) -> Result<Step, Refused> {
    if part.state != PartState::Unknown {
        return Err(Refused::State);
    }
    if part.until.is_some_and(|until| until > now) {
        return Err(Refused::NotYet);
    }
    let why = "no status webhook named this send in time; it may or may not have been delivered";
    Ok(Step {
        part: Part {
            state: PartState::Review,
            ..part.clone()
        },
        effects: Effects {
            review: Some((ReviewReason::UnknownOutcome, why.to_owned())),
            ..Effects::default()
        },
    })
}

fn status_of(
    part: &Part,
    status: &Status<'_>,
    now: At,
    spacing: Duration,
) -> Result<Step, Refused> {
    // A status names a part by Meta's id, or, before the part has one, by the callback data of
    // a send that may be under way or recorded.
    let named = match &part.wamid {
        _ if matches!(part.state, PartState::Sandbox | PartState::Served) => false,
        Some(wamid) => wamid == status.wamid,
        None => part.state.named_by_callback(),
    };
    if !named {
        return Err(Refused::State);
    }
    let mut part = part.clone();
    let mut changed = false;
    let mut closes_review = false;
    let holds = (part.state == PartState::Sending).then_some(now + spacing);
    match part.state {
        // Meta has it, whether its sender is still in its request (a status often races the
        // answer), lost the answer, or died: it is settled at once, and never sent again. A
        // sender that is still there adds what its answer says ([`accepted_again`]).
        PartState::Sending | PartState::Unknown => {
            part.state = PartState::Accepted;
            part.wamid = Some(status.wamid.to_owned());
            part.sent_at = Some(part.sent_at.unwrap_or(now));
            part.until = None;
            changed = true;
        }
        // No status came in time and a person was asked; this one says it was sent, so the
        // person has nothing to do. A failure stays with the person, who has it already.
        PartState::Review if part.wamid.is_none() => {
            part.wamid = Some(status.wamid.to_owned());
            changed = true;
            if status.delivery != Delivery::Failed {
                part.state = PartState::Accepted;
                part.sent_at = Some(now);
                closes_review = true;
            }
        }
        _ => {}
    }
    let closed = |part| {
        Ok(Step {
            part,
            effects: Effects {
                close_review: closes_review,
                hold_recipient_until: holds,
                review: None,
            },
        })
    };
    if Delivery::rank(Some(status.delivery)) <= Delivery::rank(part.delivery) {
        return if changed {
            closed(part)
        } else {
            Err(Refused::Stale)
        };
    }
    part.delivery = Some(status.delivery);
    // Only a failure of a part people do not have yet changes more than its delivery.
    let with_people = matches!(part.state, PartState::Failed | PartState::Review);
    if status.delivery != Delivery::Failed || with_people {
        return closed(part);
    }
    let error = format!(
        "Meta reported the message failed (code {})",
        status
            .code
            .map_or_else(|| "unknown".to_owned(), |c| c.to_string())
    );
    if status.code == Some(WINDOW_CLOSED) && part.kind == PartKind::Text {
        return Ok(Step {
            part: closed_window(&part, status.code, error),
            effects: Effects {
                hold_recipient_until: holds,
                ..Effects::default()
            },
        });
    }
    Ok(Step {
        part: Part {
            state: PartState::Failed,
            error_code: status.code,
            error: Some(error.clone()),
            ..part
        },
        effects: Effects {
            review: Some((ReviewReason::SendFailed, error)),
            hold_recipient_until: holds,
            ..Effects::default()
        },
    })
}

/// A fresh start, whatever happened before: the person accepts it may arrive twice.
fn requeue(part: &Part) -> Result<Step, Refused> {
    if !matches!(part.state, PartState::Failed | PartState::Review) {
        return Err(Refused::State);
    }
    moved(Part {
        state: back(part),
        wamid: None,
        delivery: None,
        failures: 0,
        next_attempt_at: None,
        until: None,
        ..part.clone()
    })
}

/// How a send ended. Written with the send's attempt, atomically.
#[derive(Debug, Clone, PartialEq)]
pub enum SendResult {
    /// Meta took it; the recipient's next part may go from `next_send_at`.
    Accepted {
        wamid: String,
        template: bool,
        next_send_at: At,
    },
    /// Try again from `at`. `failure` counts it against the part's tries; a throttling
    /// answer does not. `recipient_after` holds back every part to this recipient.
    Retry {
        at: At,
        failure: bool,
        code: Option<i64>,
        error: String,
        recipient_after: Option<At>,
    },
    /// Not tried at all (its number is halted): back to the queue. Its attempt number stays
    /// spent, so a late write of this outcome can never settle a later claim of the part.
    Untried,
    /// Meta refused the text because the customer service window had closed: from now on
    /// only the template may go for this part, at once.
    WindowClosed { code: Option<i64>, error: String },
    /// The request may have left: never resent; a status webhook naming it settles it, or it
    /// goes to review after `wait_until`.
    Unknown { error: String, wait_until: At },
    /// For a person: Meta refused it for good, it ran out of tries, or the window had closed.
    Review {
        reason: ReviewReason,
        code: Option<i64>,
        error: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: At = At::from_millis(1_000);

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    fn results() -> Vec<SendResult> {
        let error = || "boom".to_owned();
        vec![
            SendResult::Accepted {
                wamid: "wamid.sent".into(),
                template: false,
                next_send_at: NOW + ms(5),
            },
            SendResult::Retry {
                at: NOW + ms(10),
                failure: true,
                code: Some(131_000),
                error: error(),
                recipient_after: Some(NOW + ms(20)),
            },
            SendResult::Untried,
            SendResult::WindowClosed {
                code: Some(WINDOW_CLOSED),
                error: error(),
            },
            SendResult::Unknown {
                error: error(),
                wait_until: NOW + ms(30),
            },
            SendResult::Review {
                reason: ReviewReason::SendFailed,
                code: Some(131_026),
                error: error(),
            },
            SendResult::Review {
                reason: ReviewReason::WindowClosed,
                code: None,
                error: error(),
            },
        ]
    }

    /// Every part the fields can describe, in every state.
    fn parts() -> Vec<Part> {
        let mut parts = Vec::new();
        for state in PartState::ALL {
            for window_closed in [false, true] {
                for wamid in [None, Some("wamid.a".to_owned())] {
                    for kind in PartKind::ALL {
                        for delivery in [None, Some(Delivery::Sent), Some(Delivery::Read)] {
                            for until in [None, Some(NOW - ms(1)), Some(NOW + ms(1))] {
                                parts.push(Part {
                                    state: *state,
                                    attempts: 2,
                                    window_closed,
                                    wamid: wamid.clone(),
                                    kind: *kind,
                                    delivery,
                                    until,
                                    next_attempt_at: until,
                                    ..Part::written(*state)
                                });
                            }
                        }
                    }
                }
            }
        }
        parts
    }

    /// Every event, with every outcome for the right and a stale attempt and every status.
    fn walk(mut check: impl FnMut(&Part, &Event<'_>, Result<Step, Refused>)) {
        let results = results();
        for part in parts() {
            let mut events = vec![
                Event::Claim { lease: ms(50) },
                Event::Depart {
                    attempt: 2,
                    lease: ms(40),
                },
                Event::Depart {
                    attempt: 1,
                    lease: ms(40),
                },
                Event::LeaseLapsed {
                    unknown_wait: ms(60),
                },
                Event::WaitOver,
                Event::Requeue,
            ];
            for result in &results {
                for attempt in [2, 1] {
                    events.push(Event::Outcome { attempt, result });
                }
            }
            for delivery in Delivery::ALL {
                for code in [None, Some(WINDOW_CLOSED), Some(131_026)] {
                    for wamid in ["wamid.a", "wamid.b"] {
                        let status = Status {
                            wamid,
                            delivery: *delivery,
                            code,
                        };
                        events.push(Event::Status(status, ms(5)));
                    }
                }
            }
            for event in &events {
                check(&part, event, next(&part, event, NOW));
            }
        }
    }

    #[test]
    fn only_the_latest_attempt_of_a_send_under_way_records_an_outcome() {
        walk(|part, event, step| {
            if let Event::Outcome { attempt, result } = event {
                let claimed_untried =
                    part.state == PartState::Claimed && matches!(result, SendResult::Untried);
                // A status settled it first and the sender says the same.
                let same_answer = part.state == PartState::Accepted
                    && matches!(result, SendResult::Accepted { wamid, .. } if part.wamid.as_ref() == Some(wamid));
                let holds = (part.state == PartState::Sending || claimed_untried || same_answer)
                    && part.attempts == *attempt;
                assert_eq!(step.is_ok(), holds, "{part:?} {event:?}");
            }
            if let Event::Depart { attempt, .. } = event {
                let holds = part.state == PartState::Claimed && part.attempts == *attempt;
                assert_eq!(step.is_ok(), holds, "{part:?} {event:?}");
            }
        });
    }

    #[test]
    fn a_send_that_may_have_left_is_never_claimed_again() {
        walk(|part, event, step| {
            let Ok(step) = step else { return };
            if step.part.state.claimable() && !part.state.claimable() {
                // Back to the queue only untried, by a person, or as the template after Meta
                // said the window had closed (a new message, not the same one again).
                let allowed = match event {
                    Event::Requeue => true,
                    // A claimed part never left.
                    Event::LeaseLapsed { .. } => part.state == PartState::Claimed,
                    Event::Outcome { result, .. } => matches!(
                        result,
                        SendResult::Retry { .. }
                            | SendResult::Untried
                            | SendResult::WindowClosed { .. }
                    ),
                    Event::Status(status, _) => {
                        status.code == Some(WINDOW_CLOSED) && part.kind == PartKind::Text
                    }
                    _ => false,
                };
                assert!(allowed, "{part:?} {event:?} -> {:?}", step.part);
                assert!(step.part.wamid.is_none() || *event == Event::Requeue);
            }
            if let Event::Claim { .. } = event {
                assert!(part.state.claimable(), "{part:?} claimed");
                assert_eq!(step.part.attempts, part.attempts + 1);
            } else {
                assert_eq!(step.part.attempts, part.attempts, "{event:?}");
            }
        });
    }

    #[test]
    fn delivery_only_moves_forward_unless_the_part_goes_again() {
        walk(|part, event, step| {
            let Ok(step) = step else { return };
            let again = step.part.state == PartState::WindowClosed || *event == Event::Requeue;
            if !again {
                assert!(
                    Delivery::rank(step.part.delivery) >= Delivery::rank(part.delivery),
                    "{part:?} {event:?}"
                );
            }
        });
    }

    #[test]
    fn a_person_is_asked_exactly_when_a_part_lands_with_people() {
        walk(|part, event, step| {
            let Ok(step) = step else { return };
            let with_people = |s: PartState| matches!(s, PartState::Failed | PartState::Review);
            let arrives = with_people(step.part.state) && !with_people(part.state);
            assert_eq!(
                step.effects.review.is_some(),
                arrives,
                "{part:?} {event:?} -> {step:?}"
            );
        });
    }

    #[test]
    fn sandbox_and_web_chat_parts_never_move() {
        walk(|part, event, step| {
            if matches!(part.state, PartState::Sandbox | PartState::Served) {
                assert!(step.is_err(), "{part:?} {event:?}");
            }
        });
    }

    #[test]
    fn a_status_settles_an_unknown_outcome_and_a_later_one_is_kept() {
        let mut part = Part {
            attempts: 1,
            until: Some(NOW + ms(100)),
            ..Part::written(PartState::Unknown)
        };
        let delivered = Status {
            wamid: "wamid.x",
            delivery: Delivery::Delivered,
            code: None,
        };
        part = next(&part, &Event::Status(delivered, ms(5)), NOW)
            .expect("settled")
            .part;
        assert_eq!(part.state, PartState::Accepted);
        assert_eq!(part.wamid.as_deref(), Some("wamid.x"));
        let sent = Status {
            wamid: "wamid.x",
            delivery: Delivery::Sent,
            code: None,
        };
        assert_eq!(
            next(&part, &Event::Status(sent, ms(5)), NOW),
            Err(Refused::Stale)
        );
        let other = Status {
            wamid: "wamid.y",
            delivery: Delivery::Read,
            code: None,
        };
        assert_eq!(
            next(&part, &Event::Status(other, ms(5)), NOW),
            Err(Refused::State)
        );
    }

    #[test]
    fn a_status_settles_a_send_under_way_at_once_and_its_sender_adds_the_spacing() {
        let sending = Part {
            attempts: 1,
            until: Some(NOW + ms(100)),
            ..Part::written(PartState::Sending)
        };
        let delivered = Status {
            wamid: "wamid.x",
            delivery: Delivery::Delivered,
            code: None,
        };
        let step = next(&sending, &Event::Status(delivered, ms(10)), NOW + ms(3)).expect("settled");
        assert_eq!(step.effects.hold_recipient_until, Some(NOW + ms(13)));
        let settled = step.part;
        assert_eq!(settled.state, PartState::Accepted);
        assert_eq!(settled.sent_at, Some(NOW + ms(3)));
        let answer = |wamid: &str| SendResult::Accepted {
            wamid: wamid.into(),
            template: true,
            next_send_at: NOW + ms(14),
        };
        let same = answer("wamid.x");
        let event = Event::Outcome {
            attempt: 1,
            result: &same,
        };
        let step = next(&settled, &event, NOW + ms(4)).expect("the sender's answer kept");
        assert_eq!(step.part.kind, PartKind::Template);
        assert_eq!(step.part.sent_at, Some(NOW + ms(3)));
        assert_eq!(step.part.delivery, Some(Delivery::Delivered));
        assert_eq!(step.effects.hold_recipient_until, Some(NOW + ms(14)));
        let other = answer("wamid.y");
        let event = Event::Outcome {
            attempt: 1,
            result: &other,
        };
        assert_eq!(next(&settled, &event, NOW), Err(Refused::State));
        let lost = SendResult::Unknown {
            error: "timed out".into(),
            wait_until: NOW + ms(50),
        };
        let event = Event::Outcome {
            attempt: 1,
            result: &lost,
        };
        assert_eq!(next(&settled, &event, NOW), Err(Refused::State));
    }

    #[test]
    fn a_closed_window_sends_the_template_once() {
        let part = Part {
            attempts: 1,
            wamid: Some("wamid.t".into()),
            ..Part::written(PartState::Accepted)
        };
        let failed = Status {
            wamid: "wamid.t",
            delivery: Delivery::Failed,
            code: Some(WINDOW_CLOSED),
        };
        let step = next(&part, &Event::Status(failed.clone(), ms(5)), NOW).expect("moved");
        assert_eq!(step.part.state, PartState::WindowClosed);
        let claimed = next(&step.part, &Event::Claim { lease: ms(10) }, NOW).expect("claimed");
        let departed = Event::Depart {
            attempt: 2,
            lease: ms(10),
        };
        let claimed = next(&claimed.part, &departed, NOW).expect("departed");
        let sent = SendResult::Accepted {
            wamid: "wamid.u".into(),
            template: false,
            next_send_at: NOW,
        };
        let event = Event::Outcome {
            attempt: 2,
            result: &sent,
        };
        let template = next(&claimed.part, &event, NOW).expect("accepted").part;
        assert_eq!(template.kind, PartKind::Template);
        // The template failing for the same reason goes to a person, not round again.
        let failed = Status {
            wamid: "wamid.u",
            ..failed
        };
        let step = next(&template, &Event::Status(failed, ms(5)), NOW).expect("failed");
        assert_eq!(step.part.state, PartState::Failed);
    }

    /// One event of a generated history, owned so that proptest can make and shrink it.
    #[derive(Debug, Clone)]
    enum Happening {
        Claim,
        Depart {
            stale: bool,
        },
        Lapse,
        WaitOver,
        Requeue,
        Outcome {
            result: usize,
            stale: bool,
        },
        Status {
            delivery: usize,
            code: usize,
            ours: bool,
        },
    }

    fn happening() -> impl Strategy<Value = Happening> {
        prop_oneof![
            3 => Just(Happening::Claim),
            3 => any::<bool>().prop_map(|stale| Happening::Depart { stale }),
            1 => Just(Happening::Lapse),
            1 => Just(Happening::WaitOver),
            1 => Just(Happening::Requeue),
            3 => (0..results().len(), any::<bool>())
                .prop_map(|(result, stale)| Happening::Outcome { result, stale }),
            3 => (0..Delivery::ALL.len(), 0..3usize, any::<bool>())
                .prop_map(|(delivery, code, ours)| Happening::Status { delivery, code, ours }),
        ]
    }

    use proptest::prelude::*;

    proptest! {
        /// Whole lives of a part, not single steps: whatever happens in whatever order, a
        /// message that may have left is not claimed again until a person sends it back or Meta
        /// closed the window (then the template, a new message, goes once); delivery never goes
        /// down meanwhile; every claim spends one attempt; a person is asked only on arrival.
        #[test]
        fn no_history_sends_a_message_twice(
            history in proptest::collection::vec((happening(), 0u64..80), 1..60),
        ) {
            let results = results();
            let mut part = Part::written(PartState::Queued);
            let mut now = NOW;
            let mut may_have_left = false;
            let mut template_left = false;
            for (happening, wait) in history {
                now = now + ms(wait);
                let result;
                let status;
                let event = match happening {
                    Happening::Claim => Event::Claim { lease: ms(50) },
                    Happening::Depart { stale } => Event::Depart {
                        attempt: part.attempts - u32::from(stale && part.attempts > 0),
                        lease: ms(40),
                    },
                    Happening::Lapse => Event::LeaseLapsed { unknown_wait: ms(60) },
                    Happening::WaitOver => Event::WaitOver,
                    Happening::Requeue => Event::Requeue,
                    Happening::Outcome { result: i, stale } => {
                        result = results[i].clone();
                        let attempt = part.attempts - u32::from(stale && part.attempts > 0);
                        Event::Outcome { attempt, result: &result }
                    }
                    Happening::Status { delivery, code, ours } => {
                        status = Status {
                            wamid: if ours { "wamid.sent" } else { "wamid.other" },
                            delivery: Delivery::ALL[delivery],
                            code: [None, Some(WINDOW_CLOSED), Some(131_026)][code],
                        };
                        Event::Status(status.clone(), ms(5))
                    }
                };
                let Ok(step) = next(&part, &event, now) else { continue };
                let again = event == Event::Requeue || step.part.state == PartState::WindowClosed;
                if let Event::Claim { .. } = event {
                    prop_assert!(!may_have_left, "claimed again after it may have left: {part:?}");
                    prop_assert_eq!(step.part.attempts, part.attempts + 1);
                } else {
                    prop_assert_eq!(step.part.attempts, part.attempts);
                }
                if !again {
                    prop_assert!(Delivery::rank(step.part.delivery) >= Delivery::rank(part.delivery));
                }
                let with_people = |s: PartState| matches!(s, PartState::Failed | PartState::Review);
                prop_assert_eq!(
                    step.effects.review.is_some(),
                    with_people(step.part.state) && !with_people(part.state)
                );
                // A person's item closes only when Meta's word takes the part off their hands.
                prop_assert_eq!(
                    step.effects.close_review,
                    part.state == PartState::Review && step.part.state == PartState::Accepted
                );
                if event == Event::Requeue {
                    template_left = false;
                }
                prop_assert!(
                    !(template_left && step.part.state == PartState::WindowClosed),
                    "the template again: {part:?} {event:?}"
                );
                template_left |= step.part.kind == PartKind::Template
                    && matches!(step.part.state, PartState::Accepted | PartState::Unknown);
                may_have_left = match step.part.state {
                    _ if again => false,
                    PartState::Accepted | PartState::Unknown => true,
                    _ => may_have_left || step.part.wamid.is_some(),
                };
                part = step.part;
            }
        }
    }
}
