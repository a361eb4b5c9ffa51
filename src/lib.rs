//! # Sabi
//!
//! One program between customers (WhatsApp Cloud API webhooks, website chat) and an AI
//! assistant. It never loses a message it acknowledged and never answers one twice.
//!
//! # Layout
//!
//! ```text
//! Meta ──── POST /webhook/whatsapp ─► ingress::whatsapp (signature, payload)
//! Browser ── POST /chat ─────────────► ingress::webchat (validation, backpressure)
//!                                        │
//!                                        ▼
//!             store::Intake::ingest / WebChat::submit_chat (append, dedupe, schedule; durable) ─► 200 / 202
//!                                        │
//! worker::Scheduler ◄── store::Turns::claim (due batch, lease + fencing token)
//!    turn: broadcast::Consent (stop / start) ─► router::RouterHandler: local answer |
//!          hand-off to a person | the agent (the sandbox acknowledgement stands in for the
//!          agent until it is configured)
//!    └─► store::Turns::finish (reply to the outbox | retry with backoff | review)
//! worker::Holder ── every 5 s: store::Inspection::gauges, Turns::hold (under a surge, a
//!    WhatsApp customer whose turn is far off is told how long; the answer follows)
//! sender::Sender ◄── store::Sending::claim_sends (oldest unsettled part per recipient) ─► Graph API
//! broadcast::Broadcaster ◄── store::Broadcasts::claim_recipients (paced, quiet hours, the
//!    messaging limit) ─► Graph API templates
//! Meta status webhooks ─► store::Intake::ingest reconciles the outbox and broadcast recipients
//! Browser ── GET /chat/{id}, /chat/{id}/events ─► store::WebChat::chat_job (any node)
//! sweeper::Sweeper ── every retention.sweep_every: store::Retention::sweep (what is past its
//!    horizon, under a lease: one node at a time)
//! ```
//!
//! Modules, from the bottom up (`src/layers.txt` holds the layers; a test keeps every import
//! pointing down them, and no two files importing each other):
//!
//! - [`clock`], [`domain`], [`phone`]: the injected clock and the one type of an instant, the types
//!   every stage shares, and phone numbers as people write them.
//! - [`config`]: one typed configuration (`sabi.toml` + `SABI_*`), validated at start, holding
//!   every stage's settings; its commented example.
//! - [`store`]: the only place state lives (SQLite embedded by default, PostgreSQL or Redis for
//!   several nodes); [`store::rules`] is its rulebook, every lifecycle written once.
//! - [`whatsapp`]: Meta's API as Sabi speaks it: the Graph client, signatures, the wire format.
//! - [`export`]: what Sabi shows of what it holds: items, replies, a customer's whole record.
//! - [`billing`]: what Meta charges for the WhatsApp messages its statuses priced.
//! - [`turn`]: the turn-handler contract the router, the agent and the worker share.
//! - `runner`: the one loop every background stage runs in: the scheduler, the sender and the
//!   broadcaster claim jobs in it; the holder and the sweeper run their rounds in it.
//! - [`sender`]: the outbox's delivery: pacing, retries, the window.
//! - [`tools`]: the business's HTTP endpoints, declared in configuration.
//! - [`broadcast`]: template campaigns: audiences, consent, the paced sender, reports.
//! - [`plan`]: sizing for a broadcast's surge of replies (`sabi plan`).
//! - [`desk`]: hand-offs into a help desk the business runs (Chatwoot), and its replies back.
//! - [`worker`]: the scheduler: batches per conversation, one turn at a time, leases, retries.
//! - [`router`]: Pidgin-aware intent routing: patterns, a classifier, fallback to the agent.
//! - [`agent`]: the LLM agent with tools and stored history; voice notes to text.
//! - [`ingress`]: the HTTP edge (webhook, web chat, health, metrics, the admin API and review
//!   desk); nothing slow happens there. [`check`] reaches what the configuration names.
//! - [`app`]: wires the parts and runs them until stopped.
//! - [`cli`]: the `sabi` commands.

pub mod agent;
pub mod app;
pub mod billing;
pub mod broadcast;
pub mod check;
pub mod cli;
pub mod clock;
pub mod config;
pub mod desk;
pub mod domain;
pub mod export;
pub mod http;
pub mod ingress;
pub mod metrics;
pub mod phone;
pub mod plan;
pub mod router;
mod runner;
pub mod sender;
pub mod simulate;
pub mod store;
pub mod sweeper;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tools;
pub mod turn;
pub mod whatsapp;
pub mod worker;
