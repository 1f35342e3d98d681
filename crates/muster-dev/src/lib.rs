//! `muster dev`: tools for the local development cluster (`hack/cluster-up.sh`), not for production.
//! `muster dev add-nodes` creates fake GPU nodes that kwok keeps Ready; the e2e harness calls
//! [`add_nodes`] directly. The node shape is built by the pure [`fake_node`]; only [`add_nodes`]
//! talks to the cluster. `muster dev fake-dcgm-exporter` ([`dcgm`]) reports their GPU health;
//! `muster dev dra-slices` ([`dra`]) publishes their GPUs as NVIDIA DRA ResourceSlices.

pub mod agent_load;
mod bench;
pub mod dcgm;
pub mod demo;
pub mod device_plugin;
pub mod dra;
mod exposition;
pub mod kubelet;
pub mod topology;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;

pub use topology::TopologyKind;
use topology::{ShapeError, gpu_topology, gpu_uuid};

/// Field manager of everything `muster dev` applies.
pub const FIELD_MANAGER: &str = "muster-dev";
/// The annotation (and taint key) kwok selects its nodes by; see `hack/cluster-up.sh`.
pub const KWOK_NODE: &str = "kwok.x-k8s.io/node";
/// The label holding a node's rack.
pub const RACK_LABEL: &str = "topology.muster.dev/rack";
/// The well-known zone label.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The GPU product label (as NVIDIA GPU feature discovery sets it).
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
pub use muster_api::GPU_RESOURCE;
use muster_api::GPU_TOPOLOGY_ANNOTATION;

/// Errors of `muster dev`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// No client could be made from the environment.
    #[error("kube client: {0}")]
    Infer(#[from] kube::config::InferConfigError),
    /// The API server refused or failed a request.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The requested GPU topology does not exist for these nodes.
    #[error(transparent)]
    Topology(#[from] ShapeError),
    /// A `--label` was not `key=value`.
    #[error("invalid label {0:?}: expected key=value")]
    Label(String),
    /// A node `muster dev dra-slices` cannot publish devices for.
    #[error("{0}")]
    Dra(String),
}

/// Arguments of `muster dev`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: DevCommand,
}

#[derive(clap::Subcommand, Debug)]
enum DevCommand {
    /// Create or update fake GPU nodes managed by kwok (server-side apply: safe to repeat).
    AddNodes(AddNodesArgs),
    /// Serve DCGM exporter metrics (temperature, memory, utilization) for fake GPU nodes.
    FakeDcgmExporter(dcgm::Args),
    /// Publish (or with --delete remove) fake NVIDIA DRA ResourceSlices (driver gpu.nvidia.com,
    /// today's shape unless --shape legacy; MIG devices with --mig, ComputeDomain slices with
    /// --compute-domain) for kwok GPU nodes, and their DeviceClasses.
    DraSlices(DraSlicesArgs),
    /// Check what `make demo` promises (gangs admitted, the oversize one explained, GPU
    /// indices disjoint); exit 0 only when all of it holds.
    DemoCheck(DemoCheckArgs),
    /// Scale benchmark (`make bench-e2e`): the same gangs as plain Jobs, upstream gang Jobs and
    /// MusterJobs on kwok GPU nodes, with pods bound per second, admission latency and muster's cost.
    Bench(bench::Args),
    /// Register fake nvidia.com/gpu devices (the GPUs of a recorded probe) with a real kubelet
    /// over the device-plugin API, answering as NVIDIA's device plugin does.
    DevicePlugin(device_plugin::Args),
    /// Node watch traffic of N node agents writing GPU health: on the Node (old) or in NodeGPUReports.
    AgentLoad(agent_load::Args),
}

/// Arguments of `muster dev demo-check`.
#[derive(clap::Args, Debug)]
struct DemoCheckArgs {
    /// Kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Print only a one-line summary (for progress while waiting).
    #[arg(long)]
    summary: bool,
    #[command(flatten)]
    expect: demo::Expectations,
}

