//! PURE: what Meta charges for the messages Sabi sends, as their statuses tell it. Since July
//! 2025 a status carries `pricing { pricing_model, category, type }`: per-message pricing
//! (`PMP`) charges each message, the older conversation-based pricing (`CBP`) a conversation
//! once, whichever message opened it.
//!
//! The ledger keeps one row per priced message (per conversation under CBP), whether or not
//! Sabi sent it (a person's reply from the app is priced too), so its key is a hash: a wamid
//! spells the recipient's number, and the ledger keeps only the number's first digits, which
//! are all a price is looked up by. A later status of the same message updates what it says;
//! the message stays counted in the hour it was first priced, so a count since any time reads
//! whole hours and every store gives the same figure.

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::clock::{At, millis};
use crate::domain::{InboundItem, ItemKind};

use super::broadcast;

/// The longest country prefix a price is looked up by.
pub const PREFIX_DIGITS: usize = 4;

/// The span counts are kept in.
pub const HOUR: Duration = Duration::from_secs(3_600);

/// What one status says a message costs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Priced {
    /// SHA-256 of the message's wamid (of its conversation's id under CBP), hex.
    pub key: String,
    /// The first digits of the recipient's number; a customer known only by a BSUID gives its
    /// country letters (`NG`).
    pub prefix: String,
    /// Meta's category, lower-cased: `marketing`, `utility`, `authentication`,
    /// `authentication_international`, `service`, `marketing_lite`.
    pub category: String,
    /// Meta's pricing type (`regular`, `free_customer_service`, `free_entry_point`), or
    /// `unknown` when the status gives none.
    pub kind: String,
    /// Whether Meta charges for it. A type this build does not know is counted as charged: a
    /// cost is better overstated than hidden.
    pub billed: bool,
}

/// What `item` says its message costs; `None` for anything but a status with pricing.
pub fn of(item: &InboundItem) -> Option<Priced> {
    if item.kind != ItemKind::Status {
        return None;
    }
    let facts = &item.facts;
    let category = facts["pricing_category"].as_str()?;
    let kind = facts["pricing_type"].as_str();
    let charged = broadcast::billed(kind, facts["pricing_billable"].as_bool());
    let subject = match (
        facts["pricing_model"].as_str(),
        facts["conversation_id"].as_str(),
    ) {
        (Some("CBP"), Some(conversation)) => format!("conversation:{conversation}"),
        _ => format!("message:{}", facts["id"].as_str()?),
    };
    Some(Priced {
        key: hex::encode(Sha256::digest(subject.as_bytes())),
        prefix: prefix(
            facts["recipient_id"].as_str(),
            facts["recipient_user_id"].as_str(),
        ),
        category: name(category),
        kind: kind.map_or_else(|| "unknown".to_owned(), name),
        billed: charged.unwrap_or(true),
    })
}

/// Meta's names as the ledger keeps them: lower case, `_` between words (Meta has written
/// both `marketing_lite` and `MARKETING-LITE`), letters, digits and `_` alone: the names are
/// printed by `sabi stats` and labelled in `/metrics`, so nothing a webhook carries may hold
/// control characters or run long.
pub fn name(given: &str) -> String {
    given
        .trim()
        .to_ascii_lowercase()
        .replace('-', "_")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(NAME_CHARS)
        .collect()
}

/// The longest category or type name kept.
const NAME_CHARS: usize = 40;

/// What a price is looked up by: the number's first digits, else a BSUID's country letters.
fn prefix(number: Option<&str>, bsuid: Option<&str>) -> String {
    let digits: String = number
        .unwrap_or_default()
        .chars()
        .filter(char::is_ascii_digit)
        .take(PREFIX_DIGITS)
        .collect();
    if !digits.is_empty() {
        return digits;
    }
    bsuid
        .and_then(|id| id.split_once('.'))
        .map(|(country, _)| country)
        .filter(|c| c.len() == 2 && c.bytes().all(|b| b.is_ascii_uppercase()))
        .unwrap_or_default()
        .to_owned()
}

/// The start of the hour `at` falls in: the ledger counts a message there.
pub fn hour(at: At) -> At {
    let span = millis(HOUR);
    At::from_millis(at.millis().div_euclid(span) * span)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::Channel;

    fn status(facts: serde_json::Value) -> InboundItem {
        InboundItem {
            kind: ItemKind::Status,
            channel: Channel::Whatsapp,
            dedupe_key: "wamid.A:sent".into(),
            business: Some("1001".into()),
            customer: Some("2348012345678".into()),
            item_type: Some("sent".into()),
            text: None,
            media_id: None,
            provider_ts: None,
            turn: None,
            facts,
        }
    }

    #[test]
    fn a_status_with_pricing_names_the_message_by_a_hash_and_the_number_by_its_prefix() {
        let priced = of(&status(json!({
            "id": "wamid.A", "recipient_id": "2348012345678", "pricing_model": "PMP",
            "pricing_category": "MARKETING-LITE", "pricing_type": "regular",
        })))
        .expect("priced");
        assert_eq!(priced.prefix, "2348");
        assert_eq!(priced.category, "marketing_lite");
        assert_eq!(priced.kind, "regular");
        assert!(priced.billed);
        assert!(!priced.key.contains("wamid"), "the wamid spells the number");
        assert_eq!(priced.key.len(), 64);
    }

    #[test]
    fn conversation_pricing_counts_a_conversation_once() {
        let first = of(&status(json!({
            "id": "wamid.A", "pricing_model": "CBP", "conversation_id": "c1",
            "pricing_category": "service", "pricing_billable": true,
        })))
        .expect("priced");
        let second = of(&status(json!({
            "id": "wamid.B", "pricing_model": "CBP", "conversation_id": "c1",
            "pricing_category": "service", "pricing_billable": true,
        })))
        .expect("priced");
        assert_eq!(first.key, second.key);
        assert_eq!(first.kind, "unknown");
        let per_message = of(&status(json!({
            "id": "wamid.B", "pricing_model": "PMP", "conversation_id": "c1",
            "pricing_category": "service", "pricing_type": "free_customer_service",
        })))
        .expect("priced");
        assert_ne!(per_message.key, second.key);
        assert!(!per_message.billed);
    }

    #[test]
    fn a_customer_known_by_a_bsuid_alone_is_priced_by_its_country() {
        let priced = of(&status(json!({
            "id": "wamid.A", "recipient_user_id": "NG.13491208655302741918",
            "pricing_category": "utility", "pricing_type": "something_new",
        })))
        .expect("priced");
        assert_eq!(priced.prefix, "NG");
        assert!(priced.billed, "an unknown type counts as charged");
    }

    #[test]
    fn what_a_webhook_names_is_kept_printable() {
        let priced = of(&status(json!({
            "id": "wamid.A", "recipient_user_id": "\u{1b}[2J.x",
            "pricing_category": "utility\u{1b}[31m", "pricing_type": "regular",
        })))
        .expect("priced");
        assert_eq!(
            (priced.category.as_str(), priced.prefix.as_str()),
            ("utility31m", "")
        );
    }

    #[test]
    fn a_status_without_pricing_prices_nothing() {
        assert_eq!(of(&status(json!({"id": "wamid.A"}))), None);
    }

    #[test]
    fn messages_are_counted_by_the_hour() {
        let at = At::from_millis(1_781_000_123_456);
        assert_eq!(hour(at).millis() % 3_600_000, 0);
        assert!(hour(at) <= at && at.since(hour(at)) < HOUR);
    }
}
