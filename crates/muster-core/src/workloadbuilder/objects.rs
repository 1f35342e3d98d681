//! Validation of the compiled objects themselves (Workload, PodGroup, CompositePodGroup) for the
//! webhook: the block rules with exact paths, plus what a CRD schema cannot say (template names
//! unique across the tree, counts present, templates neither added nor removed, only
//! `minCount` mutable).

use std::collections::BTreeMap;

use serde::Serialize;

use muster_api::blocks::{DisruptionMode, PodGroupResourceClaim, SchedulingConstraints};
use muster_api::scheduling::{
    CompositePodGroup, CompositePodGroupTemplate, MAX_DEPTH, MAX_TEMPLATES, PodGroup, PodGroupTemplate, Workload,
};

use super::field::{ErrorList, FieldError, FieldPath, is_dns_label, quote};
use super::item::PolicyInput;
use super::validate::{claims_errors, constraints_errors, disruption_mode_errors, policy_block_errors};

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn immutable<T: PartialEq + Serialize>(errs: &mut ErrorList, path: FieldPath, new: &T, old: &T) {
    if new != old {
        errs.push(FieldError::invalid(&path, json(new), "field is immutable"));
    }
}

fn common_blocks(
    errs: &mut ErrorList,
    path: &FieldPath,
    constraints: &Option<SchedulingConstraints>,
    mode: Option<&DisruptionMode>,
    claims: &Option<Vec<PodGroupResourceClaim>>,
) {
    if let Some(c) = constraints {
        errs.extend(constraints_errors(c, &path.child("schedulingConstraints")));
    }
    if let Some(m) = mode {
        errs.extend(disruption_mode_errors(m, &path.child("disruptionMode")));
    }
    if let Some(c) = claims {
        errs.extend(claims_errors(c, &path.child("resourceClaims")));
    }
}

fn leaf_policy(errs: &mut ErrorList, t_path: &FieldPath, policy: &muster_api::blocks::PodGroupSchedulingPolicy) {
    let path = t_path.child("schedulingPolicy");
    errs.extend(policy_block_errors(&PolicyInput::PodGroup(policy.clone()), &path));
    if policy.gang.is_some() && policy.min_count().is_none() {
        errs.push(FieldError::required(&path.child("gang").child("minCount"), ""));
    }
}

fn composite_policy(
    errs: &mut ErrorList,
    t_path: &FieldPath,
    policy: &muster_api::blocks::CompositePodGroupSchedulingPolicy,
) {
    let path = t_path.child("schedulingPolicy");
    errs.extend(policy_block_errors(&PolicyInput::Composite(policy.clone()), &path));
    if policy.gang.is_some() && policy.min_group_count().is_none() {
        errs.push(FieldError::required(&path.child("gang").child("minGroupCount"), ""));
    }
}

struct TreeWalk<'a> {
    errs: ErrorList,
    names: BTreeMap<&'a str, FieldPath>,
    leaves: BTreeMap<&'a str, &'a PodGroupTemplate>,
    composites: BTreeMap<&'a str, &'a CompositePodGroupTemplate>,
}

impl<'a> TreeWalk<'a> {
    fn name(&mut self, name: &'a str, path: FieldPath) {
        if !is_dns_label(name) {
            self.errs.push(FieldError::invalid(&path, quote(name), "must be a DNS label"));
        }
        if let Some(first) = self.names.get(name) {
            self.errs.push(FieldError::duplicate(&path, format!("{} (also at {first})", quote(name))));
        } else {
            self.names.insert(name, path);
        }
    }

    fn leaves(&mut self, list: &'a [PodGroupTemplate], path: &FieldPath) {
        if list.len() > MAX_TEMPLATES {
            self.errs.push(FieldError::too_many(path, list.len(), MAX_TEMPLATES));
        }
        for (i, t) in list.iter().enumerate() {
            let tp = path.index(i);
            self.name(&t.name, tp.child("name"));
            leaf_policy(&mut self.errs, &tp, &t.scheduling_policy);
            common_blocks(
                &mut self.errs,
                &tp,
                &t.scheduling_constraints,
                t.disruption_mode.as_ref(),
                &t.resource_claims,
            );
            self.leaves.insert(&t.name, t);
        }
    }

