//! A broadcast before it is kept: what Meta would refuse on the day, refused now
//! ([`check_names`], [`schedule`]), its template checked with Meta ([`Preflight`]), who is left
//! out and why (the audience's own reasons, parameters the template does not take, and the
//! customers who opted out), and what a dry run says it would do: when its sends go under
//! Meta's messaging limit ([`timeline`]). Once kept, why its recipients wait ([`waiting`]). The
//! command line and the admin API both make broadcasts through it.

use std::time::Duration;

use serde::Serialize;

use crate::broadcast::audience::Row;
use crate::broadcast::checks::{self, Mistake};
use crate::clock::{At, millis};
use crate::config::{BroadcastSettings, Config, MessagingLimit};
use crate::store::rules::broadcast;
use crate::store::rules::hours::{Span, Turn};
use crate::store::{
    self, BroadcastView, Broadcasts, LocalHours, NewBroadcast, NewRecipient, QuietHours,
    SkipReason, When,
};
use crate::whatsapp::graph::{Graph, GraphError};

/// An audience row as a recipient to keep.
pub fn recipient(row: Row) -> NewRecipient {
    NewRecipient {
        to: row.to,
        params: row.params,
        line: Some(row.line),
        skipped: row.skipped,
        tz: row.tz,
    }
}

/// When a person asked a broadcast to go, as they wrote it: a start and a deadline (each an
/// instant, or a wall-clock time on each recipient's clock, see [`When`]), quiet hours
/// (`HH:MM-HH:MM`), and the zone of recipients without their own.
#[derive(Debug, Clone, Copy, Default)]
pub struct Asked<'a> {
    pub at: Option<When>,
    pub until: Option<When>,
    pub quiet_hours: Option<&'a str>,
    pub tz: Option<&'a str>,
}

/// Why a broadcast's times cannot be used: the field asked wrongly, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct Unscheduled {
    pub field: &'static str,
    pub why: String,
}

impl From<Mistake> for Unscheduled {
    fn from(m: Mistake) -> Unscheduled {
        Unscheduled {
            field: m.field,
            why: m.why,
        }
    }
}

/// The template's name and language, and the number it goes from, as Meta takes them: checked
/// in sandbox too, so a rehearsal fails where the real day would.
///
/// # Errors
/// The first [`Mistake`], naming the field.
pub fn check_names(b: &NewBroadcast) -> Result<(), Mistake> {
    checks::template_name(&b.template)?;
    checks::language(&b.language)?;
    checks::phone_number_id(&b.business)
}

fn unscheduled(field: &'static str) -> impl Fn(String) -> Unscheduled {
    move |why| Unscheduled { field, why }
}

