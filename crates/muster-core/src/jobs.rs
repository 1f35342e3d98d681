//! PURE: what muster's job controllers decide, from a job's spec, its status and what exists:
//! - [`job`]: for a MusterJob, the pods to create and delete and the status it reports;
//! - [`set`]: for a MusterJobSet, the child MusterJobs to create and delete and its status;
//! - [`claims`]: the ResourceClaimTemplates and group ResourceClaims a job's pods use.
//!
//! The controllers (`muster::controllers::{job, jobset}`) read the caches, call these, and
//! write what they return.

pub mod claims;
pub mod job;
pub mod set;
