//! Broadcasts: template campaigns to a business's customers. So far, the audience: who gets a
//! broadcast, with which parameters, and who is left out and why ([`audience`]). The
//! recipients' lifecycle is in the store's rulebook (`store::rules::broadcast`).

pub mod audience;
