//! Who a WhatsApp customer is when Meta names them in several ways: by phone number, and since
//! 2026 by a business-scoped user id (BSUID, `CC.<letters and digits>`), with a parent BSUID
//! (`CC.ENT.<...>`) for linked portfolios. A customer with a username may withhold the number,
//! and one who changes number gets a new BSUID (`user_changed_user_id`).
//!
//! Every id an item names its customer by is linked to one key, the customer's: their
//! conversations, history, 24-hour window, consent and review items are kept under it, so a
//! message naming any of the ids joins the same conversation. The key is the one the ids were
//! first linked to (the phone number's link first); a customer Sabi meets for the first time is
//! keyed by the phone number when Meta gave one, else by the BSUID.

use crate::domain::{InboundItem, ItemKind};

/// The longest BSUID after its country prefix.
const MAX_BSUID_CHARS: usize = 128;

/// Whether `id` is a BSUID (or a parent BSUID) rather than a phone number.
pub fn is_bsuid(id: &str) -> bool {
    let Some((country, rest)) = id.split_once('.') else {
        return false;
    };
    let rest = rest.strip_prefix("ENT.").unwrap_or(rest);
    country.len() == 2
        && country.chars().all(|c| c.is_ascii_uppercase())
        && (1..=MAX_BSUID_CHARS).contains(&rest.len())
        && rest.chars().all(|c| c.is_ascii_alphanumeric())
}

/// Whom a message to the customer keyed `key` goes to, given every id linked to them: a phone
/// number when Meta has shown one (authentication templates need a number, and a number is how
/// every send went before BSUIDs), else the BSUID.
pub fn address<'a>(key: &'a str, linked: &'a [String]) -> &'a str {
    if !is_bsuid(key) {
        return key;
    }
    linked
        .iter()
        .find(|id| !is_bsuid(id))
        .map_or(key, String::as_str)
}

/// The facts that name an item's customer, by kind, in the order they are linked.
fn naming_facts(kind: ItemKind) -> &'static [&'static str] {
    match kind {
        // A `user_changed_user_id` system message names the new BSUID beside the old ids.
        ItemKind::Message => &[
            "from",
            "from_user_id",
            "from_parent_user_id",
            "system_new_user_id",
        ],
        ItemKind::Status => &["recipient_id", "recipient_user_id"],
        ItemKind::Echo => &["to", "to_user_id"],
        ItemKind::ValueError | ItemKind::FieldEvent => &[],
    }
}

/// The ids a WhatsApp `item` names its customer by, phone numbers first, each once.
pub fn ids(item: &InboundItem) -> Vec<String> {
    let mut ids: Vec<String> = naming_facts(item.kind)
        .iter()
        .filter_map(|key| item.facts.get(key)?.as_str())
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .collect();
    ids.extend(item.customer.clone());
    // Stable: among phone numbers, and among BSUIDs, the order above stays.
    ids.sort_by_key(|id| is_bsuid(id));
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(id.clone()));
    ids
}

/// Whether an item of `kind` links the ids it names: a customer's own messages and the
/// business's replies to them do; a status only reads the links. A broadcast's statuses would
/// otherwise keep the ids of people who never wrote, which no conversation's retention removes
/// (the links of a customer go with their last conversation).
pub fn links(kind: ItemKind) -> bool {
    matches!(kind, ItemKind::Message | ItemKind::Echo)
}

/// The key of a customer named by `ids` (as [`ids`] orders them), given the links already kept
/// for any of them (`linked`: id and the key it is linked to): the key of the first id that has
/// one; else the first id. `None` for no ids.
pub fn key(ids: &[String], linked: &[(String, String)]) -> Option<String> {
    ids.iter()
        .find_map(|id| {
            linked
                .iter()
                .find(|(alias, _)| alias == id)
                .map(|(_, key)| key.clone())
        })
        .or_else(|| ids.first().cloned())
}

/// The ids whose link to `key` is to be written: missing, or pointing at another key (the
/// customer's ids now known to be theirs follow the phone number's key).
pub fn unlinked<'a>(ids: &'a [String], linked: &[(String, String)], key: &str) -> Vec<&'a str> {
    ids.iter()
        .filter(|id| !linked.iter().any(|(alias, to)| alias == *id && to == key))
        .map(String::as_str)
        .collect()
}