/// Arguments of `muster dev dra-slices`.
#[derive(clap::Args, Debug)]
struct DraSlicesArgs {
    /// Kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The kwok GPU nodes.
    #[arg(long, num_args = 1.., required_unless_present = "all_gpu_nodes", conflicts_with = "all_gpu_nodes")]
    nodes: Vec<String>,
    /// Every kwok node with GPUs (with --delete: every slice of either driver this command
    /// published, and the DeviceClasses it made).
    #[arg(long)]
    all_gpu_nodes: bool,
    /// Remove the slices instead of publishing them (those of both drivers this command made;
    /// with --all-gpu-nodes also the DeviceClasses it made).
    #[arg(long)]
    delete: bool,
    /// Shape of the whole-GPU devices. `current`: as NVIDIA's driver publishes them today,
    /// device gpu-<minor> with type, uuid, productName, brand, architecture,
    /// cudaComputeCapability, driverVersion, cudaDriverVersion, resource.kubernetes.io/pciBusID,
    /// resource.kubernetes.io/pcieRoot, addressingMode, resource.kubernetes.io/numaNode (when the
    /// node's topology annotation gives a NUMA node) and a memory capacity: no index or minor
    /// attribute. `legacy`: as it published them until 2025, with index and minor int
    /// attributes and an unqualified pcieBusID.
    #[arg(long, default_value_t = dra::Shape::Current, conflicts_with = "delete")]
    shape: dra::Shape,
    /// Comma-separated GPU indices that also get one MIG device each, published beside the
    /// whole GPU in the same slice: profile 1g.10gb at memory slice 0, named
    /// gpu-<minor>-mig-1g10gb-19-0, type mig, parentUUID the GPU's uuid; also applies the
    /// DeviceClass mig.nvidia.com. Every node must have these GPUs.
    #[arg(long, value_name = "INDICES", value_delimiter = ',', conflicts_with = "delete")]
    mig: Vec<u32>,
    /// Also publish, per node, the ComputeDomain kubelet plugin's slice (driver
    /// compute-domain.nvidia.com: device channel-0, an IMEX channel, and device daemon) and the
    /// DeviceClass compute-domain-default-channel.nvidia.com.
    #[arg(long, conflicts_with = "delete")]
    compute_domain: bool,
}

/// Arguments of `muster dev add-nodes`.
#[derive(clap::Args, Debug)]
struct AddNodesArgs {
    /// Kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    nodes: FakeGpuNodes,
}

/// Default values of [`FakeGpuNodes`], shared by the CLI and [`Default`].
mod defaults {
    pub const COUNT: u32 = 4;
    pub const PREFIX: &str = "kwok-gpu-";
    pub const RACKS: u32 = 2;
    pub const ZONES: u32 = 1;
    pub const GPUS: u32 = 8;
    pub const GPU_MEMORY_MIB: u64 = 81920;
    pub const GPU_PRODUCT: &str = muster_core::devices::dra::nvidia::H100_PRODUCT;
    pub const CPU: &str = "128";
    pub const MEMORY: &str = "1Ti";
    pub const PODS: &str = "110";
    pub const UUID_SEED: &str = "muster";
}

