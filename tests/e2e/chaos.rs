//! The chaos suite (issue 15). Many gangs of mixed sizes (1, 2, 4 and 8 GPUs a pod on 8-GPU
//! kwok nodes, more than fit at once), some with a rack or zone constraint, in both disruption
//! modes, a MusterJobSet or more, and a few gangs that can never fit; muster killed with SIGKILL
//! at random moments, first as a single replica (restarted as the same pod, or as a new one that
//! waits for the Lease), then as two replicas whose leader is killed and replaced by a new pod;
//! nodes removed in between; then pods deleted under it. Once the cluster has settled it counts,
//! prints and asserts:
//!
//! - `partly_bound`: gang attempts (a MusterJob's live pods of one `batch.muster.dev/gang-attempt`;
//!   a set's live pods) with some pods bound, fewer than the gang needs (minCount, or for a set
//!   every child group at its minCount), while others are still unbound (gated, or pinned and
//!   not bound). Finished pods, pods being deleted and rolled-back pods do not count. A gang in
//!   disruption mode `single` that lost a running pod to this test runs on with fewer by design
//!   (`degraded`, not counted); in mode `all` the loss must take the whole attempt down.
//! - `double_held`: GPU indices (`gpu.muster.dev/indices`) held by two pods on one node, over
//!   every pod not finished that is bound there or pinned there and ungated (also while
//!   terminating: a terminating pod keeps its GPUs until it is gone). Sampled during the chaos too.
//! - `gone_holding`: 5 s after pods are deleted, and at the end, GPUs that the leader's
//!   `muster_gpus_allocated{node}` counts beyond what existing pods hold there (the union of their
//!   indices; a deleted node's pods are gone with it).
//! - `unadmitted_fitting`: gangs still short of minCount (wholly gated, or degraded) whose missing
//!   pods could be placed in the free GPUs of the pool now (8 minus the larger of the GPUs
//!   requested and the indices held by the pods on each node, in one domain when constrained,
//!   avoiding the nodes muster's rollback history avoids). Placed by best fit, so a gang counted
//!   here surely fits; one muster holds back after repeated rollbacks (`rollback_backoff`) is not.
//! - `impossible_started`: pods of the gangs that can never fit that were ungated or bound.
//! - `stuck_pinned`: pods pinned and ungated but not bound for longer than the bind timeout plus
//!   30 s while settling; `crashed`: replicas that exited without being killed.
//!
//! The seed (`MUSTER_CHAOS_SEED`, else random) is printed first and in every failure; it
//! replays the workload, the chaos schedule and the random picks, not muster's timing. Sizes come
//! from `MUSTER_CHAOS_PROFILE` (`short`, the default, inside `make test`; `long` for `make chaos`)
//! and `MUSTER_CHAOS_{NODES,GANGS,SETS,KILLS,MODES,REMOVE_NODES,DELETE_ROUNDS,DELETE_PODS,SETTLE}`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use muster::controllers::devices::gpus_wanted;
use muster::controllers::job::plan::GANG_ATTEMPT_ANNOTATION;
use muster::crds::scheduling::{AdmissionPlan, AvoidedNode, CompositePodGroup, PlanState};
use muster::crds::{JOB_NAME_LABEL, JOBSET_NAME_LABEL, PodGroup, REPLICATED_JOB_LABEL, ROLLED_BACK_ANNOTATION};
use muster::scheduler::{RollbackHistory, RollbackPolicy};
use muster_dev::{FakeGpuNodes, RACK_LABEL, ZONE_LABEL};
use serde_json::{Value, json};

use crate::gangs::{gated, indices_of, merge, node_of, phase, pin_of};
use crate::harness::pools::{NodePool, POOL_LABEL};
use crate::harness::replicas::{MusterReplicas, Wait};
use crate::harness::{client, cluster, kubectl, namespace, try_kubectl_apply};

/// muster's bind timeout here (seconds): a pin that cannot bind is rolled back well within the
/// settle time.
const BIND_TIMEOUT: u64 = 15;
/// GPUs of every node.
const NODE_GPUS: u32 = 8;
/// How long after a deletion muster's GPU gauges must be right.
const GONE_WITHIN: Duration = Duration::from_secs(5);
/// Consecutive clean samples (one a second) that end the settling.
const CLEAN_SAMPLES: u32 = 3;

// === the seeded random source ===

/// splitmix64: tiny, seedable, good enough to pick sizes and moments.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo { lo } else { lo + self.next() % (hi - lo + 1) }
    }

    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.range(0, items.len() as u64 - 1) as usize]
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.range(0, i as u64) as usize);
        }
    }

    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }
}

// === the profile ===

/// Sizes of one run.
#[derive(Clone, Debug)]
struct Profile {
    name: String,
    seed: u64,
    nodes: u32,
    racks: u32,
    zones: u32,
    gangs: u32,
    sets: u32,
    /// Kills of the single replica.
    single_kills: u32,
    /// Kills of the leader of two replicas.
    leader_kills: u32,
    modes: String,
    remove_nodes: u32,
    delete_rounds: u32,
    delete_pods: u32,
    /// Longest random wait before a kill.
    max_kill_delay_ms: u64,
    settle: Duration,
}

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(value.trim().parse().unwrap_or_else(|_| panic!("{name}={value:?} is not a number")))
}

impl Profile {
    fn from_env() -> Self {
        let name = std::env::var("MUSTER_CHAOS_PROFILE").unwrap_or_else(|_| "short".into());
        let long = match name.as_str() {
            "short" => false,
            "long" => true,
            other => panic!("MUSTER_CHAOS_PROFILE={other:?}: want short or long"),
        };
        let seed = env_number("MUSTER_CHAOS_SEED").unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            (nanos.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)) % 1_000_000_000_000
        });
        let pick = |var: &str, short: u64, long_value: u64| {
            env_number(&format!("MUSTER_CHAOS_{var}")).unwrap_or(if long { long_value } else { short }) as u32
        };
        let nodes = pick("NODES", 12, 40).max(4);
        let kills = pick("KILLS", 4, 20);
        let modes = std::env::var("MUSTER_CHAOS_MODES").unwrap_or_else(|_| "single,leader".into());
        let (single, leader) = (modes.contains("single"), modes.contains("leader"));
        let leader_kills = match (single, leader) {
            (true, true) => (kills / 3).max(1).min(kills),
            (false, true) => kills,
            _ => 0,
        };
        Profile {
            seed,
            nodes,
            // Racks of about 4 (short) or 8 (long) nodes, in two zones.
            racks: (nodes / if long { 8 } else { 4 }).max(2),
            zones: 2,
            gangs: pick("GANGS", 16, 60).max(2),
            sets: pick("SETS", 1, 3),
            single_kills: kills - leader_kills,
            leader_kills,
            modes,
            remove_nodes: pick("REMOVE_NODES", 1, 4).min(nodes / 2),
            delete_rounds: pick("DELETE_ROUNDS", 2, 6),
            delete_pods: pick("DELETE_PODS", 3, 5),
            max_kill_delay_ms: if long { 8000 } else { 3000 },
            settle: Duration::from_secs(pick("SETTLE", 120, 240).into()),
            name,
        }
    }

    /// The environment that replays this run.
    fn replay(&self) -> String {
        format!(
            "MUSTER_CHAOS_PROFILE={} MUSTER_CHAOS_SEED={} MUSTER_CHAOS_NODES={} MUSTER_CHAOS_GANGS={} \
             MUSTER_CHAOS_SETS={} MUSTER_CHAOS_KILLS={} MUSTER_CHAOS_MODES={} MUSTER_CHAOS_REMOVE_NODES={} \
             MUSTER_CHAOS_DELETE_ROUNDS={} MUSTER_CHAOS_DELETE_PODS={} MUSTER_CHAOS_SETTLE={} \
             MUSTER_K8S_BIN=$(bash tools/k8s/bindir.sh) cargo test --test e2e -- --nocapture chaos::",
            self.name,
            self.seed,
            self.nodes,
            self.gangs,
            self.sets,
            self.single_kills + self.leader_kills,
            self.modes,
            self.remove_nodes,
            self.delete_rounds,
            self.delete_pods,
            self.settle.as_secs()
        )
    }

    /// Nodes of the smallest rack and of the smallest zone (rack `i mod racks`, zone `rack mod zones`).
    fn smallest_domains(&self) -> (u32, u32, u32) {
        let count = |f: &dyn Fn(u32) -> bool| (0..self.nodes).filter(|&i| f(i)).count() as u32;
        let rack_min = (0..self.racks).map(|r| count(&|i| i % self.racks == r)).min().unwrap_or(0);
        let rack_max = (0..self.racks).map(|r| count(&|i| i % self.racks == r)).max().unwrap_or(0);
        let zone_min = (0..self.zones).map(|z| count(&|i| (i % self.racks) % self.zones == z)).min().unwrap_or(0);
        (rack_min, rack_max, zone_min)
    }
}

