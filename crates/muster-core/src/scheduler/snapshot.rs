//! The cluster as one admission decision sees it: nodes (labels, taints, allocatable, GPU
//! state) and what pods bound to them or admitted onto them already use. Built from
//! `Node`/`Pod` lists by pure conversion; never changed by a decision.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Node, Pod};

use super::dra::Dra;
use super::interpod::{HostPort, PodTerm, host_ports};
use super::resources::{ResourceError, Resources, pod_requests};
use super::shape::{ShapeError, Taint};
use super::volumes::Volumes;
use crate::devices::{GpuSet, MAX_GPUS};
use crate::pods::{Placement, PodClass};
use muster_api::{GPU_RESOURCE, HOSTNAME_LABEL, POD_GROUP_LABEL};

/// Something in the cluster lists that could not be taken into the snapshot as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// A node object without a name.
    #[error("a node has no name")]
    NodeWithoutName,
    /// Two node objects with the same name.
    #[error("node {0:?} is listed twice")]
    DuplicateNode(String),
    /// A node's allocatable could not be read; the node is left out.
    #[error("node {node:?}: allocatable {source}")]
    Allocatable {
        /// The node.
        node: String,
        /// What was wrong.
        #[source]
        source: ResourceError,
    },
    /// A pod on a node has unreadable requests; the node is not offered.
    #[error("pod {pod:?} on node {node:?}: requests {source}")]
    PodRequests {
        /// namespace/name of the pod.
        pod: String,
        /// The node it uses.
        node: String,
        /// What was wrong.
        #[source]
        source: ResourceError,
    },
    /// An admitted pod is pinned to a hostname no node has (the node is gone).
    #[error("admitted pod {pod:?} is pinned to hostname {hostname:?}, which no node has")]
    UnknownHostname {
        /// namespace/name of the pod.
        pod: String,
        /// The pinned hostname.
        hostname: String,
    },
    /// A pod on a node has an anti-affinity term that cannot be read (kube-scheduler refuses
    /// such pods too); its terms are left out.
    #[error("pod {pod:?}: pod anti-affinity {source}")]
    PodTerms {
        /// namespace/name of the pod.
        pod: String,
        /// What was wrong.
        #[source]
        source: ShapeError,
    },
}

/// A pod bound to a node or admitted onto it, as inter-pod rules see it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodePod {
    /// `namespace/name`.
    pub key: std::sync::Arc<str>,
    /// Its requests (none when they cannot be read: its node is then unusable).
    pub requests: Resources,
    /// What preemption weighs of it.
    pub victim: VictimInfo,
    /// Index of its node in the snapshot.
    pub node: u32,
    /// Namespace.
    pub namespace: std::sync::Arc<str>,
    /// Labels.
    pub labels: Labels,
    /// Its required anti-affinity terms (the symmetric rule: they keep matching pods away).
    pub anti_affinity: Vec<PodTerm>,
    /// Host ports it binds.
    pub host_ports: Vec<HostPort>,
    /// Being deleted (topology spread does not count it; everything else still does).
    pub terminating: bool,
}

/// Why a node is never offered, whatever the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unusable {
    /// The node has no `kubernetes.io/hostname` label, so a pod cannot be pinned to it.
    NoHostname,
    /// Another node has the same `kubernetes.io/hostname` value, so a pin would be ambiguous.
    SharedHostname,
    /// A pod using the node has unreadable requests, so its free capacity is unknown.
    UnreadableUsage,
}

/// Node labels, sorted by key for quick lookup. Shared on clone (a snapshot copies every
/// node's labels each cycle; only a label set is copied, on write).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels(std::sync::Arc<Vec<(Box<str>, Box<str>)>>);

impl Labels {
    /// The value of a label.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.binary_search_by(|(k, _)| k.as_ref().cmp(key)).ok().map(|i| self.0[i].1.as_ref())
    }

    /// Sets a label.
    pub fn insert(&mut self, key: &str, value: &str) {
        let labels = std::sync::Arc::make_mut(&mut self.0);
        match labels.binary_search_by(|(k, _)| k.as_ref().cmp(key)) {
            Ok(i) => labels[i].1 = value.into(),
            Err(i) => labels.insert(i, (key.into(), value.into())),
        }
    }

    /// All labels, by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_ref(), v.as_ref()))
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Labels {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut labels = Labels::default();
        for (k, v) in iter {
            labels.insert(k.as_ref(), v.as_ref());
        }
        labels
    }
}

