//! `sabi broadcast`: create a broadcast from an audience file (or see what it would do), list,
//! show, pause, resume and cancel broadcasts, on the store the configuration names. A running
//! `sabi serve` with an access token sends them.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::shown;
use crate::broadcast::audience;
use crate::broadcast::checks;
use crate::broadcast::plan::{
    self, DryRun, LeftOut, Limit, LimitSource, Preflight, Reach, Waiting,
};
use crate::broadcast::report::{self, Prices, Report};
use crate::clock::{At, Clock, SystemClock};
use crate::config::{BroadcastSettings, Config};
use crate::plan::words::thousands;
use crate::store::{self, BroadcastView, Control, NewBroadcast, RecipientState, Store, When};

#[derive(Debug, Subcommand)]
pub(super) enum BroadcastAction {
    /// Keep a broadcast of a template to everyone in an audience file.
    Create(Box<Create>),
    /// The broadcasts, the latest first.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// One broadcast with its counts, and the recipients in one state when asked.
    Show {
        id: i64,
        /// List the recipients in this state (queued, accepted, failed, skipped, ...).
        #[arg(long, value_parser = recipient_state)]
        recipients: Option<RecipientState>,
        #[arg(long)]
        json: bool,
    },
    /// How it went: delivered, read, replied and opted-out rates, the replies minute by minute
    /// after each send, and its cost (estimated, and as Meta's statuses priced it).
    Report {
        id: i64,
        #[arg(long)]
        json: bool,
    },
    /// A live progress bar until it is finished or cancelled: why recipients wait, and when
    /// the next go.
    Watch {
        id: i64,
        /// One JSON object a line, each time it changes.
        #[arg(long)]
        json: bool,
    },
    /// Stop sending it for now.
    Pause {
        id: i64,
        #[arg(long)]
        reason: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Send it again after a pause.
    Resume {
        id: i64,
        #[arg(long)]
        json: bool,
    },
    /// Stop it for good: who has not had it never will.
    Cancel {
        id: i64,
        #[arg(long)]
        json: bool,
    },
}

/// What `sabi broadcast create` takes.
#[derive(Debug, Args)]
pub(super) struct Create {
    #[arg(long)]
    name: String,
    /// The approved template's name.
    #[arg(long)]
    template: String,
    /// Its language code, like en or en_US.
    #[arg(long)]
    language: String,
    /// A CSV file with a header (separated by , ; tab or |); its phone column (phone, wa_id,
    /// Phone Number, mobile, msisdn, whatsapp, tel, ...) names each recipient.
    #[arg(long)]
    audience: PathBuf,
    /// The audience file's column of numbers, when its header is not a usual phone header.
    #[arg(long, value_name = "NAME")]
    phone_column: Option<String>,
    /// A column whose value fills the template's next body parameter ({{1}}, {{2}}, ...).
    #[arg(long = "param", value_name = "COLUMN")]
    params: Vec<String>,
    /// The business number (phone-number id) it goes from.
    #[arg(long = "from", value_name = "PHONE_NUMBER_ID")]
    business: String,
    /// Not before this time: 2026-11-11T18:00:00Z is one instant; 2026-11-11T09:00 (no offset)
    /// is nine o'clock on each recipient's clock. Now by default.
    #[arg(long)]
    at: Option<String>,
    /// Cancel what is not sent by this time, written as --at is.
    #[arg(long)]
    until: Option<String>,
    /// Messages per second at most; above the number's pace (whatsapp.outbound_rate) it goes
    /// at that.
    #[arg(long, default_value_t = 20)]
    rate: u32,
    /// Hours of the day it sends nothing, like 21:00-08:00, on each recipient's clock.
    #[arg(long)]
    quiet_hours: Option<String>,
    /// The IANA time zone of recipients without their own (the audience's tz column, or their
    /// country's), like Africa/Lagos.
    #[arg(long)]
    tz: Option<String>,
    /// The country code added to numbers written the local way (a leading 0), like 234;
    /// whatsapp.default_country when not given.
    #[arg(long, value_parser = crate::phone::country_code)]
    country: Option<String>,
    /// Creating again with the same key gives the same broadcast.
    #[arg(long)]
    key: Option<String>,
    /// Keep nothing: print who would get it, who is left out and why, and how long it takes.
    #[arg(long)]
    dry_run: bool,
    /// Keep a broadcast to more than 1,000 customers without asking first.
    #[arg(long)]
    yes: bool,
    #[arg(long)]
    json: bool,
}

pub(super) async fn run(config: &Config, action: BroadcastAction) -> anyhow::Result<()> {
    match action {
        BroadcastAction::Create(create) => self::create(config, *create).await,
        BroadcastAction::Ls { json } => {
            let store = store::open(config).await?;
            for b in store.broadcasts(1_000).await? {
                print(&b, json)?;
            }
            Ok(())
        }
        BroadcastAction::Show {
            id,
            recipients,
            json,
        } => {
            let store = store::open(config).await?;
            let b = store
                .broadcast(id)
                .await?
                .context("no broadcast has this id")?;
            let waits = waiting(config, store.as_ref(), &b).await?;
            match json {
                true => println!("{}", serde_json::to_string(&with_waiting(&b, &waits)?)?),
                false => {
                    print(&b, false)?;
                    if let Some(w) = &waits {
                        println!("  waiting: {}", shown(&w.message));
                    }
                }
            }
            if let Some(state) = recipients {
                for r in store
                    .broadcast_recipients(id, Some(state), usize::MAX)
                    .await?
                {
                    match json {
                        true => println!("{}", serde_json::to_string(&r)?),
                        false => println!(
                            "{:>8}  {:<16} line {:<6} {}",
                            r.id,
                            shown(&r.to),
                            r.line.map_or_else(String::new, |l| l.to_string()),
                            shown(r.error.as_deref().unwrap_or_default())
                        ),
                    }
                }
            }
            Ok(())
        }
        BroadcastAction::Report { id, json } => {
            let store = store::open(config).await?;
            let prices = Prices {
                by_prefix: &config.broadcast.prices,
                currency: &config.broadcast.currency,
            };
            let report = report::report(store.as_ref(), id, &prices)
                .await?
                .context("no broadcast has this id")?;
            match json {
                true => println!("{}", serde_json::to_string(&report)?),
                false => print_report(&report)?,
            }
            Ok(())
        }
        BroadcastAction::Watch { id, json } => watch(config, id, json).await,
        BroadcastAction::Pause { id, reason, json } => {
            control(config, id, Control::Pause, reason, json).await
        }
        BroadcastAction::Resume { id, json } => {
            control(config, id, Control::Resume, None, json).await
        }
        BroadcastAction::Cancel { id, json } => {
            control(config, id, Control::Cancel, None, json).await
        }
    }
}

/// Broadcasts to more customers than this are asked about on a terminal first.
const CONFIRM_ABOVE: usize = 1_000;

async fn create(config: &Config, mut c: Create) -> anyhow::Result<()> {
    let (json, yes, dry_only) = (c.json, c.yes, c.dry_run);
    // A run again with the key gets what the first kept, whatever has changed since (the
    // start passed, its customers reached).
    if let Some(key) = c.key.as_deref().filter(|_| !dry_only)
        && let Some(made) = store::open(config).await?.keyed_broadcast(key).await?
    {
        if !json {
            println!("a broadcast with this key exists already:");
        }
        return print(&made, json);
    }
    c.country = c
        .country
        .or_else(|| config.whatsapp.default_country.clone());
    let pace = checks::pace(c.rate, config.whatsapp.outbound_rate).map_err(flag)?;
    let mut broadcast = asked(c, pace.rate)?;
    let preflight = Preflight::from_config(config)?;
    match &preflight {
        Some(p) => p.check(&mut broadcast).await.context("the template")?,
        None if !json => eprintln!(
            "the template is not checked with Meta: that needs whatsapp.access_token and \
             whatsapp.business_account_id"
        ),
        None => {}
    }
    let limit = plan::messaging_limit(
        preflight.as_ref(),
        &broadcast.business,
        config.whatsapp.messaging_limit,
    )
    .await;
    let store = store::open(config).await?;
    let settings = BroadcastSettings {
        messaging_limit: limit.per_day,
        ..config.broadcast_settings()
    };
    let headroom = plan::leave_out(store.as_ref(), &settings, &mut broadcast).await?;
    let limit_note = limit.note(config.whatsapp.messaging_limit);
    let mut dry_run = DryRun::of(&broadcast, headroom, limit);
    dry_run
        .notes
        .extend(pace.note().into_iter().chain(limit_note));
    if dry_only {
        return dry(&dry_run, &broadcast, json);
    }
    if !json {
        for note in &dry_run.notes {
            eprintln!("{note}");
        }
    }
    anyhow::ensure!(
        dry_run.to_send > 0 || broadcast.recipients.is_empty(),
        "not kept: every one of the {} rows is left out; --dry-run lists them with why",
        thousands(broadcast.recipients.len() as u64)
    );
    if !yes && dry_run.to_send > CONFIRM_ABOVE {
        confirm(&dry_run)?;
    }
    let (made, created) = store.create_broadcast(broadcast).await?;
    if !created && !json {
        println!("a broadcast with this key exists already:");
    }
    print(&made, json)
}

/// The broadcast as asked, going at `rate`, its audience read, names checked and times set.
///
/// # Errors
/// What is wrong with what was asked, naming the flag.
fn asked(c: Create, rate: u32) -> anyhow::Result<NewBroadcast> {
    let text = std::fs::read_to_string(&c.audience)
        .with_context(|| format!("reading {}", c.audience.display()))?;
    let rows = audience::parse(
        &text,
        &c.params,
        c.country.as_deref(),
        c.phone_column.as_deref(),
    )?;
    let now = SystemClock.now();
    let mut broadcast = NewBroadcast {
        key: c.key,
        name: c.name,
        template: c.template,
        language: c.language,
        business: c.business,
        now,
        start_at: now,
        until: None,
        rate,
        body: None,
        hours: None,
        recipients: rows.into_iter().map(plan::recipient).collect(),
    };
    plan::check_names(&broadcast).map_err(flag)?;
    let when = |text: Option<String>| text.as_deref().map(When::parse).transpose();
    let asked = plan::Asked {
        at: when(c.at).map_err(|e| anyhow::anyhow!("--at: {e}"))?,
        until: when(c.until).map_err(|e| anyhow::anyhow!("--until: {e}"))?,
        quiet_hours: c.quiet_hours.as_deref(),
        tz: c.tz.as_deref(),
    };
    plan::schedule(&mut broadcast, asked)
        .map_err(|e| anyhow::anyhow!("--{}: {}", e.field.replace('_', "-"), e.why))?;
    Ok(broadcast)
}

/// A mistake in what was asked, named by its flag.
fn flag(m: checks::Mistake) -> anyhow::Error {
    anyhow::anyhow!("--{}: {}", m.field.replace('_', "-"), m.why)
}

/// Asks on the terminal before a broadcast to many customers is kept: once kept, it sends.
///
/// # Errors
/// When the answer is not yes, or there is no terminal to ask on.
fn confirm(dry: &DryRun) -> anyhow::Result<()> {
    let many = thousands(dry.to_send as u64);
    if !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
        anyhow::bail!(
            "this broadcast goes to {many} customers and there is no terminal to confirm it on: \
             add --yes to keep it (--dry-run shows what it would do)"
        );
    }
    eprint!(
        "{}\nKeep this broadcast to {many} customers? It starts sending as planned. [y/N] ",
        when_done(dry)
    );
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => anyhow::bail!(
            "not kept: the broadcast was not confirmed (--yes keeps it without asking)"
        ),
    }
}

