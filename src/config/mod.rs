//! Config: one typed configuration for every `sabi` command.
//!
//! Layers, each over the one before: built-in defaults, then an optional `sabi.toml`, then the
//! `SABI_*` environment variables of DESIGN.md. Everything is parsed and validated once, at
//! start; a bad value stops start-up with a message naming the setting (and its variable).
//! Business code only ever sees typed values: durations, addresses, secrets.

mod engine;
mod example;
mod sender;
mod tools;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

pub use self::engine::{EnginePolicy, EngineSettings, HoldSettings, queue_slots, web_chat_slots};
pub use self::sender::{
    BroadcastSettings, MarketingSettings, MessagingLimit, SenderSettings, Template,
};
pub use self::tools::{ToolConfig, bounded_strings};
use crate::domain::{BatchPolicy, Horizons};

/// The comment above the `packs` line `router.packs` puts at the head of the intents file.
const PACKS_HEADER: &str = "# router.packs\n";

/// The router's built-in intents file: what Sabi answers with no `router.intents_file`.
pub const DEFAULT_INTENTS: &str = include_str!("default_intents.toml");

/// The environment variables and the setting each one sets.
pub const ENV: &[(&str, &str)] = &[
    ("SABI_LISTEN", "listen"),
    ("SABI_STORE", "store"),
    ("SABI_WHATSAPP_APP_SECRET", "whatsapp.app_secret"),
    ("SABI_WHATSAPP_VERIFY_TOKEN", "whatsapp.verify_token"),
    ("SABI_WHATSAPP_ACCESS_TOKEN", "whatsapp.access_token"),
    ("SABI_WHATSAPP_API_BASE", "whatsapp.api_base"),
    ("SABI_GRAPH_VERSION", "whatsapp.graph_version"),
    (
        "SABI_WHATSAPP_BUSINESS_ACCOUNT_ID",
        "whatsapp.business_account_id",
    ),
    ("SABI_BATCH_WINDOW", "whatsapp.batch_window"),
    ("SABI_BATCH_MAX_WAIT", "whatsapp.batch_max_wait"),
    ("SABI_OUTBOUND_RATE", "whatsapp.outbound_rate"),
    ("SABI_PAIR_SPACING", "whatsapp.pair_spacing"),
    ("SABI_MAX_REPLY_PARTS", "whatsapp.max_reply_parts"),
    ("SABI_MESSAGING_LIMIT", "whatsapp.messaging_limit"),
    ("SABI_DEFAULT_COUNTRY", "whatsapp.default_country"),
    ("SABI_BROADCAST_COOLDOWN", "broadcast.cooldown"),
    ("SABI_SEND_TIMEOUT", "whatsapp.send_timeout"),
    ("SABI_UNKNOWN_OUTCOME_WAIT", "whatsapp.unknown_outcome_wait"),
    (
        "SABI_WHATSAPP_MARKETING_MESSAGES",
        "whatsapp.marketing_messages",
    ),
    (
        "SABI_WHATSAPP_MESSAGE_SEND_TTL_SECONDS",
        "whatsapp.message_send_ttl_seconds",
    ),
    ("SABI_LLM_BASE_URL", "llm.base_url"),
    ("SABI_LLM_API_KEY", "llm.api_key"),
    ("SABI_LLM_MODEL", "llm.model"),
    ("SABI_LLM_MAX_CONCURRENT", "llm.max_concurrent"),
    ("SABI_LLM_RPM", "llm.requests_per_minute"),
    ("SABI_LLM_TPM", "llm.tokens_per_minute"),
    ("SABI_TRANSCRIBE_BASE_URL", "llm.transcribe_base_url"),
    ("SABI_LEASE", "engine.lease"),
    ("SABI_REVIEW_AFTER", "engine.review_after"),
    ("SABI_QUEUED_REVIEW_AFTER", "engine.queued_review_after"),
    ("SABI_HOLD_AFTER", "engine.hold_after"),
    ("SABI_HUMAN_HOLD", "engine.human_hold"),
    ("SABI_ADMIN_TOKEN", "admin.token"),
    ("SABI_METRICS_TOKEN", "admin.metrics_token"),
    ("SABI_TOOLS_SECRET", "tools_secret"),
    ("SABI_CHATWOOT_BASE_URL", "handoff.chatwoot.base_url"),
    ("SABI_CHATWOOT_API_TOKEN", "handoff.chatwoot.api_token"),
    ("SABI_CHATWOOT_ACCOUNT_ID", "handoff.chatwoot.account_id"),
    ("SABI_CHATWOOT_INBOX_ID", "handoff.chatwoot.inbox_id"),
    (
        "SABI_CHATWOOT_WEBHOOK_SECRET",
        "handoff.chatwoot.webhook_secret",
    ),
    ("SABI_DESK_WEBHOOK_URL", "handoff.webhook.url"),
    ("SABI_DESK_WEBHOOK_SECRET", "handoff.webhook.secret"),
    ("SABI_MARKER_SECRET", "privacy.marker_secret"),
    ("SABI_WEBCHAT_IDENTITY_SECRET", "webchat.identity_secret"),
    ("SABI_WEBCHAT_PER_ADDRESS", "webchat.per_address_per_minute"),
    (
        "SABI_WEBCHAT_SESSIONS_PER_ADDRESS",
        "webchat.new_sessions_per_address_per_hour",
    ),
    (
        "SABI_WEBCHAT_HANDOFFS_PER_ADDRESS",
        "webchat.handoffs_per_address_per_hour",
    ),
    ("SABI_TURNS", "engine.turns_per_node"),
    ("SABI_SANDBOX_REPLY_DELAY", "engine.sandbox_reply_delay"),
    ("SABI_INTENTS_FILE", "router.intents_file"),
    ("SABI_ROUTER_PACKS", "router.packs"),
    ("SABI_RETENTION_MESSAGES", "retention.messages"),
    ("SABI_RETENTION_STATUSES", "retention.statuses"),
    ("SABI_RETENTION_QUARANTINE", "retention.quarantine"),
    ("SABI_RETENTION_DEDUPE", "retention.dedupe"),
    ("SABI_SWEEP_EVERY", "retention.sweep_every"),
    ("SABI_LOG_FORMAT", "logging.format"),
];

/// The app secret used when none is configured, in sandbox mode only, so that `sabi serve`
/// and `sabi send` work together out of the box. Never accepted once an access token is set.
pub const SANDBOX_APP_SECRET: &str = "sabi-sandbox-secret";

/// The longest batch window a channel may have.
const MAX_WINDOW: Duration = Duration::from_secs(300);

/// Every channel's default `batch_max_wait`.
const BATCH_MAX_WAIT: Duration = Duration::from_secs(60);

/// The default time a whole agent turn may take: the built-in agent's `llm.turn_timeout`, and
/// an external agent's `timeout`.
const TURN_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address the HTTP server listens on.
    pub listen: SocketAddr,
    /// Where state lives: `sqlite://PATH` (embedded, the default) or `postgres://...`.
    pub store: StoreConfig,
    pub whatsapp: WhatsappConfig,
    pub webchat: WebchatConfig,
    pub llm: LlmConfig,
    /// Your own agent instead of the built-in one (`[external_agent]`).
    pub external_agent: Option<ExternalAgentConfig>,
    pub engine: EngineConfig,
    pub ingress: IngressConfig,
    pub admin: AdminConfig,
    pub router: RouterConfig,
    pub broadcast: BroadcastConfig,
    pub retention: RetentionConfig,
    pub privacy: PrivacyConfig,
    pub logging: LoggingConfig,
    /// The business's HTTP tools, for reply templates and the agent (`[[tools]]`).
    pub tools: Vec<ToolConfig>,
    /// Signs every tool request (`X-Sabi-Signature-256`), so the business's API can trust the
    /// customer it names in `X-Sabi-Customer`.
    #[serde(skip_serializing)]
    pub tools_secret: Option<SecretString>,
    /// Where hand-offs go besides Sabi's own desk (`[handoff.chatwoot]` or `[handoff.webhook]`).
    pub handoff: HandoffConfig,
}

/// Help desks a business already runs, which take Sabi's hand-offs: one of them.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HandoffConfig {
    pub chatwoot: Option<ChatwootConfig>,
    pub webhook: Option<DeskWebhookConfig>,
}

/// Any help desk that takes Sabi's hand-offs as signed JSON (`desk::webhook`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DeskWebhookConfig {
    /// Where Sabi posts the events.
    pub url: String,
    /// Signs the events Sabi posts, and the replies the desk posts to `/webhook/desk`.
    #[serde(skip_serializing)]
    pub secret: SecretString,
    /// How often open review items are mirrored to the desk.
    #[serde(default = "mirror_every", with = "duration")]
    pub mirror_every: Duration,
}

/// A Chatwoot account's API-channel inbox that hand-offs go to.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChatwootConfig {
    /// Where Chatwoot answers, like `https://app.chatwoot.com`.
    pub base_url: String,
    /// A user's access token (an agent's or an administrator's profile token: an agent bot's
    /// may not search or create contacts), sent as `api_access_token`.
    #[serde(skip_serializing)]
    pub api_token: SecretString,
    #[serde(deserialize_with = "number::u32")]
    pub account_id: u32,
    /// The API-channel inbox conversations are opened in.
    #[serde(deserialize_with = "number::u32")]
    pub inbox_id: u32,
    /// The inbox's webhook secret: Chatwoot signs what it posts to `/webhook/chatwoot` with it.
    #[serde(skip_serializing)]
    pub webhook_secret: SecretString,
    /// How often open review items are mirrored into Chatwoot.
    #[serde(default = "mirror_every", with = "duration")]
    pub mirror_every: Duration,
}

/// A desk's default `mirror_every`: its table has required keys, so it has no `Default`.
fn mirror_every() -> Duration {
    Duration::from_secs(2)
}