// === the workload ===

/// One group of a gang: a MusterJob, or one replicated job of a set.
#[derive(Clone, Debug)]
struct Member {
    /// The MusterJob's name, or the replicated job's.
    name: String,
    pods: u32,
    gpus: u32,
    min_count: u32,
}

/// One gang: a MusterJob, or a MusterJobSet whose children start together.
#[derive(Clone, Debug)]
struct Gang {
    name: String,
    set: bool,
    members: Vec<Member>,
    topology: Option<&'static str>,
    mode: &'static str,
    /// Can never fit, even on the whole pool.
    impossible: bool,
    /// `sim.muster.dev/succeed-after` seconds, if the gang finishes by itself.
    finish_after: Option<u64>,
}

/// Pods of `gpus` GPUs that fit on `nodes` empty nodes.
fn slots(nodes: u32, gpus: u32) -> u32 {
    nodes * (NODE_GPUS / gpus)
}

impl Gang {
    fn gpus(&self) -> u32 {
        self.members.iter().map(|m| m.pods * m.gpus).sum()
    }

    fn shape(&self) -> String {
        let members: Vec<String> = self
            .members
            .iter()
            .map(|m| {
                let min = if m.min_count < m.pods { format!(" min {}", m.min_count) } else { String::new() };
                format!("{}x{} GPU{min}", m.pods, m.gpus)
            })
            .collect();
        let topology = self.topology.map(|t| format!(", one {t}")).unwrap_or_default();
        format!("{} ({}{topology}, {})", self.name, members.join(" + "), self.mode)
    }

    fn manifest(&self, pool: &NodePool) -> Value {
        let pod = |gpus: u32| {
            let mut spec = json!({
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "registry.invalid/none",
                    "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}],
            });
            merge(&mut spec, pool.placement());
            let annotations = match self.finish_after {
                Some(s) => json!({"sim.muster.dev/succeed-after": format!("{s}s")}),
                None => json!({}),
            };
            json!({"metadata": {"annotations": annotations}, "spec": spec})
        };
        let mut scheduling = json!({"disruptionMode": {self.mode: {}}});
        if let Some(key) = self.topology {
            scheduling["schedulingConstraints"] = json!({"topology": [{"key": key}]});
        }
        if !self.set {
            let m = &self.members[0];
            scheduling["schedulingPolicy"] = json!({"gang": {"minCount": m.min_count}});
            return json!({
                "apiVersion": "batch.muster.dev/v1alpha1",
                "kind": "MusterJob",
                "metadata": {"name": self.name},
                "spec": {
                    "parallelism": m.pods, "completions": m.pods, "completionMode": "Indexed",
                    "backoffLimit": 1000, "scheduling": scheduling, "template": pod(m.gpus),
                },
            });
        }
        scheduling["schedulingPolicy"] = json!({"gang": {}});
        let jobs: Vec<Value> = self
            .members
            .iter()
            .map(|m| {
                let mut spec = json!({
                    "parallelism": m.pods, "completions": m.pods, "completionMode": "Indexed",
                    "backoffLimit": 1000, "template": pod(m.gpus),
                });
                if m.pods > 1 {
                    spec["scheduling"] = json!({"schedulingPolicy": {"gang": {"minCount": m.min_count}}});
                }
                json!({"name": m.name, "replicas": 1, "template": {"spec": spec}})
            })
            .collect();
        json!({
            "apiVersion": "batch.muster.dev/v1alpha1",
            "kind": "MusterJobSet",
            "metadata": {"name": self.name},
            "spec": {"scheduling": scheduling, "failurePolicy": {"maxRestarts": 1000}, "replicatedJobs": jobs},
        })
    }
}

/// The gangs of a run, in the order they are applied.
fn workload(rng: &mut Rng, p: &Profile) -> Vec<Gang> {
    let (rack_min, rack_max, zone_min) = p.smallest_domains();
    let impossible = (p.gangs / 10).max(1);
    let mode = |rng: &mut Rng| if rng.chance(0.5) { "all" } else { "single" };
    let mut gangs = Vec::new();
    for i in 0..p.gangs {
        let gang = if i < impossible {
            // One more 8-GPU pod than the largest rack (or the whole pool) has nodes.
            let (pods, topology) = if i % 2 == 0 { (rack_max + 1, Some(RACK_LABEL)) } else { (p.nodes + 1, None) };
            Gang {
                name: format!("never{i:02}"),
                set: false,
                members: vec![Member { name: format!("never{i:02}"), pods, gpus: 8, min_count: pods }],
                topology,
                mode: mode(rng),
                impossible: true,
                finish_after: None,
            }
        } else if i < impossible + p.sets {
            // A driver (1 GPU) and a gang of workers that start together.
            let workers = rng.range(2, 4) as u32;
            let gpus = *rng.pick(&[2u32, 4]);
            let topology = (rng.chance(0.5) && slots(rack_min, gpus) > workers).then_some(RACK_LABEL);
            Gang {
                name: format!("set{i:02}"),
                set: true,
                members: vec![
                    Member { name: "driver".into(), pods: 1, gpus: 1, min_count: 1 },
                    Member { name: "workers".into(), pods: workers, gpus, min_count: workers },
                ],
                topology,
                mode: mode(rng),
                impossible: false,
                finish_after: None,
            }
        } else {
            let gpus = *rng.pick(&[1u32, 2, 2, 4, 4, 4, 8, 8]);
            let most = match gpus {
                8 => 4,
                4 | 2 => 6,
                _ => 8,
            };
            let pods = rng.range(1, most) as u32;
            let min_count = if pods >= 2 && rng.chance(0.3) {
                rng.range(pods.div_ceil(2).into(), (pods - 1).into()) as u32
            } else {
                pods
            };
            let draw = rng.range(0, 99);
            let topology = if draw < 35 && slots(rack_min, gpus) >= min_count {
                Some(RACK_LABEL)
            } else if draw < 50 && slots(zone_min, gpus) >= min_count {
                Some(ZONE_LABEL)
            } else {
                None
            };
            let mode = mode(rng);
            let finish_after = rng.chance(0.15).then(|| rng.range(20, 60));
            let name = format!("g{i:02}-{pods}x{gpus}");
            Gang {
                members: vec![Member { name: name.clone(), pods, gpus, min_count }],
                name,
                set: false,
                topology,
                mode,
                impossible: false,
                finish_after,
            }
        };
        gangs.push(gang);
    }
    rng.shuffle(&mut gangs);
    gangs
}