async fn control(
    config: &Config,
    id: i64,
    control: Control,
    reason: Option<String>,
    json: bool,
) -> anyhow::Result<()> {
    let store = store::open(config).await?;
    match store.control_broadcast(id, control, reason).await {
        Ok(b) => print(&b, json),
        Err(store::Error::NotFound) => {
            anyhow::bail!("no broadcast {id} that can be {}", past(control))
        }
        Err(e) => Err(e.into()),
    }
}

fn past(control: Control) -> &'static str {
    match control {
        Control::Pause => "paused (only a scheduled or running one)",
        Control::Resume => "resumed (only a paused one)",
        Control::Cancel => "cancelled (only one not yet finished or cancelled)",
    }
}

/// What a create would do, with nothing kept.
fn dry(dry: &DryRun, b: &NewBroadcast, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(dry)?);
        return Ok(());
    }
    println!(
        "{} would get {:?} ({}) from {}: {} of {} rows",
        thousands(dry.to_send as u64),
        b.template,
        b.language,
        b.business,
        thousands(dry.to_send as u64),
        thousands(dry.recipients as u64),
    );
    println!("  {}", when_done(dry));
    for note in &dry.notes {
        println!("  {note}");
    }
    for s in dry.skipped.iter().take(LEFT_OUT_SHOWN) {
        println!(
            "  left out, line {}: {} ({})",
            s.line.map_or_else(String::new, |l| l.to_string()),
            shown(&s.why),
            s.reason
        );
    }
    if let Some(more) = dry
        .skipped
        .len()
        .checked_sub(LEFT_OUT_SHOWN)
        .filter(|&n| n > 0)
    {
        println!(
            "  ... and {} more left out ({}); --json lists every one",
            thousands(more as u64),
            reasons(&dry.skipped[LEFT_OUT_SHOWN..])
        );
    }
    Ok(())
}

