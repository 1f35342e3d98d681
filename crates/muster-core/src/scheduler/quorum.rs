//! Quorum, exactly upstream's PreEnqueue: a gang PodGroup is quorate with at least `minCount`
//! existing pods, a basic one with one; a CompositePodGroup with at least `minGroupCount`
//! quorate children (basic: one). Only a quorate root with a gated pod goes to placement.
//! Counting only: nothing here looks at nodes.

use std::fmt;

use super::tree::{Group, GroupTree};

/// Whether a group is quorate, bottom-up.
pub fn is_quorate(group: &Group) -> bool {
    let (have, need) = counts(group);
    have >= need
}

/// What quorum counts for a group: (pods or quorate children it has, what it needs).
fn counts(group: &Group) -> (u32, u32) {
    match group {
        Group::Leaf(leaf) => (leaf.active_pods(), leaf.min_count()),
        Group::Composite(c) => {
            let quorate = c.children.iter().filter(|child| is_quorate(child)).count();
            (u32::try_from(quorate).unwrap_or(u32::MAX), c.policy.min_group_count())
        }
    }
}

/// Where a root stands before placement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Quorum {
    /// Quorate with gated pods: try to place it.
    Ready,
    /// Not quorate yet.
    Waiting(QuorumShortfall),
    /// Quorate, but every pod is already admitted or bound.
    NothingGated,
}

/// Why a root is not quorate: its own count and the groups below that hold it back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuorumShortfall {
    /// The root's name.
    pub group: String,
    /// True when the root is a CompositePodGroup (counts are child groups, not pods).
    pub composite: bool,
    /// Pods (leaf) or quorate child groups (composite) it has.
    pub have: u32,
    /// What its policy needs.
    pub need: u32,
    /// Children of a composite root that are not quorate, by name.
    pub waiting_children: Vec<String>,
}

impl fmt::Display for QuorumShortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (have, need, group) = (self.have, self.need, &self.group);
        if self.composite {
            write!(
                f,
                "waiting for quorum: composite group \"{group}\" has {have} quorate child group(s), needs {need}"
            )?;
            if !self.waiting_children.is_empty() {
                write!(f, " (not quorate: {})", self.waiting_children.join(", "))?;
            }
            Ok(())
        } else {
            write!(f, "waiting for quorum: group \"{group}\" has {have} pod(s), needs {need}")
        }
    }
}

/// PreEnqueue for a whole root: quorate and with at least one gated pod.
pub fn quorum(tree: &GroupTree) -> Quorum {
    let (have, need) = counts(&tree.root);
    if have < need {
        let waiting_children = match &tree.root {
            Group::Leaf(_) => Vec::new(),
            Group::Composite(c) => c.children.iter().filter(|g| !is_quorate(g)).map(|g| g.name().to_string()).collect(),
        };
        return Quorum::Waiting(QuorumShortfall {
            group: tree.root.name().to_string(),
            composite: matches!(tree.root, Group::Composite(_)),
            have,
            need,
            waiting_children,
        });
    }
    if tree.root.gated_pods() == 0 { Quorum::NothingGated } else { Quorum::Ready }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::resources::Resources;
    use crate::scheduler::shape::PodShape;
    use crate::scheduler::tree::{CompositeGroup, CompositePolicy, LeafGroup, LeafPolicy, PodState};

    fn leaf(name: &str, policy: LeafPolicy, gated: usize, bound: usize) -> LeafGroup {
        let mut l = LeafGroup::new(name, policy);
        for i in 0..gated {
            l.add_gated(&format!("{name}-g{i}"), "", PodShape::new(Resources::new()));
        }
        for i in 0..bound {
            l.push(&format!("{name}-b{i}"), "", PodState::Bound { node: "n".into() });
        }
        l
    }

    fn gang(min_count: u32) -> LeafPolicy {
        LeafPolicy::Gang { min_count }
    }

    #[test]
    fn leaf_quorum() {
        let cases: &[(&str, LeafGroup, bool)] = &[
            ("gang_needs_min_count_pods", leaf("g", gang(3), 2, 0), false),
            ("gang_with_min_count_pods_is_quorate", leaf("g", gang(3), 3, 0), true),
            ("bound_pods_count_towards_quorum", leaf("g", gang(3), 1, 2), true),
            ("basic_needs_one_pod", leaf("g", LeafPolicy::Basic, 0, 0), false),
            ("basic_with_one_pod_is_quorate", leaf("g", LeafPolicy::Basic, 1, 0), true),
        ];
        for (rule, l, want) in cases {
            assert_eq!(is_quorate(&Group::Leaf(l.clone())), *want, "{rule}");
        }
    }

    #[test]
    fn composite_quorum_is_bottom_up() {
        let two_of = |children: Vec<LeafGroup>| {
            let mut c = CompositeGroup::new("c", CompositePolicy::Gang { min_group_count: 2 });
            c.children = children.into_iter().map(Group::Leaf).collect();
            Group::Composite(c)
        };
        assert!(
            !is_quorate(&two_of(vec![leaf("a", gang(2), 2, 0), leaf("b", gang(2), 1, 0)])),
            "one quorate child of 2"
        );
        assert!(is_quorate(&two_of(vec![leaf("a", gang(2), 2, 0), leaf("b", gang(2), 2, 0)])));
        assert!(!is_quorate(&two_of(vec![leaf("a", gang(1), 1, 0)])), "missing children do not count");
        let basic = CompositeGroup::new("c", CompositePolicy::Basic)
            .with_child(leaf("a", gang(4), 1, 0))
            .with_child(leaf("b", LeafPolicy::Basic, 1, 0));
        assert!(is_quorate(&Group::Composite(basic)), "basic composite needs one quorate child");
        let nested = CompositeGroup::new("root", CompositePolicy::Gang { min_group_count: 1 })
            .with_child(CompositeGroup::new("mid", CompositePolicy::Basic).with_child(leaf("a", gang(2), 1, 0)));
        assert!(!is_quorate(&Group::Composite(nested)), "a non-quorate grandchild keeps the root waiting");
        assert!(!is_quorate(&Group::Composite(CompositeGroup::new("empty", CompositePolicy::Basic))));
    }

    #[test]
    fn roots_need_quorum_and_a_gated_pod() {
        let waiting = GroupTree::new("ns", leaf("train", gang(4), 3, 0));
        let Quorum::Waiting(short) = quorum(&waiting) else { panic!("not quorate") };
        assert_eq!(short.to_string(), "waiting for quorum: group \"train\" has 3 pod(s), needs 4");
        assert_eq!(quorum(&GroupTree::new("ns", leaf("train", gang(4), 4, 0))), Quorum::Ready);
        assert_eq!(quorum(&GroupTree::new("ns", leaf("train", gang(4), 0, 4))), Quorum::NothingGated);
        let composite = CompositeGroup::new("job", CompositePolicy::Gang { min_group_count: 2 })
            .with_child(leaf("a", gang(2), 2, 0))
            .with_child(leaf("b", gang(2), 1, 0));
        let Quorum::Waiting(short) = quorum(&GroupTree::new("ns", composite)) else { panic!("not quorate") };
        assert_eq!(
            short.to_string(),
            "waiting for quorum: composite group \"job\" has 1 quorate child group(s), needs 2 (not quorate: b)"
        );
    }
}
