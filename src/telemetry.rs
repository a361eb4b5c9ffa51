//! Telemetry: structured logs through `tracing`.
//!
//! The filter comes from `SABI_LOG` (same syntax as `RUST_LOG`), `info` by default; the format
//! from `logging.format` (`SABI_LOG_FORMAT`): text, or one JSON object per line for log
//! pipelines. Logs go to stderr so that commands like `sabi inbox --json` keep stdout for their
//! output.
//!
//! Customers' phone numbers and words stay out of the logs unless `logging.customer_data` is
//! on: lines name a conversation by a short hash instead ([`conversation_tag`]).

use std::io::IsTerminal;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;
use crate::domain::ConversationKey;

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env("SABI_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests in one process) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// A short name for a conversation that does not reveal the customer: within one process the
/// same conversation always gets the same tag, so its lines can be followed. The hash is keyed
/// with a random per-process key, so a tag cannot be turned back into a phone number by trying
/// them all.
pub fn conversation_tag(key: &ConversationKey) -> String {
    static KEY: OnceLock<[u8; 32]> = OnceLock::new();
    let secret = KEY.get_or_init(|| {
        let mut key = [0u8; 32];
        // Without randomness the tag is only unkeyed; it still names no customer directly.
        let _ = getrandom::fill(&mut key);
        key
    });
    let digest = Sha256::new()
        .chain_update(secret)
        .chain_update(key.channel.as_str())
        .chain_update([0])
        .chain_update(&key.business)
        .chain_update([0])
        .chain_update(&key.customer)
        .finalize();
    hex::encode(&digest[..6])
}
