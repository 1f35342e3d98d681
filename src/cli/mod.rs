//! Subcommands of the `muster` binary. Each is a thin wrapper over the library.

mod node_agent;
mod validate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// muster: gang admission and GPU topology for batch and AI jobs on Kubernetes.
#[derive(Parser, Debug)]
#[command(name = "muster", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print every CRD muster serves as YAML (apply with `kubectl apply --server-side -f -`).
    Crds,
    /// Validate MusterJob and MusterJobSet manifests offline, as the cluster would.
    Validate(validate::Args),
    /// Describe this node's GPUs and links from nvidia-smi as the gpu.muster.dev/topology annotation.
    NodeAgent(node_agent::Args),
}

impl Cli {
    /// Runs the chosen subcommand and returns the process exit code.
    pub fn run(self) -> ExitCode {
        match self.command {
            Command::Crds => match crate::crds::all_yaml() {
                Ok(yaml) => {
                    print!("{yaml}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            },
            Command::Validate(args) => validate::run(args),
            Command::NodeAgent(args) => node_agent::run(args),
        }
    }
}