/// Sets `b`'s start, deadline and hours from what was asked. Wall-clock times become instants
/// per recipient: the broadcast starts at the earliest and is cancelled after the latest, and
/// each recipient waits for its own (see [`LocalHours::span`]).
///
/// # Errors
/// What is wrong with what was asked, naming the field.
pub fn schedule(b: &mut NewBroadcast, asked: Asked<'_>) -> Result<(), Unscheduled> {
    let (at, until) = (asked.at, asked.until);
    let quiet = asked
        .quiet_hours
        .map(QuietHours::parse)
        .transpose()
        .map_err(unscheduled("quiet_hours"))?;
    let local = |when: Option<When>| match when {
        Some(When::Local(time)) => Some(time),
        _ => None,
    };
    let (start, end) = (local(at), local(until));
    if let (Some(start), Some(end)) = (start, end)
        && end <= start
    {
        return Err(unscheduled("until")(format!(
            "the deadline {end} is not after the start {start}"
        )));
    }
    let listed = || b.recipients.iter().filter(|r| r.skipped.is_none());
    let on_clocks = quiet.is_some() || start.is_some() || end.is_some();
    // Recipients who all have a zone of their own need no broadcast zone.
    let tz = asked
        .tz
        .or_else(|| listed().all(|r| r.tz.is_some()).then_some("UTC"));
    b.hours = match (tz, on_clocks) {
        (Some(tz), _) => Some(LocalHours::new(tz, quiet, start, end).map_err(unscheduled("tz"))?),
        (None, false) => None,
        (None, true) => {
            return Err(unscheduled("tz")(
                "quiet hours and times without an offset are read on each recipient's clock: \
                 give the zone of recipients without their own (like Africa/Lagos)"
                    .into(),
            ));
        }
    };
    let span = b
        .hours
        .as_ref()
        .map_or_else(Span::default, |h| h.span(listed().map(|r| r.tz.as_deref())));
    b.start_at = match at {
        Some(When::At(t)) => t,
        _ => span.start.unwrap_or(b.now),
    };
    b.until = match until {
        Some(When::At(t)) => Some(t),
        _ => span.until,
    };
    match at {
        Some(When::At(t)) => checks::not_past("at", t, b.now)?,
        // A wall-clock start is refused only once it has passed on every recipient's clock.
        Some(When::Local(_)) => {
            if let Some(last) = span.last_start {
                checks::not_past("at", last, b.now)?;
            }
        }
        None => {}
    }
    if let Some(deadline) = b.until {
        checks::not_past("until", deadline, b.now)?;
    }
    if let Some(deadline) = b.until.filter(|until| *until <= b.start_at) {
        return Err(unscheduled("until")(format!(
            "the deadline ({deadline} ms) is not after the start ({} ms)",
            b.start_at
        )));
    }
    Ok(())
}

/// Leaves out the recipients whose customers opted out of broadcasts, or were sent one within
/// the cooldown before the broadcast starts; the claim checks both again before each send, so
/// a customer who opts out later is skipped too. Returns how many customers Meta's messaging
/// limit lets broadcasts reach now (`None`: unlimited).
///
/// # Errors
/// When the store cannot say.
pub async fn leave_out(
    store: &dyn Broadcasts,
    settings: &BroadcastSettings,
    b: &mut NewBroadcast,
) -> store::Result<Option<u64>> {
    let listed: Vec<String> = b
        .recipients
        .iter()
        .filter(|r| r.skipped.is_none())
        .map(|r| r.to.clone())
        .collect();
    let out = store.opted_out(&listed).await?;
    let recent = store
        .sent_since(&listed, b.start_at - settings.cooldown)
        .await?;
    let cooldown = humantime::format_duration(settings.cooldown);
    for r in b.recipients.iter_mut().filter(|r| r.skipped.is_none()) {
        let Some(reason) = broadcast::left_out(out.contains(&r.to), recent.contains(&r.to)) else {
            continue;
        };
        let why = match reason {
            SkipReason::OptedOut => "opted out of broadcasts".to_owned(),
            _ => format!("sent a broadcast within the last {cooldown}"),
        };
        r.skipped = Some((reason, why));
    }
    let Some(limit) = settings.messaging_limit.0 else {
        return Ok(None);
    };
    // The day before the broadcast starts, not before now: a start days ahead has the whole
    // limit.
    let start = b.start_at.max(b.now);
    let reached = store.reached(start - broadcast::LIMIT_SPAN).await?;
    Ok(Some(limit.saturating_sub(reached)))
}

/// Checks a broadcast's template with Meta before anything is kept or sent.
pub struct Preflight {
    graph: Graph,
    /// The WhatsApp Business Account the templates belong to.
    account: String,
}

/// Why a broadcast's template cannot be sent.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("{name:?} does not exist in {language:?} on the business account{}", others(.languages))]
    NoTemplate {
        name: String,
        language: String,
        languages: Vec<String>,
    },
    #[error("{name:?} ({language}) is {status}, not APPROVED: nothing can be sent with it")]
    NotApproved {
        name: String,
        language: String,
        status: String,
    },
    #[error("could not be checked with Meta: {0}")]
    Graph(#[from] GraphError),
}

