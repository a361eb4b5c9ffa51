//! How a broadcast's sends go out: Meta's messaging limit (unique customers a moving 24 hours)
//! splits a large audience into days, each with its own surge of replies, and the number's
//! pace (`whatsapp.outbound_rate`), which counts the replies' own messages too, bounds the
//! rate.
//!
//! PURE: no IO.

use serde::Serialize;

use super::Warning;
use super::words::count;

/// A broadcast's default rate, messages a second (`sabi broadcast create --rate`).
pub const DEFAULT_SEND_RATE: f64 = 20.0;
/// The span of Meta's messaging limit, seconds: a recipient's place frees a day after its send.
pub const DAY: f64 = 86_400.0;

/// The sends' pace as asked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Asked {
    /// Messages a second (`--send-rate`).
    Rate(f64),
    /// Seconds one day's sends take (`--send-over`).
    Over(f64),
    /// A broadcast's default rate.
    Default,
}

impl Asked {
    /// Messages a second, for `recipients` sent in one go.
    fn rate(self, recipients: usize) -> f64 {
        match self {
            Asked::Rate(rate) => rate,
            Asked::Over(seconds) => recipients as f64 / seconds,
            Asked::Default => DEFAULT_SEND_RATE,
        }
    }

    /// What the owner gave, for messages.
    fn named(self) -> &'static str {
        match self {
            Asked::Rate(_) => "--send-rate",
            Asked::Over(_) => "--send-over",
            Asked::Default => "a broadcast's default rate",
        }
    }
}

/// What bounds the sends: as asked, the number's pace, and Meta's messaging limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    pub asked: Asked,
    /// Messages a second the number takes, in and out (`whatsapp.outbound_rate`).
    pub number_rate: u32,
    /// Unique customers a day (`whatsapp.messaging_limit`); `None`: unlimited.
    pub messaging_limit: Option<u64>,
}

/// How the sends go, as the plan assumes them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sends {
    pub audience: usize,
    /// Meta's messaging limit, unique customers a day; `None` (`null`): unlimited.
    pub messaging_limit: Option<u64>,
    /// Recipients the first day's sends reach, and the days until the last goes (1 when it all
    /// goes within a day).
    pub per_day: usize,
    pub days: usize,
    /// Whether the messaging limit, not the rate, splits the sends into days.
    pub limited: bool,
    /// Messages a second: as asked, and as the plan assumes them (capped by the number).
    pub asked_rate: f64,
    pub rate: f64,
    /// The number's pace (`whatsapp.outbound_rate`), and what the replies take of it at their
    /// busiest minute: customers' messages, answers and holding messages, a second.
    pub number_rate: u32,
    pub replies_rate: f64,
    /// Seconds one day's sends take.
    pub day_s: f64,
    /// When the last recipient's send goes, seconds after the first's.
    pub last_send_s: f64,
}

impl Sends {
    /// Recipients whose replies one surge has: a day's when the limit splits the sends, else
    /// everybody's.
    pub fn surge(&self) -> usize {
        match self.limited {
            true => self.per_day,
            false => self.audience,
        }
    }
}

/// The rate the number leaves the sends when the replies take `replies_rate` of it, the first
/// rate asked; and the sends at it.
pub fn sends(audience: usize, pace: &Pace, replies_rate: f64) -> Sends {
    let asked_rate = first_rate(audience, pace);
    // The replies' messages are whole messages a second: the sends get what is left, at
    // least one a second so that a broadcast still ends.
    let room = (f64::from(pace.number_rate) - replies_rate.ceil()).max(1.0);
    let rate = asked_rate.min(room);
    let limit = pace.messaging_limit.map(clamp_usize).unwrap_or(usize::MAX);
    let first = audience.min(limit).max(1);
    let limited = audience > limit && (first as f64 / rate) < DAY;
    let (per_day, days, last_send_s) = match limited {
        true => {
            let days = audience.div_ceil(first);
            let last_day = audience - (days - 1) * first;
            let last = (days - 1) as f64 * DAY + (last_day - 1) as f64 / rate;
            (first, days, last)
        }
        false => {
            let last = audience.saturating_sub(1) as f64 / rate;
            let per_day = audience.min((rate * DAY).floor() as usize);
            (per_day, (last / DAY).floor() as usize + 1, last)
        }
    };
    Sends {
        audience,
        messaging_limit: pace.messaging_limit,
        per_day,
        days,
        limited,
        asked_rate,
        rate,
        number_rate: pace.number_rate,
        replies_rate,
        day_s: if limited { first } else { audience } as f64 / rate,
        last_send_s,
    }
}

/// The rate asked, for the first day's recipients.
fn first_rate(audience: usize, pace: &Pace) -> f64 {
    let limit = pace.messaging_limit.map(clamp_usize).unwrap_or(usize::MAX);
    pace.asked.rate(audience.min(limit).max(1))
}

