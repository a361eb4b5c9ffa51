//! When a broadcast may reach a recipient, on the recipient's own clock: its quiet hours, and a
//! start and deadline given as wall-clock times ("09:00 on Diwali eve" comes at nine wherever
//! the customer is). A recipient with no zone of its own reads the broadcast's.
//!
//! A time given with an offset (`2026-11-11T18:00:00Z`) is one instant for everybody and is
//! kept as the broadcast's start or deadline; only wall-clock times are read per recipient.
//! Claims ask [`LocalHours::turn`] for each due recipient and let it go, wait, or cancel it.

use jiff::civil::DateTime;
use jiff::tz::TimeZone;

use crate::clock::At;

/// Hours of the day when nothing is sent (`21:00-08:00` runs over midnight).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuietHours {
    /// Minutes after midnight: from `start` up to `end`.
    start: u16,
    end: u16,
}

impl QuietHours {
    /// `spec` as `HH:MM-HH:MM`.
    ///
    /// # Errors
    /// What is wrong with it, in words.
    pub fn parse(spec: &str) -> Result<QuietHours, String> {
        let minutes = |hhmm: &str| -> Option<u16> {
            let (h, m) = hhmm.trim().split_once(':')?;
            let (h, m): (u16, u16) = (h.parse().ok()?, m.parse().ok()?);
            (h < 24 && m < 60).then_some(h * 60 + m)
        };
        let bad = || format!("quiet hours {spec:?}: write them as HH:MM-HH:MM, like 21:00-08:00");
        let (start, end) = spec.split_once('-').ok_or_else(bad)?;
        let (start, end) = (
            minutes(start).ok_or_else(bad)?,
            minutes(end).ok_or_else(bad)?,
        );
        if start == end {
            return Err(format!(
                "quiet hours {spec:?}: they start and end at the same time"
            ));
        }
        Ok(QuietHours { start, end })
    }

    /// `HH:MM-HH:MM`, as parsed.
    pub fn spec(&self) -> String {
        let hhmm = |m: u16| format!("{:02}:{:02}", m / 60, m % 60);
        format!("{}-{}", hhmm(self.start), hhmm(self.end))
    }

    /// When the quiet hours `now` falls in end, on `zone`'s clock; `None` outside them.
    pub fn ends(&self, zone: &TimeZone, now: At) -> Option<At> {
        let local = jiff::Timestamp::from_millisecond(now.millis())
            .ok()?
            .to_zoned(zone.clone());
        let minute = u16::try_from(local.hour()).ok()? * 60 + u16::try_from(local.minute()).ok()?;
        let over_midnight = self.start > self.end;
        let day = match (over_midnight, minute) {
            (false, m) if (self.start..self.end).contains(&m) => local.date(),
            (true, m) if m >= self.start => local.date().tomorrow().ok()?,
            (true, m) if m < self.end => local.date(),
            _ => return None,
        };
        let end = day.at(
            i8::try_from(self.end / 60).ok()?,
            i8::try_from(self.end % 60).ok()?,
            0,
            0,
        );
        instant(end, zone)
    }
}

/// A time a person gave: an instant, or a wall-clock time that comes on each recipient's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    At(At),
    Local(DateTime),
}

impl When {
    /// RFC 3339 with an offset (`2026-11-11T18:00:00Z`, `...+01:00`) is an instant; without one
    /// (`2026-11-11T09:00`, `2026-11-11 09:00`) it is a wall-clock time.
    ///
    /// # Errors
    /// When it is neither, in words.
    pub fn parse(text: &str) -> Result<When, String> {
        if let Ok(instant) = text.parse::<jiff::Timestamp>() {
            return Ok(When::At(At::from_millis(instant.as_millisecond())));
        }
        text.parse::<DateTime>().map(When::Local).map_err(|_| {
            format!(
                "{text:?}: write a time as 2026-11-11T18:00:00Z (one instant), or as \
                 2026-11-11T09:00 (nine o'clock on each recipient's clock)"
            )
        })
    }
}

/// Whether a recipient goes now, by its clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    Go,
    /// Not before then: its start has not come, or it is in its quiet hours.
    Wait(At),
    /// Its deadline passed: what was not sent is cancelled.
    Expired,
}

/// A broadcast's hours on its recipients' clocks.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalHours {
    pub quiet: Option<QuietHours>,
    pub start: Option<DateTime>,
    pub until: Option<DateTime>,
    /// The zone of recipients without their own: its name as given, as stores keep it.
    pub tz: String,
    zone: TimeZone,
}

