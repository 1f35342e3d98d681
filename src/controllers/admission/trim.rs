//! PURE: what admission keeps of watched objects. Only the fields placement and status read
//! survive, so 5,000 nodes and their pods stay small in memory.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EphemeralVolumeSource, Namespace, Node, NodeSpec, NodeStatus, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeSpec, Pod, PodSchedulingGate, PodSpec, PodStatus,
    ResourceRequirements, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::Event;

use crate::crds::{
    ADMISSION_GATE, COMPLETION_INDEX_ANNOTATION, GPU_ASSIGNED_ANNOTATION, GPU_HEALTH_ANNOTATION,
    GPU_INDICES_ANNOTATION, GPU_RESOURCE, GPU_TOPOLOGY_ANNOTATION, HOSTNAME_LABEL, JOB_NAME_LABEL, JOBSET_NAME_LABEL,
    POD_GROUP_LABEL, REPLICATED_JOB_LABEL, ROLLED_BACK_ANNOTATION,
};
use crate::pods::Placement;
use crate::scheduler::{CPU, EPHEMERAL_STORAGE, MEMORY, pod_requests};

/// Keeps the annotations named by `keys`; none left is no map at all (an empty map still
/// holds a node of its tree).
fn keep_annotations(a: &mut Option<BTreeMap<String, String>>, keys: &[&str]) {
    if let Some(map) = a.as_mut() {
        map.retain(|k, _| keys.contains(&k.as_str()));
    }
    if a.as_ref().is_some_and(BTreeMap::is_empty) {
        *a = None;
    }
}

fn trim_meta(meta: &mut ObjectMeta, annotations: &[&str]) {
    meta.managed_fields = None;
    keep_annotations(&mut meta.annotations, annotations);
}

fn trim_container(c: &Container) -> Container {
    Container {
        name: c.name.clone(),
        // Requests only: the API server defaults a request from each limit set without one, so
        // the requests name every resource, and placement and GPU counts read nothing else.
        resources: c.resources.as_ref().map(|r| ResourceRequirements {
            requests: r.requests.clone(),
            limits: None,
            claims: None,
        }),
        restart_policy: c.restart_policy.clone(),
        // Only ports with a hostPort matter to placement (NodePorts).
        ports: c
            .ports
            .as_ref()
            .map(|ports| ports.iter().filter(|p| p.host_port.is_some_and(|h| h > 0)).cloned().collect::<Vec<_>>())
            .filter(|p| !p.is_empty()),
        ..Default::default()
    }
}

/// Keeps a pod volume only when it names a PersistentVolumeClaim (VolumeBinding reads those)
/// or is a generic ephemeral volume (reported as not modelled; its template is dropped).
fn trim_volume(v: &Volume) -> Option<Volume> {
    let ephemeral = v.ephemeral.as_ref().map(|_| EphemeralVolumeSource::default());
    (v.persistent_volume_claim.is_some() || ephemeral.is_some()).then(|| Volume {
        name: v.name.clone(),
        persistent_volume_claim: v.persistent_volume_claim.clone(),
        ephemeral,
        ..Default::default()
    })
}

/// The most bytes admission keeps of one pod (its JSON once trimmed by [`pod`]): an ordinary
/// pod keeps 1-10 KiB; one a tenant made huge (up to the API server's ~1.5 MiB: thousands of
/// labels, tolerations, affinity terms, containers) is kept as a minimal record instead
/// ([`minimal_pod`]).
pub const MAX_KEPT_POD_BYTES: usize = 64 * 1024;
/// Set, in admission's memory only (never written to the API server), on a pod kept as a
/// minimal record: why, with its size. The pod watch reports such a pod once (log, metric,
/// a `PodTooLarge` Warning event on it).
pub const KEPT_MINIMAL_ANNOTATION: &str = "scheduling.muster.dev/kept-minimal";
/// The resource a waiting pod kept as a minimal record asks for, in an amount that does not
/// read: its shape is then unreadable, so placement leaves it gated and its group says why.
pub const TOO_LARGE_RESOURCE: &str = "scheduling.muster.dev/pod-too-large";
/// The labels a minimal record keeps: those muster reads of its pods.
const KEPT_LABELS: &[&str] = &[POD_GROUP_LABEL, JOB_NAME_LABEL, JOBSET_NAME_LABEL, REPLICATED_JOB_LABEL];
/// The annotations a pod keeps ([`pod`]); a minimal record keeps each only up to
/// [`MAX_MINIMAL_VALUE_BYTES`].
const KEPT_ANNOTATIONS: &[&str] = &[GPU_INDICES_ANNOTATION, COMPLETION_INDEX_ANNOTATION, ROLLED_BACK_ANNOTATION];
/// The longest label, annotation or name value a minimal record keeps.
const MAX_MINIMAL_VALUE_BYTES: usize = 256;
/// The most extended resources and host ports a minimal record keeps.
const MAX_MINIMAL_ITEMS: usize = 64;

