//! Domain types shared by every stage: channels, conversations, and the inbound items that
//! the ingress hands to the store.
//!
//! An [`InboundItem`] is one normalised fact from a delivery: a customer's message, a status of
//! a message Sabi sent, a value-level error, or a non-message field event. Its `facts` are the
//! normalised view operators and outside tests read back (`sabi inbox --json`); the other fields
//! are what the store indexes on.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::{At, UnixSeconds};

/// Where a message came from. Part of every deduplication key and conversation key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    Whatsapp,
    Webchat,
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Whatsapp => "whatsapp",
            Channel::Webchat => "webchat",
        }
    }

    pub fn parse(s: &str) -> Option<Channel> {
        [Channel::Whatsapp, Channel::Webchat]
            .into_iter()
            .find(|c| c.as_str() == s)
    }
}

/// A conversation is one customer talking to one business number on one channel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConversationKey {
    pub channel: Channel,
    /// For WhatsApp, the business `phone_number_id` (the routing key for replies).
    pub business: String,
    /// The customer's phone number, or their business-scoped user id when no number is given.
    pub customer: String,
}

/// What kind of fact an inbound item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    Message,
    Status,
    ValueError,
    FieldEvent,
    /// A message the business sent outside Sabi: typed by a person in the WhatsApp Business
    /// app on the same number (coexistence). The business's reply, never a turn.
    Echo,
}

impl ItemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ItemKind::Message => "message",
            ItemKind::Status => "status",
            ItemKind::ValueError => "value_error",
            ItemKind::FieldEvent => "field_event",
            ItemKind::Echo => "echo",
        }
    }

    pub fn parse(s: &str) -> Option<ItemKind> {
        use ItemKind::*;
        [Message, Status, ValueError, FieldEvent, Echo]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// One normalised inbound fact, ready to be stored.
#[derive(Debug, Clone, PartialEq)]
pub struct InboundItem {
    pub kind: ItemKind,
    pub channel: Channel,
    /// Unique per channel: the wamid for messages, `wamid:status` for statuses, a content hash
    /// for errors and field events. Redeliveries carry the same key.
    pub dedupe_key: String,
    pub business: Option<String>,
    pub customer: Option<String>,
    /// The message type (`text`, `image`, ...), the status value, or the field name.
    pub item_type: Option<String>,
    /// The human-readable text a bot should read (body, caption, button title, ...).
    pub text: Option<String>,
    pub media_id: Option<String>,
    /// When the customer sent it, by the provider's clock.
    pub provider_ts: Option<UnixSeconds>,
    /// Set when the item asks for a turn: the conversation it wakes.
    pub turn: Option<ConversationKey>,
    /// Every other normalised fact, as one JSON object (the text is kept once, above).
    pub facts: serde_json::Value,
}

/// A piece of a signed delivery that Sabi could not understand, kept raw so nothing is lost.
#[derive(Debug, Clone, PartialEq)]
pub struct Quarantined {
    pub channel: Channel,
    pub reason: String,
    pub raw: String,
}

/// When a conversation's batch becomes due, per channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPolicy {
    /// Due this long after the latest pending message...
    pub window: Duration,
    /// ...but never later than this long after the first.
    pub cap: Duration,
}

/// How long Meta retries a webhook it could not deliver.
pub const META_RETRIES: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// How long each kind of data is kept (`[retention]`; the store's rulebook says what each
/// covers and how it goes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Horizons {
    /// Messages, reply bodies, settled review items, web-chat history and jobs, turns.
    pub messages: Duration,
    /// Statuses and the other recorded items.
    pub statuses: Duration,
    /// Quarantined raw bodies.
    pub quarantine: Duration,
    /// How long a message's key outlives its content.
    pub dedupe: Duration,
}

impl Default for Horizons {
    fn default() -> Self {
        const DAY: u64 = 24 * 60 * 60;
        Horizons {
            messages: Duration::from_secs(90 * DAY),
            statuses: Duration::from_secs(30 * DAY),
            quarantine: Duration::from_secs(30 * DAY),
            dedupe: Duration::from_secs(8 * DAY),
        }
    }
}

