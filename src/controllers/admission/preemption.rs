//! The shell around `scheduler::preempt`: the running groups of lower priority as victims,
//! their eviction through the Eviction API (dry-run first for every victim, so a
//! PodDisruptionBudget that refuses one leaves nothing half done), the `DisruptionTarget`
//! condition on each victim, events naming preemptor and victims, and the nodes a waiting root
//! holds back from roots of lower priority (its nomination while its victims terminate, or its
//! reservation while it waits).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::nominations::write_nominations;
use super::{Admitter, RootKey};
use crate::controllers::lean_writes;
use crate::crds::blocks::DisruptionModeKind;
use crate::crds::scheduling::PreemptionPolicy;
use crate::scheduler::{GroupTree, Snapshot, VictimGroup, VictimPod, unmanaged_victims, victim_groups};

/// The `DisruptionTarget` reason of a pod muster preempted (upstream's scheduler writes
/// `PreemptionByScheduler`).
pub const PREEMPTED_REASON: &str = "PreemptionByMuster";
/// How long a victim group a PodDisruptionBudget protected is left out of preemption.
const PROTECTED_FOR: Duration = Duration::from_secs(30);
/// How long a preemptor waits for its victims to go before it is decided again.
const NOMINATION_TTL: Duration = Duration::from_secs(120);

/// A preemption under way: the victims still to go, and the nodes held for the root.
#[derive(Clone, Debug)]
pub(super) struct Nomination {
    /// `(namespace/name, node)` of each victim pod.
    pub victims: Vec<(String, String)>,
    /// When the victims were evicted.
    pub since: Instant,
}

/// The preemption policy of a root: its group's `preemptionPolicy` when set, else its pods'
/// (the API server's Priority plugin resolves a pod's from its PriorityClass): `Never` when
/// any pod says so.
pub(super) fn root_policy(
    group: Option<PreemptionPolicy>,
    tree: &GroupTree,
    by_uid: &HashMap<&str, &Arc<Pod>>,
) -> Option<PreemptionPolicy> {
    if group.is_some() {
        return group;
    }
    let leaves = tree.root.leaves();
    let never = leaves.iter().flat_map(|l| l.pods.iter()).any(|p| {
        by_uid.get(p.uid.as_str()).and_then(|pod| pod.spec.as_ref()).and_then(|s| s.preemption_policy.as_deref())
            == Some("Never")
    });
    never.then_some(PreemptionPolicy::Never)
}

/// Whether a root's `preemptionPolicy` lets it preempt (unset: `PreemptLowerPriority`).
pub(super) fn may_preempt(policy: Option<PreemptionPolicy>) -> bool {
    policy != Some(PreemptionPolicy::Never)
}

/// What came of evicting a victim set.
pub(super) enum Evicted {
    /// Every victim is being evicted.
    Done(Nomination),
    /// A PodDisruptionBudget refused the eviction of a pod of this victim group: nothing was
    /// evicted; the group is left out for a while.
    Protected(String, String),
}

