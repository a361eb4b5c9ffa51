//! The store's rulebook: every lifecycle's states, the events that move them, and which moves
//! are allowed, written once as pure functions. Backends load, ask, and persist; where a
//! backend decides inside one round trip (the Redis scripts, claims in SQL), the conformance
//! suite's walk (`tests/it/conformance.rs`, `every_transition_*`) drives every transition on
//! every backend and compares the outcome with these tables.
//!
//! State names exist here alone: backends and callers use the enums' `as_str`, and SQL lists
//! of states are made by the functions below.

pub mod batch;
pub mod broadcast;
pub mod category;
pub mod consent;
pub mod erasure;
pub mod hours;
pub mod identity;
pub mod item;
pub mod part;
pub mod price;
pub mod retention;
pub mod review;
pub mod turn;

/// Names an enum's variants: `ALL`, `as_str`, `parse`, `Display`, serialising as the name, and
/// comparison with a name.
macro_rules! named {
    ($name:ident { $($variant:ident => $text:literal),* $(,)? }) => {
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),*
                }
            }

            pub fn parse(name: &str) -> Option<$name> {
                $name::ALL.iter().copied().find(|s| s.as_str() == name)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }
    };
}
pub(crate) use named;

/// The states `keep` picks out of `all`, as an SQL list: `('queued', 'window_closed')`.
pub fn sql_list<S: Copy>(
    all: &[S],
    name: fn(S) -> &'static str,
    keep: impl Fn(S) -> bool,
) -> String {
    let names: Vec<String> = all
        .iter()
        .copied()
        .filter(|s| keep(*s))
        .map(|s| format!("'{}'", name(s)))
        .collect();
    format!("({})", names.join(", "))
}
