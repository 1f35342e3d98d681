//! PURE: the one classification of a pod that every part of muster reads (admission, the
//! scheduler snapshot and group trees, the GPU ledger, the job controllers, status): where its
//! lifecycle is (`status.phase`), where admission stands with it (gated, pinned, bound), and
//! whether it is being deleted.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::Timestamp;
use kube_core::Resource as _;

use muster_api::{ADMISSION_GATE, GPU_INDICES_ANNOTATION, GPU_RESOURCE, HOSTNAME_LABEL};

/// A pod's lifecycle, from `status.phase`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    /// Not yet running (gated, unbound, starting); also a pod with no phase yet.
    Pending,
    /// Running.
    Running,
    /// Every container ended successfully: it uses nothing any more.
    Succeeded,
    /// Every container ended, one failed: it uses nothing any more.
    Failed,
    /// Any other phase (`Unknown`: its node cannot be reached). It may still be running, so it
    /// keeps what it holds (GPUs) rather than risk handing them out twice.
    Unknown,
}

impl Lifecycle {
    /// The lifecycle from `status.phase`; absent is `Pending`, anything unrecognised `Unknown`.
    pub fn from_status(phase: Option<&str>) -> Self {
        match phase {
            None | Some("Pending") => Lifecycle::Pending,
            Some("Running") => Lifecycle::Running,
            Some("Succeeded") => Lifecycle::Succeeded,
            Some("Failed") => Lifecycle::Failed,
            Some(_) => Lifecycle::Unknown,
        }
    }

    /// The lifecycle of a pod.
    pub fn of(pod: &Pod) -> Self {
        Self::from_status(pod.status.as_ref().and_then(|s| s.phase.as_deref()))
    }

    /// Succeeded or failed: the pod holds nothing and never runs again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Lifecycle::Succeeded | Lifecycle::Failed)
    }
}

/// Where admission stands with a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Held by muster's admission gate.
    Gated,
    /// Admitted by muster (gate removed, pinned to this `kubernetes.io/hostname`), not bound yet.
    Admitted(String),
    /// Bound to this node (`spec.nodeName`).
    Bound(String),
    /// Neither gated, pinned nor bound: kube-scheduler's to place, not muster's.
    Unpinned,
}

impl Placement {
    /// Where a pod stands: bound first, then gated, then pinned.
    pub fn of(pod: &Pod) -> Self {
        let Some(spec) = pod.spec.as_ref() else { return Placement::Unpinned };
        if let Some(node) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
            return Placement::Bound(node.clone());
        }
        if spec.scheduling_gates.iter().flatten().any(|g| g.name == ADMISSION_GATE) {
            return Placement::Gated;
        }
        match spec.node_selector.as_ref().and_then(|s| s.get(HOSTNAME_LABEL)) {
            Some(hostname) => Placement::Admitted(hostname.clone()),
            None => Placement::Unpinned,
        }
    }
}

/// PURE: the required node affinity that pins `pod` to the node named `node`: each of its
/// required node-selector terms with `metadata.name In [node]` added (terms are ORed, a term's
/// requirements ANDed), or that one requirement alone where it has none. Added beside the
/// `kubernetes.io/hostname` node selector of a pin, it changes nothing about where the pod may
/// bind; it lets kube-scheduler's NodeAffinity PreFilter narrow the pod's filtering to that one
/// node (a hostname selector alone has every node filtered: 5,000 per pod at 5,000 nodes).
/// The API server accepts it on a gated pod: a required node affinity may be set while it is
/// empty, and only added to (requirements appended to each term) otherwise.
pub fn node_name_pin(pod: &Pod, node: &str) -> Vec<NodeSelectorTerm> {
    let requirement = NodeSelectorRequirement {
        key: "metadata.name".into(),
        operator: "In".into(),
        values: Some(vec![node.to_string()]),
    };
    let mut terms = required_node_terms(pod).to_vec();
    if terms.is_empty() {
        return vec![NodeSelectorTerm { match_fields: Some(vec![requirement]), ..Default::default() }];
    }
    for term in &mut terms {
        let fields = term.match_fields.get_or_insert_with(Vec::new);
        if !fields.contains(&requirement) {
            fields.push(requirement.clone());
        }
    }
    terms
}

/// The pod's required node-selector terms (`spec.affinity.nodeAffinity.
/// requiredDuringSchedulingIgnoredDuringExecution`); empty where it has none.
pub fn required_node_terms(pod: &Pod) -> &[NodeSelectorTerm] {
    pod.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .map_or(&[], |r| r.node_selector_terms.as_slice())
}

