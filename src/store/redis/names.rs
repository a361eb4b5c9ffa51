//! The rulebook's names in the Lua scripts. A script writes `PART.accepted`, never the bare
//! string; [`render`] replaces each such name with its string before the script is loaded, after
//! checking that the rulebook has it. So every state, reason and status name exists once (in
//! `store::rules` and `domain`), a name the rulebook does not have stops the build's tests (and
//! the store's start) instead of writing a state no other backend knows, and a call pays nothing
//! for it. Meta's delivery ranks are rendered from the same table as the SQL backends'.

use std::fmt::Write;

use crate::domain::ReviewReason;
use crate::store::rules::batch::BatchState;
use crate::store::rules::item::ItemState;
use crate::store::rules::part::{self, Delivery, PartKind, PartState};
use crate::store::rules::review::ReviewState;

/// Each table a script may name, with the names it holds.
fn tables() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        ("PART", PartState::ALL.iter().map(|s| s.as_str()).collect()),
        ("ITEM", ItemState::ALL.iter().map(|s| s.as_str()).collect()),
        (
            "BATCH",
            BatchState::ALL.iter().map(|s| s.as_str()).collect(),
        ),
        (
            "REVIEW",
            ReviewState::ALL.iter().map(|s| s.as_str()).collect(),
        ),
        (
            "REASON",
            ReviewReason::ALL.iter().map(|r| r.as_str()).collect(),
        ),
        (
            "DELIVERY",
            Delivery::ALL.iter().map(|d| d.as_str()).collect(),
        ),
        ("KIND", PartKind::ALL.iter().map(|k| k.as_str()).collect()),
    ]
}

/// `lua` with every `TABLE.name` replaced by `'name'`, `RANK_TABLE` by Meta's delivery ranks
/// and `SETTLED_BY_STATUS` by the rulebook's note for a review item a late status closed.
///
/// # Panics
/// On a name the rulebook does not have: a script that names one can never run.
pub(super) fn render(lua: &str) -> String {
    let mut out = lua.replace("RANK_TABLE", &ranks()).replace(
        "SETTLED_BY_STATUS",
        &format!("{:?}", part::SETTLED_BY_STATUS),
    );
    for (table, names) in tables() {
        let prefix = format!("{table}.");
        let mut rendered = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(at) = rest.find(&prefix) {
            let starts_word = rest[..at]
                .chars()
                .last()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
            rendered.push_str(&rest[..at]);
            let after = &rest[at + prefix.len()..];
            let len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            let name = &after[..len];
            if starts_word {
                assert!(
                    names.contains(&name),
                    "a Redis script names {table}.{name}, which the rulebook does not have"
                );
                let _ = write!(rendered, "'{name}'");
            } else {
                rendered.push_str(&prefix);
                rendered.push_str(name);
            }
            rest = &after[len..];
        }
        rendered.push_str(rest);
        out = rendered;
    }
    out
}

fn ranks() -> String {
    let mut lua = String::from("{");
    for delivery in Delivery::ALL {
        let rank = Delivery::rank(Some(*delivery));
        let _ = write!(lua, "['{}'] = {rank}, ", delivery.as_str());
    }
    lua.push('}');
    lua
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_strings_and_unknown_names_are_refused() {
        let lua = "if o.state == PART.accepted and not XPART.y then RANK = RANK_TABLE end";
        assert_eq!(
            render(lua),
            "if o.state == 'accepted' and not XPART.y then RANK = {['sent'] = 1, \
             ['failed'] = 2, ['delivered'] = 3, ['read'] = 4, ['played'] = 4, } end"
        );
        let typo = std::panic::catch_unwind(|| render("PART.acepted"));
        assert!(typo.is_err());
    }

    #[test]
    fn every_script_names_only_what_the_rulebook_has() {
        let rendered = render(super::super::SCRIPT_BODY) + &render(super::super::LAYOUT_BODY);
        for (table, _) in tables() {
            assert!(!rendered.contains(&format!("{table}.")), "{table} left");
        }
    }
}
