//! The filter pass: every node checked for one shape in kube-scheduler's filter order, the
//! reasons of those that fail tallied, and those that fit scored ([`Candidate`]).

use std::cmp::Ordering;

use super::{Avoid, Engine, PodLevel, ReasonKey, Tally};
use crate::scheduler::shape::PodShape;
use crate::scheduler::volumes::VolumeConflict;

/// A node that can take at least one pod of a shape.
#[derive(Clone, Copy)]
pub(super) struct Candidate {
    pub(super) node: u32,
    pub(super) fit: u32,
    pub(super) score: u32,
    /// Raw inter-pod preferences for one pod (preferred terms, `ScheduleAnyway` spread),
    /// normalised over the candidates before they are ranked; 0 for interchangeable pods.
    pub(super) preference: i64,
}

pub(super) fn by_score(a: &Candidate, b: &Candidate) -> Ordering {
    b.score.cmp(&a.score).then(a.node.cmp(&b.node))
}

/// Which nodes can take pods of one shape, and why the others cannot.
pub(super) struct Scan<'a> {
    pub(super) candidates: Vec<Candidate>,
    pub(super) tally: Tally<'a>,
    pub(super) nodes: u32,
}

/// How many feasible nodes a one-pod scan looks for before it stops: every node of a cluster
/// under 100 nodes, else kube-scheduler's adaptive share (50% less 1% per 125 nodes, at least
/// 5%), at least 100.
fn feasible_nodes_to_find(nodes: usize) -> usize {
    if nodes < 100 {
        return nodes;
    }
    let percent = 50usize.saturating_sub(nodes / 125).max(5);
    (nodes * percent / 100).max(100)
}

impl<'a> Engine<'a> {
    /// Filters every node for one shape (kube's order: unschedulable, taints, affinity,
    /// host ports, resources, volumes, topology spread, inter-pod affinity, then GPU
    /// indices) and scores those that fit. With `pod`, the rules relating that one pod to
    /// others are checked too (each candidate then takes one pod).
    pub(super) fn scan(&self, shape: &'a PodShape, nodes: &[u32], pod: Option<&PodLevel<'a>>) -> Scan<'a> {
        let tolerates_unschedulable = shape.tolerates_unschedulable();
        let mut scan = Scan { candidates: Vec::new(), tally: Tally::default(), nodes: 0 };
        let facts = self.facts.of(shape);
        // A claim (volume or DRA) that keeps the pod off every node: every node fails for it.
        let off_everywhere = |mut scan: Scan<'a>, reason: ReasonKey<'a>| {
            scan.nodes = u32::try_from(nodes.len()).unwrap_or(u32::MAX);
            for _ in nodes {
                scan.tally.add(reason);
            }
            scan
        };
        let volumes = match facts.map(|f| &f.volumes) {
            Some(Err(why)) => return off_everywhere(scan, ReasonKey::Volume(why)),
            Some(Ok(v)) => v.as_slice(),
            None => &[],
        };
        let resource_claims = match facts.map(|f| &f.resource_claims) {
            Some(Err(why)) => return off_everywhere(scan, ReasonKey::Claim(why)),
            Some(Ok(c)) => Some(c),
            None => None,
        };
        // One pod at a time, like kube-scheduler: stop once enough feasible nodes are found,
        // and start where the last pod's scan stopped (kube's numFeasibleNodesToFind and
        // nextStartNodeIndex), so a gang of many pods costs what kube-scheduler's cycles do.
        let (start, enough) = match pod {
            Some(_) if !nodes.is_empty() => (self.rotation.get() % nodes.len(), feasible_nodes_to_find(nodes.len())),
            _ => (0, usize::MAX),
        };
        for &i in nodes[start..].iter().chain(&nodes[..start]) {
            if scan.candidates.len() >= enough {
                break;
            }
            scan.nodes += 1;
            let node = self.node(i);
            if let Some(u) = node.unusable {
                scan.tally.add(ReasonKey::Unusable(u));
                continue;
            }
            match self.avoided[i as usize] {
                Avoid::No => {}
                Avoid::Refused => {
                    scan.tally.add(ReasonKey::RefusedEarlier);
                    continue;
                }
                Avoid::Reserved => {
                    scan.tally.add(ReasonKey::Reserved);
                    continue;
                }
            }
            if node.unschedulable && !tolerates_unschedulable {
                scan.tally.add(ReasonKey::Unschedulable);
                continue;
            }
            if let Some(t) = shape.untolerated_taint(node) {
                scan.tally.add(ReasonKey::Taint(&t.key, &t.value));
                continue;
            }
            if !shape.matches_node(node) {
                scan.tally.add(ReasonKey::NodeAffinity);
                continue;
            }
            if pod.is_some_and(|p| !p.ports_free(self, i)) {
                scan.tally.add(ReasonKey::HostPorts);
                continue;
            }
            let mut fit = self.resource_fit(i, &shape.requests);
            if fit == 0 {
                self.tally_insufficient(i, &shape.requests, &mut scan.tally);
                continue;
            }
            if let Some(conflict) = volumes.iter().find_map(|v| v.check(node).err()) {
                scan.tally.add(match conflict {
                    VolumeConflict::NodeAffinity => ReasonKey::VolumeNodeAffinity,
                    VolumeConflict::Zone => ReasonKey::VolumeZone,
                });
                continue;
            }
            if resource_claims.is_some_and(|c| !c.reaches(node)) {
                scan.tally.add(ReasonKey::ClaimReach);
                continue;
            }
            let mut preference = 0;
            if let Some(pod) = pod {
                if let Err(reason) = pod.check(node, i) {
                    scan.tally.add(reason);
                    continue;
                }
                fit = 1;
                preference = pod.preference(node);
            }
            let mut gpu_score = 0;
            // GPUs of a DRA claim count in the utilisation like `nvidia.com/gpu` does.
            let mut claim_gpus = 0;
            if let Some((count, offered)) = self.gpu_need(shape, i) {
                if shape.gpus == 0 {
                    claim_gpus = count;
                }
                let gpu_fit = offered.difference(self.gpu_used(i)).len() as u32 / count;
                fit = fit.min(u64::from(gpu_fit));
                match self.choose_gpus(i, count, offered) {
                    Some(choice) if fit > 0 => gpu_score = u32::from(choice.score),
                    _ => {
                        let dra = shape.gpus == 0;
                        scan.tally.add(if dra { ReasonKey::ClaimDevices } else { ReasonKey::GpuIndices });
                        continue;
                    }
                }
            }
            let score = self.resource_score(i, &shape.requests, claim_gpus) * self.options.resource_weight
                + gpu_score * self.options.gpu_weight;
            scan.candidates.push(Candidate { node: i, fit: u32::try_from(fit).unwrap_or(u32::MAX), score, preference });
        }
        if pod.is_some() && !nodes.is_empty() {
            self.rotation.set((start + scan.nodes as usize) % nodes.len());
        }
        scan
    }
}
