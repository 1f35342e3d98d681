//! The group tree, all-or-nothing per gang: a PodGroup's gated pods shape by shape, a
//! CompositePodGroup's children gangs first, each checked with upstream PlacementFeasible
//! ([`placement_feasible`]) and rolled back when its gang fails.

use super::Engine;
use crate::scheduler::explain::{
    ChildrenUnplaced, Explanation, ExplanationKind, PodsUnplaced, ReasonCount, TooFewPods,
};
use crate::scheduler::shape::PodShape;
use crate::scheduler::tree::{CompositeGroup, CompositePolicy, Group, LeafGroup, LeafPolicy, PodState};

/// Upstream PlacementFeasible's answer for a group with `min` = minCount (or minGroupCount).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feasibility {
    /// `scheduled + remaining < min`: the group can no longer succeed; stop early.
    Unschedulable,
    /// `scheduled < min`: keep going.
    Wait,
    /// `scheduled >= min`.
    Success,
}

/// PlacementFeasible: compares what is scheduled (including earlier cycles) and what remains
/// to be tried with the group's minimum.
pub fn placement_feasible(min: u32, scheduled: u32, remaining: u32) -> Feasibility {
    if scheduled.saturating_add(remaining) < min {
        Feasibility::Unschedulable
    } else if scheduled < min {
        Feasibility::Wait
    } else {
        Feasibility::Success
    }
}

/// The result of trying one group.
pub(super) struct Attempt {
    /// The group's policy is satisfied.
    pub(super) success: bool,
    /// Pods of the subtree now in the plan.
    pub(super) placed: u32,
    /// Pods of the subtree that fit before any rollback, plus those admitted before.
    pub(super) reached: u32,
    /// Why it failed, or what it left behind.
    pub(super) explanation: Option<Explanation>,
    /// For a one-shape PodGroup: more pods of its shape the nodes could still take.
    pub(super) slots_left: Option<u64>,
}

impl Attempt {
    pub(super) fn failed(reached: u32, explanation: Explanation) -> Self {
        Self { success: false, placed: 0, reached, explanation: Some(explanation), slots_left: None }
    }
}

impl<'a> Engine<'a> {
    /// A shape's size for ordering shapes largest first: its GPUs (`nvidia.com/gpu`, or what
    /// its own DRA claim asks for), then cpu, then memory. A DRA pod requests no
    /// `nvidia.com/gpu`, so [`PodShape::size_key`] alone would rank it as a CPU pod.
    pub(super) fn size_key(&self, shape: &PodShape) -> (u32, i64, i64) {
        let (gpus, cpu, memory) = shape.size_key();
        let claimed = self.facts.of(shape).and_then(|f| f.resource_claims.as_ref().ok()).map_or(0, |c| c.gpus());
        (gpus.max(claimed), cpu, memory)
    }

    pub(super) fn place_group(
        &mut self,
        group: &'a Group,
        nodes: &[u32],
        domain: Option<(&'a str, &'a str)>,
    ) -> Attempt {
        match group.topology_key() {
            Some(key) => self.place_in_domains(group, key, nodes),
            None => self.place_here(group, nodes, domain),
        }
    }

    pub(super) fn place_here(
        &mut self,
        group: &'a Group,
        nodes: &[u32],
        domain: Option<(&'a str, &'a str)>,
    ) -> Attempt {
        match group {
            Group::Leaf(leaf) => self.place_leaf(leaf, nodes, domain),
            Group::Composite(composite) => self.place_composite(composite, nodes, domain),
        }
    }