impl HandoffConfig {
    fn validate(&self) -> Result<(), Error> {
        let every = [
            self.chatwoot.as_ref().map(|c| c.mirror_every),
            self.webhook.as_ref().map(|w| w.mirror_every),
        ];
        if every.contains(&Some(Duration::ZERO)) {
            return Err(Error(
                "handoff's mirror_every: must be more than 0 (like \"2s\")".into(),
            ));
        }
        let (url, secret) = match (&self.chatwoot, &self.webhook) {
            (Some(_), Some(_)) => {
                return Err(Error(
                    "handoff.chatwoot and handoff.webhook: hand-offs go to one help desk; \
                     configure one of them"
                        .into(),
                ));
            }
            (Some(c), None) => (
                (
                    "handoff.chatwoot.base_url (SABI_CHATWOOT_BASE_URL)",
                    &c.base_url,
                ),
                (
                    "handoff.chatwoot.webhook_secret (SABI_CHATWOOT_WEBHOOK_SECRET)",
                    &c.webhook_secret,
                    "; Chatwoot shows the inbox's secret in its webhook settings",
                ),
            ),
            (None, Some(w)) => (
                ("handoff.webhook.url (SABI_DESK_WEBHOOK_URL)", &w.url),
                (
                    "handoff.webhook.secret (SABI_DESK_WEBHOOK_SECRET)",
                    &w.secret,
                    ", shared with the desk",
                ),
            ),
            (None, None) => return Ok(()),
        };
        let parsed = url::Url::parse(url.1).ok();
        if !parsed.is_some_and(|u| matches!(u.scheme(), "http" | "https")) {
            return Err(Error(format!(
                "{}: {:?} is not an http(s) URL",
                url.0, url.1
            )));
        }
        if secret.1.expose_secret().trim().len() < 16 {
            return Err(Error(format!(
                "{}: at least 16 characters{}",
                secret.0, secret.2
            )));
        }
        Ok(())
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            store: StoreConfig::default(),
            whatsapp: WhatsappConfig::default(),
            webchat: WebchatConfig::default(),
            llm: LlmConfig::default(),
            external_agent: None,
            engine: EngineConfig::default(),
            ingress: IngressConfig::default(),
            admin: AdminConfig::default(),
            router: RouterConfig::default(),
            broadcast: BroadcastConfig::default(),
            retention: RetentionConfig::default(),
            privacy: PrivacyConfig::default(),
            logging: LoggingConfig::default(),
            tools: Vec::new(),
            tools_secret: None,
            handoff: HandoffConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoggingConfig {
    /// `text` (the default) or `json`, one object per line.
    pub format: LogFormat,
    /// Put customers' phone numbers and message text in the logs (off: a short hash names the
    /// conversation instead).
    pub customer_data: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    /// Answer routine messages locally; off sends every batch to the agent.
    pub enabled: bool,
    /// The intents file; the built-in Nigerian banking and retail set when unset.
    pub intents_file: Option<PathBuf>,
    /// The share of local answers that may be wrong: `sabi route --calibrate` chooses each
    /// intent's thresholds to stay within it.
    pub max_wrong_rate: f64,
    /// The intent packs the business answers (`["shop"]`; the built-in file has "bank",
    /// "shop" and "telco"), besides the common intents (greeting, thanks, a person). What the
    /// others would answer goes to the agent. Unset: every pack is on. From the environment:
    /// `SABI_ROUTER_PACKS=shop,telco`.
    #[serde(deserialize_with = "names::option_list")]
    pub packs: Option<Vec<String>>,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            enabled: true,
            intents_file: None,
            max_wrong_rate: 0.02,
            packs: None,
        }
    }
}

impl RouterConfig {
    /// The intents file's text: the configured file or the built-in one.
    ///
    /// # Errors
    /// When the configured file cannot be read.
    pub fn intents_source(&self) -> Result<String, Error> {
        let source = match &self.intents_file {
            None => DEFAULT_INTENTS.to_owned(),
            Some(path) => std::fs::read_to_string(path).map_err(|e| {
                Error(format!(
                    "router.intents_file: cannot read {}: {e}",
                    path.display()
                ))
            })?,
        };
        Ok(match &self.packs {
            None => source,
            // A top-level key of the intents file, ahead of its tables; the file checks the
            // names against its intents' packs when the router is built.
            Some(packs) => {
                let packs = serde_json::to_string(packs).map_err(|e| Error(e.to_string()))?;
                // A file written from this text (`--calibrate --write`) carries the line
                // already: the configuration's packs replace it.
                let source = source
                    .strip_prefix(PACKS_HEADER)
                    .and_then(|rest| rest.split_once("\n\n"))
                    .map_or(source.as_str(), |(_, rest)| rest);
                format!("{PACKS_HEADER}packs = {packs}\n\n{source}")
            }
        })
    }
}

