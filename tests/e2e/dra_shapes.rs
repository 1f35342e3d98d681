//! The fake NVIDIA DRA driver (`muster dev dra-slices`, `harness::dra`) against the real API
//! server and kube-scheduler, no muster involved (the pods carry no PodGroup label): the API
//! server accepts each shape it publishes (the old one, MIG devices beside the GPUs, the
//! ComputeDomain plugin's channel and daemon, today's), kube-scheduler allocates a MIG claim and a
//! ComputeDomain channel claim from them, and removing takes the slices of both drivers.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use muster_dev::FIELD_MANAGER;
use muster_dev::dra::{
    COMPUTE_DOMAIN_CHANNEL_CLASS, COMPUTE_DOMAIN_DRIVER, DRIVER, MANAGED_BY_LABEL, MIG_DEVICE_CLASS, Shape,
};
use serde_json::{Value, json};

use crate::gangs::{LONG, TestNodes, merge, node_of};
use crate::harness::dra::{DraSlices, PublishOptions};
use crate::harness::{client, namespace, wait_for};

fn device_names(slice: &ResourceSlice) -> Vec<String> {
    slice.spec.devices.iter().flatten().map(|d| d.name.clone()).collect()
}

fn attribute_names(slice: &ResourceSlice, device: &str) -> Vec<String> {
    let device = slice.spec.devices.iter().flatten().find(|d| d.name == device).expect("the device");
    device.attributes.iter().flatten().map(|(k, _)| k.clone()).collect()
}

/// A claim `name` of one device of `class`, and a pod (no PodGroup: muster ignores it) on
/// `nodes` using it.
fn claim_and_pod(name: &str, class: &str, nodes: &TestNodes) -> (ResourceClaim, Pod) {
    let claim = json!({
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": class, "count": 1}}]}},
    });
    let mut pod = json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "dev", "resourceClaimName": name}],
            "containers": [{"name": "main", "image": "registry.invalid/none", "resources": {"claims": [{"name": "dev"}]}}],
        },
    });
    merge(&mut pod["spec"], nodes.placement());
    (serde_json::from_value(claim).expect("claim"), serde_json::from_value(pod).expect("pod"))
}

/// `(driver, pool, device)` of each result of `claim`'s allocation.
fn results(claim: &ResourceClaim) -> Vec<(String, String, String)> {
    let allocation = claim.status.as_ref().and_then(|s| s.allocation.as_ref());
    let results = allocation.and_then(|a| a.devices.as_ref()).and_then(|d| d.results.clone()).unwrap_or_default();
    results.into_iter().map(|r| (r.driver, r.pool, r.device)).collect()
}

fn labels_of(class: &DeviceClass) -> Value {
    json!(class.labels())
}

#[tokio::test]
async fn the_fake_driver_publishes_each_shape_and_kube_scheduler_allocates_mig_and_channel_devices() {
    let ns = namespace("dra-shapes");
    let nodes = TestNodes::add(&ns.name, 1, 8, 1).await;
    let node = nodes.names[0].clone();
    let client = client().await;

    // The old shape, GPU 3 in MIG mode (published as its MIG device only), and the
    // ComputeDomain plugin's slice.
    let options = PublishOptions { shape: Shape::Legacy, mig_parents: vec![3], compute_domain: true };
    let slices = DraSlices::publish_with(&nodes.names, &options).await;
    assert_eq!(slices.slices.len(), 2, "the GPU slice and the ComputeDomain slice");
    let gpu = slices.of(&node);
    let mut expected: Vec<String> = (0..8).filter(|i| *i != 3).map(|i| format!("gpu-{i}")).collect();
    expected.push("gpu-3-mig-1g10gb-19-0".into());
    assert_eq!(device_names(gpu), expected);
    let legacy = attribute_names(gpu, "gpu-0");
    assert!(legacy.contains(&"index".into()) && legacy.contains(&"minor".into()), "{legacy:?}");
    let cd = slices.of_driver(&node, COMPUTE_DOMAIN_DRIVER);
    assert_eq!(device_names(cd), ["channel-0", "daemon"]);
    let classes: Api<DeviceClass> = Api::all(client.clone());
    for name in [DRIVER, MIG_DEVICE_CLASS, COMPUTE_DOMAIN_CHANNEL_CLASS] {
        let class = classes.get(name).await.unwrap_or_else(|e| panic!("DeviceClass {name}: {e}"));
        assert_eq!(labels_of(&class)[MANAGED_BY_LABEL], FIELD_MANAGER, "{name}");
    }

    // kube-scheduler allocates from them: the MIG device for a mig.nvidia.com claim, channel-0
    // for a default-channel claim.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    for (name, class) in [("mig", MIG_DEVICE_CLASS), ("channel", COMPUTE_DOMAIN_CHANNEL_CLASS)] {
        let (claim, pod) = claim_and_pod(name, class, &nodes);
        claims.create(&PostParams::default(), &claim).await.expect("create the claim");
        pods.create(&PostParams::default(), &pod).await.expect("create the pod");
    }
    for (name, want) in [("mig", (DRIVER, "gpu-3-mig-1g10gb-19-0")), ("channel", (COMPUTE_DOMAIN_DRIVER, "channel-0"))]
    {
        let pod = wait_for(&format!("pod {name} bound"), LONG, || async {
            pods.get_opt(name).await.ok().flatten().filter(|p| node_of(p).is_some())
        })
        .await;
        assert_eq!(node_of(&pod), Some(node.as_str()));
        let claim = claims.get(name).await.expect("the claim");
        assert_eq!(results(&claim), [(want.0.to_string(), node.clone(), want.1.to_string())], "claim {name}");
    }
    println!("kube-scheduler allocated the MIG device and channel-0 on {node}");

    // Removing takes the slices of both drivers.
    let mut removed = slices.remove().await;
    removed.sort();
    assert_eq!(removed, [format!("{node}-{COMPUTE_DOMAIN_DRIVER}"), format!("{node}-{DRIVER}")]);
    drop(slices);

    // Today's shape, the default: no index or minor, the standard PCI and NUMA attributes.
    let today = DraSlices::publish(&nodes.names).await;
    assert_eq!(today.slices.len(), 1);
    assert_eq!(device_names(today.of(&node)), (0..8).map(|i| format!("gpu-{i}")).collect::<Vec<_>>());
    let attributes = attribute_names(today.of(&node), "gpu-5");
    for absent in ["index", "minor", "pcieBusID"] {
        assert!(!attributes.contains(&absent.to_string()), "{absent} in {attributes:?}");
    }
    for present in
        ["resource.kubernetes.io/pciBusID", "resource.kubernetes.io/pcieRoot", "resource.kubernetes.io/numaNode"]
    {
        assert!(attributes.contains(&present.to_string()), "{present} not in {attributes:?}");
    }
}