/// One node: what it offers and what is already taken.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeInfo {
    /// `metadata.name`.
    pub name: String,
    /// Labels, including `kubernetes.io/hostname`.
    pub labels: Labels,
    /// Taints.
    pub taints: Vec<Taint>,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// `status.allocatable`.
    pub allocatable: Resources,
    /// Requests of pods bound to the node or admitted onto it and not yet bound.
    pub requested: Resources,
    /// GPUs with indices `0..gpu_count` (at most 64).
    pub gpu_count: u32,
    /// GPU indices not on offer: allocated (from the GPU ledger) or unhealthy.
    pub gpu_used: GpuSet,
    /// Set when the node must not be offered to any pod.
    pub unusable: Option<Unusable>,
}

impl NodeInfo {
    /// A node with this allocatable, labelled `kubernetes.io/hostname: <name>`, nothing used,
    /// and `gpu_count` taken from its `nvidia.com/gpu` allocatable.
    pub fn new(name: &str, allocatable: Resources) -> Self {
        let mut node = Self {
            name: name.to_string(),
            labels: Labels::default(),
            taints: Vec::new(),
            unschedulable: false,
            gpu_count: gpu_count(&allocatable),
            allocatable,
            requested: Resources::new(),
            gpu_used: GpuSet::EMPTY,
            unusable: None,
        };
        node.labels.insert(HOSTNAME_LABEL, name);
        node
    }

    /// Builder: sets a label.
    pub fn with_label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key, value);
        self
    }

    /// Builder: adds a taint.
    pub fn with_taint(mut self, taint: Taint) -> Self {
        self.taints.push(taint);
        self
    }

    /// Builder: sets what is already requested on the node.
    pub fn with_requested(mut self, requested: Resources) -> Self {
        self.requested = requested;
        self
    }

    /// Builder: marks GPU indices as used.
    pub fn with_gpu_used(mut self, used: GpuSet) -> Self {
        self.gpu_used = used;
        self
    }

    /// The node's `kubernetes.io/hostname` label, which an admission pin selects on.
    pub fn hostname(&self) -> Option<&str> {
        self.labels.get(HOSTNAME_LABEL)
    }

    /// The GPU indices the node has: `0..gpu_count`.
    pub fn gpus(&self) -> GpuSet {
        GpuSet::first(self.gpu_count as usize)
    }

    /// Converts a Kubernetes node (usage starts empty).
    pub fn from_node(node: &Node) -> Result<Self, SnapshotError> {
        let name = node.metadata.name.clone().ok_or(SnapshotError::NodeWithoutName)?;
        let allocatable = match node.status.as_ref().and_then(|s| s.allocatable.as_ref()) {
            Some(map) => Resources::from_quantities(map)
                .map_err(|source| SnapshotError::Allocatable { node: name.clone(), source })?,
            None => Resources::new(),
        };
        let spec = node.spec.as_ref();
        Ok(Self {
            labels: node.metadata.labels.iter().flatten().collect(),
            taints: spec.and_then(|s| s.taints.as_ref()).into_iter().flatten().map(Taint::from_k8s).collect(),
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
            gpu_count: gpu_count(&allocatable),
            allocatable,
            requested: Resources::new(),
            gpu_used: GpuSet::EMPTY,
            unusable: None,
            name,
        })
    }
}

fn gpu_count(allocatable: &Resources) -> u32 {
    u32::try_from(allocatable.get(GPU_RESOURCE).clamp(0, MAX_GPUS as i64)).unwrap_or(0)
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Where a pod's usage counts: the node it is bound to, or the hostname muster pinned it to.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// Bound (`spec.nodeName`).
    Node(String),
    /// Admitted by muster, not bound yet (pinned by the hostname label).
    Hostname(String),
    /// Waiting, nominated to this node (`status.nominatedNodeName`: a preemptor's claim on the
    /// room its victims free). It uses nothing yet; kube-scheduler counts it on the node for
    /// pods of its priority or lower, so admission keeps such pods off the node (see
    /// [`Snapshot::nominated_nodes`]).
    Nominated(String),
}

/// What one pod adds to a snapshot, read from the pod once (when its watch event arrives), so
/// a snapshot can be assembled without reading pod objects again. `None` from [`PodUsage::of`]
/// for pods that use nothing and claim nothing: gated or unpinned without a nomination,
/// finished, or pinned by something other than muster's admission.
#[derive(Clone, Debug, PartialEq)]
pub struct PodUsage {
    /// namespace/name, for problems.
    pub key: std::sync::Arc<str>,
    /// Where it counts.
    pub target: Target,
    /// Its requests (`None` without a spec), or why they cannot be read.
    pub requests: Option<Result<Resources, ResourceError>>,
    /// Namespace.
    pub namespace: std::sync::Arc<str>,
    /// Labels.
    pub labels: Labels,
    /// Required anti-affinity terms, or why they cannot be read.
    pub anti_affinity: Result<Vec<PodTerm>, ShapeError>,
    /// Host ports it binds.
    pub host_ports: Vec<HostPort>,
    /// Being deleted.
    pub terminating: bool,
    /// What preemption weighs of it.
    pub victim: VictimInfo,
}

