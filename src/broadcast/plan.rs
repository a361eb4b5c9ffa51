//! A broadcast before it is kept: its template checked with Meta ([`Preflight`]), who is left
//! out and why (the audience's own reasons, parameters the template does not take, and the
//! customers who opted out), and what a dry run says it would do. The command line and the
//! admin API both make broadcasts through it.

use std::time::Duration;

use serde::Serialize;

use crate::broadcast::audience::Row;
use crate::clock::millis;
use crate::config::{BroadcastSettings, Config};
use crate::store::rules::broadcast;
use crate::store::rules::hours::Span;
use crate::store::{
    self, Broadcasts, LocalHours, NewBroadcast, NewRecipient, QuietHours, SkipReason, When,
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
    let reached = store.reached(b.now - broadcast::LIMIT_SPAN).await?;
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
        let graph = Graph::new(&whatsapp.api_base, token.clone(), whatsapp.send_timeout)?;
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
}

/// What a create would do, with nothing kept.
#[derive(Debug, Serialize)]
pub struct DryRun {
    pub dry_run: bool,
    /// Rows in the audience.
    pub recipients: usize,
    pub to_send: usize,
    pub skipped: Vec<LeftOut>,
    /// How long the sends the messaging limit lets go now take at the broadcast's rate.
    pub takes_ms: i64,
    pub rate: u32,
    /// Customers Meta's messaging limit lets broadcasts reach now (`None`: unlimited)...
    pub headroom: Option<u64>,
    /// ...and how many of this audience wait for more, a day at most.
    pub wait_for_headroom: usize,
    /// Meta confirmed the template and its parameters (see [`Preflight`]).
    pub template_checked: bool,
}

#[derive(Debug, Serialize)]
pub struct LeftOut {
    pub line: Option<u64>,
    pub to: String,
    pub reason: SkipReason,
    pub why: String,
}

impl DryRun {
    pub fn of(b: &NewBroadcast, headroom: Option<u64>) -> DryRun {
        let to_send = b.recipients.iter().filter(|r| r.skipped.is_none()).count();
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
        let takes = Duration::from_secs_f64(now as f64 / f64::from(b.rate.max(1)));
        DryRun {
            dry_run: true,
            recipients: b.recipients.len(),
            to_send,
            skipped,
            takes_ms: millis(takes),
            rate: b.rate,
            headroom,
            wait_for_headroom: to_send - now,
            template_checked: b.body.is_some(),
        }
    }
}
