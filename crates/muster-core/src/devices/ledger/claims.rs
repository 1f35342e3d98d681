//! The [`Ledger`] itself: which pod holds which GPUs of each node, assigned and released one
//! pod at a time, and how pod records become claims when it is rebuilt from the API.

use std::collections::HashMap;

use super::{Conflict, LedgerProblem, PodRecord, parse_indices};
use crate::devices::gpuset::{GpuSet, MAX_GPUS};

/// GPUs held by one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The node the GPUs are on.
    pub node: String,
    /// The GPU indices.
    pub gpus: GpuSet,
}

/// Which GPUs each live pod holds, per node.
///
/// Hash maps, not ordered ones: the GPU pass rebuilds the ledger of every GPU pod of the
/// cluster each admission cycle (10,000 pods at 5,000 nodes), and ordered maps keyed by UIDs
/// and node names spent most of that comparing strings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    claims: HashMap<String, Claim>,
    /// node -> who holds which of its GPUs; the inverse of `claims`, kept for conflict lookups.
    owners: HashMap<String, Holders>,
}

/// The holders of one node's GPUs: the union of their indices, and each index with its pod,
/// ascending by index (so equal ledgers compare equal whatever order they were built in).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Holders {
    used: GpuSet,
    by_index: Vec<(usize, String)>,
}

impl Holders {
    fn holder(&self, index: usize) -> Option<&str> {
        if !self.used.contains(index) {
            return None;
        }
        self.by_index.iter().find(|(i, _)| *i == index).map(|(_, uid)| uid.as_str())
    }

    fn hold(&mut self, gpus: GpuSet, uid: &str) {
        self.used = self.used.union(gpus);
        for i in gpus {
            let at = self.by_index.partition_point(|(j, _)| *j < i);
            self.by_index.insert(at, (i, uid.to_string()));
        }
    }

    fn free(&mut self, gpus: GpuSet) {
        self.used = self.used.difference(gpus);
        self.by_index.retain(|(i, _)| !gpus.contains(*i));
    }
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Ledger::default()
    }

    /// Records that `pod_uid` holds `gpus` on `node`, unless another pod holds one of them or
    /// the pod already holds a different set. Repeating an assignment is harmless.
    pub fn assign(&mut self, node: &str, pod_uid: &str, gpus: GpuSet) -> Result<(), Conflict> {
        if let Some(held) = self.claims.get(pod_uid) {
            if held.node == node && held.gpus == gpus {
                return Ok(());
            }
            return Err(Conflict::AlreadyAssigned {
                node: node.to_string(),
                pod_uid: pod_uid.to_string(),
                wanted: gpus,
                held: held.clone(),
            });
        }
        if gpus.is_empty() {
            return Ok(());
        }
        let owners = self.owners.get(node);
        if let Some(owners) = owners.filter(|o| !o.used.is_disjoint(gpus)) {
            let held: Vec<(usize, String)> =
                gpus.iter().filter_map(|i| owners.holder(i).map(|uid| (i, uid.to_string()))).collect();
            return Err(Conflict::IndexHeld {
                node: node.to_string(),
                pod_uid: pod_uid.to_string(),
                wanted: gpus,
                held,
            });
        }
        match self.owners.get_mut(node) {
            Some(owners) => owners.hold(gpus, pod_uid),
            None => {
                let mut owners = Holders::default();
                owners.hold(gpus, pod_uid);
                self.owners.insert(node.to_string(), owners);
            }
        }
        self.claims.insert(pod_uid.to_string(), Claim { node: node.to_string(), gpus });
        Ok(())
    }

    /// Frees the GPUs of `pod_uid` (finished or deleted) and returns what it held.
    pub fn release(&mut self, pod_uid: &str) -> Option<Claim> {
        let claim = self.claims.remove(pod_uid)?;
        if let Some(owners) = self.owners.get_mut(&claim.node) {
            owners.free(claim.gpus);
            if owners.by_index.is_empty() {
                self.owners.remove(&claim.node);
            }
        }
        Some(claim)
    }

    /// GPUs of `node` held by some pod.
    pub fn used_mask(&self, node: &str) -> GpuSet {
        self.owners.get(node).map_or(GpuSet::EMPTY, |o| o.used)
    }

    /// What `pod_uid` holds.
    pub fn claim(&self, pod_uid: &str) -> Option<&Claim> {
        self.claims.get(pod_uid)
    }

    /// The pod holding GPU `index` of `node`.
    pub fn holder(&self, node: &str, index: usize) -> Option<&str> {
        self.owners.get(node).and_then(|o| o.holder(index))
    }

    /// Every claim, by pod uid (in no particular order).
    pub fn claims(&self) -> impl Iterator<Item = (&str, &Claim)> {
        self.claims.iter().map(|(uid, c)| (uid.as_str(), c))
    }

    /// Applies what one pod's current state says: a pod that no longer holds GPUs (finished,
    /// or deleted before it was bound) frees them; a live pod with an annotation claims every
    /// GPU it names that no other pod holds. A live pod without the annotation changes
    /// nothing, so a claim made at admission survives until its patch shows up. Returns what
    /// is wrong with the record; a problem never costs the pod a GPU it could keep.
    pub fn observe(&mut self, pod: PodRecord<'_>) -> Vec<LedgerProblem> {
        if !pod.holds_gpus() {
            self.release(pod.uid);
            return Vec::new();
        }
        let Some(value) = pod.indices else {
            return Vec::new();
        };
        if pod.node.is_empty() {
            return vec![LedgerProblem::NoNode { uid: pod.uid.to_string() }];
        }
        let gpus = match parse_indices(value) {
            Ok(gpus) => gpus,
            Err(error) => {
                let (uid, node) = (pod.uid.to_string(), pod.node.to_string());
                return vec![LedgerProblem::BadAnnotation { uid, node, error }];
            }
        };
        let mut problems = Vec::new();
        let count = pod.node_gpus.min(MAX_GPUS);
        let beyond = gpus.difference(GpuSet::first(count));
        if !beyond.is_empty() {
            let (uid, node) = (pod.uid.to_string(), pod.node.to_string());
            problems.push(LedgerProblem::BeyondNode { uid, node, beyond, count: pod.node_gpus });
        }
        match self.assign(pod.node, pod.uid, gpus) {
            Ok(()) => {}
            Err(conflict) => {
                if let Conflict::IndexHeld { held, .. } = &conflict {
                    let contested = GpuSet::from_indices(held.iter().map(|(i, _)| *i)).unwrap_or(gpus);
                    // Disjoint from every other claim by construction, so this cannot fail.
                    let _ = self.assign(pod.node, pod.uid, gpus.difference(contested));
                }
                problems.push(conflict.into());
            }
        }
        problems
    }

    /// The ledger of the given pods (the live ones of the API), and every problem met.
    /// Records are taken oldest first whatever order they come in, so the same pods always
    /// give the same ledger: on a conflict the older pod keeps the GPU, then the lower uid.
    pub fn rebuild<'a>(pods: impl IntoIterator<Item = PodRecord<'a>>) -> (Ledger, Vec<LedgerProblem>) {
        let mut pods: Vec<PodRecord<'a>> = pods.into_iter().collect();
        pods.sort_by(|a, b| a.seniority().cmp(&b.seniority()));
        let mut ledger =
            Ledger { claims: HashMap::with_capacity(pods.len()), owners: HashMap::with_capacity(pods.len()) };
        let problems = pods.into_iter().flat_map(|p| ledger.observe(p)).collect();
        (ledger, problems)
    }
}

#[cfg(test)]
mod tests;