impl Horizons {
    /// Whether a message's key lives long enough for Meta's retries: it lasts `messages` with
    /// its content and `dedupe` after. Shorter than [`META_RETRIES`], a retry could come after
    /// it went and be answered again: refused when replies go to WhatsApp, allowed in sandbox
    /// mode (nothing reaches a customer), where short trials see retention work.
    ///
    /// # Errors
    /// A sentence naming `retention.dedupe` when the key would go too soon.
    pub fn check(&self, replies_reach_whatsapp: bool) -> Result<(), String> {
        if replies_reach_whatsapp && self.messages + self.dedupe < META_RETRIES {
            return Err(format!(
                "retention.dedupe: a message's key must outlive Meta's {} days of webhook \
                 retries, or a late retry is answered again; retention.messages ({}) and \
                 retention.dedupe ({}) together keep it only that long (the default dedupe is 8d)",
                META_RETRIES.as_secs() / 86_400,
                humantime::format_duration(self.messages),
                humantime::format_duration(self.dedupe),
            ));
        }
        Ok(())
    }
}

/// One of the customer's messages inside a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchMessage {
    /// Arrival order in the store: breaks ties between equal provider timestamps.
    pub seq: i64,
    pub external_id: String,
    pub item_type: Option<String>,
    pub text: Option<String>,
    pub media_id: Option<String>,
    /// When the customer sent it, by the provider's clock, if known.
    pub provider_ts: Option<UnixSeconds>,
    pub received_at: At,
    /// For a web visitor whose site vouched for them (`user_id` with a valid `user_hash`), that
    /// user id; `None` for an anonymous visitor and on WhatsApp, where Meta names the sender.
    pub user: Option<String>,
    /// For an anonymous web visitor, the client address the question came from, so that the
    /// desk can fold one address's repeated hand-offs into one.
    pub address: Option<String>,
}

impl BatchMessage {
    /// When the customer sent it, as well as Sabi knows: the provider's time, else arrival.
    pub fn sent_at(&self) -> At {
        sent_at(self.provider_ts, self.received_at)
    }
}

/// Every pending message of one conversation at claim time, in the order the customer sent them.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub id: i64,
    pub conversation: ConversationKey,
    pub messages: Vec<BatchMessage>,
    /// When the batch became due: the scheduling delay is measured from here.
    pub due_at: At,
    /// Until when a person holds the conversation: they replied to the customer lately, and
    /// the assistant stands down (the store's rulebook, `rules::review::person_holds`).
    pub held_until: Option<At>,
}

impl Batch {
    /// Who is talking, as far as anyone vouched for it. A web batch is a verified user only
    /// when every message of it was vouched for as the same user.
    pub fn identity(&self) -> Identity {
        match self.conversation.channel {
            Channel::Whatsapp => Identity::Whatsapp(self.conversation.customer.clone()),
            Channel::Webchat => {
                let mut users = self.messages.iter().map(|m| m.user.as_deref());
                match users.next().flatten() {
                    Some(first) if users.all(|u| u == Some(first)) => {
                        Identity::Web(first.to_owned())
                    }
                    _ => Identity::Anonymous,
                }
            }
        }
    }

    /// When the customer sent the first message of the batch.
    pub fn first_sent_at(&self) -> At {
        self.messages
            .iter()
            .map(BatchMessage::sent_at)
            .min()
            .unwrap_or(self.due_at)
    }
}

/// When a customer sent a message, as well as Sabi knows: the provider's time, but never later
/// than it reached Sabi (a phone's clock may run ahead).
pub fn sent_at(provider: Option<UnixSeconds>, received: At) -> At {
    provider.map_or(received, |sent| sent.at().min(received))
}

/// The verified identity of the person a turn answers: what tools may act for. Never taken
/// from what a model or a visitor's text says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A WhatsApp customer: the number (or business-scoped id) Meta sent the message from.
    Whatsapp(String),
    /// A web visitor whose site signed their user id.
    Web(String),
    /// A web visitor nobody vouched for.
    Anonymous,
}

impl Identity {
    /// The customer id tools are given, if anyone vouched for one.
    pub fn customer(&self) -> Option<&str> {
        match self {
            Identity::Whatsapp(id) | Identity::Web(id) => Some(id),
            Identity::Anonymous => None,
        }
    }