    fn composites(&mut self, list: &'a [CompositePodGroupTemplate], path: &FieldPath, depth: usize) {
        if list.len() > MAX_TEMPLATES {
            self.errs.push(FieldError::too_many(path, list.len(), MAX_TEMPLATES));
        }
        for (i, t) in list.iter().enumerate() {
            let tp = path.index(i);
            if depth > MAX_DEPTH {
                self.errs.push(FieldError::forbidden(
                    &tp,
                    format!("the template tree may be at most {MAX_DEPTH} levels deep"),
                ));
                continue;
            }
            self.name(&t.name, tp.child("name"));
            composite_policy(&mut self.errs, &tp, &t.scheduling_policy);
            common_blocks(&mut self.errs, &tp, &t.scheduling_constraints, t.disruption_mode.as_ref(), &None);
            let leaves = t.pod_group_templates.as_deref().unwrap_or_default();
            let composites = t.composite_pod_group_templates.as_deref().unwrap_or_default();
            if leaves.is_empty() && composites.is_empty() {
                self.errs.push(FieldError::required(
                    &tp.child("podGroupTemplates"),
                    "a composite template needs at least one child template",
                ));
            }
            self.leaves(leaves, &tp.child("podGroupTemplates"));
            self.composites(composites, &tp.child("compositePodGroupTemplates"), depth + 1);
            self.composites.insert(&t.name, t);
        }
    }
}

/// Every rule for a Workload, with update rules against `old`.
pub fn validate_workload(w: &Workload, old: Option<&Workload>) -> ErrorList {
    let spec = FieldPath::new("spec");
    let mut walk =
        TreeWalk { errs: Vec::new(), names: BTreeMap::new(), leaves: BTreeMap::new(), composites: BTreeMap::new() };
    let leaves = w.spec.pod_group_templates.as_deref().unwrap_or_default();
    let composites = w.spec.composite_pod_group_templates.as_deref().unwrap_or_default();
    if leaves.is_empty() == composites.is_empty() {
        walk.errs.push(FieldError::invalid(
            &spec,
            quote(""),
            "must specify exactly one of: `podGroupTemplates`, `compositePodGroupTemplates`",
        ));
    }
    walk.leaves(leaves, &spec.child("podGroupTemplates"));
    walk.composites(composites, &spec.child("compositePodGroupTemplates"), 1);
    let mut errs = walk.errs;
    if let Some(old) = old {
        immutable(&mut errs, spec.child("controllerRef"), &w.spec.controller_ref, &old.spec.controller_ref);
        let mut before =
            TreeWalk { errs: Vec::new(), names: BTreeMap::new(), leaves: BTreeMap::new(), composites: BTreeMap::new() };
        before.leaves(old.spec.pod_group_templates.as_deref().unwrap_or_default(), &spec);
        before.composites(old.spec.composite_pod_group_templates.as_deref().unwrap_or_default(), &spec, 1);
        let (now_names, then_names): (Vec<&str>, Vec<&str>) =
            (walk.names.keys().copied().collect(), before.names.keys().copied().collect());
        if now_names != then_names {
            errs.push(FieldError::forbidden(&spec, "templates may not be added, removed or renamed"));
        }
        for (name, t) in &walk.leaves {
            if let Some(o) = before.leaves.get(name) {
                let path = walk.names.get(name).cloned().unwrap_or_else(|| spec.clone());
                let mut t_no_count = (*t).clone();
                let mut o_no_count = (*o).clone();
                for x in [&mut t_no_count, &mut o_no_count] {
                    if let Some(g) = x.scheduling_policy.gang.as_mut() {
                        g.min_count = None;
                    }
                }
                if t_no_count != o_no_count {
                    errs.push(FieldError::invalid(
                        &path,
                        quote(name),
                        "field is immutable: only schedulingPolicy.gang.minCount may change",
                    ));
                }
            }
        }
        for (name, t) in &walk.composites {
            if let Some(o) = before.composites.get(name) {
                let strip = |c: &CompositePodGroupTemplate| CompositePodGroupTemplate {
                    pod_group_templates: None,
                    composite_pod_group_templates: None,
                    ..c.clone()
                };
                if strip(t) != strip(o) {
                    let path = walk.names.get(name).cloned().unwrap_or_else(|| spec.clone());
                    errs.push(FieldError::invalid(&path, quote(name), "field is immutable"));
                }
            }
        }
    }
    errs
}

