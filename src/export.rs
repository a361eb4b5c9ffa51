//! What Sabi shows of what it holds: stored items and reply parts as JSON (`sabi inbox`,
//! `sabi outbox`), and a customer's whole record as one JSON document or as text for a person
//! to read (`sabi export`, `GET /admin/customers/...`), and the customer a person names there.

use std::fmt::Write;
use std::time::{Duration, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::clock::At;
use crate::domain::Channel;
use crate::phone;
use crate::store::rules::identity::is_bsuid;
use crate::store::{
    BroadcastSend, CustomerRecord, Delivery, OutboxEntry, ReviewRecord, StoredItem, Subject,
};

/// The customer a person names on `channel`: on WhatsApp a number as people write it, with
/// its country code (`+234 803-123-4567`, `2348031234567`) or the local way (`0803 123 4567`)
/// with `country`; on web chat a session id as given. A number that cannot be read so is
/// refused naming `country_is_given_by` (`--country`, `?country=`): taken as digits, a local
/// number would name a customer Sabi never held, and "held nothing" would hide the mistake.
///
/// # Errors
/// Why `written` names no customer, in words.
pub fn subject(
    channel: Channel,
    written: &str,
    country: Option<&str>,
    country_is_given_by: &str,
) -> Result<Subject, String> {
    if channel != Channel::Whatsapp || is_bsuid(written.trim()) {
        return Subject::parse(channel, written);
    }
    let number = phone::e164(written, country).map_err(|_| {
        format!(
            "{written:?} is not a WhatsApp number: write it with its country code \
             (+234 803 123 4567), or the local way (0803 123 4567) with {country_is_given_by} \
             (like 234) or whatsapp.default_country set, or their business-scoped user id \
             (NG.8812734650192837)"
        )
    })?;
    Subject::parse(channel, &number)
}

/// 9999-12-31T23:59:59.999Z, the last instant a calendar date is written for.
pub const LAST_MILLI: i64 = 253_402_300_799_999;

/// Unix milliseconds as an RFC 3339 time, to the millisecond; times past the year 9999 (which
/// RFC 3339 cannot write) as its last instant.
pub fn rfc3339(at: At) -> String {
    let millis = u64::try_from(at.millis().min(LAST_MILLI)).unwrap_or_default();
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(millis)).to_string()
}

/// The normalised facts of an item, with the store's own columns beside them.
pub fn item_json(stored: &StoredItem) -> Value {
    let item = &stored.item;
    let mut object = match &item.facts {
        Value::Object(map) => map.clone(),
        _ => serde_json::Map::new(),
    };
    let columns = [
        ("seq", json!(stored.seq)),
        ("kind", json!(item.kind.as_str())),
        ("channel", json!(item.channel.as_str())),
        ("business_number", json!(item.business)),
        ("customer", json!(item.customer)),
        ("external_id", json!(item.dedupe_key)),
        ("type", json!(item.item_type)),
        ("text", json!(item.text)),
        ("media_id", json!(item.media_id)),
        ("provider_timestamp", json!(item.provider_ts)),
        ("received_at_ms", json!(stored.received_at)),
        ("received_at", json!(rfc3339(stored.received_at))),
        ("state", json!(stored.state)),
        ("batch", json!(stored.batch)),
    ];
    for (key, value) in columns {
        // The facts keep their own meaning of a key (a status's `id`, a message's `type`).
        object.entry(key).or_insert(value);
    }
    Value::Object(object)
}

/// A reply part with how its sending went.
pub fn reply_json(entry: &OutboxEntry) -> Value {
    let c = &entry.conversation;
    json!({
        "id": entry.id,
        "channel": c.channel.as_str(),
        "business_number": c.business,
        "customer": c.customer,
        "batch": entry.batch_id,
        "part": entry.part,
        "text": entry.text,
        "state": entry.state,
        "kind": entry.kind,
        "attempts": entry.attempts,
        "wamid": entry.wamid,
        "delivery": entry.delivery,
        "error_code": entry.error_code,
        "error": entry.error,
        "created_at": rfc3339(entry.created_at),
        "sent_at": entry.sent_at.map(rfc3339),
        "turn_started_at_ms": entry.turn_started_at,
        "turn_finished_at_ms": entry.turn_finished_at,
    })
}

/// Everything held about a customer, as one document.
pub fn record_json(who: &Subject, record: &CustomerRecord) -> Value {
    json!({
        "channel": who.channel.as_str(),
        "customer": who.customer,
        "items": record.items.iter().map(item_json).collect::<Vec<_>>(),
        "replies": record.replies.iter().map(reply_json).collect::<Vec<_>>(),
        "hand_offs": record.reviews.iter().map(review_json).collect::<Vec<_>>(),
        "broadcasts": record.broadcasts.iter().map(broadcast_json).collect::<Vec<_>>(),
        "broadcast_choice": record.consent.map(|c| json!({
            "opted_out": c.opted_out,
            "source": c.source,
            "at": rfc3339(c.at),
        })),
    })
}