// === what the cluster looks like ===

/// A pool node as the checks need it.
struct NodeInfo {
    gpus: u32,
    ready: bool,
    labels: BTreeMap<String, String>,
}

/// What muster's rollback history makes a root wait for.
#[derive(Default)]
struct RootHistory {
    avoided: BTreeSet<String>,
    backing_off: bool,
}

/// One look at the namespace and the pool.
struct World {
    pods: Vec<Pod>,
    nodes: BTreeMap<String, NodeInfo>,
    roots: BTreeMap<String, RootHistory>,
    /// MusterJobs whose status says Complete: their succeeded pods may be gone (pod GC deletes
    /// every pod of a removed node), and a finished gang is not one that waits.
    complete: BTreeSet<String>,
}

fn history(rollbacks: i32, recent: i32, last: Option<Timestamp>, avoid: &[AvoidedNode]) -> RootHistory {
    let h = RollbackHistory {
        count: u32::try_from(rollbacks).unwrap_or(0),
        recent: u32::try_from(recent).unwrap_or(0),
        last,
        avoid: avoid.iter().map(|a| (a.node.clone(), a.until.0)).collect(),
    };
    let now = Timestamp::now();
    RootHistory { avoided: h.avoided(now), backing_off: h.unschedulable(now, &RollbackPolicy::DEFAULT) }
}

async fn observe(ns: &str, pool: &str) -> World {
    let c = client().await;
    let pods = Api::<Pod>::namespaced(c.clone(), ns).list(&ListParams::default()).await;
    let pods = pods.unwrap_or_else(|e| panic!("listing pods of {ns}: {e}")).items;
    let lp = ListParams::default().labels(&format!("{POOL_LABEL}={pool}"));
    let nodes = Api::<Node>::all(c.clone()).list(&lp).await.unwrap_or_else(|e| panic!("listing nodes: {e}")).items;
    let nodes = nodes
        .into_iter()
        .map(|n| {
            let status = n.status.clone().unwrap_or_default();
            let gpus = status
                .allocatable
                .as_ref()
                .and_then(|a| a.get("nvidia.com/gpu"))
                .and_then(|q| q.0.parse().ok())
                .unwrap_or(0);
            let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
                && !n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
            (n.name_any(), NodeInfo { gpus, ready, labels: n.labels().clone() })
        })
        .collect();
    let mut roots = BTreeMap::new();
    let groups = Api::<PodGroup>::namespaced(c.clone(), ns).list(&ListParams::default()).await;
    for g in groups.map(|l| l.items).unwrap_or_default() {
        if let Some(s) = &g.status {
            let last = s.last_rollback_time.as_ref().map(|t| t.0);
            roots.insert(g.name_any(), history(s.rollbacks, s.recent_rollbacks, last, &s.avoid_nodes));
        }
    }
    let composites = Api::<CompositePodGroup>::namespaced(c, ns).list(&ListParams::default()).await;
    for g in composites.map(|l| l.items).unwrap_or_default() {
        if let Some(s) = &g.status {
            let last = s.last_rollback_time.as_ref().map(|t| t.0);
            roots.insert(g.name_any(), history(s.rollbacks, s.recent_rollbacks, last, &s.avoid_nodes));
        }
    }
    let jobs = Api::<muster::crds::MusterJob>::namespaced(client().await, ns).list(&ListParams::default()).await;
    let complete = jobs
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|j| j.status.as_ref().and_then(|s| s.phase) == Some(muster::crds::batch::JobPhase::Complete))
        .map(|j| j.name_any())
        .collect();
    World { pods, nodes, roots, complete }
}

fn finished(p: &Pod) -> bool {
    matches!(phase(p), "Succeeded" | "Failed")
}

fn terminating(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_some()
}

/// A pod that takes part in its gang: not finished, not being deleted, not rolled back.
fn live(p: &Pod) -> bool {
    !finished(p) && !terminating(p) && !p.annotations().contains_key(ROLLED_BACK_ANNOTATION)
}

/// The node where a pod holds GPUs: bound there, or pinned there and ungated (also while it
/// terminates); none once finished.
fn holder_node(p: &Pod) -> Option<&str> {
    if finished(p) {
        return None;
    }
    node_of(p).or_else(|| if gated(p) { None } else { pin_of(p) })
}

fn indices(p: &Pod) -> BTreeSet<u32> {
    indices_of(p).map(|s| s.split(',').filter_map(|i| i.trim().parse().ok()).collect()).unwrap_or_default()
}

/// The gang and member a pod belongs to.
fn gang_of(p: &Pod) -> Option<(&str, &str)> {
    let labels = p.labels();
    match labels.get(JOBSET_NAME_LABEL) {
        Some(set) => Some((set.as_str(), labels.get(REPLICATED_JOB_LABEL)?.as_str())),
        None => labels.get(JOB_NAME_LABEL).map(|j| (j.as_str(), j.as_str())),
    }
}

/// One line about a pod, for failure messages.
fn describe_pod(p: &Pod) -> String {
    let mut out = format!("{} [{}", p.name_any(), phase(p));
    if let Some(n) = node_of(p) {
        let _ = write!(out, ", bound {n}");
    } else if let Some(n) = pin_of(p) {
        let _ = write!(out, ", pinned {n}");
    }
    if gated(p) {
        out.push_str(", gated");
    }
    if let Some(i) = indices_of(p) {
        let _ = write!(out, ", GPUs {i}");
    }
    if let Some(a) = p.annotations().get(GANG_ATTEMPT_ANNOTATION) {
        let _ = write!(out, ", attempt {a}");
    }
    if terminating(p) {
        out.push_str(", terminating");
    }
    out.push(']');
    out
}

/// What one pod holds on its node.
struct Held<'a> {
    pod: &'a Pod,
    indices: BTreeSet<u32>,
    /// GPUs requested.
    gpus: u32,
}

