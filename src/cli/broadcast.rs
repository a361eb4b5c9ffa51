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
use crate::broadcast::plan::{self, DryRun, Preflight};
use crate::broadcast::report::{self, Prices, Report};
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::store::{self, BroadcastView, Control, NewBroadcast, RecipientState, When};

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
    /// A live progress bar until it is finished or cancelled.
    Watch { id: i64 },
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
    /// Messages per second at most.
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
    #[arg(long)]
    json: bool,
}

pub(super) async fn run(config: &Config, action: BroadcastAction) -> anyhow::Result<()> {
    match action {
        BroadcastAction::Create(create) => {
            let Create {
                name,
                template,
                language,
                audience,
                phone_column,
                params,
                business,
                at,
                until,
                rate,
                quiet_hours,
                tz,
                country,
                key,
                dry_run,
                json,
            } = *create;
            let text = std::fs::read_to_string(&audience)
                .with_context(|| format!("reading {}", audience.display()))?;
            let country = country.or_else(|| config.whatsapp.default_country.clone());
            let rows =
                audience::parse(&text, &params, country.as_deref(), phone_column.as_deref())?;
            let now = SystemClock.now();
            let mut broadcast = NewBroadcast {
                key,
                name,
                template,
                language,
                business,
                now,
                start_at: now,
                until: None,
                rate: rate.max(1),
                body: None,
                hours: None,
                recipients: rows.into_iter().map(plan::recipient).collect(),
            };
            let when = |text: Option<String>| text.as_deref().map(When::parse).transpose();
            let asked = plan::Asked {
                at: when(at).map_err(anyhow::Error::msg)?,
                until: when(until).map_err(anyhow::Error::msg)?,
                quiet_hours: quiet_hours.as_deref(),
                tz: tz.as_deref(),
            };
            plan::schedule(&mut broadcast, asked)
                .map_err(|e| anyhow::anyhow!("--{}: {}", e.field.replace('_', "-"), e.why))?;
            match Preflight::from_config(config)? {
                Some(preflight) => preflight
                    .check(&mut broadcast)
                    .await
                    .context("the template")?,
                None if !json => eprintln!(
                    "the template is not checked with Meta: that needs whatsapp.access_token and \
                     whatsapp.business_account_id"
                ),
                None => {}
            }
            let store = store::open(config).await?;
            let settings = config.broadcast_settings();
            let headroom = plan::leave_out(store.as_ref(), &settings, &mut broadcast).await?;
            if dry_run {
                return dry(&broadcast, headroom, json);
            }
            let (made, created) = store.create_broadcast(broadcast).await?;
            if !created && !json {
                println!("a broadcast with this key exists already:");
            }
            print(&made, json)
        }
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
            print(&b, json)?;
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
        BroadcastAction::Watch { id } => watch(config, id).await,
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
fn dry(b: &NewBroadcast, headroom: Option<u64>, json: bool) -> anyhow::Result<()> {
    let dry = DryRun::of(b, headroom);
    if json {
        println!("{}", serde_json::to_string(&dry)?);
        return Ok(());
    }
    println!(
        "{} would get {:?} ({}) from {}: {} of {} rows, about {} at {} a second",
        dry.to_send,
        b.template,
        b.language,
        b.business,
        dry.to_send,
        dry.recipients,
        humantime::format_duration(Duration::from_secs(dry.takes_ms.unsigned_abs() / 1000)),
        b.rate
    );
    if dry.wait_for_headroom > 0 {
        println!(
            "  {} wait for Meta's messaging limit (whatsapp.messaging_limit): {} more customers \
             can be reached in these 24 hours; the rest go as it frees up",
            dry.wait_for_headroom,
            dry.headroom.unwrap_or(0)
        );
    }
    for s in &dry.skipped {
        println!(
            "  left out, line {}: {} ({})",
            s.line.map_or_else(String::new, |l| l.to_string()),
            shown(&s.why),
            s.reason
        );
    }
    Ok(())
}

/// Redraws one line a second (a line per change when not on a terminal) until the broadcast
/// ends.
async fn watch(config: &Config, id: i64) -> anyhow::Result<()> {
    let store = store::open(config).await?;
    let terminal = std::io::stdout().is_terminal();
    let mut last = String::new();
    loop {
        let b = store
            .broadcast(id)
            .await?
            .context("no broadcast has this id")?;
        let line = progress(&b);
        if line != last {
            match terminal {
                true => print!("\r\x1b[2K{line}"),
                false => println!("{line}"),
            }
            std::io::stdout().flush()?;
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
fn progress(b: &BroadcastView) -> String {
    const WIDTH: u64 = 30;
    let n = |state: &str| b.counts.get(state).copied().unwrap_or(0);
    let sent = n("accepted") + n("delivered") + n("read");
    let done = b.recipients - n("queued") - n("held") - n("sending");
    let filled = (done * WIDTH).checked_div(b.recipients).unwrap_or(WIDTH);
    let percent = (done * 100).checked_div(b.recipients).unwrap_or(100);
    let bar: String = (0..WIDTH)
        .map(|i| if i < filled { '#' } else { '.' })
        .collect();
    let state = match &b.paused_because {
        Some(why) => format!("paused: {}", shown(why)),
        None => b.state.to_string(),
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
