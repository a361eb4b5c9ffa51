//! Telemetry: structured logs through `tracing`.
//!
//! The filter comes from `SABI_LOG` (same syntax as `RUST_LOG`), `info` by default; the format
//! from `logging.format` (`SABI_LOG_FORMAT`): text, or one JSON object per line for log
//! pipelines. Logs go to stderr so that commands like `sabi inbox --json` keep stdout for their
//! output.
//!
//! Customers' phone numbers and words stay out of the logs unless `logging.customer_data` is
//! on: lines name a conversation by a short hash instead ([`conversation_tag`]).

use std::sync::OnceLock;

use sha2::{Digest, Sha256};
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;
use crate::domain::ConversationKey;

/// Logs at `SABI_LOG`'s levels, or at `level` and above when it is unset.
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_env("SABI_LOG").unwrap_or_else(|_| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    // A second init (tests in one process) keeps the first subscriber. JSON escapes what it
    // writes; text lines go through `Escaped`, and so have no colours of their own.
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(false)
            .with_writer(|| Escaped(std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder
            .with_writer(std::io::stderr)
            .json()
            .flatten_event(true)
            .try_init(),
    };
}

/// Writes text log lines with every control character but the line's end escaped: a value from
/// outside (a model's tool name, a message id) cannot forge a log line or reach a terminal as
/// an escape sequence.
struct Escaped<W>(W);

impl<W: std::io::Write> std::io::Write for Escaped<W> {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let (body, end) = match line.strip_suffix(b"\n") {
            Some(body) => (body, &b"\n"[..]),
            None => (line, &b""[..]),
        };
        if body.iter().any(|b| b.is_ascii_control() && *b != b'\t') {
            let mut escaped = Vec::with_capacity(line.len() + 16);
            for &b in body {
                match b {
                    b'\t' => escaped.push(b),
                    b if b.is_ascii_control() => {
                        escaped.extend_from_slice(format!("\\x{b:02x}").as_bytes());
                    }
                    b => escaped.push(b),
                }
            }
            escaped.extend_from_slice(end);
            self.0.write_all(&escaped)?;
        } else {
            self.0.write_all(line)?;
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::Escaped;

    #[test]
    fn a_log_line_keeps_its_end_and_loses_forged_ones() {
        let mut out = Escaped(Vec::new());
        out.write_all(b"tool=\"a\nINFO forged\x1b[31m\x07\"\n")
            .expect("written");
        assert_eq!(
            String::from_utf8(out.0).expect("utf-8"),
            "tool=\"a\\x0aINFO forged\\x1b[31m\\x07\"\n"
        );
    }
}