fn others(languages: &[String]) -> String {
    match languages.is_empty() {
        true => String::new(),
        false => format!(" (it has {})", languages.join(", ")),
    }
}

impl Preflight {
    /// `None` in sandbox mode (no access token) or without a business account id: templates go
    /// unchecked, and a dry run says so.
    ///
    /// # Errors
    /// When the Graph API client cannot be built.
    pub fn from_config(config: &Config) -> reqwest::Result<Option<Preflight>> {
        let whatsapp = &config.whatsapp;
        let (Some(token), Some(account)) = (&whatsapp.access_token, &whatsapp.business_account_id)
        else {
            return Ok(None);
        };
        let graph = Graph::new(&whatsapp.graph_base(), token.clone(), whatsapp.send_timeout)?;
        Ok(Some(Preflight {
            graph,
            account: account.clone(),
        }))
    }

    /// The template exists in the broadcast's language and is APPROVED; each recipient whose
    /// parameters are not as many as its body takes is left out, saying so. Its body is kept
    /// with the broadcast.
    ///
    /// # Errors
    /// [`Refused`] when nothing could be sent with it, or Meta could not be asked.
    pub async fn check(&self, b: &mut NewBroadcast) -> Result<(), Refused> {
        let found = self.graph.templates(&self.account, &b.template).await?;
        let Some(template) = found.iter().find(|t| t.language == b.language) else {
            return Err(Refused::NoTemplate {
                name: b.template.clone(),
                language: b.language.clone(),
                languages: found.into_iter().map(|t| t.language).collect(),
            });
        };
        if template.status != "APPROVED" {
            return Err(Refused::NotApproved {
                name: b.template.clone(),
                language: b.language.clone(),
                status: template.status.clone(),
            });
        }
        let takes = template.parameters();
        for r in b.recipients.iter_mut().filter(|r| r.skipped.is_none()) {
            if r.params.len() != takes {
                let why = format!(
                    "the template takes {takes} parameters; this row gives {}",
                    r.params.len()
                );
                r.skipped = Some((SkipReason::Invalid, why));
            }
        }
        b.body = template.body().map(str::to_owned);
        Ok(())
    }

    /// The business's messaging limit as Meta has it for the number `business`: `None` when
    /// Meta does not say.
    ///
    /// # Errors
    /// When Meta could not be asked.
    pub async fn metas_limit(&self, business: &str) -> Result<Option<MessagingLimit>, GraphError> {
        self.graph.messaging_limit(business).await
    }
}

/// The messaging limit a broadcast from `business` goes at: the broadcaster sends at most
/// `configured` (`whatsapp.messaging_limit`) a day, and Meta refuses beyond its own tier, so the
/// lower of the two, with Meta's tier read when it can be (`preflight`). When Meta could not
/// be asked, the setting's, saying so.
pub async fn messaging_limit(
    preflight: Option<&Preflight>,
    business: &str,
    configured: MessagingLimit,
) -> Limit {
    let Some(preflight) = preflight else {
        return Limit::configured(configured);
    };
    match preflight.metas_limit(business).await {
        Ok(meta) => Limit::of(configured, meta),
        Err(e) => Limit {
            unread: Some(e.to_string()),
            ..Limit::configured(configured)
        },
    }
}

/// The messaging limit a broadcast is planned with, and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limit {
    pub per_day: MessagingLimit,
    pub source: LimitSource,
    /// Meta's tier for the business, as the Graph API answered (`None`: not asked, or not
    /// said).
    pub meta: Option<MessagingLimit>,
    /// Why Meta's tier could not be read, when it could not.
    pub unread: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitSource {
    /// The business number's portfolio, as the Graph API answered.
    Meta,
    /// `whatsapp.messaging_limit`: in sandbox, or when Meta did not say.
    Setting,
}

