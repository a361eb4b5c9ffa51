//! PURE: what to do with a claimed batch, and how a failed turn ends. No IO.

use std::time::Duration;

use crate::clock::At;
use crate::config::EnginePolicy;
use crate::domain::{Claim, ReviewReason};
use crate::store::Ending;
use crate::store::rules::review::person_holds;

/// What a worker does with a batch it has just claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Run,
    Review(ReviewReason),
}

/// Decides before any work: a batch of a conversation a person holds (they replied lately) goes
/// to that person; one out of attempts (its workers kept dying) or too old for an automatic
/// reply goes to a person, unless a person sent it back.
///
/// Too old means it reached Sabi late (an outage, Meta's retries): an answer would come out of
/// context. A batch that aged in Sabi's own queue (a surge) is answered however long it waited,
/// unless `queued_review_after` says otherwise: a surge must not empty itself into the review
/// queue.
pub fn decide(claim: &Claim, now: At, policy: &EnginePolicy) -> Decision {
    if person_holds(claim.batch.held_until, now) {
        return Decision::Review(ReviewReason::PersonAnswering);
    }
    if claim.attempt > policy.max_attempts {
        return Decision::Review(ReviewReason::OutOfRetries);
    }
    if claim.requeued {
        return Decision::Run;
    }
    let batch = &claim.batch;
    let late = batch
        .messages
        .iter()
        .map(|m| m.received_at.since(m.sent_at()))
        .max()
        .unwrap_or_default();
    let queued = now.since(batch.due_at);
    if late > policy.review_after || policy.queued_review_after.is_some_and(|cap| queued > cap) {
        return Decision::Review(ReviewReason::TooOld);
    }
    Decision::Run
}

/// How a failed attempt ends: a retry after `retry_base · 2^(attempt-1)`, or review after the last.
pub fn after_failure(attempt: u32, now: At, policy: &EnginePolicy, error: String) -> Ending {
    if attempt >= policy.max_attempts {
        return Ending::Review {
            reason: ReviewReason::OutOfRetries,
            error: Some(error),
        };
    }
    Ending::RetryAt {
        at: now + backoff(attempt, policy.retry_base),
        error,
    }
}

/// How long a batch falling due now is expected to wait for its turn: the batches due ahead of
/// it at the rate model turns ended over the last minute (on every node), and never less than the
/// oldest due batch has waited already (which is all there is to go on when none ended).
pub fn expected_wait(
    due: u64,
    ended_last_minute: u64,
    oldest_due: Option<At>,
    now: At,
) -> Duration {
    let waited = oldest_due.map_or(Duration::ZERO, |at| now.since(at));
    if due == 0 {
        return Duration::ZERO;
    }
    let ahead = match ended_last_minute {
        0 => Duration::ZERO,
        ended => Duration::from_secs_f64(60.0 * due as f64 / ended as f64),
    };
    ahead.max(waited)
}