/// The store backend, written as a URL (`sqlite://sabi-data/sabi.db`) or as a table
/// (`{ kind = "sqlite", path = "..." }`, `{ kind = "postgres", url = "..." }`,
/// `{ kind = "redis", url = "..." }`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(try_from = "StoreSpec", into = "String")]
pub enum StoreConfig {
    Sqlite {
        path: PathBuf,
    },
    /// `postgres://user:password@host/database`: several nodes share it.
    Postgres {
        url: String,
    },
    /// `redis://[:password@]host[:port][/db][?prefix=NAME&durability=require]`, or `rediss://`
    /// over TLS (`&ca=PATH` for a private CA): several nodes share it (Valkey too).
    Redis {
        url: String,
    },
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig::Sqlite {
            path: PathBuf::from("sabi-data/sabi.db"),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum StoreSpec {
    Url(String),
    Table(StoreTable),
}

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
enum StoreTable {
    Sqlite { path: PathBuf },
    Postgres { url: String },
    Redis { url: String },
}

impl From<StoreConfig> for String {
    fn from(store: StoreConfig) -> String {
        match store {
            StoreConfig::Sqlite { path } => format!("sqlite://{}", path.display()),
            // Printed configurations never show the database password.
            StoreConfig::Postgres { url } | StoreConfig::Redis { url } => without_password(&url),
        }
    }
}

/// `postgres://user:secret@host/db` as `postgres://user:***@host/db`.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((credentials, host)) if credentials.contains(':') => {
            let user = credentials.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

/// A table's URL, which must be of the kind the table names.
fn of_kind(url: String, kind: &str) -> Result<StoreConfig, String> {
    let store = StoreConfig::try_from(StoreSpec::Url(url))?;
    match (&store, kind) {
        (StoreConfig::Postgres { .. }, "postgres") | (StoreConfig::Redis { .. }, "redis") => {
            Ok(store)
        }
        _ => Err(format!("a store of kind {kind:?} needs a {kind}:// url")),
    }
}

impl TryFrom<StoreSpec> for StoreConfig {
    type Error = String;

    fn try_from(spec: StoreSpec) -> Result<Self, String> {
        match spec {
            StoreSpec::Table(StoreTable::Sqlite { path }) => Ok(StoreConfig::Sqlite { path }),
            StoreSpec::Table(StoreTable::Postgres { url }) => of_kind(url, "postgres"),
            StoreSpec::Table(StoreTable::Redis { url }) => of_kind(url, "redis"),
            StoreSpec::Url(url) => match url.split_once("://") {
                Some(("sqlite", path)) if !path.is_empty() => {
                    Ok(StoreConfig::Sqlite { path: path.into() })
                }
                Some(("postgres" | "postgresql", rest)) if !rest.is_empty() => {
                    Ok(StoreConfig::Postgres { url })
                }
                Some(("redis" | "rediss", rest)) if !rest.is_empty() => {
                    Ok(StoreConfig::Redis { url })
                }
                _ => Err(format!(
                    "unsupported store {url:?}: expected sqlite://PATH, postgres://..., redis://... or rediss://..."
                )),
            },
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct WhatsappConfig {
    /// The Meta app's secret: webhooks are signed with it. Unset in sandbox mode means a fixed
    /// sandbox secret that `sabi send` also uses.
    #[serde(skip_serializing)]
    pub app_secret: Option<SecretString>,
    /// The previous app secret, still accepted while a rotation is under way.
    #[serde(skip_serializing)]
    pub previous_app_secret: Option<SecretString>,
    /// The token Meta echoes when it verifies the callback URL. Unset: verification refused.
    #[serde(skip_serializing)]
    pub verify_token: Option<SecretString>,
    /// Graph API access token. Unset means sandbox mode: replies are stored, not sent.
    #[serde(skip_serializing)]
    pub access_token: Option<SecretString>,
    /// The WhatsApp Business Account's id: broadcasts check their template through it before
    /// anything is sent.
    pub business_account_id: Option<String>,
    /// Graph API base URL. One that ends in a version (`.../v23.0`) is used as it is;
    /// otherwise `graph_version` follows it.
    pub api_base: String,
    /// The Graph API version Sabi speaks (`v24.0`): Meta keeps each for about two years, and
    /// changes what webhooks carry between them.
    pub graph_version: String,
    /// A conversation's batch is due this long after its latest message (0 to 300 s).
    #[serde(with = "duration")]
    pub batch_window: Duration,
    /// ...and never later than this long after its first (at least the window).
    #[serde(with = "duration")]
    pub batch_max_wait: Duration,
    /// Messages per second per business number.
    #[serde(deserialize_with = "number::u32")]
    pub outbound_rate: u32,
    /// Meta's messaging limit for the business: unique customers that broadcasts may reach in
    /// a rolling 24 hours; beyond it, the rest of a broadcast waits.
    pub messaging_limit: MessagingLimit,
    /// The least time between two messages to one customer. Meta's pair limit is about one
    /// per 6 s with bursts allowed; a reply's few parts fit in the burst.
    #[serde(with = "duration")]
    pub pair_spacing: Duration,
    /// How long one Graph API call may take.
    #[serde(with = "duration")]
    pub send_timeout: Duration,
    /// A send whose answer was lost waits this long for a status webhook, then goes to review.
    #[serde(with = "duration")]
    pub unknown_outcome_wait: Duration,
    /// Failed tries of one send before it goes to review (throttling does not count).
    #[serde(deserialize_with = "number::u32")]
    pub send_max_failures: u32,
    /// The wait after a failed send, doubled after each further failure.
    #[serde(with = "duration")]
    pub send_retry_base: Duration,
    /// Sends in flight at once on one node.
    #[serde(deserialize_with = "number::usize")]
    pub sends_in_flight: usize,
    /// Mark the customer's message read, with the typing indicator, while a turn works.
    pub typing_indicator: bool,
    /// A reply's first part quotes the customer's latest message.
    pub quote_replies: bool,
    /// Sent instead of a reply once the 24-hour window has closed; such replies go to review
    /// when unset.
    pub window_template: Option<Template>,
    /// Send MARKETING templates through Meta's Marketing Messages API
    /// (`/{phone-number-id}/marketing_messages`); every other send keeps to `/messages`. Off
    /// until the business has accepted Meta's terms for it: Meta refuses the endpoint before.
    #[serde(deserialize_with = "flag::parse")]
    pub marketing_messages: bool,
    /// How long Meta keeps trying to deliver a marketing message sent through the Marketing
    /// Messages API, in seconds (Meta's `message_send_ttl_seconds`: 43200 to 2592000, 12 hours
    /// to 30 days). Unset: Meta's default, 30 days.
    #[serde(deserialize_with = "number::option_u32")]
    pub message_send_ttl_seconds: Option<u32>,
    /// The country calling code (like 234) of numbers people write the local way (0803 ...):
    /// in audience files, and naming a customer to export or forget. Unset: such numbers are
    /// refused unless the command gives `--country`.
    pub default_country: Option<String>,
    /// What Meta charges per message, by pricing category and the recipient's country prefix
    /// (the longest that matches; a BSUID's two letters for a customer known by no number):
    /// `sabi stats` prices the messages Meta's statuses priced with it. `broadcast.prices`
    /// count as the `marketing` and `marketing_lite` prices.
    pub prices: BTreeMap<String, BTreeMap<String, f64>>,
    /// The currency of `prices`. Unset: `broadcast.currency`.
    pub currency: Option<String>,
    /// A reply in more parts than this is packed into as few messages as fit (each is billed
    /// once Meta charges for service messages); at most this many are sent as written.
    #[serde(deserialize_with = "number::usize")]
    pub max_reply_parts: usize,
}

/// Meta's pricing categories, as the statuses' `pricing.category` names them (lower case).
pub const PRICING_CATEGORIES: &[&str] = &[
    "marketing",
    "marketing_lite",
    "utility",
    "authentication",
    "authentication_international",
    "service",
];

/// What Meta charges per message: `whatsapp.prices` with `broadcast.prices` folded in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MessagePrices {
    /// Category -> country prefix (digits, or a BSUID's country letters) -> price.
    pub by_category: BTreeMap<String, BTreeMap<String, f64>>,
    pub currency: String,
}

impl MessagePrices {
    /// The price of a message in `category` to a number starting `prefix`: the longest priced
    /// prefix's.
    pub fn of(&self, category: &str, prefix: &str) -> Option<f64> {
        let prices = self.by_category.get(category)?;
        (1..=prefix.len())
            .rev()
            .filter(|n| prefix.is_char_boundary(*n))
            .find_map(|n| prices.get(&prefix[..n]).copied())
    }
}

/// A price's prefix is a country calling code's first digits (at most 4) or a BSUID's
/// country letters (`NG`), and the price is a number no less than zero.
fn check_price(setting: &str, prefix: &str, price: f64) -> Result<(), Error> {
    let digits = (1..=4).contains(&prefix.len()) && prefix.bytes().all(|b| b.is_ascii_digit());
    let letters = prefix.len() == 2 && prefix.bytes().all(|b| b.is_ascii_uppercase());
    if !digits && !letters {
        return Err(Error(format!(
            "{setting}: {prefix:?} is neither a country prefix (up to 4 digits, like 234) nor a \
             country's two letters (like NG)"
        )));
    }
    if !price.is_finite() || price < 0.0 {
        return Err(Error(format!("{setting}.{prefix}: {price} is not a price")));
    }
    Ok(())
}

/// A Graph API version as Meta writes it: `v` and two numbers, like `v24.0`.
fn is_graph_version(text: &str) -> bool {
    text.strip_prefix('v')
        .and_then(|v| v.split_once('.'))
        .is_some_and(|(major, minor)| {
            !major.is_empty()
                && !minor.is_empty()
                && major
                    .chars()
                    .chain(minor.chars())
                    .all(|c| c.is_ascii_digit())
        })
}

impl Default for WhatsappConfig {
    fn default() -> Self {
        WhatsappConfig {
            app_secret: None,
            previous_app_secret: None,
            verify_token: None,
            access_token: None,
            business_account_id: None,
            api_base: "https://graph.facebook.com".into(),
            graph_version: "v24.0".into(),
            batch_window: Duration::from_secs(20),
            batch_max_wait: BATCH_MAX_WAIT,
            outbound_rate: 80,
            messaging_limit: MessagingLimit(Some(250)),
            pair_spacing: Duration::from_secs(1),
            send_timeout: Duration::from_secs(15),
            unknown_outcome_wait: Duration::from_secs(2 * 60),
            send_max_failures: 6,
            send_retry_base: Duration::from_secs(2),
            sends_in_flight: 32,
            typing_indicator: true,
            quote_replies: false,
            window_template: None,
            marketing_messages: false,
            message_send_ttl_seconds: None,
            default_country: None,
            prices: BTreeMap::new(),
            currency: None,
            max_reply_parts: 1,
        }
    }
}

impl WhatsappConfig {
    /// Sandbox mode: no access token, so nothing is sent to Meta.
    pub fn sandbox(&self) -> bool {
        self.access_token.is_none()
    }

    /// The Graph API's base URL with its version: `api_base` as given when it names a
    /// version, else `api_base/graph_version`.
    pub fn graph_base(&self) -> String {
        let base = self.api_base.trim_end_matches('/');
        let last = base.rsplit('/').next().unwrap_or_default();
        if is_graph_version(last) {
            base.to_owned()
        } else {
            format!("{base}/{}", self.graph_version)
        }
    }

    /// The secrets a webhook signature may be made with, current first.
    pub fn app_secrets(&self) -> Vec<SecretString> {
        let current = self
            .app_secret
            .clone()
            .unwrap_or_else(|| SecretString::from(SANDBOX_APP_SECRET.to_owned()));
        std::iter::once(current)
            .chain(self.previous_app_secret.clone())
            .collect()
    }

    pub fn batch_policy(&self) -> BatchPolicy {
        policy(self.batch_window, self.batch_max_wait)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebchatConfig {
    /// Web chat answers each question at once by default.
    #[serde(with = "duration")]
    pub batch_window: Duration,
    #[serde(with = "duration")]
    pub batch_max_wait: Duration,
    /// The business side of web-chat conversations (one site per Sabi by default).
    pub site: String,
    /// How long a job's result can be fetched (the history keeps answers longer).
    #[serde(with = "duration")]
    pub result_ttl: Duration,
    /// Questions waiting beyond this: new ones are refused with 503 and Retry-After.
    #[serde(deserialize_with = "number::usize")]
    pub max_queue: usize,
    /// Questions one session may ask per minute before it gets 429.
    #[serde(deserialize_with = "number::usize")]
    pub per_session_per_minute: usize,
    /// Questions from one address (the client behind `ingress.trusted_proxies`) per minute, in
    /// bursts of as many, before it gets 429: a family behind one router never meets it, a
    /// script at once. 0: no limit.
    #[serde(deserialize_with = "number::usize")]
    pub per_address_per_minute: usize,
    /// New sessions (a session id's first question) from one address per hour, in bursts of as
    /// many: a script that takes a new session per question meets it. 0: no limit.
    #[serde(deserialize_with = "number::usize")]
    pub new_sessions_per_address_per_hour: usize,
    /// Anonymous requests for a person from one address per hour, in bursts of as many: each
    /// is a desk item someone must read. 0: no limit.
    #[serde(deserialize_with = "number::usize")]
    pub handoffs_per_address_per_hour: usize,
    /// Event streams open at once on one node; more get 503 (browsers then poll).
    #[serde(deserialize_with = "number::usize")]
    pub max_streams: usize,
    /// Your site signs its signed-in user's id with this (`user_hash`, hex HMAC-SHA256 of
    /// `user_id`), so a visitor cannot claim to be someone else. Unset: every visitor is
    /// anonymous and offered only public tools.
    #[serde(skip_serializing)]
    pub identity_secret: Option<SecretString>,
    /// Who may frame the chat page (a Content-Security-Policy `frame-ancestors` list, like
    /// `https://www.example.com`); `*` lets any site embed it.
    pub frame_ancestors: String,
}

impl Default for WebchatConfig {
    fn default() -> Self {
        WebchatConfig {
            batch_window: Duration::ZERO,
            batch_max_wait: BATCH_MAX_WAIT,
            site: "web".into(),
            result_ttl: Duration::from_secs(24 * 3600),
            max_queue: 1000,
            per_session_per_minute: 20,
            per_address_per_minute: 30,
            new_sessions_per_address_per_hour: 30,
            handoffs_per_address_per_hour: 5,
            max_streams: 10_000,
            identity_secret: None,
            frame_ancestors: "*".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmConfig {
    /// OpenAI-compatible base URL (`https://api.openai.com/v1`, a local vLLM, ...). Unset: no
    /// agent; the sandbox acknowledgement answers what the router does not.
    pub base_url: Option<String>,
    #[serde(skip_serializing)]
    pub api_key: Option<SecretString>,
    pub model: Option<String>,
    /// A second provider, tried when the first is out of tries.
    pub fallback: Option<FallbackLlm>,
    /// What the agent is told about the business and how to answer.
    pub system_prompt: String,
    /// How long one model call may take.
    #[serde(with = "duration")]
    pub timeout: Duration,
    /// How long a whole agent turn may take (every call and tool).
    #[serde(with = "duration")]
    pub turn_timeout: Duration,
    /// Tries per provider and call (429, 5xx and timeouts are retried).
    #[serde(deserialize_with = "number::u32")]
    pub attempts: u32,
    /// The wait after a failed call, doubled after each further one.
    #[serde(with = "duration")]
    pub backoff: Duration,
    /// This node's budget of the provider: calls in flight at once, and requests and tokens per
    /// minute (unset: not paced). Each node keeps its own: give each its share of your tier's
    /// limits. It, not `engine.turns_per_node`, bounds what a surge sends to the model.
    #[serde(flatten)]
    pub budget: LlmBudget,
    /// Rounds of tool calls before the agent must answer.
    #[serde(deserialize_with = "number::u32")]
    pub max_tool_rounds: u32,
    /// Roughly how many tokens of earlier conversation go to the model.
    #[serde(deserialize_with = "number::usize")]
    pub history_tokens: usize,
    /// Tool calls run in one round; the model's further calls in that round are not run and
    /// are answered with an error it reads.
    #[serde(deserialize_with = "number::usize")]
    pub max_tool_calls: usize,
    /// A tool's answer (or error) is cut to this many bytes before the model reads it.
    #[serde(deserialize_with = "number::usize")]
    pub max_tool_answer_bytes: usize,
    /// Estimated prompt tokens (about 4 characters each) all of a turn's model calls may send
    /// together; a turn that would send more goes to a person instead.
    #[serde(deserialize_with = "number::usize")]
    pub turn_prompt_tokens: usize,
    /// The most characters a string argument of a tool may have when its `parameters` schema
    /// gives no `maxLength` (the model is offered the bound, and the call is checked).
    #[serde(deserialize_with = "number::usize")]
    pub max_argument_chars: usize,
    /// Hosts an answer may link to (each with its subdomains, like `example.com`); an answer
    /// with any other link, or a `javascript:` one, is not sent. Empty: no links at all.
    pub allowed_link_hosts: Vec<String>,
    /// Mask phone and account numbers before text leaves for the model.
    pub redact: bool,
    /// Price per million prompt tokens, for `sabi stats`'s cost estimate.
    pub prompt_price: f64,
    /// Price per million completion tokens.
    pub completion_price: f64,
    /// Speech-to-text base URL; the LLM's when unset.
    pub transcribe_base_url: Option<String>,
    /// Speech-to-text key; the LLM's when unset.
    #[serde(skip_serializing)]
    pub transcribe_api_key: Option<SecretString>,
    /// The speech-to-text model.
    pub transcribe_model: String,
    /// The largest voice note downloaded for transcription (Meta allows 16 MB).
    #[serde(deserialize_with = "number::usize")]
    pub media_max_bytes: usize,
    /// Sampling temperature; 0 for tool use (the same question gets the same tool decision).
    /// Unset: the provider's default.
    pub temperature: Option<f64>,
    /// Nucleus sampling; unset: the provider's default.
    pub top_p: Option<f64>,
    /// The most tokens one answer may have; an answer cut off there is never sent.
    pub max_tokens: Option<u32>,
    /// A fixed seed, for providers that make sampling repeatable with one.
    pub seed: Option<u64>,
    /// Merged into every chat request's body: a provider's own options.
    #[serde(skip_serializing_if = "toml::Table::is_empty")]
    pub extra: toml::Table,
    /// The voice notes' language (ISO-639-1, like `en`), passed to the transcription; unset:
    /// detected.
    pub transcribe_language: Option<String>,
    /// Whisper's `prompt`: the business's words and spellings (Pidgin too), to bias what it hears.
    pub transcribe_prompt: Option<String>,
}

impl Default for LlmConfig {
    fn default() -> Self {
        LlmConfig {
            base_url: None,
            api_key: None,
            model: None,
            fallback: None,
            system_prompt: "You are the customer support assistant of this business on WhatsApp \
                            and web chat. Answer briefly and kindly, in the customer's own \
                            language or Pidgin. Use the tools to look things up; never invent \
                            balances, orders or policies. If you cannot help, say a person will \
                            follow up."
                .into(),
            // Two tries of 20 s (and a 1 s wait) on each of two providers fit in the turn's 120 s.
            timeout: Duration::from_secs(20),
            turn_timeout: TURN_TIMEOUT,
            attempts: 2,
            backoff: Duration::from_secs(1),
            budget: LlmBudget::default(),
            max_tool_rounds: 4,
            history_tokens: 2000,
            max_tool_calls: 8,
            max_tool_answer_bytes: 32 * 1024,
            turn_prompt_tokens: 100_000,
            max_argument_chars: 1000,
            allowed_link_hosts: Vec::new(),
            redact: false,
            prompt_price: 0.0,
            completion_price: 0.0,
            transcribe_base_url: None,
            transcribe_api_key: None,
            transcribe_model: "whisper-1".into(),
            media_max_bytes: 16 * 1024 * 1024,
            temperature: None,
            top_p: None,
            max_tokens: None,
            seed: None,
            extra: toml::Table::new(),
            transcribe_language: None,
            transcribe_prompt: None,
        }
    }
}

/// An agent of your own that Sabi posts batches to.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalAgentConfig {
    pub url: String,
    /// Signs every request (`X-Sabi-Signature-256`), so the agent can check it came from Sabi.
    #[serde(skip_serializing)]
    pub secret: SecretString,
    #[serde(default = "turn_timeout", with = "duration")]
    pub timeout: Duration,
}

/// The external agent's default `timeout`: its table has required keys, so it has no
/// `Default` to fill a missing one from.
fn turn_timeout() -> Duration {
    TURN_TIMEOUT
}

/// The fallback provider.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FallbackLlm {
    pub base_url: String,
    #[serde(skip_serializing)]
    pub api_key: Option<SecretString>,
    pub model: String,
    #[serde(flatten)]
    pub budget: LlmBudget,
}

/// How much of a model provider Sabi may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct LlmBudget {
    #[serde(deserialize_with = "number::usize")]
    pub max_concurrent: usize,
    #[serde(deserialize_with = "number::option_u32")]
    pub requests_per_minute: Option<u32>,
    #[serde(deserialize_with = "number::option_u32")]
    pub tokens_per_minute: Option<u32>,
}

impl Default for LlmBudget {
    fn default() -> Self {
        LlmBudget {
            max_concurrent: 16,
            requests_per_minute: None,
            tokens_per_minute: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// How long a claimed batch is held; renewed every quarter of it.
    #[serde(with = "duration")]
    pub lease: Duration,
    /// A batch whose first message reached Sabi this much after the customer sent it (an
    /// outage, Meta's retries) goes to review instead of an automatic reply.
    #[serde(with = "duration")]
    pub review_after: Duration,
    /// A batch that waited in Sabi's own queue longer than this (a surge) goes to review;
    /// unset, it is answered however long it waited.
    #[serde(with = "duration::option", skip_serializing_if = "Option::is_none")]
    pub queued_review_after: Option<Duration>,
    /// A WhatsApp customer whose turn is expected further off than this gets one short holding
    /// message with the expected wait, and the answer follows; 0: never. `sabi plan` sizes for
    /// it.
    #[serde(with = "duration")]
    pub hold_after: Duration,
    /// The holding message; `{wait}` becomes the expected wait, like "about 5 minutes".
    pub hold_message: String,
    /// After a person replies to a customer (the desk, the admin API, or the WhatsApp Business
    /// app on the same number), the assistant stands down in that conversation this long,
    /// renewed by each of their replies: what the customer writes meanwhile goes to the person.
    #[serde(with = "duration")]
    pub human_hold: Duration,
    /// How long running work may take to finish at shutdown.
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
    /// Turns at once on one node: they mostly wait on I/O, and the model budget bounds the
    /// calls they make.
    #[serde(deserialize_with = "number::usize")]
    pub turns_per_node: usize,
    /// Tries of a turn before its batch goes to review.
    #[serde(deserialize_with = "number::u32")]
    pub max_attempts: u32,
    /// The wait after a failed turn, doubled after each further failure.
    #[serde(with = "duration")]
    pub retry_base: Duration,
    /// How often a worker asks the store for work other nodes stored.
    #[serde(with = "duration")]
    pub poll_interval: Duration,
    /// Sandbox mode's acknowledgement waits this long, to stand in for an agent's thinking.
    #[serde(with = "duration")]
    pub sandbox_reply_delay: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            lease: Duration::from_secs(120),
            review_after: Duration::from_secs(15 * 60),
            queued_review_after: None,
            hold_after: Duration::from_secs(60),
            hold_message: "Thanks for your message! Many people are writing to us right now: we \
                           will answer you in {wait}."
                .into(),
            human_hold: Duration::from_secs(3600),
            shutdown_grace: Duration::from_secs(10),
            // Turns mostly wait on the model or a tool: a node runs many, and the model budget
            // (`llm.max_concurrent` and the per-minute limits) bounds what reaches the provider.
            turns_per_node: 32,
            max_attempts: 4,
            retry_base: Duration::from_secs(5),
            poll_interval: Duration::from_secs(1),
            sandbox_reply_delay: Duration::ZERO,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngressConfig {
    /// Largest request body accepted (Meta sends up to 3 MB).
    #[serde(deserialize_with = "number::usize")]
    pub max_body_bytes: usize,
    /// Networks the WhatsApp webhook accepts requests from (CIDR, like Meta's published
    /// ranges); empty accepts any. A valid signature is still required.
    pub webhook_allow: Vec<ipnet::IpNet>,
    /// Proxies whose `X-Forwarded-For` is believed (CIDR); from anyone else it is ignored.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// A client must send a request's headers within this (slower ones are dropped).
    #[serde(with = "duration")]
    pub header_timeout: Duration,
    /// ...and its whole body within this (408 otherwise; Meta sends at once).
    #[serde(with = "duration")]
    pub body_timeout: Duration,
    /// Connections open at once on one node (kept within the open-file limit); new ones are
    /// closed beyond it.
    #[serde(deserialize_with = "number::usize")]
    pub max_connections: usize,
    /// Bodies over 64 KiB (or of unknown length) read at once by the webhook, and as many
    /// again by every other route; more get 503 at once.
    #[serde(deserialize_with = "number::usize")]
    pub max_large_bodies: usize,
    /// A client that reads nothing of its answer for this long is dropped (one that pipelines
    /// requests and never reads the answers would otherwise hold its connection for good).
    #[serde(with = "duration")]
    pub write_timeout: Duration,
    /// A connection this old takes no new request and closes once its answer is written
    /// (cut off if that takes `engine.shutdown_grace` more); event streams are exempt.
    #[serde(with = "duration")]
    pub max_connection_age: Duration,
    /// Requests one connection carries (pipelined or one after another); the last answer
    /// closes it.
    #[serde(deserialize_with = "number::usize")]
    pub max_requests_per_connection: usize,
    /// Connections open at once from one client address (an IPv6 client's /64), within
    /// `max_connections`; new ones beyond are closed at once. A peer in `trusted_proxies`
    /// speaks for many clients and is not capped: the proxy's own per-client limit applies.
    #[serde(deserialize_with = "number::usize")]
    pub max_connections_per_address: usize,
    /// Bytes of request bodies being read at once for one client address (the client behind
    /// `trusted_proxies`; an IPv6 client's /64), small bodies included: each counts its
    /// declared length (or the route's limit when none is declared) until read; more get 503
    /// at once. The admin API's bodies, read only once its token is checked, do not count.
    #[serde(deserialize_with = "number::usize")]
    pub max_body_bytes_per_address: usize,
}

impl Default for IngressConfig {
    fn default() -> Self {
        // Meta's 3 MB plus room for headers of the JSON around it.
        let max_body_bytes = 3 * 1024 * 1024 + 512 * 1024;
        IngressConfig {
            max_body_bytes,
            webhook_allow: Vec::new(),
            trusted_proxies: Vec::new(),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            max_connections: 10_000,
            max_large_bodies: 16,
            write_timeout: Duration::from_secs(30),
            max_connection_age: Duration::from_secs(300),
            max_requests_per_connection: 1_000,
            max_connections_per_address: 256,
            // Two of Meta's largest webhooks at once, of the default body limit: a configured
            // `max_body_bytes` does not move it (validation asks that it hold at least one).
            max_body_bytes_per_address: 2 * max_body_bytes,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Bearer token of the admin API; unset means the admin API is off.
    #[serde(skip_serializing)]
    pub token: Option<SecretString>,
    /// Bearer token `/metrics` requires; unset leaves it open (keep it behind your proxy).
    #[serde(skip_serializing)]
    pub metrics_token: Option<SecretString>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct BroadcastConfig {
    /// Told once to a customer who writes STOP (or its equivalents) and is opted out.
    pub stop_reply: String,
    /// Told once to a customer who writes START and is opted back in.
    pub start_reply: String,
    /// Offered (with a "Stop offers" button) after a bare STOP that may have answered the
    /// assistant's question: the answer comes first, and the opt-out is the customer's choice.
    /// Must not end with a question mark.
    pub stop_offer: String,
    /// A customer sent a broadcast this recently is skipped by the next.
    #[serde(with = "duration")]
    pub cooldown: Duration,
    /// Holds for Meta's marketing limit per user (131049, at least 24 h each) before a
    /// recipient fails.
    #[serde(deserialize_with = "number::u32")]
    pub max_holds: u32,
    /// What Meta charges for one template message, by the recipient's country prefix (the
    /// longest that matches): a broadcast's cost before it goes and after.
    pub prices: BTreeMap<String, f64>,
    /// The currency of `prices`.
    pub currency: String,
}

impl Default for BroadcastConfig {
    fn default() -> Self {
        BroadcastConfig {
            stop_reply: "You will get no more offers or updates from us. You can still write to \
                         us any time, and reply START to get them again."
                .into(),
            start_reply:
                "You will get our offers and updates again. Reply STOP any time to stop them."
                    .into(),
            stop_offer: "If you want no more offers or updates from us, tap Stop offers.".into(),
            cooldown: Duration::from_secs(24 * 60 * 60),
            max_holds: 3,
            prices: BTreeMap::new(),
            currency: "USD".into(),
        }
    }
}

/// How long Sabi keeps what it holds (`store::rules::retention` has the rules).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Customer messages, reply bodies, settled review items, web-chat history and jobs.
    #[serde(with = "duration")]
    pub messages: Duration,
    /// Delivery and read statuses, and the other recorded items.
    #[serde(with = "duration")]
    pub statuses: Duration,
    /// Quarantined raw bodies.
    #[serde(with = "duration")]
    pub quarantine: Duration,
    /// How long a message's deduplication key (a hash) outlives its content.
    #[serde(with = "duration")]
    pub dedupe: Duration,
    /// How often the sweeper looks for what is past its horizon.
    #[serde(with = "duration")]
    pub sweep_every: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        // The horizons' own defaults are the store rules' (`Horizons::default`).
        let horizons = Horizons::default();
        RetentionConfig {
            messages: horizons.messages,
            statuses: horizons.statuses,
            quarantine: horizons.quarantine,
            dedupe: horizons.dedupe,
            sweep_every: Duration::from_secs(60),
        }
    }
}

/// What erasure leaves behind is keyed (`store::rules::erasure::Marks`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrivacyConfig {
    /// Keys the do-not-contact markers and erased messages' hashes (HMAC-SHA256), so a copy of
    /// the store alone cannot tell whom they stand for. Keep it outside the store and its
    /// backups. Required once an access token is set; unset in sandbox mode on SQLite, Sabi
    /// makes one and keeps it beside the database (`marker-secret`, 0600).
    #[serde(skip_serializing)]
    pub marker_secret: Option<SecretString>,
    /// The secrets used before `marker_secret`, oldest first: a store made under them moves to
    /// the new one at start, and they stay needed to find its markers.
    #[serde(skip_serializing)]
    pub previous_marker_secrets: Vec<SecretString>,
}

/// The file a sandbox keeps its generated marker secret in, beside a SQLite store.
pub const SANDBOX_MARKER_SECRET_FILE: &str = "marker-secret";

impl Config {
    /// The marker secret and the ones before it: the configured one, or in sandbox mode on
    /// SQLite the one kept beside the database, made on first use.
    ///
    /// # Errors
    /// None configured outside that case, or the sandbox's file cannot be read or made.
    pub fn marker_secrets(&self) -> Result<(SecretString, Vec<SecretString>), Error> {
        let previous = self.privacy.previous_marker_secrets.clone();
        if let Some(secret) = &self.privacy.marker_secret {
            return Ok((secret.clone(), previous));
        }
        let missing = || {
            Error(
                "privacy.marker_secret (SABI_MARKER_SECRET): required once an access token is \
                 set or the store is PostgreSQL or Redis; a long random string kept outside the \
                 store, like `openssl rand -hex 32`"
                    .into(),
            )
        };
        let StoreConfig::Sqlite { path } = &self.store else {
            return Err(missing());
        };
        if !self.whatsapp.sandbox() {
            return Err(missing());
        }
        let file = path
            .parent()
            .unwrap_or(Path::new("."))
            .join(SANDBOX_MARKER_SECRET_FILE);
        let cannot = |e: std::io::Error| {
            Error(format!(
                "privacy.marker_secret: cannot keep the sandbox's secret in {}: {e}",
                file.display()
            ))
        };
        match std::fs::read_to_string(&file) {
            Ok(secret) if !secret.trim().is_empty() => {
                return Ok((SecretString::from(secret.trim().to_owned()), previous));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(cannot(e)),
        }
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| cannot(std::io::Error::other(e.to_string())))?;
        let secret = hex::encode(bytes);
        if let Some(dir) = file.parent() {
            // The store's own directory, private as the store makes it.
            let mut dirs = std::fs::DirBuilder::new();
            dirs.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut dirs, 0o700);
            dirs.create(dir).map_err(cannot)?;
        }
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        match options.open(&file) {
            Ok(mut out) => {
                std::io::Write::write_all(&mut out, secret.as_bytes()).map_err(cannot)?;
                Ok((SecretString::from(secret), previous))
            }
            // Another command made it first: theirs is the one.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let secret = std::fs::read_to_string(&file).map_err(cannot)?;
                Ok((SecretString::from(secret.trim().to_owned()), previous))
            }
            Err(e) => Err(cannot(e)),
        }
    }
}

/// A configuration that cannot be used, naming the setting.
#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct Error(String);

pub use self::example::example;

impl Config {
    /// Every setting at its default.
    ///
    /// # Errors
    /// Never in practice: the defaults are valid (a test holds them to it).
    pub fn defaults() -> Result<Config, Error> {
        serde_path_to_error::deserialize(toml::Value::Table(toml::Table::new()))
            .map_err(|e| Error(format!("{}: {}", e.path(), e.inner())))
    }

    /// Loads defaults, then `file` if given (it must exist) or `./sabi.toml` if present, then
    /// the `SABI_*` variables among `env`.
    ///
    /// # Errors
    /// An unreadable file, or any invalid setting, named.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, Error> {
        let mut table = read_file(file)?;
        let env: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with("SABI_"))
            .collect();
        for (var, value) in &env {
            let Some((_, key)) = ENV.iter().find(|(name, _)| name == var) else {
                continue;
            };
            set_path(&mut table, key, value.clone());
        }
        let config: Config =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
                let key = e.path().to_string();
                let from_env = ENV
                    .iter()
                    .find(|(name, k)| *k == key && env.iter().any(|(v, _)| v == name))
                    .map(|(name, _)| format!(" (from {name})"))
                    .unwrap_or_default();
                Error(format!("{key}{from_env}: {}", e.inner()))
            })?;
        config.validate()?;
        Ok(config)
    }

    /// What Meta charges per message: `whatsapp.prices`, with `broadcast.prices` as the
    /// marketing (and marketing_lite) prices.
    ///
    /// # Errors
    /// An unknown category, a prefix that is neither digits nor a country's two letters, a
    /// price below zero, or the two tables disagreeing on a price or a currency.
    pub fn message_prices(&self) -> Result<MessagePrices, Error> {
        let broadcast = &self.broadcast;
        let currency = self
            .whatsapp
            .currency
            .clone()
            .unwrap_or_else(|| broadcast.currency.clone());
        if currency != broadcast.currency && !broadcast.prices.is_empty() {
            return Err(Error(format!(
                "whatsapp.currency is {currency} and broadcast.currency {}: broadcast.prices \
                 count as marketing prices, so the two must agree",
                broadcast.currency
            )));
        }
        let mut by_category = self.whatsapp.prices.clone();
        for (category, prices) in &by_category {
            if !PRICING_CATEGORIES.contains(&category.as_str()) {
                return Err(Error(format!(
                    "whatsapp.prices: {category:?} is not one of Meta's pricing categories ({})",
                    PRICING_CATEGORIES.join(", ")
                )));
            }
            for (prefix, price) in prices {
                check_price(&format!("whatsapp.prices.{category}"), prefix, *price)?;
            }
        }
        for (prefix, price) in &broadcast.prices {
            check_price("broadcast.prices", prefix, *price)?;
            for category in ["marketing", "marketing_lite"] {
                let kept = by_category.entry(category.to_owned()).or_default();
                match kept.insert(prefix.clone(), *price) {
                    Some(other) if other != *price => {
                        return Err(Error(format!(
                            "whatsapp.prices.{category} gives {prefix} {other} and \
                             broadcast.prices {price}: keep one"
                        )));
                    }
                    _ => {}
                }
            }
        }
        Ok(MessagePrices {
            by_category,
            currency,
        })
    }

    fn validate(&self) -> Result<(), Error> {
        for (name, window, cap) in [
            (
                "whatsapp",
                self.whatsapp.batch_window,
                self.whatsapp.batch_max_wait,
            ),
            (
                "webchat",
                self.webchat.batch_window,
                self.webchat.batch_max_wait,
            ),
        ] {
            if window > MAX_WINDOW {
                return Err(Error(format!(
                    "{name}.batch_window: {} is above the 300s limit",
                    humantime::format_duration(window)
                )));
            }
            if cap < window {
                return Err(Error(format!(
                    "{name}.batch_max_wait: {} is shorter than the batch window {}",
                    humantime::format_duration(cap),
                    humantime::format_duration(window)
                )));
            }
        }
        if self.engine.lease < Duration::from_secs(1) {
            return Err(Error(
                "engine.lease (SABI_LEASE): must be at least 1s".into(),
            ));
        }
        if self.engine.queued_review_after == Some(Duration::ZERO) {
            return Err(Error(
                "engine.queued_review_after (SABI_QUEUED_REVIEW_AFTER): 0 would send every batch \
                 to people; leave it unset to answer however long a batch queued"
                    .into(),
            ));
        }
        let budgets = std::iter::once(("llm", &self.llm.budget)).chain(
            self.llm
                .fallback
                .iter()
                .map(|f| ("llm.fallback", &f.budget)),
        );
        for (name, budget) in budgets {
            let zero = match budget {
                b if b.max_concurrent == 0 => Some("max_concurrent (SABI_LLM_MAX_CONCURRENT)"),
                b if b.requests_per_minute == Some(0) => Some("requests_per_minute (SABI_LLM_RPM)"),
                b if b.tokens_per_minute == Some(0) => Some("tokens_per_minute (SABI_LLM_TPM)"),
                _ => None,
            };
            if let Some(setting) = zero {
                return Err(Error(format!(
                    "{name}.{setting}: must be at least 1 (leave a per-minute limit unset for none)"
                )));
            }
        }
        if self.engine.turns_per_node == 0 {
            return Err(Error(
                "engine.turns_per_node (SABI_TURNS): must be at least 1".into(),
            ));
        }
        if self.engine.max_attempts == 0 {
            return Err(Error("engine.max_attempts: must be at least 1".into()));
        }
        if self.engine.poll_interval < Duration::from_millis(10) {
            return Err(Error("engine.poll_interval: must be at least 10ms".into()));
        }
        let ancestors = &self.webchat.frame_ancestors;
        if ancestors.trim().is_empty()
            || !ancestors.chars().all(|c| c.is_ascii_graphic() || c == ' ')
            || ancestors.contains([';', ','])
        {
            return Err(Error(
                "webchat.frame_ancestors: a space-separated list of origins (or * or 'none')"
                    .into(),
            ));
        }
        if !is_graph_version(&self.whatsapp.graph_version) {
            return Err(Error(format!(
                "whatsapp.graph_version (SABI_GRAPH_VERSION): {:?} is not a Graph API version \
                 like v24.0",
                self.whatsapp.graph_version
            )));
        }
        if self.whatsapp.outbound_rate == 0 {
            return Err(Error(
                "whatsapp.outbound_rate (SABI_OUTBOUND_RATE): must be at least 1".into(),
            ));
        }
        if let Some(code) = &self.whatsapp.default_country {
            // Written as digits, as the setting is shown and added to numbers.
            let why = match crate::phone::country_code(code) {
                Ok(digits) if digits == *code => None,
                Ok(digits) => Some(format!("write {code:?} as {digits}")),
                Err(why) => Some(why),
            };
            if let Some(why) = why {
                return Err(Error(format!(
                    "whatsapp.default_country (SABI_DEFAULT_COUNTRY): {why}"
                )));
            }
        }
        if self
            .admin
            .token
            .as_ref()
            .is_some_and(|t| t.expose_secret().trim().len() < 16)
        {
            return Err(Error(
                "admin.token (SABI_ADMIN_TOKEN): at least 16 characters, or unset to turn the admin API off".into(),
            ));
        }
        if self.llm.base_url.is_some() && self.llm.model.is_none() {
            return Err(Error(
                "llm.model (SABI_LLM_MODEL): required once llm.base_url is set".into(),
            ));
        }
        if self.whatsapp.sends_in_flight == 0 || self.whatsapp.send_max_failures == 0 {
            return Err(Error(
                "whatsapp.sends_in_flight and whatsapp.send_max_failures: must be at least 1"
                    .into(),
            ));
        }
        check_marketing_ttl(self.whatsapp.message_send_ttl_seconds)?;
        self.message_prices()?;
        self.handoff.validate()?;
        if self.whatsapp.max_reply_parts == 0 {
            return Err(Error("whatsapp.max_reply_parts: must be at least 1".into()));
        }
        if self.whatsapp.marketing_messages
            && !self.whatsapp.sandbox()
            && self.whatsapp.business_account_id.is_none()
        {
            return Err(Error(
                "whatsapp.marketing_messages (SABI_WHATSAPP_MARKETING_MESSAGES): needs whatsapp.business_account_id (SABI_WHATSAPP_BUSINESS_ACCOUNT_ID), whose template list tells which templates are MARKETING".into(),
            ));
        }
        if self.whatsapp.send_timeout < Duration::from_millis(100) {
            return Err(Error(
                "whatsapp.send_timeout (SABI_SEND_TIMEOUT): must be at least 100ms".into(),
            ));
        }
        if !self.whatsapp.sandbox() && self.whatsapp.app_secret.is_none() {
            return Err(Error(
                "whatsapp.app_secret (SABI_WHATSAPP_APP_SECRET): required once an access token is set".into(),
            ));
        }
        self.horizons()
            .check(!self.whatsapp.sandbox())
            .map_err(|why| Error(format!("{why} (SABI_RETENTION_DEDUPE)")))?;
        if self.retention.sweep_every < Duration::from_secs(1) {
            return Err(Error(
                "retention.sweep_every (SABI_SWEEP_EVERY): must be at least 1s".into(),
            ));
        }
        if self
            .broadcast
            .stop_offer
            .trim_end()
            .ends_with(['?', '\u{ff1f}'])
        {
            return Err(Error(
                "broadcast.stop_offer: must not end with a question mark (a bare STOP after it \
                 would be taken for an answer again)"
                    .into(),
            ));
        }
        if self.ingress.max_body_bytes < 3 * 1024 * 1024 {
            return Err(Error(
                "ingress.max_body_bytes: must allow Meta's 3 MB webhooks".into(),
            ));
        }
        if !self.whatsapp.sandbox() && self.privacy.marker_secret.is_none() {
            return Err(Error(
                "privacy.marker_secret (SABI_MARKER_SECRET): required once an access token is set; a long random string kept outside the store, like `openssl rand -hex 32`".into(),
            ));
        }
        if self
            .privacy
            .marker_secret
            .iter()
            .chain(&self.privacy.previous_marker_secrets)
            .any(|s| s.expose_secret().trim().len() < 16)
        {
            return Err(Error(
                "privacy.marker_secret (SABI_MARKER_SECRET): at least 16 characters".into(),
            ));
        }
        let ingress = &self.ingress;
        if ingress.max_body_bytes_per_address < ingress.max_body_bytes {
            return Err(Error(
                "ingress.max_body_bytes_per_address: must be at least ingress.max_body_bytes"
                    .into(),
            ));
        }
        let at_least_one = [
            ("max_connections", ingress.max_connections),
            (
                "max_connections_per_address",
                ingress.max_connections_per_address,
            ),
            (
                "max_requests_per_connection",
                ingress.max_requests_per_connection,
            ),
            ("max_large_bodies", ingress.max_large_bodies),
        ];
        if let Some((name, _)) = at_least_one.iter().find(|(_, n)| *n == 0) {
            return Err(Error(format!("ingress.{name}: must be at least 1")));
        }
        for (name, value) in [
            ("header_timeout", ingress.header_timeout),
            ("body_timeout", ingress.body_timeout),
            ("write_timeout", ingress.write_timeout),
            ("max_connection_age", ingress.max_connection_age),
        ] {
            if value < Duration::from_secs(1) {
                return Err(Error(format!("ingress.{name}: must be at least 1s")));
            }
        }
        Ok(())
    }
}

/// Meta's range for a marketing message's time-to-live: 12 hours to 30 days.
pub const MARKETING_TTL_SECONDS: std::ops::RangeInclusive<u32> = 43_200..=2_592_000;

fn check_marketing_ttl(ttl: Option<u32>) -> Result<(), Error> {
    match ttl {
        Some(seconds) if !MARKETING_TTL_SECONDS.contains(&seconds) => Err(Error(format!(
            "whatsapp.message_send_ttl_seconds (SABI_WHATSAPP_MESSAGE_SEND_TTL_SECONDS): {seconds} is outside Meta's range for marketing messages, {} (12 hours) to {} (30 days)",
            MARKETING_TTL_SECONDS.start(),
            MARKETING_TTL_SECONDS.end()
        ))),
        _ => Ok(()),
    }
}

fn read_file(file: Option<&Path>) -> Result<toml::Table, Error> {
    let default = Path::new("sabi.toml");
    let path = match file {
        Some(path) => path,
        None if default.exists() => default,
        None => return Ok(toml::Table::new()),
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error(format!("cannot read {}: {e}", path.display())))?;
    text.parse::<toml::Table>()
        .map_err(|e| Error(format!("{}: {e}", path.display())))
}

/// Sets `a.b` in `table` to a string; typed deserialisation then parses it.
fn set_path(table: &mut toml::Table, key: &str, value: String) {
    match key.split_once('.') {
        None => {
            table.insert(key.to_owned(), toml::Value::String(value));
        }
        Some((head, rest)) => {
            let child = table
                .entry(head.to_owned())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !child.is_table() {
                *child = toml::Value::Table(toml::Table::new());
            }
            if let toml::Value::Table(child) = child {
                set_path(child, rest, value);
            }
        }
    }
}

fn policy(window: Duration, cap: Duration) -> BatchPolicy {
    BatchPolicy { window, cap }
}

impl Config {
    /// When and how customers far back in the queue are told to wait.
    pub fn hold_settings(&self) -> HoldSettings {
        HoldSettings {
            after: self.engine.hold_after,
            message: self.engine.hold_message.clone(),
            sandbox: self.whatsapp.sandbox(),
        }
    }

    /// How long each kind of data is kept.
    pub fn horizons(&self) -> Horizons {
        let r = &self.retention;
        Horizons {
            messages: r.messages,
            statuses: r.statuses,
            quarantine: r.quarantine,
            dedupe: r.dedupe,
        }
    }

    /// The scheduler's settings.
    pub fn engine_settings(&self) -> EngineSettings {
        EngineSettings {
            turns: self.engine.turns_per_node,
            lease: self.engine.lease,
            poll_interval: self.engine.poll_interval,
            shutdown_grace: self.engine.shutdown_grace,
            sandbox: self.whatsapp.sandbox(),
            quote_replies: self.whatsapp.quote_replies,
            max_reply_parts: self.whatsapp.max_reply_parts,
            log_customer_data: self.logging.customer_data,
            policy: EnginePolicy {
                max_attempts: self.engine.max_attempts,
                retry_base: self.engine.retry_base,
                review_after: self.engine.review_after,
                queued_review_after: self.engine.queued_review_after,
            },
        }
    }
}

impl Config {
    /// How broadcasts run.
    pub fn broadcast_settings(&self) -> BroadcastSettings {
        BroadcastSettings {
            cooldown: self.broadcast.cooldown,
            max_holds: self.broadcast.max_holds,
            messaging_limit: self.whatsapp.messaging_limit,
            number_rate: self.whatsapp.outbound_rate,
        }
    }

    /// How broadcasts use Meta's Marketing Messages API.
    pub fn marketing_settings(&self) -> MarketingSettings {
        MarketingSettings {
            on: self.whatsapp.marketing_messages,
            ttl_seconds: self.whatsapp.message_send_ttl_seconds,
            account: self.whatsapp.business_account_id.clone(),
        }
    }

    /// The sender's settings.
    pub fn sender_settings(&self) -> SenderSettings {
        let w = &self.whatsapp;
        SenderSettings {
            rate: w.outbound_rate,
            pair_spacing: w.pair_spacing,
            // A claimed part waits for its pacing slot behind at most every other send in
            // flight on its number (a throttled number is not claimed from); twice that and 5 s
            // more. A claim that lapses costs nothing: the part was never sent.
            lease: Duration::from_secs(5)
                + Duration::from_secs_f64(
                    2.0 * w.sends_in_flight as f64 / f64::from(w.outbound_rate.max(1)),
                ),
            // A departed send ends within send_timeout; twice that leaves time to record it.
            send_lease: w.send_timeout.saturating_mul(2),
            unknown_wait: w.unknown_outcome_wait,
            max_failures: w.send_max_failures,
            retry_base: w.send_retry_base,
            window: Duration::from_secs(24 * 3600),
            template: w.window_template.clone(),
            in_flight: w.sends_in_flight,
            poll_interval: self.engine.poll_interval,
            shutdown_grace: self.engine.shutdown_grace,
        }
    }
}

impl WebchatConfig {
    pub fn batch_policy(&self) -> BatchPolicy {
        policy(self.batch_window, self.batch_max_wait)
    }
}

/// Durations written like `250ms`, `20s`, `15m`, or a number of seconds.
pub(crate) mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, de};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Spec {
        Seconds(u64),
        Text(String),
    }

    pub(crate) fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    /// An optional duration: unset is `None`.
    pub(crate) mod option {
        use std::time::Duration;

        use serde::Deserializer;

        pub(crate) fn serialize<S: serde::Serializer>(
            d: &Option<Duration>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => super::serialize(d, s),
                None => s.serialize_none(),
            }
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Duration>, D::Error> {
            super::deserialize(d).map(Some)
        }
    }

    /// No setting needs longer, and every sum and date Sabi makes of two settings and the
    /// time now stays far from overflowing.
    pub(crate) const LONGEST: Duration = Duration::from_secs(100 * 365 * 86_400);

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let parsed = match Spec::deserialize(d)? {
            Spec::Seconds(s) => Duration::from_secs(s),
            Spec::Text(t) if t.trim() == "0" => Duration::ZERO,
            Spec::Text(t) => humantime::parse_duration(t.trim()).map_err(|e| {
                de::Error::custom(format!(
                    "invalid duration {t:?} ({e}); write it like 250ms, 20s or 15m"
                ))
            })?,
        };
        if parsed > LONGEST {
            return Err(de::Error::custom(format!(
                "the duration {} is longer than any setting allows (100 years)",
                humantime::format_duration(parsed)
            )));
        }
        Ok(parsed)
    }
}

