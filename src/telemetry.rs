//! Telemetry: structured logs through `tracing`.
//!
//! The filter comes from `SABI_LOG` (same syntax as `RUST_LOG`), `info` by default. Logs go to
//! stderr so that commands like `sabi inbox --json` keep stdout for their output.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_env("SABI_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // A second init (tests in one process) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
