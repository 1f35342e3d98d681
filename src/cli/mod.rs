//! Subcommands of the `muster` binary. Each is a thin wrapper over the library.

mod api_limit;
mod node_agent;
mod request_defaults;
mod run;
mod validate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
// Subcommands run on a single-threaded runtime: `muster dev`'s helper, one for the binary.
use muster_dev::block_on;

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
    /// Run the controller manager (reconcilers on the leader, health and metrics everywhere).
    Run(Box<run::Args>),
    /// Development tools for the local test cluster (hack/cluster-up.sh).
    Dev(muster_dev::Args),
    /// On a GPU node: publish its GPU topology (NVML, else nvidia-smi) as the Node's
    /// gpu.muster.dev/topology annotation, and the GPUs kubelet assigned and their health in the
    /// node's NodeGPUReport.
    NodeAgent(node_agent::Args),
    /// Generate the book's reference pages from the code (`make docs-ref`).
    #[command(subcommand, hide = true)]
    Docs(crate::docs::Command),
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
            Command::Run(args) => run::run(*args),
            Command::Dev(args) => muster_dev::run(args, crate::controllers::shutdown_signal()),
            Command::NodeAgent(args) => node_agent::run(args),
            Command::Docs(command) => crate::docs::run(command),
        }
    }
}
