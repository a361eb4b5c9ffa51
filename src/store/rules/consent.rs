//! A customer's standing for broadcasts: whether they opted out, how, and when.
//!
//! Only broadcasts read it: a customer who opted out still gets every service reply. The latest
//! choice wins, by when the customer made it, so a late webhook never undoes a newer choice.
//! [`apply`] is that rule, and [`preferences`] reads the choices Meta reports
//! (`user_preferences` webhooks).

use serde_json::Value;

use super::named;
use crate::clock::{At, UnixSeconds};
use crate::domain::{InboundItem, ItemKind};

/// Where a choice came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The customer wrote a stop or start request (STOP, "no send me again", START, ...).
    Keyword,
    /// Meta's `user_preferences` webhook: the customer stopped or resumed marketing messages
    /// from WhatsApp's own menu.
    UserPreferences,
    /// Meta refused a broadcast with 131050: the customer stopped marketing messages.
    Refused,
    /// The customer asked Sabi to forget them: what stays is a marker no broadcast passes
    /// (see [`super::erasure`]).
    Erased,
}

named!(Source {
    Keyword => "keyword",
    UserPreferences => "user_preferences",
    Refused => "meta_131050",
    Erased => "erased",
});

/// A customer's choice about broadcasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub opted_out: bool,
    pub source: Source,
    /// When the customer made it (as Meta reports it, or when Sabi learnt it).
    pub at: At,
}

/// What to keep after `new`, given the choice kept so far; `None` when it changes nothing: the
/// customer's standing is already that, or `new` is older than the choice kept.
pub fn apply(kept: Option<&Choice>, new: &Choice) -> Option<Choice> {
    let standing = kept.is_some_and(|k| k.opted_out);
    if standing == new.opted_out || kept.is_some_and(|k| k.at > new.at) {
        return None;
    }
    Some(*new)
}

/// The choices a stored webhook item reports, by customer: Meta's `user_preferences` field
/// (marketing messages stopped or resumed).
pub fn preferences(item: &InboundItem) -> Vec<(String, Choice)> {
    if item.kind != ItemKind::FieldEvent || item.facts["field"] != "user_preferences" {
        return Vec::new();
    }
    let Some(prefs) = item.facts["value"]["user_preferences"].as_array() else {
        return Vec::new();
    };
    prefs.iter().filter_map(preference).collect()
}

fn preference(p: &Value) -> Option<(String, Choice)> {
    if p["category"] != "marketing_messages" {
        return None;
    }
    let opted_out = match p["value"].as_str()? {
        "stop" => true,
        "resume" => false,
        _ => return None,
    };
    let at = UnixSeconds(p["timestamp"].as_i64()?).at();
    let customer = p["wa_id"].as_str()?.to_owned();
    Some((
        customer,
        Choice {
            opted_out,
            source: Source::UserPreferences,
            at,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(opted_out: bool, at: i64) -> Choice {
        Choice {
            opted_out,
            source: Source::Keyword,
            at: At::from_millis(at),
        }
    }

    #[test]
    fn the_latest_choice_wins_and_a_repeat_changes_nothing() {
        assert_eq!(apply(None, &choice(true, 5)), Some(choice(true, 5)));
        assert_eq!(apply(None, &choice(false, 5)), None, "opted in already");
        let out = choice(true, 5);
        assert_eq!(apply(Some(&out), &choice(true, 9)), None, "a repeat");
        assert_eq!(apply(Some(&out), &choice(false, 4)), None, "older");
        assert_eq!(apply(Some(&out), &choice(false, 5)), Some(choice(false, 5)));
        let back = choice(false, 9);
        assert_eq!(
            apply(Some(&back), &choice(true, 10)),
            Some(choice(true, 10))
        );
    }
}
