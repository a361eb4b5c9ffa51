//! One run of the store's script: an operation's name, its arguments as JSON, and the epoch
//! the node read at start; the reply is the operation's result as JSON.

use redis::{RedisError, Script};
use serde::de::DeserializeOwned;

use super::connection::Connection;
use crate::store::{Error, Result};

/// What a run of the script needs, shared by the store and its intake's gatherer.
#[derive(Clone)]
pub(super) struct Caller {
    pub(super) conn: Connection,
    pub(super) script: Script,
    /// `{prefix}`: every key starts with it.
    pub(super) tag: String,
    /// The store's epoch, read at open: a script refuses a call of another epoch.
    pub(super) epoch: String,
}

impl Caller {
    /// Runs one operation of the script with its arguments, already JSON.
    pub(super) async fn call<T: DeserializeOwned>(&self, op: &str, args: &str) -> Result<T> {
        let mut conn = self.conn.clone();
        let reply: String = self
            .script
            .key(&self.tag)
            .arg(op)
            .arg(args)
            .arg(&self.epoch)
            .invoke_async(&mut conn)
            .await
            .map_err(refused)?;
        serde_json::from_str(&reply)
            .map_err(|e| Error::Schema(format!("undecodable reply to {op}: {e}")))
    }
}

pub(super) fn unavailable(e: RedisError) -> Error {
    Error::Unavailable(e.to_string())
}

/// The script's refusals, and everything else as the server being unavailable.
pub(super) fn refused(e: RedisError) -> Error {
    match e.code() {
        Some("SABI_LEASE_LOST") => Error::LeaseLost,
        Some("SABI_NOT_FOUND") => Error::NotFound,
        Some("SABI_RESET") => reset(),
        _ => unavailable(e),
    }
}

pub(super) fn reset() -> Error {
    Error::Schema(
        "the Redis store was reset since this node started (its keys were lost or made again): \
         restart the node"
            .into(),
    )
}