/// A pod, classified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodClass {
    /// Its lifecycle.
    pub lifecycle: Lifecycle,
    /// Where admission stands with it.
    pub placement: Placement,
    /// It has a deletionTimestamp (in its grace period, it may still run and hold GPUs).
    pub terminating: bool,
}

impl PodClass {
    /// Classifies a pod.
    pub fn of(pod: &Pod) -> Self {
        Self {
            lifecycle: Lifecycle::of(pod),
            placement: Placement::of(pod),
            terminating: pod.metadata.deletion_timestamp.is_some(),
        }
    }

    /// Succeeded or failed.
    pub fn finished(&self) -> bool {
        self.lifecycle.is_terminal()
    }

    /// Held by muster's admission gate.
    pub fn gated(&self) -> bool {
        self.placement == Placement::Gated
    }

    /// The node it is bound to.
    pub fn bound_node(&self) -> Option<&str> {
        match &self.placement {
            Placement::Bound(node) => Some(node),
            _ => None,
        }
    }

    /// Not finished and not being deleted: it counts toward its group.
    pub fn live(&self) -> bool {
        !self.finished() && !self.terminating
    }
}

/// Held by muster's admission gate.
pub fn is_gated(pod: &Pod) -> bool {
    Placement::of(pod) == Placement::Gated
}

/// Bound to a node.
pub fn is_bound(pod: &Pod) -> bool {
    matches!(Placement::of(pod), Placement::Bound(_))
}

/// Succeeded or failed.
pub fn is_finished(pod: &Pod) -> bool {
    Lifecycle::of(pod).is_terminal()
}

/// Being deleted.
pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// GPUs a pod asks for (`nvidia.com/gpu`): the largest of its containers' sum and its init
/// containers' peak, each container's the larger of its request and limit, as kubelet counts.
pub fn gpus_wanted(pod: &Pod) -> u64 {
    let Some(spec) = pod.spec.as_ref() else { return 0 };
    let of = |c: &k8s_openapi::api::core::v1::Container| {
        let r = c.resources.as_ref();
        let get = |m: Option<&BTreeMap<String, Quantity>>| {
            m.and_then(|m| m.get(GPU_RESOURCE)).and_then(|q| q.0.trim().parse::<u64>().ok()).unwrap_or(0)
        };
        get(r.and_then(|r| r.limits.as_ref())).max(get(r.and_then(|r| r.requests.as_ref())))
    };
    let containers: u64 = spec.containers.iter().map(of).sum();
    let init = spec.init_containers.iter().flatten().map(of).max().unwrap_or(0);
    containers.max(init)
}

/// What the GPU pass (`controllers::devices::plan`) reads of a pod: a [`Pod`] as the API
/// server has it, or the [`GpuPod`] admission keeps of one from its watch events.
pub trait DevicePod: std::fmt::Debug + Sync {
    /// `metadata.uid`.
    fn uid(&self) -> &str;
    /// `metadata.name`.
    fn name(&self) -> &str;
    /// `metadata.namespace`.
    fn namespace(&self) -> &str;
    /// `metadata.creationTimestamp`.
    fn created(&self) -> Option<Timestamp>;
    /// Its lifecycle, placement and deletion.
    fn class(&self) -> Cow<'_, PodClass>;
    /// GPUs it asks for ([`gpus_wanted`]).
    fn gpus_wanted(&self) -> u64;
    /// Its `gpu.muster.dev/indices` annotation.
    fn gpu_indices(&self) -> Option<&str>;
    /// Its own claims (made from templates) and the claim each got
    /// ([`crate::scheduler::own_claims`]).
    fn own_claims(&self) -> Cow<'_, [(String, Option<String>)]>;
    /// A reference to it, for events.
    fn reference(&self) -> ObjectReference;
}

impl DevicePod for Pod {
    fn uid(&self) -> &str {
        self.metadata.uid.as_deref().unwrap_or_default()
    }
    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
    fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }
    fn created(&self) -> Option<Timestamp> {
        self.metadata.creation_timestamp.as_ref().map(|t| t.0)
    }
    fn class(&self) -> Cow<'_, PodClass> {
        Cow::Owned(PodClass::of(self))
    }
    fn gpus_wanted(&self) -> u64 {
        gpus_wanted(self)
    }
    fn gpu_indices(&self) -> Option<&str> {
        self.metadata.annotations.as_ref()?.get(GPU_INDICES_ANNOTATION).map(String::as_str)
    }
    fn own_claims(&self) -> Cow<'_, [(String, Option<String>)]> {
        Cow::Owned(crate::scheduler::own_claims(self))
    }
    fn reference(&self) -> ObjectReference {
        self.object_ref(&())
    }
}

