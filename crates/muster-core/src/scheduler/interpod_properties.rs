//! Property tests for the rules that relate pods to other pods: on random small clusters
//! (zones, racks, pods already running, some of them with anti-affinity or host ports) and
//! random gangs (anti-affinity, co-location, topology spread with minDomains and inclusion
//! policies, host ports), every plan passes kube-scheduler's filters pod by pod, including
//! kube-scheduler's view after the pin, and the engine admits a gang exactly when a brute-force
//! search over every sequence of nodes finds a placement. The checker below is written from
//! the plugins' definitions, independently of the engine.

use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use muster_api::{ADMISSION_GATE, GPU_RESOURCE, HOSTNAME_LABEL, POD_GROUP_LABEL};

const ZONE: &str = "topology.kubernetes.io/zone";
/// Cores per node; pods ask for one core, so a node takes at most this many.
const CORES: i64 = 2;

#[derive(Clone, Debug)]
struct Existing {
    node: usize,
    app: &'static str,
    /// Anti-affinity against `train` pods on this key.
    anti: Option<&'static str>,
    host_port: bool,
}

#[derive(Clone, Debug)]
struct GangSpec {
    pods: usize,
    min: usize,
    /// Required anti-affinity against its own pods on this key.
    anti: Option<&'static str>,
    /// Required co-location with its own pods (or with `db` pods) on the zone key.
    affinity: Option<&'static str>,
    /// (maxSkew, minDomains, honor node affinity, honor taints).
    spread: Option<(i32, i32, bool, bool)>,
    host_port: bool,
    /// Only nodes of zone a (a node selector).
    zone_a_only: bool,
}

#[derive(Clone, Debug)]
struct Case {
    zones: Vec<u8>,
    tainted: Vec<bool>,
    existing: Vec<Existing>,
    gang: GangSpec,
}

fn key_of(k: u8) -> &'static str {
    if k == 0 { HOSTNAME_LABEL } else { ZONE }
}

fn arb_case() -> impl Strategy<Value = Case> {
    let nodes = 1..=4usize;
    nodes
        .prop_flat_map(|n| {
            let existing = (0..n, 0..3u8, prop::option::weighted(0.3, 0..2u8), prop::bool::weighted(0.2)).prop_map(
                |(node, app, anti, host_port)| Existing {
                    node,
                    app: ["train", "db", "web"][usize::from(app)],
                    anti: anti.map(key_of),
                    host_port,
                },
            );
            let gang = (
                (1..=4usize, 0..=1usize),
                prop::option::weighted(0.4, 0..2u8),
                prop::option::weighted(0.3, any::<bool>()),
                prop::option::weighted(0.5, (1..=2i32, 1..=3i32, any::<bool>(), any::<bool>())),
                prop::bool::weighted(0.2),
                prop::bool::weighted(0.15),
            )
                .prop_map(|((pods, less), anti, affinity, spread, host_port, zone_a_only)| GangSpec {
                    pods,
                    min: pods.saturating_sub(less).max(1),
                    anti: anti.map(key_of),
                    affinity: affinity.map(|own| if own { "train" } else { "db" }),
                    spread,
                    host_port,
                    zone_a_only,
                });
            (
                prop::collection::vec(0..3u8, n),
                prop::collection::vec(prop::bool::weighted(0.2), n),
                prop::collection::vec(existing, 0..=3),
                gang,
            )
        })
        .prop_map(|(zones, tainted, existing, gang)| Case { zones, tainted, existing, gang })
}

fn zone(z: u8) -> &'static str {
    ["a", "b", "c"][usize::from(z)]
}

fn anti_json(key: &str) -> Value {
    json!([{"topologyKey": key, "labelSelector": {"matchLabels": {"app": "train"}}}])
}

impl Case {
    fn nodes(&self) -> Vec<NodeInfo> {
        let allocatable = Resources::new().with(CPU, CORES * 1000).with(PODS, 110).with(GPU_RESOURCE, 8);
        self.zones
            .iter()
            .zip(&self.tainted)
            .enumerate()
            .map(|(i, (&z, &t))| {
                let n = NodeInfo::new(&format!("n{i}"), allocatable.clone()).with_label(ZONE, zone(z));
                if t { n.with_taint(Taint::new("spot", "", TaintEffect::NoSchedule)) } else { n }
            })
            .collect()
    }

    fn existing_pods(&self) -> Vec<Pod> {
        self.existing
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let mut spec = json!({"nodeName": format!("n{}", e.node),
                    "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]});
                if let Some(key) = e.anti {
                    spec["affinity"] =
                        json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": anti_json(key)}});
                }
                if e.host_port {
                    spec["containers"][0]["ports"] = json!([{"containerPort": 80, "hostPort": 8080}]);
                }
                serde_json::from_value(json!({"metadata": {"name": format!("e{i}"), "namespace": "ns",
                    "labels": {"app": e.app}}, "spec": spec}))
                .expect("pod")
            })
            .collect()
    }