/// What preemption reads of a running pod: its priority, who manages it, the GPU indices it
/// holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VictimInfo {
    /// `spec.priority` (0 when unset).
    pub priority: i32,
    /// muster admits it (it carries the PodGroup label): it is weighed with its group.
    pub managed: bool,
    /// The native PodGroup it joined (`spec.schedulingGroup.podGroupName`), if any: its pods
    /// go whole or not at all.
    pub native_group: Option<std::sync::Arc<str>>,
    /// Its `gpu.muster.dev/indices`.
    pub gpus: GpuSet,
}

impl VictimInfo {
    /// What preemption reads of `pod`.
    pub fn of(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        let annotations = pod.metadata.annotations.as_ref();
        Self {
            priority: spec.and_then(|s| s.priority).unwrap_or(0),
            managed: pod.metadata.labels.as_ref().is_some_and(|l| l.contains_key(POD_GROUP_LABEL)),
            native_group: spec
                .and_then(|s| s.scheduling_group.as_ref())
                .and_then(|g| g.pod_group_name.as_deref())
                .map(Into::into),
            gpus: annotations
                .and_then(|a| a.get(muster_api::GPU_INDICES_ANNOTATION))
                .and_then(|v| crate::devices::parse_indices(v).ok())
                .unwrap_or_default(),
        }
    }
}

impl PodUsage {
    /// A pod `key` (`namespace/name`) bound to `node` with `requests` and nothing else of
    /// note (no labels, inter-pod rules or ports): what [`PodUsage::of`] reads of such a pod.
    pub fn bound(key: &str, node: &str, requests: Resources, victim: VictimInfo) -> Self {
        Self {
            key: key.into(),
            target: Target::Node(node.into()),
            requests: Some(Ok(requests)),
            namespace: key.split_once('/').map_or("", |(ns, _)| ns).into(),
            labels: Labels::default(),
            anti_affinity: Ok(Vec::new()),
            host_ports: Vec::new(),
            terminating: false,
            victim,
        }
    }

    /// What `pod` uses, if it uses anything.
    pub fn of(pod: &Pod) -> Option<Self> {
        let class = PodClass::of(pod);
        let target = match class.placement {
            _ if class.finished() => return None,
            Placement::Bound(node) => Target::Node(node),
            Placement::Admitted(hostname)
                if !class.terminating
                    && pod.metadata.labels.as_ref().is_some_and(|l| l.contains_key(POD_GROUP_LABEL)) =>
            {
                Target::Hostname(hostname)
            }
            _ if class.terminating => return None,
            _ => match pod.status.as_ref().and_then(|s| s.nominated_node_name.as_deref()).filter(|n| !n.is_empty()) {
                Some(node) => Target::Nominated(node.into()),
                None => return None,
            },
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let labels: Labels = pod.metadata.labels.iter().flatten().collect();
        let spec = pod.spec.as_ref();
        let anti = spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
        let anti_affinity =
            anti.into_iter().flatten().map(|t| PodTerm::from_k8s(t, namespace, &labels)).collect::<Result<Vec<_>, _>>();
        Some(Self {
            key: pod_key(pod).into(),
            target,
            requests: spec.map(pod_requests),
            namespace: namespace.into(),
            labels,
            anti_affinity,
            host_ports: spec.map(host_ports).unwrap_or_default(),
            terminating: crate::pods::is_terminating(pod),
            victim: VictimInfo::of(pod),
        })
    }
}

/// Nodes sorted by name, with indexes by name and by hostname label.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    nodes: Vec<NodeInfo>,
    /// Shared by the snapshots assembled from one kept set of nodes (they change with the
    /// nodes only, not with the pods).
    by_name: std::sync::Arc<HashMap<String, u32>>,
    by_hostname: std::sync::Arc<HashMap<String, u32>>,
    problems: Vec<SnapshotError>,
    /// Pods bound or admitted, in the order they were added.
    pods: Vec<NodePod>,
    /// Per node: indexes into `pods`.
    pods_by_node: Vec<Vec<u32>>,
    /// Indexes into `pods` of those with required anti-affinity terms.
    anti_pods: Vec<u32>,
    /// Indexes into `pods` by namespace.
    by_namespace: HashMap<std::sync::Arc<str>, Vec<u32>>,
    /// Namespace labels (for namespace selectors of pod affinity terms).
    namespaces: HashMap<String, Labels>,
    /// PersistentVolumeClaims and the nodes their volumes allow.
    volumes: Volumes,
    /// DRA devices, templates and claims.
    dra: std::sync::Arc<Dra>,
    /// Waiting pods nominated to a node: `(node index, priority, namespace/name)`.
    nominated: Vec<(u32, i32, std::sync::Arc<str>)>,
    /// Where muster's admission plans put pods not bound yet, by pod UID: what vouches for
    /// their GPU indices ([`crate::devices::trust`]).
    placed: HashMap<Box<str>, crate::devices::Placed>,
}