impl<T: DevicePod + Send + ?Sized> DevicePod for std::sync::Arc<T> {
    fn uid(&self) -> &str {
        (**self).uid()
    }
    fn name(&self) -> &str {
        (**self).name()
    }
    fn namespace(&self) -> &str {
        (**self).namespace()
    }
    fn created(&self) -> Option<Timestamp> {
        (**self).created()
    }
    fn class(&self) -> Cow<'_, PodClass> {
        (**self).class()
    }
    fn gpus_wanted(&self) -> u64 {
        (**self).gpus_wanted()
    }
    fn gpu_indices(&self) -> Option<&str> {
        (**self).gpu_indices()
    }
    fn own_claims(&self) -> Cow<'_, [(String, Option<String>)]> {
        (**self).own_claims()
    }
    fn reference(&self) -> ObjectReference {
        (**self).reference()
    }
}

/// PURE: what the GPU pass reads of a pod, kept by admission from the pod's watch events
/// instead of the pod: a few hundred bytes where a cached `Pod` takes about 5 KiB (its spec
/// and one container alone are 3.8 KiB of struct), for each placed pod of the cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuPod {
    uid: String,
    name: String,
    namespace: String,
    created: Option<Timestamp>,
    class: PodClass,
    gpus_wanted: u64,
    gpu_indices: Option<String>,
    own_claims: Vec<(String, Option<String>)>,
}

impl GpuPod {
    /// What the GPU pass reads of `pod`; `None` for a pod on no node: finished, gated or not
    /// placed yet (the pass locates pods first and leaves those out). Every other pod is
    /// kept, GPUs asked for or not: what its node says it holds (kubelet's assignment read
    /// back) goes into the ledger whatever its spec says.
    pub fn of(pod: &Pod) -> Option<Self> {
        let class = PodClass::of(pod);
        let placed = matches!(class.placement, Placement::Bound(_) | Placement::Admitted(_));
        (placed && !class.finished()).then(|| GpuPod {
            uid: DevicePod::uid(pod).to_string(),
            name: DevicePod::name(pod).to_string(),
            namespace: DevicePod::namespace(pod).to_string(),
            created: DevicePod::created(pod),
            class,
            gpus_wanted: gpus_wanted(pod),
            gpu_indices: DevicePod::gpu_indices(pod).map(str::to_string),
            own_claims: crate::scheduler::own_claims(pod),
        })
    }
}

