use std::collections::{HashMap, HashSet};

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceClass, DeviceTaint, ResourceClaim, ResourceClaimSpec, ResourceSlice,
};
use proptest::prelude::*;
use serde_json::json;

use super::fixtures::each_shape::{on_each_shape, set_shape, shape};
use super::fixtures::{
    NVIDIA_GPU_SELECTOR, Shape, device_class, nvidia_device_class, nvidia_slice, nvidia_slice_shaped,
};
use super::*;
use crate::devices::{GpuSet, SelectOptions, select, set_cost};
use crate::scheduler::Labels;

const UUIDS: [&str; 8] = [
    "GPU-00000000-0000-0000-0000-000000000000",
    "GPU-11111111-1111-1111-1111-111111111111",
    "GPU-22222222-2222-2222-2222-222222222222",
    "GPU-33333333-3333-3333-3333-333333333333",
    "GPU-44444444-4444-4444-4444-444444444444",
    "GPU-55555555-5555-5555-5555-555555555555",
    "GPU-66666666-6666-6666-6666-666666666666",
    "GPU-77777777-7777-7777-7777-777777777777",
];

/// The driver's slice for `node` in the running test's shape.
fn shaped(node: &str, gpus: &[(usize, &str)], generation: i64) -> ResourceSlice {
    nvidia_slice_shaped(node, gpus, generation, shape())
}

fn eight(node: &str) -> ResourceSlice {
    let gpus: Vec<(usize, &str)> = UUIDS.iter().enumerate().map(|(i, u)| (i, *u)).collect();
    shaped(node, &gpus, 1)
}

fn inventory(slices: &[ResourceSlice], classes: &[DeviceClass], claims: &[ResourceClaim]) -> Inventory {
    Inventory::new(slices, classes, claims, NVIDIA_GPU_DRIVER, &HashMap::new())
}

fn spec(v: serde_json::Value) -> ResourceClaimSpec {
    match serde_json::from_value(v) {
        Ok(s) => s,
        Err(e) => panic!("test spec does not parse: {e}"),
    }
}

/// A claim for `count` GPUs of the NVIDIA class with extra request selectors.
fn gpu_spec(count: i64, selectors: &[&str]) -> ResourceClaimSpec {
    let selectors: Vec<_> = selectors.iter().map(|e| json!({"cel": {"expression": e}})).collect();
    spec(json!({"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": NVIDIA_GPU_DRIVER, "count": count, "selectors": selectors}}]}}))
}

fn allocated_claim(ns: &str, name: &str, devices: &[(&str, &str)]) -> ResourceClaim {
    let results: Vec<_> = devices
        .iter()
        .map(|(pool, d)| json!({"request": "gpu", "driver": NVIDIA_GPU_DRIVER, "pool": pool, "device": d}))
        .collect();
    match serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": NVIDIA_GPU_DRIVER}}]}},
        "status": {"allocation": {"devices": {"results": results}}}
    })) {
        Ok(c) => c,
        Err(e) => panic!("test claim does not parse: {e}"),
    }
}

fn set(indices: &[usize]) -> GpuSet {
    GpuSet::from_indices(indices.iter().copied()).unwrap_or_default()
}

// === CEL selectors ===

#[test]
fn selectors_supported_forms_evaluate_like_kube_scheduler() {
    on_each_shape(selectors_supported_forms_on_the_running_shape);
}

/// Selectors on the attributes only one shape publishes: the legacy `index`/`minor` ints, or
/// today's `uuid`, `pcieRoot`, `numaNode`.
fn shape_selectors() -> Vec<(&'static str, &'static str, &'static [usize])> {
    match shape() {
        Shape::Legacy => vec![
            (
                "unqualified attribute is under the driver's domain",
                "device.attributes['gpu.nvidia.com'].index == 3",
                &[3],
            ),
            ("int comparison", "device.attributes['gpu.nvidia.com'].minor >= 6", &[6, 7]),
            ("in on a list", "device.attributes['gpu.nvidia.com'].index in [1, 4]", &[1, 4]),
            ("exists macro", "[2, 5].exists(i, device.attributes['gpu.nvidia.com'].index == i)", &[2, 5]),
            ("legacy index published", "has(device.attributes['gpu.nvidia.com'].index)", &[0, 1, 2, 3, 4, 5, 6, 7]),
        ],
        Shape::Current => vec![
            (
                "unqualified attribute is under the driver's domain",
                "device.attributes['gpu.nvidia.com'].uuid == 'GPU-33333333-3333-3333-3333-333333333333'",
                &[3],
            ),
            ("int comparison", "device.attributes['resource.kubernetes.io'].numaNode >= 1", &[4, 5, 6, 7]),
            (
                "in on a list",
                "device.attributes['resource.kubernetes.io'].pcieRoot in ['pci0000:01', 'pci0000:04']",
                &[1, 4],
            ),
            (
                "exists macro",
                "['pci0000:02', 'pci0000:05'].exists(r, device.attributes['resource.kubernetes.io'].pcieRoot == r)",
                &[2, 5],
            ),
            ("no index today", "has(device.attributes['gpu.nvidia.com'].index)", &[]),
            ("no minor today", "has(device.attributes['gpu.nvidia.com'].minor)", &[]),
            (
                "addressingMode today",
                "device.attributes['gpu.nvidia.com'].addressingMode == 'HMM'",
                &[0, 1, 2, 3, 4, 5, 6, 7],
            ),
        ],
    }
}