/// Every rule for a PodGroup, with update rules against `old` (only `gang.minCount` may change).
pub fn validate_pod_group(pg: &PodGroup, old: Option<&PodGroup>) -> ErrorList {
    let spec_path = FieldPath::new("spec");
    let s = &pg.spec;
    let mut errs = Vec::new();
    leaf_policy(&mut errs, &spec_path, &s.scheduling_policy);
    common_blocks(&mut errs, &spec_path, &s.scheduling_constraints, Some(&s.disruption_mode), &s.resource_claims);
    if s.parent_composite_pod_group_name.is_some() && s.workload_ref.is_none() {
        errs.push(FieldError::required(&spec_path.child("workloadRef"), "when parentCompositePodGroupName is set"));
    }
    if let Some(old) = old {
        let o = &old.spec;
        let kind_changed = s.scheduling_policy.kind() != o.scheduling_policy.kind();
        if kind_changed {
            errs.push(FieldError::invalid(
                &spec_path.child("schedulingPolicy"),
                json(&s.scheduling_policy),
                "field is immutable: the policy may not change between `basic` and `gang`",
            ));
        }
        immutable(
            &mut errs,
            spec_path.child("parentCompositePodGroupName"),
            &s.parent_composite_pod_group_name,
            &o.parent_composite_pod_group_name,
        );
        immutable(&mut errs, spec_path.child("workloadRef"), &s.workload_ref, &o.workload_ref);
        immutable(
            &mut errs,
            spec_path.child("schedulingConstraints"),
            &s.scheduling_constraints,
            &o.scheduling_constraints,
        );
        immutable(&mut errs, spec_path.child("resourceClaims"), &s.resource_claims, &o.resource_claims);
        immutable(&mut errs, spec_path.child("disruptionMode"), &s.disruption_mode, &o.disruption_mode);
        immutable(&mut errs, spec_path.child("priorityClassName"), &s.priority_class_name, &o.priority_class_name);
        immutable(&mut errs, spec_path.child("priority"), &s.priority, &o.priority);
        immutable(&mut errs, spec_path.child("preemptionPolicy"), &s.preemption_policy, &o.preemption_policy);
    }
    errs
}

/// Every rule for a CompositePodGroup, with update rules against `old` (its spec is immutable).
pub fn validate_composite_pod_group(cpg: &CompositePodGroup, old: Option<&CompositePodGroup>) -> ErrorList {
    let spec_path = FieldPath::new("spec");
    let s = &cpg.spec;
    let mut errs = Vec::new();
    composite_policy(&mut errs, &spec_path, &s.scheduling_policy);
    common_blocks(&mut errs, &spec_path, &s.scheduling_constraints, Some(&s.disruption_mode), &None);
    if let Some(old) = old {
        immutable(&mut errs, spec_path, s, &old.spec);
    }
    errs
}

/// Reason with which a job or set is not acted on when an object muster compiled for it fails
/// [`own_write_refusal`].
pub const INVALID_COMPILED: &str = "InvalidCompiledObject";

