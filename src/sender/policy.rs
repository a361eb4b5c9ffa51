//! PURE: what a Graph API error means for the send, and how long to wait. No IO.
//!
//! Decisions key on Meta's `error.code` (the reference's table); the HTTP status only decides
//! when no code came.

use std::time::Duration;

use crate::store::WINDOW_CLOSED;
use crate::whatsapp::graph::GraphError;

/// What to do after a failed send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Meta asks to slow down (HTTP 429; 4, 80007, 130429): wait, then send again. Not a
    /// failure of the part.
    Throttled { retry_after: Option<Duration> },
    /// Too many messages to this one customer (131056): wait 4^n seconds.
    PairLimited,
    /// Meta said it did not take it, and another try may work (1, 2, 131000, 131016, 131057,
    /// 133004), or the request never reached Meta.
    Transient,
    /// The access token expired (190, 0): stop sending from this number.
    TokenExpired,
    /// Outside the customer service window (131047): only a template may go.
    WindowClosed,
    /// Meta refused it for good (100, 131026, 131049, 131050, 368, ...): never again.
    Permanent,
    /// The request may have reached Meta (no answer, or a 5xx without Meta's error body):
    /// never resend blindly.
    Unknown,
}

pub fn classify(error: &GraphError) -> Class {
    match error {
        GraphError::NotSent(_) => Class::Transient,
        GraphError::Unknown(_) => Class::Unknown,
        GraphError::TooLarge(_) => Class::Permanent,
        GraphError::Api {
            status,
            code,
            retry_after,
            ..
        } => match code {
            Some(4 | 80_007 | 130_429) => Class::Throttled {
                retry_after: *retry_after,
            },
            Some(131_056) => Class::PairLimited,
            Some(1 | 2 | 131_000 | 131_016 | 131_057 | 133_004) => Class::Transient,
            Some(0 | 190) => Class::TokenExpired,
            Some(WINDOW_CLOSED) => Class::WindowClosed,
            Some(_) => Class::Permanent,
            None if *status == 429 => Class::Throttled {
                retry_after: *retry_after,
            },
            None if *status == 401 => Class::TokenExpired,
            // A 5xx without Meta's error body came from a gateway in front of it: the message
            // may have been taken, so it is never sent again blindly.
            None if *status >= 500 => Class::Unknown,
            None => Class::Permanent,
        },
    }
}

/// What a refusal by the Marketing Messages API means besides [`classify`]'s class. Its other
/// errors are Cloud API's and are classified as they are (#100 "Message must be a template
/// message" is permanent: only templates are ever sent there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarketingRefusal {
    /// 131055 "Method not allowed": Meta does not take this template there (its category is
    /// no longer MARKETING, or the number is not onboarded). Nothing was sent: it goes through
    /// `/messages` instead.
    NotMarketing,
    /// 131009 on a marketing send: the template's sync with Meta's ads is not complete (up to
    /// 10 minutes after it was made or after a week unused): another try later may work.
    NotSynced,
}

/// The Marketing Messages API's own meaning of `error`; `None` when it means what it means on
/// `/messages`.
pub fn marketing_refusal(error: &GraphError) -> Option<MarketingRefusal> {
    match code(error)? {
        131_055 => Some(MarketingRefusal::NotMarketing),
        131_009 => Some(MarketingRefusal::NotSynced),
        _ => None,
    }
}

/// The error code a failure carries, if Meta gave one.
pub fn code(error: &GraphError) -> Option<i64> {
    match error {
        GraphError::Api { code, .. } => *code,
        _ => None,
    }
}

/// How long to wait after the `n`th consecutive answer of this class (1-based), before
/// jitter. Throttling honours Retry-After when it asks for longer.
pub fn wait(class: Class, n: u32, base: Duration) -> Duration {
    let exponent = n.saturating_sub(1).min(16);
    match class {
        Class::Throttled { retry_after } => {
            let backoff = base.saturating_mul(1 << exponent).min(MAX_THROTTLE_WAIT);
            retry_after.map_or(backoff, |asked| asked.clamp(backoff, MAX_THROTTLE_WAIT))
        }
        // Meta's advice for the pair limit: 4^n seconds.
        Class::PairLimited => Duration::from_secs(4u64.saturating_pow(exponent)).min(MAX_PAIR_WAIT),
        _ => base.saturating_mul(1 << exponent).min(MAX_RETRY_WAIT),
    }
}