impl LocalHours {
    /// # Errors
    /// When `tz` is not a known IANA zone.
    pub fn new(
        tz: &str,
        quiet: Option<QuietHours>,
        start: Option<DateTime>,
        until: Option<DateTime>,
    ) -> Result<LocalHours, String> {
        Ok(LocalHours {
            quiet,
            start,
            until,
            tz: tz.to_owned(),
            zone: zone(tz).ok_or_else(|| unknown_zone(tz))?,
        })
    }

    /// As a store keeps them: `None` when it keeps none, or cannot read them (they were checked
    /// when the broadcast was made).
    pub fn stored(
        quiet_hours: Option<&str>,
        tz: Option<&str>,
        start: Option<&str>,
        until: Option<&str>,
    ) -> Option<LocalHours> {
        let civil = |text: Option<&str>| text.map(str::parse::<DateTime>).transpose().ok();
        let quiet = quiet_hours.map(QuietHours::parse).transpose().ok()?;
        LocalHours::new(tz?, quiet, civil(start)?, civil(until)?).ok()
    }

    pub fn quiet_spec(&self) -> Option<String> {
        self.quiet.as_ref().map(QuietHours::spec)
    }

    /// The wall-clock start and deadline as stores keep them.
    pub fn start_text(&self) -> Option<String> {
        self.start.map(|t| t.to_string())
    }

    pub fn until_text(&self) -> Option<String> {
        self.until.map(|t| t.to_string())
    }

    /// Whether a recipient in zone `tz` (the broadcast's when `None` or unknown) goes at `now`.
    pub fn turn(&self, tz: Option<&str>, now: At) -> Turn {
        let own = tz.and_then(zone);
        let zone = own.as_ref().unwrap_or(&self.zone);
        let on_clock = |t: DateTime| instant(t, zone);
        if let Some(until) = self.until.and_then(on_clock)
            && now >= until
        {
            return Turn::Expired;
        }
        if let Some(start) = self.start.and_then(on_clock)
            && now < start
        {
            return Turn::Wait(start);
        }
        // An end that has come (a clock change can make one) is no reason to wait.
        match self.quiet.and_then(|q| q.ends(zone, now)) {
            Some(end) if end > now => Turn::Wait(end),
            _ => Turn::Go,
        }
    }

    /// The earliest wall-clock start and the latest deadline over the recipients' zones (the
    /// broadcast's for those without one), as instants: the broadcast runs from the first and
    /// is cancelled after the last.
    pub fn span<'a>(&self, zones: impl IntoIterator<Item = Option<&'a str>>) -> Span {
        let mut seen: Vec<TimeZone> = Vec::new();
        for tz in zones {
            let z = tz.and_then(zone).unwrap_or_else(|| self.zone.clone());
            if !seen.contains(&z) {
                seen.push(z);
            }
        }
        if seen.is_empty() {
            seen.push(self.zone.clone());
        }
        let over = |t: Option<DateTime>| -> Vec<At> {
            t.map(|t| seen.iter().filter_map(|z| instant(t, z)).collect())
                .unwrap_or_default()
        };
        let starts = over(self.start);
        Span {
            start: starts.iter().min().copied(),
            last_start: starts.into_iter().max(),
            until: over(self.until).into_iter().max(),
        }
    }
}

/// The instants a broadcast's wall-clock times span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    /// The start on the earliest recipient's clock...
    pub start: Option<At>,
    /// ...and on the latest's: once it has passed, the start has passed for everyone.
    pub last_start: Option<At>,
    pub until: Option<At>,
}

/// The IANA zone named `tz`, from the bundled database.
pub fn zone(tz: &str) -> Option<TimeZone> {
    TimeZone::get(tz).ok()
}

/// Why a zone name is refused, in words.
pub fn unknown_zone(tz: &str) -> String {
    format!("time zone {tz:?}: not a known zone, like Africa/Lagos")
}

