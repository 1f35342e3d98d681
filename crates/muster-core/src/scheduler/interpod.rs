//! PURE: the rules of a pod spec that relate a pod to other pods, as kube-scheduler's default
//! profile reads them: InterPodAffinity (required and preferred affinity and anti-affinity,
//! with namespaces and namespace selectors), PodTopologySpread (`DoNotSchedule` filters and
//! `ScheduleAnyway` scores, with minDomains and the node inclusion policies) and NodePorts
//! (host ports). Parsed once per pod shape; placement evaluates them against the pods already
//! on the nodes and the pods of the decision so far.
//!
//! Label selectors follow `metav1.LabelSelectorAsSelector`: a missing selector matches
//! nothing, an empty one everything.

use k8s_openapi::api::core::v1::{
    Container, PodAffinityTerm, PodSpec, TopologySpreadConstraint, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::shape::{Operator, Requirement, ShapeError};
use super::snapshot::Labels;

/// A label selector: every requirement must hold (none: matches everything).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Selector {
    /// `matchLabels` (as `In` with one value) and `matchExpressions`.
    pub requirements: Vec<Requirement>,
}

impl Selector {
    /// Reads a Kubernetes label selector; only `In`, `NotIn`, `Exists` and `DoesNotExist`
    /// are label selector operators.
    pub fn from_k8s(s: &LabelSelector) -> Result<Self, ShapeError> {
        let mut requirements: Vec<Requirement> = s
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| Requirement { key: k.clone(), operator: Operator::In, values: vec![v.clone()] })
            .collect();
        for e in s.match_expressions.iter().flatten() {
            let operator = match e.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => return Err(ShapeError::SelectorOperator(other.to_string())),
            };
            requirements.push(Requirement {
                key: e.key.clone(),
                operator,
                values: e.values.clone().unwrap_or_default(),
            });
        }
        Ok(Self { requirements })
    }

    /// Whether labels satisfy every requirement.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.requirements.iter().all(|r| r.matches(labels.get(&r.key)))
    }

    /// True when the selector has no requirement (matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Adds `key In [value]` for each key the pod has a label for (`matchLabelKeys`), or
    /// `key NotIn [value]` (`mismatchLabelKeys`). The apiserver already merges these into
    /// the selector of pods it admits; merging again adds the same requirement once more,
    /// which changes nothing.
    fn merge_keys(&mut self, keys: &[String], labels: &Labels, operator: Operator) {
        for key in keys {
            if let Some(value) = labels.get(key) {
                self.requirements.push(Requirement { key: key.clone(), operator, values: vec![value.to_string()] });
            }
        }
    }
}

fn selector(s: Option<&LabelSelector>) -> Result<Option<Selector>, ShapeError> {
    s.map(Selector::from_k8s).transpose()
}

/// One pod affinity or anti-affinity term, resolved for the pod that carries it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodTerm {
    /// Pods it selects; `None` selects none.
    pub selector: Option<Selector>,
    /// Namespaces it looks in (the carrier's own when neither these nor a selector are set).
    pub namespaces: Vec<String>,
    /// Namespaces it looks in by their labels; `None` adds none.
    pub namespace_selector: Option<Selector>,
    /// Node label whose value is the domain.
    pub topology_key: String,
}

impl PodTerm {
    /// Reads a term of a pod in namespace `own` with labels `labels`.
    pub fn from_k8s(t: &PodAffinityTerm, own: &str, labels: &Labels) -> Result<Self, ShapeError> {
        let mut sel = selector(t.label_selector.as_ref())?;
        if let Some(s) = sel.as_mut() {
            s.merge_keys(t.match_label_keys.as_deref().unwrap_or_default(), labels, Operator::In);
            s.merge_keys(t.mismatch_label_keys.as_deref().unwrap_or_default(), labels, Operator::NotIn);
        }
        let namespace_selector = selector(t.namespace_selector.as_ref())?;
        let mut namespaces = t.namespaces.clone().unwrap_or_default();
        if namespaces.is_empty() && namespace_selector.is_none() {
            namespaces.push(own.to_string());
        }
        namespaces.sort();
        namespaces.dedup();
        Ok(Self { selector: sel, namespaces, namespace_selector, topology_key: t.topology_key.clone() })
    }

