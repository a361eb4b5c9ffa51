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
fn refused(e: RedisError) -> Error {
    match e.code().and_then(refusal_of) {
        Some(refusal) => refusal,
        None => unavailable(e),
    }
}

/// An error a delivery's run answered inside `ingest_many` (`"SABI_<WHAT> why"`, or Redis's
/// own error text), read as [`refused`] reads a whole call's.
pub(super) fn refusal(why: &str) -> Error {
    let code = why.split_whitespace().next().unwrap_or_default();
    refusal_of(code).unwrap_or_else(|| Error::Unavailable(why.to_owned()))
}

fn refusal_of(code: &str) -> Option<Error> {
    match code {
        "SABI_LEASE_LOST" => Some(Error::LeaseLost),
        "SABI_NOT_FOUND" => Some(Error::NotFound),
        "SABI_RESET" => Some(reset()),
        _ => None,
    }
}

pub(super) fn reset() -> Error {
    Error::Schema(
        "the Redis store was reset since this node started (its keys were lost or made again): \
         restart the node"
            .into(),
    )
}
