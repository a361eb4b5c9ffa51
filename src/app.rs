//! App: opens the store, binds the listener, starts the scheduler and (with an access token)
//! the sender, and runs them until told to stop. A node runs the HTTP ingress, the workers
//! (scheduler and sender), or both ([`Role`]).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::agent::budget::Limits;
use crate::agent::external::ExternalAgent;
use crate::agent::llm::{Llm, LlmContext, Provider, Retries, Sampling};
use crate::agent::voice::{Transcriber, VoiceNotes};
use crate::agent::{Agent, AgentSettings};
use crate::broadcast::Broadcaster;
use crate::broadcast::consent::{self, Consent};
use crate::broadcast::sender::Route;
use crate::clock::{SharedClock, SystemClock};
use crate::config::{Config, LlmBudget};
use crate::desk::{HelpDesk, Mirror};
use crate::http::serve::{ConnectionLimits, serve};
use crate::ingress::{self, Ingress, WorkerLinks};
use crate::metrics::Metrics;
use crate::router::{Router, RouterHandler};
use crate::sender::pacer::Pacer;
use crate::sender::{Sender, Typing};
use crate::store::{self, Store};
use crate::sweeper::Sweeper;
use crate::tools::Tools;
use crate::turn::{Acknowledger, TurnHandler};
use crate::whatsapp::graph::Graph;
use crate::worker::Scheduler;
use crate::worker::holder::Holder;

/// What a node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// HTTP ingress and the scheduler.
    All,
    /// HTTP ingress only.
    Api,
    /// The scheduler only.
    Worker,
}

pub struct App {
    http: Option<(TcpListener, axum::Router, ConnectionLimits)>,
    scheduler: Arc<Scheduler>,
    /// Delivers replies through the Graph API; none in sandbox mode.
    sender: Option<Arc<Sender>>,
    /// Sends broadcasts through the Graph API, sharing the sender's pacing; in sandbox mode it
    /// records them instead.
    broadcaster: Arc<Broadcaster>,
    /// Tells WhatsApp customers far back in a surge's queue to wait.
    holder: Arc<Holder>,
    sweeper: Arc<Sweeper>,
    /// Mirrors hand-offs into the help desk (`[handoff]`), when there is one.
    desk: Option<Arc<Mirror>>,
    runs_scheduler: bool,
    store: Arc<dyn Store>,
    shutdown: CancellationToken,
}