const MAX_THROTTLE_WAIT: Duration = Duration::from_secs(60);
const MAX_PAIR_WAIT: Duration = Duration::from_secs(256);
const MAX_RETRY_WAIT: Duration = Duration::from_secs(600);

/// `wait` spread by ±25 % with `random` (any u32), so retries of many sends do not return
/// together.
pub fn jitter(wait: Duration, random: u32) -> Duration {
    let spread = f64::from(random) / f64::from(u32::MAX); // 0..=1
    wait.mul_f64(0.75 + spread / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16, code: Option<i64>) -> GraphError {
        GraphError::Api {
            status,
            code,
            message: String::new(),
            retry_after: None,
        }
    }

    #[test]
    fn codes_decide_before_statuses() {
        assert_eq!(
            classify(&api(400, Some(130_429))),
            Class::Throttled { retry_after: None }
        );
        assert_eq!(classify(&api(400, Some(131_056))), Class::PairLimited);
        assert_eq!(classify(&api(500, Some(131_000))), Class::Transient);
        assert_eq!(classify(&api(401, Some(190))), Class::TokenExpired);
        assert_eq!(classify(&api(400, Some(131_047))), Class::WindowClosed);
        for permanent in [100, 131_026, 131_049, 131_050, 368] {
            assert_eq!(classify(&api(400, Some(permanent))), Class::Permanent);
        }
        // A 500 that carries a permanent code is still permanent.
        assert_eq!(classify(&api(500, Some(100))), Class::Permanent);
        assert_eq!(
            classify(&api(429, None)),
            Class::Throttled { retry_after: None }
        );
        assert_eq!(classify(&api(503, None)), Class::Unknown);
        assert_eq!(
            classify(&GraphError::Unknown("timeout".into())),
            Class::Unknown
        );
        assert_eq!(
            classify(&GraphError::NotSent("refused".into())),
            Class::Transient
        );
    }

    #[test]
    fn the_marketing_messages_api_has_its_own_refusals() {
        assert_eq!(
            marketing_refusal(&api(400, Some(131_055))),
            Some(MarketingRefusal::NotMarketing)
        );
        assert_eq!(
            marketing_refusal(&api(400, Some(131_009))),
            Some(MarketingRefusal::NotSynced)
        );
        // Everything else is Cloud API's meaning: throttling, a non-template, an opt-out.
        for code in [130_429, 100, 131_050, 131_049] {
            assert_eq!(marketing_refusal(&api(400, Some(code))), None, "{code}");
        }
        assert_eq!(classify(&api(400, Some(100))), Class::Permanent);
        assert_eq!(marketing_refusal(&GraphError::Unknown("lost".into())), None);
    }

    #[test]
    fn waits_grow_and_honour_retry_after() {
        let base = Duration::from_secs(1);
        let throttled = Class::Throttled { retry_after: None };
        assert_eq!(wait(throttled, 1, base), Duration::from_secs(1));
        assert_eq!(wait(throttled, 3, base), Duration::from_secs(4));
        assert_eq!(wait(throttled, 30, base), MAX_THROTTLE_WAIT);
        let asked = Class::Throttled {
            retry_after: Some(Duration::from_secs(30)),
        };
        assert_eq!(wait(asked, 1, base), Duration::from_secs(30));
        let greedy = Class::Throttled {
            retry_after: Some(Duration::from_secs(3600)),
        };
        assert_eq!(
            wait(greedy, 1, base),
            MAX_THROTTLE_WAIT,
            "capped below the send lease"
        );
        assert_eq!(wait(Class::PairLimited, 1, base), Duration::from_secs(1));
        assert_eq!(wait(Class::PairLimited, 3, base), Duration::from_secs(16));
    }

    #[test]
    fn jitter_stays_within_a_quarter() {
        let w = Duration::from_secs(8);
        assert_eq!(jitter(w, 0), Duration::from_secs(6));
        assert_eq!(jitter(w, u32::MAX), Duration::from_secs(10));
    }
}