impl Admitter {
    /// Evicts the victims of `preemption` for the root `key` (of priority `priority`): a dry
    /// run for each first (a PodDisruptionBudget refusing one stops it all), then the
    /// evictions, the `DisruptionTarget` condition on each victim, the events and metrics.
    pub(super) async fn evict_victims(
        &mut self,
        key: &RootKey,
        priority: i32,
        preemption: &crate::scheduler::Preemption,
        groups: &[VictimGroup],
    ) -> crate::controllers::context::Result<Evicted> {
        let victims: Vec<(String, String, &VictimPod, usize)> = preemption
            .victims
            .iter()
            .flat_map(|u| u.pods.iter().map(move |p| (p, u.group)))
            .filter_map(|(p, g)| p.key.split_once('/').map(|(ns, name)| (ns.to_string(), name.to_string(), p, g)))
            .collect();
        let evict = |dry_run: bool| EvictParams {
            post_options: PostParams { dry_run, ..PostParams::default() },
            ..EvictParams::default()
        };
        for (ns, name, _, g) in &victims {
            let api = Api::<Pod>::namespaced(self.ctx.evictions.clone(), ns);
            match api.evict(name, &evict(true)).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(kube::Error::Api(e)) if e.code == 429 => {
                    tracing::debug!(pod = %name, namespace = %ns, message = %e.message, "eviction dry run refused");
                    let group = groups[*g].name.clone();
                    self.protected.insert(group.clone(), Instant::now() + PROTECTED_FOR);
                    return Ok(Evicted::Protected(group, e.message));
                }
                Err(e) => return Err(e.into()),
            }
        }
        let preemptor = format!("{}/{}", key.ns, key.name);
        let mut names = BTreeSet::new();
        // What was evicted: the root waits for these pods only. A pod that could not be (a
        // budget that changed since the dry run, an API error) stays; the next decision weighs
        // the cluster as it is then.
        let mut evicted: Vec<(String, String)> = Vec::new();
        let mut first_error = None;
        for (ns, name, victim, g) in &victims {
            let api = Api::<Pod>::namespaced(self.ctx.evictions.clone(), ns);
            match api.evict(name, &evict(false)).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => continue,
                Err(e) => {
                    tracing::warn!(pod = %name, namespace = %ns, error = %e, "eviction failed after its dry run");
                    first_error.get_or_insert(e);
                    continue;
                }
            }
            evicted.push((victim.key.clone(), victim.node.clone()));
            names.insert(groups[*g].name.clone());
            self.ctx.metrics.preemption_victims.inc();
            // The pod is terminating: say why (upstream's scheduler does the same before it
            // deletes a victim). It may be gone already.
            let condition = json!({"status": {"conditions": [{
                "type": "DisruptionTarget", "status": "True", "reason": PREEMPTED_REASON,
                "message": format!("preempted by muster for PodGroup {preemptor} (priority {priority})"),
                "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
            }]}});
            if let Err(e) =
                lean_writes::patch_status(&api, name, &PatchParams::default(), &Patch::Strategic(&condition)).await
                && !matches!(&e, kube::Error::Api(a) if a.code == 404)
            {
                tracing::debug!(pod = %name, error = %e, "could not mark a victim DisruptionTarget");
            }
        }
        if evicted.is_empty()
            && let Some(e) = first_error
        {
            return Err(e.into());
        }
        self.ctx.metrics.preemptions.inc();
        self.nominate(&key.ns, &preemption.decision.plan).await;
        let nodes: Vec<String> = preemption.nominated_nodes().into_iter().collect();
        let message = format!(
            "preempting {} pod(s) of lower priority ({}) to make room on node(s) {}",
            evicted.len(),
            names.iter().cloned().collect::<Vec<_>>().join(", "),
            nodes.join(", ")
        );
        tracing::info!(group = %key, %message, "preemption");
        self.root_event(key, false, "Preempting", &message);
        for group in &names {
            if let Some((ns, name)) = group.split_once('/') {
                let victim = self.victim_key(ns, name);
                let note = format!("preempted by PodGroup {preemptor} (priority {priority}): its pods are evicted");
                self.root_event(&victim, true, "Preempted", &note);
            }
        }
        Ok(Evicted::Done(Nomination { victims: evicted, since: Instant::now() }))
    }

    /// Nominates each planned pod of a preemptor to the node it takes once its victims are
    /// gone (`status.nominatedNodeName`): kube-scheduler then counts it there for every pod of
    /// its priority or lower it places (gated pods included), so nothing it schedules takes
    /// the freed room first; admission reads the nomination back the same way.
    async fn nominate(&self, ns: &str, plan: &[crate::scheduler::PlacedPod]) {
        let writes = plan.iter().map(|p| (p.pod.clone(), Some(p.node.clone())));
        write_nominations(&self.ctx.client, ns, writes.collect()).await;
    }

    /// Takes back the nominations of a root's pods that still wait, where the root is no
    /// longer preempting (its victims went and it was decided again, its nomination ran out,
    /// or muster restarted meanwhile).
    pub(super) async fn clear_nominations(&self, key: &RootKey, tree: &GroupTree, by_uid: &HashMap<&str, &Arc<Pod>>) {
        let stale: Vec<(String, Option<String>)> = tree
            .root
            .leaves()
            .iter()
            .flat_map(|l| l.pods.iter())
            .filter_map(|p| by_uid.get(p.uid.as_str()))
            .filter(|pod| crate::pods::is_gated(pod))
            .filter(|pod| {
                pod.status.as_ref().and_then(|s| s.nominated_node_name.as_deref()).is_some_and(|n| !n.is_empty())
            })
            .filter_map(|pod| pod.metadata.name.clone().map(|n| (n, None)))
            .collect();
        if !stale.is_empty() {
            tracing::debug!(group = %key, pods = stale.len(), "nominations taken back");
            write_nominations(&self.ctx.client, &key.ns, stale).await;
        }
    }

    /// The root key of a victim group by its root's name (a PodGroup, or a CompositePodGroup).
    fn victim_key(&self, ns: &str, name: &str) -> RootKey {
        let composite =
            self.caches.composites.get(&kube::runtime::reflector::ObjectRef::new(name).within(ns)).is_some();
        if composite { RootKey { composite, ns: ns.into(), name: name.into() } } else { RootKey::leaf(ns, name) }
    }

    /// Groups a PodDisruptionBudget protected a moment ago (left out of preemption).
    pub(super) fn protected_now(&mut self, now: Instant) -> BTreeSet<String> {
        self.protected.retain(|_, until| *until > now);
        self.protected.keys().cloned().collect()
    }
}

/// Whether a nomination still waits: some victim still counts on its node, and it is not too
/// old.
pub(super) fn still_waiting(n: &Nomination, snapshot: &Snapshot, now: Instant) -> bool {
    now.duration_since(n.since) < NOMINATION_TTL
        && n.victims.iter().any(|(key, node)| snapshot.node_pod(node, key).is_some())
}

