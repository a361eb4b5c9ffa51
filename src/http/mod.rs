//! HTTP plumbing shared by every route: the one error type and its table of codes, and the
//! server's connection-level defences.

mod error;
pub mod serve;

pub use self::error::{AddressRule, ApiError};
