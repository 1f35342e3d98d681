//! Groups with a topology key: the group tried in each domain of the key (only the one its
//! admitted pods occupy, if any), the best that succeeds kept, or why none did.

use std::collections::{BTreeMap, BTreeSet};

use super::{Attempt, Engine, Scoring};
use crate::scheduler::explain::{DomainConflict, Explanation, ExplanationKind, TopologyUnplaced};
use crate::scheduler::shape::PodShape;
use crate::scheduler::tree::{Group, LeafGroup, PodState};

impl<'a> Engine<'a> {
    /// Pods of `shape` the nodes could still take (for choosing the tightest domain).
    fn free_slots(&self, shape: &'a PodShape, nodes: &[u32]) -> u64 {
        self.scan(shape, nodes, None).candidates.iter().map(|c| u64::from(c.fit)).sum()
    }

    /// Tries the group in each domain of `key` (only the one its admitted pods occupy, if
    /// any) and keeps the best that succeeds: most pods placed, then the tightest fit (fewest
    /// slots left for its largest pod; the loosest with Spread), then the domain name.
    pub(super) fn place_in_domains(&mut self, group: &'a Group, key: &'a str, nodes: &[u32]) -> Attempt {
        let leaves = group.leaves();
        let pods = leaves.iter().map(|l| l.placed_pods().saturating_add(l.gated_pods())).fold(0, u32::saturating_add);

        let occupied = self.occupied_domains(&leaves, key);
        if occupied.len() > 1 || occupied.contains(&None) {
            let occupied = occupied.iter().map(|d| d.unwrap_or("(no label)").to_string()).collect();
            let kind = ExplanationKind::DomainConflict(DomainConflict { key: key.into(), occupied });
            return Attempt::failed(0, Explanation { group: group.name().to_string(), kind });
        }
        let mut domains: BTreeMap<&'a str, Vec<u32>> = BTreeMap::new();
        let mut nodes_without_label = 0;
        // Neighbouring nodes (by name) usually share a domain: try the last one first.
        let mut last: Option<(&'a str, &mut Vec<u32>)> = None;
        for &i in nodes {
            let Some(value) = self.node(i).labels.get(key) else {
                nodes_without_label += 1;
                continue;
            };
            match last {
                Some((v, ref mut members)) if v == value => members.push(i),
                _ => {
                    let members = domains.entry(value).or_default();
                    members.push(i);
                    last = Some((value, members));
                }
            }
        }
        if let Some(Some(only)) = occupied.first() {
            domains.retain(|value, _| value == only);
        }

        let largest =
            leaves.iter().flat_map(|l| l.shapes.iter()).max_by(|a, b| self.size_key(a).cmp(&self.size_key(b)));
        let mut best: Option<(&'a str, u32, u64)> = None;
        let mut best_failure: Option<(&'a str, u32, Option<Explanation>)> = None;
        for (&value, members) in &domains {
            let checkpoint = self.plan.len();
            let attempt = self.place_here(group, members, Some((key, value)));
            if attempt.success {
                let left = match attempt.slots_left {
                    Some(left) => left,
                    None => largest.map_or(0, |shape| self.free_slots(shape, members)),
                };
                let better = best.is_none_or(|(_, placed, best_left)| {
                    let tighter = match self.options.scoring {
                        Scoring::BinPack => left < best_left,
                        Scoring::Spread => left > best_left,
                    };
                    attempt.placed > placed || (attempt.placed == placed && tighter)
                });
                if better {
                    best = Some((value, attempt.placed, left));
                }
            } else if best_failure.as_ref().is_none_or(|(_, reached, _)| attempt.reached > *reached) {
                best_failure = Some((value, attempt.reached, attempt.explanation));
            }
            self.rollback(checkpoint);
        }
        if let Some((value, _, _)) = best {
            let members = domains.remove(value).unwrap_or_default();
            return self.place_here(group, &members, Some((key, value)));
        }
        let (best, in_best, reached) = match best_failure {
            Some((value, reached, explanation)) => {
                (Some((value.to_string(), reached)), explanation.map(Box::new), reached)
            }
            None => (None, None, 0),
        };
        let kind = TopologyUnplaced {
            key: key.into(),
            pods,
            domains: u32::try_from(domains.len()).unwrap_or(u32::MAX),
            nodes_without_label,
            best,
            in_best,
        };
        Attempt::failed(reached, Explanation { group: group.name().to_string(), kind: ExplanationKind::Topology(kind) })
    }

    /// Label values of `key` on the nodes the leaves' admitted or bound pods are on (`None`
    /// for such a node without the label). Pods on nodes the snapshot lacks are ignored.
    fn occupied_domains(&self, leaves: &[&'a LeafGroup], key: &str) -> Vec<Option<&'a str>> {
        let mut out = BTreeSet::new();
        for pod in leaves.iter().flat_map(|l| l.pods.iter()) {
            let node = match &pod.state {
                PodState::Admitted { hostname } => self.snapshot.index_by_hostname(hostname),
                PodState::Bound { node } => self.snapshot.index_of(node),
                _ => None,
            };
            if let Some(i) = node {
                out.insert(self.node(i).labels.get(key));
            }
        }
        out.into_iter().collect()
    }
}