/// What a root that was not placed holds back from roots of lower priority.
pub(super) enum Held {
    /// Its victims are being evicted: these nodes are nominated for it.
    Preempting(BTreeSet<String>),
    /// It waits: its reservation, if it is the head (`None` otherwise), and what to add to its
    /// message (why no preemption, what it reserves).
    Waiting { reserved: Option<BTreeSet<String>>, note: Option<String> },
}

impl Admitter {
    /// A quorate root that does not fit: preempt for it where its policy allows and victims of
    /// lower priority make it fit; otherwise, when it is the head (`head`: no root of its
    /// priority or higher holds nodes this cycle), reserve the nodes it would take once every
    /// pod of lower priority is gone. Records the nomination or reservation on its memory.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn preempt_or_reserve(
        &mut self,
        key: &RootKey,
        tree: &GroupTree,
        trees: &[GroupTree],
        roots: &HashMap<RootKey, super::GroupRef<'_>>,
        leaf_modes: &HashMap<(&str, &str), DisruptionModeKind>,
        policy: Option<PreemptionPolicy>,
        head: bool,
        snapshot: &Snapshot,
        excluded: &std::collections::HashSet<String>,
        options: &crate::scheduler::PlaceOptions,
        gpus: &(dyn crate::scheduler::GpuChooser + Sync),
    ) -> crate::controllers::context::Result<Held> {
        let preempts = may_preempt(policy);
        if !preempts && !head {
            self.roots.entry(key.clone()).or_default().reserved = None;
            let note = "no preemption: preemptionPolicy is Never; a root of its priority or higher waits before it";
            return Ok(Held::Waiting { reserved: None, note: Some(note.into()) });
        }
        let mut lower: Vec<VictimGroup> = trees
            .iter()
            .filter(|t| t.priority < tree.priority)
            .flat_map(|t| {
                let mode = roots.get(&RootKey::of(&t.namespace, &t.root)).map(|r| r.disruption());
                let leaf_mode = |name: &str| {
                    leaf_modes.get(&(t.namespace.as_str(), name)).copied().unwrap_or(DisruptionModeKind::Single)
                };
                victim_groups(t, mode.unwrap_or(DisruptionModeKind::Single), leaf_mode, snapshot)
            })
            .collect();
        lower.extend(unmanaged_victims(snapshot, tree.priority, excluded));
        let mut notes = Vec::new();
        if preempts {
            let protected = self.protected_now(Instant::now());
            let candidates: Vec<VictimGroup> = lower.iter().filter(|g| !protected.contains(&g.name)).cloned().collect();
            let found = crate::scheduler::preempt(snapshot, tree, true, &candidates, options, gpus);
            tracing::debug!(
                group = %key,
                candidates = candidates.len(),
                protected = protected.len(),
                victims = ?found.as_ref().map(|p| p.pods().map(|v| v.key.clone()).collect::<Vec<_>>()),
                "preemption weighed"
            );
            match found {
                Ok(p) => match self.evict_victims(key, tree.priority, &p, &candidates).await? {
                    Evicted::Done(nomination) => {
                        let nodes = p.nominated_nodes();
                        let memory = self.roots.entry(key.clone()).or_default();
                        let message = format!(
                            "preempting {} pod(s) of lower priority; waiting for them to go (node(s) {} held for it)",
                            nomination.victims.len(),
                            nodes.iter().cloned().collect::<Vec<_>>().join(", ")
                        );
                        memory.outcome =
                            Some(crate::scheduler::status::Outcome::Unschedulable(message, "Preempting".into()));
                        memory.nomination = Some(nomination);
                        memory.reserved = Some(nodes.clone());
                        return Ok(Held::Preempting(nodes));
                    }
                    Evicted::Protected(group, why) => {
                        notes.push(format!("preemption waits: a PodDisruptionBudget protects {group} ({why})"))
                    }
                },
                Err(why) if !protected.is_empty() => notes.push(format!(
                    "no preemption: {why} (protected by a PodDisruptionBudget: {})",
                    protected.iter().cloned().collect::<Vec<_>>().join(", ")
                )),
                Err(why) => notes.push(format!("no preemption: {why}")),
            }
        } else {
            notes.push("no preemption: preemptionPolicy is Never".into());
        }
        // With nothing of lower priority running, it would be placed as it is now: it is not.
        let reserved = if head && !lower.is_empty() {
            crate::scheduler::reservation(snapshot, tree, &lower, options, gpus)
        } else {
            None
        };
        if let Some(nodes) = &reserved {
            notes.push(format!(
                "node(s) {} reserved for it: roots of lower priority are placed elsewhere",
                nodes.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        self.roots.entry(key.clone()).or_default().reserved = reserved.clone();
        Ok(Held::Waiting { reserved, note: Some(notes.join("; ")) })
    }
}
