//! A pod's scheduling shape (requests, nodeSelector, required node affinity, tolerations, GPU
//! count) and the per-node rules on it: selector and affinity matching, taints and
//! tolerations. Identical pods of a group share one shape. No capacity or scoring here.

use k8s_openapi::api::core::v1::{
    NodeSelector as K8sNodeSelector, NodeSelectorRequirement, Pod, Taint as K8sTaint, Toleration as K8sToleration,
};

use super::interpod::PodRules;
use super::resources::{ResourceError, Resources, pod_requests};
use super::snapshot::{Labels, NodeInfo};

/// Taint kube-scheduler treats an unschedulable node as having (NodeUnschedulable plugin).
pub const UNSCHEDULABLE_TAINT_KEY: &str = "node.kubernetes.io/unschedulable";

/// Why a pod's spec cannot be turned into a shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// The pod has no spec.
    #[error("pod has no spec")]
    NoSpec,
    /// A request could not be read.
    #[error(transparent)]
    Resource(#[from] ResourceError),
    /// A node selector requirement has an operator kube does not know.
    #[error("node affinity operator {0:?} is not one of In, NotIn, Exists, DoesNotExist, Gt, Lt")]
    Operator(String),
    /// A label selector (pod affinity, topology spread) has an operator kube does not know.
    #[error("label selector operator {0:?} is not one of In, NotIn, Exists, DoesNotExist")]
    SelectorOperator(String),
}

/// What kube-scheduler looks at to decide whether a pod fits a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodShape {
    /// Effective requests, including one pod.
    pub requests: Resources,
    /// `spec.nodeSelector`, sorted by key.
    pub node_selector: Vec<(String, String)>,
    /// Required node affinity terms (ORed); `None` when the pod has none.
    pub required_affinity: Option<Vec<NodeSelectorTerm>>,
    /// `spec.tolerations`.
    pub tolerations: Vec<Toleration>,
    /// Whole GPUs requested (`nvidia.com/gpu`).
    pub gpus: u32,
    /// Rules relating the pod to other pods: inter-pod affinity, topology spread, host ports.
    pub rules: PodRules,
    /// PersistentVolumeClaims the pod mounts (VolumeBinding, VolumeZone), sorted.
    pub claims: Vec<String>,
    /// Pod-level DRA `resourceClaims` entries (DynamicResources), in order.
    pub resource_claims: Vec<super::dra::PodClaim>,
}

/// One node selector term: every expression and every field requirement must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodeSelectorTerm {
    /// Requirements on node labels.
    pub match_expressions: Vec<Requirement>,
    /// Requirements on node fields (only `metadata.name` exists).
    pub match_fields: Vec<Requirement>,
}

/// `key <operator> values`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Requirement {
    /// Label key, or field path for `match_fields`.
    pub key: String,
    /// The operator.
    pub operator: Operator,
    /// Values; one integer for `Gt`/`Lt`, none for `Exists`/`DoesNotExist`.
    pub values: Vec<String>,
}

/// Node selector operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operator {
    /// The label is present with one of the values.
    In,
    /// The label is absent or has none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
    /// The label is an integer greater than the value.
    Gt,
    /// The label is an integer less than the value.
    Lt,
}

/// Taint effects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaintEffect {
    /// New pods must tolerate it.
    NoSchedule,
    /// A soft preference; filters ignore it.
    PreferNoSchedule,
    /// New pods must tolerate it, and running ones are evicted.
    NoExecute,
}

/// A node taint.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Taint {
    /// Key.
    pub key: String,
    /// Value (may be empty).
    pub value: String,
    /// Effect.
    pub effect: TaintEffect,
}

/// A pod toleration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Toleration {
    /// Key; empty with `exists` tolerates every key.
    pub key: String,
    /// `Exists` (any value) rather than `Equal`.
    pub exists: bool,
    /// Value compared by `Equal`.
    pub value: String,
    /// Effect tolerated; `None` tolerates all effects.
    pub effect: Option<TaintEffect>,
}

