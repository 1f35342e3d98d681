//! Gangs disrupted after they started: under a root in disruption mode `all`, the gangs that
//! lost pods below minCount, and the started pods to delete so they restart whole.

use std::collections::{BTreeMap, BTreeSet};

use crate::scheduler::tree::{CompositePolicy, Group, GroupTree, LeafPolicy};

/// A gang of a root in disruption mode `all` that lost pods after it started: the pods of
/// the gang still running, to delete so the gang restarts whole (their controller recreates
/// them gated, with the lost ones).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disrupted {
    /// The gang PodGroup.
    pub group: String,
    /// Its started pods left (bound or admitted, live).
    pub started: u32,
    /// Its minCount.
    pub min_count: u32,
    /// The started pods (name, UID): delete them all.
    pub delete: Vec<(String, String)>,
    /// Set when this gang lost nothing itself: the gang of the same CompositePodGroup tree
    /// that did, which takes it down with it.
    pub with: Option<String>,
}

/// The gangs of a tree (under a root in disruption mode `all`) that started and then lost
/// pods, so fewer than minCount of them are still started: left alone, the lost pods'
/// replacements would be placed one by one beside the survivors, or wait gated while the
/// survivors run, a gang partly started. Mode `all` says the gang is disrupted as a whole.
/// Pods that finished (`finished`: per PodGroup, succeeded or failed) count as started: a pod
/// that completed is no disruption. A tree whose root has a plan in flight is the commit
/// protocol's, not this check's. Under a gang CompositePodGroup root the set was admitted as one,
/// so one gang disrupted takes the started pods of every other group of the tree down too: the
/// set starts again whole, not a driver running beside workers that wait gated.
pub fn disrupted(tree: &GroupTree, finished: &BTreeMap<String, u32>) -> Vec<Disrupted> {
    let mut out = Vec::new();
    collect_disrupted(&tree.root, finished, &mut out);
    let set_as_one = matches!(&tree.root, Group::Composite(c) if matches!(c.policy, CompositePolicy::Gang { .. }));
    if let (Some(first), true) = (out.first(), set_as_one) {
        let cause = first.group.clone();
        let hit: BTreeSet<String> = out.iter().map(|d| d.group.clone()).collect();
        collect_with(&tree.root, &hit, &cause, &mut out);
    }
    out
}

/// The groups of a tree not in `hit` that have started pods, taken down with gang `cause`.
fn collect_with(group: &Group, hit: &BTreeSet<String>, cause: &str, out: &mut Vec<Disrupted>) {
    match group {
        Group::Composite(c) => c.children.iter().for_each(|g| collect_with(g, hit, cause, out)),
        Group::Leaf(l) if !hit.contains(&l.name) => {
            let started = l.placed_names();
            if !started.is_empty() {
                let min_count = match l.policy {
                    LeafPolicy::Gang { min_count } => min_count,
                    LeafPolicy::Basic => 0,
                };
                let n = u32::try_from(started.len()).unwrap_or(u32::MAX);
                out.push(Disrupted {
                    group: l.name.clone(),
                    started: n,
                    min_count,
                    delete: started,
                    with: Some(cause.to_string()),
                });
            }
        }
        Group::Leaf(_) => {}
    }
}

fn collect_disrupted(group: &Group, finished: &BTreeMap<String, u32>, out: &mut Vec<Disrupted>) {
    match group {
        Group::Composite(c) => c.children.iter().for_each(|g| collect_disrupted(g, finished, out)),
        Group::Leaf(l) => {
            let LeafPolicy::Gang { min_count } = l.policy else { return };
            let started = l.placed_names();
            let n = u32::try_from(started.len()).unwrap_or(u32::MAX);
            let done = finished.get(&l.name).copied().unwrap_or(0);
            if n > 0 && n.saturating_add(done) < min_count {
                out.push(Disrupted { group: l.name.clone(), started: n, min_count, delete: started, with: None });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_gang_below_min_count_is_disrupted_whole() {
        use crate::scheduler::tree::{LeafGroup, PodState};
        let leaf = |name: &str, policy: LeafPolicy, states: Vec<PodState>| {
            let mut l = LeafGroup::new(name, policy);
            for (i, s) in states.into_iter().enumerate() {
                l.push(&format!("{name}-{i}"), &format!("u-{name}-{i}"), s);
            }
            l
        };
        let bound = || PodState::Bound { node: "n".into() };
        let pinned = || PodState::Admitted { hostname: "n".into() };
        let gated = || PodState::Gated { shape: 0 };
        let gang = |m| LeafPolicy::Gang { min_count: m };
        let cases = [
            ("whole gang running", leaf("a", gang(3), vec![bound(), bound(), pinned()]), vec![]),
            ("not started yet", leaf("a", gang(3), vec![gated(), gated(), gated()]), vec![]),
            ("one lost, its replacement gated", leaf("a", gang(3), vec![bound(), pinned(), gated()]), vec![2]),
            ("one lost, not replaced yet", leaf("a", gang(3), vec![bound(), bound()]), vec![2]),
            ("extra pods beyond minCount lost", leaf("a", gang(2), vec![bound(), bound(), gated()]), vec![]),
            ("a basic group runs what it has", leaf("a", LeafPolicy::Basic, vec![bound(), gated()]), vec![]),
        ];
        for (name, l, want) in cases {
            let tree = GroupTree::new("ns", l);
            let got: Vec<u32> = disrupted(&tree, &BTreeMap::new()).iter().map(|d| d.started).collect();
            assert_eq!(got, want, "{name}");
        }
        let early = GroupTree::new("ns", leaf("a", gang(3), vec![bound(), bound()]));
        let done = BTreeMap::from([("a".to_string(), 1)]);
        assert_eq!(disrupted(&early, &done), vec![], "a pod that completed is no disruption");
        let l = leaf("a", gang(3), vec![bound(), gated(), pinned()]);
        let d = disrupted(&GroupTree::new("ns", l), &BTreeMap::new());
        let names: Vec<&str> = d[0].delete.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a-0", "a-2"], "the started pods are deleted, the gated ones kept");

        // A set admitted as one (gang composite): the workers lose a pod, the running driver goes
        // down with them, and a child not started yet has nothing to delete.
        use crate::scheduler::tree::CompositeGroup;
        let set = |policy| {
            CompositeGroup::new("set", policy)
                .with_child(leaf("driver", gang(1), vec![bound()]))
                .with_child(leaf("workers", gang(2), vec![bound(), gated()]))
                .with_child(leaf("idle", gang(1), vec![gated()]))
        };
        let d = disrupted(&GroupTree::new("ns", set(CompositePolicy::Gang { min_group_count: 3 })), &BTreeMap::new());
        let got: Vec<(&str, Option<&str>, usize)> =
            d.iter().map(|d| (d.group.as_str(), d.with.as_deref(), d.delete.len())).collect();
        assert_eq!(got, [("workers", None, 1), ("driver", Some("workers"), 1)]);
        let d = disrupted(&GroupTree::new("ns", set(CompositePolicy::Basic)), &BTreeMap::new());
        let got: Vec<&str> = d.iter().map(|d| d.group.as_str()).collect();
        assert_eq!(got, ["workers"], "children admitted one by one go down one by one");
        let whole = CompositeGroup::new("set", CompositePolicy::Gang { min_group_count: 2 })
            .with_child(leaf("driver", gang(1), vec![bound()]))
            .with_child(leaf("workers", gang(2), vec![bound(), bound()]));
        assert_eq!(disrupted(&GroupTree::new("ns", whole), &BTreeMap::new()), vec![], "nothing lost: nothing down");
    }
}
