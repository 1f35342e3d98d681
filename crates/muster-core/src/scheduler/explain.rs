//! Why pods were not placed, structured (node counts per filter reason, per group, per
//! topology domain) and rendered in kube-scheduler's words
//! (`0/40 nodes fit 8 pods of group "train": 32 Insufficient nvidia.com/gpu, ...`).
//! Types and text only; placement fills them in.

use std::fmt;

use super::snapshot::Unusable;

/// Why one node could not take a pod, in kube-scheduler's terms.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FilterReason {
    /// The node cannot be offered to any pod.
    Unusable(Unusable),
    /// `spec.unschedulable` and the pod does not tolerate it.
    Unschedulable,
    /// `nodeSelector` or required node affinity does not match.
    NodeAffinity,
    /// A NoSchedule/NoExecute taint the pod does not tolerate.
    UntoleratedTaint {
        /// Taint key.
        key: String,
        /// Taint value.
        value: String,
    },
    /// Not enough of a resource left.
    Insufficient(String),
    /// No pod slots left.
    TooManyPods,
    /// Enough `nvidia.com/gpu` by count, but no acceptable set of free GPU indices.
    GpuIndices,
    /// kube-scheduler refused a pin of this gang to the node in an earlier attempt; it is
    /// avoided for a while.
    RefusedEarlier,
    /// A root of higher priority that waits holds the node (its reservation, or the node its
    /// preemption frees), or a pod of the root's priority or higher is nominated to it (a
    /// preemptor: kube-scheduler counts it there): the root is placed elsewhere.
    Reserved,
    /// A host port the pod needs is taken (NodePorts).
    HostPorts,
    /// A claim of the pod keeps it off every node (VolumeBinding), in kube-scheduler's words.
    Volume(String),
    /// A DRA claim of the pod keeps it off every node (a template or claim missing, a request
    /// muster cannot allocate), in muster's words.
    Claim(String),
    /// The node cannot reach the devices of a named claim the pod uses (DynamicResources).
    ClaimReach,
    /// Not enough free devices matching the pod's GPU claim on the node (DynamicResources).
    ClaimDevices,
    /// A bound volume's node affinity excludes the node (VolumeBinding).
    VolumeNodeAffinity,
    /// A bound volume's zone or region differs from the node's (VolumeZone).
    VolumeZone,
    /// The node lacks a topology spread constraint's key (PodTopologySpread).
    SpreadLabel,
    /// One more pod there would exceed a spread constraint's maxSkew (PodTopologySpread).
    Spread,
    /// Pinned there, kube-scheduler would count only that node for a spread constraint with
    /// `minDomains` (nodeAffinityPolicy Honor) and refuse the pod.
    SpreadPinned,
    /// No pod the pod's required affinity selects is in the node's domain (InterPodAffinity).
    PodAffinity,
    /// A pod the pod's required anti-affinity selects is in the node's domain.
    PodAntiAffinity,
    /// A pod in the node's domain has required anti-affinity selecting this pod.
    ExistingAntiAffinity,
}

impl fmt::Display for FilterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FilterReason::Unusable(Unusable::NoHostname) => f.write_str("node(s) had no kubernetes.io/hostname label"),
            FilterReason::Unusable(Unusable::SharedHostname) => {
                f.write_str("node(s) shared their kubernetes.io/hostname label")
            }
            FilterReason::Unusable(Unusable::UnreadableUsage) => {
                f.write_str("node(s) had pods with unreadable requests")
            }
            FilterReason::Unschedulable => f.write_str("node(s) were unschedulable"),
            FilterReason::NodeAffinity => f.write_str("node(s) didn't match Pod's node affinity/selector"),
            FilterReason::UntoleratedTaint { key, value } => {
                write!(f, "node(s) had untolerated taint {{{key}: {value}}}")
            }
            FilterReason::Insufficient(resource) => write!(f, "Insufficient {resource}"),
            FilterReason::TooManyPods => f.write_str("Too many pods"),
            FilterReason::GpuIndices => f.write_str("node(s) had no free GPU indices"),
            FilterReason::RefusedEarlier => f.write_str("node(s) refused this gang's pods in an earlier attempt (see condition BindFailed)"),
            FilterReason::Reserved => f.write_str("node(s) held for a waiting gang of higher priority or a preemptor"),
            FilterReason::HostPorts => f.write_str("node(s) didn't have free ports for the requested pod ports"),
            FilterReason::Volume(why) => f.write_str(why),
            FilterReason::Claim(why) => f.write_str(why),
            FilterReason::ClaimReach => f.write_str("node(s) cannot reach the devices of a shared ResourceClaim"),
            FilterReason::ClaimDevices => f.write_str("node(s) had no free devices matching the pod's GPU claim"),
            FilterReason::VolumeNodeAffinity => f.write_str("node(s) had volume node affinity conflict"),
            FilterReason::VolumeZone => f.write_str("node(s) had no available volume zone"),
            FilterReason::SpreadLabel => {
                f.write_str("node(s) didn't match pod topology spread constraints (missing required label)")
            }
            FilterReason::Spread => f.write_str("node(s) didn't match pod topology spread constraints"),
            FilterReason::SpreadPinned => f.write_str(
                "node(s) would fail pod topology spread constraints once pinned (minDomains counts the pinned node alone)",
            ),
            FilterReason::PodAffinity => f.write_str("node(s) didn't match pod affinity rules"),
            FilterReason::PodAntiAffinity => f.write_str("node(s) didn't match pod anti-affinity rules"),
            FilterReason::ExistingAntiAffinity => f.write_str("node(s) didn't satisfy existing pods anti-affinity rules"),
        }
    }
}

