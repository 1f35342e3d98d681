//! Generates the gRPC client and server of kubelet's device-plugin API (v1beta1) from
//! muster's own wire-compatible proto (`proto/deviceplugin/v1beta1/deviceplugin.proto`), for
//! `muster dev device-plugin`. protox parses the proto in Rust, so no protoc is needed.

use std::error::Error;

/// The proto directory, the include root of every file in it.
const PROTO_ROOT: &str = "proto";

/// The device-plugin API, v1beta1.
const DEVICE_PLUGIN: &str = "proto/deviceplugin/v1beta1/deviceplugin.proto";

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    let fds = protox::compile([DEVICE_PLUGIN], [PROTO_ROOT])?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(fds)?;
    Ok(())
}