/// Switches that may come from the environment as text.
mod flag {
    use serde::{Deserialize, Deserializer, de};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Spec {
        Flag(bool),
        Text(String),
    }

    pub(super) fn parse<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
        match Spec::deserialize(d)? {
            Spec::Flag(on) => Ok(on),
            Spec::Text(t) => match t.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => Ok(true),
                "false" | "0" | "no" | "off" => Ok(false),
                _ => Err(de::Error::custom(format!(
                    "invalid switch {t:?}: true or false"
                ))),
            },
        }
    }
}

/// Numbers that may come from the environment as text.
mod number {
    use serde::{Deserialize, Deserializer, de};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Spec {
        Number(u64),
        Text(String),
    }

    fn parse<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        match Spec::deserialize(d)? {
            Spec::Number(n) => Ok(n),
            Spec::Text(t) => t
                .trim()
                .parse()
                .map_err(|_| de::Error::custom(format!("invalid number {t:?}"))),
        }
    }

    pub(super) fn u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        u32::try_from(parse(d)?).map_err(|_| de::Error::custom("number too large"))
    }

    pub(super) fn usize<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
        usize::try_from(parse(d)?).map_err(|_| de::Error::custom("number too large"))
    }

    pub(super) fn option_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
        u32(d).map(Some)
    }
}