impl Limit {
    pub fn configured(per_day: MessagingLimit) -> Limit {
        Limit {
            per_day,
            source: LimitSource::Setting,
            meta: None,
            unread: None,
        }
    }

    /// The lower of the setting and Meta's tier.
    pub fn of(configured: MessagingLimit, meta: Option<MessagingLimit>) -> Limit {
        let metas_is_lower = meta.is_some_and(|m| below(m, configured));
        Limit {
            per_day: if metas_is_lower { meta } else { None }.unwrap_or(configured),
            source: match metas_is_lower {
                true => LimitSource::Meta,
                false => LimitSource::Setting,
            },
            meta,
            unread: None,
        }
    }

    /// What a person should know when the setting and Meta's tier differ, or Meta could not
    /// be asked.
    pub fn note(&self, configured: MessagingLimit) -> Option<String> {
        if let Some(why) = &self.unread {
            return Some(format!(
                "Meta's messaging limit could not be read ({why}): planned with \
                 whatsapp.messaging_limit ({})",
                per_day(configured)
            ));
        }
        let meta = self.meta?;
        if below(meta, configured) {
            return Some(format!(
                "Meta lets this business reach {} a day, fewer than whatsapp.messaging_limit \
                 ({}): planned with Meta's; set whatsapp.messaging_limit = {} so the \
                 broadcaster keeps to it",
                per_day(meta),
                per_day(configured),
                meta
            ));
        }
        below(configured, meta).then(|| {
            format!(
                "Meta lets this business reach {} a day; the broadcaster keeps to \
                 whatsapp.messaging_limit ({}): set it to {} to go faster",
                per_day(meta),
                per_day(configured),
                meta
            )
        })
    }
}

