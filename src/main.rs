//! The `muster` binary: parse the command line, run a subcommand.
#![forbid(unsafe_code)]
#![deny(warnings, rust_2018_idioms)]

use clap::Parser;

fn main() -> std::process::ExitCode {
    muster::cli::Cli::parse().run()
}