impl Operator {
    fn parse(s: &str) -> Result<Self, ShapeError> {
        Ok(match s {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" => Operator::Gt,
            "Lt" => Operator::Lt,
            other => return Err(ShapeError::Operator(other.to_string())),
        })
    }
}

impl TaintEffect {
    /// Reads an effect; an unknown one is treated as `NoSchedule`, so it is never ignored.
    pub fn parse(s: &str) -> Self {
        match s {
            "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
            "NoExecute" => TaintEffect::NoExecute,
            _ => TaintEffect::NoSchedule,
        }
    }
}

impl Taint {
    /// A taint from its parts.
    pub fn new(key: &str, value: &str, effect: TaintEffect) -> Self {
        Self { key: key.into(), value: value.into(), effect }
    }

    /// Converts a Kubernetes taint.
    pub fn from_k8s(t: &K8sTaint) -> Self {
        Self { key: t.key.clone(), value: t.value.clone().unwrap_or_default(), effect: TaintEffect::parse(&t.effect) }
    }
}

impl Toleration {
    /// Converts a Kubernetes toleration (an empty effect tolerates every effect).
    pub fn from_k8s(t: &K8sToleration) -> Self {
        Self {
            key: t.key.clone().unwrap_or_default(),
            exists: t.operator.as_deref() == Some("Exists"),
            value: t.value.clone().unwrap_or_default(),
            effect: t.effect.as_deref().filter(|e| !e.is_empty()).map(TaintEffect::parse),
        }
    }

    /// Whether this toleration tolerates `taint` (kube's `ToleratesTaint`).
    pub fn tolerates(&self, key: &str, value: &str, effect: TaintEffect) -> bool {
        if self.effect.is_some_and(|e| e != effect) {
            return false;
        }
        if !self.key.is_empty() && self.key != key {
            return false;
        }
        if self.exists {
            return true;
        }
        // Validation forbids an empty key with Equal; kube then compares values only, as here.
        self.value == value
    }
}

impl Requirement {
    /// A requirement from its parts.
    pub fn new(key: &str, operator: Operator, values: &[&str]) -> Self {
        Self { key: key.into(), operator, values: values.iter().map(|v| v.to_string()).collect() }
    }

    fn from_k8s(r: &NodeSelectorRequirement) -> Result<Self, ShapeError> {
        Ok(Self {
            key: r.key.clone(),
            operator: Operator::parse(&r.operator)?,
            values: r.values.clone().unwrap_or_default(),
        })
    }

    /// Whether a label (or field) value, present or not, satisfies the requirement.
    pub fn matches(&self, value: Option<&str>) -> bool {
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.iter().any(|x| x == v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.iter().any(|x| x == v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::Gt | Operator::Lt => {
                let (Some(v), [bound]) = (value, self.values.as_slice()) else { return false };
                let (Ok(v), Ok(bound)) = (v.parse::<i64>(), bound.parse::<i64>()) else { return false };
                if self.operator == Operator::Gt { v > bound } else { v < bound }
            }
        }
    }
}

impl NodeSelectorTerm {
    /// Whether a node satisfies the term; a term with no requirements matches nothing, as in kube.
    pub fn matches(&self, name: &str, labels: &Labels) -> bool {
        if self.match_expressions.is_empty() && self.match_fields.is_empty() {
            return false;
        }
        self.match_expressions.iter().all(|r| r.matches(labels.get(&r.key)))
            && self.match_fields.iter().all(|r| r.matches((r.key == "metadata.name").then_some(name)))
    }
}

impl PodShape {
    /// A shape with these requests (which should include `pods: 1`) and no other constraints.
    pub fn new(requests: Resources) -> Self {
        let gpus = u32::try_from(requests.gpus.max(0)).unwrap_or(u32::MAX);
        Self { requests, gpus, ..Default::default() }
    }