/// The left-out rows a dry run's text lists one by one; the rest are counted by reason.
const LEFT_OUT_SHOWN: usize = 10;

/// "17,990 invalid, 26 duplicate".
fn reasons(skipped: &[LeftOut]) -> String {
    let mut counts = std::collections::BTreeMap::<String, u64>::new();
    for s in skipped {
        *counts.entry(s.reason.to_string()).or_default() += 1;
    }
    let counted: Vec<String> = counts
        .iter()
        .map(|(reason, n)| format!("{} {reason}", thousands(*n)))
        .collect();
    counted.join(", ")
}

/// "18,000 recipients at 250 customers a day: 72 days, the last by 2027-02-14 18:00 UTC".
fn when_done(dry: &DryRun) -> String {
    if dry.to_send == 0 {
        return "nobody would get it: every row is left out".into();
    }
    let last = checks::rfc3339(At::from_millis(dry.finishes_at));
    let limit = match dry.messaging_limit.source {
        LimitSource::Meta => "Meta's messaging limit for this business",
        LimitSource::Setting => "whatsapp.messaging_limit",
    };
    if dry.days > 1 {
        return format!(
            "{} recipients at {} customers a day ({limit}): {} days, the last by {last}",
            thousands(dry.to_send as u64),
            thousands(dry.per_day),
            dry.days,
        );
    }
    let takes = Duration::from_secs(u64::try_from(dry.takes_ms).unwrap_or(0).div_ceil(1000));
    format!(
        "{} recipients at {} a second: about {}, the last at {last}",
        thousands(dry.to_send as u64),
        dry.rate,
        humantime::format_duration(takes),
    )
}