    /// As tools receive it in `X-Sabi-Customer`: `whatsapp:<number>`, `web:<user_id>` or
    /// `anonymous`.
    pub fn header(&self) -> String {
        match self {
            Identity::Whatsapp(id) => format!("whatsapp:{id}"),
            Identity::Web(id) => format!("web:{id}"),
            Identity::Anonymous => "anonymous".to_owned(),
        }
    }
}

/// The fencing token of a lease: every write a turn makes carries it, and the store refuses a
/// token that is no longer the batch's latest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseToken(pub i64);

/// A batch handed to a worker under a lease.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub batch: Batch,
    pub token: LeaseToken,
    /// 1 for the first try; every claim of the same batch counts one more.
    pub attempt: u32,
    /// A person sent these messages back to the agent: answer them however old they are.
    pub requeued: bool,
}

/// One part of a reply, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplyPart {
    pub text: String,
    /// Quick replies offered under the text (WhatsApp: up to 3 buttons, or a list of up to 10).
    pub options: Vec<String>,
    /// The customer's message this part quotes (its external id).
    pub quote: Option<String>,
}

impl ReplyPart {
    pub fn text(text: impl Into<String>) -> ReplyPart {
        ReplyPart {
            text: text.into(),
            ..ReplyPart::default()
        }
    }
}

/// Why a batch went to a person instead of an automatic reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReviewReason {
    /// The first message is older than the age limit: an automatic reply would come too late.
    TooOld,
    /// Every attempt failed.
    OutOfRetries,
    /// The turn handed the conversation to a person (the customer asked, or the intent says so).
    HandoffAsked,
    /// A send's outcome stayed unknown (no status webhook named it in time): it may or may not
    /// have reached the customer, so it is not sent again automatically.
    UnknownOutcome,
    /// The customer service window had closed and no template is configured.
    WindowClosed,
    /// Meta refused the send for good, or it ran out of tries.
    SendFailed,
    /// The model's answers were not fit to send (markup, JSON, cut off, ...), also after a
    /// corrective retry and the fallback provider.
    ModelOutput,
    /// A person answered the customer lately (from the desk, the admin API or the WhatsApp
    /// Business app): the assistant stands down, and what the customer writes goes to them.
    PersonAnswering,
}

impl ReviewReason {
    pub const ALL: [ReviewReason; 8] = [
        ReviewReason::TooOld,
        ReviewReason::OutOfRetries,
        ReviewReason::HandoffAsked,
        ReviewReason::UnknownOutcome,
        ReviewReason::WindowClosed,
        ReviewReason::SendFailed,
        ReviewReason::ModelOutput,
        ReviewReason::PersonAnswering,
    ];

    pub fn parse(name: &str) -> Option<ReviewReason> {
        ReviewReason::ALL.into_iter().find(|r| r.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ReviewReason::TooOld => "too_old",
            ReviewReason::OutOfRetries => "out_of_retries",
            ReviewReason::HandoffAsked => "handoff_asked",
            ReviewReason::UnknownOutcome => "unknown_outcome",
            ReviewReason::WindowClosed => "window_closed",
            ReviewReason::SendFailed => "send_failed",
            ReviewReason::ModelOutput => "model_output",
            ReviewReason::PersonAnswering => "person_answering",
        }
    }
}

impl std::fmt::Display for ReviewReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ReviewReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn a_key_must_outlive_metas_retries_when_replies_reach_whatsapp() {
        let defaults = Horizons::default();
        assert!(defaults.check(true).is_ok());
        let short = Horizons {
            messages: DAY,
            dedupe: DAY,
            ..defaults
        };
        let refused = short.check(true).expect_err("a key kept two days");
        assert!(refused.starts_with("retention.dedupe"), "{refused}");
        assert!(short.check(false).is_ok(), "sandbox mode allows it");
        let long_content = Horizons {
            messages: 7 * DAY,
            dedupe: Duration::from_secs(60),
            ..defaults
        };
        assert!(long_content.check(true).is_ok(), "content keeps the key");
    }
}