/// Whether limit `a` lets fewer customers through than `b` (`None` is unlimited).
fn below(a: MessagingLimit, b: MessagingLimit) -> bool {
    match (a.0, b.0) {
        (Some(a), Some(b)) => a < b,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// "250 customers" or "unlimited customers".
fn per_day(limit: MessagingLimit) -> String {
    match limit.0 {
        Some(n) => format!("{n} customers"),
        None => "unlimited customers".into(),
    }
}

/// What a create would do, with nothing kept.
#[derive(Debug, Serialize)]
pub struct DryRun {
    pub dry_run: bool,
    /// Rows in the audience.
    pub recipients: usize,
    pub to_send: usize,
    pub skipped: Vec<LeftOut>,
    /// From the start until the last recipient goes.
    pub takes_ms: i64,
    /// When the last recipient goes, ms since the epoch (quiet hours aside).
    pub finishes_at: i64,
    /// How many go each day: the messaging limit's, or all at the rate.
    pub per_day: u64,
    /// Days with sends, the first included.
    pub days: u64,
    /// Messages a second: the pace really allowed (see [`checks::pace`]).
    pub rate: u32,
    pub messaging_limit: Limit,
    /// Customers Meta's messaging limit lets broadcasts reach now (`None`: unlimited)...
    pub headroom: Option<u64>,
    /// ...and how many of this audience wait for it to free up.
    pub wait_for_headroom: usize,
    /// Meta confirmed the template and its parameters (see [`Preflight`]).
    pub template_checked: bool,
    /// What was changed from what was asked, and why.
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct LeftOut {
    pub line: Option<u64>,
    pub to: String,
    pub reason: SkipReason,
    pub why: String,
}

/// When the sends of a broadcast go, by the messaging limit and the rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeline {
    pub finishes_at: At,
    pub per_day: u64,
    pub days: u64,
}

/// `to_send` recipients from `start` at `rate` a second, `headroom` of them at once and
/// `per_day` more each day after. Meta's window is a rolling 24 hours: the places taken in the
/// day before `start` free one by one as their day ends, by `start` + 24 h at the latest, so
/// the finish is the latest it can be, never a promise the limit breaks.
pub fn timeline(
    to_send: u64,
    start: At,
    rate: u32,
    headroom: Option<u64>,
    per_day: MessagingLimit,
) -> Timeline {
    let rate = u64::from(rate.max(1));
    let at_rate = |n: u64| Duration::from_secs_f64(n as f64 / rate as f64);
    let by_rate = rate.saturating_mul(24 * 60 * 60);
    let first = headroom.map_or(to_send, |h| to_send.min(h));
    let rest = to_send - first;
    let daily = per_day.0.map_or(by_rate, |l| l.clamp(1, by_rate));
    if rest == 0 {
        return Timeline {
            finishes_at: start + at_rate(first),
            per_day: daily.min(to_send),
            // The rate alone can spread a large audience over days.
            days: first.div_ceil(by_rate),
        };
    }
    let more_days = rest.div_ceil(daily);
    let last_day = rest - (more_days - 1) * daily;
    let days_after = u32::try_from(more_days).unwrap_or(u32::MAX);
    Timeline {
        finishes_at: start + broadcast::LIMIT_SPAN.saturating_mul(days_after) + at_rate(last_day),
        per_day: daily,
        days: more_days + u64::from(first > 0),
    }
}

impl DryRun {
    /// `headroom` as [`leave_out`] gives it.
    pub fn of(b: &NewBroadcast, headroom: Option<u64>, limit: Limit) -> DryRun {
        let to_send = b.recipients.iter().filter(|r| r.skipped.is_none()).count();
        let start = b.start_at.max(b.now);
        let line = timeline(to_send as u64, start, b.rate, headroom, limit.per_day);
        let now = headroom.map_or(to_send, |h| {
            to_send.min(usize::try_from(h).unwrap_or(usize::MAX))
        });
        let skipped = b
            .recipients
            .iter()
            .filter_map(|r| {
                let (reason, why) = r.skipped.as_ref()?;
                Some(LeftOut {
                    line: r.line,
                    to: r.to.clone(),
                    reason: *reason,
                    why: why.clone(),
                })
            })
            .collect();
        DryRun {
            dry_run: true,
            recipients: b.recipients.len(),
            to_send,
            skipped,
            takes_ms: millis(line.finishes_at.since(start)),
            finishes_at: line.finishes_at.millis(),
            per_day: line.per_day,
            days: line.days,
            rate: b.rate,
            messaging_limit: limit,
            headroom,
            wait_for_headroom: to_send - now,
            template_checked: b.body.is_some(),
            notes: Vec::new(),
        }
    }
}

/// Why a live broadcast's recipients wait, and when the next ones go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Waiting {
    /// `paused`, `start`, `quiet_hours` or `messaging_limit`.
    pub reason: &'static str,
    pub message: String,
    /// When the next ones go, ms since the epoch; `None` when a person decides (a pause).
    pub next_at: Option<At>,
}

/// How much of Meta's messaging limit broadcasts use now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    pub limit: MessagingLimit,
    /// Customers reached in the last 24 hours ([`Broadcasts::reached`]).
    pub reached: u64,
    /// The earliest of their latest sends ([`Broadcasts::first_reached`]).
    pub first: Option<At>,
}

impl Reach {
    /// # Errors
    /// When the store cannot say.
    pub async fn read(
        store: &dyn Broadcasts,
        limit: MessagingLimit,
        now: At,
    ) -> store::Result<Reach> {
        let since = now - broadcast::LIMIT_SPAN;
        Ok(Reach {
            limit,
            reached: store.reached(since).await?,
            first: store.first_reached(since).await?,
        })
    }
}