impl DevicePod for GpuPod {
    fn uid(&self) -> &str {
        &self.uid
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn namespace(&self) -> &str {
        &self.namespace
    }
    fn created(&self) -> Option<Timestamp> {
        self.created
    }
    fn class(&self) -> Cow<'_, PodClass> {
        Cow::Borrowed(&self.class)
    }
    fn gpus_wanted(&self) -> u64 {
        self.gpus_wanted
    }
    fn gpu_indices(&self) -> Option<&str> {
        self.gpu_indices.as_deref()
    }
    fn own_claims(&self) -> Cow<'_, [(String, Option<String>)]> {
        Cow::Borrowed(&self.own_claims)
    }
    fn reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            uid: Some(self.uid.clone()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod pin_tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).expect("pod")
    }

    #[test]
    fn the_node_name_pin_narrows_every_term_and_keeps_what_they_required() {
        let pin = json!({"key": "metadata.name", "operator": "In", "values": ["n1"]});
        let zone = json!({"key": "zone", "operator": "In", "values": ["a"]});
        let gpu = json!({"key": "gpu", "operator": "Exists"});
        let affinity = |terms: serde_json::Value| json!({"containers": [], "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}});
        for (name, spec, want) in [
            ("no affinity: one term", json!({"containers": []}), json!([{"matchFields": [pin]}])),
            (
                "preferred only: one term",
                json!({"containers": [], "affinity": {"nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [zone]}}]}}}),
                json!([{"matchFields": [pin]}]),
            ),
            ("no terms: one term", affinity(json!([])), json!([{"matchFields": [pin]}])),
            (
                "each term narrowed, its expressions kept",
                affinity(json!([{"matchExpressions": [zone]}, {"matchExpressions": [gpu], "matchFields": [
                    {"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}]}])),
                json!([{"matchExpressions": [zone], "matchFields": [pin]}, {"matchExpressions": [gpu], "matchFields": [
                    {"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}, pin]}]),
            ),
            (
                "pinned already: nothing added twice",
                affinity(json!([{"matchFields": [pin]}])),
                json!([{"matchFields": [pin]}]),
            ),
        ] {
            let got = serde_json::to_value(node_name_pin(&pod(spec), "n1")).expect("terms");
            assert_eq!(got, want, "{name}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value, status: serde_json::Value, deleting: bool) -> Pod {
        let mut meta = json!({"name": "p"});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(json!({"metadata": meta, "spec": spec, "status": status})).expect("pod")
    }

    #[test]
    fn the_gpu_pass_keeps_only_pods_it_has_to_do_with() {
        let gpu = |n: &str| json!({"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": n}}}], "nodeName": "n1"});
        let cases = [
            ("asks for GPUs", pod(gpu("2"), json!({"phase": "Running"}), false), Some(2)),
            ("asks for none", pod(gpu("0"), json!({}), false), Some(0)),
            ("finished", pod(gpu("2"), json!({"phase": "Succeeded"}), false), None),
            ("on no node", pod(json!({"containers": []}), json!({}), false), None),
            (
                "gated",
                pod(json!({"containers": [], "schedulingGates": [{"name": ADMISSION_GATE}]}), json!({}), false),
                None,
            ),
            (
                "pinned, a claim of its own",
                pod(
                    json!({"containers": [], "nodeSelector": {HOSTNAME_LABEL: "n1"},
                           "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}),
                    json!({"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu"}]}),
                    false,
                ),
                Some(0),
            ),
        ];
        for (case, p, want) in cases {
            let kept = GpuPod::of(&p);
            assert_eq!(kept.as_ref().map(|k| k.gpus_wanted), want, "{case}");
            if let Some(k) = kept {
                assert_eq!(k.class, PodClass::of(&p), "{case}");
                assert_eq!(DevicePod::own_claims(&k), DevicePod::own_claims(&p), "{case}");
            }
        }
        let mut annotated = pod(gpu("0"), json!({}), true);
        annotated.metadata.annotations = Some([(GPU_INDICES_ANNOTATION.to_string(), "3".to_string())].into());
        let kept = GpuPod::of(&annotated).expect("a pod with GPU indices is kept");
        assert_eq!((kept.gpu_indices(), kept.class().terminating), (Some("3"), true));
    }

    #[test]
    fn pods_are_classified_once_for_everyone() {
        let gate = json!([{"name": ADMISSION_GATE}]);
        let c = |extra: serde_json::Value| {
            let mut spec = json!({"containers": [{"name": "c"}]});
            if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
                s.extend(e.clone());
            }
            spec
        };
        let cases = [
            (
                "gated",
                pod(c(json!({"schedulingGates": gate})), json!({}), false),
                Lifecycle::Pending,
                Placement::Gated,
                false,
            ),
            (
                "another gate only",
                pod(c(json!({"schedulingGates": [{"name": "x"}]})), json!({}), false),
                Lifecycle::Pending,
                Placement::Unpinned,
                false,
            ),
            (
                "pinned",
                pod(c(json!({"nodeSelector": {HOSTNAME_LABEL: "h1"}})), json!({"phase": "Pending"}), false),
                Lifecycle::Pending,
                Placement::Admitted("h1".into()),
                false,
            ),
            (
                "bound beats pinned",
                pod(
                    c(json!({"nodeName": "n1", "nodeSelector": {HOSTNAME_LABEL: "h1"}})),
                    json!({"phase": "Running"}),
                    false,
                ),
                Lifecycle::Running,
                Placement::Bound("n1".into()),
                false,
            ),
            (
                "terminating, still running",
                pod(c(json!({"nodeName": "n1"})), json!({"phase": "Running"}), true),
                Lifecycle::Running,
                Placement::Bound("n1".into()),
                true,
            ),
            (
                "finished",
                pod(c(json!({"nodeName": "n1"})), json!({"phase": "Failed"}), false),
                Lifecycle::Failed,
                Placement::Bound("n1".into()),
                false,
            ),
            (
                "node lost",
                pod(c(json!({"nodeName": "n1"})), json!({"phase": "Unknown"}), false),
                Lifecycle::Unknown,
                Placement::Bound("n1".into()),
                false,
            ),
            (
                "no spec",
                serde_json::from_value(json!({"metadata": {"name": "p"}})).expect("pod"),
                Lifecycle::Pending,
                Placement::Unpinned,
                false,
            ),
        ];
        for (name, pod, lifecycle, placement, terminating) in cases {
            let class = PodClass::of(&pod);
            assert_eq!(class, PodClass { lifecycle, placement: placement.clone(), terminating }, "{name}");
            assert_eq!(is_gated(&pod), placement == Placement::Gated, "{name}");
            assert_eq!(is_bound(&pod), matches!(placement, Placement::Bound(_)), "{name}");
            assert_eq!(is_finished(&pod), lifecycle.is_terminal(), "{name}");
            assert_eq!(class.live(), !lifecycle.is_terminal() && !terminating, "{name}");
        }
        assert!(!Lifecycle::Unknown.is_terminal(), "a pod on a lost node keeps what it holds");
    }
}