fn selectors_supported_forms_on_the_running_shape() {
    let inv = inventory(&[eight("n1")], &[nvidia_device_class()], &[]);
    let mut table: Vec<(&str, &str, &[usize])> = shape_selectors();
    table.extend::<[(&str, &str, &[usize]); _]>([
        ("class selector alone", "true", &[0, 1, 2, 3, 4, 5, 6, 7]),
        (
            "qualified attribute is under its own domain",
            "device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:02'",
            &[2],
        ),
        ("false selector", "device.attributes['gpu.nvidia.com'].type == 'mig'", &[]),
        ("has() on a present attribute", "has(device.attributes['gpu.nvidia.com'].uuid)", &[0, 1, 2, 3, 4, 5, 6, 7]),
        ("has() on a domain the device lacks is false", "has(device.attributes['example.com'].uuid)", &[]),
        ("in on an attribute map", "'uuid' in device.attributes['gpu.nvidia.com']", &[0, 1, 2, 3, 4, 5, 6, 7]),
        (
            "string functions",
            "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H100') && device.attributes['gpu.nvidia.com'].productName.lowerAscii().contains('hbm3')",
            &[0, 1, 2, 3, 4, 5, 6, 7],
        ),
        ("matches", "device.attributes['gpu.nvidia.com'].uuid.matches('^GPU-[57]')", &[5, 7]),
        ("driver", "device.driver == 'gpu.nvidia.com'", &[0, 1, 2, 3, 4, 5, 6, 7]),
        ("allowMultipleAllocations defaults to false", "!device.allowMultipleAllocations", &[0, 1, 2, 3, 4, 5, 6, 7]),
        (
            "quantity compareTo",
            "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
            &[0, 1, 2, 3, 4, 5, 6, 7],
        ),
        (
            "quantity isGreaterThan false",
            "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('100Gi'))",
            &[],
        ),
        (
            "quantity isLessThan",
            "device.capacity['gpu.nvidia.com'].memory.isLessThan(quantity('80Gi'))",
            &[0, 1, 2, 3, 4, 5, 6, 7],
        ),
        (
            "quantity equality is by value",
            "device.capacity['gpu.nvidia.com'].memory == quantity('81559Mi')",
            &[0, 1, 2, 3, 4, 5, 6, 7],
        ),
        (
            "semver attribute",
            "device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('550.54.15'))",
            &[0, 1, 2, 3, 4, 5, 6, 7],
        ),
        (
            "semver compareTo",
            "device.attributes['gpu.nvidia.com'].cudaComputeCapability.compareTo(semver('9.0.0')) == 0",
            &[0, 1, 2, 3, 4, 5, 6, 7],
        ),
        (
            "semver isLessThan false",
            "device.attributes['gpu.nvidia.com'].cudaComputeCapability.isLessThan(semver('8.0.0'))",
            &[],
        ),
        (
            "semver precedence is numeric",
            "semver('1.10.0').isGreaterThan(semver('1.9.0')) && semver('1.0.0-rc.1').isLessThan(semver('1.0.0'))",
            &[0, 1, 2, 3, 4, 5, 6, 7],
        ),
        ("semver parts", "device.attributes['gpu.nvidia.com'].driverVersion.major() == 580", &[0, 1, 2, 3, 4, 5, 6, 7]),
    ]);
    for (rule, expression, want) in table {
        let req = match inv.request_of(&gpu_spec(1, &[expression])) {
            Ok(r) => r,
            Err(e) => panic!("{rule}: {e}"),
        };
        assert_eq!(inv.offer(&req, "n1"), Ok(set(want)), "{}: {rule}: {expression}", shape());
    }
}

