//! Generates the gRPC client and server of kubelet's PodResources API from the vendored proto
//! (`proto/`, see its README). protox parses the proto in Rust, so no protoc is needed.

use std::error::Error;

/// The vendored proto directory, the include root of every file in it.
const PROTO_ROOT: &str = "proto";

/// The PodResources API, v1.
const POD_RESOURCES: &str = "proto/k8s.io/kubelet/podresources/v1/api.proto";

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    let fds = protox::compile([POD_RESOURCES], [PROTO_ROOT])?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(fds)?;
    Ok(())
}
