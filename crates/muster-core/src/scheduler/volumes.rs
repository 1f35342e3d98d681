//! PURE: what a pod's PersistentVolumeClaims say about where it may run, as kube-scheduler's
//! VolumeBinding and VolumeZone plugins read them. A claim bound to a volume with node
//! affinity (a local disk, a zonal disk) allows only the nodes that affinity selects; a volume
//! labelled with a zone or region allows only nodes with that label value; a claim not bound
//! yet whose class binds `WaitForFirstConsumer` is bound where the pod goes, so it restricts
//! nothing (but the pods of one decision that share such a claim go where the first of them
//! goes: the volume is provisioned for that node, and kube-scheduler holds the others to it);
//! a claim that does not exist, or is unbound with `Immediate` binding, keeps the pod
//! out of every node until that changes.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

use super::shape::{NodeSelectorTerm, ShapeError};
use super::snapshot::{Labels, NodeInfo};

/// Zone and region labels VolumeZone compares between a volume and a node.
const ZONE_LABELS: [&str; 4] = [
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
];

/// Where one claim stands for scheduling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimState {
    /// Bound to a volume; the nodes that volume allows.
    Bound(VolumeNodes),
    /// Not bound; bound when a pod using it is scheduled (restricts nothing here).
    WaitForFirstConsumer,
    /// Keeps every pod that mounts it off every node, for this reason (kube-scheduler's words).
    Blocked(String),
}

/// The nodes a bound volume allows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeNodes {
    /// The volume's name.
    pub volume: String,
    /// Required node affinity terms (ORed); `None` allows every node.
    pub affinity: Option<Vec<NodeSelectorTerm>>,
    /// Zone and region labels: the node must have the label with one of these values.
    pub zones: Vec<(String, Vec<String>)>,
}

/// Why a node fails a bound volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeConflict {
    /// The volume's node affinity excludes the node.
    NodeAffinity,
    /// The volume's zone or region label does not match the node's.
    Zone,
}

impl VolumeNodes {
    /// Whether the node may use the volume, or why not.
    pub fn check(&self, node: &NodeInfo) -> Result<(), VolumeConflict> {
        if let Some(terms) = &self.affinity
            && !terms.iter().any(|t| t.matches(&node.name, &node.labels))
        {
            return Err(VolumeConflict::NodeAffinity);
        }
        for (key, values) in &self.zones {
            if !node.labels.get(key).is_some_and(|v| values.iter().any(|x| x == v)) {
                return Err(VolumeConflict::Zone);
            }
        }
        Ok(())
    }

    fn from_volume(pv: &PersistentVolume) -> Result<Self, ShapeError> {
        let affinity = pv
            .spec
            .as_ref()
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref())
            .map(super::shape::terms_from_k8s)
            .transpose()?;
        let labels: Labels = pv.metadata.labels.iter().flatten().collect();
        let zones = ZONE_LABELS
            .iter()
            .filter_map(|key| {
                // Several zones are written `a__b` (kube's volume helpers).
                labels.get(key).map(|v| (key.to_string(), v.split("__").map(String::from).collect()))
            })
            .collect();
        Ok(Self { volume: pv.metadata.name.clone().unwrap_or_default(), affinity, zones })
    }
}

/// Every claim's state, by namespace and name.
#[derive(Clone, Debug, Default)]
pub struct Volumes {
    claims: HashMap<(String, String), ClaimState>,
}

