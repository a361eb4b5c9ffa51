//! A closed stdout ends a command quietly and with success: `sabi inbox | head` has printed
//! what its reader wanted, and the rest had nobody to read it. Rust ignores SIGPIPE, so a write
//! to a closed pipe fails instead of ending the process: `print!` panics on it and `writeln!`
//! returns the error. Both are recognised here, once for every command.

use std::io::ErrorKind;
use std::panic::PanicHookInfo;

/// From here on, `print!`'s panic on a closed stdout ends the process with success, unreported;
/// every other panic is reported as before.
pub(super) fn end_quietly_when_closed() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if printing_to_closed_stdout(info) {
            // Nothing is left to say to anyone: what was printed was all the reader wanted.
            std::process::exit(0);
        }
        report(info);
    }));
}

/// Whether a command's error is a write to a closed stdout (`writeln!` on a locked stdout).
pub(super) fn closed(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == ErrorKind::BrokenPipe)
    })
}

/// `print!` panics with "failed printing to stdout: " and the I/O error, the only account of
/// its failure it gives.
fn printing_to_closed_stdout(info: &PanicHookInfo<'_>) -> bool {
    let payload = info.payload();
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    message.starts_with("failed printing to stdout")
        && message
            .to_lowercase()
            .contains(&ErrorKind::BrokenPipe.to_string())
}