impl World {
    /// The GPUs held on each node (bound or pinned pods), by pod.
    fn holdings(&self) -> BTreeMap<&str, Vec<Held<'_>>> {
        let mut out: BTreeMap<&str, Vec<_>> = BTreeMap::new();
        for p in &self.pods {
            if let Some(node) = holder_node(p) {
                out.entry(node).or_default().push(Held { pod: p, indices: indices(p), gpus: gpus_wanted(p) as u32 });
            }
        }
        out
    }

    /// Free GPUs of each ready pool node.
    fn free(&self) -> BTreeMap<&str, u32> {
        let holdings = self.holdings();
        self.nodes
            .iter()
            .filter(|(_, n)| n.ready)
            .map(|(name, n)| {
                let held = holdings.get(name.as_str()).map_or(0, |pods| {
                    let requested: u32 = pods.iter().map(|h| h.gpus).sum();
                    let indices: BTreeSet<u32> = pods.iter().flat_map(|h| h.indices.iter().copied()).collect();
                    requested.max(indices.len() as u32)
                });
                (name.as_str(), n.gpus.saturating_sub(held))
            })
            .collect()
    }

    /// GPU indices held by more than one pod on an existing node.
    fn double_held(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (node, pods) in self.holdings() {
            if !self.nodes.contains_key(node) {
                continue;
            }
            let mut by_index: BTreeMap<u32, Vec<&Pod>> = BTreeMap::new();
            for h in &pods {
                for i in &h.indices {
                    by_index.entry(*i).or_default().push(h.pod);
                }
            }
            for (i, holders) in by_index.into_iter().filter(|(_, h)| h.len() > 1) {
                let who: Vec<String> = holders.iter().map(|p| describe_pod(p)).collect();
                out.push(format!("{node} GPU {i}: {}", who.join(" and ")));
            }
        }
        out
    }

    /// The union of GPU indices existing pods hold on `node`.
    fn held_indices(&self, node: &str) -> u32 {
        let holdings = self.holdings();
        let held: BTreeSet<u32> =
            holdings.get(node).into_iter().flatten().flat_map(|h| h.indices.iter().copied()).collect();
        held.len() as u32
    }

    fn pods_of<'a>(&'a self, gang: &'a Gang) -> impl Iterator<Item = &'a Pod> + 'a {
        self.pods.iter().filter(move |p| gang_of(p).is_some_and(|(g, _)| g == gang.name))
    }
}

// === the figures ===

/// What a settled cluster must show: every list empty (and `gone_holding` 0).
#[derive(Default)]
struct Figures {
    partly_bound: Vec<String>,
    double_held: Vec<String>,
    gone_holding: u32,
    gone_detail: Vec<String>,
    unadmitted_fitting: Vec<String>,
    impossible_started: Vec<String>,
    stuck_pinned: Vec<String>,
    crashed: Vec<String>,
    // For information only.
    degraded: Vec<String>,
    rollback_backoff: Vec<String>,
    running: u32,
    waiting: u32,
    finished: u32,
    /// Pods still bound to a deleted node, or pinned and not bound yet: not settled.
    unsettled: Vec<String>,
    /// Where each gang stands.
    states: Vec<String>,
}

impl Figures {
    fn failures(&self) -> usize {
        self.partly_bound.len()
            + self.double_held.len()
            + self.gone_holding as usize
            + self.unadmitted_fitting.len()
            + self.impossible_started.len()
            + self.stuck_pinned.len()
            + self.crashed.len()
    }

    fn line(&self) -> String {
        format!(
            "partly_bound={} double_held={} gone_holding={} unadmitted_fitting={} impossible_started={} \
             stuck_pinned={} crashed={} (running={} waiting={} finished={} degraded={} rollback_backoff={})",
            self.partly_bound.len(),
            self.double_held.len(),
            self.gone_holding,
            self.unadmitted_fitting.len(),
            self.impossible_started.len(),
            self.stuck_pinned.len(),
            self.crashed.len(),
            self.running,
            self.waiting,
            self.finished,
            self.degraded.len(),
            self.rollback_backoff.len(),
        )
    }

    fn details(&self) -> String {
        let mut out = String::new();
        for (what, items) in [
            ("partly bound", &self.partly_bound),
            ("GPU indices held twice", &self.double_held),
            ("GPUs counted for pods that are gone", &self.gone_detail),
            ("gangs that fit but wait", &self.unadmitted_fitting),
            ("never-fitting gangs started", &self.impossible_started),
            ("pods pinned and never bound", &self.stuck_pinned),
            ("replicas that exited by themselves", &self.crashed),
            ("degraded (mode single, lost pods to the test; not a failure)", &self.degraded),
            ("held back by muster's rollback backoff (not a failure)", &self.rollback_backoff),
            ("not settled", &self.unsettled),
        ] {
            if items.is_empty() {
                continue;
            }
            let _ = writeln!(out, "  {what} ({}):", items.len());
            for item in items.iter().take(25) {
                let _ = writeln!(out, "    {item}");
            }
            if items.len() > 25 {
                let _ = writeln!(out, "    ... {} more", items.len() - 25);
            }
        }
        out
    }
}

/// Bound and placed (bound, or pinned and ungated) live pods of each member of a gang.
#[derive(Default, Debug)]
struct MemberCount {
    bound: u32,
    placed: u32,
    unbound: u32,
}

/// Places `pods` (GPUs each) on `room` by best fit, largest first; the placement if all fit.
fn best_fit(room: &mut [(&str, u32)], pods: &mut [u32]) -> Option<Vec<String>> {
    pods.sort_unstable_by(|a, b| b.cmp(a));
    let mut placed = Vec::new();
    for &gpus in pods.iter() {
        let slot = room.iter_mut().filter(|(_, free)| *free >= gpus).min_by_key(|(_, free)| *free)?;
        slot.1 -= gpus;
        placed.push(format!("{gpus}@{}", slot.0));
    }
    Some(placed)
}

/// Whether the pods a gang misses could be placed now; a placement when they surely can.
fn fitting(
    gang: &Gang,
    counts: &BTreeMap<&str, MemberCount>,
    placed_nodes: &BTreeSet<&str>,
    world: &World,
) -> Option<String> {
    let mut missing: Vec<u32> = Vec::new();
    for m in &gang.members {
        let have = counts.get(m.name.as_str()).map_or(0, |c| c.placed);
        missing.extend(std::iter::repeat_n(m.gpus, m.min_count.saturating_sub(have) as usize));
    }
    if missing.is_empty() {
        return None;
    }
    let avoided = world.roots.get(&gang.name).map(|h| h.avoided.clone()).unwrap_or_default();
    let free: Vec<(&str, u32)> = world.free().into_iter().filter(|(n, _)| !avoided.contains(*n)).collect();
    let domain_of = |node: &str| -> Option<String> {
        gang.topology.map_or(Some(String::new()), |key| world.nodes.get(node)?.labels.get(key).cloned())
    };
    // With a constraint, pods already placed fix the domain.
    let fixed: BTreeSet<Option<String>> = placed_nodes.iter().map(|n| domain_of(n)).collect();
    if fixed.len() > 1 || fixed.contains(&None) {
        return None;
    }
    let mut domains: BTreeMap<String, Vec<(&str, u32)>> = BTreeMap::new();
    for (node, room) in free {
        if let Some(d) = domain_of(node) {
            domains.entry(d).or_default().push((node, room));
        }
    }
    let want = fixed.into_iter().next().flatten();
    for (domain, mut room) in domains {
        if want.as_ref().is_some_and(|w| *w != domain) {
            continue;
        }
        if let Some(placement) = best_fit(&mut room, &mut missing.clone()) {
            let where_ = if gang.topology.is_some() { format!(" in {domain}") } else { String::new() };
            return Some(format!("{} missing pod(s) fit{where_}: {}", missing.len(), placement.join(" ")));
        }
    }
    None
}