/// How many nodes failed for one reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReasonCount {
    /// The reason.
    pub reason: FilterReason,
    /// Nodes that failed for it.
    pub nodes: u32,
}

/// Why a group (or part of it) was not placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    /// The group's name.
    pub group: String,
    /// What happened.
    pub kind: ExplanationKind,
}

/// What kept a group's pods from being placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExplanationKind {
    /// Fewer pods exist than the policy needs (placement stopped before trying).
    TooFewPods(TooFewPods),
    /// Pods of a PodGroup did not (all) fit.
    Pods(PodsUnplaced),
    /// Child groups of a CompositePodGroup did not (all) fit.
    Children(ChildrenUnplaced),
    /// No domain of the group's topology key fits it.
    Topology(TopologyUnplaced),
    /// The group's admitted or bound pods already sit in more than one domain (or on a node
    /// without the label), so no placement can keep it in one.
    DomainConflict(DomainConflict),
}

/// A PodGroup with fewer placeable pods than `minCount`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TooFewPods {
    /// Pods already admitted or bound.
    pub existing: u32,
    /// Gated pods that can be placed.
    pub gated: u32,
    /// Gated pods whose spec cannot be read.
    pub invalid: u32,
    /// `minCount` (1 for basic).
    pub min_count: u32,
}

/// Pods of a PodGroup that did not fit, with the node counts of the last shape that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodsUnplaced {
    /// Gated pods the group tried to place.
    pub pods: u32,
    /// Of those, pods that fit (before any rollback).
    pub placed: u32,
    /// Pods admitted or bound before this decision.
    pub existing: u32,
    /// `minCount` (1 for basic).
    pub min_count: u32,
    /// True for a gang.
    pub gang: bool,
    /// Nodes considered (the domain, when there is one).
    pub nodes: u32,
    /// Of those, nodes that could take at least one pod.
    pub nodes_fit: u32,
    /// Why the other nodes could not, most common first.
    pub reasons: Vec<ReasonCount>,
    /// Gated pods whose spec cannot be read: (pod, error).
    pub invalid: Vec<(String, String)>,
    /// The topology domain placement was confined to: (key, value).
    pub domain: Option<(String, String)>,
}

/// Child groups of a CompositePodGroup that did not fit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildrenUnplaced {
    /// Child groups that exist.
    pub children: u32,
    /// Child groups that fit.
    pub placed: u32,
    /// `minGroupCount` (1 for basic).
    pub min_group_count: u32,
    /// True for a gang.
    pub gang: bool,
    /// Child groups not tried because the rest could no longer reach `minGroupCount`.
    pub not_tried: u32,
    /// Why each failed child failed.
    pub failed: Vec<Explanation>,
}

/// A group whose topology constraint no domain satisfies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyUnplaced {
    /// The node label key.
    pub key: String,
    /// Pods of the group (all descendants), existing and gated.
    pub pods: u32,
    /// Domains (label values) tried.
    pub domains: u32,
    /// Nodes without the label, never in any domain.
    pub nodes_without_label: u32,
    /// The domain that fit the most pods, and how many.
    pub best: Option<(String, u32)>,
    /// Why the best domain failed.
    pub in_best: Option<Box<Explanation>>,
}

