//! kubelet's PodResources API, v1: the messages, the client the node agent asks
//! (`muster node-agent`) and the server the fake kubelet answers with (`muster-dev`),
//! generated at build time from the vendored `proto/` (see `build.rs` and `proto/README.md`).
//! Nothing here decides anything: what the answers mean for muster is `devices::report`'s.

/// The messages, client and server of the PodResources API, generated from
/// `proto/k8s.io/kubelet/podresources/v1/api.proto` (proto package `v1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("v1");
}
