//! `kubectl-muster`: the kubectl plugin (`kubectl muster list | why | suspend | resume`). kubectl
//! runs it when it is on PATH; the logic lives in the `kubectl_muster` library.
#![forbid(unsafe_code)]
#![deny(warnings, rust_2018_idioms)]

use clap::Parser;

fn main() -> std::process::ExitCode {
    kubectl_muster::Cli::parse().run()
}
