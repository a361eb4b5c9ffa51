//! HTTP plumbing shared by every route: the one error type and its table of codes.

mod error;

pub use self::error::ApiError;