/// A wall-clock time on `zone`'s clock (the later reading when a clock change repeats it, the
/// time after the gap when it skips it).
fn instant(time: DateTime, zone: &TimeZone) -> Option<At> {
    let instant = zone.to_ambiguous_timestamp(time).later().ok()?;
    Some(At::from_millis(instant.as_millisecond()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// 2026-11-11T20:30:00Z: 21:30 in Lagos (UTC+1), 02:00 the next day in Kolkata.
    const AT: At = At::from_millis(1_794_429_000_000);
    const HOUR: Duration = Duration::from_secs(3_600);

    fn lagos() -> TimeZone {
        zone("Africa/Lagos").expect("known")
    }

    #[test]
    fn quiet_hours_hold_on_the_zones_clock_and_may_run_over_midnight() {
        let quiet = QuietHours::parse("21:00-08:00").expect("valid");
        // 21:30 in Lagos: they end at 08:00 the next morning, 10 h 30 min later.
        assert_eq!(quiet.ends(&lagos(), AT), Some(AT + HOUR * 21 / 2));
        assert_eq!(quiet.ends(&lagos(), AT - HOUR), None, "20:30 in Lagos");
        assert_eq!(
            quiet.ends(&lagos(), AT + HOUR * 10),
            Some(AT + HOUR * 21 / 2),
            "07:30 the next morning"
        );
        assert_eq!(quiet.ends(&lagos(), AT + HOUR * 11), None, "08:30");
        let kolkata = zone("Asia/Kolkata").expect("known");
        let early = QuietHours::parse("01:00-06:30").expect("valid");
        assert_eq!(early.ends(&kolkata, AT), Some(AT + HOUR * 9 / 2));
        assert_eq!(early.spec(), "01:00-06:30");
        for spec in ["21:00", "25:00-08:00", "08:00-08:00"] {
            assert!(QuietHours::parse(spec).is_err(), "{spec}");
        }
        assert!(LocalHours::new("Mars/Olympus", None, None, None).is_err());
    }

    #[test]
    fn a_wall_clock_time_comes_on_each_recipients_clock() {
        let nine = "2026-11-12T09:00".parse::<DateTime>().expect("valid");
        let noon = "2026-11-12T12:00".parse::<DateTime>().expect("valid");
        let hours = LocalHours::new("Africa/Lagos", None, Some(nine), Some(noon)).expect("valid");
        // 09:00 in Lagos is 08:00Z; in London 09:00Z; in Kolkata 03:30Z.
        let lagos_nine = AT + HOUR * 23 / 2;
        assert_eq!(hours.turn(None, AT), Turn::Wait(lagos_nine));
        assert_eq!(
            hours.turn(Some("Europe/London"), lagos_nine),
            Turn::Wait(lagos_nine + HOUR)
        );
        assert_eq!(
            hours.turn(Some("Asia/Kolkata"), AT + HOUR * 8),
            Turn::Go,
            "10:00 IST"
        );
        assert_eq!(
            hours.turn(Some("Asia/Kolkata"), lagos_nine),
            Turn::Expired,
            "past noon in Kolkata"
        );
        assert_eq!(hours.turn(Some("Nowhere/Else"), lagos_nine), Turn::Go);
        let span = hours.span([Some("Asia/Kolkata"), Some("Europe/London"), None]);
        assert_eq!(span.start, Some(lagos_nine - HOUR * 9 / 2));
        assert_eq!(span.until, Some(lagos_nine + HOUR * 4));
    }

    #[test]
    fn quiet_hours_in_the_recipients_zone_make_it_wait_until_they_end() {
        let quiet = QuietHours::parse("21:00-08:00").ok();
        let hours = LocalHours::new("Africa/Lagos", quiet, None, None).expect("valid");
        assert_eq!(hours.turn(None, AT), Turn::Wait(AT + HOUR * 21 / 2));
        // 20:30 in London: not quiet yet.
        assert_eq!(hours.turn(Some("Europe/London"), AT), Turn::Go);
        assert_eq!(
            LocalHours::stored(Some("21:00-08:00"), Some("Africa/Lagos"), None, None),
            Some(hours)
        );
    }

    #[test]
    fn a_clock_change_never_makes_a_recipient_wait_for_a_time_that_came() {
        // London's clocks go back at 02:00 BST on 2026-10-25 (01:00-02:00 comes twice): quiet
        // hours ending at 01:30 end at the later one.
        let quiet = QuietHours::parse("23:00-01:30").ok();
        let hours = LocalHours::new("Europe/London", quiet, None, None).expect("valid");
        let first_0115 = "2026-10-25T00:15:00Z"
            .parse::<jiff::Timestamp>()
            .expect("valid");
        let now = At::from_millis(first_0115.as_millisecond());
        let later_0130 = "2026-10-25T01:30:00Z"
            .parse::<jiff::Timestamp>()
            .expect("valid");
        assert_eq!(
            hours.turn(None, now),
            Turn::Wait(At::from_millis(later_0130.as_millisecond()))
        );
        for minutes in 0..24 * 60 {
            let at = now + Duration::from_secs(minutes * 60);
            if let Turn::Wait(until) = hours.turn(None, at) {
                assert!(until > at, "a wait for a time that came: {until} at {at}");
            }
        }
    }

    #[test]
    fn a_time_with_an_offset_is_an_instant_and_one_without_is_a_wall_clock_time() {
        assert_eq!(
            When::parse("2026-11-11T20:30:00Z"),
            Ok(When::At(AT)),
            "an instant"
        );
        assert_eq!(When::parse("2026-11-11T21:30:00+01:00"), Ok(When::At(AT)));
        assert!(matches!(
            When::parse("2026-11-11 09:00"),
            Ok(When::Local(_))
        ));
        assert!(When::parse("tomorrow").is_err());
    }
}