/// Keeps what placement, quorum and status read of a pod; a pod still over
/// [`MAX_KEPT_POD_BYTES`] after that is kept as a [`minimal_pod`].
pub fn pod(p: &mut Pod) {
    trim_pod(p);
    if let Some(bytes) = oversize(p, MAX_KEPT_POD_BYTES) {
        *p = minimal_pod(p, bytes);
    }
}

/// The JSON size of `p` when it is over `limit` bytes (counted up to the first byte past it).
fn oversize(p: &Pod, limit: usize) -> Option<usize> {
    struct Count {
        n: usize,
        limit: usize,
    }
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.n += buf.len();
            if self.n > self.limit { Err(std::io::Error::other("over the limit")) } else { Ok(buf.len()) }
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count { n: 0, limit };
    // Serializing a pod fails only when the count stops it.
    match serde_json::to_writer(&mut count, p) {
        Ok(()) => None,
        Err(_) => Some(count.n),
    }
}

/// What admission keeps of a pod too large to keep ([`pod`]): enough to count what it uses
/// where it runs, never its whole shape. Its name, namespace, uid, version, deletion, owner
/// (the controller), muster's labels and annotations (each short), the node it is bound or
/// pinned to, muster's gate, its priority, its claims, and its requests summed into one
/// container as kube-scheduler sums them (with its host ports). A waiting (gated) pod asks for
/// [`TOO_LARGE_RESOURCE`] instead: it is never placed on a shape muster did not keep.
pub fn minimal_pod(p: &Pod, bytes: usize) -> Pod {
    let short = |v: &String| v.len() <= MAX_MINIMAL_VALUE_BYTES;
    // The entries of `map` under one of `keys`, each with a short value.
    let kept = |map: &Option<BTreeMap<String, String>>, keys: &[&str]| -> BTreeMap<String, String> {
        map.iter()
            .flatten()
            .filter(|(k, v)| keys.contains(&k.as_str()) && short(v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let meta = &p.metadata;
    let labels = kept(&meta.labels, KEPT_LABELS);
    let mut annotations = kept(&meta.annotations, KEPT_ANNOTATIONS);
    annotations.insert(
        KEPT_MINIMAL_ANNOTATION.to_string(),
        format!("{bytes} bytes kept after trimming, over the limit of {MAX_KEPT_POD_BYTES}"),
    );
    let metadata = ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        creation_timestamp: meta.creation_timestamp.clone(),
        deletion_timestamp: meta.deletion_timestamp.clone(),
        deletion_grace_period_seconds: meta.deletion_grace_period_seconds,
        owner_references: meta
            .owner_references
            .as_ref()
            .and_then(|o| o.iter().find(|r| r.controller == Some(true)).cloned())
            .map(|r| vec![r]),
        labels: (!labels.is_empty()).then_some(labels),
        annotations: Some(annotations),
        ..Default::default()
    };
    let spec = p.spec.as_ref().map(|spec| {
        let gated = matches!(Placement::of(p), Placement::Gated);
        let requests = if gated {
            BTreeMap::from([(TOO_LARGE_RESOURCE.to_string(), Quantity("not-kept".to_string()))])
        } else {
            summed_requests(spec)
        };
        let host_ports: Vec<ContainerPort> = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|port| port.host_port.is_some_and(|h| h > 0))
            .take(MAX_MINIMAL_ITEMS)
            .cloned()
            .collect();
        let hostname = spec.node_selector.as_ref().and_then(|s| s.get(HOSTNAME_LABEL)).filter(|h| short(h));
        PodSpec {
            containers: vec![Container {
                name: "requests".to_string(),
                resources: Some(ResourceRequirements { requests: Some(requests), ..Default::default() }),
                ports: (!host_ports.is_empty()).then_some(host_ports),
                ..Default::default()
            }],
            node_name: spec.node_name.clone().filter(|n| short(n)),
            node_selector: hostname.map(|h| BTreeMap::from([(HOSTNAME_LABEL.to_string(), h.clone())])),
            scheduling_gates: gated.then(|| vec![PodSchedulingGate { name: ADMISSION_GATE.to_string() }]),
            scheduler_name: spec.scheduler_name.clone().filter(|n| short(n)),
            priority: spec.priority,
            preemption_policy: spec.preemption_policy.clone(),
            // The API server allows a pod 32 claims.
            resource_claims: spec.resource_claims.clone(),
            ..Default::default()
        }
    });
    let status = p.status.as_ref().map(|status| PodStatus {
        phase: status.phase.clone(),
        start_time: status.start_time.clone(),
        nominated_node_name: status.nominated_node_name.clone().filter(|n| short(n)),
        resource_claim_statuses: status.resource_claim_statuses.clone(),
        ..Default::default()
    });
    Pod { metadata, spec, status }
}

/// The requests of `spec` summed as kube-scheduler sums them ([`pod_requests`]: containers,
/// init containers, sidecars, pod-level resources, overhead), as one container's requests (the
/// pod itself is counted by the reader, as ever). At most [`MAX_MINIMAL_ITEMS`] extended resources; a
/// quantity that does not read stays unreadable under its resource's name.
fn summed_requests(spec: &PodSpec) -> BTreeMap<String, Quantity> {
    match pod_requests(spec) {
        Ok(sum) => {
            let inline = [CPU, MEMORY, EPHEMERAL_STORAGE, GPU_RESOURCE].map(|name| (name, sum.get(name)));
            inline
                .into_iter()
                .chain(sum.extended().take(MAX_MINIMAL_ITEMS))
                .filter(|(_, amount)| *amount != 0)
                .map(|(name, amount)| {
                    let q = if name == CPU { format!("{amount}m") } else { amount.to_string() };
                    (name.to_string(), Quantity(q))
                })
                .collect()
        }
        Err(e) => {
            let mut name = e.resource;
            if name.len() > MAX_MINIMAL_VALUE_BYTES {
                name = "unreadable".to_string();
            }
            BTreeMap::from([(name, Quantity("unreadable".to_string()))])
        }
    }
}

/// [`pod`] without the size bound.
fn trim_pod(p: &mut Pod) {
    trim_meta(&mut p.metadata, KEPT_ANNOTATIONS);
    if let Some(spec) = p.spec.take() {
        p.spec = Some(PodSpec {
            containers: spec.containers.iter().map(trim_container).collect(),
            init_containers: spec.init_containers.as_ref().map(|cs| cs.iter().map(trim_container).collect()),
            overhead: spec.overhead,
            node_selector: spec.node_selector,
            affinity: spec.affinity,
            topology_spread_constraints: spec.topology_spread_constraints,
            volumes: spec
                .volumes
                .map(|vs| vs.iter().filter_map(trim_volume).collect::<Vec<_>>())
                .filter(|v| !v.is_empty()),
            scheduler_name: spec.scheduler_name,
            resource_claims: spec.resource_claims,
            tolerations: spec.tolerations,
            node_name: spec.node_name,
            scheduling_gates: spec.scheduling_gates,
            priority: spec.priority,
            // Whether the pod's gang may preempt (its PriorityClass's, resolved by the API server).
            preemption_policy: spec.preemption_policy,
            resources: spec.resources,
            ..Default::default()
        });
    }
    if let Some(status) = p.status.take() {
        // PodScheduled tells why kube-scheduler refused a pinned pod (the bind watcher reads it).
        let conditions = status
            .conditions
            .map(|cs| cs.into_iter().filter(|c| c.type_ == "PodScheduled").collect::<Vec<_>>())
            .filter(|cs| !cs.is_empty());
        // resourceClaimStatuses names the claims made from the pod's templates (admission
        // allocates them); nominatedNodeName, a preemptor's claim on a node, which kube-scheduler
        // honours for pods of its priority or lower (so admission does too).
        p.status = Some(PodStatus {
            phase: status.phase,
            start_time: status.start_time,
            conditions,
            resource_claim_statuses: status.resource_claim_statuses,
            nominated_node_name: status.nominated_node_name.filter(|n| !n.is_empty()),
            ..Default::default()
        });
    }
}

/// What admission's store keeps of one of muster's pods once it is bound (after [`pod`]): the
/// cycle shapes only the pods that wait for placement, and what a bound pod uses is kept in the
/// cluster state from the same event, so its containers, affinity, tolerations, spread
/// constraints and claims are dropped. What the rest reads stays: the node, the pin's node
/// selector, the gates, and the scheduler and volumes that `AllOrNothing` reads. About 3 KiB
/// a pod (the containers alone, most of it: a `Container` is large even when nearly empty).
pub fn bound_pod(p: &mut Pod) {
    let Some(spec) = p.spec.as_mut() else { return };
    if spec.node_name.as_deref().is_none_or(str::is_empty) {
        return;
    }
    let spec = std::mem::take(spec);
    p.spec = Some(PodSpec {
        node_name: spec.node_name,
        node_selector: spec.node_selector,
        scheduling_gates: spec.scheduling_gates,
        scheduler_name: spec.scheduler_name,
        volumes: spec.volumes,
        priority: spec.priority,
        ..Default::default()
    });
}

/// Drops `managedFields`, the bulk of an object nobody here reads.
pub fn managed_fields<K: kube::Resource>(k: &mut K) {
    k.meta_mut().managed_fields = None;
}

/// What placement reads of each node (after [`node`]), as a hash: a node update changes free
/// capacity only when this changes, so status heartbeats do not wake roots in backoff.
#[derive(Debug, Default)]
pub struct NodeFingerprints(HashMap<String, u64>);

impl NodeFingerprints {
    fn of(n: &Node) -> u64 {
        let mut h = DefaultHasher::new();
        // The node agent's health samples change every refresh; they are polled like metrics
        // (see the cycle), and a change of what is offered bumps capacity there.
        let annotations: Vec<_> =
            n.metadata.annotations.iter().flatten().filter(|(k, _)| k.as_str() != GPU_HEALTH_ANNOTATION).collect();
        let parts = (&n.metadata.labels, annotations, &n.spec, &n.status);
        // Serializing cannot fail for these types; an empty body then still hashes the same.
        serde_json::to_vec(&parts).unwrap_or_default().hash(&mut h);
        h.finish()
    }

    /// Whether `ev` can change what fits: a node added, removed or changed in what placement
    /// reads, or the end of a relist (anything may have happened meanwhile).
    pub fn changed(&mut self, ev: &Event<Node>) -> bool {
        match ev {
            Event::Apply(n) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                self.0.insert(name, Self::of(n)) != Some(Self::of(n))
            }
            Event::InitApply(n) => {
                self.0.insert(n.metadata.name.clone().unwrap_or_default(), Self::of(n));
                false
            }
            Event::Delete(n) => {
                self.0.remove(n.metadata.name.as_deref().unwrap_or_default());
                true
            }
            Event::Init => false,
            Event::InitDone => true,
        }
    }
}

