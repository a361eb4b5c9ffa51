//! PURE: a message template's latest category, as Meta's template list and its
//! `template_category_update` webhook give it. The category decides where a template goes:
//! MARKETING to the Marketing Messages API (when it is on), every other to `/messages`.
//!
//! Meta's advice is followed: a category changes only on a *completed* change (the webhook
//! with `previous_category`), never on an *impending* one (with `correct_category`), and the
//! word heard last wins. Both are timed by Sabi's clock, not Meta's webhook time: a template
//! list read and a webhook are then compared on one clock, and a redelivered webhook is a
//! duplicate that is never heard twice.

use crate::clock::At;
use crate::domain::{InboundItem, ItemKind};

/// The webhook field that tells a template's category changed.
pub const FIELD: &str = "template_category_update";

/// A template's category as Meta gave it, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateCategory {
    pub name: String,
    pub language: String,
    /// As Meta spells it, in capitals: MARKETING, UTILITY, AUTHENTICATION.
    pub category: String,
    /// When Sabi heard it: the webhook's arrival, or when Meta's template list was read.
    pub heard_at: At,
}

impl TemplateCategory {
    /// A category with Meta's spelling, whatever case it came in.
    pub fn new(name: &str, language: &str, category: &str, heard_at: At) -> TemplateCategory {
        TemplateCategory {
            name: name.to_owned(),
            language: language.to_owned(),
            category: category.trim().to_ascii_uppercase(),
            heard_at,
        }
    }
}

/// Whether a category heard at `new` replaces the one kept (heard at `kept`, if any): the
/// newer word wins, and of two at the same time the later heard.
pub fn replaces(kept: Option<At>, new: At) -> bool {
    kept.is_none_or(|kept| new >= kept)
}

/// A completed category change in a stored webhook item; `None` for anything else, an
/// impending change included, heard at `received_at`.
pub fn news(item: &InboundItem, received_at: At) -> Option<TemplateCategory> {
    if item.kind != ItemKind::FieldEvent || item.facts["field"] != FIELD {
        return None;
    }
    let value = &item.facts["value"];
    // Only a completed change names the category it left; an impending one names the
    // category Meta thinks correct, which is not yet the template's.
    value.get("previous_category")?;
    Some(TemplateCategory::new(
        value["message_template_name"].as_str()?,
        value["message_template_language"].as_str()?,
        value["new_category"].as_str()?,
        received_at,
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::clock::UnixSeconds;
    use crate::domain::Channel;

    fn field_event(field: &str, value: serde_json::Value) -> InboundItem {
        InboundItem {
            kind: ItemKind::FieldEvent,
            channel: Channel::Whatsapp,
            dedupe_key: "field:1".into(),
            business: None,
            customer: None,
            item_type: Some(field.into()),
            text: None,
            media_id: None,
            provider_ts: Some(UnixSeconds(1_781_000_000)),
            turn: None,
            facts: json!({"kind": "field_event", "field": field, "value": value}),
        }
    }

    #[test]
    fn a_completed_change_gives_the_new_category_when_it_is_heard() {
        let item = field_event(
            FIELD,
            json!({
                "message_template_id": 1_689_556_908_120_042_i64,
                "message_template_name": "order_update",
                "message_template_language": "en_US",
                "previous_category": "UTILITY",
                "new_category": "MARKETING",
            }),
        );
        let news = news(&item, At::from_millis(5)).expect("a completed change");
        assert_eq!(
            news,
            TemplateCategory::new("order_update", "en_US", "MARKETING", At::from_millis(5))
        );
    }

    #[test]
    fn an_impending_change_and_other_fields_change_nothing() {
        let impending = field_event(
            FIELD,
            json!({
                "message_template_name": "order_update",
                "message_template_language": "en_US",
                "correct_category": "MARKETING",
                "new_category": "UTILITY",
                "category_update_timestamp": 1_781_086_400,
            }),
        );
        assert_eq!(news(&impending, At::from_millis(5)), None);
        let status = field_event(
            "message_template_status_update",
            json!({"event": "APPROVED", "message_template_name": "order_update",
                   "message_template_language": "en_US", "previous_category": "UTILITY",
                   "new_category": "MARKETING"}),
        );
        assert_eq!(news(&status, At::from_millis(5)), None);
    }

    #[test]
    fn categories_are_spelt_as_meta_does_and_the_newer_word_wins() {
        let c = TemplateCategory::new("t", "en", " marketing ", At::from_millis(1));
        assert_eq!(c.category, "MARKETING");
        assert!(replaces(None, At::from_millis(1)));
        assert!(replaces(Some(At::from_millis(1)), At::from_millis(2)));
        assert!(replaces(Some(At::from_millis(2)), At::from_millis(2)));
        assert!(!replaces(Some(At::from_millis(3)), At::from_millis(2)));
    }
}
