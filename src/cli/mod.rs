//! The `sabi` commands. Every command reads the same configuration (file and environment), so
//! `sabi inbox` inspects the store that `sabi serve` writes.

mod broadcast;
mod pipe;
mod plan;
mod simulate;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::{Parser, Subcommand};
use serde_json::{Value, json};

use crate::app::{App, Role};
use crate::billing;
use crate::clock::{At, Clock, SystemClock};
use crate::config::Config;
use crate::desk::chatwoot::Chatwoot;
use crate::desk::webhook::DeskWebhook;
use crate::domain::{Channel, ItemKind, ReviewReason};
use crate::export::{self, shown};
use crate::router::{self, Router};
use crate::store::{self, Delivery, InboxQuery, Resolution, ReviewEntry, ReviewQuery};
use crate::whatsapp::{sign, wire};

#[derive(Debug, Parser)]
#[command(
    name = "sabi",
    version,
    about = "A durable gateway between customers and an AI assistant"
)]
pub struct Cli {
    /// Configuration file (default: ./sabi.toml when it exists). SABI_* variables override it.
    #[arg(long, global = true, env = "SABI_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway: HTTP ingress and workers.
    Serve {
        /// What this node runs: all, api (HTTP ingress only) or worker (turns only).
        #[arg(long, value_enum, default_value = "all")]
        role: Role,
    },
    /// Broadcasts: template campaigns to an audience file (`sabi broadcast create --help`).
    Broadcast {
        #[command(subcommand)]
        action: broadcast::BroadcastAction,
    },
    /// Print stored inbound items (messages, statuses, errors, field events) in arrival order.
    Inbox {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        /// Only items of this kind: message, status, value_error, field_event.
        #[arg(long, value_parser = parse_kind)]
        kind: Option<ItemKind>,
        /// Only items of this channel: whatsapp, webchat.
        #[arg(long, value_parser = parse_channel)]
        channel: Option<Channel>,
        /// At most this many items.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Print reply parts in the outbox, with how their sending went.
    Outbox {
        #[arg(long)]
        json: bool,
    },
    /// The review queue: what waits for a person, and settling it (`sabi review` lists).
    Review {
        #[command(subcommand)]
        action: Option<ReviewAction>,
        /// One JSON object per line (for the list).
        #[arg(long)]
        json: bool,
    },
    /// Route messages with the local intent router: one text, JSON lines on stdin, or an evaluation.
    Route {
        /// The message to route (omit with --jsonl or --eval).
        text: Option<String>,
        /// Read JSON lines with a "text" field (or plain lines) on stdin; write one JSON object per line.
        #[arg(long, conflicts_with_all = ["text", "eval"])]
        jsonl: bool,
        /// Score the router on labelled JSON-lines files ({"text", "intent", "tags"}), together.
        #[arg(long, value_name = "FILE", num_args = 1.., conflicts_with = "text")]
        eval: Vec<PathBuf>,
        /// With --eval: K-fold cross-validation, each fold routed by a router that also learned
        /// from the other folds; 0 scores the router as configured.
        #[arg(long, default_value_t = 5)]
        folds: usize,
        /// Choose each intent's thresholds from cross-validated decisions on these labelled
        /// files, so that at most `router.max_wrong_rate` of local answers are wrong; prints
        /// them, and with --write writes them into that intents file.
        #[arg(long, value_name = "FILE", num_args = 1.., conflicts_with_all = ["text", "jsonl", "eval"])]
        calibrate: Vec<PathBuf>,
        /// Recalibrate from exported, labelled turns (`--export-unsure`, each line's "intent"
        /// set) plus the bundled messages: prints each file's scores before and after
        /// (cross-validated, leave-one-file-out, hold-out); with --write writes the result.
        #[arg(long, value_name = "FILE", num_args = 1.., conflicts_with_all = ["text", "jsonl", "eval", "calibrate"])]
        retrain: Vec<PathBuf>,
        /// With --calibrate or --retrain: the intents file to write the thresholds into (the
        /// configured one, or the built-in one's text, copied there).
        #[arg(long, value_name = "INTENTS")]
        write: Option<PathBuf>,
        /// Print the intents file in use (the built-in one unless configured), to copy and extend.
        #[arg(long, conflicts_with_all = ["text", "jsonl", "eval"])]
        print_intents: bool,
        /// Write, as JSON lines to label, the kept turns people labelled, those someone other
        /// than the router's guess answered, and those it was least sure of. Set each line's
        /// "intent", then pass the file to --calibrate or --eval.
        #[arg(long, conflicts_with_all = ["text", "jsonl", "eval", "calibrate", "print_intents"])]
        export_unsure: bool,
        /// With --export-unsure: only turns that ended within this long (like 7d).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "7d", requires = "export_unsure")]
        since: Duration,
        /// With --export-unsure: at most this many lines.
        #[arg(long, default_value_t = 200, requires = "export_unsure")]
        limit: usize,
    },
    /// Who answered the turns (router, agent, people), the model's tokens and cost, and the
    /// spend the router avoided.
    Stats {
        /// Only turns that ended within this long (like 24h or 7d); all of them by default.
        #[arg(long, value_parser = humantime::parse_duration)]
        since: Option<Duration>,
        #[arg(long)]
        json: bool,
    },
    /// When a broadcast's sends go under Meta's messaging limit, what customers see of the
    /// replies' surge, what to run, what it costs and what the model provider must allow.
    Plan(Box<plan::PlanArgs>),
    /// Plays a broadcast's surge of replies against the real engine on virtual time (a
    /// temporary store, fakes of the Graph API and the model): the table of `sabi plan`,
    /// measured.
    Simulate(Box<simulate::SimulateArgs>),
    /// Everything Sabi holds about one customer (their right of access): what they sent and
    /// when, the replies to them and how they went, hand-offs to people, broadcasts, their
    /// broadcast choice. Readable text, or one JSON document with --json.
    Export {
        #[command(flatten)]
        who: CustomerArgs,
        #[arg(long)]
        json: bool,
    },
    /// Erases one customer (their right to erasure): every message, reply, hand-off, web-chat
    /// job, broadcast send and quarantined part that names them. Keeps only hashes: of their
    /// messages' ids (so Meta's retries are not taken in again) and, on WhatsApp, a
    /// do-not-contact marker (so no broadcast reaches them). Prints what it removed; running
    /// it again removes nothing more.
    Forget {
        #[command(flatten)]
        who: CustomerArgs,
        #[arg(long)]
        json: bool,
    },
    /// Print the raw deliveries (or parts) that Sabi could not understand.
    Quarantine {
        #[arg(long)]
        json: bool,
    },
    /// Print the effective configuration (secrets left out), or with --example a complete,
    /// commented sabi.toml with every default.
    Config {
        #[arg(long)]
        example: bool,
    },
    /// Check the configuration, and reach the store, the Graph API and the LLM with it.
    Check,
    /// Post a signed WhatsApp text-message webhook to a running Sabi, as Meta would.
    Send {
        /// The message text.
        text: String,
        /// The customer's phone number.
        #[arg(long, default_value = "2348000000001")]
        from: String,
        /// The customer's profile name.
        #[arg(long, default_value = "Sandbox Customer")]
        name: String,
        /// The business phone-number id the customer writes to.
        #[arg(long, default_value = "100000000000001")]
        business: String,
        /// The message id (default: a fresh one). Send the same id twice to see deduplication.
        #[arg(long)]
        id: Option<String>,
        /// Where to post (default: the configured listen address).
        #[arg(long)]
        url: Option<String>,
    },
}

/// The customer `sabi export` and `sabi forget` name.
#[derive(Debug, clap::Args)]
struct CustomerArgs {
    /// A WhatsApp number as people write it: with its country code (+234 803 123 4567,
    /// 2348031234567), or the local way (0803 123 4567) with --country; or a web-chat session id.
    customer: String,
    /// The channel the customer is on: whatsapp or webchat.
    #[arg(long, value_parser = parse_channel, default_value = "whatsapp")]
    channel: Channel,
    /// The country calling code of a number written the local way, like 234
    /// (whatsapp.default_country when not given).
    #[arg(long, value_parser = crate::phone::country_code)]
    country: Option<String>,
}

impl CustomerArgs {
    fn subject(&self, config: &Config) -> anyhow::Result<store::Subject> {
        let country = self
            .country
            .as_deref()
            .or(config.whatsapp.default_country.as_deref());
        export::subject(self.channel, &self.customer, country, "--country")
            .map_err(anyhow::Error::msg)
    }
}

fn review_reason(name: &str) -> Result<ReviewReason, String> {
    ReviewReason::parse(name).ok_or_else(|| format!("no review reason is called {name:?}"))
}

#[derive(Debug, clap::Subcommand)]
pub enum ReviewAction {
    /// Open items, oldest first.
    Ls {
        /// Only this reason: too_old, out_of_retries, handoff_asked, unknown_outcome,
        /// window_closed, send_failed, model_output, person_answering.
        #[arg(long, value_parser = review_reason)]
        reason: Option<ReviewReason>,
        /// Only this customer.
        #[arg(long)]
        customer: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// One item with its conversation, as JSON.
    Show { id: i64 },
    /// Reply to the customer as a person, through the outbox and all its rules.
    Reply {
        id: i64,
        text: String,
        /// Keep a WhatsApp reply in sandbox mode (never sent). Without it, a configuration with
        /// no access token is refused, since the reply could not go out.
        #[arg(long)]
        sandbox: bool,
    },
    /// Back to the agent (a failed or unknown send: sent again).
    Requeue { id: i64 },
    /// Nothing more to do.
    Close { id: i64 },
}

fn parse_kind(s: &str) -> Result<ItemKind, String> {
    ItemKind::parse(s)
        .ok_or_else(|| format!("unknown kind {s:?}: message, status, value_error or field_event"))
}

fn parse_channel(s: &str) -> Result<Channel, String> {
    Channel::parse(s).ok_or_else(|| format!("unknown channel {s:?}: whatsapp or webchat"))
}

/// Runs a command and turns its outcome into the process's exit code.
pub fn main(cli: Cli) -> ExitCode {
    pipe::end_quietly_when_closed();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if pipe::closed(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sabi: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // The example needs no configuration, so a broken one cannot stop it.
    if let Command::Config { example: true } = cli.command {
        print!("{}", crate::config::example()?);
        return Ok(());
    }
    let config = Config::load(cli.config.as_deref(), std::env::vars())?;
    // A simulation's node would log every simulated turn.
    let level = match cli.command {
        Command::Simulate(_) => "warn",
        _ => "info",
    };
    crate::telemetry::init(config.logging.format, level);
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        match cli.command {
            Command::Serve { role } => serve(&config, role).await,
            Command::Config { .. } => {
                print!("{}", toml::to_string(&config)?);
                Ok(())
            }
            Command::Check => check(&config).await,
            Command::Broadcast { action } => broadcast::run(&config, action).await,
            Command::Outbox { json } => outbox(&config, json).await,
            Command::Review { action, json } => {
                let action = action.unwrap_or(ReviewAction::Ls {
                    reason: None,
                    customer: None,
                    json,
                });
                review(&config, action).await
            }
            Command::Inbox {
                json,
                kind,
                channel,
                limit,
            } => {
                inbox(
                    &config,
                    json,
                    InboxQuery {
                        kind,
                        channel,
                        after: None,
                        limit,
                    },
                )
                .await
            }
            Command::Quarantine { json } => quarantine(&config, json).await,
            Command::Export { who, json } => {
                export_customer(&config, who.subject(&config)?, json).await
            }
            Command::Forget { who, json } => forget(&config, who.subject(&config)?, json).await,
            Command::Stats { since, json } => stats(&config, since, json).await,
            Command::Plan(args) => plan::run(&config, *args).await,
            Command::Simulate(args) => simulate::run(&config, *args).await,
            Command::Route {
                text,
                jsonl,
                eval,
                folds,
                calibrate,
                retrain,
                write,
                print_intents,
                export_unsure,
                since,
                limit,
            } => {
                if export_unsure {
                    return export_unsure_turns(&config, since, limit).await;
                }
                if print_intents {
                    print!("{}", config.router.intents_source()?);
                    return Ok(());
                }
                if !calibrate.is_empty() {
                    return calibrate_router(&config, &calibrate, folds, write.as_deref());
                }
                if !retrain.is_empty() {
                    return retrain_router(&config, &retrain, folds, write.as_deref());
                }
                if write.is_some() {
                    anyhow::bail!("--write goes with --calibrate or --retrain");
                }
                route(&config, text, jsonl, eval, folds)
            }
            Command::Send {
                text,
                from,
                name,
                business,
                id,
                url,
            } => {
                send(
                    &config,
                    SendArgs {
                        text,
                        from,
                        name,
                        business,
                        id,
                        url,
                    },
                )
                .await
            }
        }
    })
}

async fn serve(config: &Config, role: Role) -> anyhow::Result<()> {
    // Listening before anything slow (training the router), so a SIGTERM during start-up
    // also ends in a clean stop.
    let stop = shutdown_signal()?;
    // Every connection is an open file: the soft limit (often 1,024) is far too low.
    let fds = crate::http::serve::raise_fd_limit();
    tracing::debug!(open_files = fds, "open-file limit");
    let app = App::build(config, role).await?;
    if role != Role::Worker && config.admin.token.is_none() {
        tracing::info!(
            "the admin API (/admin/) and the review desk (/desk) are off: set admin.token \
             (SABI_ADMIN_TOKEN), at least 16 characters, to turn them on"
        );
    }
    let shutdown = app.shutdown_token();
    tokio::spawn(async move {
        stop.await;
        tracing::info!("shutdown signal received");
        shutdown.cancel();
    });
    app.run_until_stopped().await
}

/// Resolves on SIGTERM or Ctrl-C.
fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        Ok(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

async fn inbox(config: &Config, as_json: bool, query: InboxQuery) -> anyhow::Result<()> {
    let store = store::open(config).await?;
    let items = store.inbox(query).await?;
    let mut out = pipe::stdout();
    for item in &items {
        if as_json {
            writeln!(out, "{}", export::item_json(item))?;
        } else {
            let i = &item.item;
            writeln!(
                out,
                "{:>6}  {:<11} {:<8} {:<16} {:<18} {:<16} {}",
                item.seq,
                i.kind.as_str(),
                item.state,
                i.item_type.as_deref().unwrap_or("-"),
                shown(i.business.as_deref().unwrap_or("-")),
                shown(i.customer.as_deref().unwrap_or("-")),
                shown(i.text.as_deref().unwrap_or(""))
            )?;
        }
    }
    Ok(())
}

async fn outbox(config: &Config, as_json: bool) -> anyhow::Result<()> {
    let store = store::open(config).await?;
    let mut out = pipe::stdout();
    for entry in store.outbox(None).await? {
        let c = &entry.conversation;
        if as_json {
            let line = export::reply_json(&entry);
            writeln!(out, "{line}")?;
        } else {
            writeln!(
                out,
                "{:>6}  {:<13} {:<9} {:<18} {:<16} batch {} part {}  {}",
                entry.id,
                entry.state,
                entry.delivery.map_or("-", Delivery::as_str),
                shown(&c.business),
                shown(&c.customer),
                entry.batch_id,
                entry.part,
                shown(&entry.text)
            )?;
        }
    }
    Ok(())
}

async fn export_customer(
    config: &Config,
    who: store::Subject,
    as_json: bool,
) -> anyhow::Result<()> {
    let store = store::open(config).await?;
    let ids = store.linked_ids(&who).await?;
    let record = store::export_linked(store.as_ref(), &who).await?;
    if as_json {
        let mut document = export::record_json(&who, &record);
        document["ids"] = json!(ids);
        println!("{}", serde_json::to_string_pretty(&document)?);
    } else {
        print!("{}", export::record_text(&who, &record));
        if ids.len() > 1 {
            println!("Meta names them: {}", ids.join(", "));
        }
    }
    Ok(())
}

/// How long `sabi forget` waits for a turn or a send under way for the customer to end.
const FORGET_PATIENCE: Duration = Duration::from_secs(60);

async fn forget(config: &Config, who: store::Subject, as_json: bool) -> anyhow::Result<()> {
    let store = store::open(config).await?;
    let started = Instant::now();
    let erased = loop {
        match store::forget_linked(store.as_ref(), &who, SystemClock.now()).await {
            Err(store::Error::Busy(why)) if started.elapsed() < FORGET_PATIENCE => {
                eprintln!("waiting: {why}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            outcome => break outcome?,
        }
    };
    if as_json {
        println!("{}", json!({"customer": who.customer, "erased": erased}));
    } else if erased.total() == 0 {
        println!("Sabi held nothing about {}.", who.customer);
    } else {
        let counts = serde_json::to_value(erased)?;
        let removed: Vec<String> = counts
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, n)| n.as_u64() != Some(0))
            .map(|(kind, n)| format!("{n} {}", kind.replace('_', " ")))
            .collect();
        println!("Forgot {}: {}.", who.customer, removed.join(", "));
    }
    Ok(())
}

async fn check(config: &Config) -> anyhow::Result<()> {
    let mut findings = crate::check::run(config).await;
    // The router is above the check's layer: the command adds it (see src/layers.txt).
    findings.insert(2, check_router(config));
    if let Some(c) = &config.handoff.chatwoot {
        findings.push(check_chatwoot(c).await);
    }
    if let Some(w) = &config.handoff.webhook {
        findings.push(check_desk_webhook(w).await);
    }
    for f in &findings {
        println!(
            "{:<14} {}  {}",
            f.what,
            if f.ok { "ok  " } else { "FAIL" },
            f.says
        );
    }
    let failed = findings.iter().filter(|f| !f.ok).count();
    anyhow::ensure!(failed == 0, "{failed} check(s) failed");
    Ok(())
}

/// The intents file loads, and every word its patterns spell can match (a word the lexicon
/// rewrites first never does: the file loads, but the pattern is dead).
fn check_router(config: &Config) -> crate::check::Finding {
    let finding = |ok, says: String| crate::check::Finding {
        what: "router",
        ok,
        says,
    };
    if !config.router.enabled {
        return finding(true, "off: the agent answers every message".into());
    }
    let loaded = config
        .router
        .intents_source()
        .map_err(|e| e.to_string())
        .and_then(|source| {
            let router = Router::trained(&source).map_err(|e| e.to_string())?;
            Ok((router.labels().len(), router.unreachable_words().to_vec()))
        });
    match loaded {
        Err(e) => finding(false, format!("the intents file: {e}")),
        Ok((intents, dead)) if dead.is_empty() => {
            finding(true, format!("{intents} intents loaded"))
        }
        Ok((_, dead)) => finding(
            false,
            format!(
                "{} pattern word(s) can never match:\n  {}",
                dead.len(),
                dead.join("\n  ")
            ),
        ),
    }
}

/// The help desk's token and inbox, as Chatwoot answers for them.
async fn check_chatwoot(c: &crate::config::ChatwootConfig) -> crate::check::Finding {
    let inbox = match Chatwoot::new(c) {
        Ok(chatwoot) => chatwoot.inbox().await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let (ok, says) = match inbox {
        Ok(name) => (
            true,
            format!("inbox {} ({name}) of account {}", c.inbox_id, c.account_id),
        ),
        Err(e) => (
            false,
            format!("{e} (check handoff.chatwoot's base_url, api_token, account_id and inbox_id)"),
        ),
    };
    crate::check::Finding {
        what: "chatwoot",
        ok,
        says,
    }
}

/// The desk on `[handoff.webhook]` takes a signed `ping` event.
async fn check_desk_webhook(w: &crate::config::DeskWebhookConfig) -> crate::check::Finding {
    let clock: crate::clock::SharedClock = std::sync::Arc::new(crate::clock::SystemClock);
    let pinged = match DeskWebhook::new(w, clock) {
        Ok(desk) => desk
            .post(&serde_json::json!({"event": "ping", "id": "ping"}))
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let (ok, says) = match pinged {
        Ok(()) => (true, format!("{} took a signed ping", w.url)),
        Err(e) => (
            false,
            format!("{e} (check handoff.webhook's url and secret)"),
        ),
    };
    crate::check::Finding {
        what: "desk webhook",
        ok,
        says,
    }
}

async fn stats(config: &Config, since: Option<Duration>, as_json: bool) -> anyhow::Result<()> {
    let store = store::open(config).await?;
    let since = since.map_or(At::default(), |d| SystemClock.now() - d);
    let s = store.turn_stats(since).await?;
    let whatsapp = billing::bill(&store.price_counts(since).await?, &config.message_prices()?);
    let turns = s.local + s.agent + s.people;
    let share = |n: u64| {
        if turns == 0 {
            0.0
        } else {
            100.0 * n as f64 / turns as f64
        }
    };
    // What the locally answered turns would have cost at the agent's average turn.
    let average = if s.agent == 0 {
        0.0
    } else {
        s.cost / s.agent as f64
    };
    let avoided = average * s.local as f64;
    if as_json {
        let line = json!({
            "turns": turns,
            "local": s.local,
            "agent": s.agent,
            "people": s.people,
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens,
            "cost": s.cost,
            "cost_avoided": avoided,
            "whatsapp": whatsapp,
        });
        println!("{line}");
    } else {
        println!("turns        {turns}");
        println!("local        {} ({:.1} %)", s.local, share(s.local));
        println!("agent        {} ({:.1} %)", s.agent, share(s.agent));
        println!("people       {} ({:.1} %)", s.people, share(s.people));
        println!(
            "tokens       {} prompt, {} completion",
            s.prompt_tokens, s.completion_tokens
        );
        println!("cost         {:.4}", s.cost);
        println!("avoided      {avoided:.4} (local turns at the agent's average of {average:.4})");
        println!("whatsapp     {}", whatsapp.summary());
    }
    Ok(())
}

async fn review(config: &Config, action: ReviewAction) -> anyhow::Result<()> {
    let store = store::open(config).await?;
    let now = crate::clock::SystemClock.now();
    let resolution = match action {
        ReviewAction::Ls {
            reason,
            customer,
            json,
        } => {
            let query = ReviewQuery {
                reason,
                customer,
                limit: None,
            };
            return list_review(store.review_queue(query).await?, json);
        }
        ReviewAction::Show { id } => {
            let item = store
                .review_item(id)
                .await?
                .with_context(|| format!("no review item {id}"))?;
            let conversations = store.conversations(&item.conversation.customer, 50).await?;
            let conversation = conversations
                .iter()
                .find(|c| c.conversation == item.conversation)
                .map(crate::ingress::conversation_json);
            let shown =
                json!({"item": crate::ingress::review_json(&item), "conversation": conversation});
            println!("{}", serde_json::to_string_pretty(&shown)?);
            return Ok(());
        }
        ReviewAction::Reply { id, text, sandbox } => {
            anyhow::ensure!(!text.trim().is_empty(), "the reply is empty");
            let item = store
                .review_item(id)
                .await?
                .with_context(|| format!("no review item {id}"))?;
            // The service may hold its token in an environment this shell does not have: a
            // reply settled here would then be kept, never sent, and the item closed.
            let whatsapp = item.conversation.channel == Channel::Whatsapp;
            anyhow::ensure!(
                !(whatsapp && config.whatsapp.sandbox() && !sandbox),
                "this configuration has no WhatsApp access token, so the reply would be kept in \
                 sandbox mode and never sent: run the command with the service's configuration, \
                 reply through the admin API, or pass --sandbox to keep it so"
            );
            (
                id,
                Resolution::Reply {
                    text: text.trim().to_owned(),
                    sandbox: config.whatsapp.sandbox(),
                    hold: config.engine.human_hold,
                    desk: None,
                },
            )
        }
        ReviewAction::Requeue { id } => (id, Resolution::Requeue),
        ReviewAction::Close { id } => (id, Resolution::Close),
    };
    let (id, resolution) = resolution;
    match store.resolve_review(id, now, resolution).await {
        Err(store::Error::NotFound) => anyhow::bail!("no open review item {id}"),
        outcome => outcome?,
    }
    println!("review item {id} settled; a running Sabi picks it up within its poll interval");
    Ok(())
}

fn list_review(items: Vec<ReviewEntry>, as_json: bool) -> anyhow::Result<()> {
    let mut out = pipe::stdout();
    for item in items {
        if as_json {
            writeln!(out, "{}", crate::ingress::review_json(&item))?;
        } else {
            let c = &item.conversation;
            writeln!(
                out,
                "{:>6}  {:<15} {:<18} {:<16} {} message(s)  {}",
                item.id,
                item.reason,
                c.business,
                c.customer,
                item.messages.len(),
                item.error.as_deref().unwrap_or("")
            )?;
        }
    }
    Ok(())
}

async fn quarantine(config: &Config, as_json: bool) -> anyhow::Result<()> {
    let store = store::open(config).await?;
    let mut out = pipe::stdout();
    for q in store.quarantine(None).await? {
        if as_json {
            let line = json!({
                "id": q.id,
                "channel": q.quarantined.channel.as_str(),
                "received_at": export::rfc3339(q.received_at),
                "reason": q.quarantined.reason,
                "raw": q.quarantined.raw,
            });
            writeln!(out, "{line}")?;
        } else {
            writeln!(
                out,
                "{:>6}  {}  {}",
                q.id,
                export::rfc3339(q.received_at),
                shown(&q.quarantined.reason)
            )?;
        }
    }
    Ok(())
}

/// Each file's name without its folder, for the per-file tables.
fn file_names(files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .map(|f| {
            f.file_name()
                .map_or_else(|| f.display().to_string(), |n| n.to_string_lossy().into())
        })
        .collect()
}

/// A file named `*-sealed.jsonl` holds messages no rule may be written from: it is scored,
/// and none of its messages is ever printed.
fn sealed(file: &Path, mut report: router::eval::Report) -> router::eval::Report {
    let name = file.file_name().map(|n| n.to_string_lossy());
    if name.is_some_and(|n| n.ends_with("-sealed.jsonl")) {
        report.seal();
    }
    report
}

fn route(
    config: &Config,
    text: Option<String>,
    jsonl: bool,
    eval: Vec<PathBuf>,
    folds: usize,
) -> anyhow::Result<()> {
    let source = config.router.intents_source()?;
    if !eval.is_empty() {
        let sets = eval
            .iter()
            .map(|file| read_samples(file))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let (reports, how) = if folds == 0 {
            let router = Router::trained(&source)?;
            let reports: Vec<router::eval::Report> = sets
                .iter()
                .zip(&eval)
                .map(|(set, file)| sealed(file, router::eval::evaluate(&router, set)))
                .collect();
            (reports, "as configured".to_owned())
        } else {
            // The detail is leave-one-file-out's when there are several files (the figure a
            // business should expect on its own customers' phrasing), cross-validated's for one.
            let scores: Vec<router::eval::FileScores> =
                router::eval::generalisation(&source, &sets, folds)?
                    .into_iter()
                    .zip(&eval)
                    .map(|(s, file)| router::eval::FileScores {
                        cross_validated: sealed(file, s.cross_validated),
                        leave_one_file_out: sealed(file, s.leave_one_file_out),
                        held_out: sealed(file, s.held_out),
                    })
                    .collect();
            let names = file_names(&eval);
            for (file, s) in eval.iter().zip(&scores) {
                let (how, report) = match sets.len() {
                    1 => (format!("{folds}-fold cross-validation"), &s.cross_validated),
                    _ => (
                        "leave-one-file-out: learned from the other files only".to_owned(),
                        &s.leave_one_file_out,
                    ),
                };
                println!("{} ({how})\n\n{report}", file.display());
            }
            let table: Vec<(String, &router::eval::FileScores)> =
                names.into_iter().zip(&scores).collect();
            println!(
                "per file ({folds}-fold cross-validated over the files together; leave-one-file-out; \
                 the fixed hold-out, routed by a router that learned from every file's other messages)\n"
            );
            print!("{}", router::eval::generalisation_table(&table));
            return Ok(());
        };
        for (file, report) in eval.iter().zip(&reports) {
            println!("{} ({how})\n\n{report}", file.display());
        }
        if reports.len() > 1 {
            let table: Vec<(String, &router::eval::Report)> =
                file_names(&eval).into_iter().zip(&reports).collect();
            println!("per file ({how})\n");
            print!("{}", router::eval::summary_table(&table));
        }
        return Ok(());
    }
    let started = Instant::now();
    let router = Router::trained(&source)?;
    let trained = started.elapsed();
    let mut out = pipe::stdout();
    if jsonl {
        for line in std::io::stdin().lines() {
            let line = line.context("reading stdin")?;
            if line.trim().is_empty() {
                continue;
            }
            let text = match serde_json::from_str::<Value>(&line) {
                Ok(Value::Object(o)) => o
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                _ => line,
            };
            writeln!(out, "{}", serde_json::to_string(&router.route(&text))?)?;
        }
        return Ok(());
    }
    let text =
        text.context("give a message to route, or --jsonl, --eval FILE or --print-intents")?;
    let started = Instant::now();
    let routing = router.route(&text);
    let took = started.elapsed();
    writeln!(out, "intent      {}", routing.intent)?;
    writeln!(out, "confidence  {:.3}", routing.confidence)?;
    writeln!(out, "tier        {:?}", routing.tier)?;
    match routing.fallback {
        None => writeln!(out, "local       yes")?,
        Some(why) => writeln!(out, "local       no: the agent answers ({why:?})")?,
    }
    if let Some(secondary) = &routing.secondary {
        writeln!(out, "secondary   {secondary}")?;
    }
    writeln!(
        out,
        "entities    {}",
        serde_json::to_string(&routing.entities)?
    )?;
    writeln!(out, "normalised  {}", routing.normalised)?;
    writeln!(
        out,
        "took        {took:?} (training at start-up: {trained:?})"
    )?;
    Ok(())
}

/// `sabi route --export-unsure`: the kept turns worth a person's label, as JSON lines.
async fn export_unsure_turns(config: &Config, since: Duration, limit: usize) -> anyhow::Result<()> {
    let router = Router::trained(&config.router.intents_source()?)?;
    let store = store::open(config).await?;
    // Read further than the limit: repeated texts are listed once.
    let read = limit.saturating_mul(4).max(1_000);
    let turns = store.routed_turns(SystemClock.now() - since, read).await?;
    let mut out = pipe::stdout();
    for line in router::learning::unsure(&router, turns, limit) {
        writeln!(out, "{}", serde_json::to_string(&line)?)?;
    }
    Ok(())
}

/// `sabi route --calibrate`: thresholds from cross-validation, printed and optionally written.
fn calibrate_router(
    config: &Config,
    files: &[PathBuf],
    folds: usize,
    write: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let source = config.router.intents_source()?;
    let mut samples = Vec::new();
    for file in files {
        samples.extend(read_samples(file)?);
    }
    let max_wrong = config.router.max_wrong_rate;
    let thresholds = router::eval::calibrate(&source, &samples, folds.max(2), max_wrong)?;
    println!(
        "thresholds for at most {:.1} % wrong local answers ({}-fold cross-validation, {} messages)\n",
        max_wrong * 100.0,
        folds.max(2),
        samples.len()
    );
    println!(
        "{:<20} {:>8} {:>10} {:>7} {:>6}",
        "intent", "confirm", "threshold", "local", "wrong"
    );
    for t in &thresholds {
        println!(
            "{:<20} {:>8.2} {:>10.2} {:>7} {:>6}",
            t.intent, t.confirm, t.threshold, t.local, t.wrong
        );
    }
    if let Some(path) = write {
        let calibrated = router::eval::with_thresholds(&source, &thresholds)?;
        std::fs::write(path, calibrated).with_context(|| format!("writing {}", path.display()))?;
        println!("\nwritten into {}", shown(&path.display().to_string()));
    }
    Ok(())
}

/// `sabi route --retrain`: thresholds recalibrated on the bundled messages and the labelled
/// turns, each file's scores before and after, and only then, with `--write`, the file.
fn retrain_router(
    config: &Config,
    files: &[PathBuf],
    folds: usize,
    write: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let source = config.router.intents_source()?;
    let mut names = Vec::new();
    let mut sets = Vec::new();
    if router::IntentsFile::parse(&source)?.bundled_examples {
        names.push("bundled".to_owned());
        sets.push(Router::bundled_samples());
    }
    for file in files {
        names.push(file.display().to_string());
        sets.push(read_samples(file)?);
    }
    let folds = folds.max(2);
    let max_wrong = config.router.max_wrong_rate;
    let retrained = router::eval::retrain(&source, &sets, folds, max_wrong)?;
    let table = |scores: &[router::eval::FileScores]| {
        let rows: Vec<(String, &router::eval::FileScores)> =
            names.iter().cloned().zip(scores).collect();
        router::eval::generalisation_table(&rows)
    };
    println!(
        "before: the thresholds in use ({folds}-fold cross-validated; leave-one-file-out; hold-out)\n\n{}",
        table(&retrained.before)
    );
    println!(
        "after: recalibrated for at most {:.1} % wrong local answers on every file's messages outside the hold-out\n\n{}",
        max_wrong * 100.0,
        table(&retrained.after)
    );
    println!(
        "{:<20} {:>8} {:>10} {:>7} {:>6}",
        "intent", "confirm", "threshold", "local", "wrong"
    );
    for t in &retrained.thresholds {
        println!(
            "{:<20} {:>8.2} {:>10.2} {:>7} {:>6}",
            t.intent, t.confirm, t.threshold, t.local, t.wrong
        );
    }
    match write {
        Some(path) => {
            std::fs::write(path, &retrained.source)
                .with_context(|| format!("writing {}", path.display()))?;
            println!("\nwritten into {}", shown(&path.display().to_string()));
        }
        None => println!("\nnothing written: add --write INTENTS to keep the recalibrated file"),
    }
    Ok(())
}

/// The labelled lines of a file; lines whose `intent` is still `null` (an export not yet fully
/// labelled) are skipped, and counted on stderr.
fn read_samples(file: &std::path::Path) -> anyhow::Result<Vec<router::eval::Sample>> {
    #[derive(serde::Deserialize)]
    struct Line {
        #[serde(default)]
        id: String,
        text: String,
        intent: Option<String>,
        #[serde(default)]
        tags: Vec<String>,
    }
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut samples = Vec::new();
    let mut unlabelled = 0;
    for (i, l) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let line: Line = serde_json::from_str(l)
            .with_context(|| format!("{} line {}", file.display(), i + 1))?;
        match line.intent {
            Some(intent) => samples.push(router::eval::Sample {
                id: line.id,
                text: line.text,
                intent,
                tags: line.tags,
            }),
            None => unlabelled += 1,
        }
    }
    if unlabelled > 0 {
        eprintln!(
            "{}: {unlabelled} lines without an intent skipped",
            file.display()
        );
    }
    Ok(samples)
}

struct SendArgs {
    text: String,
    from: String,
    name: String,
    business: String,
    id: Option<String>,
    url: Option<String>,
}

async fn send(config: &Config, args: SendArgs) -> anyhow::Result<()> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let id = args
        .id
        .unwrap_or_else(|| format!("wamid.SABI{:x}{:x}", now.as_nanos(), std::process::id()));
    let body = wire::encode(&wire::text_webhook(
        &args.business,
        &args.from,
        &args.name,
        &id,
        now.as_secs(),
        &args.text,
    ));
    let secret = config
        .whatsapp
        .app_secrets()
        .into_iter()
        .next()
        .context("no app secret configured")?;
    let url = args.url.unwrap_or_else(|| {
        let mut addr = config.listen;
        if addr.ip().is_unspecified() {
            addr.set_ip([127, 0, 0, 1].into());
        }
        format!("http://{addr}/webhook/whatsapp")
    });
    let response = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/json")
        .header("x-hub-signature-256", sign(&secret, body.as_bytes()))
        .body(body)
        .send()
        .await
        .with_context(|| format!("posting to {url}"))?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    println!("{} {id} {text}", status.as_u16());
    anyhow::ensure!(status.is_success(), "{url} answered {status}");
    Ok(())
}