/// A set of fake GPU nodes: names `<prefix><index>` for index in `start_index..start_index+count`.
/// Node `i` sits in rack `rack-<i mod racks>`, and rack `r` in zone `zone-<r mod zones>`, so a
/// node keeps its rack and zone whatever `count` and `start_index` a later call uses.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct FakeGpuNodes {
    /// How many nodes.
    #[arg(short = 'n', long, default_value_t = defaults::COUNT)]
    pub count: u32,
    /// Node name prefix; the index follows it.
    #[arg(long, default_value = defaults::PREFIX)]
    pub prefix: String,
    /// Index of the first node.
    #[arg(long, default_value_t = 0)]
    pub start_index: u32,
    /// Number of racks (label topology.muster.dev/rack).
    #[arg(long, default_value_t = defaults::RACKS, value_parser = clap::value_parser!(u32).range(1..))]
    pub racks: u32,
    /// Number of zones (label topology.kubernetes.io/zone).
    #[arg(long, default_value_t = defaults::ZONES, value_parser = clap::value_parser!(u32).range(1..))]
    pub zones: u32,
    /// GPUs per node (nvidia.com/gpu capacity); 0 makes CPU-only nodes.
    #[arg(long, default_value_t = defaults::GPUS)]
    pub gpus: u32,
    /// Memory of each GPU in MiB.
    #[arg(long, default_value_t = defaults::GPU_MEMORY_MIB)]
    pub gpu_memory_mib: u64,
    /// GPU product (label nvidia.com/gpu.product).
    #[arg(long, default_value = defaults::GPU_PRODUCT)]
    pub gpu_product: String,
    /// GPU interconnect written to the gpu.muster.dev/topology annotation.
    #[arg(long, value_enum, default_value_t = TopologyKind::Nvswitch)]
    pub topology: TopologyKind,
    /// Taint the nodes kwok.x-k8s.io/node=fake:NoSchedule (pods then need a toleration).
    #[arg(long)]
    pub taint: bool,
    /// GPUs only as DRA devices (`muster dev dra-slices`): no nvidia.com/gpu capacity, as on a
    /// node whose GPUs NVIDIA's DRA driver publishes instead of the device plugin.
    #[arg(long)]
    pub dra_only: bool,
    /// CPU capacity of each node.
    #[arg(long, default_value = defaults::CPU)]
    pub cpu: String,
    /// Memory capacity of each node.
    #[arg(long, default_value = defaults::MEMORY)]
    pub memory: String,
    /// Pod capacity of each node.
    #[arg(long, default_value = defaults::PODS)]
    pub pods: String,
    /// Seed of the GPU UUIDs: the same seed, node name and index always give the same UUID.
    #[arg(long, default_value = defaults::UUID_SEED)]
    pub uuid_seed: String,
    /// Extra node label, `key=value` (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
}

impl Default for FakeGpuNodes {
    fn default() -> Self {
        Self {
            count: defaults::COUNT,
            prefix: defaults::PREFIX.into(),
            start_index: 0,
            racks: defaults::RACKS,
            zones: defaults::ZONES,
            gpus: defaults::GPUS,
            gpu_memory_mib: defaults::GPU_MEMORY_MIB,
            gpu_product: defaults::GPU_PRODUCT.into(),
            topology: TopologyKind::Nvswitch,
            taint: false,
            dra_only: false,
            cpu: defaults::CPU.into(),
            memory: defaults::MEMORY.into(),
            pods: defaults::PODS.into(),
            uuid_seed: defaults::UUID_SEED.into(),
            labels: Vec::new(),
        }
    }
}

fn parse_label(s: &str) -> Result<(String, String), Error> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(Error::Label(s.to_string())),
    }
}

impl FakeGpuNodes {
    /// The node names, in index order.
    pub fn names(&self) -> Vec<String> {
        (self.start_index..self.start_index.saturating_add(self.count)).map(|i| format!("{}{i}", self.prefix)).collect()
    }
}

