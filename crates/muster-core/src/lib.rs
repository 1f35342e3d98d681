//! muster's pure core: plain data in, plain data out. No Kubernetes client, no async runtime,
//! no clock and no randomness (callers pass `now`); its only view of Kubernetes is the API
//! types (`muster-api`, k8s-openapi) and kube's `Resource` traits.
//!
//! - [`workloadbuilder`]: a MusterJob's or MusterJobSet's intent, validated with exact field
//!   paths and compiled into `Workload`, `PodGroup` and `CompositePodGroup` objects;
//! - [`scheduler`]: gang admission: the group forest, quorum, placement, preemption, what a
//!   group's status says;
//! - [`devices`]: GPUs: the topology model, index selection, health, the ledger, DRA;
//! - [`jobs`]: what the job controllers decide for a MusterJob or MusterJobSet;
//! - [`pods`]: what muster reads from a pod, in one place;
//! - [`owners`] and [`conditions`]: owner references and status conditions, kept the
//!   Kubernetes way.
#![forbid(unsafe_code)]

pub mod conditions;
pub mod devices;
pub mod jobs;
pub mod owners;
pub mod pods;
pub mod scheduler;
pub mod workloadbuilder;