fn review_json(review: &ReviewRecord) -> Value {
    json!({
        "id": review.id,
        "batch": review.batch_id,
        "reason": review.reason.as_str(),
        "state": review.state,
        "error": review.error,
        "created_at": rfc3339(review.created_at),
        "settled_at": review.resolved_at.map(rfc3339),
        "reply": review.note,
    })
}

fn broadcast_json(send: &BroadcastSend) -> Value {
    let r = &send.recipient;
    json!({
        "broadcast": send.broadcast_id,
        "name": send.name,
        "template": send.template,
        "params": r.params,
        "state": r.state,
        "skipped": r.skipped,
        "error": r.error,
        "sent_at": r.sent_at.map(rfc3339),
        "replied_at": r.replied_at.map(rfc3339),
    })
}

/// Text from outside (customers, Meta, models) as a terminal may show it: control characters
/// (escape sequences, bells, line breaks that would forge a line) are written as escapes.
pub fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    text.chars()
        .map(|c| match c {
            c if c.is_control() => c.escape_default().to_string(),
            c => c.to_string(),
        })
        .collect::<String>()
        .into()
}

/// Everything held about a customer, for a person to read: one line per thing, oldest first
/// within each kind.
pub fn record_text(who: &Subject, record: &CustomerRecord) -> String {
    let mut out = format!(
        "{} customer {}\n",
        who.channel.as_str(),
        shown(&who.customer)
    );
    if *record == CustomerRecord::default() {
        out.push_str("Sabi holds nothing about this customer.\n");
        return out;
    }
    let _ = writeln!(out, "\nreceived ({}):", record.items.len());
    for stored in &record.items {
        let i = &stored.item;
        let _ = writeln!(
            out,
            "  {}  {} {}  {}",
            rfc3339(stored.received_at),
            i.kind.as_str(),
            shown(i.item_type.as_deref().unwrap_or("-")),
            shown(i.text.as_deref().unwrap_or(""))
        );
    }
    let _ = writeln!(out, "\nreplies ({}):", record.replies.len());
    for reply in &record.replies {
        let _ = writeln!(
            out,
            "  {}  {} {}  {}",
            rfc3339(reply.created_at),
            reply.state,
            reply.delivery.map_or("-", Delivery::as_str),
            shown(&reply.text)
        );
    }
    let _ = writeln!(out, "\nhand-offs to people ({}):", record.reviews.len());
    for review in &record.reviews {
        let _ = writeln!(
            out,
            "  {}  {}  {}{}",
            rfc3339(review.created_at),
            review.reason.as_str(),
            review.state,
            review
                .note
                .as_deref()
                .map(|n| format!(": {}", shown(n)))
                .unwrap_or_default()
        );
    }
    let _ = writeln!(out, "\nbroadcasts ({}):", record.broadcasts.len());
    for send in &record.broadcasts {
        let _ = writeln!(
            out,
            "  {} ({})  {}",
            shown(&send.name),
            shown(&send.template),
            send.recipient.state
        );
    }
    if let Some(choice) = record.consent {
        let standing = if choice.opted_out {
            "opted out"
        } else {
            "opted in"
        };
        let _ = writeln!(
            out,
            "\nbroadcasts: {standing} ({}, {})",
            choice.source,
            rfc3339(choice.at)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{record_text, shown};
    use crate::clock::At;
    use crate::domain::{Channel, ReviewReason};
    use crate::store::{CustomerRecord, ReviewRecord, ReviewState, Subject};

    #[test]
    fn control_characters_from_outside_are_shown_as_escapes() {
        assert_eq!(shown("plain text, ẹ jọ̀ọ́"), "plain text, ẹ jọ̀ọ́");
        assert_eq!(shown("a\u{1b}[2Jb\u{7}\nc"), "a\\u{1b}[2Jb\\u{7}\\nc");
    }

    #[test]
    fn a_line_break_in_what_a_person_wrote_cannot_forge_a_line_of_the_report() {
        let record = CustomerRecord {
            reviews: vec![ReviewRecord {
                id: 1,
                batch_id: 1,
                reason: ReviewReason::HandoffAsked,
                state: ReviewState::Replied,
                error: None,
                created_at: At::from_millis(0),
                resolved_at: None,
                note: Some("sorted\nbroadcasts: opted in".into()),
            }],
            ..CustomerRecord::default()
        };
        let who = Subject {
            channel: Channel::Whatsapp,
            customer: "2348031234567".into(),
        };
        let text = record_text(&who, &record);
        assert!(
            !text.lines().any(|l| l.starts_with("broadcasts: ")),
            "{text}"
        );
        assert!(text.contains("sorted\\nbroadcasts"), "{text}");
    }
}