#[test]
fn selectors_unsupported_forms_are_errors_naming_the_field() {
    on_each_shape(|| {
        let inv = inventory(&[eight("n1")], &[nvidia_device_class()], &[]);
        let table: &[(&str, &str, &str)] = &[
            ("syntax error", "device.driver ==", "compilation failed"),
            ("undeclared variable", "gpu.index == 1", "undeclared reference to `gpu`"),
            ("unsupported function", "ip('10.0.0.1') == ip('10.0.0.1')", "function `ip` is not supported"),
            ("cel.bind is not supported", "cel.bind(x, 1, x == 1)", "function `bind` is not supported"),
            ("message construction", "Foo{a: 1} == Foo{a: 1}", "message construction"),
        ];
        for (rule, expression, why) in table {
            let err = inv.request_of(&gpu_spec(1, &["true", expression])).err();
            match err {
                Some(ClaimError::Selector { field, expression: e, why: w }) => {
                    assert_eq!(field, "spec.devices.requests[0].exactly.selectors[1].cel.expression", "{rule}");
                    assert_eq!(&e, expression, "{rule}");
                    assert!(w.contains(why), "{rule}: {w}");
                }
                other => panic!("{rule}: want a selector error, got {other:?}"),
            }
        }
        let broken = device_class("broken", "device.nope(1)");
        let inv = inventory(&[eight("n1")], &[broken], &[]);
        let claim = spec(json!({"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "broken"}}]}}));
        match inv.request_of(&claim) {
            Err(ClaimError::Selector { field, .. }) => {
                assert_eq!(field, "DeviceClass broken spec.selectors[0].cel.expression")
            }
            other => panic!("want a class selector error, got {other:?}"),
        }
    });
}

#[test]
fn runtime_errors_fail_the_request_never_a_silent_false() {
    on_each_shape(runtime_errors_on_the_running_shape);
}

fn runtime_errors_on_the_running_shape() {
    let inv = inventory(&[eight("n1")], &[nvidia_device_class()], &[]);
    let mismatch = match shape() {
        Shape::Legacy => {
            "device.attributes['gpu.nvidia.com'].index == 'one' || device.capacity['gpu.nvidia.com'].memory.isLessThan(semver('1.0.0'))"
        }
        Shape::Current => {
            "device.attributes['resource.kubernetes.io'].numaNode == 'one' || device.capacity['gpu.nvidia.com'].memory.isLessThan(semver('1.0.0'))"
        }
    };
    for (rule, expression) in [
        ("missing attribute of a present domain", "device.attributes['gpu.nvidia.com'].nope == 1"),
        ("result is not a bool", "device.driver"),
        ("type mismatch", mismatch),
    ] {
        let req = match inv.request_of(&gpu_spec(1, &[expression])) {
            Ok(r) => r,
            Err(e) => panic!("{rule}: {e}"),
        };
        match inv.offer(&req, "n1") {
            Err(ClaimError::Runtime { field, device, .. }) => {
                assert_eq!(field, "spec.devices.requests[0].exactly.selectors[0].cel.expression", "{rule}");
                assert!(device.starts_with("gpu.nvidia.com/n1/gpu-"), "{rule}: {device}");
            }
            Ok(s) if rule == "type mismatch" && s.is_empty() => {}
            other => panic!("{rule}: want a runtime error, got {other:?}"),
        }
        assert!(inv.offered_gpus(&req, "n1").is_empty(), "{rule}");
    }
}

// === claim specs ===

#[test]
fn claim_specs_outside_the_subset_name_the_field() {
    on_each_shape(|| {
        let inv = inventory(&[eight("n1")], &[nvidia_device_class(), device_class("other", "true")], &[]);
        let exactly = |extra: serde_json::Value| {
            let mut e = json!({"deviceClassName": NVIDIA_GPU_DRIVER});
            if let (Some(e), Some(x)) = (e.as_object_mut(), extra.as_object()) {
                e.extend(x.clone());
            }
            spec(json!({"devices": {"requests": [{"name": "gpu", "exactly": e}]}}))
        };
        let table: Vec<(&str, ResourceClaimSpec, &str)> = vec![
            (
                "firstAvailable",
                spec(
                    json!({"devices": {"requests": [{"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": NVIDIA_GPU_DRIVER}]}]}}),
                ),
                "spec.devices.requests[0].firstAvailable",
            ),
            (
                "allocationMode All",
                exactly(json!({"allocationMode": "All"})),
                "spec.devices.requests[0].exactly.allocationMode",
            ),
            ("adminAccess", exactly(json!({"adminAccess": true})), "spec.devices.requests[0].exactly.adminAccess"),
            (
                "capacity",
                exactly(json!({"capacity": {"requests": {"memory": "1Gi"}}})),
                "spec.devices.requests[0].exactly.capacity",
            ),
            (
                "tolerations",
                exactly(json!({"tolerations": [{"key": "k", "operator": "Exists"}]})),
                "spec.devices.requests[0].exactly.tolerations",
            ),
            ("count 0", exactly(json!({"count": 0})), "spec.devices.requests[0].exactly.count"),
            (
                "constraints",
                spec(
                    json!({"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": NVIDIA_GPU_DRIVER}}], "constraints": [{"matchAttribute": "gpu.nvidia.com/productName"}]}}),
                ),
                "spec.devices.constraints",
            ),
            (
                "two classes",
                spec(
                    json!({"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": NVIDIA_GPU_DRIVER}}, {"name": "b", "exactly": {"deviceClassName": "other"}}]}}),
                ),
                "spec.devices.requests[1].exactly.deviceClassName",
            ),
            (
                "different selectors",
                spec(
                    json!({"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": NVIDIA_GPU_DRIVER}}, {"name": "b", "exactly": {"deviceClassName": NVIDIA_GPU_DRIVER, "selectors": [{"cel": {"expression": "true"}}]}}]}}),
                ),
                "spec.devices.requests[1].exactly.selectors",
            ),
        ];
        for (rule, s, field) in table {
            match inv.request_of(&s) {
                Err(ClaimError::Unsupported { field: f, why }) => {
                    assert_eq!(f, field, "{rule}");
                    assert!(!why.is_empty(), "{rule}");
                }
                other => panic!("{rule}: want unsupported, got {other:?}"),
            }
        }
        assert_eq!(inv.request_of(&spec(json!({"devices": {"requests": []}}))).err(), Some(ClaimError::NoRequests));
        assert_eq!(inv.request_of(&spec(json!({}))).err(), Some(ClaimError::NoRequests));
        assert_eq!(
            inv.request_of(&spec(
                json!({"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "nope"}}]}})
            ))
            .err(),
            Some(ClaimError::UnknownClass {
                field: "spec.devices.requests[0].exactly.deviceClassName".to_string(),
                class: "nope".to_string()
            })
        );
    });
}

#[test]
fn a_supported_claim_reads_class_requests_and_total() {
    on_each_shape(|| {
        let inv = inventory(&[eight("n1")], &[nvidia_device_class()], &[]);
        let s = spec(json!({"devices": {"requests": [
        {"name": "a", "exactly": {"deviceClassName": NVIDIA_GPU_DRIVER, "count": 2, "allocationMode": "ExactCount"}},
        {"name": "b", "exactly": {"deviceClassName": NVIDIA_GPU_DRIVER}}]}}));
        let req = inv.request_of(&s).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(req.class(), NVIDIA_GPU_DRIVER);
        assert_eq!(req.requests(), &[("a".to_string(), 2), ("b".to_string(), 1)]);
        assert_eq!(req.total(), 3);
        assert!(inv.is_gpu_request(&req));
    });
}

