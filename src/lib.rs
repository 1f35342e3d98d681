//! muster: gang admission and GPU topology for batch and AI jobs on Kubernetes.
//!
//! The pure core (`workloadbuilder`, `scheduler`, `devices`) takes plain data and
//! returns plain data; `controllers` and `webhook` are the thin imperative shell.
#![forbid(unsafe_code)]

pub mod agent;
pub mod cli;
pub mod controllers;
pub mod crds;
pub mod devices;
pub mod plugin;
pub mod pods;
pub mod scheduler;
pub mod webhook;
pub mod workloadbuilder;
