//! The node agent's I/O with the node it runs on: kubelet's PodResources API over its unix
//! socket ([`kubelet`]), and NVML from the host's driver ([`nvml`]). What the agent decides
//! from them is pure and lives in `devices::report` and `devices::probe`; the loop that
//! publishes it onto the Node is `muster node-agent` (`cli/node_agent.rs`).

pub mod kubelet;
pub mod nvml;