/// What the owner should know about the sends: a rate the number cannot take, and days.
pub fn warnings(sends: &Sends, pace: &Pace) -> Vec<Warning> {
    let mut warnings = Vec::new();
    if sends.rate < sends.asked_rate {
        warnings.push(Warning {
            code: "send_rate",
            message: format!(
                "{} asks for {} messages a second, but the number takes {} a second in and out \
                 (whatsapp.outbound_rate) and the replies need {} of them at their busiest: \
                 the plan assumes {} a second (sabi broadcast create --rate {})",
                pace.asked.named(),
                decimal(sends.asked_rate),
                sends.number_rate,
                sends.replies_rate.ceil(),
                decimal(sends.rate),
                sends.rate.floor().max(1.0),
            ),
        });
    }
    if let (true, Some(limit)) = (sends.limited, sends.messaging_limit) {
        warnings.push(Warning {
            code: "messaging_limit",
            message: format!(
                "{} customers are more than Meta lets the business reach in a day ({}, \
                 whatsapp.messaging_limit or --messaging-limit): the broadcast goes to {} \
                 a day and takes {} days, and each day's replies are a surge of their own \
                 (the figures are one day's); a higher messaging limit shortens it",
                count(sends.audience as f64),
                count(limit as f64),
                count(limit as f64),
                sends.days,
            ),
        });
    }
    warnings
}

/// A rate as people read it: whole, or with one decimal below 10.
fn decimal(rate: f64) -> String {
    match rate {
        r if r >= 10.0 || r.fract() == 0.0 => format!("{r:.0}"),
        r => format!("{r:.1}"),
    }
}

fn clamp_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(asked: Asked, limit: Option<u64>) -> Pace {
        Pace {
            asked,
            number_rate: 80,
            messaging_limit: limit,
        }
    }

    #[test]
    fn the_messaging_limit_splits_the_audience_into_days() {
        let sends = sends(18_000, &pace(Asked::Default, Some(250)), 2.0);
        assert!(sends.limited);
        assert_eq!((sends.per_day, sends.days, sends.surge()), (250, 72, 250));
        assert_eq!(sends.day_s, 250.0 / 20.0);
        // The 72nd day's 250th recipient: 71 days, then 249 sends at 20 a second.
        assert_eq!(sends.last_send_s, 71.0 * DAY + 249.0 / 20.0);
        let codes: Vec<&str> = warnings(&sends, &pace(Asked::Default, Some(250)))
            .iter()
            .map(|w| w.code)
            .collect();
        assert_eq!(codes, ["messaging_limit"]);
    }

    #[test]
    fn an_audience_within_the_limit_goes_in_one_send() {
        for limit in [None, Some(100_000)] {
            let sends = sends(18_000, &pace(Asked::Default, limit), 2.0);
            assert!(!sends.limited);
            assert_eq!(
                (sends.per_day, sends.days, sends.surge()),
                (18_000, 1, 18_000)
            );
            assert_eq!(sends.day_s, 900.0);
            assert!(warnings(&sends, &pace(Asked::Default, limit)).is_empty());
        }
    }

    #[test]
    fn a_rate_above_the_numbers_pace_is_capped_leaving_the_replies_room() {
        let asked = pace(Asked::Rate(1_000.0), None);
        let sends = sends(2_000, &asked, 3.2);
        assert_eq!(sends.rate, 76.0, "80 less the replies' 4");
        assert_eq!(sends.day_s, 2_000.0 / 76.0);
        let warned = warnings(&sends, &asked);
        assert_eq!(warned[0].code, "send_rate");
        assert!(
            warned[0].message.contains("--send-rate asks for 1000"),
            "{warned:?}"
        );
        assert!(
            warned[0].message.contains("whatsapp.outbound_rate"),
            "{warned:?}"
        );
        // --send-over: a day's sends in a minute is 300 a second.
        let over = pace(Asked::Over(60.0), Some(18_000));
        let sends = super::sends(18_000, &over, 0.0);
        assert_eq!((sends.asked_rate, sends.rate), (300.0, 80.0));
        assert!(warnings(&sends, &over)[0].message.contains("--send-over"));
    }

    #[test]
    fn a_rate_too_slow_for_the_limit_to_bind_sends_for_days_on_end() {
        // 0.001 a second reaches 86 customers a day: the limit of 250 never fills.
        let slow = pace(Asked::Rate(0.001), Some(250));
        let sends = sends(1_000, &slow, 0.0);
        assert!(!sends.limited);
        assert_eq!(sends.per_day, 86);
        assert_eq!(sends.days, (999.0 / 0.001 / DAY).floor() as usize + 1);
        assert!(warnings(&sends, &slow).is_empty());
    }
}
