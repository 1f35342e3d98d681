//! muster: gang admission and GPU topology for batch and AI jobs on Kubernetes.
//!
//! This crate is the controller manager, the top floor of the workspace: the controllers, the
//! webhook, the node agent's I/O and the `muster` binary. The floors below it are crates of
//! their own: the API types (`muster-api`, re-exported as [`crds`]), the pure core
//! (`muster-core`: [`workloadbuilder`], [`scheduler`], [`devices`], [`pods`]), and the test
//! fakes behind `muster dev` (`muster-dev`). The kubectl plugin is `kubectl-muster`.
#![forbid(unsafe_code)]

pub mod agent;
pub mod cli;
pub mod controllers;
pub mod docs;
pub mod webhook;

/// The API types (the `muster-api` crate).
pub use muster_api as crds;
/// The pure core's modules (the `muster-core` crate), under the names the shell uses.
pub use muster_core::{devices, pods, scheduler, workloadbuilder};

#[cfg(test)]
mod floors;
