//! muster's admission webhooks reached as inside a cluster: the apiserver calls the webhook
//! Service named in the configurations (`clientConfig.service`), the Service's EndpointSlice names
//! an address where a real `muster run` listens, and the caBundle is the one muster injected.
//!
//! No container runtime runs pods here, so muster runs in a network namespace of its own with a
//! non-loopback address (198.51.100.2, an EndpointSlice may not name 127.0.0.0/8), and
//! kube-apiserver routes to endpoints (`--enable-aggregator-routing=true`: it sends webhook calls to
//! a Service's EndpointSlices, not its ClusterIP, which no kube-proxy routes). See [`testhost`].
//! The webhook configurations are cluster-wide with fixed names, so these tests have a control
//! plane of their own (the e2e suite's muster registers the same names by URL).
//!
//! Run with `make e2e-service`, as root with iproute2 (`ip`). Logs stay in
//! `target/e2e-cluster-<pid>/logs` (muster's in `muster-<test>.log`).

#[allow(dead_code)]
#[path = "../e2e/harness.rs"]
mod harness;

mod testhost;
mod webhooks;