    fn gang_spec(&self) -> Value {
        let g = &self.gang;
        let mut spec = json!({"schedulingGates": [{"name": ADMISSION_GATE}],
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]});
        let mut affinity = json!({});
        if let Some(key) = g.anti {
            affinity["podAntiAffinity"] = json!({"requiredDuringSchedulingIgnoredDuringExecution": anti_json(key)});
        }
        if let Some(app) = g.affinity {
            affinity["podAffinity"] = json!({"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": ZONE, "labelSelector": {"matchLabels": {"app": app}}}]});
        }
        spec["affinity"] = affinity;
        if let Some((skew, min_domains, honor_affinity, honor_taints)) = g.spread {
            spec["topologySpreadConstraints"] = json!([{"maxSkew": skew, "topologyKey": ZONE,
                "whenUnsatisfiable": "DoNotSchedule", "minDomains": min_domains,
                "labelSelector": {"matchLabels": {"app": "train"}},
                "nodeAffinityPolicy": if honor_affinity { "Honor" } else { "Ignore" },
                "nodeTaintsPolicy": if honor_taints { "Honor" } else { "Ignore" }}]);
        }
        if g.host_port {
            spec["containers"][0]["ports"] = json!([{"containerPort": 80, "hostPort": 8080}]);
        }
        if g.zone_a_only {
            spec["nodeSelector"] = json!({ZONE: "a"});
        }
        spec
    }

    fn tree(&self) -> GroupTree {
        let mut leaf =
            LeafGroup::new("train", LeafPolicy::Gang { min_count: u32::try_from(self.gang.min).unwrap_or(1) });
        for i in 0..self.gang.pods {
            let pod: Pod = serde_json::from_value(json!({"metadata": {"name": format!("p{i}"), "namespace": "ns",
                "uid": format!("u{i}"), "labels": {"app": "train", POD_GROUP_LABEL: "train"}}, "spec": self.gang_spec()}))
            .expect("pod");
            leaf.add_pod(&pod);
        }
        GroupTree::new("ns", leaf)
    }

    fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot::new(self.nodes());
        for p in self.existing_pods() {
            s.add_pod(&p);
        }
        s
    }

    /// kube-scheduler's filters for the next gang pod on node `n`, given the gang pods placed
    /// so far (`placed`, node indexes), written from the plugins' definitions.
    fn kube_fits(&self, placed: &[usize], n: usize) -> bool {
        let g = &self.gang;
        let zones: Vec<&str> = self.zones.iter().map(|&z| zone(z)).collect();
        let nodes = zones.len();
        // (node, app, anti key, host port) of every pod there.
        let mut pods: Vec<(usize, &str, Option<&str>, bool)> =
            self.existing.iter().map(|e| (e.node, e.app, e.anti, e.host_port)).collect();
        pods.extend(placed.iter().map(|&p| (p, "train", g.anti, g.host_port)));
        let same =
            |key: &str, a: usize, b: usize| key == HOSTNAME_LABEL && a == b || key == ZONE && zones[a] == zones[b];
        let tolerated = !self.tainted[n];
        let selected = |m: usize| !g.zone_a_only || zones[m] == "a";
        if !tolerated || !selected(n) {
            return false;
        }
        if pods.iter().filter(|p| p.0 == n).count() as i64 >= CORES {
            return false;
        }
        if g.host_port && pods.iter().any(|p| p.0 == n && p.3) {
            return false;
        }
        if let Some((skew, min_domains, honor_affinity, honor_taints)) = g.spread {
            let eligible = |m: usize| (!honor_affinity || selected(m)) && (!honor_taints || !self.tainted[m]);
            let mut counts: std::collections::BTreeMap<&str, i64> = Default::default();
            for m in (0..nodes).filter(|&m| eligible(m)) {
                *counts.entry(zones[m]).or_default() +=
                    pods.iter().filter(|p| p.0 == m && p.1 == "train").count() as i64;
            }
            let min = if (counts.len() as i32) < min_domains { 0 } else { counts.values().copied().min().unwrap_or(0) };
            if counts.get(zones[n]).copied().unwrap_or(0) + 1 - min > i64::from(skew) {
                return false;
            }
            // After the pin, with Honor, kube-scheduler counts node n alone.
            let on_n = pods.iter().filter(|p| p.0 == n && p.1 == "train").count() as i64;
            if honor_affinity && min_domains > 1 && on_n + 1 > i64::from(skew) {
                return false;
            }
        }
        if let Some(app) = g.affinity {
            let matching: Vec<usize> = pods.iter().filter(|p| p.1 == app).map(|p| p.0).collect();
            let near = matching.iter().any(|&m| same(ZONE, m, n));
            if !(near || matching.is_empty() && app == "train") {
                return false;
            }
        }
        if let Some(key) = g.anti
            && pods.iter().any(|p| p.1 == "train" && same(key, p.0, n))
        {
            return false;
        }
        // Pods there whose anti-affinity refuses train pods.
        !pods.iter().any(|p| p.2.is_some_and(|key| same(key, p.0, n)))
    }

    /// Whether some sequence of `min` nodes passes the filters pod by pod.
    fn brute_force(&self, placed: &mut Vec<usize>) -> bool {
        if placed.len() == self.gang.min {
            return true;
        }
        for n in 0..self.zones.len() {
            if self.kube_fits(placed, n) {
                placed.push(n);
                if self.brute_force(placed) {
                    return true;
                }
                placed.pop();
            }
        }
        false
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn plans_pass_kube_scheduler_filters_and_admit_exactly_what_fits(case in arb_case()) {
        let d = place(&case.snapshot(), &case.tree(), &PlaceOptions::default(), &LowestFreeIndices);
        let mut placed = Vec::new();
        for p in &d.plan {
            let n: usize = p.node.trim_start_matches('n').parse().expect("node index");
            prop_assert!(case.kube_fits(&placed, n), "pod {} on {} breaks a filter after {:?}: {:?}", p.pod, p.node, placed, case);
            placed.push(n);
        }
        let fits = case.brute_force(&mut Vec::new());
        prop_assert_eq!(d.admitted, fits, "engine {} vs brute force {}: {} {:?}", d.admitted, fits, d.message(), case);
        if d.admitted {
            prop_assert!(d.plan.len() >= case.gang.min);
        } else {
            prop_assert!(d.plan.is_empty(), "a gang that does not fit places nothing");
        }
    }
}