/// A topology-constrained group whose existing pods already span domains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainConflict {
    /// The node label key.
    pub key: String,
    /// Label values the pods' nodes have (`(no label)` for a node without it).
    pub occupied: Vec<String>,
}

fn plural(n: u32, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

impl FilterReason {
    /// The reason as a metric label: a fixed name, with the resource for `Insufficient` (no
    /// taint keys or values, so the label set stays small).
    pub fn class(&self) -> String {
        match self {
            FilterReason::Unusable(_) => "NodeUnusable".into(),
            FilterReason::Unschedulable => "NodeUnschedulable".into(),
            FilterReason::NodeAffinity => "NodeAffinity".into(),
            FilterReason::UntoleratedTaint { .. } => "UntoleratedTaint".into(),
            FilterReason::Insufficient(resource) => format!("Insufficient {resource}"),
            FilterReason::TooManyPods => "TooManyPods".into(),
            FilterReason::GpuIndices => "GpuIndices".into(),
            FilterReason::RefusedEarlier => "RefusedEarlier".into(),
            FilterReason::Reserved => "Reserved".into(),
            FilterReason::HostPorts => "NodePorts".into(),
            FilterReason::Volume(_) | FilterReason::VolumeNodeAffinity => "VolumeBinding".into(),
            FilterReason::VolumeZone => "VolumeZone".into(),
            FilterReason::Claim(_) | FilterReason::ClaimReach | FilterReason::ClaimDevices => "DynamicResources".into(),
            FilterReason::SpreadLabel | FilterReason::Spread | FilterReason::SpreadPinned => "PodTopologySpread".into(),
            FilterReason::PodAffinity | FilterReason::PodAntiAffinity | FilterReason::ExistingAntiAffinity => {
                "InterPodAffinity".into()
            }
        }
    }
}

impl Explanation {
    /// What kept the group out, as a metric label (the first failed child's, for a composite):
    /// the most common reason among the nodes the pods' selector and affinity allow; when
    /// every filtered node was one they exclude, `InsufficientCapacity` if some nodes fit
    /// pods (just not enough) and `NodeAffinity` if none did; else the kind of failure
    /// (`TooFewPods`, `Topology`, `DomainConflict`, `Children`).
    pub fn metric_reason(&self) -> String {
        match &self.kind {
            ExplanationKind::TooFewPods(_) => "TooFewPods".into(),
            ExplanationKind::Pods(p) => match p.reasons.iter().find(|r| r.reason != FilterReason::NodeAffinity) {
                Some(r) => r.reason.class(),
                None if p.nodes_fit > 0 || p.reasons.is_empty() => "InsufficientCapacity".into(),
                None => "NodeAffinity".into(),
            },
            ExplanationKind::Children(c) => {
                c.failed.first().map_or_else(|| "Children".into(), Explanation::metric_reason)
            }
            ExplanationKind::Topology(t) => t.in_best.as_ref().map_or_else(|| "Topology".into(), |e| e.metric_reason()),
            ExplanationKind::DomainConflict(_) => "DomainConflict".into(),
        }
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = &self.group;
        match &self.kind {
            ExplanationKind::TooFewPods(t) => {
                write!(f, "group \"{group}\" has {} to place", plural(t.existing + t.gated, "pod", "pods"))?;
                if t.existing > 0 {
                    write!(f, " ({} admitted before)", t.existing)?;
                }
                write!(f, ", fewer than minCount {}", t.min_count)?;
                if t.invalid > 0 {
                    write!(f, "; {} with an unreadable spec", plural(t.invalid, "pod", "pods"))?;
                }
                Ok(())
            }
            ExplanationKind::Pods(p) if p.placed == p.pods && !p.invalid.is_empty() => {
                let (pod, error) = &p.invalid[0];
                let n = u32::try_from(p.invalid.len()).unwrap_or(u32::MAX);
                write!(
                    f,
                    "group \"{group}\": {} left gated (pod {pod}: {error})",
                    plural(n, "unreadable pod", "unreadable pods")
                )
            }
            ExplanationKind::Pods(p) => {
                write!(f, "{}/{} nodes", p.nodes_fit, p.nodes)?;
                if let Some((key, value)) = &p.domain {
                    write!(f, " in {key}={value}")?;
                }
                write!(f, " fit {} of group \"{group}\"", plural(p.pods, "pod", "pods"))?;
                if p.placed + p.existing > 0 || (p.gang && p.min_count != p.pods) {
                    write!(f, " (only {} placeable", p.placed)?;
                    if p.existing > 0 {
                        write!(f, " plus {} admitted before", p.existing)?;
                    }
                    if p.gang {
                        write!(f, ", minCount {}", p.min_count)?;
                    }
                    f.write_str(")")?;
                }
                if !p.reasons.is_empty() {
                    let reasons: Vec<String> = p.reasons.iter().map(|r| format!("{} {}", r.nodes, r.reason)).collect();
                    write!(f, ": {}", reasons.join(", "))?;
                }
                if let Some((pod, error)) = p.invalid.first() {
                    write!(
                        f,
                        "; {} unreadable",
                        plural(u32::try_from(p.invalid.len()).unwrap_or(u32::MAX), "pod", "pods")
                    )?;
                    write!(f, " (pod {pod}: {error})")?;
                }
                Ok(())
            }
            ExplanationKind::Children(c) => {
                write!(f, "composite group \"{group}\": {} of {} child groups fit", c.placed, c.children)?;
                if c.gang {
                    write!(f, ", minGroupCount {}", c.min_group_count)?;
                }
                if c.not_tried > 0 {
                    write!(f, " ({} not tried)", c.not_tried)?;
                }
                for failed in &c.failed {
                    write!(f, "; {failed}")?;
                }
                Ok(())
            }
            ExplanationKind::DomainConflict(c) => write!(
                f,
                "group \"{group}\" already has pods in more than one domain of {} ({}), so no single domain can hold it",
                c.key,
                c.occupied.join(", ")
            ),
            ExplanationKind::Topology(t) => {
                write!(f, "no domain of {} fits all {} of group \"{group}\"", t.key, plural(t.pods, "pod", "pods"))?;
                match &t.best {
                    Some((domain, fits)) => write!(f, ": best domain \"{domain}\" fits {fits}")?,
                    None => write!(f, ": {} tried", plural(t.domains, "domain", "domains"))?,
                }
                if t.nodes_without_label > 0 {
                    write!(f, " ({} without the label)", plural(t.nodes_without_label, "node", "nodes"))?;
                }
                if let Some(inner) = &t.in_best {
                    write!(f, "; {inner}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(placed: u32, existing: u32, reasons: Vec<ReasonCount>) -> PodsUnplaced {
        PodsUnplaced {
            pods: 8,
            placed,
            existing,
            min_count: 8,
            gang: true,
            nodes: 40,
            nodes_fit: placed,
            reasons,
            invalid: vec![],
            domain: None,
        }
    }

    #[test]
    fn metric_reasons_name_the_commonest_filter_without_taint_details() {
        let taint = FilterReason::UntoleratedTaint { key: "dedicated".into(), value: "infra".into() };
        let gpu = FilterReason::Insufficient("nvidia.com/gpu".into());
        let leaf = |reasons: Vec<ReasonCount>| Explanation {
            group: "g".into(),
            kind: ExplanationKind::Pods(pods(0, 0, reasons)),
        };
        assert_eq!(
            leaf(vec![ReasonCount { reason: gpu.clone(), nodes: 32 }, ReasonCount { reason: taint.clone(), nodes: 8 }])
                .metric_reason(),
            "Insufficient nvidia.com/gpu"
        );
        assert_eq!(leaf(vec![ReasonCount { reason: taint, nodes: 40 }]).metric_reason(), "UntoleratedTaint");
        assert_eq!(leaf(vec![]).metric_reason(), "InsufficientCapacity");
        // Nodes the selector excludes are not what kept the pods out, unless no node fit at all.
        let elsewhere = ReasonCount { reason: FilterReason::NodeAffinity, nodes: 38 };
        let mut some_fit = pods(2, 0, vec![elsewhere.clone()]);
        let explain = |p: &PodsUnplaced| Explanation { group: "g".into(), kind: ExplanationKind::Pods(p.clone()) };
        assert_eq!(explain(&some_fit).metric_reason(), "InsufficientCapacity");
        some_fit.reasons.push(ReasonCount { reason: gpu.clone(), nodes: 2 });
        assert_eq!(explain(&some_fit).metric_reason(), "Insufficient nvidia.com/gpu");
        assert_eq!(leaf(vec![elsewhere]).metric_reason(), "NodeAffinity");
        let composite = Explanation {
            group: "set".into(),
            kind: ExplanationKind::Children(ChildrenUnplaced {
                children: 2,
                placed: 1,
                min_group_count: 2,
                gang: true,
                not_tried: 0,
                failed: vec![leaf(vec![ReasonCount { reason: gpu, nodes: 40 }])],
            }),
        };
        assert_eq!(composite.metric_reason(), "Insufficient nvidia.com/gpu");
    }

    #[test]
    fn pods_render_like_kube_scheduler() {
        let e = Explanation {
            group: "train".into(),
            kind: ExplanationKind::Pods(pods(
                0,
                0,
                vec![
                    ReasonCount { reason: FilterReason::Insufficient("nvidia.com/gpu".into()), nodes: 32 },
                    ReasonCount {
                        reason: FilterReason::UntoleratedTaint { key: "dedicated".into(), value: "infra".into() },
                        nodes: 8,
                    },
                ],
            )),
        };
        assert_eq!(
            e.to_string(),
            "0/40 nodes fit 8 pods of group \"train\": 32 Insufficient nvidia.com/gpu, \
             8 node(s) had untolerated taint {dedicated: infra}"
        );
        let partial = Explanation { group: "train".into(), kind: ExplanationKind::Pods(pods(5, 2, vec![])) };
        assert_eq!(
            partial.to_string(),
            "5/40 nodes fit 8 pods of group \"train\" (only 5 placeable plus 2 admitted before, minCount 8)"
        );
    }

    #[test]
    fn every_filter_reason_has_kube_words() {
        let words: Vec<String> = [
            FilterReason::Unusable(Unusable::NoHostname),
            FilterReason::Unusable(Unusable::SharedHostname),
            FilterReason::Unusable(Unusable::UnreadableUsage),
            FilterReason::Unschedulable,
            FilterReason::NodeAffinity,
            FilterReason::UntoleratedTaint { key: "k".into(), value: String::new() },
            FilterReason::Insufficient("cpu".into()),
            FilterReason::TooManyPods,
            FilterReason::GpuIndices,
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(
            words,
            vec![
                "node(s) had no kubernetes.io/hostname label",
                "node(s) shared their kubernetes.io/hostname label",
                "node(s) had pods with unreadable requests",
                "node(s) were unschedulable",
                "node(s) didn't match Pod's node affinity/selector",
                "node(s) had untolerated taint {k: }",
                "Insufficient cpu",
                "Too many pods",
                "node(s) had no free GPU indices",
            ]
        );
    }

    #[test]
    fn topology_and_children_nest() {
        let inner = Explanation {
            group: "train".into(),
            kind: ExplanationKind::Pods(PodsUnplaced {
                domain: Some(("topology.muster.dev/rack".into(), "rack-a".into())),
                nodes: 4,
                pods: 9,
                placed: 8,
                nodes_fit: 4,
                min_count: 9,
                ..pods(8, 0, vec![ReasonCount { reason: FilterReason::Insufficient("cpu".into()), nodes: 0 }])
            }),
        };
        let topo = Explanation {
            group: "train".into(),
            kind: ExplanationKind::Topology(TopologyUnplaced {
                key: "topology.muster.dev/rack".into(),
                pods: 9,
                domains: 3,
                nodes_without_label: 1,
                best: Some(("rack-a".into(), 8)),
                in_best: Some(Box::new(inner)),
            }),
        };
        assert_eq!(
            topo.to_string(),
            "no domain of topology.muster.dev/rack fits all 9 pods of group \"train\": best domain \"rack-a\" fits 8 \
             (1 node without the label); 4/4 nodes in topology.muster.dev/rack=rack-a fit 9 pods of group \"train\" \
             (only 8 placeable, minCount 9): 0 Insufficient cpu"
        );
        let children = Explanation {
            group: "job".into(),
            kind: ExplanationKind::Children(ChildrenUnplaced {
                children: 3,
                placed: 1,
                min_group_count: 3,
                gang: true,
                not_tried: 1,
                failed: vec![Explanation {
                    group: "ps".into(),
                    kind: ExplanationKind::TooFewPods(TooFewPods { existing: 1, gated: 1, invalid: 1, min_count: 3 }),
                }],
            }),
        };
        assert_eq!(
            children.to_string(),
            "composite group \"job\": 1 of 3 child groups fit, minGroupCount 3 (1 not tried); \
             group \"ps\" has 2 pods to place (1 admitted before), fewer than minCount 3; 1 pod with an unreadable spec"
        );
    }
}
