//! Broadcasts: template campaigns to a business's customers: who gets one, with which
//! parameters, and who is left out and why ([`audience`], [`plan`]); the loop that sends them,
//! paced and once per recipient ([`sender`]); how it went ([`report`]); and customers' stop and
//! start requests ([`consent`]). A recipient's clock, for quiet hours and wall-clock times, is
//! their own zone, or their country's ([`zones`]). The lifecycles are in the store's rulebook (`store::rules::broadcast` and
//! `store::rules::consent`).

pub mod audience;
pub mod checks;
pub mod consent;
pub mod plan;
pub mod report;
pub mod sender;
pub mod zones;

pub use self::consent::Consent;
pub use self::sender::Broadcaster;