    /// kube's `AffinityTerm.Matches`: the pod's namespace is selected (by name, or by its
    /// labels `namespace_labels`, unknown namespaces having none) and so are its labels.
    pub fn matches(&self, namespace: &str, labels: &Labels, namespace_labels: Option<&Labels>) -> bool {
        let empty = Labels::default();
        let in_namespace = self.namespaces.binary_search_by(|n| n.as_str().cmp(namespace)).is_ok()
            || self.namespace_selector.as_ref().is_some_and(|s| s.matches(namespace_labels.unwrap_or(&empty)));
        in_namespace && self.selector.as_ref().is_some_and(|s| s.matches(labels))
    }
}

/// A preferred (weighted) affinity or anti-affinity term.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WeightedTerm {
    /// 1..=100.
    pub weight: i32,
    /// The term.
    pub term: PodTerm,
    /// Anti-affinity (subtracts) rather than affinity (adds).
    pub anti: bool,
}

/// One topology spread constraint.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SpreadConstraint {
    /// `maxSkew`.
    pub max_skew: i32,
    /// Node label whose values are the domains.
    pub topology_key: String,
    /// Pods counted; `None` counts none.
    pub selector: Option<Selector>,
    /// `minDomains` (1 when unset).
    pub min_domains: i32,
    /// `nodeAffinityPolicy: Honor` (the default): only nodes the pod's node selector and
    /// required node affinity allow are counted.
    pub honor_node_affinity: bool,
    /// `nodeTaintsPolicy: Honor` (default Ignore): only nodes whose taints the pod tolerates
    /// are counted.
    pub honor_taints: bool,
    /// `whenUnsatisfiable: DoNotSchedule` (a filter); otherwise `ScheduleAnyway` (a score).
    pub hard: bool,
}

impl SpreadConstraint {
    /// Reads a constraint of a pod with labels `labels` (`matchLabelKeys` merged as kube does).
    pub fn from_k8s(c: &TopologySpreadConstraint, labels: &Labels) -> Result<Self, ShapeError> {
        let mut sel = selector(c.label_selector.as_ref())?;
        if let Some(s) = sel.as_mut() {
            s.merge_keys(c.match_label_keys.as_deref().unwrap_or_default(), labels, Operator::In);
        }
        Ok(Self {
            max_skew: c.max_skew,
            topology_key: c.topology_key.clone(),
            selector: sel,
            min_domains: c.min_domains.unwrap_or(1),
            honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
            honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
            hard: c.when_unsatisfiable == "DoNotSchedule",
        })
    }

    /// Whether an existing pod counts toward this constraint of a pod in `namespace`
    /// (kube's `countPodsMatchSelector`: same namespace, not terminating, selected; an empty
    /// selector counts nothing).
    pub fn counts(&self, namespace: &str, pod_namespace: &str, labels: &Labels, terminating: bool) -> bool {
        !terminating
            && namespace == pod_namespace
            && self.selector.as_ref().is_some_and(|s| !s.is_empty() && s.matches(labels))
    }

    /// Whether the incoming pod itself matches (`selfMatchNum`).
    pub fn matches_self(&self, labels: &Labels) -> bool {
        self.selector.as_ref().is_some_and(|s| s.matches(labels))
    }
}

/// A host port a container binds (`hostPort > 0`), sanitized as kube does: an empty host IP
/// is `0.0.0.0`, an empty protocol `TCP`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    /// Host IP.
    pub ip: String,
    /// Protocol.
    pub protocol: String,
    /// Port.
    pub port: i32,
}

/// Bind-all host IP.
const ANY_IP: &str = "0.0.0.0";

impl HostPort {
    /// A host port from its parts.
    pub fn new(ip: &str, protocol: &str, port: i32) -> Self {
        let ip = if ip.is_empty() { ANY_IP } else { ip };
        let protocol = if protocol.is_empty() { "TCP" } else { protocol };
        Self { ip: ip.into(), protocol: protocol.into(), port }
    }