/// Keeps a namespace's name and labels (what namespace selectors read).
pub fn namespace(n: &mut Namespace) {
    trim_meta(&mut n.metadata, &[]);
    n.spec = None;
    n.status = None;
}

/// Keeps what VolumeBinding reads of a claim: the volume it is bound to and its class.
pub fn claim(c: &mut PersistentVolumeClaim) {
    trim_meta(&mut c.metadata, &[]);
    if let Some(spec) = c.spec.take() {
        c.spec = Some(PersistentVolumeClaimSpec {
            volume_name: spec.volume_name,
            storage_class_name: spec.storage_class_name,
            ..Default::default()
        });
    }
    c.status = None;
}

/// Keeps what VolumeBinding and VolumeZone read of a volume: its node affinity and labels.
pub fn volume(v: &mut PersistentVolume) {
    trim_meta(&mut v.metadata, &[]);
    if let Some(spec) = v.spec.take() {
        v.spec = Some(PersistentVolumeSpec { node_affinity: spec.node_affinity, ..Default::default() });
    }
    v.status = None;
}

/// Keeps a storage class's binding mode.
pub fn storage_class(c: &mut StorageClass) {
    trim_meta(&mut c.metadata, &[]);
    c.parameters = None;
    c.mount_options = None;
    c.allowed_topologies = None;
}

