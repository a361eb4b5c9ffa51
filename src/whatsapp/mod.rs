//! Meta's WhatsApp Cloud API as Sabi speaks it, for every stage that does: the Graph API client
//! (the sender's messages, the agent's media downloads), the webhook signature (also Sabi's own
//! HMAC for tools and vouched web visitors) and the wire format of Meta's JSON.

pub mod graph;
pub mod signature;
pub mod wire;

pub use self::signature::{Rejection, sign, verify};