#[test]
fn is_gpu_request_follows_the_selectors() {
    on_each_shape(|| {
        let nic = device_class("nic", "device.driver == 'nic.example.com'");
        let inv = inventory(&[eight("n1")], &[nvidia_device_class(), nic.clone()], &[]);
        let nic_claim = spec(json!({"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "nic"}}]}}));
        let req = inv.request_of(&nic_claim).unwrap_or_else(|e| panic!("{e}"));
        assert!(!inv.is_gpu_request(&req), "a class matching no GPU is not a GPU request");
        // With no GPUs published yet, the class name / quoted driver decides.
        let empty = inventory(&[], &[nvidia_device_class(), nic], &[]);
        let gpu = empty.request_of(&gpu_spec(1, &[])).unwrap_or_else(|e| panic!("{e}"));
        assert!(empty.is_gpu_request(&gpu));
        let req = empty.request_of(&nic_claim).unwrap_or_else(|e| panic!("{e}"));
        assert!(!empty.is_gpu_request(&req));
    });
}

// === pools, reach, taints, join ===

#[test]
fn only_the_newest_pool_generation_counts() {
    on_each_shape(|| {
        let old = eight("n1");
        let mut new = shaped("n1", &[(0, UUIDS[0]), (1, UUIDS[1])], 2);
        new.metadata.name = Some("n1-new".to_string());
        let inv = inventory(&[old, new], &[nvidia_device_class()], &[]);
        assert_eq!(inv.node_gpus("n1"), set(&[0, 1]));
        let req = inv.request_of(&gpu_spec(1, &[])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(inv.offered_gpus(&req, "n1"), set(&[0, 1]));
        assert!(inv.problems().is_empty(), "{:?}", inv.problems());
    });
}

#[test]
fn an_incomplete_pool_offers_nothing_and_says_so() {
    on_each_shape(|| {
        let mut slice = eight("n1");
        slice.spec.pool.resource_slice_count = 2;
        let inv = inventory(&[slice], &[nvidia_device_class()], &[]);
        assert!(inv.has_slices("n1"));
        assert_eq!(inv.node_gpus("n1").len(), 8);
        let req = inv.request_of(&gpu_spec(1, &[])).unwrap_or_else(|e| panic!("{e}"));
        assert!(inv.offered_gpus(&req, "n1").is_empty());
        assert!(inv.problems().iter().any(|p| p.object == "pool gpu.nvidia.com/n1" && p.why.starts_with("incomplete")));
    });
}

#[test]
fn a_pool_with_a_device_name_twice_is_invalid() {
    on_each_shape(|| {
        let mut slice = eight("n1");
        if let Some(d) = slice.spec.devices.as_mut() {
            d[1].name = "gpu-0".to_string();
        }
        let inv = inventory(&[slice], &[nvidia_device_class()], &[]);
        let req = inv.request_of(&gpu_spec(1, &[])).unwrap_or_else(|e| panic!("{e}"));
        assert!(inv.offered_gpus(&req, "n1").is_empty());
        assert!(inv.problems().iter().any(|p| p.why.starts_with("invalid")));
    });
}

#[test]
fn reach_of_node_selector_and_all_nodes() {
    let zone_a: Labels = [("zone", "a")].into_iter().collect();
    let none = Labels::default();
    let selector: k8s_openapi::api::core::v1::NodeSelector = match serde_json::from_value(
        json!({"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}),
    ) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    let terms = terms_from_k8s(&selector).unwrap_or_default();
    let table = [
        ("node reaches itself", Reach::Node("n1".to_string()), "n1", &none, true),
        ("node reaches no other", Reach::Node("n1".to_string()), "n2", &none, false),
        ("selector matches labels", Reach::Selector(terms.clone()), "n2", &zone_a, true),
        ("selector misses", Reach::Selector(terms), "n2", &none, false),
        ("all nodes", Reach::AllNodes, "n9", &none, true),
    ];
    for (rule, reach, node, labels, want) in table {
        assert_eq!(reach.reaches(node, labels), want, "{rule}");
    }
    let mut network = nvidia_slice("x", &[(0, UUIDS[0])], 1);
    network.spec.driver = "nic.example.com".to_string();
    network.spec.node_name = None;
    network.spec.node_selector = Some(selector);
    let inv = inventory(&[network], &[], &[]);
    let id = DeviceId { driver: "nic.example.com".into(), pool: "x".into(), device: "gpu-0".into() };
    assert!(matches!(inv.reach(&id), Some(Reach::Selector(_))));
    assert!(!inv.has_slices("x"), "a non-GPU-driver slice does not make a DRA GPU node");
}

#[test]
fn tainted_devices_are_not_offered() {
    on_each_shape(|| {
        let mut slice = eight("n1");
        if let Some(d) = slice.spec.devices.as_mut() {
            let taint =
                |effect: &str| DeviceTaint { key: "k".into(), value: None, effect: effect.into(), time_added: None };
            d[0].taints = Some(vec![taint("NoSchedule")]);
            d[1].taints = Some(vec![taint("NoExecute")]);
            d[2].taints = Some(vec![taint("None")]);
            d[3].binding_conditions = Some(vec!["ready".into()]);
        }
        let inv = inventory(&[slice], &[nvidia_device_class()], &[]);
        let req = inv.request_of(&gpu_spec(1, &[])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(inv.offered_gpus(&req, "n1"), set(&[2, 4, 5, 6, 7]));
        assert_eq!(inv.node_gpus("n1").len(), 8);
    });
}

fn int_attribute(i: i64) -> k8s_openapi::api::resource::v1::DeviceAttribute {
    k8s_openapi::api::resource::v1::DeviceAttribute { int: Some(i), ..Default::default() }
}

#[test]
fn gpu_index_joins_by_uuid_then_index_then_minor_then_name() {
    // (rule, device name, `index` attribute, `minor` attribute, uuid in the annotation as,
    // the GPU index it joins to or None: a problem, not offered).
    type Case = (&'static str, &'static str, Option<i64>, Option<i64>, Option<usize>, Option<usize>);
    let table: &[Case] = &[
        ("uuid in the topology model wins over everything", "gpu-0", Some(1), Some(2), Some(5), Some(5)),
        ("then the legacy index attribute", "gpu-0", Some(6), Some(2), None, Some(6)),
        ("then the minor attribute", "gpu-0", None, Some(3), None, Some(3)),
        ("then the minor in the name gpu-<minor>", "gpu-4", None, None, None, Some(4)),
        ("uuid still wins over the name", "gpu-4", None, None, Some(2), Some(2)),
        ("a name that is not gpu-<minor> and no attribute", "card-7", None, None, None, None),
        ("gpu- without digits", "gpu-", None, None, None, None),
        ("gpu-<minor> with a suffix", "gpu-1x", None, None, None, None),
    ];
    on_each_shape(|| {
        for (rule, name, index, minor, annotated, want) in table {
            let mut slice = shaped("n1", &[(0, UUIDS[0])], 1);
            if let Some(d) = slice.spec.devices.as_mut().and_then(|d| d.first_mut()) {
                d.name = (*name).to_string();
                if let Some(a) = d.attributes.as_mut() {
                    a.remove("index");
                    a.remove("minor");
                    if let Some(i) = index {
                        a.insert("index".into(), int_attribute(*i));
                    }
                    if let Some(m) = minor {
                        a.insert("minor".into(), int_attribute(*m));
                    }
                }
            }
            let annotation: HashMap<String, HashMap<String, usize>> = annotated
                .map(|i| HashMap::from([("n1".to_string(), HashMap::from([(UUIDS[0].to_string(), i)]))]))
                .unwrap_or_default();
            let inv = Inventory::new(&[slice], &[nvidia_device_class()], &[], NVIDIA_GPU_DRIVER, &annotation);
            let id = DeviceId { driver: NVIDIA_GPU_DRIVER.into(), pool: "n1".into(), device: (*name).to_string() };
            let req = inv.request_of(&gpu_spec(1, &[])).unwrap_or_else(|e| panic!("{rule}: {e}"));
            match want {
                Some(i) => {
                    assert_eq!(inv.gpu_index(&id), Some(("n1".to_string(), *i)), "{}: {rule}", shape());
                    assert_eq!(inv.node_gpus("n1"), set(&[*i]), "{}: {rule}", shape());
                    assert_eq!(inv.offered_gpus(&req, "n1"), set(&[*i]), "{}: {rule}", shape());
                    assert_eq!(inv.gpu_device("n1", *i), Some(&id), "{}: {rule}", shape());
                    assert!(inv.problems().is_empty(), "{}: {rule}: {:?}", shape(), inv.problems());
                }
                None => {
                    assert_eq!(inv.gpu_index(&id), None, "{}: {rule}", shape());
                    assert!(inv.node_gpus("n1").is_empty(), "{}: {rule}", shape());
                    assert!(inv.offered_gpus(&req, "n1").is_empty(), "{}: {rule}", shape());
                    assert!(
                        inv.problems()
                            .iter()
                            .any(|p| p.object.ends_with(&format!("device {name}")) && p.why.contains("neither a uuid")),
                        "{}: {rule}: {:?}",
                        shape(),
                        inv.problems()
                    );
                }
            }
        }
    });
}

#[test]
fn published_gpus_read_slots_and_places_of_either_shape() {
    on_each_shape(|| {
        let published = published_gpus(&[eight("n1")], NVIDIA_GPU_DRIVER);
        let n1 = published.get("n1").unwrap_or_else(|| panic!("{}: n1 not published", shape()));
        assert_eq!(n1.len(), 8, "{}", shape());
        for (slot, gpu) in &n1.gpus {
            assert_eq!(gpu.uuid.as_deref(), Some(UUIDS[*slot]), "{}: slot {slot}", shape());
            assert_eq!(gpu.pcie_root.as_deref(), Some(format!("pci0000:{slot:02x}").as_str()), "{}", shape());
            let numa = match shape() {
                Shape::Current => Some(u32::try_from(slot / 4).unwrap_or(u32::MAX)),
                Shape::Legacy => None,
            };
            assert_eq!(gpu.numa, numa, "{}: slot {slot}", shape());
        }
    });
}

// === MIG and ComputeDomain devices ===

const MIG_PARENTS: [usize; 2] = [2, 5];

fn eight_with_mig(node: &str) -> ResourceSlice {
    let gpus: Vec<(usize, &str)> = UUIDS.iter().enumerate().map(|(i, u)| (i, *u)).collect();
    super::fixtures::nvidia_slice_with_mig(node, &gpus, &MIG_PARENTS, 1, shape())
}

fn class_spec(class: &str, count: i64) -> ResourceClaimSpec {
    spec(json!({"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": class, "count": count}}]}}))
}

#[test]
fn mig_devices_beside_gpus_are_never_counted_or_offered_as_gpus() {
    on_each_shape(|| {
        let slices = [eight_with_mig("n1"), super::fixtures::compute_domain_slice("n1")];
        let classes = [nvidia_device_class(), nvidia::mig_device_class(), nvidia::compute_domain_channel_class()];
        let inv = inventory(&slices, &classes, &[]);
        let whole = set(&[0, 1, 3, 4, 6, 7]);
        assert_eq!(inv.node_gpus("n1"), whole, "{}: MIG parents are not whole GPUs", shape());
        let published = published_gpus(&slices, NVIDIA_GPU_DRIVER);
        let n1 = published.get("n1").map(|p| p.gpus.keys().copied().collect::<Vec<_>>());
        assert_eq!(n1, Some(vec![0, 1, 3, 4, 6, 7]), "{}", shape());
        assert!(inv.problems().is_empty(), "{}: {:?}", shape(), inv.problems());

        let gpus = inv.request_of(&gpu_spec(1, &[])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(inv.offered_gpus(&gpus, "n1"), whole, "{}", shape());
        assert_eq!(inv.partition_asked(&gpus), None, "{}: the GPU class asks for no MIG device", shape());
        // Even a selector matching every device of the driver offers whole GPUs only.
        let any = inv
            .request_of(&spec(json!({"devices": {"requests": [{"name": "r", "exactly": {
                "deviceClassName": NVIDIA_GPU_DRIVER, "selectors": [{"cel": {"expression": "true"}}]}}]}})))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(inv.offered_gpus(&any, "n1"), whole, "{}", shape());

        for (class, what) in
            [(nvidia::MIG_DEVICE_CLASS, "MIG"), (nvidia::COMPUTE_DOMAIN_CHANNEL_CLASS, "ComputeDomain")]
        {
            let req = inv.request_of(&class_spec(class, 1)).unwrap_or_else(|e| panic!("{class}: {e}"));
            assert!(inv.offered_gpus(&req, "n1").is_empty(), "{}: {class} offered GPUs", shape());
            let asked = inv.partition_asked(&req).map(ToString::to_string).unwrap_or_default();
            assert!(asked.contains(what), "{}: {class}: {asked:?}", shape());
            assert_eq!(
                inv.choose_shared(&req, &HashSet::new()),
                None,
                "{}: {class} chosen for a shared claim",
                shape()
            );
        }
    });
}

#[test]
fn a_contested_device_names_its_rivals() {
    on_each_shape(|| {
        let a = allocated_claim("team", "a", &[("n1", "gpu-1")]);
        let b = allocated_claim("team", "b", &[("n1", "gpu-1"), ("n1", "gpu-2")]);
        let inv = inventory(&[eight("n1")], &[nvidia_device_class()], &[a.clone(), b.clone()]);
        assert!(inv.any_contested(), "{}", shape());
        let gpu1 = DeviceId { driver: NVIDIA_GPU_DRIVER.into(), pool: "n1".into(), device: "gpu-1".into() };
        let gpu2 = DeviceId { driver: NVIDIA_GPU_DRIVER.into(), pool: "n1".into(), device: "gpu-2".into() };
        let key = |n: &str| ClaimKey { namespace: "team".into(), name: n.into() };
        let (ka, kb) = (key("a"), key("b"));
        assert_eq!(inv.rivals(&gpu1, &ka).collect::<Vec<_>>(), vec![&kb], "{}", shape());
        assert_eq!(inv.rivals(&gpu1, &kb).collect::<Vec<_>>(), vec![&ka], "{}", shape());
        assert_eq!(inv.rivals(&gpu2, &kb).count(), 0, "{}", shape());
        let req = inv.request_of(&gpu_spec(1, &[])).unwrap_or_else(|e| panic!("{e}"));
        assert!(!inv.offered_gpus(&req, "n1").contains(1), "{}", shape());
        // One claim alone is not contested.
        let inv =
            inventory(&[eight("n1")], &[nvidia_device_class()], &[a, allocated_claim("team", "c", &[("n1", "gpu-3")])]);
        assert!(!inv.any_contested(), "{}", shape());
    });
}

#[test]
fn allocated_devices_are_held_and_not_offered() {
    on_each_shape(|| {
        let claim = allocated_claim("team", "c1", &[("n1", "gpu-2"), ("n1", "gpu-3")]);
        let inv = inventory(&[eight("n1")], &[nvidia_device_class()], &[claim]);
        assert_eq!(inv.allocated_gpus("n1"), set(&[2, 3]));
        let id = DeviceId { driver: NVIDIA_GPU_DRIVER.into(), pool: "n1".into(), device: "gpu-2".into() };
        assert_eq!(inv.holder(&id), Some(&ClaimKey { namespace: "team".into(), name: "c1".into() }));
        let req = inv.request_of(&gpu_spec(1, &[])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(inv.offered_gpus(&req, "n1"), set(&[0, 1, 4, 5, 6, 7]));
    });
}

// === allocation results ===

#[test]
fn gpu_allocation_is_what_kube_scheduler_writes() {
    on_each_shape(|| {
        let mut class = nvidia_device_class();
        if let Some(s) = class.spec.as_mut() {
            s.config = Some(vec![match serde_json::from_value(
                json!({"opaque": {"driver": NVIDIA_GPU_DRIVER, "parameters": {"kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}}}),
            ) {
                Ok(c) => c,
                Err(e) => panic!("{e}"),
            }]);
        }
        let inv = inventory(&[eight("n1")], &[class], &[]);
        let s = spec(json!({"devices": {
        "requests": [
            {"name": "a", "exactly": {"deviceClassName": NVIDIA_GPU_DRIVER, "count": 2}},
            {"name": "b", "exactly": {"deviceClassName": NVIDIA_GPU_DRIVER}}],
        "config": [
            {"opaque": {"driver": NVIDIA_GPU_DRIVER, "parameters": {"all": true}}},
            {"requests": ["b"], "opaque": {"driver": NVIDIA_GPU_DRIVER, "parameters": {"only": "b"}}},
            {"requests": ["a", "b"], "opaque": {"driver": NVIDIA_GPU_DRIVER, "parameters": {"both": true}}}]}}));
        let req = inv.request_of(&s).unwrap_or_else(|e| panic!("{e}"));
        let got = inv.gpu_allocation(&req, "n1", set(&[1, 4, 6])).unwrap_or_else(|e| panic!("{e}"));
        let want = json!({
            "devices": {
                "results": [
                    {"request": "a", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-1"},
                    {"request": "a", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-4"},
                    {"request": "b", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-6"}],
                "config": [
                    {"source": "FromClass", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}}},
                    {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"all": true}}},
                    {"source": "FromClaim", "requests": ["b"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {"only": "b"}}},
                    {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"both": true}}}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}
        });
        assert_eq!(serde_json::to_value(&got).unwrap_or_default(), want);
        assert_eq!(SharedReach::of_allocation(&got).map(|r| r.reaches("n1", &Labels::default())), Ok(true));
        assert_eq!(SharedReach::of_allocation(&got).map(|r| r.reaches("n2", &Labels::default())), Ok(false));
        assert_eq!(allocated_devices(&got).len(), 3);
    });
}

#[test]
fn gpu_allocation_refuses_wrong_sizes_and_unoffered_gpus() {
    on_each_shape(|| {
        let claim = allocated_claim("team", "c1", &[("n1", "gpu-2")]);
        let inv = inventory(&[eight("n1")], &[nvidia_device_class()], &[claim]);
        let req = inv.request_of(&gpu_spec(2, &[])).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(inv.gpu_allocation(&req, "n1", set(&[1])), Err(ClaimError::Allocation { .. })));
        assert!(matches!(inv.gpu_allocation(&req, "n1", set(&[1, 2])), Err(ClaimError::Allocation { .. })));
        assert!(matches!(inv.gpu_allocation(&req, "n2", set(&[0, 1])), Err(ClaimError::Allocation { .. })));
        assert!(inv.gpu_allocation(&req, "n1", set(&[0, 1])).is_ok());
    });
}

fn shared_slice(pool: &str, devices: &[&str], reach: serde_json::Value) -> ResourceSlice {
    let devices: Vec<_> = devices.iter().map(|d| json!({"name": d})).collect();
    let mut spec = json!({"driver": "fabric.example.com", "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1}, "devices": devices});
    if let (Some(s), Some(r)) = (spec.as_object_mut(), reach.as_object()) {
        s.extend(r.clone());
    }
    match serde_json::from_value(json!({"metadata": {"name": pool}, "spec": spec})) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn choose_shared_prefers_the_widest_reach() {
    let zone = json!({"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}});
    let slices = [
        shared_slice("global", &["g0"], json!({"allNodes": true})),
        shared_slice("zonal", &["z0", "z1"], zone),
        shared_slice("local", &["l0", "l1", "l2"], json!({"nodeName": "n1"})),
    ];
    let class = device_class("fabric", "device.driver == 'fabric.example.com'");
    let inv = inventory(&slices, &[class], &[]);
    let claim = |count: i64| {
        spec(
            json!({"devices": {"requests": [{"name": "f", "exactly": {"deviceClassName": "fabric", "count": count}}]}}),
        )
    };
    let names = |d: &[DeviceId]| d.iter().map(|d| d.device.clone()).collect::<Vec<_>>();

    let req = inv.request_of(&claim(1)).unwrap_or_else(|e| panic!("{e}"));
    let (devices, reach) = inv.choose_shared(&req, &HashSet::new()).unwrap_or_else(|| panic!("one device"));
    assert_eq!(names(&devices), ["g0"]);
    assert_eq!(reach, SharedReach::everywhere());
    assert!(inv.shared_allocation(&req, &devices, &reach).node_selector.is_none());

    let req = inv.request_of(&claim(3)).unwrap_or_else(|e| panic!("{e}"));
    let (devices, reach) = inv.choose_shared(&req, &HashSet::new()).unwrap_or_else(|| panic!("three devices"));
    assert_eq!(names(&devices), ["g0", "z0", "z1"]);
    let zone_a: Labels = [("zone", "a")].into_iter().collect();
    assert!(reach.reaches("n7", &zone_a) && !reach.reaches("n7", &Labels::default()));

    let taken: HashSet<DeviceId> = devices.iter().skip(1).take(1).cloned().collect();
    let (devices, reach) = inv.choose_shared(&req, &taken).unwrap_or_else(|| panic!("three devices"));
    assert_eq!(names(&devices), ["g0", "l0", "l1"], "zonal has one left, so the node-local group is used");
    assert_eq!(reach, SharedReach::node("n1"));

    let req = inv.request_of(&claim(5)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(inv.choose_shared(&req, &HashSet::new()), None, "groups are never mixed");
}

#[test]
fn malformed_objects_are_problems_not_panics() {
    on_each_shape(|| {
        let mut no_reach = eight("n1");
        no_reach.spec.node_name = None;
        let mut bad_version = eight("n2");
        if let Some(d) = bad_version.spec.devices.as_mut()
            && let Some(a) = d[0].attributes.as_mut()
            && let Some(v) = a.get_mut("driverVersion")
        {
            v.version = Some("not-a-version".into());
        }
        let inv = inventory(&[no_reach, bad_version], &[nvidia_device_class()], &[]);
        assert!(inv.problems().iter().any(|p| p.why.contains("none of nodeName")));
        assert!(inv.problems().iter().any(|p| p.why.contains("driverVersion")));
        let req = inv.request_of(&gpu_spec(1, &[])).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(inv.offer(&req, "n2"), Err(ClaimError::Runtime { .. })));
    });
}

// === properties ===

fn node_strategy() -> impl Strategy<Value = (Vec<(usize, bool, bool)>, GpuSet)> {
    // Per GPU: (index, allocated, inside the class); plus a chosen subset seed.
    (
        proptest::collection::btree_set(0usize..8, 1..=8),
        proptest::collection::vec(any::<bool>(), 8),
        proptest::collection::vec(any::<bool>(), 8),
        any::<u8>(),
    )
        .prop_map(|(indices, allocated, outside, seed)| {
            let gpus = indices.into_iter().map(|i| (i, allocated[i], !outside[i])).collect();
            (gpus, GpuSet::from_bits(u64::from(seed)))
        })
}

fn property_inventory(gpus: &[(usize, bool, bool)]) -> Inventory {
    let devices: Vec<(usize, &str)> = gpus.iter().map(|(i, _, _)| (*i, UUIDS[*i])).collect();
    let mut slice = shaped("n1", &devices, 1);
    if let Some(ds) = slice.spec.devices.as_mut() {
        for (d, (_, _, inside)) in ds.iter_mut().zip(gpus) {
            if !inside && let Some(a) = d.attributes.as_mut() {
                a.insert(
                    "type".into(),
                    k8s_openapi::api::resource::v1::DeviceAttribute {
                        string: Some("vfio".into()),
                        ..Default::default()
                    },
                );
                a.remove("index");
            }
        }
    }
    let held: Vec<(&str, String)> = gpus.iter().filter(|g| g.1).map(|(i, _, _)| ("n1", format!("gpu-{i}"))).collect();
    let held: Vec<(&str, &str)> = held.iter().map(|(p, d)| (*p, d.as_str())).collect();
    let claim = allocated_claim("team", "held", &held);
    let class = device_class(NVIDIA_GPU_DRIVER, NVIDIA_GPU_SELECTOR);
    // The annotation keeps "outside" devices' uuids so they still join to their index.
    let annotation = HashMap::from([(
        "n1".to_string(),
        gpus.iter().map(|(i, _, _)| (UUIDS[*i].to_string(), *i)).collect::<HashMap<_, _>>(),
    )]);
    Inventory::new(&[slice], &[class], &[claim], NVIDIA_GPU_DRIVER, &annotation)
}

proptest! {
    #[test]
    fn offered_never_holds_allocated_or_outside_the_class((gpus, _) in node_strategy()) {
        for shape in Shape::ALL {
        set_shape(shape);
        let inv = property_inventory(&gpus);
        let req = inv.request_of(&gpu_spec(1, &[])).unwrap_or_else(|e| panic!("{e}"));
        let offered = inv.offered_gpus(&req, "n1");
        for (i, allocated, inside) in &gpus {
            if *allocated || !*inside {
                prop_assert!(!offered.contains(*i), "{shape}: GPU {i} offered");
            } else {
                prop_assert!(offered.contains(*i), "{shape}: GPU {i} free and inside but not offered");
            }
        }
        }
    }

    #[test]
    fn gpu_allocation_names_exactly_the_chosen_devices_once((gpus, seed) in node_strategy(), split in 0u32..8) {
        for shape in Shape::ALL {
        set_shape(shape);
        let inv = property_inventory(&gpus);
        let probe = inv.request_of(&gpu_spec(1, &[])).unwrap_or_else(|e| panic!("{e}"));
        let chosen = inv.offered_gpus(&probe, "n1").intersection(seed);
        if chosen.is_empty() {
            continue;
        }
        let total = chosen.len() as i64;
        let first = i64::from(split).clamp(1, total);
        let s = if first < total {
            spec(json!({"devices": {"requests": [
                {"name": "a", "exactly": {"deviceClassName": NVIDIA_GPU_DRIVER, "count": first}},
                {"name": "b", "exactly": {"deviceClassName": NVIDIA_GPU_DRIVER, "count": total - first}}]}}))
        } else {
            gpu_spec(total, &[])
        };
        let req = inv.request_of(&s).unwrap_or_else(|e| panic!("{e}"));
        let a: AllocationResult = inv.gpu_allocation(&req, "n1", chosen).unwrap_or_else(|e| panic!("{e}"));
        let named = allocated_devices(&a);
        let unique: HashSet<&DeviceId> = named.iter().collect();
        prop_assert_eq!(unique.len(), named.len(), "{}", shape);
        let indices = GpuSet::from_indices(named.iter().filter_map(|d| inv.gpu_index(d).map(|(_, i)| i)));
        prop_assert_eq!(indices, Some(chosen), "{}", shape);
        let results = a.devices.and_then(|d| d.results).unwrap_or_default();
        let first_name = if first < total { "a" } else { "gpu" };
        prop_assert_eq!(results.iter().filter(|r| r.request == first_name).count() as i64, first, "{}", shape);
        // Request order: the first `first` GPUs ascending go to the first request.
        let firsts: Vec<usize> = chosen.iter().take(first as usize).collect();
        let got: Vec<usize> = results.iter().take(first as usize).filter_map(|r| {
            inv.gpu_index(&DeviceId { driver: r.driver.clone(), pool: r.pool.clone(), device: r.device.clone() }).map(|(_, i)| i)
        }).collect();
        prop_assert_eq!(got, firsts, "{}", shape);
        }
    }

    #[test]
    fn choosing_on_a_dra_node_costs_what_the_count_based_choice_costs((gpus, _) in node_strategy(), k in 1usize..=8) {
        for shape in Shape::ALL {
        set_shape(shape);
        let inv = property_inventory(&gpus);
        let req = inv.request_of(&gpu_spec(1, &[])).unwrap_or_else(|e| panic!("{e}"));
        let offered = inv.offered_gpus(&req, "n1");
        let count_free = GpuSet::from_indices(gpus.iter().filter(|g| !g.1 && g.2).map(|g| g.0)).unwrap_or_default();
        let topology = crate::devices::fixtures::dgx_h100();
        let dra = select(&topology, offered, k, SelectOptions::default());
        let count = select(&topology, count_free, k, SelectOptions::default());
        prop_assert_eq!(dra.map(|s| set_cost(&topology, s.gpus)), count.map(|s| set_cost(&topology, s.gpus)), "{}", shape);
        }
    }
}
