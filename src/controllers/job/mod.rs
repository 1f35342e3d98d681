//! The MusterJob reconciler: validate, compile the Workload and PodGroup (or, for a
//! MusterJobSet's child, only the PodGroup from the parent's Workload), run gated pods with
//! batch/v1 semantics, and report status and events. With DRA, it also makes the GPU
//! ResourceClaimTemplate of a job with `spec.gpuClaims` and the shared claims of its PodGroup.
//! The decisions live in `plan` and `claims` (pure).
//!
//! One concern per file:
//! - `watches`: the watch caches the reconciles share ([`JobContext`]) and the controller loop
//!   ([`run`]);
//! - `reconcile`: one reconcile, step by step: validate, choose the scheduling API, compile the
//!   groups, make the claims, sync the pods;
//! - `scheduling_api`: the scheduling API a job keeps (muster's or upstream's);
//! - `groups`: muster's Workload and PodGroup of a job, applied, and the groups its pods join;
//! - `native_groups`: the native (`scheduling.k8s.io`) Workload and PodGroup (upstream mode);
//! - `frozen`: the hashes of the fields frozen after creation;
//! - `claim_writes`: the GPU ResourceClaimTemplate and the PodGroup's shared claims, made;
//! - `sync`: a plan carried out: pods deleted and created, events, status, when to look again;
//! - `gang_attempt`: the gang attempt new pods carry;
//! - `create_pods`: pod creates in doubling batches;
//! - `status`: the job's status writes;
//! - `tracking`: the pods' tracking finalizer, removed once the status counts them.

/// The ResourceClaims a job's pods use (pure, in the core).
pub use muster_core::jobs::claims;
pub mod expected;
/// What the controller decides for a MusterJob (pure, in the core).
pub use muster_core::jobs::job as plan;

mod claim_writes;
mod create_pods;
mod frozen;
mod gang_attempt;
mod groups;
mod native_groups;
mod reconcile;
mod record;
mod scheduling_api;
mod status;
mod sync;
mod tracking;
mod watches;

pub use frozen::FROZEN_HASH_ANNOTATION;
pub use watches::{JobContext, run};

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "job";
/// Server-side apply field manager of this controller.
pub const FIELD_MANAGER: &str = "muster-job-controller";