/// PURE: muster's own check of a Workload, PodGroup or CompositePodGroup it is about to write,
/// `errors` being [`validate_workload`], [`validate_pod_group`] or
/// [`validate_composite_pod_group`] of it against the object it replaces. The CRDs of these
/// kinds carry no CEL rules (the API server would evaluate them again on every status write),
/// and muster's validating webhook skips muster's own requests, so these rules check muster's
/// writes here, before each create or apply: `Some((reason, message))`, naming every field,
/// means the object is not written and its job or set is not acted on.
pub fn own_write_refusal(kind: &str, name: &str, errors: &[FieldError]) -> Option<(&'static str, String)> {
    (!errors.is_empty()).then(|| {
        (
            INVALID_COMPILED,
            format!("the {kind} {name} muster compiled would be invalid: {}", super::field::joined(errors)),
        )
    })
}

/// A kind muster compiles and writes itself (Workload, PodGroup, CompositePodGroup): its name for
/// messages and its rules ([`validate_workload`], [`validate_pod_group`],
/// [`validate_composite_pod_group`]).
pub trait Compiled: kube_core::Resource + Sized {
    /// The kind, as messages name it.
    const KIND: &'static str;
    /// The rules of the kind, against the object it replaces.
    fn rule_errors(&self, old: Option<&Self>) -> ErrorList;
}

impl Compiled for Workload {
    const KIND: &'static str = "Workload";
    fn rule_errors(&self, old: Option<&Self>) -> ErrorList {
        validate_workload(self, old)
    }
}

impl Compiled for PodGroup {
    const KIND: &'static str = "PodGroup";
    fn rule_errors(&self, old: Option<&Self>) -> ErrorList {
        validate_pod_group(self, old)
    }
}

impl Compiled for CompositePodGroup {
    const KIND: &'static str = "CompositePodGroup";
    fn rule_errors(&self, old: Option<&Self>) -> ErrorList {
        validate_composite_pod_group(self, old)
    }
}

/// PURE: [`own_write_refusal`] of `object`, about to be written over `old` (`None`: created).
pub fn refuse_own_write<T: Compiled>(object: &T, old: Option<&T>) -> Option<(&'static str, String)> {
    let name = object.meta().name.as_deref().unwrap_or_default();
    own_write_refusal(T::KIND, name, &object.rule_errors(old))
}