/// The gang-level figures of `world` (all but `gone_holding` and `crashed`).
fn figures(world: &World, gangs: &[Gang], disrupted: &BTreeSet<String>) -> Figures {
    let mut f = Figures { double_held: world.double_held(), ..Figures::default() };
    for p in &world.pods {
        if finished(p) {
            continue;
        }
        if let Some(node) = node_of(p)
            && !world.nodes.contains_key(node)
        {
            f.unsettled.push(format!("{} on deleted node", describe_pod(p)));
        } else if node_of(p).is_none() && !gated(p) && pin_of(p).is_some() {
            f.unsettled.push(format!("{} not bound yet", describe_pod(p)));
        }
    }
    for gang in gangs {
        let pods: Vec<&Pod> = world.pods_of(gang).collect();
        let describe = || pods.iter().map(|p| describe_pod(p)).collect::<Vec<_>>().join("; ");
        if gang.impossible {
            let started: Vec<String> =
                pods.iter().filter(|p| !finished(p) && holder_node(p).is_some()).map(|p| describe_pod(p)).collect();
            if !started.is_empty() {
                f.impossible_started.push(format!("{}: {}", gang.shape(), started.join("; ")));
            }
            f.states.push(format!("{}: {} pods, {} started", gang.shape(), pods.len(), started.len()));
            f.waiting += 1;
            continue;
        }
        if pods.iter().any(|p| phase(p) == "Succeeded") || world.complete.contains(&gang.name) {
            f.states.push(format!("{}: finishing or finished", gang.shape()));
            f.finished += 1;
            continue;
        }
        let live: Vec<&Pod> = pods.iter().copied().filter(|p| live(p)).collect();
        let mut counts: BTreeMap<&str, MemberCount> = BTreeMap::new();
        let mut placed_nodes = BTreeSet::new();
        for p in &live {
            let Some((_, member)) = gang_of(p) else { continue };
            let c = counts.entry(member).or_default();
            if node_of(p).is_some() {
                c.bound += 1;
            } else {
                c.unbound += 1;
            }
            if let Some(n) = holder_node(p) {
                c.placed += 1;
                placed_nodes.insert(n);
            }
        }
        let bound: u32 = counts.values().map(|c| c.bound).sum();
        let whole = gang.members.iter().all(|m| counts.get(m.name.as_str()).is_some_and(|c| c.bound >= m.min_count));
        let state: Vec<String> = gang
            .members
            .iter()
            .map(|m| {
                let c = counts.get(m.name.as_str());
                let (b, u) = c.map_or((0, 0), |c| (c.bound, c.unbound));
                format!("{}: {b} bound, {u} not", m.name)
            })
            .collect();
        f.states.push(format!("{}: {}", gang.shape(), state.join(", ")));
        if whole {
            f.running += 1;
        } else {
            f.waiting += 1;
        }

        // Partly bound: per attempt for a MusterJob, the set as a whole.
        let mut attempts: BTreeMap<String, (u32, u32)> = BTreeMap::new();
        if gang.set {
            let unbound: u32 = counts.values().map(|c| c.unbound).sum();
            if bound > 0 && unbound > 0 && !whole {
                attempts.insert("set".into(), (bound, unbound));
            }
        } else {
            let m = &gang.members[0];
            let mut per: BTreeMap<String, (u32, u32)> = BTreeMap::new();
            for p in &live {
                let a = p.annotations().get(GANG_ATTEMPT_ANNOTATION).cloned().unwrap_or_default();
                let e = per.entry(a).or_default();
                if node_of(p).is_some() {
                    e.0 += 1;
                } else {
                    e.1 += 1;
                }
            }
            attempts.extend(per.into_iter().filter(|(_, (b, u))| *b > 0 && *b < m.min_count && *u > 0));
        }
        for (attempt, (b, u)) in attempts {
            let line = format!("{} attempt {attempt}: {b} bound, {u} unbound: {}", gang.shape(), describe());
            if gang.mode == "single" && disrupted.contains(&gang.name) {
                f.degraded.push(line);
            } else {
                f.partly_bound.push(line);
            }
        }

        if !whole && let Some(fit) = fitting(gang, &counts, &placed_nodes, world) {
            let line = format!("{}: {fit}; pods: {}", gang.shape(), describe());
            if world.roots.get(&gang.name).is_some_and(|h| h.backing_off) {
                f.rollback_backoff.push(line);
            } else {
                f.unadmitted_fitting.push(line);
            }
        }
    }
    f
}

/// `muster_gpus_allocated` of each pool node in an OpenMetrics text.
fn allocated_gauges<'a>(text: &'a str, pool: &str) -> Vec<(&'a str, f64)> {
    let prefix = format!("{pool}-");
    text.lines()
        .filter_map(|l| l.strip_prefix("muster_gpus_allocated{"))
        .filter_map(|rest| {
            let (labels, value) = rest.split_once("} ")?;
            let node = labels.split(',').find_map(|kv| kv.strip_prefix("node=\""))?.trim_end_matches('"');
            Some((node, value.trim().parse().ok()?))
        })
        .filter(|(node, _)| node.starts_with(&prefix))
        .collect()
}

/// GPUs the leader's gauges count beyond what existing pods hold, with the cluster read just
/// before and just after the gauges (a pod admitted or deleted in between is not blamed).
async fn gone_holding(replicas: &mut MusterReplicas, ns: &str, pool: &str, when: &str) -> (u32, Vec<String>) {
    let leader = match replicas.wait_leader(Duration::from_secs(30)).await {
        Ok(l) => l,
        Err(e) => return (0, vec![format!("{when}: no gauges to check: {e}")]),
    };
    let before = observe(ns, pool).await;
    let Some(text) = replicas.metrics_of(&leader).await else {
        return (0, vec![format!("{when}: leader {leader} did not serve /metrics")]);
    };
    let after = observe(ns, pool).await;
    let mut total = 0;
    let mut detail = Vec::new();
    for (node, value) in allocated_gauges(&text, pool) {
        let held = before.held_indices(node).max(after.held_indices(node));
        let counted = value.max(0.0) as u32;
        if counted > held {
            total += counted - held;
            let gone = if after.nodes.contains_key(node) { "" } else { " (node deleted)" };
            detail.push(format!("{when}: {node}{gone}: muster_gpus_allocated {counted}, existing pods hold {held}"));
        }
    }
    (total, detail)
}

// === the run ===

struct Run {
    profile: Profile,
    rng: Rng,
    began: Instant,
    ns: String,
    pool: NodePool,
    replicas: MusterReplicas,
    gangs: Vec<Gang>,
    /// Gangs of which this test deleted a placed pod or removed its node.
    disrupted: BTreeSet<String>,
    removed: Vec<String>,
    deleted_pods: u32,
    kills: u32,
    /// Kills aimed at a commit seen in flight.
    mid_commit: u32,
    starts: u32,
    /// Failures seen while the chaos ran (sampled).
    during: Figures,
}

impl Run {
    fn elapsed(&self) -> String {
        format!("{:.0}s", self.began.elapsed().as_secs_f64())
    }

    fn identity(&mut self) -> String {
        self.starts += 1;
        format!("chaos-{}-{}", std::process::id(), self.starts)
    }

    /// Applies the gangs as a user would while muster restarts: a create its webhook could not
    /// review (the replica just started, not serving yet: `failurePolicy: Fail` refuses it, by
    /// design) is sent again, for up to a minute; any other refusal fails the run.
    async fn apply(&self, gangs: &[Gang]) {
        for g in gangs {
            let manifest = g.manifest(&self.pool).to_string();
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                match try_kubectl_apply(&self.ns, &manifest) {
                    Ok(_) => break,
                    Err(e) if e.contains("failed calling webhook") && Instant::now() < deadline => {
                        eprintln!("chaos {}: {} refused while muster restarts, again: {e}", self.elapsed(), g.name);
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => panic!("chaos seed={}: {e}\nreplay: {}", self.profile.seed, self.profile.replay()),
                }
            }
        }
    }

