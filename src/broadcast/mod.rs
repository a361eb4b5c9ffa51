//! Broadcasts: template campaigns to a business's customers: who gets one, with which
//! parameters, and who is left out and why ([`audience`]); the loop that sends them, paced and
//! once per recipient ([`sender`]). The lifecycles are in the store's rulebook
//! (`store::rules::broadcast`).

pub mod audience;
pub mod sender;

pub use self::sender::Broadcaster;