/// Why `b`'s recipients wait now, by Meta's messaging limit as [`limit`] reads it.
async fn waiting(
    config: &Config,
    store: &dyn Store,
    b: &BroadcastView,
) -> anyhow::Result<Option<Waiting>> {
    let limit = limit(config, &b.business).await?;
    let now = SystemClock.now();
    let reach = Reach::read(store, limit.per_day, now).await?;
    Ok(plan::waiting(b, now, reach))
}

/// The messaging limit broadcasts from `business` go at (see [`plan::messaging_limit`]).
async fn limit(config: &Config, business: &str) -> anyhow::Result<Limit> {
    let preflight = Preflight::from_config(config)?;
    let limit = plan::messaging_limit(
        preflight.as_ref(),
        business,
        config.whatsapp.messaging_limit,
    )
    .await;
    Ok(limit)
}

/// A broadcast as JSON with why its recipients wait (`waiting`, null when none do).
fn with_waiting(b: &BroadcastView, waits: &Option<Waiting>) -> anyhow::Result<serde_json::Value> {
    let mut value = serde_json::to_value(b)?;
    value["waiting"] = serde_json::to_value(waits)?;
    Ok(value)
}

/// Redraws one line a second (a line per change when not on a terminal, a JSON object a line
/// with `json`) until the broadcast ends.
async fn watch(config: &Config, id: i64, json: bool) -> anyhow::Result<()> {
    let store = store::open(config).await?;
    let terminal = !json && std::io::stdout().is_terminal();
    let limit = limit(
        config,
        &store
            .broadcast(id)
            .await?
            .context("no broadcast has this id")?
            .business,
    )
    .await?;
    let mut last = String::new();
    loop {
        let b = store
            .broadcast(id)
            .await?
            .context("no broadcast has this id")?;
        let now = SystemClock.now();
        let reach = Reach::read(store.as_ref(), limit.per_day, now).await?;
        let waits = plan::waiting(&b, now, reach);
        let line = match json {
            true => serde_json::to_string(&with_waiting(&b, &waits)?)?,
            false => progress(&b, waits.as_ref()),
        };
        if line != last {
            match terminal {
                true => print!("\r\x1b[2K{line}"),
                false => println!("{line}"),
            }
            super::pipe::stdout().flush()?;
            last = line;
        }
        if !b.state.live() {
            if terminal {
                println!();
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `[#########...........]  45% 2250/5000 sent, 12 failed, 30 left out  running`
fn progress(b: &BroadcastView, waits: Option<&Waiting>) -> String {
    const WIDTH: u64 = 30;
    let n = |state: &str| b.counts.get(state).copied().unwrap_or(0);
    let sent = n("accepted") + n("delivered") + n("read");
    let done = b.recipients - n("queued") - n("held") - n("sending");
    let filled = (done * WIDTH).checked_div(b.recipients).unwrap_or(WIDTH);
    let percent = (done * 100).checked_div(b.recipients).unwrap_or(100);
    let bar: String = (0..WIDTH)
        .map(|i| if i < filled { '#' } else { '.' })
        .collect();
    let state = match (waits, &b.paused_because) {
        (Some(w), _) => format!("{}: waiting, {}", b.state, shown(&w.message)),
        (None, Some(why)) => format!("paused: {}", shown(why)),
        (None, None) => b.state.to_string(),
    };
    format!(
        "[{bar}] {percent:>3}% {sent}/{} sent, {} failed, {} unknown, {} left out, {} held  {state}",
        b.recipients,
        n("failed"),
        n("unknown"),
        n("skipped") + n("cancelled"),
        n("held"),
    )
}

fn print_report(r: &Report) -> anyhow::Result<()> {
    print(&r.broadcast, false)?;
    let percent = |share: f64| format!("{:.1}%", share * 100.0);
    println!(
        "  sent {}: delivered {}, read {}, replied {}, opted out {}, failed {}",
        r.sent,
        percent(r.rates.delivered),
        percent(r.rates.read),
        percent(r.rates.replied),
        percent(r.rates.opted_out),
        percent(r.rates.failed)
    );
    let curve: Vec<String> = r.reply_curve.iter().map(u64::to_string).collect();
    println!(
        "  first replies per minute after the send: {} (later: {})",
        curve.join(" "),
        r.replies_later
    );
    let c = &r.cost;
    println!(
        "  cost: {:.2} {} estimated, {:.2} {} charged by Meta ({} billed, {} free, {} not priced \
         yet){}",
        c.estimated,
        c.currency,
        c.actual,
        c.currency,
        c.billed,
        c.free,
        c.awaiting_pricing,
        match c.unpriced {
            0 => String::new(),
            n => format!("; {n} recipients in countries without a price in broadcast.prices"),
        }
    );
    let by_category: Vec<String> = c
        .by_category
        .iter()
        .map(|(category, charged)| {
            format!(
                "{category} {} ({:.2} {})",
                charged.messages, charged.cost, c.currency
            )
        })
        .collect();
    if !by_category.is_empty() {
        println!("  charged by Meta's category: {}", by_category.join(", "));
    }
    Ok(())
}

fn print(b: &BroadcastView, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(b)?);
        return Ok(());
    }
    let counts: Vec<String> = b
        .counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(state, n)| format!("{state} {n}"))
        .collect();
    println!(
        "{:>6}  {:<10} {:<24} {} recipients: {}{}",
        b.id,
        b.state,
        shown(&b.name),
        b.recipients,
        counts.join(", "),
        b.paused_because
            .as_deref()
            .map_or_else(String::new, |why| format!(" (paused: {})", shown(why)))
    );
    Ok(())
}

fn recipient_state(s: &str) -> Result<RecipientState, String> {
    RecipientState::parse(s).ok_or_else(|| {
        let names: Vec<&str> = RecipientState::ALL.iter().map(|s| s.as_str()).collect();
        format!("one of {}", names.join(", "))
    })
}
