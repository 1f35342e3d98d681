//! The ledger kept across passes: only the nodes whose pods' records changed are built again.

use std::collections::HashMap;

use k8s_openapi::jiff::Timestamp;

use super::{Ledger, LedgerProblem, PodPhase, PodRecord};

/// The ledger kept across passes: each node's part is built again only when the records of
/// the pods on it changed (a pod came, went, or its annotation, phase, binding, termination,
/// confirmation or its node's GPU count moved), so a pass over 10,000 GPU pods of which a
/// handful changed claims the GPUs of a handful of nodes, not of all.
///
/// Always equal to [`Ledger::rebuild`] of the same records (a property test checks it): the
/// claims of the pods on one node never touch another node's, and a node's records are
/// observed in the rebuild's order (oldest first, see `PodRecord::seniority`). Each record is a
/// different pod (UIDs are unique, as the API's are).
#[derive(Clone, Debug, Default)]
pub struct KeptLedger {
    ledger: Ledger,
    /// Per node (`""` for records without one): its pods' records as last observed, by UID,
    /// and the problems met then.
    nodes: HashMap<String, NodePart>,
}

#[derive(Clone, Debug, Default)]
struct NodePart {
    records: Vec<KeptRecord>,
    problems: Vec<LedgerProblem>,
}

/// A [`PodRecord`] kept between passes (its node is the part's).
#[derive(Clone, Debug, PartialEq, Eq)]
struct KeptRecord {
    uid: String,
    created: Option<Timestamp>,
    indices: Option<String>,
    phase: PodPhase,
    bound: bool,
    terminating: bool,
    node_gpus: usize,
    confirmed: bool,
}

impl KeptRecord {
    fn of(r: &PodRecord<'_>) -> Self {
        KeptRecord {
            uid: r.uid.to_string(),
            created: r.created,
            indices: r.indices.map(str::to_string),
            phase: r.phase,
            bound: r.bound,
            terminating: r.terminating,
            node_gpus: r.node_gpus,
            confirmed: r.confirmed,
        }
    }

    fn is(&self, r: &PodRecord<'_>) -> bool {
        self.uid == r.uid
            && self.created == r.created
            && self.indices.as_deref() == r.indices
            && self.phase == r.phase
            && self.bound == r.bound
            && self.terminating == r.terminating
            && self.node_gpus == r.node_gpus
            && self.confirmed == r.confirmed
    }
}

impl KeptLedger {
    /// Takes the records of every live pod now (as [`Ledger::rebuild`] would) and brings the
    /// ledger up to date with them: the nodes whose records changed since the last update are
    /// built again, the others kept. Returns how many nodes were built again.
    pub fn update<'a>(&mut self, pods: impl IntoIterator<Item = PodRecord<'a>>) -> usize {
        let mut by_node: HashMap<&'a str, Vec<PodRecord<'a>>> = HashMap::with_capacity(self.nodes.len());
        for pod in pods {
            by_node.entry(pod.node).or_default().push(pod);
        }
        for records in by_node.values_mut() {
            records.sort_unstable_by(|a, b| a.uid.cmp(b.uid));
        }
        let same = |part: &NodePart, now: &[PodRecord<'_>]| {
            part.records.len() == now.len() && part.records.iter().zip(now).all(|(kept, r)| kept.is(r))
        };
        let stale: Vec<String> = self
            .nodes
            .iter()
            .filter(|(node, part)| by_node.get(node.as_str()).is_none_or(|now| !same(part, now)))
            .map(|(node, _)| node.clone())
            .collect();
        // Every claim of the stale parts goes first: a pod that moved to another node claims
        // there only once it no longer holds GPUs here.
        for node in &stale {
            if let Some(part) = self.nodes.remove(node) {
                for kept in &part.records {
                    self.ledger.release(&kept.uid);
                }
            }
        }
        let mut built = 0;
        for (node, mut records) in by_node {
            if self.nodes.contains_key(node) {
                continue;
            }
            built += 1;
            let kept = records.iter().map(KeptRecord::of).collect();
            records.sort_by(|a, b| a.seniority().cmp(&b.seniority()));
            let problems = records.into_iter().flat_map(|p| self.ledger.observe(p)).collect();
            self.nodes.insert(node.to_string(), NodePart { records: kept, problems });
        }
        built
    }

    /// The ledger as of the last update.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Every problem met by the records of the last update (in no particular order).
    pub fn problems(&self) -> impl Iterator<Item = &LedgerProblem> {
        self.nodes.values().flat_map(|part| part.problems.iter())
    }
}

#[cfg(test)]
mod tests;
