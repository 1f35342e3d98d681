//! The `muster` binary: parse the command line, run a subcommand.
#![forbid(unsafe_code)]
#![deny(warnings, rust_2018_idioms)]

use clap::Parser;

/// jemalloc, not the system allocator: see Cargo.toml.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    muster::cli::Cli::parse().run()
}