/// PURE: fake node number `index` of `spec`, with capacity and allocatable in its status.
pub fn fake_node(spec: &FakeGpuNodes, index: u32) -> Result<Node, ShapeError> {
    let name = format!("{}{index}", spec.prefix);
    let rack = index % spec.racks.max(1);
    let zone = rack % spec.zones.max(1);
    let mut labels: BTreeMap<String, String> = [
        ("type", "kwok".to_string()),
        ("kubernetes.io/hostname", name.clone()),
        ("kubernetes.io/os", "linux".to_string()),
        ("kubernetes.io/arch", "amd64".to_string()),
        (RACK_LABEL, format!("rack-{rack}")),
        (ZONE_LABEL, format!("zone-{zone}")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut annotations = BTreeMap::from([(KWOK_NODE.to_string(), "fake".to_string())]);
    let mut resources = BTreeMap::from([
        ("cpu".to_string(), Quantity(spec.cpu.clone())),
        ("memory".to_string(), Quantity(spec.memory.clone())),
        ("pods".to_string(), Quantity(spec.pods.clone())),
        ("ephemeral-storage".to_string(), Quantity("1Ti".into())),
    ]);
    if spec.gpus > 0 {
        labels.insert(GPU_PRODUCT_LABEL.into(), spec.gpu_product.clone());
        labels.insert("nvidia.com/gpu.count".into(), spec.gpus.to_string());
        labels.insert("nvidia.com/gpu.memory".into(), spec.gpu_memory_mib.to_string());
        if !spec.dra_only {
            resources.insert(GPU_RESOURCE.into(), Quantity(spec.gpus.to_string()));
        }
        let uuids: Vec<String> = (0..spec.gpus).map(|g| gpu_uuid(&spec.uuid_seed, &name, g)).collect();
        if let Some(t) = gpu_topology(spec.topology, &uuids, spec.gpu_memory_mib)? {
            annotations.insert(GPU_TOPOLOGY_ANNOTATION.into(), t.to_json());
        }
    }
    labels.extend(spec.labels.iter().cloned());
    let taints = spec.taint.then(|| {
        vec![Taint {
            key: KWOK_NODE.into(),
            value: Some("fake".into()),
            effect: "NoSchedule".into(),
            ..Taint::default()
        }]
    });
    Ok(Node {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec { taints, ..NodeSpec::default() }),
        status: Some(NodeStatus {
            capacity: Some(resources.clone()),
            allocatable: Some(resources),
            ..NodeStatus::default()
        }),
    })
}

/// A client from `kubeconfig`, or from the environment ($KUBECONFIG, ~/.kube/config, in-cluster).
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, Error> {
    let config = match kubeconfig {
        Some(path) => {
            Config::from_custom_kubeconfig(Kubeconfig::read_from(path)?, &KubeConfigOptions::default()).await?
        }
        None => Config::infer().await?,
    };
    Ok(Client::try_from(config)?)
}

/// Creates or updates the nodes of `spec` (server-side apply, idempotent) and sets their
/// capacity and allocatable through the status subresource. Returns the node names.
pub async fn add_nodes(client: &Client, spec: &FakeGpuNodes) -> Result<Vec<String>, Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut names = Vec::new();
    for index in spec.start_index..spec.start_index.saturating_add(spec.count) {
        let node = fake_node(spec, index)?;
        let name = node.metadata.name.clone().unwrap_or_default();
        let body = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": node.metadata,
            "spec": node.spec.unwrap_or_default(),
        });
        nodes.patch(&name, &params, &Patch::Apply(&body)).await?;
        // kwok's ready stage keeps whatever capacity/allocatable the status holds.
        let status = json!({ "apiVersion": "v1", "kind": "Node", "status": node.status.unwrap_or_default() });
        nodes.patch_status(&name, &params, &Patch::Apply(&status)).await?;
        names.push(name);
    }
    Ok(names)
}

async fn demo_check(args: &DemoCheckArgs) -> Result<Vec<demo::Finding>, Error> {
    demo::observe(args.kubeconfig.as_deref(), &args.expect).await
}

