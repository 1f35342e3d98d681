//! End-to-end tests against a real control plane (etcd, kube-apiserver, kube-scheduler,
//! kube-controller-manager, kwok), built by tools/k8s and started once per run by [`harness`],
//! with muster itself running against it.
//! Run with `make e2e`; the cluster's logs stay in `target/e2e-cluster-<pid>/logs`.

mod admission;
mod cases;
mod certs;
mod chaos;
mod claims;
mod controlplane;
mod differential;
mod dra;
mod dra_gangs;
mod dra_race;
mod dra_shapes;
mod gangs;
mod gpus;
mod harness;
mod hostile;
mod isolation;
mod job_semantics;
mod jobs;
mod jobset_semantics;
mod node_agent;
mod operating;
mod placement_diff;
mod plugin;
mod preemption;
mod rollback;
mod upstream;
mod webhook;