impl Snapshot {
    /// A snapshot of these nodes, their usage as given.
    pub fn new(mut nodes: Vec<NodeInfo>) -> Self {
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let mut problems = Vec::new();
        nodes.dedup_by(|later, earlier| {
            let duplicate = later.name == earlier.name;
            if duplicate {
                problems.push(SnapshotError::DuplicateNode(later.name.clone()));
            }
            duplicate
        });
        let mut by_name = HashMap::with_capacity(nodes.len());
        let mut by_hostname: HashMap<String, u32> = HashMap::with_capacity(nodes.len());
        let mut shared = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            by_name.insert(node.name.clone(), i);
            if let Some(hostname) = node.hostname()
                && let Some(first) = by_hostname.insert(hostname.to_string(), i)
            {
                shared.extend([first, i]);
            }
        }
        for i in shared {
            if let Some(node) = nodes.get_mut(i as usize) {
                node.unusable = Some(Unusable::SharedHostname);
            }
        }
        for node in &mut nodes {
            if node.hostname().is_none() {
                node.unusable = Some(Unusable::NoHostname);
            }
        }
        let pods_by_node = vec![Vec::new(); nodes.len()];
        Self {
            nodes,
            by_name: std::sync::Arc::new(by_name),
            by_hostname: std::sync::Arc::new(by_hostname),
            problems,
            pods: Vec::new(),
            pods_by_node,
            anti_pods: Vec::new(),
            by_namespace: HashMap::new(),
            namespaces: HashMap::new(),
            volumes: Volumes::default(),
            dra: std::sync::Arc::default(),
            nominated: Vec::new(),
            placed: HashMap::new(),
        }
    }

    /// A snapshot of these nodes, with the problems met reading the node objects first.
    pub(crate) fn with_problems(nodes: Vec<NodeInfo>, problems: Vec<SnapshotError>) -> Self {
        let mut snapshot = Snapshot::new(nodes);
        snapshot.problems.splice(0..0, problems);
        snapshot
    }

    /// A snapshot from the cluster's node and pod lists: usage from pods bound to a node and
    /// from pods muster admitted (pinned by hostname, not yet bound). Objects that cannot be
    /// read are listed in [`Snapshot::problems`]; a node whose usage cannot be read is not
    /// offered. GPU indices in use come from the ledger: see [`Snapshot::set_gpu_used`].
    pub fn from_cluster(nodes: &[Node], pods: &[Pod]) -> Self {
        let mut problems = Vec::new();
        let infos = nodes.iter().filter_map(|n| NodeInfo::from_node(n).map_err(|e| problems.push(e)).ok()).collect();
        let mut snapshot = Snapshot::with_problems(infos, problems);
        for pod in pods {
            snapshot.add_pod(pod);
        }
        snapshot
    }

    /// Counts a pod's requests on the node it is bound to or admitted onto; returns whether it
    /// was counted. Gated, unpinned and finished pods use nothing.
    pub fn add_pod(&mut self, pod: &Pod) -> bool {
        PodUsage::of(pod).is_some_and(|usage| self.add_usage(&usage))
    }

    /// Room for `additional` more pods, so adding a cluster's pods one by one does not grow
    /// the list again and again.
    pub fn reserve_pods(&mut self, additional: usize) {
        self.pods.reserve(additional);
    }

    /// Counts what a pod uses (read once by [`PodUsage::of`]) on its node, or records its
    /// nomination; returns whether it was counted (false when its node is not in the snapshot).
    pub fn add_usage(&mut self, usage: &PodUsage) -> bool {
        let index = match &usage.target {
            Target::Nominated(node) => {
                let Some(&i) = self.by_name.get(node) else { return false };
                self.nominated.push((i, usage.victim.priority, usage.key.clone()));
                return true;
            }
            Target::Node(node) => self.by_name.get(node).copied(),
            Target::Hostname(hostname) => {
                let index = self.by_hostname.get(hostname).copied();
                if index.is_none() {
                    self.problems.push(SnapshotError::UnknownHostname {
                        pod: usage.key.to_string(),
                        hostname: hostname.clone(),
                    });
                }
                index
            }
        };
        let Some(i) = index.filter(|&i| (i as usize) < self.nodes.len()) else { return false };
        self.add_node_pod(usage, i);
        let node = &mut self.nodes[i as usize];
        match &usage.requests {
            Some(Ok(requests)) => node.requested.add(requests),
            Some(Err(source)) => {
                node.unusable = Some(Unusable::UnreadableUsage);
                self.problems.push(SnapshotError::PodRequests {
                    pod: usage.key.to_string(),
                    node: node.name.clone(),
                    source: source.clone(),
                });
            }
            None => {}
        }
        true
    }

    /// Records what inter-pod rules read of a pod counted on node `i`.
    fn add_node_pod(&mut self, usage: &PodUsage, i: u32) {
        let anti_affinity = match &usage.anti_affinity {
            Ok(terms) => terms.clone(),
            Err(source) => {
                self.problems.push(SnapshotError::PodTerms { pod: usage.key.to_string(), source: source.clone() });
                Vec::new()
            }
        };
        let index = u32::try_from(self.pods.len()).unwrap_or(u32::MAX);
        if !anti_affinity.is_empty() {
            self.anti_pods.push(index);
        }
        self.pods.push(NodePod {
            key: usage.key.clone(),
            requests: match &usage.requests {
                Some(Ok(r)) => r.clone(),
                _ => Resources::default(),
            },
            victim: usage.victim.clone(),
            node: i,
            namespace: usage.namespace.clone(),
            labels: usage.labels.clone(),
            anti_affinity,
            host_ports: usage.host_ports.clone(),
            terminating: usage.terminating,
        });
        self.pods_by_node[i as usize].push(index);
        self.by_namespace.entry(usage.namespace.clone()).or_default().push(index);
    }

    /// Takes pods out (preemption weighs the snapshot without its victims): each given as
    /// `(namespace/name, node, requests, GPU indices)`; its requests and GPUs are freed on its
    /// node and the inter-pod rules no longer see it. A pod not in the snapshot frees nothing.
    pub fn remove_pods<'a>(&mut self, pods: impl IntoIterator<Item = (&'a str, &'a str, &'a Resources, GpuSet)>) {
        let mut gone: std::collections::HashSet<(u32, &str)> = std::collections::HashSet::new();
        for (key, node, requests, gpus) in pods {
            let Some(&i) = self.by_name.get(node) else { continue };
            if !self.pods_by_node[i as usize].iter().any(|&p| &*self.pods[p as usize].key == key) {
                continue;
            }
            if !gone.insert((i, key)) {
                continue;
            }
            let info = &mut self.nodes[i as usize];
            info.requested.sub(requests);
            info.gpu_used = info.gpu_used.difference(gpus);
        }
        if gone.is_empty() {
            return;
        }
        let kept: Vec<NodePod> =
            std::mem::take(&mut self.pods).into_iter().filter(|p| !gone.contains(&(p.node, &*p.key))).collect();
        for list in &mut self.pods_by_node {
            list.clear();
        }
        self.anti_pods.clear();
        self.by_namespace.clear();
        for (index, pod) in kept.iter().enumerate() {
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            self.pods_by_node[pod.node as usize].push(index);
            if !pod.anti_affinity.is_empty() {
                self.anti_pods.push(index);
            }
            self.by_namespace.entry(pod.namespace.clone()).or_default().push(index);
        }
        self.pods = kept;
    }

    /// The pod `key` (`namespace/name`) on node `node`, as the snapshot counts it.
    pub fn node_pod(&self, node: &str, key: &str) -> Option<&NodePod> {
        let i = *self.by_name.get(node)?;
        self.pods_by_node.get(i as usize)?.iter().map(|&p| &self.pods[p as usize]).find(|p| &*p.key == key)
    }

    /// The nodes a waiting pod of priority `priority` or higher is nominated to, other than
    /// the pods `own` says are the asker's: kube-scheduler counts such a pod on its node when it
    /// places a pod of priority `priority` (its nominator adds nominated pods of equal or higher
    /// priority to the node it filters, gated ones included), so a pin of such a pod there may
    /// not bind. Admission keeps roots of that priority off these nodes.
    pub fn nominated_nodes(&self, priority: i32, own: impl Fn(&str) -> bool) -> BTreeSet<String> {
        self.nominated
            .iter()
            .filter(|(_, p, key)| *p >= priority && !own(key))
            .map(|(i, _, _)| self.nodes[*i as usize].name.clone())
            .collect()
    }

    /// Waiting pods nominated to a node: `(namespace/name, node, priority)`.
    pub fn nominations(&self) -> impl Iterator<Item = (&str, &str, i32)> {
        self.nominated.iter().map(|(i, p, key)| (&**key, self.nodes[*i as usize].name.as_str(), *p))
    }

    /// The pods bound or admitted in one namespace.
    pub fn pods_in(&self, namespace: &str) -> impl Iterator<Item = &NodePod> {
        self.by_namespace.get(namespace).into_iter().flatten().map(|&p| &self.pods[p as usize])
    }

    /// Sets the labels of every namespace (read by namespace selectors of pod affinity terms).
    pub fn set_namespaces(&mut self, namespaces: impl IntoIterator<Item = (String, Labels)>) {
        self.namespaces = namespaces.into_iter().collect();
    }

    /// Sets the cluster's claims and volumes (read by pods that mount claims).
    pub fn set_volumes(&mut self, volumes: Volumes) {
        self.volumes = volumes;
    }

    /// Sets the cluster's DRA state. A node whose GPUs are published as devices of the GPU
    /// driver has GPU indices up to its highest device index, and the GPUs whose devices any
    /// claim holds are taken (now, and in what [`Snapshot::set_gpu_used`] sets later).
    pub fn set_dra(&mut self, dra: impl Into<std::sync::Arc<Dra>>) {
        let dra = dra.into();
        if let Some(inventory) = dra.inventory() {
            for node in &mut self.nodes {
                let devices = inventory.node_gpus(&node.name);
                let count = devices.iter().max().map_or(0, |i| i as u32 + 1);
                node.gpu_count = node.gpu_count.max(count);
                node.gpu_used = node.gpu_used.union(inventory.allocated_gpus(&node.name));
            }
        }
        self.dra = dra;
    }

    /// The cluster's DRA state.
    pub fn dra(&self) -> &Dra {
        &self.dra
    }

    /// Records where muster's admission plans put pods (pod UID -> node and GPUs): the one
    /// thing that vouches for the GPU indices of a pod not bound yet.
    pub fn set_placed(&mut self, placed: impl IntoIterator<Item = (String, crate::devices::Placed)>) {
        self.placed = placed.into_iter().map(|(uid, p)| (uid.into_boxed_str(), p)).collect();
    }

    /// Where muster's admission plan put the pod `uid`, if it did.
    pub fn placed(&self, uid: &str) -> Option<&crate::devices::Placed> {
        self.placed.get(uid)
    }

    /// The labels of a namespace, when known.
    pub fn namespace_labels(&self, namespace: &str) -> Option<&Labels> {
        self.namespaces.get(namespace)
    }

    /// The cluster's claims and volumes.
    pub fn volumes(&self) -> &Volumes {
        &self.volumes
    }

    /// Every pod bound or admitted.
    pub fn node_pods(&self) -> &[NodePod] {
        &self.pods
    }

    /// The pods bound to or admitted onto node `i`.
    pub fn pods_on(&self, i: u32) -> impl Iterator<Item = &NodePod> {
        self.pods_by_node.get(i as usize).into_iter().flatten().map(|&p| &self.pods[p as usize])
    }

    /// Pods with required anti-affinity terms.
    pub fn anti_affinity_pods(&self) -> impl Iterator<Item = &NodePod> {
        self.anti_pods.iter().map(|&p| &self.pods[p as usize])
    }

    /// Sets the GPU indices not on offer on a node (from the GPU ledger and health); returns
    /// false when there is no such node. GPUs whose devices a DRA claim holds stay taken.
    pub fn set_gpu_used(&mut self, node: &str, used: GpuSet) -> bool {
        let allocated = self.dra.inventory().map_or(GpuSet::EMPTY, |i| i.allocated_gpus(node));
        match self.by_name.get(node).and_then(|&i| self.nodes.get_mut(i as usize)) {
            Some(n) => {
                n.gpu_used = used.union(allocated);
                true
            }
            None => false,
        }
    }

    /// The nodes, sorted by name.
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.index_of(name).map(|i| &self.nodes[i as usize])
    }

    /// A node by its `kubernetes.io/hostname` label.
    pub fn node_by_hostname(&self, hostname: &str) -> Option<&NodeInfo> {
        self.index_by_hostname(hostname).map(|i| &self.nodes[i as usize])
    }

    /// What could not be taken in as it is.
    pub fn problems(&self) -> &[SnapshotError] {
        &self.problems
    }

    pub(crate) fn index_of(&self, name: &str) -> Option<u32> {
        self.by_name.get(name).copied()
    }

    pub(crate) fn index_by_hostname(&self, hostname: &str) -> Option<u32> {
        self.by_hostname.get(hostname).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::shape::TaintEffect;
    use k8s_openapi::api::core::v1::{
        Container, NodeSpec, NodeStatus, PodSchedulingGate, PodSpec, PodStatus, ResourceRequirements, Taint as K8sTaint,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn k8s_node(name: &str, hostname: &str, allocatable: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([(HOSTNAME_LABEL.to_string(), hostname.to_string())].into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                unschedulable: Some(true),
                taints: Some(vec![K8sTaint {
                    key: "dedicated".into(),
                    value: Some("infra".into()),
                    effect: "NoExecute".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                allocatable: Some(allocatable.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect()),
                ..Default::default()
            }),
        }
    }

    fn k8s_pod(name: &str, cpu: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                labels: Some([(POD_GROUP_LABEL.to_string(), "g".to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some([("cpu".to_string(), Quantity(cpu.into()))].into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn bound(mut pod: Pod, node: &str) -> Pod {
        pod.spec.as_mut().unwrap().node_name = Some(node.into());
        pod
    }

    fn pinned(mut pod: Pod, hostname: &str) -> Pod {
        pod.spec.as_mut().unwrap().node_selector = Some([(HOSTNAME_LABEL.to_string(), hostname.to_string())].into());
        pod
    }

    fn gated(mut pod: Pod) -> Pod {
        pod.spec.as_mut().unwrap().scheduling_gates =
            Some(vec![PodSchedulingGate { name: muster_api::ADMISSION_GATE.into() }]);
        pod
    }

    fn phase(mut pod: Pod, phase: &str) -> Pod {
        pod.status = Some(PodStatus { phase: Some(phase.into()), ..Default::default() });
        pod
    }

    #[test]
    fn nodes_convert_with_labels_taints_and_gpus() {
        let n =
            NodeInfo::from_node(&k8s_node("n1", "host-1", &[("cpu", "128"), ("nvidia.com/gpu", "8"), ("pods", "110")]))
                .unwrap();
        assert_eq!(n.hostname(), Some("host-1"));
        assert!(n.unschedulable);
        assert_eq!(n.taints, vec![Taint::new("dedicated", "infra", TaintEffect::NoExecute)]);
        assert_eq!((n.allocatable.cpu_milli, n.allocatable.pods, n.gpu_count), (128_000, 110, 8));
        assert_eq!(n.gpus(), GpuSet::first(8));
    }

    #[test]
    fn usage_counts_bound_and_admitted_pods_only() {
        let nodes = [k8s_node("n1", "host-1", &[("cpu", "8")]), k8s_node("n2", "host-2", &[("cpu", "8")])];
        let pods = [
            bound(k8s_pod("bound", "1"), "n1"),
            pinned(k8s_pod("admitted", "2"), "host-2"),
            gated(pinned(k8s_pod("still-gated", "4"), "host-2")),
            phase(bound(k8s_pod("done", "4"), "n1"), "Succeeded"),
            k8s_pod("unpinned", "4"),
        ];
        let s = Snapshot::from_cluster(&nodes, &pods);
        assert_eq!(s.node("n1").unwrap().requested.cpu_milli, 1000);
        assert_eq!(s.node("n2").unwrap().requested.cpu_milli, 2000, "admitted pods count by hostname label");
        assert_eq!(s.node("n1").unwrap().requested.pods, 1);
        assert!(s.problems().is_empty());
    }

    #[test]
    fn a_waiting_pod_nominated_to_a_node_uses_nothing_there_but_is_listed() {
        let nodes = [k8s_node("n1", "host-1", &[("cpu", "8")]), k8s_node("n2", "host-2", &[("cpu", "8")])];
        let nominate = |mut pod: Pod, node: &str, priority: i32| {
            pod.status = Some(PodStatus { nominated_node_name: Some(node.into()), ..Default::default() });
            pod.spec.as_mut().unwrap().priority = Some(priority);
            pod
        };
        let mut leaving = nominate(gated(k8s_pod("leaving", "1")), "n2", 9);
        let mut done = nominate(k8s_pod("done", "1"), "n1", 9);
        done.status.as_mut().unwrap().phase = Some("Failed".into());
        leaving.metadata.deletion_timestamp = Some(Time(Default::default()));
        let mut unmanaged = nominate(k8s_pod("plain", "1"), "n2", 3);
        unmanaged.metadata.labels = None;
        let pods = [
            nominate(gated(k8s_pod("preemptor", "4")), "n1", 7),
            // Bound or admitted: its usage counts, a stale nomination does not.
            nominate(bound(k8s_pod("bound", "1"), "n1"), "n2", 7),
            nominate(pinned(k8s_pod("admitted", "2"), "host-2"), "n1", 7),
            // kube-scheduler's own nomination of a pod muster does not manage.
            unmanaged,
            leaving,
            done,
            nominate(gated(k8s_pod("empty", "1")), "", 9),
        ];
        let s = Snapshot::from_cluster(&nodes, &pods);
        assert_eq!(s.node("n1").unwrap().requested.cpu_milli, 1000);
        assert_eq!(s.node("n2").unwrap().requested.cpu_milli, 2000);
        let listed: Vec<_> = s.nominations().collect();
        assert_eq!(listed, vec![("ns/preemptor", "n1", 7), ("ns/plain", "n2", 3)]);
        assert_eq!(s.nominated_nodes(4, |_| false), BTreeSet::from(["n1".to_string()]));
        assert_eq!(s.nominated_nodes(3, |k| k == "ns/preemptor"), BTreeSet::from(["n2".to_string()]));
    }

    #[test]
    fn a_terminating_admitted_pod_uses_nothing_but_a_terminating_bound_pod_does() {
        let nodes = [k8s_node("n1", "n1", &[("cpu", "8")])];
        let mut leaving = pinned(k8s_pod("leaving", "2"), "n1");
        leaving.metadata.deletion_timestamp = Some(Time(Default::default()));
        let mut draining = bound(k8s_pod("draining", "3"), "n1");
        draining.metadata.deletion_timestamp = Some(Time(Default::default()));
        let s = Snapshot::from_cluster(&nodes, &[leaving, draining]);
        assert_eq!(s.node("n1").unwrap().requested.cpu_milli, 3000);
    }

    #[test]
    fn unreadable_usage_takes_the_node_out() {
        let nodes = [k8s_node("n1", "n1", &[("cpu", "8")])];
        let s = Snapshot::from_cluster(&nodes, &[bound(k8s_pod("odd", "a lot"), "n1")]);
        assert_eq!(s.node("n1").unwrap().unusable, Some(Unusable::UnreadableUsage));
        assert!(matches!(s.problems(), [SnapshotError::PodRequests { .. }]));
    }

    #[test]
    fn pins_need_a_unique_hostname_label() {
        let mut no_label = NodeInfo::new("c", Resources::new());
        no_label.labels = Labels::default();
        let s = Snapshot::new(vec![
            NodeInfo::new("b", Resources::new()).with_label(HOSTNAME_LABEL, "same"),
            NodeInfo::new("a", Resources::new()).with_label(HOSTNAME_LABEL, "same"),
            no_label,
            NodeInfo::new("d", Resources::new()),
        ]);
        let names: Vec<_> = s.nodes().iter().map(|n| (n.name.as_str(), n.unusable)).collect();
        assert_eq!(
            names,
            vec![
                ("a", Some(Unusable::SharedHostname)),
                ("b", Some(Unusable::SharedHostname)),
                ("c", Some(Unusable::NoHostname)),
                ("d", None),
            ]
        );
    }

    #[test]
    fn problems_name_what_was_left_out() {
        let mut bad = k8s_node("bad", "bad", &[("memory", "much")]);
        bad.metadata.labels = None;
        let nameless = Node::default();
        let s = Snapshot::from_cluster(&[bad, nameless], &[pinned(k8s_pod("p", "1"), "gone")]);
        assert!(s.nodes().is_empty());
        let text: Vec<String> = s.problems().iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            vec![
                "node \"bad\": allocatable resource memory: quantity \"much\" is not a number with an optional suffix",
                "a node has no name",
                "admitted pod \"ns/p\" is pinned to hostname \"gone\", which no node has",
            ]
        );
    }

    #[test]
    fn gpu_state_is_set_by_the_shell() {
        let mut s = Snapshot::new(vec![NodeInfo::new("n1", Resources::new().with(GPU_RESOURCE, 8))]);
        assert!(s.set_gpu_used("n1", GpuSet::from_bits(0b101)));
        assert!(!s.set_gpu_used("n9", GpuSet::first(1)));
        assert_eq!(s.node("n1").unwrap().gpu_used, GpuSet::from_bits(0b101));
        assert_eq!(s.node_by_hostname("n1").map(|n| n.name.as_str()), Some("n1"));
    }
}
