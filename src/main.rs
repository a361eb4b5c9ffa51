//! The `sabi` binary: parse the command line and hand over to [`sabi::cli`].

use clap::Parser;

fn main() -> std::process::ExitCode {
    sabi::cli::main(sabi::cli::Cli::parse())
}