    fn place_leaf(&mut self, leaf: &'a LeafGroup, nodes: &[u32], domain: Option<(&'a str, &'a str)>) -> Attempt {
        let existing = leaf.placed_pods();
        let mut by_shape: Vec<Vec<usize>> = vec![Vec::new(); leaf.shapes.len()];
        let mut invalid = Vec::new();
        for (i, pod) in leaf.pods.iter().enumerate() {
            match &pod.state {
                PodState::Gated { shape } => match by_shape.get_mut(*shape) {
                    Some(pods) => pods.push(i),
                    None => invalid.push((pod.name.clone(), format!("shape {shape} is not in the group"))),
                },
                PodState::Invalid { error } => invalid.push((pod.name.clone(), error.to_string())),
                _ => {}
            }
        }
        for pods in &mut by_shape {
            pods.sort_by(|&a, &b| leaf.pods[a].name.cmp(&leaf.pods[b].name));
        }
        // Largest shapes first: big pods are the hardest to fit.
        let mut order: Vec<usize> = (0..by_shape.len()).filter(|&s| !by_shape[s].is_empty()).collect();
        order.sort_by(|&a, &b| self.size_key(&leaf.shapes[b]).cmp(&self.size_key(&leaf.shapes[a])).then(a.cmp(&b)));
        let gated = by_shape.iter().map(|p| u32::try_from(p.len()).unwrap_or(u32::MAX)).fold(0, u32::saturating_add);
        let min_count = leaf.min_count();
        let gang = matches!(leaf.policy, LeafPolicy::Gang { .. });
        let invalid_count = u32::try_from(invalid.len()).unwrap_or(u32::MAX);
        if placement_feasible(min_count, existing, gated) == Feasibility::Unschedulable {
            return Attempt::failed(
                existing,
                Explanation {
                    group: leaf.name.clone(),
                    kind: ExplanationKind::TooFewPods(TooFewPods {
                        existing,
                        gated,
                        invalid: invalid_count,
                        min_count,
                    }),
                },
            );
        }

        let checkpoint = self.plan.len();
        let (mut placed, mut remaining) = (0u32, gated);
        let mut shortfall: Option<(u32, u32, Vec<ReasonCount>)> = None;
        let mut slots_left = None;
        for &s in &order {
            let (shape, pods) = (&leaf.shapes[s], &by_shape[s]);
            let (fitted, scanned, nodes_fit, tally) = if self.facts.per_pod {
                let (fitted, scan) = self.fill_each(leaf, shape, pods, nodes);
                let nodes_fit = u32::try_from(scan.candidates.len()).unwrap_or(u32::MAX);
                (fitted, scan.nodes, nodes_fit, scan.tally)
            } else {
                let scan = self.scan(shape, nodes, None);
                let nodes_fit = u32::try_from(scan.candidates.len()).unwrap_or(u32::MAX);
                let capacity: u64 = scan.candidates.iter().map(|c| u64::from(c.fit)).sum();
                let (scanned, tally) = (scan.nodes, scan.tally);
                let fitted = self.fill(leaf, shape, pods, scan.candidates);
                // Each pod placed takes exactly one slot of its own shape; the chooser may
                // refuse a few more, so this is an upper bound.
                slots_left = Some(capacity.saturating_sub(u64::from(fitted)));
                (fitted, scanned, nodes_fit, tally)
            };
            placed += fitted;
            remaining -= u32::try_from(pods.len()).unwrap_or(u32::MAX);
            if (fitted as usize) < pods.len() {
                shortfall = Some((scanned, nodes_fit, tally.counts()));
            }
            if placement_feasible(min_count, existing + placed, remaining) == Feasibility::Unschedulable {
                break;
            }
        }
        if gang && self.facts.per_pod && existing + placed < min_count {
            // One pod at a time, the first choices can block later pods (co-location that
            // picked the small zone, spread that filled the wrong domain): search the
            // choices, within a budget, before giving up.
            let sequence: Vec<(&'a PodShape, usize)> =
                order.iter().flat_map(|&s| by_shape[s].iter().map(move |&p| (&leaf.shapes[s], p))).collect();
            if let Some(found) = self.search(leaf, &sequence, nodes, checkpoint, min_count - existing) {
                placed = found;
            }
        }
        let success = existing + placed >= min_count;
        let explanation = (shortfall.is_some() || !invalid.is_empty()).then(|| {
            let (nodes, nodes_fit, reasons) = shortfall.unwrap_or_default();
            Explanation {
                group: leaf.name.clone(),
                kind: ExplanationKind::Pods(PodsUnplaced {
                    pods: gated,
                    placed,
                    existing,
                    min_count,
                    gang,
                    nodes,
                    nodes_fit,
                    reasons,
                    invalid,
                    domain: domain.map(|(k, v)| (k.to_string(), v.to_string())),
                }),
            }
        });
        let reached = existing + placed;
        if !success {
            self.rollback(checkpoint);
            placed = 0;
        }
        let slots_left = slots_left.filter(|_| leaf.shapes.len() == 1);
        Attempt { success, placed, reached, explanation, slots_left }
    }

    fn place_composite(
        &mut self,
        composite: &'a CompositeGroup,
        nodes: &[u32],
        domain: Option<(&'a str, &'a str)>,
    ) -> Attempt {
        let min_group_count = composite.policy.min_group_count();
        let gang = matches!(composite.policy, CompositePolicy::Gang { .. });
        let mut children: Vec<&'a Group> = composite.children.iter().collect();
        children.sort_by_key(|g| !g.is_gang());
        let total = u32::try_from(children.len()).unwrap_or(u32::MAX);
        let checkpoint = self.plan.len();
        let (mut admitted, mut placed, mut reached, mut evaluated) = (0u32, 0u32, 0u32, 0u32);
        let mut details = Vec::new();
        if placement_feasible(min_group_count, 0, total) != Feasibility::Unschedulable {
            for child in children {
                let attempt = self.place_group(child, nodes, domain);
                evaluated += 1;
                reached += attempt.reached;
                if attempt.success {
                    admitted += 1;
                    placed += attempt.placed;
                }
                details.extend(attempt.explanation);
                if placement_feasible(min_group_count, admitted, total - evaluated) == Feasibility::Unschedulable {
                    break;
                }
            }
        }
        let success = admitted >= min_group_count;
        if !success {
            self.rollback(checkpoint);
            placed = 0;
        }
        let explanation = (!success || !details.is_empty()).then(|| Explanation {
            group: composite.name.clone(),
            kind: ExplanationKind::Children(ChildrenUnplaced {
                children: total,
                placed: admitted,
                min_group_count,
                gang,
                not_tried: total - evaluated,
                failed: details,
            }),
        });
        Attempt { success, placed, reached, explanation, slots_left: None }
    }
}