/// The wait after failed attempt number `attempt` (1-based).
pub fn backoff(attempt: u32, base: Duration) -> Duration {
    base.saturating_mul(1 << attempt.saturating_sub(1).min(16))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::UnixSeconds;
    use crate::domain::{Batch, BatchMessage, Channel, ConversationKey, LeaseToken};

    fn policy() -> EnginePolicy {
        EnginePolicy {
            max_attempts: 4,
            retry_base: Duration::from_secs(5),
            review_after: Duration::from_secs(15 * 60),
            queued_review_after: None,
        }
    }

    fn claim(attempt: u32, sent_at_s: i64) -> Claim {
        Claim {
            batch: Batch {
                id: 1,
                conversation: ConversationKey {
                    channel: Channel::Whatsapp,
                    business: "b".into(),
                    customer: "c".into(),
                },
                messages: vec![BatchMessage {
                    seq: 1,
                    external_id: "w".into(),
                    item_type: Some("text".into()),
                    text: None,
                    media_id: None,
                    provider_ts: Some(UnixSeconds(sent_at_s)),
                    received_at: At::from_millis(sent_at_s * 1000 + 500),
                    user: None,
                    address: None,
                }],
                due_at: At::from_millis(sent_at_s * 1000),
                held_until: None,
            },
            token: LeaseToken(attempt.into()),
            attempt,
            requeued: false,
        }
    }

    #[test]
    fn a_conversation_a_person_holds_goes_to_them_before_any_other_rule() {
        let p = policy();
        let sent = 1_781_000_000;
        let now = At::from_millis(sent * 1000 + 60_000);
        let mut held = claim(1, sent);
        held.batch.held_until = Some(now + Duration::from_secs(1));
        let to_person = Decision::Review(ReviewReason::PersonAnswering);
        assert_eq!(decide(&held, now, &p), to_person);
        held.requeued = true;
        assert_eq!(
            decide(&held, now, &p),
            to_person,
            "the hold outranks a requeue"
        );
        held.batch.held_until = Some(now);
        assert_eq!(decide(&held, now, &p), Decision::Run, "the hold is over");
    }

    #[test]
    fn the_expected_wait_is_the_queue_at_the_rate_turns_end() {
        let now = At::from_millis(1_000_000);
        let minute = Duration::from_secs(60);
        assert_eq!(expected_wait(0, 50, None, now), Duration::ZERO);
        // 300 due, 60 ended in the last minute: five minutes.
        assert_eq!(expected_wait(300, 60, Some(now), now), minute * 5);
        // The oldest has waited ten already: at least that.
        assert_eq!(
            expected_wait(300, 60, Some(now - minute * 10), now),
            minute * 10
        );
        assert_eq!(
            expected_wait(3, 0, Some(now - minute), now),
            minute,
            "none ended"
        );
    }

    #[test]
    fn backoff_doubles_from_the_base() {
        let waits: Vec<u64> = (1..=3)
            .map(|a| backoff(a, Duration::from_secs(5)).as_secs())
            .collect();
        assert_eq!(waits, vec![5, 10, 20]);
    }

    #[test]
    fn failures_retry_then_go_to_review_after_the_last_attempt() {
        let p = policy();
        assert_eq!(
            after_failure(1, At::from_millis(1_000), &p, "e".into()),
            Ending::RetryAt {
                at: At::from_millis(6_000),
                error: "e".into()
            }
        );
        assert_eq!(
            after_failure(3, At::from_millis(1_000), &p, "e".into()),
            Ending::RetryAt {
                at: At::from_millis(21_000),
                error: "e".into()
            }
        );
        assert_eq!(
            after_failure(4, At::from_millis(1_000), &p, "e".into()),
            Ending::Review {
                reason: ReviewReason::OutOfRetries,
                error: Some("e".into())
            }
        );
    }

    #[test]
    fn batches_that_reached_sabi_late_and_exhausted_ones_go_to_review() {
        let p = policy();
        let sent = 1_781_000_000;
        let at = |seconds: i64| At::from_millis((sent + seconds) * 1000);
        // claim(..) reached Sabi half a second after it was sent, and fell due then.
        assert_eq!(decide(&claim(1, sent), at(60), &p), Decision::Run);
        assert_eq!(
            decide(&claim(1, sent), at(60 * 60), &p),
            Decision::Run,
            "an hour in Sabi's own queue: answered, late"
        );
        let mut late = claim(1, sent - 15 * 60 - 1);
        late.batch.messages[0].received_at = at(0);
        late.batch.due_at = at(0);
        assert_eq!(
            decide(&late, at(1), &p),
            Decision::Review(ReviewReason::TooOld),
            "reached Sabi more than 15 minutes after it was sent"
        );
        let capped = EnginePolicy {
            queued_review_after: Some(Duration::from_secs(30 * 60)),
            ..policy()
        };
        assert_eq!(decide(&claim(1, sent), at(29 * 60), &capped), Decision::Run);
        assert_eq!(
            decide(&claim(1, sent), at(31 * 60), &capped),
            Decision::Review(ReviewReason::TooOld)
        );
        assert_eq!(
            decide(&claim(5, sent), at(0), &p),
            Decision::Review(ReviewReason::OutOfRetries)
        );
        let sent_back = Claim {
            requeued: true,
            ..late
        };
        assert_eq!(
            decide(&sent_back, at(3600), &capped),
            Decision::Run,
            "a person sent it back: answered however old"
        );
    }
}