    async fn start(&mut self, identity: &str, wait: Wait) {
        if let Err(e) = self.replicas.start(identity, wait).await {
            panic!("chaos seed={}: {e}\nreplay: {}", self.profile.seed, self.profile.replay());
        }
    }

    async fn wait_leader(&mut self) -> String {
        match self.replicas.wait_leader(Duration::from_secs(60)).await {
            Ok(l) => l,
            Err(e) => panic!("chaos seed={}: {e}\nreplay: {}", self.profile.seed, self.profile.replay()),
        }
    }

    /// Waits for the moment of the next kill: a random delay, or (half the time) the first
    /// commit seen in flight within it (a group whose plan is recorded and not resumed
    /// `Admitted`: a commit that went through whole stays `Committing` until its binds end),
    /// watched so that the kill lands while muster is patching its pods or watching their binds.
    async fn kill_moment(&mut self) {
        let delay = self.rng.millis(200, self.profile.max_kill_delay_ms);
        if !self.rng.chance(0.5) {
            tokio::time::sleep(delay).await;
            return;
        }
        let c = client().await;
        let in_flight = |plan: Option<&AdmissionPlan>| plan.is_some_and(|p| p.state != PlanState::Admitted);
        let leaves = watcher(Api::<PodGroup>::namespaced(c.clone(), &self.ns), watcher::Config::default())
            .applied_objects()
            .filter_map(move |g| async move {
                let g = g.ok()?;
                in_flight(g.status.as_ref().and_then(|s| s.plan.as_ref())).then(|| g.name_any())
            });
        let sets = watcher(Api::<CompositePodGroup>::namespaced(c, &self.ns), watcher::Config::default())
            .applied_objects()
            .filter_map(move |g| async move {
                let g = g.ok()?;
                in_flight(g.status.as_ref().and_then(|s| s.plan.as_ref())).then(|| g.name_any())
            });
        let mut commits = std::pin::pin!(futures::stream::select(leaves, sets));
        if let Ok(Some(name)) = tokio::time::timeout(delay, commits.next()).await {
            self.mid_commit += 1;
            eprintln!("chaos {}: the commit of {name} is in flight", self.elapsed());
        }
    }

    fn kill(&mut self, identity: &str) {
        let (_, exited) = self.replicas.running();
        self.during.crashed.extend(exited);
        if self.replicas.kill(identity) {
            self.kills += 1;
            eprintln!("chaos {}: killed {identity} (kill {})", self.elapsed(), self.kills);
        }
    }

    /// Checks what must hold at every moment.
    async fn sample(&mut self) {
        let world = observe(&self.ns, &self.pool.name).await;
        let f = figures(&world, &self.gangs, &self.disrupted);
        let at = self.elapsed();
        self.during.double_held.extend(f.double_held.into_iter().map(|d| format!("at {at}: {d}")));
        self.during.impossible_started.extend(f.impossible_started.into_iter().map(|d| format!("at {at}: {d}")));
    }

    /// Deletes one random node of the pool (as a cloud would); its pods go with pod GC.
    async fn remove_node(&mut self) {
        let world = observe(&self.ns, &self.pool.name).await;
        let names: Vec<&String> = world.nodes.keys().collect();
        if names.is_empty() {
            return;
        }
        let node = (*self.rng.pick(&names)).clone();
        for p in &world.pods {
            if holder_node(p) == Some(node.as_str())
                && let Some((gang, _)) = gang_of(p)
            {
                self.disrupted.insert(gang.to_string());
            }
        }
        kubectl(&["delete", "node", &node, "--wait=false"]);
        eprintln!("chaos {}: removed node {node}", self.elapsed());
        self.removed.push(node);
    }

    /// Deletes `count` random pods of the workload; with `check`, 5 s later muster's gauges
    /// must not count them.
    async fn delete_pods(&mut self, count: u32, check: bool) {
        let world = observe(&self.ns, &self.pool.name).await;
        let mut candidates: Vec<&Pod> = world.pods.iter().filter(|p| live(p)).collect();
        self.rng.shuffle(&mut candidates);
        let chosen: Vec<&Pod> = candidates.into_iter().take(count as usize).collect();
        if chosen.is_empty() {
            return;
        }
        for p in &chosen {
            if holder_node(p).is_some()
                && let Some((gang, _)) = gang_of(p)
            {
                self.disrupted.insert(gang.to_string());
            }
        }
        let names: Vec<String> = chosen.iter().map(|p| p.name_any()).collect();
        let deleted_at = Instant::now();
        let mut args = vec!["delete", "pod", "-n", &self.ns, "--wait=false", "--ignore-not-found"];
        args.extend(names.iter().map(String::as_str));
        kubectl(&args);
        self.deleted_pods += names.len() as u32;
        eprintln!("chaos {}: deleted pods {}", self.elapsed(), names.join(" "));
        if !check {
            return;
        }
        tokio::time::sleep(GONE_WITHIN.saturating_sub(deleted_at.elapsed())).await;
        let when = format!("{} after deleting {}", self.elapsed(), names.join(" "));
        let (gone, detail) = gone_holding(&mut self.replicas, &self.ns, &self.pool.name, &when).await;
        self.during.gone_holding += gone;
        self.during.gone_detail.extend(detail);
    }

