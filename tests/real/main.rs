//! The real-node lane (`make e2e-real`): muster installed with its chart as a user installs it,
//! on a control plane whose one real node (hack/real-node.sh: containerd, Debian's runc,
//! kubelet and kube-proxy, a CNI bridge) runs real containers, beside the kwok GPU nodes.
//!
//! One test, [`lane::real_node_lane`], runs the stages in order on one cluster, because each
//! builds on the one before (the install, then jobs on it, then a failover, an upgrade, the
//! uninstall). Every stage prints a line and its figures, and `target/e2e-real/report.md` gets
//! them all; the first stage that fails stops the lane with its reason.
//!
//! Needs root (kubelet, containerd, runc), iptables and runc (hack/host-deps.sh real).

#[allow(dead_code)]
#[path = "../e2e/harness.rs"]
mod harness;

mod lane;
mod node;
mod stages;
