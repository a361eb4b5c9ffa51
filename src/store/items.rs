//! What every backend stores the same way: an item's encoded facts and the hash a redelivery is
//! compared on, a web-chat question as an inbox item, and what an inbox state means to a
//! browser. Backends share these so they agree byte for byte.

use std::time::Duration;

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::clock::At;
use crate::domain;
use crate::domain::{Channel, ConversationKey, InboundItem, ItemKind, Quarantined};
use crate::store::rules::broadcast;
use crate::store::rules::item::{self, ItemState};
use crate::store::rules::part::{Delivery, Status};
use crate::store::{ChatSubmission, JobStatus, parse_broadcast_callback};

/// An item's facts as stored, and the hash a redelivery is compared on.
pub(crate) struct Encoded {
    pub(crate) facts: String,
    pub(crate) hash: Vec<u8>,
}

impl Encoded {
    pub(crate) fn of(item: &InboundItem) -> Encoded {
        let facts = item.facts.to_string();
        // The normalised content, not the delivery's formatting, decides what is "the same".
        let mut hasher = Sha256::new();
        hasher.update(facts.as_bytes());
        hasher.update(item.text.as_deref().unwrap_or_default().as_bytes());
        let hash = hasher.finalize()[..16].to_vec();
        Encoded { facts, hash }
    }
}

/// A reply part's quick replies as the stores keep them (a JSON list, or nothing).
pub(crate) fn options_of(kept: Option<&str>) -> Vec<String> {
    kept.and_then(|o| serde_json::from_str(o).ok())
        .unwrap_or_default()
}

/// When the customer sent an item (see [`domain::sent_at`]): the 24-hour window starts there.
pub(crate) fn sent_at(item: &InboundItem, received_at: At) -> At {
    domain::sent_at(item.provider_ts, received_at)
}

/// A customer's change to a message sent earlier (WhatsApp's `revoke` and `edit`). It wakes
/// nothing itself. While the message it names still waits for its turn, a deletion takes it out
/// of its batch (`withdrawn`: nothing is answered for it, and a conversation left with nothing
/// pending is no longer due) and an edit replaces its text. Once the message is in a turn, or
/// answered, the change is only kept as a fact.
#[derive(Debug, PartialEq)]
pub(crate) enum Amendment<'a> {
    Withdraw { original: &'a str },
    Replace { original: &'a str, text: &'a str },
}

impl Amendment<'_> {
    pub(crate) fn original(&self) -> &str {
        match self {
            Amendment::Withdraw { original } | Amendment::Replace { original, .. } => original,
        }
    }

    /// The new text, for an edit.
    pub(crate) fn text(&self) -> Option<&str> {
        match self {
            Amendment::Withdraw { .. } => None,
            Amendment::Replace { text, .. } => Some(text),
        }
    }
}

/// The change `item` makes to an earlier message, if it is one (the parser notes the message it
/// names as the fact `amends`).
pub(crate) fn amendment(item: &InboundItem) -> Option<Amendment<'_>> {
    let original = item.facts.get("amends")?.as_str()?;
    match item.item_type.as_deref()? {
        "revoke" => Some(Amendment::Withdraw { original }),
        "edit" => Some(Amendment::Replace {
            original,
            text: item.text.as_deref()?,
        }),
        _ => None,
    }
}

/// A quarantined part is kept once however often it is redelivered.
pub(crate) fn quarantine_hash(q: &Quarantined) -> Vec<u8> {
    Sha256::digest(q.raw.as_bytes())[..16].to_vec()
}

/// The inbox key of a question: the session's length first, so that no two (session,
/// message id) pairs can spell the same key even though both may contain `:`.
pub(crate) fn message_key(session_id: &str, message_id: &str) -> String {
    format!("{}:{session_id}:{message_id}", session_id.len())
}

/// A web-chat question as an inbox message: the session is the customer, the site the business.
pub(crate) fn question_item(s: &ChatSubmission, key: String) -> InboundItem {
    InboundItem {
        kind: ItemKind::Message,
        channel: Channel::Webchat,
        dedupe_key: key,
        business: Some(s.business.clone()),
        customer: Some(s.session_id.clone()),
        item_type: Some("text".into()),
        text: Some(s.question.clone()),
        media_id: None,
        provider_ts: None,
        turn: Some(ConversationKey {
            channel: Channel::Webchat,
            business: s.business.clone(),
            customer: s.session_id.clone(),
        }),
        facts: json!({
            "kind": "message",
            "type": "text",
            "session_id": s.session_id,
            "message_id": s.message_id,
            "job_id": s.job_id,
            "user_id": s.user_id,
            "address": s.address,
        }),
    }
}

/// How long a session that asked too fast waits: until `freeing`, the question whose minute
/// ends first and leaves room for one more, is a minute old; at least a second.
pub(crate) fn session_retry_after(freeing: Option<At>, now: At) -> Duration {
    let wait = freeing.map_or(Duration::ZERO, |at| (at + MINUTE).since(now));
    wait.max(Duration::from_secs(1))
}

/// The window a session's questions are counted in.
pub(crate) const MINUTE: Duration = Duration::from_secs(60);

/// The inbox state of the question, as the browser understands it.
pub(crate) fn status_of(state: &str) -> JobStatus {
    ItemState::parse(state).map_or(JobStatus::Failed, item::job_status)
}

/// The largest queue position reported: past it the exact figure tells a person nothing more,
/// and counting further would cost every poll a longer scan.
pub(crate) const POSITION_CAP: i64 = 10_000;

/// A stored name read back as the rulebook's enum: a name this build does not know means the
/// store was written by another one.
pub(crate) fn known<T>(parse: fn(&str) -> Option<T>, name: &str) -> crate::store::Result<T> {
    parse(name).ok_or_else(|| crate::store::Error::Schema(format!("unknown name {name:?}")))
}

/// A status webhook item as a broadcast recipient reads it.
pub(crate) struct RecipientStatus<'a> {
    pub(crate) status: Status<'a>,
    /// The (recipient, attempt) its callback data names, for when the send's answer was lost.
    pub(crate) named: Option<(i64, u32)>,
    /// Whether Meta charges for the message, when the status carries its pricing.
    pub(crate) billed: Option<bool>,
    /// Meta's pricing category for the message, when the status carries its pricing.
    pub(crate) pricing: Option<&'a str>,
}

/// A status webhook item as a broadcast recipient reads it; `None` for any other item.
pub(crate) fn broadcast_status(item: &InboundItem) -> Option<RecipientStatus<'_>> {
    if item.kind != ItemKind::Status {
        return None;
    }
    let facts = &item.facts;
    let status = Status {
        wamid: facts["id"].as_str()?,
        delivery: facts["status"].as_str().and_then(Delivery::parse)?,
        code: facts["error_codes"]
            .get(0)
            .and_then(serde_json::Value::as_i64),
    };
    let named = facts["biz_opaque_callback_data"]
        .as_str()
        .and_then(parse_broadcast_callback);
    let billed = broadcast::billed(
        facts["pricing_type"].as_str(),
        facts["pricing_billable"].as_bool(),
    );
    Some(RecipientStatus {
        status,
        named,
        billed,
        pricing: facts["pricing_category"].as_str(),
    })
}
