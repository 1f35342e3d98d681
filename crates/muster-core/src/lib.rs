//! muster's pure core: plain data in, plain data out. No Kubernetes client, no async runtime,
//! no clock and no randomness (callers pass `now`); its only view of Kubernetes is the API
//! types (`muster-api`, k8s-openapi) and kube's `Resource` traits.
//!
//! - [`workloadbuilder`]: a MusterJob's or MusterJobSet's intent, validated with exact field
//!   paths and compiled into `Workload`, `PodGroup` and `CompositePodGroup` objects;
//! - [`scheduler`]: gang admission: the group forest, quorum, placement, preemption, what a
//!   group's status says;
//! - [`devices`]: GPUs: the topology model, index selection, health, the ledger, DRA;
//! - [`pods`]: what muster reads from a pod, in one place.
#![forbid(unsafe_code)]

pub mod conditions;
pub mod devices;
pub mod pods;
pub mod scheduler;
pub mod workloadbuilder;