    /// kube's `HostPortInfo.CheckConflict`: same protocol and port, and the same IP or either
    /// one binding all.
    pub fn conflicts(&self, used: &HostPort) -> bool {
        self.port == used.port
            && self.protocol == used.protocol
            && (self.ip == ANY_IP || used.ip == ANY_IP || self.ip == used.ip)
    }
}

/// Host ports of a pod: its containers' and those of its restartable (sidecar) init
/// containers, which run for the pod's whole life (kube's `GetHostPorts`).
pub fn host_ports(spec: &PodSpec) -> Vec<HostPort> {
    let sidecars = spec.init_containers.iter().flatten().filter(|c| c.restart_policy.as_deref() == Some("Always"));
    let mut out: Vec<HostPort> = sidecars
        .chain(spec.containers.iter())
        .flat_map(|c: &Container| c.ports.iter().flatten())
        .filter_map(|p| {
            p.host_port.filter(|&h| h > 0).map(|h| {
                HostPort::new(p.host_ip.as_deref().unwrap_or_default(), p.protocol.as_deref().unwrap_or_default(), h)
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What a pod says about other pods, parsed once per shape.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodRules {
    /// Required affinity terms (all must hold).
    pub affinity: Vec<PodTerm>,
    /// Required anti-affinity terms (none may be violated).
    pub anti_affinity: Vec<PodTerm>,
    /// Preferred terms (scoring only).
    pub preferred: Vec<WeightedTerm>,
    /// Topology spread constraints.
    pub spread: Vec<SpreadConstraint>,
    /// Host ports.
    pub host_ports: Vec<HostPort>,
}

impl PodRules {
    /// Reads the rules of a pod spec in namespace `namespace` with labels `labels`.
    pub fn from_spec(spec: &PodSpec, namespace: &str, labels: &Labels) -> Result<Self, ShapeError> {
        let terms = |ts: Option<&Vec<PodAffinityTerm>>| -> Result<Vec<PodTerm>, ShapeError> {
            ts.into_iter().flatten().map(|t| PodTerm::from_k8s(t, namespace, labels)).collect()
        };
        let weighted =
            |ts: Option<&Vec<WeightedPodAffinityTerm>>, anti: bool| -> Result<Vec<WeightedTerm>, ShapeError> {
                ts.into_iter()
                    .flatten()
                    .map(|w| {
                        Ok(WeightedTerm {
                            weight: w.weight,
                            term: PodTerm::from_k8s(&w.pod_affinity_term, namespace, labels)?,
                            anti,
                        })
                    })
                    .collect()
            };
        let affinity = spec.affinity.as_ref().and_then(|a| a.pod_affinity.as_ref());
        let anti = spec.affinity.as_ref().and_then(|a| a.pod_anti_affinity.as_ref());
        let mut preferred =
            weighted(affinity.and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref()), false)?;
        preferred.extend(weighted(
            anti.and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref()),
            true,
        )?);
        Ok(Self {
            affinity: terms(affinity.and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()))?,
            anti_affinity: terms(anti.and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()))?,
            preferred,
            spread: spec
                .topology_spread_constraints
                .iter()
                .flatten()
                .map(|c| SpreadConstraint::from_k8s(c, labels))
                .collect::<Result<_, _>>()?,
            host_ports: host_ports(spec),
        })
    }

    /// True when the pod has no rule about other pods: placement may then treat identical
    /// pods as interchangeable and fill nodes by capacity arithmetic.
    pub fn is_empty(&self) -> bool {
        self.affinity.is_empty()
            && self.anti_affinity.is_empty()
            && self.preferred.is_empty()
            && self.spread.is_empty()
            && self.host_ports.is_empty()
    }

    /// Whether a pod with these labels in this namespace matches every required affinity term
    /// (kube's `podMatchesAllAffinityTerms`; false with no terms).
    pub fn matches_all_affinity(&self, namespace: &str, labels: &Labels, namespace_labels: Option<&Labels>) -> bool {
        !self.affinity.is_empty() && self.affinity.iter().all(|t| t.matches(namespace, labels, namespace_labels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Affinity, ContainerPort, PodAntiAffinity};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().copied().collect()
    }

    fn term(v: serde_json::Value) -> PodAffinityTerm {
        serde_json::from_value(v).expect("term")
    }

    #[test]
    fn selectors_follow_label_selector_as_selector() {
        let app = labels(&[("app", "train"), ("tier", "gpu")]);
        let cases: &[(&str, serde_json::Value, bool)] = &[
            ("empty_selector_matches_everything", json!({}), true),
            ("match_labels_need_equal_values", json!({"matchLabels": {"app": "train"}}), true),
            ("match_labels_reject_other_values", json!({"matchLabels": {"app": "serve"}}), false),
            ("in", json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["cpu", "gpu"]}]}), true),
            (
                "not_in_missing_label",
                json!({"matchExpressions": [{"key": "x", "operator": "NotIn", "values": ["a"]}]}),
                true,
            ),
            ("exists", json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}), true),
            ("does_not_exist", json!({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}), false),
            (
                "labels_and_expressions_are_anded",
                json!({"matchLabels": {"app": "train"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["cpu"]}]}),
                false,
            ),
        ];
        for (name, v, want) in cases {
            let s = Selector::from_k8s(&serde_json::from_value(v.clone()).expect("selector")).expect("parses");
            assert_eq!(s.matches(&app), *want, "{name}");
        }
        let gt = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "a".into(),
                operator: "Gt".into(),
                values: Some(vec!["1".into()]),
            }]),
            ..Default::default()
        };
        assert_eq!(Selector::from_k8s(&gt), Err(ShapeError::SelectorOperator("Gt".into())));
    }

    #[test]
    fn terms_resolve_namespaces_like_kube() {
        let pod = labels(&[("app", "train")]);
        let team = labels(&[("team", "ml")]);
        let own = PodTerm::from_k8s(&term(json!({"topologyKey": "h", "labelSelector": {}})), "a", &pod).unwrap();
        assert!(own.matches("a", &pod, None), "no namespaces and no selector: the carrier's own");
        assert!(!own.matches("b", &pod, None));
        let listed = PodTerm::from_k8s(
            &term(json!({"topologyKey": "h", "labelSelector": {}, "namespaces": ["b", "c"]})),
            "a",
            &pod,
        )
        .unwrap();
        assert!(!listed.matches("a", &pod, None), "listed namespaces replace the own one");
        assert!(listed.matches("c", &pod, None));
        let by_label = PodTerm::from_k8s(
            &term(
                json!({"topologyKey": "h", "labelSelector": {}, "namespaceSelector": {"matchLabels": {"team": "ml"}}}),
            ),
            "a",
            &pod,
        )
        .unwrap();
        assert!(by_label.matches("z", &pod, Some(&team)));
        assert!(!by_label.matches("z", &pod, None), "an unknown namespace has no labels");
        let all = PodTerm::from_k8s(
            &term(json!({"topologyKey": "h", "labelSelector": {}, "namespaceSelector": {}})),
            "a",
            &pod,
        )
        .unwrap();
        assert!(all.matches("anything", &pod, None), "an empty namespace selector selects every namespace");
        let none = PodTerm::from_k8s(&term(json!({"topologyKey": "h"})), "a", &pod).unwrap();
        assert!(!none.matches("a", &pod, None), "a term without a label selector selects no pod");
    }

    #[test]
    fn match_label_keys_narrow_to_the_carriers_values() {
        let mine = labels(&[("app", "train"), ("job", "j1")]);
        let t = PodTerm::from_k8s(
            &term(json!({"topologyKey": "h", "labelSelector": {"matchLabels": {"app": "train"}},
                         "matchLabelKeys": ["job"], "mismatchLabelKeys": ["app"]})),
            "a",
            &mine,
        )
        .unwrap();
        // job In [j1] and app NotIn [train] on top of app = train: nothing can match.
        assert!(!t.matches("a", &mine, None));
        let only_match = PodTerm::from_k8s(
            &term(json!({"topologyKey": "h", "labelSelector": {}, "matchLabelKeys": ["job", "absent"]})),
            "a",
            &mine,
        )
        .unwrap();
        assert!(only_match.matches("a", &labels(&[("job", "j1")]), None));
        assert!(!only_match.matches("a", &labels(&[("job", "j2")]), None));
    }

    #[test]
    fn spread_counts_same_namespace_live_selected_pods() {
        let c = SpreadConstraint::from_k8s(
            &serde_json::from_value(json!({"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                                            "labelSelector": {"matchLabels": {"app": "train"}}, "minDomains": 3}))
            .unwrap(),
            &Labels::default(),
        )
        .unwrap();
        let train = labels(&[("app", "train")]);
        assert!((c.hard, c.min_domains, c.honor_node_affinity, c.honor_taints) == (true, 3, true, false));
        assert!(c.counts("ns", "ns", &train, false));
        assert!(!c.counts("ns", "other", &train, false), "other namespaces are not counted");
        assert!(!c.counts("ns", "ns", &train, true), "terminating pods are not counted");
        let everything = SpreadConstraint::from_k8s(
            &serde_json::from_value(json!({"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway",
                                            "labelSelector": {}, "nodeAffinityPolicy": "Ignore", "nodeTaintsPolicy": "Honor"}))
            .unwrap(),
            &Labels::default(),
        )
        .unwrap();
        assert!(!everything.counts("ns", "ns", &train, false), "an empty selector counts nothing, as in kube");
        assert!(everything.matches_self(&train));
        assert!((everything.hard, everything.honor_node_affinity, everything.honor_taints) == (false, false, true));
    }

    #[test]
    fn host_ports_conflict_like_kube() {
        let any = HostPort::new("", "", 8080);
        assert_eq!(any, HostPort::new("0.0.0.0", "TCP", 8080));
        let cases: &[(&str, HostPort, HostPort, bool)] = &[
            ("same_port_any_ip", any.clone(), HostPort::new("10.0.0.1", "TCP", 8080), true),
            ("specific_ips_differ", HostPort::new("10.0.0.1", "", 8080), HostPort::new("10.0.0.2", "", 8080), false),
            ("specific_ip_same", HostPort::new("10.0.0.1", "", 8080), HostPort::new("10.0.0.1", "", 8080), true),
            ("protocols_differ", any.clone(), HostPort::new("", "UDP", 8080), false),
            ("ports_differ", any.clone(), HostPort::new("", "", 8081), false),
        ];
        for (name, a, b, want) in cases {
            assert_eq!(a.conflicts(b), *want, "{name}");
            assert_eq!(b.conflicts(a), *want, "{name} (symmetric)");
        }
    }

    #[test]
    fn host_ports_come_from_containers_and_sidecars_only() {
        let port = |h: i32| ContainerPort { container_port: 80, host_port: Some(h), ..Default::default() };
        let c = |name: &str, ports: Vec<ContainerPort>, restart: Option<&str>| Container {
            name: name.into(),
            ports: Some(ports),
            restart_policy: restart.map(String::from),
            ..Default::default()
        };
        let spec = PodSpec {
            containers: vec![c(
                "app",
                vec![port(9000), ContainerPort { container_port: 81, ..Default::default() }],
                None,
            )],
            init_containers: Some(vec![
                c("init", vec![port(9001)], None),
                c("sidecar", vec![port(9002)], Some("Always")),
            ]),
            ..Default::default()
        };
        let ports: Vec<i32> = host_ports(&spec).iter().map(|p| p.port).collect();
        assert_eq!(ports, vec![9000, 9002]);
    }

    #[test]
    fn rules_read_required_and_preferred_terms() {
        let spec = PodSpec {
            affinity: Some(Affinity {
                pod_anti_affinity: Some(PodAntiAffinity {
                    required_during_scheduling_ignored_during_execution: Some(vec![term(
                        json!({"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "t"}}}),
                    )]),
                    preferred_during_scheduling_ignored_during_execution: Some(vec![WeightedPodAffinityTerm {
                        weight: 10,
                        pod_affinity_term: term(json!({"topologyKey": "zone", "labelSelector": {}})),
                    }]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let rules = PodRules::from_spec(&spec, "ns", &labels(&[("app", "t")])).unwrap();
        assert_eq!(rules.anti_affinity.len(), 1);
        assert!(rules.affinity.is_empty());
        assert_eq!(rules.preferred.len(), 1);
        assert!(rules.preferred[0].anti);
        assert!(!rules.is_empty());
        assert!(PodRules::from_spec(&PodSpec::default(), "ns", &Labels::default()).unwrap().is_empty());
    }
}