/// Lists of names given as a list, or as one comma-separated string (from the environment).
mod names {
    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Spec {
        List(Vec<String>),
        Text(String),
    }

    pub(super) fn option_list<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<String>>, D::Error> {
        Ok(Some(match Spec::deserialize(d)? {
            Spec::List(names) => names,
            Spec::Text(text) => text
                .split(',')
                .map(str::trim)
                .filter(|name| !name.is_empty())
                .map(str::to_owned)
                .collect(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn no_file() -> Option<&'static Path> {
        // An explicit empty file keeps a developer's ./sabi.toml out of the tests.
        Some(Path::new("/dev/null"))
    }

    #[test]
    fn defaults_match_the_design() {
        let c = Config::load(no_file(), env(&[])).expect("defaults are valid");
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.store, StoreConfig::default());
        assert_eq!(c.whatsapp.batch_window, Duration::from_secs(20));
        assert_eq!(c.whatsapp.batch_max_wait, Duration::from_secs(60));
        assert_eq!(c.webchat.batch_window, Duration::ZERO);
        assert_eq!(c.engine.lease, Duration::from_secs(120));
        assert_eq!(c.engine.review_after, Duration::from_secs(900));
        assert_eq!(c.whatsapp.outbound_rate, 80);
        assert!(c.whatsapp.sandbox());
    }

    #[test]
    fn router_packs_come_as_a_list_or_from_the_environment_as_commas() {
        let from_env =
            Config::load(no_file(), env(&[("SABI_ROUTER_PACKS", " shop, telco,")])).expect("valid");
        assert_eq!(
            from_env.router.packs,
            Some(vec!["shop".to_owned(), "telco".to_owned()])
        );
        let table: toml::Table = toml::from_str("[router]\npacks = [\"bank\"]").expect("toml");
        let from_file = Config::deserialize(toml::Value::Table(table)).expect("valid");
        assert_eq!(from_file.router.packs, Some(vec!["bank".to_owned()]));
        let unset = Config::load(no_file(), env(&[])).expect("valid");
        assert_eq!(unset.router.packs, None, "every pack on");
    }

    #[test]
    fn broadcast_prices_count_as_marketing_prices_and_a_conflict_is_refused() {
        let read = |text: &str| {
            let table: toml::Table = toml::from_str(text).expect("toml");
            Config::deserialize(toml::Value::Table(table))
                .expect("valid")
                .message_prices()
        };
        let prices = read(
            "[whatsapp.prices]\nutility = { \"234\" = 0.0067 }\n\
             [broadcast]\nprices = { \"234\" = 0.0516 }\ncurrency = \"USD\"",
        )
        .expect("valid");
        assert_eq!(prices.of("marketing", "2348"), Some(0.0516));
        assert_eq!(prices.of("marketing_lite", "2348"), Some(0.0516));
        assert_eq!(prices.of("utility", "2348"), Some(0.0067));
        assert_eq!(prices.of("utility", "4477"), None);
        assert_eq!(prices.currency, "USD");
        let refused = |text: &str, says: &str| {
            let e = read(text).expect_err(text).to_string();
            assert!(e.contains(says), "{e}");
        };
        refused(
            "[whatsapp.prices]\nmarketing = { \"234\" = 0.05 }\n[broadcast]\nprices = { \"234\" = 0.0516 }",
            "whatsapp.prices.marketing gives 234 0.05 and broadcast.prices 0.0516",
        );
        refused(
            "[whatsapp.prices]\nutilty = { \"234\" = 0.05 }",
            "\"utilty\" is not one of Meta's pricing categories",
        );
        refused(
            "[whatsapp.prices]\nutility = { \"+234\" = 0.05 }",
            "neither a country prefix",
        );
        refused(
            "[whatsapp]\ncurrency = \"NGN\"\n[broadcast]\nprices = { \"234\" = 0.05 }",
            "the two must agree",
        );
    }

    /// Each default is written once, in a `Default` impl that serde fills missing keys from:
    /// a file without a section, one with the section empty, and the code's `Default` agree.
    #[test]
    fn an_empty_file_and_empty_sections_read_as_the_defaults() {
        let read = |table: toml::Table| {
            Config::deserialize(toml::Value::Table(table)).unwrap_or_else(|e| panic!("{e}"))
        };
        let want = format!("{:#?}", Config::default());
        assert_eq!(format!("{:#?}", read(toml::Table::new())), want);
        let defaults = toml::Table::try_from(Config::default()).expect("serialise");
        let sections: Vec<&String> = defaults
            .iter()
            .filter(|(_, value)| value.is_table())
            .map(|(name, _)| name)
            .collect();
        assert!(sections.iter().any(|s| *s == "llm"), "{sections:?}");
        for section in sections {
            let mut table = toml::Table::new();
            table.insert(section.clone(), toml::Value::Table(toml::Table::new()));
            assert_eq!(format!("{:#?}", read(table)), want, "[{section}]");
        }
        // The tables with required keys take the same defaults as the rest.
        let c = read(
            "[llm.fallback]\nbase_url = \"u\"\nmodel = \"m\"\n\
             [external_agent]\nurl = \"u\"\nsecret = \"s\"\n"
                .parse()
                .expect("toml"),
        );
        assert_eq!(
            c.llm.fallback.expect("fallback").budget,
            LlmBudget::default()
        );
        let agent = c.external_agent.expect("external agent");
        assert_eq!(agent.timeout, LlmConfig::default().turn_timeout);
    }

    #[test]
    fn environment_overrides_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("sabi.toml");
        std::fs::write(
            &file,
            "listen = \"127.0.0.1:9000\"\n[whatsapp]\nbatch_window = \"5s\"\n",
        )
        .expect("write");
        let c = Config::load(
            Some(&file),
            env(&[
                ("SABI_BATCH_WINDOW", "250ms"),
                ("SABI_STORE", "sqlite:///tmp/x.db"),
                ("SABI_OUTBOUND_RATE", "20"),
                ("SABI_UNRELATED", "x"),
            ]),
        )
        .expect("valid");
        assert_eq!(c.listen.port(), 9000);
        assert_eq!(c.whatsapp.batch_window, Duration::from_millis(250));
        assert_eq!(
            c.store,
            StoreConfig::Sqlite {
                path: "/tmp/x.db".into()
            }
        );
        assert_eq!(c.whatsapp.outbound_rate, 20);
    }

    #[test]
    fn the_graph_version_follows_the_base_unless_the_base_names_one() {
        let mut whatsapp = WhatsappConfig::default();
        assert_eq!(whatsapp.graph_base(), "https://graph.facebook.com/v24.0");
        whatsapp.graph_version = "v25.0".into();
        assert_eq!(whatsapp.graph_base(), "https://graph.facebook.com/v25.0");
        // A base written with its version, as before the setting, keeps it.
        whatsapp.api_base = "http://127.0.0.1:9/v23.0/".into();
        assert_eq!(whatsapp.graph_base(), "http://127.0.0.1:9/v23.0");
        for version in ["v24.0", "v3.2"] {
            assert!(is_graph_version(version), "{version}");
        }
        for not in ["24.0", "v24", "vX.0", "v24.0.1", "v.1", "latest"] {
            assert!(!is_graph_version(not), "{not}");
        }
    }

    #[test]
    fn bad_values_name_the_setting() {
        let cases = [
            (
                vec![("SABI_BATCH_WINDOW", "soon")],
                "whatsapp.batch_window (from SABI_BATCH_WINDOW)",
            ),
            (
                vec![("SABI_LISTEN", "nowhere")],
                "listen (from SABI_LISTEN)",
            ),
            (vec![("SABI_STORE", "mysql://x")], "store (from SABI_STORE)"),
            (vec![("SABI_ADMIN_TOKEN", "")], "admin.token"),
            (vec![("SABI_ADMIN_TOKEN", "short")], "admin.token"),
            (
                vec![("SABI_DEFAULT_COUNTRY", "NG")],
                "whatsapp.default_country (SABI_DEFAULT_COUNTRY): \"NG\" is not a country",
            ),
            (
                vec![("SABI_DEFAULT_COUNTRY", "+234")],
                "whatsapp.default_country (SABI_DEFAULT_COUNTRY): write \"+234\" as 234",
            ),
            (
                vec![("SABI_OUTBOUND_RATE", "fast")],
                "whatsapp.outbound_rate",
            ),
            (
                vec![("SABI_GRAPH_VERSION", "latest")],
                "whatsapp.graph_version (SABI_GRAPH_VERSION): \"latest\" is not a Graph API version",
            ),
            (vec![("SABI_BATCH_WINDOW", "301s")], "whatsapp.batch_window"),
            (
                vec![("SABI_BATCH_WINDOW", "30s"), ("SABI_BATCH_MAX_WAIT", "10s")],
                "whatsapp.batch_max_wait",
            ),
            (
                vec![("SABI_WHATSAPP_ACCESS_TOKEN", "t")],
                "SABI_WHATSAPP_APP_SECRET",
            ),
            (
                vec![("SABI_RETENTION_MESSAGES", "forever")],
                "retention.messages (from SABI_RETENTION_MESSAGES)",
            ),
            (vec![("SABI_SWEEP_EVERY", "0s")], "retention.sweep_every"),
            (
                vec![("SABI_RETENTION_MESSAGES", "18446744073709551615s")],
                "retention.messages (from SABI_RETENTION_MESSAGES)",
            ),
            (
                vec![("SABI_RETENTION_DEDUPE", "100000000000d")],
                "retention.dedupe (from SABI_RETENTION_DEDUPE)",
            ),
            (
                // Once replies reach WhatsApp, the horizons are added together.
                vec![
                    ("SABI_WHATSAPP_ACCESS_TOKEN", "t"),
                    ("SABI_WHATSAPP_APP_SECRET", "s"),
                    ("SABI_RETENTION_MESSAGES", "18446744073709551615s"),
                ],
                "retention.messages (from SABI_RETENTION_MESSAGES)",
            ),
            (
                vec![("SABI_REVIEW_AFTER", "200years")],
                "engine.review_after (from SABI_REVIEW_AFTER)",
            ),
            (
                vec![
                    ("SABI_WHATSAPP_ACCESS_TOKEN", "t"),
                    ("SABI_WHATSAPP_APP_SECRET", "s"),
                    ("SABI_RETENTION_MESSAGES", "1d"),
                    ("SABI_RETENTION_DEDUPE", "1d"),
                ],
                "retention.dedupe",
            ),
        ];
        for (vars, want) in cases {
            let err = Config::load(no_file(), env(&vars))
                .expect_err("invalid")
                .to_string();
            assert!(err.contains(want), "{vars:?}: {err}");
        }
    }

    #[test]
    fn the_marketing_messages_api_is_off_until_switched_on_and_its_ttl_is_in_meta_s_range() {
        let c = Config::load(no_file(), env(&[])).expect("defaults");
        assert!(
            !c.whatsapp.marketing_messages,
            "off until Meta's terms are accepted"
        );
        assert_eq!(c.whatsapp.message_send_ttl_seconds, None);
        let c = Config::load(
            no_file(),
            env(&[
                ("SABI_WHATSAPP_MARKETING_MESSAGES", "true"),
                ("SABI_WHATSAPP_MESSAGE_SEND_TTL_SECONDS", "43200"),
            ]),
        )
        .expect("on, with a 12-hour TTL");
        let marketing = c.marketing_settings();
        assert!(marketing.on);
        assert_eq!(marketing.ttl_seconds, Some(43_200));
        for (vars, want) in [
            (
                vec![("SABI_WHATSAPP_MARKETING_MESSAGES", "maybe")],
                "whatsapp.marketing_messages (from SABI_WHATSAPP_MARKETING_MESSAGES)",
            ),
            (
                vec![("SABI_WHATSAPP_MESSAGE_SEND_TTL_SECONDS", "43199")],
                "whatsapp.message_send_ttl_seconds (SABI_WHATSAPP_MESSAGE_SEND_TTL_SECONDS): 43199 is outside",
            ),
            (
                vec![("SABI_WHATSAPP_MESSAGE_SEND_TTL_SECONDS", "2592001")],
                "2592001 is outside Meta's range for marketing messages, 43200 (12 hours) to 2592000 (30 days)",
            ),
            (
                vec![
                    ("SABI_WHATSAPP_ACCESS_TOKEN", "t"),
                    ("SABI_WHATSAPP_APP_SECRET", "s"),
                    ("SABI_MARKER_SECRET", "m"),
                    ("SABI_WHATSAPP_MARKETING_MESSAGES", "true"),
                ],
                "whatsapp.marketing_messages (SABI_WHATSAPP_MARKETING_MESSAGES): needs whatsapp.business_account_id",
            ),
        ] {
            let err = Config::load(no_file(), env(&vars))
                .expect_err("invalid")
                .to_string();
            assert!(err.contains(want), "{vars:?}: {err}");
        }
    }

    #[test]
    fn the_marker_secret_is_required_once_sending_and_made_beside_a_sandbox_store() {
        let sending = [
            ("SABI_WHATSAPP_ACCESS_TOKEN", "t"),
            ("SABI_WHATSAPP_APP_SECRET", "s"),
        ];
        let err = Config::load(no_file(), env(&sending)).expect_err("no marker secret");
        assert!(err.to_string().contains("privacy.marker_secret"), "{err}");
        let short = [("SABI_MARKER_SECRET", "short")];
        let err = Config::load(no_file(), env(&short)).expect_err("too short");
        assert!(err.to_string().contains("16 characters"), "{err}");

        let dir = tempfile::tempdir().expect("tempdir");
        let store = format!("sqlite://{}", dir.path().join("data/sabi.db").display());
        let sandbox =
            Config::load(no_file(), env(&[("SABI_STORE", store.as_str())])).expect("sandbox");
        let (made, _) = sandbox.marker_secrets().expect("made");
        let file = dir.path().join("data").join(SANDBOX_MARKER_SECRET_FILE);
        assert_eq!(
            std::fs::read_to_string(&file).expect("kept"),
            made.expose_secret()
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&file).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            let dir = std::fs::metadata(dir.path().join("data")).expect("meta");
            assert_eq!(dir.permissions().mode() & 0o777, 0o700);
        }
        let (again, _) = sandbox.marker_secrets().expect("read back");
        assert_eq!(again.expose_secret(), made.expose_secret());

        let shared = [("SABI_STORE", "postgres://sabi@db/sabi")];
        let on_postgres = Config::load(no_file(), env(&shared)).expect("loads");
        assert!(
            on_postgres.marker_secrets().is_err(),
            "no file beside a server"
        );
        let set = [
            ("SABI_STORE", "postgres://sabi@db/sabi"),
            ("SABI_MARKER_SECRET", "a-marker-secret-for-tests"),
        ];
        let (secret, _) = Config::load(no_file(), env(&set))
            .expect("loads")
            .marker_secrets()
            .expect("configured");
        assert_eq!(secret.expose_secret(), "a-marker-secret-for-tests");
    }

    #[test]
    fn short_horizons_are_for_sandbox_mode_or_long_enough_content() {
        let short = [
            ("SABI_RETENTION_MESSAGES", "30s"),
            ("SABI_RETENTION_DEDUPE", "1m"),
            ("SABI_SWEEP_EVERY", "1s"),
        ];
        let c = Config::load(no_file(), env(&short)).expect("sandbox mode takes any horizon");
        assert_eq!(c.horizons().messages, Duration::from_secs(30));
        let sending = [
            ("SABI_WHATSAPP_ACCESS_TOKEN", "t"),
            ("SABI_WHATSAPP_APP_SECRET", "s"),
            ("SABI_MARKER_SECRET", "a-marker-secret-for-tests"),
            ("SABI_RETENTION_MESSAGES", "7d"),
            ("SABI_RETENTION_DEDUPE", "1h"),
        ];
        Config::load(no_file(), env(&sending)).expect("the content keeps the key long enough");
        let c = Config::load(no_file(), env(&[])).expect("defaults");
        assert_eq!(c.horizons(), Horizons::default());
    }

    #[test]
    fn unknown_file_keys_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("sabi.toml");
        std::fs::write(&file, "[whatsapp]\nbatch_windw = \"5s\"\n").expect("write");
        let err = Config::load(Some(&file), env(&[]))
            .expect_err("typo")
            .to_string();
        assert!(err.contains("batch_windw"), "{err}");
    }

    #[test]
    fn store_as_a_table() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("sabi.toml");
        let load = |text: &str| {
            std::fs::write(&file, text).expect("write");
            Config::load(Some(&file), env(&[])).map(|c| c.store)
        };
        let sqlite = load("store = { kind = \"sqlite\", path = \"data/s.db\" }\n");
        assert_eq!(
            sqlite.expect("valid"),
            StoreConfig::Sqlite {
                path: "data/s.db".into()
            }
        );
        let redis =
            load("store = { kind = \"redis\", url = \"redis://cache:6379/0?prefix=shop\" }\n");
        assert_eq!(
            redis.expect("valid"),
            StoreConfig::Redis {
                url: "redis://cache:6379/0?prefix=shop".into()
            }
        );
        assert!(load("store = { kind = \"redis\", url = \"postgres://db/sabi\" }\n").is_err());
    }
}
