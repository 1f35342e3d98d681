//! Tests of the Helm chart (`charts/muster`): rendering and lint without a cluster; then, on a
//! control plane of their own (the webhook configurations, cluster roles and CRDs they install
//! are cluster-wide, so they stay out of the e2e suite's cluster), server-side dry-run, install,
//! muster running with nothing but the chart's RBAC, refusals outside it, and upgrades.
//! Run with `make chart-test`.

#[allow(dead_code)]
#[path = "../e2e/harness.rs"]
mod harness;

mod apf;
mod install;
mod knobs;
mod node_agent;
mod observability;
mod rbac;
mod render;
mod support;
mod tenant;
mod upgrade;