    /// The shape of a pod, from its spec.
    pub fn from_pod(pod: &Pod) -> Result<Self, ShapeError> {
        let spec = pod.spec.as_ref().ok_or(ShapeError::NoSpec)?;
        let mut shape = PodShape::new(pod_requests(spec)?);
        shape.node_selector = spec.node_selector.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
        shape.tolerations = spec.tolerations.iter().flatten().map(Toleration::from_k8s).collect();
        let required = spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
        if let Some(selector) = required {
            shape.required_affinity = Some(terms_from_k8s(selector)?);
        }
        let labels: Labels = pod.metadata.labels.iter().flatten().collect();
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        shape.rules = PodRules::from_spec(spec, namespace, &labels)?;
        shape.claims = spec
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.persistent_volume_claim.as_ref().map(|c| c.claim_name.clone()))
            .collect();
        shape.claims.sort();
        shape.claims.dedup();
        shape.resource_claims = super::dra::pod_claims(spec);
        Ok(shape)
    }

    /// True when identical pods of this shape are interchangeable: nothing in it depends on
    /// other pods (no inter-pod rule, no claim another pod may share), so nodes can be filled
    /// by capacity arithmetic.
    pub fn is_independent(&self) -> bool {
        self.rules.is_empty() && self.claims.is_empty()
    }

    /// NodeAffinity filter: `nodeSelector` and required node affinity both hold.
    pub fn matches_node(&self, node: &NodeInfo) -> bool {
        self.node_selector.iter().all(|(k, v)| node.labels.get(k) == Some(v.as_str()))
            && self
                .required_affinity
                .as_ref()
                .is_none_or(|terms| terms.iter().any(|t| t.matches(&node.name, &node.labels)))
    }

    /// TaintToleration filter: the first `NoSchedule`/`NoExecute` taint no toleration covers.
    pub fn untolerated_taint<'n>(&self, node: &'n NodeInfo) -> Option<&'n Taint> {
        node.taints.iter().find(|t| {
            t.effect != TaintEffect::PreferNoSchedule
                && !self.tolerations.iter().any(|tol| tol.tolerates(&t.key, &t.value, t.effect))
        })
    }

    /// NodeUnschedulable filter: an unschedulable node admits only pods tolerating its taint.
    pub fn tolerates_unschedulable(&self) -> bool {
        self.tolerations.iter().any(|t| t.tolerates(UNSCHEDULABLE_TAINT_KEY, "", TaintEffect::NoSchedule))
    }

    /// A size key for ordering shapes largest first: GPUs, then cpu, then memory.
    pub(crate) fn size_key(&self) -> (u32, i64, i64) {
        (self.gpus, self.requests.cpu_milli, self.requests.memory)
    }
}

