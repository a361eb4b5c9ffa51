//! The sender's settings: pacing, retries, and the customer service window.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// How the sender runs, typed once from configuration.
#[derive(Debug, Clone)]
pub struct SenderSettings {
    /// Requests per second per business number.
    pub rate: u32,
    /// The least time between two messages to one customer.
    pub pair_spacing: Duration,
    /// How long a claimed part is held while it waits for its pacing slot; unsent then (its
    /// sender died, or the wait ran long), it goes back to the queue for any sender.
    pub lease: Duration,
    /// How long a departed send is held: past it, a sender that died mid-request leaves the
    /// part unknown. Longer than a request may take (`send_timeout`).
    pub send_lease: Duration,
    /// How long an unknown outcome waits for its status webhook before review.
    pub unknown_wait: Duration,
    /// Failed tries before a part goes to review (throttling answers do not count).
    pub max_failures: u32,
    /// The first wait after a failure; doubled after each further one.
    pub retry_base: Duration,
    /// The customer service window: 24 hours.
    pub window: Duration,
    /// Sent instead of a reply outside the window; review when unset.
    pub template: Option<Template>,
    /// Sends in flight at once on this node.
    pub in_flight: usize,
    /// How often the store is asked for parts other nodes wrote.
    pub poll_interval: Duration,
    /// How long sends in flight may take to end at shutdown.
    pub shutdown_grace: Duration,
}

/// A template, sent when the customer service window has closed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Template {
    pub name: String,
    /// Its language code, like `en_US`.
    pub language: String,
    /// Body parameters, in order (positional).
    #[serde(default)]
    pub parameters: Vec<String>,
}

/// How broadcasts run, typed once from configuration.
#[derive(Debug, Clone, Copy)]
pub struct BroadcastSettings {
    /// A customer sent a broadcast this recently is skipped by the next.
    pub cooldown: Duration,
    /// Holds for Meta's marketing limit per user (131049) before a recipient fails.
    pub max_holds: u32,
    pub messaging_limit: MessagingLimit,
    /// The number's pace, messages a second, which broadcasts share with replies: a broadcast
    /// asked to go faster goes at this.
    pub number_rate: u32,
}

/// Meta's messaging limit: how many unique customers business-initiated messages may reach in
/// a rolling 24 hours (250, 2,000, 10,000, 100,000, or unlimited); `None` is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessagingLimit(pub Option<u64>);

/// As `sabi.toml` writes it: `250`, or `"unlimited"`.
impl std::fmt::Display for MessagingLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(n) => write!(f, "{n}"),
            None => f.write_str("\"unlimited\""),
        }
    }
}

impl Serialize for MessagingLimit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(n) => s.serialize_u64(n),
            None => s.serialize_str("unlimited"),
        }
    }
}

impl<'de> Deserialize<'de> for MessagingLimit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Spec {
            Number(u64),
            Text(String),
        }
        let limit = match Spec::deserialize(d)? {
            Spec::Number(n) => n,
            Spec::Text(t) if t.trim().eq_ignore_ascii_case("unlimited") => {
                return Ok(MessagingLimit(None));
            }
            Spec::Text(t) => t.trim().parse().map_err(|_| {
                de::Error::custom(format!("{t:?}: a number of customers, or \"unlimited\""))
            })?,
        };
        if limit == 0 {
            return Err(de::Error::custom("at least 1 customer, or \"unlimited\""));
        }
        Ok(MessagingLimit(Some(limit)))
    }
}

/// Meta's Marketing Messages API for broadcasts, typed once from configuration.
#[derive(Debug, Clone, Default)]
pub struct MarketingSettings {
    /// MARKETING templates go to `/marketing_messages`; off, every send goes to `/messages`.
    pub on: bool,
    /// Meta's `message_send_ttl_seconds` for those sends, when set.
    pub ttl_seconds: Option<u32>,
    /// The business account whose template list tells a template's category.
    pub account: Option<String>,
}