/// `item` under `key` when it names its customer otherwise: its customer and the conversation
/// it wakes are the key's; its facts keep the ids Meta gave. `None` when it is under the key.
pub fn rekeyed(item: &InboundItem, key: &str) -> Option<InboundItem> {
    if item.customer.as_deref() == Some(key) {
        return None;
    }
    let mut rekeyed = item.clone();
    rekeyed.customer = Some(key.to_owned());
    if let Some(turn) = &mut rekeyed.turn {
        turn.customer = key.to_owned();
    }
    Some(rekeyed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Channel;
    use serde_json::json;

    fn item(kind: ItemKind, customer: Option<&str>, facts: serde_json::Value) -> InboundItem {
        InboundItem {
            kind,
            channel: Channel::Whatsapp,
            dedupe_key: "k".into(),
            business: Some("9".into()),
            customer: customer.map(str::to_owned),
            item_type: None,
            text: None,
            media_id: None,
            provider_ts: None,
            turn: None,
            facts,
        }
    }

    fn owned(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn bsuids_are_told_from_phone_numbers() {
        for id in ["NG.8812734650192837", "US.ENT.abc123", "GB.x"] {
            assert!(is_bsuid(id), "{id}");
        }
        let long = format!("NG.{}", "a".repeat(129));
        for id in [
            "2348031234567",
            "NG.",
            "ng.123",
            "NGA.1",
            "NG.12-3",
            "NG.ENT.",
            &long,
        ] {
            assert!(!is_bsuid(id), "{id}");
        }
    }

    #[test]
    fn an_item_names_its_customer_phone_first_each_id_once() {
        let message = item(
            ItemKind::Message,
            Some("2348031234567"),
            json!({"from": "2348031234567", "from_user_id": "NG.1", "from_parent_user_id": "NG.ENT.9"}),
        );
        assert_eq!(ids(&message), owned(&["2348031234567", "NG.1", "NG.ENT.9"]));
        let withheld = item(
            ItemKind::Message,
            Some("NG.1"),
            json!({"from_user_id": "NG.1"}),
        );
        assert_eq!(ids(&withheld), owned(&["NG.1"]));
        let changed = item(
            ItemKind::Message,
            Some("NG.1"),
            json!({"from_user_id": "NG.1", "system_new_user_id": "NG.2"}),
        );
        assert_eq!(ids(&changed), owned(&["NG.1", "NG.2"]));
        let status = item(
            ItemKind::Status,
            Some("NG.1"),
            json!({"recipient_user_id": "NG.1", "recipient_id": "2348031234567"}),
        );
        assert_eq!(ids(&status), owned(&["2348031234567", "NG.1"]));
        let echo = item(ItemKind::Echo, Some("NG.7"), json!({"to_user_id": "NG.7"}));
        assert_eq!(ids(&echo), owned(&["NG.7"]));
        assert!(ids(&item(ItemKind::FieldEvent, None, json!({}))).is_empty());
    }

    #[test]
    fn only_what_the_customer_and_business_say_links_ids() {
        assert!(links(ItemKind::Message) && links(ItemKind::Echo));
        assert!(!links(ItemKind::Status) && !links(ItemKind::FieldEvent));
    }

    #[test]
    fn the_key_is_the_first_linked_ids_and_new_ids_follow_it() {
        let both = owned(&["2348031234567", "NG.1"]);
        // Met for the first time: the phone number is the key, both ids get linked.
        assert_eq!(key(&both, &[]).as_deref(), Some("2348031234567"));
        assert_eq!(
            unlinked(&both, &[], "2348031234567"),
            ["2348031234567", "NG.1"]
        );
        // Known by the BSUID alone first: the BSUID stays the key, the number joins it.
        let by_bsuid = vec![("NG.1".to_owned(), "NG.1".to_owned())];
        assert_eq!(key(&both, &by_bsuid).as_deref(), Some("NG.1"));
        assert_eq!(unlinked(&both, &by_bsuid, "NG.1"), ["2348031234567"]);
        // Then named by the BSUID alone: the same key, nothing to write.
        let linked = vec![
            ("2348031234567".to_owned(), "NG.1".to_owned()),
            ("NG.1".to_owned(), "NG.1".to_owned()),
        ];
        let alone = owned(&["NG.1"]);
        assert_eq!(key(&alone, &linked).as_deref(), Some("NG.1"));
        assert!(unlinked(&alone, &linked, "NG.1").is_empty());
        // Two histories met before the link was known: the phone number's key wins, and the
        // BSUID follows it from now on.
        let apart = vec![
            ("2348031234567".to_owned(), "2348031234567".to_owned()),
            ("NG.1".to_owned(), "NG.1".to_owned()),
        ];
        assert_eq!(key(&both, &apart).as_deref(), Some("2348031234567"));
        assert_eq!(unlinked(&both, &apart, "2348031234567"), ["NG.1"]);
        assert_eq!(key(&[], &[]), None);
    }

    #[test]
    fn a_send_goes_to_the_number_once_meta_has_shown_one() {
        let linked = vec!["NG.1a2b3c".to_owned(), "2348031234567".to_owned()];
        assert_eq!(address("NG.1a2b3c", &linked), "2348031234567");
        assert_eq!(address("NG.1a2b3c", &linked[..1]), "NG.1a2b3c");
        assert_eq!(address("2348031234567", &[]), "2348031234567");
    }
}
