//! A closed stdout ends a command quietly and with success: `sabi inbox | head` has printed
//! what its reader wanted, and the rest had nobody to read it. Rust ignores SIGPIPE, so a write
//! to a closed pipe fails instead of ending the process: `print!` panics on it and `writeln!`
//! returns the error. Both are recognised here, once for every command; a broken pipe anywhere
//! else (a store's connection) stays an error.

use std::io::{ErrorKind, StdoutLock, Write};
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

/// Whether a command's error is a write to a closed stdout through [`stdout`].
pub(super) fn closed(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .is_some_and(|inner| inner.is::<ClosedStdout>())
    })
}

/// Stdout, locked, whose writes tell a closed reader apart from every other broken pipe.
pub(super) fn stdout() -> Stdout {
    Stdout(std::io::stdout().lock())
}

pub(super) struct Stdout(StdoutLock<'static>);

/// The reader of stdout went away.
#[derive(Debug, thiserror::Error)]
#[error("stdout was closed")]
struct ClosedStdout;

fn marked(e: std::io::Error) -> std::io::Error {
    match e.kind() {
        ErrorKind::BrokenPipe => std::io::Error::new(ErrorKind::BrokenPipe, ClosedStdout),
        _ => e,
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf).map_err(marked)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush().map_err(marked)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_closed_stdout_ends_quietly_never_another_broken_pipe() {
        let reader_gone = marked(std::io::Error::from(ErrorKind::BrokenPipe));
        let with_context = anyhow::Error::from(reader_gone).context("printing the inbox");
        assert!(closed(&with_context));

        // A store's connection that broke mid-command is a failure to report.
        let connection = std::io::Error::from(ErrorKind::BrokenPipe);
        assert!(!closed(
            &anyhow::Error::from(connection).context("erasing the customer")
        ));
        let other = marked(std::io::Error::from(ErrorKind::PermissionDenied));
        assert!(!closed(&anyhow::Error::from(other)));
    }
}