/// The turn pipeline: voice notes to text, then the router, then the agent (the sandbox
/// acknowledgement stands in while no LLM is configured).
fn default_handler(
    config: &Config,
    clock: SharedClock,
    store: &Arc<dyn Store>,
    graph: Option<&Graph>,
    router: Option<Arc<Router>>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Arc<dyn TurnHandler>> {
    // Header secrets are read from the environment once, here: a missing one stops start-up.
    let tools = Arc::new(Tools::new(
        &crate::config::bounded_strings(&config.tools, config.llm.max_argument_chars),
        &|var| std::env::var(var).ok(),
        config.tools_secret.clone(),
    )?);
    let agent: Arc<dyn TurnHandler> = match agent(
        config,
        clock.clone(),
        store,
        &tools,
        router.clone(),
        metrics,
    )? {
        Some(agent) => agent,
        None => Acknowledger::new(clock, config.engine.sandbox_reply_delay),
    };
    let handler = match router {
        Some(router) => RouterHandler::new(router, tools, agent, store.clone(), metrics.clone()),
        None => agent,
    };
    let transcribe_base = config
        .llm
        .transcribe_base_url
        .as_ref()
        .or(config.llm.base_url.as_ref());
    let hearing = match (graph, transcribe_base) {
        (Some(graph), Some(base)) => Some((
            graph.clone(),
            Transcriber {
                base_url: base.clone(),
                api_key: config
                    .llm
                    .transcribe_api_key
                    .clone()
                    .or_else(|| config.llm.api_key.clone()),
                model: config.llm.transcribe_model.clone(),
                max_bytes: config.llm.media_max_bytes as u64,
                timeout: config.llm.timeout,
                language: config.llm.transcribe_language.clone(),
                prompt: config.llm.transcribe_prompt.clone(),
            },
        )),
        _ => None,
    };
    Ok(VoiceNotes::new(handler, store.clone(), hearing)?)
}

/// The intent router, trained from the configured intents; `None` when it is turned off.
fn trained_router(config: &Config) -> anyhow::Result<Option<Arc<Router>>> {
    if !config.router.enabled {
        return Ok(None);
    }
    let source = config.router.intents_source()?;
    let started = std::time::Instant::now();
    let router = Router::shared(&source)?;
    tracing::info!(
        took_ms = started.elapsed().as_millis() as u64,
        intents = router.labels().len(),
        "router ready"
    );
    // The file loads, but these words of its patterns never match (`sabi check` lists them too).
    for dead in router.unreachable_words() {
        tracing::warn!("router: {dead}");
    }
    Ok(Some(router))
}

/// A provider's budget as configured.
fn limits(budget: LlmBudget) -> Limits {
    Limits {
        concurrent: budget.max_concurrent,
        requests_per_minute: budget.requests_per_minute,
        tokens_per_minute: budget.tokens_per_minute,
    }
}

/// The agent: an external one, or the built-in LLM agent, when either is configured.
fn agent(
    config: &Config,
    clock: SharedClock,
    store: &Arc<dyn Store>,
    tools: &Arc<Tools>,
    router: Option<Arc<Router>>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Option<Arc<dyn TurnHandler>>> {
    if let Some(external) = &config.external_agent {
        let agent = ExternalAgent::new(
            external.url.clone(),
            external.secret.clone(),
            external.timeout,
            store.clone(),
            router,
        )
        .context("building the external agent's client")?;
        return Ok(Some(agent));
    }
    let llm = &config.llm;
    let (Some(base_url), Some(model)) = (&llm.base_url, &llm.model) else {
        return Ok(None);
    };
    let primary = Provider {
        base_url: base_url.clone(),
        api_key: llm.api_key.clone(),
        model: model.clone(),
    };
    let fallback = llm.fallback.as_ref().map(|f| Provider {
        base_url: f.base_url.clone(),
        api_key: f.api_key.clone(),
        model: f.model.clone(),
    });
    let retries = Retries {
        attempts: llm.attempts,
        backoff: llm.backoff,
    };
    let sampling = Sampling {
        temperature: llm.temperature,
        top_p: llm.top_p,
        max_tokens: llm.max_tokens,
        seed: llm.seed,
        extra: serde_json::to_value(&llm.extra)
            .ok()
            .and_then(|v| v.as_object().cloned())
            .unwrap_or_default(),
    };
    let context = LlmContext {
        timeout: llm.timeout,
        retries,
        sampling,
        clock,
        metrics: metrics.clone(),
    };
    let fallback = fallback.zip(llm.fallback.as_ref().map(|f| limits(f.budget)));
    let client = Llm::new((primary, limits(llm.budget)), fallback, context)
        .context("building the LLM client")?;
    let settings = AgentSettings {
        system_prompt: llm.system_prompt.clone(),
        max_tool_rounds: llm.max_tool_rounds,
        history_tokens: llm.history_tokens,
        redact: llm.redact,
        turn_timeout: llm.turn_timeout,
        prompt_price: llm.prompt_price,
        completion_price: llm.completion_price,
        max_tool_calls: llm.max_tool_calls,
        max_tool_answer_bytes: llm.max_tool_answer_bytes,
        turn_prompt_tokens: llm.turn_prompt_tokens,
        allowed_link_hosts: llm.allowed_link_hosts.clone(),
    };
    Ok(Some(Agent::new(
        client,
        tools.clone(),
        store.clone(),
        router,
        settings,
        metrics.clone(),
    )))
}

impl App {
    /// Opens the configured store and, for the roles that serve HTTP, binds the configured
    /// address (port 0 picks a free one).
    ///
    /// # Errors
    /// When the store cannot be opened or the address cannot be bound.
    pub async fn build(config: &Config, role: Role) -> anyhow::Result<App> {
        App::build_with(config, role, Arc::new(SystemClock), None).await
    }

    /// [`App::build`] with a given clock and turn handler (the sandbox acknowledgement when none).
    ///
    /// # Errors
    /// As [`App::build`].
    pub async fn build_with(
        config: &Config,
        role: Role,
        clock: SharedClock,
        handler: Option<Arc<dyn TurnHandler>>,
    ) -> anyhow::Result<App> {
        let store = store::open(config).await.context("opening the store")?;
        App::build_on(config, role, clock, store, handler).await
    }

    /// [`App::build_with`] on a store already open (the configured one is not opened).
    ///
    /// # Errors
    /// As [`App::build`].
    pub async fn build_on(
        config: &Config,
        role: Role,
        clock: SharedClock,
        store: Arc<dyn Store>,
        handler: Option<Arc<dyn TurnHandler>>,
    ) -> anyhow::Result<App> {
        let metrics = Metrics::new();
        let graph = match &config.whatsapp.access_token {
            None => None,
            Some(token) => Some(
                Graph::new(
                    &config.whatsapp.graph_base(),
                    token.clone(),
                    config.whatsapp.send_timeout,
                )
                .context("building the Graph API client")?,
            ),
        };
        // Ingress uses the router too: to know an anonymous visitor's request for a person.
        let router = trained_router(config)?;
        let handler = match handler {
            Some(handler) => handler,
            None => default_handler(
                config,
                clock.clone(),
                &store,
                graph.as_ref(),
                router.clone(),
                &metrics,
            )?,
        };
        // The desk attaches customers' media, fetched with the sender's client.
        let media = graph.clone();
        let sender = graph.map(|graph| {
            Sender::new(
                store.clone(),
                clock.clone(),
                graph,
                config.sender_settings(),
                metrics.clone(),
            )
        });
        let replies = consent::Replies {
            stopped: config.broadcast.stop_reply.clone(),
            started: config.broadcast.start_reply.clone(),
            offer: config.broadcast.stop_offer.clone(),
        };
        let handler = Consent::new(handler, store.clone(), store.clone(), replies);
        // Every answered message is marked read, with the typing indicator or without.
        let handler = match &sender {
            Some(sender) => {
                let typing = config.whatsapp.typing_indicator;
                Typing::new(handler, sender.clone(), typing) as Arc<dyn TurnHandler>
            }
            None => handler,
        };
        // Broadcasts run in sandbox mode too, recorded instead of sent.
        let route = match &sender {
            Some(sender) => Route::Meta(sender.clone()),
            None => Route::Sandbox(Pacer::new(config.whatsapp.outbound_rate, clock.clone())),
        };
        let broadcaster = Broadcaster::new(
            store.clone(),
            clock.clone(),
            route,
            config.sender_settings(),
            config.broadcast_settings(),
            config.marketing_settings(),
            metrics.clone(),
        );
        let sweeper = Sweeper::new(
            store.clone(),
            clock.clone(),
            config.horizons(),
            config.retention.sweep_every,
            metrics.clone(),
        );
        // One client for the mirror and the webhook's notices back to the desk.
        let help_desk = HelpDesk::from_config(&config.handoff, clock.clone())
            .context("building the help desk's HTTP client")?;
        let desk = help_desk
            .as_ref()
            .map(|d| Mirror::new(store.clone(), d, media, clock.clone(), metrics.clone()));
        let holder = Holder::new(
            store.clone(),
            store.clone(),
            clock.clone(),
            config.hold_settings(),
            metrics.clone(),
        );
        // Written reply parts wake this node's sender (none in sandbox mode: nothing listens).
        let outbox = sender
            .as_ref()
            .map_or_else(|| Arc::new(Notify::new()), |s| s.wakeup());
        let scheduler = Scheduler::new(
            store.clone(),
            clock.clone(),
            handler,
            config.engine_settings(),
            metrics.clone(),
            outbox.clone(),
        );
        let http = match role {
            Role::Worker => None,
            Role::All | Role::Api => {
                let listener = TcpListener::bind(config.listen)
                    .await
                    .with_context(|| format!("binding {}", config.listen))?;
                let state = Ingress::new(
                    config,
                    store.clone(),
                    clock,
                    WorkerLinks {
                        wakeup: scheduler.wakeup(),
                        outbox,
                        chat: scheduler.chat_signals(),
                    },
                    metrics,
                    router,
                    help_desk,
                );
                let ingress = &config.ingress;
                let limits = ConnectionLimits {
                    header_timeout: ingress.header_timeout,
                    write_timeout: ingress.write_timeout,
                    max_age: ingress.max_connection_age,
                    max_requests: ingress.max_requests_per_connection,
                    max_connections: crate::http::serve::connections_within(
                        crate::http::serve::fd_limit(),
                        ingress.max_connections,
                    ),
                    per_address: ingress.max_connections_per_address,
                    trusted_proxies: ingress.trusted_proxies.clone(),
                    grace: config.engine.shutdown_grace,
                };
                Some((listener, ingress::router(state, &config.ingress), limits))
            }
        };
        if config.whatsapp.app_secret.is_none() && http.is_some() {
            // The sandbox secret is public: only a node on this machine alone may accept it.
            if role == Role::Api || !config.listen.ip().is_loopback() {
                anyhow::bail!(
                    "no WhatsApp app secret: a node that serves {} must have one, or anyone \
                     could sign webhooks with the public sandbox secret (set \
                     SABI_WHATSAPP_APP_SECRET)",
                    if role == Role::Api {
                        "as --role api"
                    } else {
                        "beyond this machine"
                    }
                );
            }
            tracing::warn!(
                "no WhatsApp app secret configured: sandbox mode accepts webhooks signed with the sandbox secret"
            );
        }
        Ok(App {
            http,
            scheduler,
            sender,
            broadcaster,
            holder,
            sweeper,
            desk,
            runs_scheduler: role != Role::Api,
            store,
            shutdown: CancellationToken::new(),
        })
    }

    /// The address the HTTP server is bound to, for the roles that serve HTTP.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.http
            .as_ref()
            .and_then(|(listener, _, _)| listener.local_addr().ok())
    }

    pub fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// The scheduler, for driving turns by hand (`tick`) when this node does not run it.
    pub fn scheduler(&self) -> Arc<Scheduler> {
        self.scheduler.clone()
    }

    /// The help desk's mirror, for mirroring by hand; none without a `[handoff]` desk.
    pub fn desk(&self) -> Option<Arc<Mirror>> {
        self.desk.clone()
    }

    /// The sweeper, for sweeping by hand.
    pub fn sweeper(&self) -> Arc<Sweeper> {
        self.sweeper.clone()
    }

    /// The holder, for looking at the queue by hand when this node does not run it.
    pub fn holder(&self) -> Arc<Holder> {
        self.holder.clone()
    }

    /// The sender, for driving sends by hand when this node does not run it.
    pub fn sender(&self) -> Option<Arc<Sender>> {
        self.sender.clone()
    }

    /// Cancelling this token stops the app gracefully.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Serves until the shutdown token is cancelled, then lets in-flight requests and running
    /// turns finish (turns within the grace period).
    ///
    /// # Errors
    /// When the HTTP server fails.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let shutdown = self.shutdown.clone();
        let worker = self
            .runs_scheduler
            .then(|| tokio::spawn(self.scheduler.clone().run(shutdown.clone())));
        let sender = self
            .sender
            .clone()
            .filter(|_| self.runs_scheduler)
            .map(|sender| tokio::spawn(sender.run(shutdown.clone())));
        let broadcaster = self
            .runs_scheduler
            .then(|| tokio::spawn(self.broadcaster.clone().run(shutdown.clone())));
        let holder = self
            .runs_scheduler
            .then(|| tokio::spawn(self.holder.clone().run(shutdown.clone())));
        let sweeper = self
            .runs_scheduler
            .then(|| tokio::spawn(self.sweeper.clone().run(shutdown.clone())));
        let desk = self
            .desk
            .clone()
            .filter(|_| self.runs_scheduler)
            .map(|desk| tokio::spawn(desk.run(shutdown.clone())));
        match self.http {
            Some((listener, router, limits)) => {
                let addr = listener.local_addr()?;
                tracing::info!(%addr, chat_page = %format!("http://{addr}/"), "sabi listening");
                serve(listener, router, limits, shutdown.clone())
                    .await
                    .context("serving HTTP")?;
            }
            None => shutdown.cancelled().await,
        }
        if let Some(worker) = worker {
            worker.await.context("the scheduler panicked")?;
        }
        if let Some(sender) = sender {
            sender.await.context("the sender panicked")?;
        }
        if let Some(broadcaster) = broadcaster {
            broadcaster.await.context("the broadcast loop panicked")?;
        }
        if let Some(holder) = holder {
            holder.await.context("the holding loop panicked")?;
        }
        if let Some(sweeper) = sweeper {
            sweeper.await.context("the sweeper panicked")?;
        }
        if let Some(desk) = desk {
            desk.await.context("the help desk's mirror panicked")?;
        }
        tracing::info!("sabi stopped");
        Ok(())
    }
}