/// Keeps what placement reads of a node.
pub fn node(n: &mut Node) {
    trim_meta(&mut n.metadata, &[GPU_TOPOLOGY_ANNOTATION, GPU_ASSIGNED_ANNOTATION, GPU_HEALTH_ANNOTATION]);
    if let Some(spec) = n.spec.take() {
        n.spec = Some(NodeSpec { taints: spec.taints, unschedulable: spec.unschedulable, ..Default::default() });
    }
    if let Some(status) = n.status.take() {
        n.status = Some(NodeStatus { allocatable: status.allocatable, ..Default::default() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;

    #[test]
    fn only_node_changes_placement_reads_count() {
        let mut n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": {"rack": "a"}, "resourceVersion": "1"},
            "status": {"allocatable": {"nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]}
        }))
        .expect("node");
        node(&mut n);
        let mut seen = NodeFingerprints::default();
        assert!(!seen.changed(&Event::Init));
        assert!(!seen.changed(&Event::InitApply(n.clone())), "a relist reports once, at its end");
        assert!(seen.changed(&Event::InitDone));
        // A heartbeat: new resourceVersion and heartbeat time, nothing placement reads.
        let mut beat = n.clone();
        beat.metadata.resource_version = Some("2".into());
        assert!(!seen.changed(&Event::Apply(beat.clone())));
        let mut relabelled = beat.clone();
        relabelled.metadata.labels = Some([("rack".to_string(), "b".to_string())].into());
        assert!(seen.changed(&Event::Apply(relabelled.clone())));
        assert!(!seen.changed(&Event::Apply(relabelled.clone())));
        let mut bigger = relabelled.clone();
        bigger.status.as_mut().expect("status").allocatable =
            Some([("nvidia.com/gpu".to_string(), Quantity("16".into()))].into());
        assert!(seen.changed(&Event::Apply(bigger.clone())));
        // The agent's annotations are kept; what kubelet gave wakes a cycle, a health sample not.
        let annotated = |key: &str, value: &str| {
            let mut n = bigger.clone();
            n.metadata.annotations.get_or_insert_default().insert(key.to_string(), value.to_string());
            node(&mut n);
            n
        };
        let sampled = annotated(GPU_HEALTH_ANNOTATION, "{}");
        assert!(sampled.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(GPU_HEALTH_ANNOTATION)));
        assert!(!seen.changed(&Event::Apply(sampled)));
        assert!(seen.changed(&Event::Apply(annotated(GPU_ASSIGNED_ANNOTATION, "{}"))));
        assert!(seen.changed(&Event::Apply(bigger.clone())));
        assert!(seen.changed(&Event::Delete(bigger.clone())));
        assert!(seen.changed(&Event::Apply(bigger)), "a node seen again after its deletion is new");
    }

    #[test]
    fn pods_keep_only_what_placement_reads() {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "labels": {"a": "b"}, "annotations": {GPU_INDICES_ANNOTATION: "0,1", "big": "x"},
                         "managedFields": [{"manager": "m"}]},
            "spec": {"nodeName": "n", "nodeSelector": {"k": "v"}, "volumes": [{"name": "v", "emptyDir": {}}],
                     "containers": [{"name": "c", "image": "i", "command": ["x"], "env": [{"name": "E", "value": "v"}],
                                     "ports": [{"containerPort": 80}],
                                     "resources": {"requests": {"cpu": "1"}}}],
                     "tolerations": [{"operator": "Exists"}], "schedulingGates": [{"name": "g"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .expect("pod");
        pod(&mut p);
        let v = serde_json::to_value(&p).expect("json");
        assert_eq!(v["metadata"]["annotations"], json!({GPU_INDICES_ANNOTATION: "0,1"}));
        assert_eq!(v["metadata"]["labels"], json!({"a": "b"}));
        assert!(v["metadata"].get("managedFields").is_none());
        assert_eq!(v["spec"]["containers"], json!([{"name": "c", "resources": {"requests": {"cpu": "1"}}}]));
        assert!(v["spec"].get("volumes").is_none());
        assert_eq!(v["spec"]["nodeName"], "n");
        assert_eq!(v["spec"]["schedulingGates"], json!([{"name": "g"}]));
        assert_eq!(v["status"], json!({"phase": "Running"}));
    }

    #[test]
    fn pods_keep_requests_not_limits_and_no_empty_annotations() {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": {"other": "x"}},
            "spec": {"containers": [{"name": "c", "resources": {
                "requests": {"cpu": "1", "nvidia.com/gpu": "2"}, "limits": {"cpu": "2", "nvidia.com/gpu": "2"}}}]}
        }))
        .expect("pod");
        pod(&mut p);
        assert_eq!(p.metadata.annotations, None, "no annotation read: no map");
        let v = serde_json::to_value(&p).expect("json");
        assert_eq!(v["spec"]["containers"][0]["resources"], json!({"requests": {"cpu": "1", "nvidia.com/gpu": "2"}}));
        assert_eq!(crate::controllers::devices::gpus_wanted(&p), 2, "the GPU count reads the requests");
    }

    #[test]
    fn pods_keep_what_inter_pod_filters_and_the_bind_watcher_read() {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"volumes": [{"name": "v", "emptyDir": {}}, {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}],
                     "containers": [{"name": "c", "ports": [{"containerPort": 80}, {"containerPort": 81, "hostPort": 8081}]}],
                     "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                         {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "x"}}}]}},
                     "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}],
                     "schedulerName": "other"},
            "status": {"phase": "Pending", "nominatedNodeName": "n2", "conditions": [{"type": "Ready", "status": "False"},
                       {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}]}
        }))
        .expect("pod");
        pod(&mut p);
        assert_eq!(serde_json::to_value(&p).expect("json")["status"]["nominatedNodeName"], "n2");
        let v = serde_json::to_value(&p).expect("json");
        assert_eq!(v["spec"]["volumes"], json!([{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]));
        assert_eq!(v["spec"]["containers"][0]["ports"], json!([{"containerPort": 81, "hostPort": 8081}]));
        assert_eq!(
            v["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"],
            "kubernetes.io/hostname"
        );
        assert_eq!(v["spec"]["topologySpreadConstraints"][0]["maxSkew"], 1);
        assert_eq!(v["spec"]["schedulerName"], "other");
        assert_eq!(
            v["status"]["conditions"],
            json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}])
        );
    }

    #[test]
    fn a_bound_pod_keeps_what_status_reads_and_a_waiting_pod_keeps_its_shape() {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u", "labels": {"a": "b"}, "annotations": {GPU_INDICES_ANNOTATION: "0"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": "n"}, "schedulerName": "other", "priority": 5,
                     "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}],
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}},
                                     "ports": [{"containerPort": 81, "hostPort": 8081}]}],
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                         {"matchExpressions": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}]}}},
                     "tolerations": [{"operator": "Exists"}],
                     "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]},
            "status": {"phase": "Running"}
        }))
        .expect("pod");
        pod(&mut p);
        // Not bound yet: nothing more is dropped (placement and the pin read it all).
        let waiting = p.clone();
        bound_pod(&mut p);
        assert_eq!(p, waiting);
        p.spec.as_mut().expect("spec").node_name = Some(String::new());
        bound_pod(&mut p);
        assert_eq!(p.spec.as_ref().expect("spec").containers.len(), 1, "an empty node name is not bound");

        p.spec.as_mut().expect("spec").node_name = Some("n".into());
        let before = p.clone();
        bound_pod(&mut p);
        let v = serde_json::to_value(&p).expect("json");
        assert_eq!(
            v["spec"],
            json!({"nodeName": "n", "nodeSelector": {"kubernetes.io/hostname": "n"}, "schedulerName": "other",
                   "priority": 5, "containers": [],
                   "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]})
        );
        assert_eq!((p.metadata.clone(), p.status.clone()), (before.metadata.clone(), before.status.clone()));
        // What the cycle reads of a bound pod reads the same.
        assert_eq!(crate::pods::PodClass::of(&p), crate::pods::PodClass::of(&before));
        assert_eq!(crate::scheduler::status::pinned_hostname(&p), Some("n"));
        let unmodelled = |p: &Pod| crate::scheduler::unmodelled(p.spec.as_ref().expect("spec"));
        assert_eq!(unmodelled(&p), unmodelled(&before));
        assert!(!unmodelled(&p).is_empty(), "the scheduler and the volume are still reported");
    }

    /// A pod as large as the API server takes (~1.5 MiB): thousands of labels, containers,
    /// tolerations and affinity terms, bound to `n1` (or held by muster's gate).
    fn huge_pod(bound: bool) -> Pod {
        let labels: serde_json::Map<String, serde_json::Value> =
            (0..2000).map(|i| (format!("tenant.example.com/l-{i:04}"), json!("v".repeat(60)))).collect();
        let mut labels = labels;
        labels.insert(crate::crds::POD_GROUP_LABEL.into(), json!("g"));
        let containers: Vec<_> = (0..400)
            .map(|i| {
                json!({"name": format!("c-{i}"), "image": "i", "env": [{"name": "E", "value": "x".repeat(200)}],
                       "ports": [{"containerPort": 80, "hostPort": if i == 0 { 8080 } else { 0 }}],
                       "resources": {"requests": {"cpu": "10m", "memory": "1Mi", "nvidia.com/gpu": if i < 2 { "1" } else { "0" },
                                                  format!("example.com/r{}", i % 3): "1"}}})
            })
            .collect();
        let tolerations: Vec<_> =
            (0..3000).map(|i| json!({"key": format!("k-{i}"), "operator": "Equal", "value": "v".repeat(40)})).collect();
        let terms: Vec<_> = (0..1000)
            .map(|i| json!({"matchExpressions": [{"key": format!("zone-{i}"), "operator": "In", "values": ["a", "b", "c"]}]}))
            .collect();
        let mut spec = json!({
            "containers": containers,
            "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "8", "memory": "1Gi"}}}],
            "overhead": {"cpu": "250m"},
            "tolerations": tolerations,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}},
            "priority": 7,
            "nodeSelector": {HOSTNAME_LABEL: "n1", "big": "x".repeat(300)},
        });
        if bound {
            spec["nodeName"] = json!("n1");
        } else {
            spec["schedulingGates"] = json!([{"name": ADMISSION_GATE}, {"name": "other"}]);
        }
        serde_json::from_value(json!({
            "metadata": {"name": "big", "namespace": "t", "uid": "u-big", "resourceVersion": "9", "labels": labels,
                         "annotations": {GPU_INDICES_ANNOTATION: "0,1", COMPLETION_INDEX_ANNOTATION: "x".repeat(5000),
                                         "kubectl.kubernetes.io/last-applied-configuration": "y".repeat(880_000)}},
            "spec": spec,
            "status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}
        }))
        .expect("pod")
    }

    #[test]
    fn a_huge_pod_is_kept_small_and_still_counts_what_it_uses_where_it_runs() {
        let original = huge_pod(true);
        let size = serde_json::to_vec(&original).expect("json").len();
        assert!(size > 1_500_000, "the pod is {size} bytes");
        let mut whole = original.clone();
        trim_pod(&mut whole);
        assert!(oversize(&whole, MAX_KEPT_POD_BYTES).is_some(), "trimming alone keeps it too large");
        let mut kept = original.clone();
        pod(&mut kept);
        let kept_size = serde_json::to_vec(&kept).expect("json").len();
        assert!(kept_size < 4096, "kept {kept_size} bytes");
        let why = kept.metadata.annotations.as_ref().and_then(|a| a.get(KEPT_MINIMAL_ANNOTATION)).expect("marked");
        assert!(why.contains("over the limit of 65536"), "{why}");
        // What it uses on its node reads the same as from the whole pod: requests summed
        // (containers, the init container's peak, overhead), host ports, node, priority.
        use crate::scheduler::{PodUsage, Target};
        let (usage, whole_usage) = (PodUsage::of(&kept).expect("counted"), PodUsage::of(&whole).expect("counted"));
        assert_eq!(usage.target, Target::Node("n1".into()));
        assert_eq!(usage.requests, whole_usage.requests);
        let requests = usage.requests.clone().expect("some").expect("readable");
        assert_eq!((requests.cpu_milli, requests.gpus, requests.extended_amount("example.com/r1")), (8250, 2, 133));
        assert_eq!(usage.host_ports, whole_usage.host_ports);
        assert_eq!(usage.victim, whole_usage.victim);
        assert_eq!(usage.labels.get(crate::crds::POD_GROUP_LABEL), Some("g"));
        assert_eq!(usage.labels.get("tenant.example.com/l-0001"), None, "only muster's labels are kept");
        assert_eq!(crate::controllers::devices::gpus_wanted(&kept), crate::controllers::devices::gpus_wanted(&whole));
        assert_eq!(crate::pods::PodClass::of(&kept), crate::pods::PodClass::of(&whole));
        let annotations = kept.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(annotations.get(GPU_INDICES_ANNOTATION).map(String::as_str), Some("0,1"));
        assert!(!annotations.contains_key(COMPLETION_INDEX_ANNOTATION), "a long value is not kept");
        assert_eq!(kept.metadata.uid.as_deref(), Some("u-big"));
        assert_eq!(kept.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Running"));
        // The store's slim of a bound pod keeps what the cycle reads, the mark included.
        let mut slim = kept.clone();
        bound_pod(&mut slim);
        assert_eq!((&slim.metadata, &slim.status), (&kept.metadata, &kept.status));
    }

    #[test]
    fn a_huge_waiting_pod_is_kept_gated_and_never_placed() {
        let mut kept = huge_pod(false);
        pod(&mut kept);
        assert!(serde_json::to_vec(&kept).expect("json").len() < 4096);
        assert_eq!(crate::pods::Placement::of(&kept), crate::pods::Placement::Gated);
        // Its shape does not read: placement leaves it gated and its group says why.
        let err = crate::scheduler::PodShape::from_pod(&kept).expect_err("unreadable");
        assert!(err.to_string().contains(TOO_LARGE_RESOURCE), "{err}");
        // Nothing is counted for it (a gated pod uses nothing yet).
        assert!(crate::scheduler::PodUsage::of(&kept).is_none());
    }

    #[test]
    fn ordinary_pods_are_kept_exactly_as_trimming_keeps_them() {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u", "labels": {"a": "b", crate::crds::POD_GROUP_LABEL: "g"},
                         "annotations": {GPU_INDICES_ANNOTATION: "0"}},
            "spec": {"nodeName": "n", "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}
        }))
        .expect("pod");
        let mut trimmed = p.clone();
        trim_pod(&mut trimmed);
        pod(&mut p);
        assert_eq!(p, trimmed);
        assert!(p.metadata.annotations.as_ref().is_some_and(|a| !a.contains_key(KEPT_MINIMAL_ANNOTATION)));
        // The mark is admission's alone: a pod that carries it is not taken for a minimal one.
        let mut forged = trimmed.clone();
        forged.metadata.annotations.get_or_insert_default().insert(KEPT_MINIMAL_ANNOTATION.into(), "x".into());
        pod(&mut forged);
        assert_eq!(forged, trimmed);
        // A pod just under the bound is kept whole too; one just over is not.
        let size = serde_json::to_vec(&p).expect("json").len();
        assert_eq!(oversize(&p, size), None);
        assert_eq!(oversize(&p, size - 1), Some(size));
    }

    #[test]
    fn a_huge_annotation_alone_makes_a_pod_minimal_and_is_dropped() {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u", "annotations": {GPU_INDICES_ANNOTATION: "0,".repeat(100_000)}},
            "spec": {"nodeName": "n", "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": "Running"}
        }))
        .expect("pod");
        pod(&mut p);
        let annotations = p.metadata.annotations.clone().unwrap_or_default();
        assert!(annotations.contains_key(KEPT_MINIMAL_ANNOTATION) && !annotations.contains_key(GPU_INDICES_ANNOTATION));
        let usage = crate::scheduler::PodUsage::of(&p).expect("counted");
        assert_eq!(usage.requests.and_then(Result::ok).map(|r| r.cpu_milli), Some(1000));
    }

    #[test]
    fn nodes_keep_labels_taints_and_allocatable() {
        let mut n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": {"kubernetes.io/hostname": "n"}, "annotations": {GPU_TOPOLOGY_ANNOTATION: "{}", "x": "y"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "podCIDR": "10.0.0.0/24"},
            "status": {"allocatable": {"cpu": "8"}, "images": [{"names": ["a"]}], "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .expect("node");
        node(&mut n);
        let v = serde_json::to_value(&n).expect("json");
        assert_eq!(v["metadata"]["annotations"], json!({GPU_TOPOLOGY_ANNOTATION: "{}"}));
        assert_eq!(v["spec"], json!({"taints": [{"key": "k", "effect": "NoSchedule"}]}));
        assert_eq!(v["status"], json!({"allocatable": {"cpu": "8"}}));
    }
}
