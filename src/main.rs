//! The `muster` binary: parse the command line, run a subcommand.
#![forbid(unsafe_code)]
#![deny(warnings, rust_2018_idioms)]

use clap::Parser;

/// jemalloc, not the system allocator: see Cargo.toml. The `system-allocator` feature keeps the
/// system's, so heaptrack sees every allocation (`make bench-e2e BENCH_PROFILE=heaptrack`).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    muster::cli::Cli::parse().run()
}