async fn run_demo_check(args: DemoCheckArgs) -> ExitCode {
    match demo_check(&args).await {
        Ok(findings) => {
            let passed = findings.iter().filter(|f| f.ok).count();
            if args.summary {
                let waiting: Vec<&str> = findings.iter().filter(|f| !f.ok).map(|f| f.what.as_str()).collect();
                println!(
                    "{passed}/{} checks hold{}",
                    findings.len(),
                    if waiting.is_empty() { String::new() } else { format!("; waiting: {}", waiting.join("; ")) }
                );
            } else {
                for f in &findings {
                    println!("{} {}", if f.ok { "ok  " } else { "FAIL" }, f.what);
                }
            }
            if passed == findings.len() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs `muster dev`. A long-running tool (the fake DCGM exporter) stops when `shutdown`
/// resolves: the binary passes its signal handling in (SIGTERM or Ctrl-C).
pub fn run(args: Args, shutdown: impl Future<Output = ()> + Send + 'static) -> ExitCode {
    let args = match args.command {
        DevCommand::AddNodes(args) => args,
        DevCommand::Bench(args) => return bench::run(args),
        DevCommand::DemoCheck(args) => return block_on(run_demo_check(args)),
        DevCommand::FakeDcgmExporter(args) => return dcgm::run(args, shutdown),
        DevCommand::DraSlices(args) => return block_on(run_dra_slices(args)),
        DevCommand::DevicePlugin(args) => return device_plugin::run(args, shutdown),
        DevCommand::AgentLoad(args) => return agent_load::run(args),
    };
    block_on(run_add_nodes(args))
}

/// Runs a subcommand's `future` on a single-threaded runtime; exit code 2 when no runtime can be
/// made. The `muster` binary's other subcommands run on it too (one helper, in the lower crate).
pub fn block_on<F: Future<Output = ExitCode>>(future: F) -> ExitCode {
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(future),
        Err(e) => {
            eprintln!("error: tokio runtime: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run_dra_slices(args: DraSlicesArgs) -> ExitCode {
    let result = async {
        let client = client(args.kubeconfig.as_deref()).await?;
        let nodes = if args.all_gpu_nodes && !args.delete {
            dra::fake_gpu_nodes(&client).await?
        } else if args.all_gpu_nodes {
            // Slices of nodes that are gone too.
            let slices: Api<k8s_openapi::api::resource::v1::ResourceSlice> = Api::all(client.clone());
            let lp = kube::api::ListParams::default().labels(&format!("{}={FIELD_MANAGER}", dra::MANAGED_BY_LABEL));
            slices.list(&lp).await?.items.into_iter().filter_map(|s| s.spec.node_name).collect()
        } else {
            args.nodes.clone()
        };
        if args.delete {
            let mut lines: Vec<String> = dra::unpublish(&client, &nodes)
                .await?
                .into_iter()
                .map(|n| format!("resourceslice/{n} deleted"))
                .collect();
            if args.all_gpu_nodes {
                lines.extend(
                    dra::delete_device_class(&client).await?.into_iter().map(|c| format!("deviceclass/{c} deleted")),
                );
            }
            Ok::<_, Error>(lines)
        } else {
            let opts = dra::PublishOptions {
                shape: args.shape,
                mig_parents: args.mig.clone(),
                compute_domain: args.compute_domain,
            };
            let published = dra::publish_with(&client, &nodes, &opts).await?;
            let classes = published.classes.into_iter().map(|c| format!("deviceclass/{c} applied"));
            let slices = published.slices.into_iter().map(|n| format!("resourceslice/{n} applied"));
            Ok(classes.chain(slices).collect())
        }
    }
    .await;
    match result {
        Ok(lines) => {
            for line in lines {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run_add_nodes(args: AddNodesArgs) -> ExitCode {
    let result = async {
        let client = client(args.kubeconfig.as_deref()).await?;
        add_nodes(&client, &args.nodes).await
    }
    .await;
    match result {
        Ok(names) => {
            let spec = &args.nodes;
            for name in names {
                println!("node/{name} applied ({} x {}, topology {})", spec.gpus, spec.gpu_product, spec.topology);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
        node.metadata.labels.as_ref()?.get(key).map(String::as_str)
    }

    #[test]
    fn cli_defaults_equal_default() {
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            nodes: FakeGpuNodes,
        }
        let parsed = <Wrapper as clap::Parser>::try_parse_from(["add-nodes"]).unwrap();
        assert_eq!(parsed.nodes, FakeGpuNodes::default());
    }

    #[test]
    fn node_carries_kwok_annotation_labels_and_gpus() {
        let node = fake_node(&FakeGpuNodes::default(), 3).unwrap();
        assert_eq!(node.metadata.name.as_deref(), Some("kwok-gpu-3"));
        let annotations = node.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[KWOK_NODE], "fake");
        assert!(annotations[GPU_TOPOLOGY_ANNOTATION].contains("\"NV18\""));
        assert_eq!(label(&node, "type"), Some("kwok"));
        assert_eq!(label(&node, "kubernetes.io/hostname"), Some("kwok-gpu-3"));
        assert_eq!(label(&node, RACK_LABEL), Some("rack-1"));
        assert_eq!(label(&node, ZONE_LABEL), Some("zone-0"));
        assert_eq!(label(&node, GPU_PRODUCT_LABEL), Some("NVIDIA-H100-80GB-HBM3"));
        let status = node.status.as_ref().unwrap();
        assert_eq!(status.allocatable.as_ref().unwrap()[GPU_RESOURCE], Quantity("8".into()));
        assert_eq!(status.capacity, status.allocatable);
        assert_eq!(node.spec.as_ref().unwrap().taints, None);
    }

    #[test]
    fn racks_nest_in_zones_and_do_not_depend_on_count() {
        let spec = FakeGpuNodes { racks: 4, zones: 2, ..FakeGpuNodes::default() };
        let racks: Vec<_> =
            (0..8).map(|i| label(&fake_node(&spec, i).unwrap(), RACK_LABEL).unwrap().to_string()).collect();
        assert_eq!(racks, ["rack-0", "rack-1", "rack-2", "rack-3", "rack-0", "rack-1", "rack-2", "rack-3"]);
        let zone_of = |i| label(&fake_node(&spec, i).unwrap(), ZONE_LABEL).unwrap().to_string();
        assert_eq!(zone_of(0), zone_of(2));
        assert_ne!(zone_of(0), zone_of(1));
        let other = FakeGpuNodes { count: 1, start_index: 5, ..spec.clone() };
        assert_eq!(fake_node(&other, 5).unwrap(), fake_node(&spec, 5).unwrap());
    }

    #[test]
    fn taint_none_topology_cpu_only_and_extra_labels() {
        let spec = FakeGpuNodes {
            taint: true,
            topology: TopologyKind::None,
            labels: vec![("muster.dev/e2e".into(), "ns-1".into())],
            ..FakeGpuNodes::default()
        };
        let node = fake_node(&spec, 0).unwrap();
        let taints = node.spec.as_ref().unwrap().taints.as_ref().unwrap();
        assert_eq!((taints[0].key.as_str(), taints[0].effect.as_str()), (KWOK_NODE, "NoSchedule"));
        assert!(!node.metadata.annotations.as_ref().unwrap().contains_key(GPU_TOPOLOGY_ANNOTATION));
        assert_eq!(label(&node, "muster.dev/e2e"), Some("ns-1"));
        let cpu_only = fake_node(&FakeGpuNodes { gpus: 0, ..FakeGpuNodes::default() }, 0).unwrap();
        assert_eq!(label(&cpu_only, GPU_PRODUCT_LABEL), None);
        assert!(!cpu_only.status.unwrap().capacity.unwrap().contains_key(GPU_RESOURCE));
    }

    #[test]
    fn cube_mesh_with_four_gpus_is_refused() {
        let spec = FakeGpuNodes { gpus: 4, topology: TopologyKind::CubeMesh, ..FakeGpuNodes::default() };
        assert!(matches!(fake_node(&spec, 0), Err(ShapeError::GpuCount { .. })));
    }

    #[test]
    fn names_follow_prefix_and_start_index() {
        let spec = FakeGpuNodes { count: 3, prefix: "gpu-".into(), start_index: 10, ..FakeGpuNodes::default() };
        assert_eq!(spec.names(), ["gpu-10", "gpu-11", "gpu-12"]);
    }

    #[test]
    fn labels_must_be_key_value() {
        assert_eq!(parse_label("a=b").unwrap(), ("a".into(), "b".into()));
        assert_eq!(parse_label("a=").unwrap(), ("a".into(), String::new()));
        assert!(parse_label("=b").is_err());
        assert!(parse_label("ab").is_err());
    }
}