/// A group's `spec.priority` against its class: a group made by hand gets its priority from its
/// `priorityClassName` (`class_value`: that class's value, or the cluster's global default
/// class's where none is named, 0 without one; `None` when the named class does not exist), as
/// the API server resolves a pod's. A number that disagrees is refused: no one ranks a group at
/// a number no class gives (admission ranks a root at its pods' resolved priority anyway).
pub fn validate_priority(priority: Option<i32>, class: Option<&str>, class_value: Option<i32>) -> ErrorList {
    let spec_path = FieldPath::new("spec");
    match (priority, class_value) {
        (_, None) => {
            vec![FieldError::not_found(&spec_path.child("priorityClassName"), quote(class.unwrap_or_default()))]
        }
        (Some(p), Some(v)) if p != v => {
            let from = match class {
                Some(c) => format!("the value of PriorityClass {}", quote(c)),
                None => "the cluster's default priority (no priorityClassName)".to_string(),
            };
            vec![FieldError::invalid(
                &spec_path.child("priority"),
                p,
                format!("must be {v}, {from}: a group's priority comes from its class"),
            )]
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn muster_writes_nothing_its_own_rules_refuse() {
        assert_eq!(super::own_write_refusal("PodGroup", "train", &[]), None);
        let errors = vec![
            FieldError::invalid(&FieldPath::new("spec").child("priority"), "7", "field is immutable"),
            FieldError::required(
                &FieldPath::new("spec").child("workloadRef"),
                "when parentCompositePodGroupName is set",
            ),
        ];
        let (reason, message) = super::own_write_refusal("PodGroup", "train", &errors).expect("refused");
        assert_eq!(reason, super::INVALID_COMPILED);
        assert!(message.starts_with("the PodGroup train muster compiled would be invalid: "), "{message}");
        assert!(message.contains("spec.priority: Invalid value: 7: field is immutable"), "{message}");
        assert!(message.contains("spec.workloadRef: Required value"), "{message}");
    }

    use super::*;
    use muster_api::blocks::{CompositePodGroupSchedulingPolicy, PodGroupSchedulingPolicy};

    fn leaf(name: &str, min: Option<i32>) -> PodGroupTemplate {
        PodGroupTemplate {
            name: name.into(),
            scheduling_policy: PodGroupSchedulingPolicy::gang(min),
            ..Default::default()
        }
    }

    fn workload(composite: Vec<CompositePodGroupTemplate>) -> Workload {
        Workload::new(
            "w",
            muster_api::WorkloadSpec { composite_pod_group_templates: Some(composite), ..Default::default() },
        )
    }

    #[test]
    fn template_names_are_unique_across_the_tree() {
        let inner = CompositePodGroupTemplate {
            name: "c".into(),
            scheduling_policy: CompositePodGroupSchedulingPolicy::basic(),
            pod_group_templates: Some(vec![leaf("a", Some(1))]),
            ..Default::default()
        };
        let root = CompositePodGroupTemplate {
            name: "root".into(),
            scheduling_policy: CompositePodGroupSchedulingPolicy::basic(),
            pod_group_templates: Some(vec![leaf("a", Some(1))]),
            composite_pod_group_templates: Some(vec![inner]),
            ..Default::default()
        };
        let errs = validate_workload(&workload(vec![root]), None);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(
            errs[0].path.as_str(),
            "spec.compositePodGroupTemplates[0].compositePodGroupTemplates[0].podGroupTemplates[0].name"
        );
    }

    #[test]
    fn gang_templates_need_counts() {
        let w = Workload::new(
            "w",
            muster_api::WorkloadSpec { pod_group_templates: Some(vec![leaf("a", None)]), ..Default::default() },
        );
        let errs = validate_workload(&w, None);
        assert_eq!(
            errs.iter().map(|e| e.path.to_string()).collect::<Vec<_>>(),
            vec!["spec.podGroupTemplates[0].schedulingPolicy.gang.minCount"]
        );
    }

    #[test]
    fn only_min_count_changes_in_a_workload() {
        let old = Workload::new(
            "w",
            muster_api::WorkloadSpec { pod_group_templates: Some(vec![leaf("a", Some(2))]), ..Default::default() },
        );
        let ok = Workload::new(
            "w",
            muster_api::WorkloadSpec { pod_group_templates: Some(vec![leaf("a", Some(3))]), ..Default::default() },
        );
        assert!(validate_workload(&ok, Some(&old)).is_empty());
        let mut bad = ok.clone();
        if let Some(t) = bad.spec.pod_group_templates.as_mut() {
            t[0].scheduling_constraints = Some(SchedulingConstraints::topology("rack"));
        }
        assert_eq!(validate_workload(&bad, Some(&old)).len(), 1);
        let renamed = Workload::new(
            "w",
            muster_api::WorkloadSpec { pod_group_templates: Some(vec![leaf("b", Some(2))]), ..Default::default() },
        );
        assert!(validate_workload(&renamed, Some(&old)).iter().any(|e| e.kind == super::super::ErrorType::Forbidden));
    }

    #[test]
    fn pod_group_updates_keep_all_but_min_count() {
        let old = PodGroup::new(
            "g",
            muster_api::PodGroupSpec {
                scheduling_policy: PodGroupSchedulingPolicy::gang(Some(2)),
                disruption_mode: DisruptionMode::single(),
                ..Default::default()
            },
        );
        let mut new = old.clone();
        new.spec.scheduling_policy = PodGroupSchedulingPolicy::gang(Some(4));
        assert!(validate_pod_group(&new, Some(&old)).is_empty());
        new.spec.disruption_mode = DisruptionMode::all();
        new.spec.scheduling_policy = PodGroupSchedulingPolicy::basic();
        let paths: Vec<String> = validate_pod_group(&new, Some(&old)).iter().map(|e| e.path.to_string()).collect();
        assert_eq!(paths, vec!["spec.schedulingPolicy", "spec.disruptionMode"]);
    }

    #[test]
    fn each_compiled_kind_is_refused_by_its_own_rules_under_its_kind_and_name() {
        let pg = PodGroup::new(
            "g",
            muster_api::PodGroupSpec {
                scheduling_policy: PodGroupSchedulingPolicy::gang(Some(2)),
                disruption_mode: DisruptionMode::single(),
                ..Default::default()
            },
        );
        assert_eq!(refuse_own_write(&pg, None), None);
        assert_eq!(refuse_own_write(&pg, Some(&pg)), None);
        let mut all = pg.clone();
        all.spec.disruption_mode = DisruptionMode::all();
        let (reason, message) = refuse_own_write(&all, Some(&pg)).expect("a frozen field changed");
        assert_eq!(reason, INVALID_COMPILED);
        assert!(
            message.starts_with("the PodGroup g muster compiled would be invalid: spec.disruptionMode"),
            "{message}"
        );
        let cpg = CompositePodGroup::new(
            "c",
            muster_api::CompositePodGroupSpec {
                scheduling_policy: CompositePodGroupSchedulingPolicy::gang(Some(2)),
                disruption_mode: DisruptionMode::single(),
                ..Default::default()
            },
        );
        let mut resized = cpg.clone();
        resized.spec.scheduling_policy = CompositePodGroupSchedulingPolicy::gang(Some(1));
        assert_eq!(refuse_own_write(&cpg, Some(&cpg)), None);
        let (_, message) = refuse_own_write(&resized, Some(&cpg)).expect("its spec is immutable");
        assert!(message.starts_with("the CompositePodGroup c muster compiled"), "{message}");
        let mut twice = workload(vec![]);
        twice.spec.pod_group_templates = Some(vec![leaf("a", Some(1)), leaf("a", Some(1))]);
        let (_, message) = refuse_own_write(&twice, None).expect("a template name twice");
        assert!(message.starts_with("the Workload w muster compiled"), "{message}");
    }

    #[test]
    fn composite_pod_group_spec_is_immutable() {
        let old = CompositePodGroup::new(
            "c",
            muster_api::CompositePodGroupSpec {
                scheduling_policy: CompositePodGroupSchedulingPolicy::gang(Some(2)),
                disruption_mode: DisruptionMode::single(),
                ..Default::default()
            },
        );
        let mut new = old.clone();
        new.spec.scheduling_policy = CompositePodGroupSchedulingPolicy::gang(Some(1));
        assert_eq!(validate_composite_pod_group(&new, Some(&old)).len(), 1);
        assert!(validate_composite_pod_group(&old, Some(&old)).is_empty());
    }

    #[test]
    fn a_groups_priority_is_its_class_value() {
        /// (what, priority, class, the class's value, the errors)
        type Case = (&'static str, Option<i32>, Option<&'static str>, Option<i32>, &'static str);
        let cases: [Case; 6] = [
            ("unset, class exists", None, Some("high"), Some(1000), ""),
            ("equal to the class", Some(1000), Some("high"), Some(1000), ""),
            (
                "above its class",
                Some(1_000_000),
                Some("low"),
                Some(100),
                r#"spec.priority: Invalid value: 1000000: must be 100, the value of PriorityClass "low": a group's priority comes from its class"#,
            ),
            (
                "no class, a number",
                Some(5),
                None,
                Some(0),
                "spec.priority: Invalid value: 5: must be 0, the cluster's default priority (no priorityClassName): a group's priority comes from its class",
            ),
            ("no class, the default", Some(0), None, Some(0), ""),
            (
                "a class that does not exist",
                Some(7),
                Some("nope"),
                None,
                r#"spec.priorityClassName: Not found: "nope""#,
            ),
        ];
        for (what, priority, class, value, want) in cases {
            let got: Vec<String> = validate_priority(priority, class, value).iter().map(|e| e.to_string()).collect();
            assert_eq!(got.join("; "), want, "{what}");
        }
    }
}