pub(crate) fn terms_from_k8s(selector: &K8sNodeSelector) -> Result<Vec<NodeSelectorTerm>, ShapeError> {
    selector
        .node_selector_terms
        .iter()
        .map(|t| {
            Ok(NodeSelectorTerm {
                match_expressions: t
                    .match_expressions
                    .iter()
                    .flatten()
                    .map(Requirement::from_k8s)
                    .collect::<Result<_, _>>()?,
                match_fields: t.match_fields.iter().flatten().map(Requirement::from_k8s).collect::<Result<_, _>>()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Affinity, NodeAffinity, NodeSelectorTerm as K8sTerm, PodSpec};

    fn node(name: &str, labels: &[(&str, &str)]) -> NodeInfo {
        let mut n = NodeInfo::new(name, Resources::new());
        for (k, v) in labels {
            n = n.with_label(k, v);
        }
        n
    }

    fn term(exprs: Vec<Requirement>) -> NodeSelectorTerm {
        NodeSelectorTerm { match_expressions: exprs, match_fields: vec![] }
    }

    fn affinity(terms: Vec<NodeSelectorTerm>) -> PodShape {
        PodShape { required_affinity: Some(terms), ..Default::default() }
    }

    #[test]
    fn affinity_operators() {
        use Operator::*;
        let n = node("n1", &[("zone", "a"), ("gen", "5"), ("tier", "x")]);
        let cases: &[(&str, Requirement, bool)] = &[
            ("in_matches_listed_value", Requirement::new("zone", In, &["a", "b"]), true),
            ("in_rejects_other_value", Requirement::new("zone", In, &["b"]), false),
            ("in_rejects_missing_label", Requirement::new("rack", In, &["a"]), false),
            ("not_in_rejects_listed_value", Requirement::new("zone", NotIn, &["a"]), false),
            ("not_in_accepts_missing_label", Requirement::new("rack", NotIn, &["a"]), true),
            ("exists_needs_the_label", Requirement::new("tier", Exists, &[]), true),
            ("exists_rejects_missing_label", Requirement::new("rack", Exists, &[]), false),
            ("does_not_exist_accepts_missing", Requirement::new("rack", DoesNotExist, &[]), true),
            ("does_not_exist_rejects_present", Requirement::new("zone", DoesNotExist, &[]), false),
            ("gt_compares_integers", Requirement::new("gen", Gt, &["4"]), true),
            ("gt_is_strict", Requirement::new("gen", Gt, &["5"]), false),
            ("lt_compares_integers", Requirement::new("gen", Lt, &["10"]), true),
            ("lt_rejects_non_integer_label", Requirement::new("zone", Lt, &["10"]), false),
            ("gt_rejects_missing_label", Requirement::new("rack", Gt, &["0"]), false),
            ("gt_needs_exactly_one_value", Requirement::new("gen", Gt, &["1", "2"]), false),
        ];
        for (rule, req, want) in cases {
            assert_eq!(affinity(vec![term(vec![req.clone()])]).matches_node(&n), *want, "{rule}");
        }
    }

    #[test]
    fn affinity_terms_are_ored_and_expressions_anded() {
        use Operator::*;
        let n = node("n1", &[("zone", "a"), ("gpu", "h100")]);
        let both = term(vec![Requirement::new("zone", In, &["a"]), Requirement::new("gpu", In, &["a100"])]);
        assert!(!affinity(vec![both.clone()]).matches_node(&n), "expressions of a term are ANDed");
        let other = term(vec![Requirement::new("gpu", In, &["h100"])]);
        assert!(affinity(vec![both, other]).matches_node(&n), "terms are ORed");
        assert!(!affinity(vec![]).matches_node(&n), "no terms match nothing");
        assert!(!affinity(vec![NodeSelectorTerm::default()]).matches_node(&n), "an empty term matches nothing");
    }

    #[test]
    fn affinity_match_fields_select_by_node_name() {
        let by_name = |op, v: &[&str]| {
            affinity(vec![NodeSelectorTerm {
                match_expressions: vec![],
                match_fields: vec![Requirement::new("metadata.name", op, v)],
            }])
        };
        let n = node("gpu-7", &[]);
        assert!(by_name(Operator::In, &["gpu-7"]).matches_node(&n));
        assert!(!by_name(Operator::In, &["gpu-8"]).matches_node(&n));
        assert!(by_name(Operator::NotIn, &["gpu-8"]).matches_node(&n));
    }

    #[test]
    fn node_selector_needs_every_label() {
        let n = node("n1", &[("zone", "a"), ("pool", "gpu")]);
        let shape = |pairs: &[(&str, &str)]| PodShape {
            node_selector: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        };
        assert!(shape(&[("zone", "a"), ("pool", "gpu")]).matches_node(&n));
        assert!(!shape(&[("zone", "a"), ("pool", "cpu")]).matches_node(&n));
        assert!(!shape(&[("rack", "1")]).matches_node(&n));
    }

    #[test]
    fn taints_and_tolerations() {
        use TaintEffect::*;
        let tol = |key: &str, exists: bool, value: &str, effect: Option<TaintEffect>| Toleration {
            key: key.into(),
            exists,
            value: value.into(),
            effect,
        };
        let cases: &[(&str, Taint, Vec<Toleration>, bool)] = &[
            ("no_schedule_blocks_without_toleration", Taint::new("dedicated", "infra", NoSchedule), vec![], false),
            ("no_execute_blocks_without_toleration", Taint::new("dedicated", "infra", NoExecute), vec![], false),
            ("prefer_no_schedule_is_ignored", Taint::new("dedicated", "infra", PreferNoSchedule), vec![], true),
            (
                "equal_toleration_matches_key_and_value",
                Taint::new("dedicated", "infra", NoSchedule),
                vec![tol("dedicated", false, "infra", Some(NoSchedule))],
                true,
            ),
            (
                "equal_toleration_rejects_other_value",
                Taint::new("dedicated", "infra", NoSchedule),
                vec![tol("dedicated", false, "ml", None)],
                false,
            ),
            (
                "exists_toleration_ignores_value",
                Taint::new("dedicated", "infra", NoExecute),
                vec![tol("dedicated", true, "", None)],
                true,
            ),
            (
                "empty_key_exists_tolerates_everything",
                Taint::new("anything", "x", NoExecute),
                vec![tol("", true, "", None)],
                true,
            ),
            (
                "effect_must_match_when_set",
                Taint::new("dedicated", "infra", NoExecute),
                vec![tol("dedicated", true, "", Some(NoSchedule))],
                false,
            ),
        ];
        for (rule, taint, tolerations, want) in cases {
            let mut n = node("n1", &[]);
            n.taints = vec![taint.clone()];
            let shape = PodShape { tolerations: tolerations.clone(), ..Default::default() };
            assert_eq!(shape.untolerated_taint(&n).is_none(), *want, "{rule}");
        }
    }

    #[test]
    fn unschedulable_is_tolerated_like_kube_scheduler() {
        let plain = PodShape::default();
        assert!(!plain.tolerates_unschedulable());
        let tolerant = PodShape {
            tolerations: vec![Toleration { key: UNSCHEDULABLE_TAINT_KEY.into(), exists: true, ..Default::default() }],
            ..Default::default()
        };
        assert!(tolerant.tolerates_unschedulable());
        let wildcard =
            PodShape { tolerations: vec![Toleration { exists: true, ..Default::default() }], ..Default::default() };
        assert!(wildcard.tolerates_unschedulable());
    }

    #[test]
    fn shapes_from_pods_carry_selector_affinity_tolerations_and_gpus() {
        let pod = Pod {
            spec: Some(PodSpec {
                containers: vec![k8s_openapi::api::core::v1::Container {
                    name: "c".into(),
                    resources: Some(k8s_openapi::api::core::v1::ResourceRequirements {
                        requests: Some(
                            [(
                                "nvidia.com/gpu".to_string(),
                                k8s_openapi::apimachinery::pkg::api::resource::Quantity("4".into()),
                            )]
                            .into(),
                        ),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                node_selector: Some([("pool".to_string(), "gpu".to_string())].into()),
                tolerations: Some(vec![K8sToleration {
                    key: Some("dedicated".into()),
                    operator: Some("Exists".into()),
                    effect: Some(String::new()),
                    ..Default::default()
                }]),
                affinity: Some(Affinity {
                    node_affinity: Some(NodeAffinity {
                        required_during_scheduling_ignored_during_execution: Some(K8sNodeSelector {
                            node_selector_terms: vec![K8sTerm {
                                match_expressions: Some(vec![NodeSelectorRequirement {
                                    key: "zone".into(),
                                    operator: "In".into(),
                                    values: Some(vec!["a".into()]),
                                }]),
                                match_fields: None,
                            }],
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let shape = PodShape::from_pod(&pod).unwrap();
        assert_eq!(shape.gpus, 4);
        assert_eq!(shape.requests.pods, 1);
        assert_eq!(shape.node_selector, vec![("pool".to_string(), "gpu".to_string())]);
        assert_eq!(shape.tolerations[0].effect, None, "an empty effect tolerates all effects");
        assert_eq!(shape.required_affinity.as_ref().map(Vec::len), Some(1));

        let mut bad = pod.clone();
        if let Some(terms) = bad
            .spec
            .as_mut()
            .and_then(|s| s.affinity.as_mut())
            .and_then(|a| a.node_affinity.as_mut())
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_mut())
        {
            terms.node_selector_terms[0].match_expressions.as_mut().unwrap()[0].operator = "Near".into();
        }
        assert_eq!(PodShape::from_pod(&bad), Err(ShapeError::Operator("Near".into())));
        assert_eq!(PodShape::from_pod(&Pod::default()), Err(ShapeError::NoSpec));
    }
}