    /// Waits until the cluster is clean for a few samples in a row, or the settle time is up;
    /// returns the last figures.
    async fn settle(&mut self) -> Figures {
        let deadline = Instant::now() + self.profile.settle;
        let mut pinned_since: HashMap<String, Instant> = HashMap::new();
        let mut clean = 0;
        let mut last_report = String::new();
        loop {
            let world = observe(&self.ns, &self.pool.name).await;
            let mut f = figures(&world, &self.gangs, &self.disrupted);
            let pinned: BTreeSet<String> = world
                .pods
                .iter()
                .filter(|p| !finished(p) && node_of(p).is_none() && !gated(p) && pin_of(p).is_some())
                .filter_map(|p| p.uid())
                .collect();
            pinned_since.retain(|uid, _| pinned.contains(uid));
            for uid in &pinned {
                pinned_since.entry(uid.clone()).or_insert_with(Instant::now);
            }
            let stuck_after = Duration::from_secs(BIND_TIMEOUT + 30);
            for p in &world.pods {
                if p.uid().and_then(|u| pinned_since.get(&u)).is_some_and(|t| t.elapsed() > stuck_after) {
                    f.stuck_pinned.push(describe_pod(p));
                }
            }
            if f.failures() == 0 && f.unsettled.is_empty() {
                clean += 1;
            } else {
                clean = 0;
                let first = f.details().lines().take(3).collect::<Vec<_>>().join(" |");
                let report = format!("{} unsettled={}:{first}", f.line(), f.unsettled.len());
                if report != last_report {
                    eprintln!("chaos {}: settling: {report}", self.elapsed());
                    last_report = report;
                }
            }
            if clean >= CLEAN_SAMPLES || Instant::now() > deadline {
                return f;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// See the module doc.
#[tokio::test]
async fn gangs_stay_whole_through_kills_and_losses() {
    let profile = Profile::from_env();
    let mut rng = Rng(profile.seed);
    eprintln!(
        "chaos: seed={} profile={} nodes={} racks={} gangs={} sets={} kills={} (single {}, leader {}) remove_nodes={} \
         delete {}x{} pods\nchaos: replay with {}",
        profile.seed,
        profile.name,
        profile.nodes,
        profile.racks,
        profile.gangs,
        profile.sets,
        profile.single_kills + profile.leader_kills,
        profile.single_kills,
        profile.leader_kills,
        profile.remove_nodes,
        profile.delete_rounds,
        profile.delete_pods,
        profile.replay()
    );
    let gangs = workload(&mut rng, &profile);
    let replicas = MusterReplicas::new(&["--bind-timeout", &BIND_TIMEOUT.to_string()]).await;
    let began = Instant::now();
    let ns = namespace("chaos");
    let shape = FakeGpuNodes {
        count: profile.nodes,
        gpus: NODE_GPUS,
        racks: profile.racks,
        zones: profile.zones,
        ..FakeGpuNodes::default()
    };
    let pool = NodePool::add(&ns.name, &shape).await;
    let demand: u32 = gangs.iter().filter(|g| !g.impossible).map(Gang::gpus).sum();
    eprintln!(
        "chaos: {} gangs asking {demand} GPUs (never-fitting ones aside) of {} on the pool:\n  {}",
        gangs.len(),
        profile.nodes * NODE_GPUS,
        gangs.iter().map(Gang::shape).collect::<Vec<_>>().join("\n  ")
    );
    let mut run = Run {
        rng,
        began,
        ns: ns.name.clone(),
        pool,
        replicas,
        gangs,
        disrupted: BTreeSet::new(),
        removed: Vec::new(),
        deleted_pods: 0,
        kills: 0,
        mid_commit: 0,
        starts: 0,
        during: Figures::default(),
        profile,
    };
    let p = run.profile.clone();

    // The schedule: a first wave of gangs now, the rest and some node removals before kills.
    let total_kills = p.single_kills + p.leader_kills;
    let first = (run.gangs.len() * 3).div_ceil(5);
    let mut waves: BTreeMap<u32, Vec<Gang>> = BTreeMap::new();
    for g in run.gangs[first..].iter().cloned() {
        let at = run.rng.range(0, u64::from(total_kills.max(1)) - 1) as u32;
        waves.entry(at).or_default().push(g);
    }
    let removals_early = if total_kills > 0 { p.remove_nodes.div_ceil(2) } else { 0 };
    let mut removal_at: BTreeMap<u32, u32> = BTreeMap::new();
    for _ in 0..removals_early {
        // In the first half, so that pod GC has collected their pods by the end.
        let at = run.rng.range(0, u64::from(total_kills.div_ceil(2).max(1)) - 1) as u32;
        *removal_at.entry(at).or_default() += 1;
    }
    let mut identity = run.identity();
    run.start(&identity, Wait::Leader).await;
    run.apply(&run.gangs[..first]).await;
    eprintln!("chaos {}: {first} gangs applied, muster {identity} leading", run.elapsed());

    // Before kill `k`: its wave of gangs, its node removals.
    async fn before_kill(run: &mut Run, k: u32, waves: &mut BTreeMap<u32, Vec<Gang>>, removal_at: &BTreeMap<u32, u32>) {
        if let Some(wave) = waves.remove(&k) {
            run.apply(&wave).await;
            eprintln!(
                "chaos {}: applied {}",
                run.elapsed(),
                wave.iter().map(|g| g.name.as_str()).collect::<Vec<_>>().join(" ")
            );
        }
        for _ in 0..removal_at.get(&k).copied().unwrap_or(0) {
            run.remove_node().await;
        }
        // Replacements to admit, so that a kill can land in their commit.
        if run.rng.chance(0.5) {
            let count = run.rng.range(1, 2) as u32;
            run.delete_pods(count, false).await;
        }
    }

    // Mode 1: one replica, killed at random moments, sometimes before it is even ready; it
    // comes back as the same pod (the Lease is its own at once) or as a new one (which waits
    // for the Lease to expire).
    for k in 0..p.single_kills {
        before_kill(&mut run, k, &mut waves, &removal_at).await;
        run.kill_moment().await;
        run.kill(&identity.clone());
        tokio::time::sleep(run.rng.millis(0, 1000)).await;
        if run.rng.chance(0.3) {
            identity = run.identity();
        }
        let early = k + 1 < p.single_kills && run.rng.chance(0.2);
        let wait = if early { Wait::Started } else { Wait::Leader };
        run.start(&identity.clone(), wait).await;
        run.sample().await;
    }
    if p.single_kills > 0 {
        let leader = run.wait_leader().await;
        eprintln!("chaos {}: single replica phase done, {leader} leading", run.elapsed());
    }

    // Mode 2: two replicas; the leader is killed and replaced by a new pod, and the standby
    // (or the new pod) takes over once the Lease expires.
    if p.leader_kills > 0 {
        let standby = run.identity();
        run.start(&standby, Wait::Serving).await;
        for k in p.single_kills..total_kills {
            before_kill(&mut run, k, &mut waves, &removal_at).await;
            let leader = run.wait_leader().await;
            run.kill_moment().await;
            run.kill(&leader);
            tokio::time::sleep(run.rng.millis(0, 3000)).await;
            let replacement = run.identity();
            run.start(&replacement, Wait::Serving).await;
            run.sample().await;
        }
        let leader = run.wait_leader().await;
        eprintln!("chaos {}: two-replica phase done, {leader} leading", run.elapsed());
    }
    for (_, wave) in std::mem::take(&mut waves) {
        run.apply(&wave).await;
    }

    // Then pods deleted and the rest of the nodes removed under the running muster.
    let mut removals_left = p.remove_nodes - removals_early;
    for round in 0..p.delete_rounds {
        if removals_left > 0 && (round % 2 == 0 || round + 1 == p.delete_rounds) {
            run.remove_node().await;
            removals_left -= 1;
        }
        tokio::time::sleep(run.rng.millis(1000, 4000)).await;
        run.delete_pods(p.delete_pods, true).await;
        run.sample().await;
    }
    for _ in 0..removals_left {
        run.remove_node().await;
    }

    eprintln!("chaos {}: chaos over; settling (at most {:?})", run.elapsed(), p.settle);
    let mut end = run.settle().await;
    let (gone, detail) = gone_holding(&mut run.replicas, &run.ns, &run.pool.name, "at the end").await;
    end.gone_holding += gone + run.during.gone_holding;
    end.gone_detail.extend(std::mem::take(&mut run.during.gone_detail));
    end.gone_detail.extend(detail);
    end.double_held.extend(std::mem::take(&mut run.during.double_held));
    end.impossible_started.extend(std::mem::take(&mut run.during.impossible_started));
    let (_, exited) = run.replicas.running();
    end.crashed.extend(std::mem::take(&mut run.during.crashed));
    end.crashed.extend(exited);

    let summary = format!(
        "chaos seed={} profile={} nodes={} gangs={} kills={} (single {}, leader {}, {} at a commit in flight) removed_nodes={} \
         deleted_pods={} wall={} {}",
        p.seed,
        p.name,
        p.nodes,
        run.gangs.len(),
        run.kills,
        p.single_kills,
        p.leader_kills,
        run.mid_commit,
        run.removed.len(),
        run.deleted_pods,
        run.elapsed(),
        end.line()
    );
    let details = end.details();
    let states = format!("  gangs at the end:\n    {}\n", end.states.join("\n    "));
    eprintln!("{summary}\n{details}{states}");
    let _ = std::fs::write(cluster().dir.join("chaos.txt"), format!("{summary}\n{details}{states}"));
    let mut logs: Vec<String> = (1..=run.starts)
        .map(|n| MusterReplicas::log_of(&format!("chaos-{}-{n}", std::process::id())).display().to_string())
        .collect();
    logs.dedup();
    assert!(end.failures() == 0, "{summary}\n{details}{states}replay: {}\nmuster logs: {}", p.replay(), logs.join(" "));
}

/// The detectors themselves, on made-up worlds: each must see its broken state.
mod detectors {
    use super::*;

    const GATE: &str = muster::crds::ADMISSION_GATE;

    fn node(name: &str, rack: &str) -> (String, NodeInfo) {
        let labels = BTreeMap::from([(RACK_LABEL.to_string(), rack.to_string())]);
        (name.to_string(), NodeInfo { gpus: NODE_GPUS, ready: true, labels })
    }

    /// A pod of job `job`: bound to `node`, pinned to `pin` and ungated, or gated.
    fn pod(name: &str, job: &str, gpus: u32, bound: Option<&str>, pin: Option<&str>, indices: Option<&str>) -> Pod {
        let mut annotations = json!({GANG_ATTEMPT_ANNOTATION: "0"});
        if let Some(i) = indices {
            annotations["gpu.muster.dev/indices"] = json!(i);
        }
        let mut spec = json!({"containers": [{"name": "main",
            "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]});
        match (bound, pin) {
            (Some(n), _) => spec["nodeName"] = json!(n),
            (None, Some(n)) => spec["nodeSelector"] = json!({"kubernetes.io/hostname": n}),
            (None, None) => spec["schedulingGates"] = json!([{"name": GATE}]),
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": name, "labels": {JOB_NAME_LABEL: job}, "annotations": annotations},
            "spec": spec,
            "status": {"phase": if bound.is_some() { "Running" } else { "Pending" }},
        }))
        .expect("pod")
    }

    fn job(name: &str, pods: u32, gpus: u32, mode: &'static str) -> Gang {
        Gang {
            name: name.into(),
            set: false,
            members: vec![Member { name: name.into(), pods, gpus, min_count: pods }],
            topology: None,
            mode,
            impossible: false,
            finish_after: None,
        }
    }

    fn world(pods: Vec<Pod>) -> World {
        World {
            pods,
            nodes: [node("n0", "r0"), node("n1", "r1")].into(),
            roots: BTreeMap::new(),
            complete: BTreeSet::new(),
        }
    }

    #[test]
    fn half_bound_gang_is_partly_bound_unless_single_and_disrupted() {
        let w = world(vec![
            pod("a-0", "a", 8, Some("n0"), None, Some("0,1,2,3,4,5,6,7")),
            pod("a-1", "a", 8, None, None, None),
        ]);
        let f = figures(&w, &[job("a", 2, 8, "all")], &BTreeSet::new());
        assert_eq!(f.partly_bound.len(), 1, "{}", f.details());
        let disrupted = BTreeSet::from(["a".to_string()]);
        let f = figures(&w, &[job("a", 2, 8, "all")], &disrupted);
        assert_eq!(f.partly_bound.len(), 1, "mode all must restart whole: {}", f.details());
        let f = figures(&w, &[job("a", 2, 8, "single")], &disrupted);
        assert_eq!((f.partly_bound.len(), f.degraded.len()), (0, 1), "{}", f.details());
    }

    #[test]
    fn whole_gang_is_not_partly_bound() {
        let w = world(vec![
            pod("a-0", "a", 4, Some("n0"), None, Some("0,1,2,3")),
            pod("a-1", "a", 4, Some("n0"), None, Some("4,5,6,7")),
        ]);
        let f = figures(&w, &[job("a", 2, 4, "all")], &BTreeSet::new());
        assert_eq!(f.failures(), 0, "{}", f.details());
        assert_eq!(f.running, 1);
    }

    #[test]
    fn one_index_held_by_two_pods_is_double_held() {
        let w = world(vec![
            pod("a-0", "a", 2, Some("n0"), None, Some("0,1")),
            pod("b-0", "b", 2, None, Some("n0"), Some("1,2")),
        ]);
        let f = figures(&w, &[job("a", 1, 2, "single"), job("b", 1, 2, "single")], &BTreeSet::new());
        assert_eq!(f.double_held.len(), 1, "{}", f.details());
        assert!(f.double_held[0].starts_with("n0 GPU 1:"), "{:?}", f.double_held);
    }

    #[test]
    fn gated_gang_with_room_is_unadmitted_fitting() {
        // n0 full, n1 empty: a gated 1x8 gang fits on n1.
        let w = world(vec![
            pod("a-0", "a", 8, Some("n0"), None, Some("0,1,2,3,4,5,6,7")),
            pod("b-0", "b", 8, None, None, None),
        ]);
        let gangs = [job("a", 1, 8, "single"), job("b", 1, 8, "single")];
        let f = figures(&w, &gangs, &BTreeSet::new());
        assert_eq!(f.unadmitted_fitting.len(), 1, "{}", f.details());
        assert!(f.unadmitted_fitting[0].contains("8@n1"), "{:?}", f.unadmitted_fitting);
        // Two 8-GPU pods do not fit in one free node.
        let w = world(vec![
            pod("a-0", "a", 8, Some("n0"), None, Some("0,1,2,3,4,5,6,7")),
            pod("b-0", "b", 8, None, None, None),
            pod("b-1", "b", 8, None, None, None),
        ]);
        let f = figures(&w, &[job("a", 1, 8, "single"), job("b", 2, 8, "single")], &BTreeSet::new());
        assert_eq!(f.failures(), 0, "{}", f.details());
    }

    #[test]
    fn topology_constraint_limits_the_fit_to_one_domain() {
        // 2 pods of 8 GPUs in one rack: n0 and n1 are in different racks.
        let w = world(vec![pod("b-0", "b", 8, None, None, None), pod("b-1", "b", 8, None, None, None)]);
        let mut b = job("b", 2, 8, "all");
        b.topology = Some(RACK_LABEL);
        let f = figures(&w, &[b.clone()], &BTreeSet::new());
        assert_eq!(f.unadmitted_fitting.len(), 0, "{}", f.details());
        b.topology = None;
        let f = figures(&w, &[b], &BTreeSet::new());
        assert_eq!(f.unadmitted_fitting.len(), 1, "{}", f.details());
    }

    #[test]
    fn never_fitting_gang_started_is_counted() {
        let w = world(vec![pod("x-0", "x", 8, None, Some("n1"), Some("0,1,2,3,4,5,6,7"))]);
        let mut x = job("x", 3, 8, "single");
        x.impossible = true;
        let f = figures(&w, &[x], &BTreeSet::new());
        assert_eq!(f.impossible_started.len(), 1, "{}", f.details());
    }

    #[test]
    fn gauges_are_read_per_pool_node() {
        let text = "# TYPE muster_gpus_allocated gauge\nmuster_gpus_allocated{node=\"p-0\"} 8\n\
                    muster_gpus_allocated{node=\"other-1\"} 3\nmuster_gpus_total{node=\"p-0\"} 8\n";
        assert_eq!(allocated_gauges(text, "p"), vec![("p-0", 8.0)]);
    }

    #[test]
    fn rng_is_seeded() {
        let (mut a, mut b) = (Rng(42), Rng(42));
        assert_eq!((0..5).map(|_| a.next()).collect::<Vec<_>>(), (0..5).map(|_| b.next()).collect::<Vec<_>>());
        assert!((0..1000).map(|_| a.range(3, 5)).all(|v| (3..=5).contains(&v)));
    }
}
