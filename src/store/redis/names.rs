//! The rulebook's names as Lua tables, put in front of the scripts: a script writes
//! `PART.accepted`, never the bare string, so every state, reason and status name exists once
//! (in `store::rules` and `domain`), and a name the rulebook does not have fails the call
//! instead of writing a state no other backend knows. Meta's delivery ranks come from the same
//! table as the SQL backends'.

use std::fmt::Write;

use crate::domain::ReviewReason;
use crate::store::rules::batch::BatchState;
use crate::store::rules::item::ItemState;
use crate::store::rules::part::{Delivery, PartKind, PartState};
use crate::store::rules::review::ReviewState;

/// The Lua that defines every name table.
pub(super) fn preamble() -> String {
    let mut lua = String::from(
        "local STRICT = {__index = function(_, name)\n  \
         error('SABI_SCHEMA no such name in the rulebook: ' .. tostring(name))\nend}\n",
    );
    table(&mut lua, "PART", PartState::ALL.iter().map(|s| s.as_str()));
    table(&mut lua, "ITEM", ItemState::ALL.iter().map(|s| s.as_str()));
    table(
        &mut lua,
        "BATCH",
        BatchState::ALL.iter().map(|s| s.as_str()),
    );
    table(
        &mut lua,
        "REVIEW",
        ReviewState::ALL.iter().map(|s| s.as_str()),
    );
    table(
        &mut lua,
        "REASON",
        ReviewReason::ALL.iter().map(|r| r.as_str()),
    );
    table(
        &mut lua,
        "DELIVERY",
        Delivery::ALL.iter().map(|d| d.as_str()),
    );
    table(&mut lua, "KIND", PartKind::ALL.iter().map(|k| k.as_str()));
    lua.push_str("local RANK = {");
    for delivery in Delivery::ALL {
        let rank = Delivery::rank(Some(*delivery));
        let _ = write!(lua, "['{}'] = {rank}, ", delivery.as_str());
    }
    lua.push_str("}\n");
    lua
}

fn table<'a>(lua: &mut String, name: &str, names: impl Iterator<Item = &'a str>) {
    let _ = write!(lua, "local {name} = setmetatable({{");
    for n in names {
        let _ = write!(lua, "{n} = '{n}', ");
    }
    lua.push_str("}, STRICT)\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_a_plain_lua_identifier() {
        let lua = preamble();
        for line in lua.lines().filter(|l| l.contains("setmetatable")) {
            let body = &line[line.find('{').unwrap_or(0)..];
            for entry in body.split(", ").filter(|e| e.contains(" = ")) {
                let name = entry
                    .trim_start_matches('{')
                    .split(" = ")
                    .next()
                    .unwrap_or("");
                assert!(
                    name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                    "{name:?} in {line}"
                );
            }
        }
        assert!(lua.contains("PART = setmetatable({sandbox = 'sandbox'"));
        assert!(lua.contains("['read'] = 4"));
    }
}