/// Why `b`'s recipients wait at `now`; `None` when they are being sent, or none waits.
pub fn waiting(b: &BroadcastView, now: At, reach: Reach) -> Option<Waiting> {
    if let Some(why) = &b.paused_because {
        return Some(Waiting {
            reason: "paused",
            message: format!(
                "paused ({why}): `sabi broadcast resume {}` sends the rest",
                b.id
            ),
            next_at: None,
        });
    }
    let n = |state: &str| b.counts.get(state).copied().unwrap_or(0);
    if !b.state.live() || n("queued") + n("held") == 0 {
        return None;
    }
    if b.start_at > now {
        return Some(wait("start", "it starts", b.start_at));
    }
    let hours = || LocalHours::stored(b.quiet_hours.as_deref(), b.tz.as_deref(), None, None);
    if let Some(Turn::Wait(end)) = hours().map(|h| h.turn(None, now)) {
        return Some(wait("quiet_hours", "quiet hours end", end));
    }
    let local = LocalHours::stored(
        None,
        b.tz.as_deref(),
        b.local_start.as_deref(),
        b.local_until.as_deref(),
    );
    if let Some(Turn::Wait(start)) = local.map(|h| h.turn(None, now)) {
        return Some(wait("start", "it starts on its recipients' clocks", start));
    }
    let limit = reach.limit.0?;
    if reach.reached < limit {
        return None;
    }
    let next = reach.first.map(|first| first + broadcast::LIMIT_SPAN);
    Some(Waiting {
        reason: "messaging_limit",
        message: format!(
            "Meta's messaging limit: {} customers reached in the last 24 hours, of {limit} a \
             day{}",
            reach.reached,
            next.map_or_else(String::new, |t| format!(
                "; the next go from {}",
                checks::rfc3339(t)
            ))
        ),
        next_at: next,
    })
}

fn wait(reason: &'static str, what: &str, next: At) -> Waiting {
    Waiting {
        reason,
        message: format!("{what} at {}", checks::rfc3339(next)),
        next_at: Some(next),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = broadcast::LIMIT_SPAN;

    #[test]
    fn an_audience_beyond_the_limit_takes_a_day_per_limit() {
        let start = At::from_millis(1_800_000_000_000);
        let line = timeline(18_000, start, 20, Some(250), MessagingLimit(Some(250)));
        assert_eq!(line.days, 72);
        assert_eq!(line.per_day, 250);
        assert_eq!(
            line.finishes_at,
            start + DAY * 71 + Duration::from_millis(12_500)
        );
    }

    #[test]
    fn within_the_limit_the_rate_decides() {
        let start = At::from_millis(0);
        let line = timeline(2_000, start, 80, Some(10_000), MessagingLimit(Some(10_000)));
        assert_eq!(line.days, 1);
        assert_eq!(line.per_day, 2_000);
        assert_eq!(line.finishes_at, start + Duration::from_secs(25));
        let unlimited = timeline(2_000, start, 80, None, MessagingLimit(None));
        assert_eq!(unlimited, line);
        // A day at one a second is 86,400: the rate alone spreads 200,000 over three days.
        let slow = timeline(200_000, start, 1, None, MessagingLimit(None));
        assert_eq!((slow.days, slow.per_day), (3, 86_400));
        assert_eq!(slow.finishes_at, start + Duration::from_secs(200_000));
    }

    #[test]
    fn headroom_used_today_pushes_the_rest_to_tomorrow() {
        let start = At::from_millis(0);
        let line = timeline(300, start, 10, Some(0), MessagingLimit(Some(250)));
        assert_eq!(line.days, 2);
        assert_eq!(line.finishes_at, start + DAY * 2 + Duration::from_secs(5));
        assert_eq!(
            timeline(0, start, 10, Some(0), MessagingLimit(Some(250))).days,
            0
        );
        // 100 places free now: they go at once, the next 250 within the day, the last 50 the
        // day after; the places taken yesterday free by the end of today at the latest.
        let some = timeline(400, start, 10, Some(100), MessagingLimit(Some(250)));
        assert_eq!(some.days, 3);
        assert_eq!(some.finishes_at, start + DAY * 2 + Duration::from_secs(5));
    }
}