impl Volumes {
    /// The claims of the cluster, with the volumes they are bound to and their classes.
    pub fn from_cluster(
        claims: &[PersistentVolumeClaim],
        volumes: &[PersistentVolume],
        classes: &[StorageClass],
    ) -> Self {
        let volumes: HashMap<&str, &PersistentVolume> =
            volumes.iter().filter_map(|v| v.metadata.name.as_deref().map(|n| (n, v))).collect();
        let wait_for_consumer: HashMap<&str, bool> = classes
            .iter()
            .filter_map(|c| {
                let name = c.metadata.name.as_deref()?;
                Some((name, c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")))
            })
            .collect();
        let mut out = HashMap::with_capacity(claims.len());
        for claim in claims {
            let (Some(ns), Some(name)) = (claim.metadata.namespace.clone(), claim.metadata.name.clone()) else {
                continue;
            };
            let spec = claim.spec.as_ref();
            let state = if claim.metadata.deletion_timestamp.is_some() {
                ClaimState::Blocked(format!("persistentvolumeclaim \"{name}\" is being deleted"))
            } else {
                match spec.and_then(|s| s.volume_name.as_deref()).filter(|v| !v.is_empty()) {
                    Some(volume) => match volumes.get(volume) {
                        Some(pv) => match VolumeNodes::from_volume(pv) {
                            Ok(nodes) => ClaimState::Bound(nodes),
                            Err(e) => ClaimState::Blocked(format!("persistentvolume \"{volume}\": {e}")),
                        },
                        None => ClaimState::Blocked("pvc(s) bound to non-existent pv(s)".into()),
                    },
                    None => {
                        let class = spec.and_then(|s| s.storage_class_name.as_deref()).unwrap_or_default();
                        if wait_for_consumer.get(class).copied().unwrap_or(false) {
                            ClaimState::WaitForFirstConsumer
                        } else {
                            ClaimState::Blocked("pod has unbound immediate PersistentVolumeClaims".into())
                        }
                    }
                }
            };
            out.insert((ns, name), state);
        }
        Self { claims: out }
    }

    /// Whether a claim exists and waits for its first consumer (unbound, WaitForFirstConsumer).
    pub fn waits_for_consumer(&self, namespace: &str, name: &str) -> bool {
        matches!(self.claims.get(&(namespace.to_string(), name.to_string())), Some(ClaimState::WaitForFirstConsumer))
    }

    /// What the claims `names` of a pod in `namespace` allow: the bound volumes to check each
    /// node against, or the reason no node can take the pod.
    pub fn resolve(&self, namespace: &str, names: &[String]) -> Result<Vec<&VolumeNodes>, String> {
        let mut out = Vec::new();
        for name in names {
            match self.claims.get(&(namespace.to_string(), name.clone())) {
                None => return Err(format!("persistentvolumeclaim \"{name}\" not found")),
                Some(ClaimState::Blocked(why)) => return Err(why.clone()),
                Some(ClaimState::WaitForFirstConsumer) => {}
                Some(ClaimState::Bound(nodes)) => out.push(nodes),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::Resources;
    use serde_json::json;

    fn claim(name: &str, class: &str, volume: Option<&str>) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"storageClassName": class, "volumeName": volume, "accessModes": ["ReadWriteOnce"]}
        }))
        .expect("claim")
    }

    fn node(name: &str, labels: &[(&str, &str)]) -> NodeInfo {
        labels.iter().fold(NodeInfo::new(name, Resources::new()), |n, (k, v)| n.with_label(k, v))
    }

    #[test]
    fn claims_resolve_to_the_nodes_their_volumes_allow() {
        let local: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "local-1"},
            "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}}
        }))
        .unwrap();
        let zonal: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "disk-1", "labels": {"topology.kubernetes.io/zone": "a__b"}}
        }))
        .unwrap();
        let wffc: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": "wffc"}, "provisioner": "x", "volumeBindingMode": "WaitForFirstConsumer"
        }))
        .unwrap();
        let immediate: StorageClass =
            serde_json::from_value(json!({"metadata": {"name": "now"}, "provisioner": "x"})).unwrap();
        let v = Volumes::from_cluster(
            &[
                claim("local", "", Some("local-1")),
                claim("zonal", "", Some("disk-1")),
                claim("later", "wffc", None),
                claim("stuck", "now", None),
                claim("dangling", "", Some("gone")),
            ],
            &[local, zonal],
            &[wffc, immediate],
        );
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let bound = v.resolve("ns", &names(&["local", "later"])).unwrap();
        assert_eq!(bound.len(), 1, "a WaitForFirstConsumer claim restricts nothing");
        let n1 = node("n1", &[("kubernetes.io/hostname", "n1"), ("topology.kubernetes.io/zone", "b")]);
        let n2 = node("n2", &[("kubernetes.io/hostname", "n2"), ("topology.kubernetes.io/zone", "c")]);
        assert_eq!(bound[0].check(&n1), Ok(()));
        assert_eq!(bound[0].check(&n2), Err(VolumeConflict::NodeAffinity));
        let zonal = v.resolve("ns", &names(&["zonal"])).unwrap();
        assert_eq!(zonal[0].check(&n1), Ok(()), "zone b is one of a__b");
        assert_eq!(zonal[0].check(&n2), Err(VolumeConflict::Zone));
        assert_eq!(
            v.resolve("ns", &names(&["missing"])),
            Err("persistentvolumeclaim \"missing\" not found".to_string())
        );
        assert_eq!(
            v.resolve("other", &names(&["local"])),
            Err("persistentvolumeclaim \"local\" not found".to_string()),
            "claims are namespaced"
        );
        assert_eq!(
            v.resolve("ns", &names(&["stuck"])),
            Err("pod has unbound immediate PersistentVolumeClaims".to_string())
        );
        assert_eq!(v.resolve("ns", &names(&["dangling"])), Err("pvc(s) bound to non-existent pv(s)".to_string()));
    }
}
