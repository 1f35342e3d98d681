//! Table tests (one per rule) and property tests of the workloadbuilder.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use proptest::prelude::*;

use super::field::ErrorType;
use super::job::{default_min_count, job_item, jobset_item, validate_job, validate_jobset};
use super::*;
use muster_api::batch::{MusterJobSetSpec, MusterJobSpec, MusterJobTemplate, ReplicatedJob};
use muster_api::blocks::*;
use muster_api::scheduling::{MAX_DEPTH, MAX_TEMPLATES, Workload};
use muster_api::{MusterJob, MusterJobSet};

fn owner() -> OwnerReference {
    OwnerReference {
        api_version: "batch.muster.dev/v1alpha1".into(),
        kind: "MusterJob".into(),
        name: "train".into(),
        uid: "uid-1".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn opts() -> BuildOptions {
    BuildOptions::all_allowed("train", "ns", Some(owner()))
}

fn job_spec(parallelism: i32, scheduling: Option<PodGroupScheduling>) -> MusterJobSpec {
    serde_json::from_value(serde_json::json!({
        "parallelism": parallelism,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}},
    }))
    .map(|mut s: MusterJobSpec| {
        s.scheduling = scheduling;
        s
    })
    .expect("valid spec fixture")
}

fn gang(min_count: Option<i32>) -> PodGroupScheduling {
    PodGroupScheduling { scheduling_policy: Some(PodGroupSchedulingPolicy::gang(min_count)), ..Default::default() }
}

fn leaf(spec: &MusterJobSpec) -> WorkloadItem {
    job_item(spec, "main", &FieldPath::new("spec"))
}

fn validate(item: WorkloadItem, old: Option<&WorkloadItem>) -> ErrorList {
    Builder::new(item, opts()).validate(old)
}

fn paths(errs: &ErrorList) -> Vec<String> {
    errs.iter().map(|e| e.path.to_string()).collect()
}

fn template_of(w: &Workload) -> &muster_api::PodGroupTemplate {
    &w.spec.pod_group_templates.as_ref().expect("leaf templates")[0]
}

// === defaults and merge ===

#[test]
fn no_scheduling_compiles_to_basic() {
    let b = Builder::new(leaf(&job_spec(3, None)), opts());
    assert!(b.validate(None).is_empty());
    let w = b.build_workload().expect("builds");
    assert_eq!(template_of(w).scheduling_policy, PodGroupSchedulingPolicy::basic());
    assert_eq!(template_of(w).disruption_mode, None);
}

#[test]
fn gang_min_count_defaults_to_parallelism() {
    let w = Builder::new(leaf(&job_spec(6, Some(gang(None)))), opts()).build_workload().cloned().expect("builds");
    assert_eq!(template_of(&w).scheduling_policy.min_count(), Some(6));
}

#[test]
fn gang_min_count_default_is_at_least_one() {
    assert_eq!(default_min_count(0), 1);
    let w = Builder::new(leaf(&job_spec(0, Some(gang(None)))), opts()).build_workload().cloned().expect("builds");
    assert_eq!(template_of(&w).scheduling_policy.min_count(), Some(1));
}

#[test]
fn explicit_min_count_wins_over_default() {
    let w = Builder::new(leaf(&job_spec(6, Some(gang(Some(4))))), opts()).build_workload().cloned().expect("builds");
    assert_eq!(template_of(&w).scheduling_policy.min_count(), Some(4));
}

#[test]
fn empty_user_block_does_not_override_default() {
    let mut item = WorkloadItem::new("main", FieldPath::new("spec"));
    item.default_config.policy = Some(PodGroupSchedulingPolicy::gang(Some(2)));
    item.default_config.disruption_mode = Some(DisruptionMode::all());
    item.input.policy =
        Some(Block::new(PolicyInput::PodGroup(PodGroupSchedulingPolicy::default()), FieldPath::new("p")));
    item.input.disruption_mode = Some(Block::new(DisruptionMode::default(), FieldPath::new("m")));
    item.input.constraints = Some(Block::new(SchedulingConstraints { topology: Some(vec![]) }, FieldPath::new("c")));
    let c = item.resolve();
    assert_eq!(c.policy, Some(PodGroupSchedulingPolicy::gang(Some(2))));
    assert_eq!(c.disruption_mode, Some(DisruptionMode::all()));
    assert_eq!(c.constraints, None);
}

#[test]
fn user_block_replaces_default_block_whole() {
    let mut item = WorkloadItem::new("main", FieldPath::new("spec"));
    item.default_config.policy = Some(PodGroupSchedulingPolicy::gang(Some(2)));
    item.input.policy =
        Some(Block::new(PolicyInput::PodGroup(PodGroupSchedulingPolicy::gang(None)), FieldPath::new("p")));
    // The default's minCount does not leak into the user's gang block.
    assert_eq!(item.resolve().policy, Some(PodGroupSchedulingPolicy::gang(None)));
}

#[test]
fn callbacks_run_in_order_after_merge() {
    let mut item = WorkloadItem::new("main", FieldPath::new("spec"));
    item.callbacks.push(Arc::new(|c: &mut SchedulingConfig| c.priority_class_name = Some("a".into())));
    item.callbacks.push(Arc::new(|c: &mut SchedulingConfig| {
        let prev = c.priority_class_name.clone().unwrap_or_default();
        c.priority_class_name = Some(format!("{prev}b"));
    }));
    assert_eq!(item.resolve().priority_class_name.as_deref(), Some("ab"));
}

#[test]
fn priority_class_comes_from_the_pod_template() {
    let mut spec = job_spec(2, None);
    spec.template.spec.as_mut().expect("pod spec").priority_class_name = Some("high".into());
    let w = Builder::new(leaf(&spec), opts()).build_workload().cloned().expect("builds");
    assert_eq!(template_of(&w).priority_class_name.as_deref(), Some("high"));
}

// === structural rules ===

#[test]
fn policy_union_requires_one_member() {
    let s = PodGroupScheduling { scheduling_policy: Some(PodGroupSchedulingPolicy::default()), ..Default::default() };
    let errs = validate(leaf(&job_spec(2, Some(s))), None);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(
        errs[0].to_string(),
        "spec.scheduling.schedulingPolicy: Invalid value: \"\": must specify one of: `basic`, `gang`"
    );
}

#[test]
fn policy_union_allows_only_one_member() {
    let p = PodGroupSchedulingPolicy { basic: Some(Empty {}), gang: Some(GangSchedulingPolicy { min_count: Some(1) }) };
    let s = PodGroupScheduling { scheduling_policy: Some(p), ..Default::default() };
    let errs = validate(leaf(&job_spec(2, Some(s))), None);
    assert!(errs.iter().any(|e| e.detail == "must specify exactly one of: `basic`, `gang`"), "{errs:?}");
}

#[test]
fn min_count_must_be_positive() {
    let errs = validate(leaf(&job_spec(2, Some(gang(Some(0))))), None);
    assert_eq!(paths(&errs), vec!["spec.scheduling.schedulingPolicy.gang.minCount"]);
    assert_eq!(errs[0].kind, ErrorType::Invalid);
}

#[test]
fn min_count_may_not_exceed_parallelism() {
    let errs = validate(leaf(&job_spec(2, Some(gang(Some(3))))), None);
    assert_eq!(errs.len(), 1);
    assert_eq!(
        errs[0].to_string(),
        "spec.scheduling.schedulingPolicy.gang.minCount: Invalid value: 3: must be less than or equal to parallelism (2)"
    );
}

#[test]
fn topology_allows_one_constraint() {
    let c = SchedulingConstraints {
        topology: Some(vec![TopologyConstraint { key: "a".into() }, TopologyConstraint { key: "b".into() }]),
    };
    let s = PodGroupScheduling { scheduling_constraints: Some(c), ..gang(None) };
    let errs = validate(leaf(&job_spec(2, Some(s))), None);
    assert_eq!(paths(&errs), vec!["spec.scheduling.schedulingConstraints.topology"]);
    assert_eq!(errs[0].kind, ErrorType::TooMany);
}

#[test]
fn topology_key_must_be_a_label_key() {
    for (key, kind) in [("", ErrorType::Required), ("bad key", ErrorType::Invalid), ("-x/y", ErrorType::Invalid)] {
        let s = PodGroupScheduling { scheduling_constraints: Some(SchedulingConstraints::topology(key)), ..gang(None) };
        let errs = validate(leaf(&job_spec(2, Some(s))), None);
        assert!(!errs.is_empty(), "{key:?}");
        assert!(
            errs.iter()
                .all(|e| e.path.as_str() == "spec.scheduling.schedulingConstraints.topology[0].key" && e.kind == kind),
            "{key:?}: {errs:?}"
        );
    }
}

#[test]
fn disruption_mode_union_requires_one_member() {
    let s = PodGroupScheduling { disruption_mode: Some(DisruptionMode::default()), ..gang(None) };
    let errs = validate(leaf(&job_spec(2, Some(s))), None);
    assert_eq!(errs.len(), 1);
    assert_eq!(
        errs[0].to_string(),
        "spec.scheduling.disruptionMode: Invalid value: \"\": must specify one of: `single`, `all`"
    );
}

fn claim(name: &str, claim: Option<&str>, template: Option<&str>) -> PodGroupResourceClaim {
    PodGroupResourceClaim {
        name: name.into(),
        resource_claim_name: claim.map(Into::into),
        resource_claim_template_name: template.map(Into::into),
    }
}

#[test]
fn claims_are_limited_to_four() {
    let claims = (0..5).map(|i| claim(&format!("c{i}"), Some("x"), None)).collect();
    let s = PodGroupScheduling { resource_claims: Some(claims), ..gang(None) };
    let errs = validate(leaf(&job_spec(2, Some(s))), None);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].to_string(), "spec.scheduling.resourceClaims: Too many: 5: must have at most 4 items");
}

#[test]
fn claim_names_are_unique() {
    let s = PodGroupScheduling {
        resource_claims: Some(vec![claim("a", Some("x"), None), claim("a", None, Some("t"))]),
        ..gang(None)
    };
    let errs = validate(leaf(&job_spec(2, Some(s))), None);
    assert_eq!(paths(&errs), vec!["spec.scheduling.resourceClaims[1].name"]);
    assert_eq!(errs[0].kind, ErrorType::Duplicate);
}

#[test]
fn claim_needs_exactly_one_source() {
    for (c, detail) in [
        (claim("a", None, None), "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`"),
        (
            claim("a", Some("x"), Some("y")),
            "must specify exactly one of: `resourceClaimName`, `resourceClaimTemplateName`",
        ),
    ] {
        let s = PodGroupScheduling { resource_claims: Some(vec![c]), ..gang(None) };
        let errs = validate(leaf(&job_spec(2, Some(s))), None);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].path.as_str(), "spec.scheduling.resourceClaims[0]");
        assert_eq!(errs[0].detail, detail);
    }
}

#[test]
fn claim_names_are_dns_names() {
    let s = PodGroupScheduling { resource_claims: Some(vec![claim("A_b", Some("Not/valid"), None)]), ..gang(None) };
    let errs = validate(leaf(&job_spec(2, Some(s))), None);
    let p = paths(&errs);
    assert!(p.contains(&"spec.scheduling.resourceClaims[0].name".to_string()), "{p:?}");
    assert!(p.contains(&"spec.scheduling.resourceClaims[0].resourceClaimName".to_string()), "{p:?}");
}

#[test]
fn structural_validation_can_be_disabled() {
    let s =
        PodGroupScheduling { scheduling_constraints: Some(SchedulingConstraints::topology("bad key")), ..gang(None) };
    let mut o = opts();
    o.disable_structural_validation = true;
    assert!(Builder::new(leaf(&job_spec(2, Some(s))), o).validate(None).is_empty());
}

// === allow-lists and cross-field rules ===

#[test]
fn empty_allow_list_allows_nothing_not_even_the_default() {
    let mut o = opts();
    o.allowed_policies.clear();
    let errs = Builder::new(leaf(&job_spec(2, None)), o).validate(None);
    assert_eq!(errs.len(), 1);
    assert_eq!(
        errs[0].to_string(),
        "spec.scheduling.schedulingPolicy: Forbidden: basic scheduling policy is not supported by this controller"
    );
}

#[test]
fn disallowed_disruption_mode_is_forbidden() {
    let mut o = opts();
    o.allowed_disruption_modes = vec![DisruptionModeKind::Single];
    let s = PodGroupScheduling { disruption_mode: Some(DisruptionMode::all()), ..gang(None) };
    let errs = Builder::new(leaf(&job_spec(2, Some(s))), o).validate(None);
    assert_eq!(errs.len(), 1);
    assert_eq!(
        errs[0].to_string(),
        "spec.scheduling.disruptionMode: Forbidden: the disruptionMode `all` is not supported by this controller"
    );
}

#[test]
fn basic_with_disruption_mode_all_is_rejected_at_the_mode_path() {
    let s = PodGroupScheduling { disruption_mode: Some(DisruptionMode::all()), ..Default::default() };
    let errs = validate(leaf(&job_spec(2, Some(s))), None);
    assert_eq!(errs.len(), 1);
    assert_eq!(
        errs[0].to_string(),
        "spec.scheduling.disruptionMode: Invalid value: \"\": the disruptionMode `all` is not supported with the Basic scheduling policy"
    );
}

#[test]
fn gang_with_disruption_mode_all_is_fine() {
    let s = PodGroupScheduling { disruption_mode: Some(DisruptionMode::all()), ..gang(Some(2)) };
    assert!(validate(leaf(&job_spec(2, Some(s))), None).is_empty());
}

#[test]
fn gang_without_any_count_is_required() {
    let mut item = WorkloadItem::new("main", FieldPath::new("spec"));
    item.input.policy =
        Some(Block::new(PolicyInput::PodGroup(PodGroupSchedulingPolicy::gang(None)), FieldPath::new("p")));
    let errs = validate(item.clone(), None);
    assert_eq!(paths(&errs), vec!["p.gang.minCount"]);
    assert_eq!(
        Builder::new(item, opts()).build_workload().err(),
        Some(BuildError::MissingCount { template: "main".into(), field: "minCount" })
    );
}

// === update rules ===

#[test]
fn min_count_may_change() {
    let old = leaf(&job_spec(4, Some(gang(Some(2)))));
    assert!(validate(leaf(&job_spec(4, Some(gang(Some(4))))), Some(&old)).is_empty());
}

#[test]
fn parallelism_may_change_and_moves_the_default_min_count() {
    let old = leaf(&job_spec(4, Some(gang(None))));
    let new = leaf(&job_spec(6, Some(gang(None))));
    assert!(validate(new.clone(), Some(&old)).is_empty());
    assert_eq!(new.resolve().policy.and_then(|p| p.min_count()), Some(6));
}

#[test]
fn policy_variant_is_frozen() {
    let old = leaf(&job_spec(2, None));
    let errs = validate(leaf(&job_spec(2, Some(gang(Some(2))))), Some(&old));
    assert_eq!(paths(&errs), vec!["spec.scheduling.schedulingPolicy"]);
    assert!(errs[0].detail.starts_with("field is immutable"));
}

#[test]
fn writing_out_the_default_is_no_change() {
    let old = leaf(&job_spec(2, None));
    let s = PodGroupScheduling { scheduling_policy: Some(PodGroupSchedulingPolicy::basic()), ..Default::default() };
    assert!(validate(leaf(&job_spec(2, Some(s))), Some(&old)).is_empty());
}

#[test]
fn constraints_mode_and_claims_are_frozen() {
    let old = leaf(&job_spec(2, Some(gang(None))));
    let cases: Vec<(PodGroupScheduling, &str)> = vec![
        (
            PodGroupScheduling { scheduling_constraints: Some(SchedulingConstraints::topology("rack")), ..gang(None) },
            "spec.scheduling.schedulingConstraints",
        ),
        (
            PodGroupScheduling { disruption_mode: Some(DisruptionMode::all()), ..gang(None) },
            "spec.scheduling.disruptionMode",
        ),
        (
            PodGroupScheduling { resource_claims: Some(vec![claim("a", Some("x"), None)]), ..gang(None) },
            "spec.scheduling.resourceClaims",
        ),
    ];
    for (s, path) in cases {
        let errs = validate(leaf(&job_spec(2, Some(s))), Some(&old));
        assert_eq!(paths(&errs), vec![path]);
        assert_eq!(errs[0].detail, "field is immutable");
    }
}

#[test]
fn unchanged_invalid_blocks_are_ratcheted() {
    let bad =
        PodGroupScheduling { scheduling_constraints: Some(SchedulingConstraints::topology("bad key")), ..gang(None) };
    let old = leaf(&job_spec(2, Some(bad.clone())));
    assert!(validate(leaf(&job_spec(2, Some(bad))), Some(&old)).is_empty());
}

// === tree shape ===

fn composite(name: &str, children: Vec<WorkloadItem>) -> WorkloadItem {
    let mut item = WorkloadItem::new(name, FieldPath::new(name));
    item.input.policy = Some(Block::new(
        PolicyInput::Composite(CompositePodGroupSchedulingPolicy::basic()),
        FieldPath::new(name).child("schedulingPolicy"),
    ));
    item.children = children;
    item
}

fn named_leaf(name: &str) -> WorkloadItem {
    WorkloadItem::new(name, FieldPath::new(name))
}

#[test]
fn template_names_are_unique_across_the_tree() {
    let errs = validate(composite("root", vec![named_leaf("a"), composite("c", vec![named_leaf("a")])]), None);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].kind, ErrorType::InternalError);
}

#[test]
fn tree_is_at_most_four_deep() {
    let deep =
        composite("l1", vec![composite("l2", vec![composite("l3", vec![composite("l4", vec![named_leaf("l5")])])])]);
    let errs = validate(deep, None);
    assert_eq!(paths(&errs), vec!["l5"]);
    let ok = composite("l1", vec![composite("l2", vec![composite("l3", vec![named_leaf("l4")])])]);
    assert!(validate(ok, None).is_empty());
}

#[test]
fn at_most_eight_templates_per_kind() {
    let root = composite("root", (0..9).map(|i| named_leaf(&format!("c{i}"))).collect());
    let errs = validate(root, None);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].kind, ErrorType::TooMany);
}

#[test]
fn leaf_and_composite_data_are_not_mixed() {
    let mut root = composite("root", vec![named_leaf("a")]);
    root.input.policy = Some(Block::new(PolicyInput::PodGroup(PodGroupSchedulingPolicy::basic()), FieldPath::new("p")));
    let errs = validate(root, None);
    assert_eq!(errs[0].kind, ErrorType::InternalError);
    let mut l = named_leaf("a");
    l.input.resource_claims = None;
    let mut c = composite("root", vec![l]);
    c.input.resource_claims = Some(Block::new(vec![], FieldPath::new("claims")));
    assert_eq!(validate(c, None)[0].kind, ErrorType::InternalError);
}

#[test]
fn root_name_may_not_change_on_update() {
    let errs = validate(named_leaf("b"), Some(&named_leaf("a")));
    assert!(errs.iter().any(|e| e.kind == ErrorType::InternalError), "{errs:?}");
}

// === composite (MusterJobSet) ===

fn set_spec(scheduling: Option<CompositePodGroupScheduling>, rjobs: &[(&str, i32, i32)]) -> MusterJobSetSpec {
    MusterJobSetSpec {
        scheduling,
        replicated_jobs: rjobs
            .iter()
            .map(|(name, replicas, parallelism)| ReplicatedJob {
                name: name.to_string(),
                replicas: *replicas,
                template: MusterJobTemplate { metadata: None, spec: job_spec(*parallelism, Some(gang(None))) },
                group_name: None,
                depends_on: vec![],
            })
            .collect(),
        ..Default::default()
    }
}

fn composite_gang(min: Option<i32>) -> CompositePodGroupScheduling {
    CompositePodGroupScheduling {
        scheduling_policy: Some(CompositePodGroupSchedulingPolicy::gang(min)),
        ..Default::default()
    }
}

#[test]
fn min_group_count_defaults_to_the_number_of_child_groups() {
    let root =
        jobset_item(&set_spec(Some(composite_gang(None)), &[("driver", 1, 1), ("workers", 3, 4)])).expect("tree");
    let b = Builder::new(root, opts());
    assert!(b.validate(None).is_empty());
    let w = b.build_workload().expect("builds");
    let t = &w.spec.composite_pod_group_templates.as_ref().expect("composite")[0];
    assert_eq!(t.scheduling_policy.min_group_count(), Some(4));
    let leaves = t.pod_group_templates.as_ref().expect("leaves");
    assert_eq!(leaves.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), vec!["driver", "workers"]);
    assert_eq!(leaves[1].scheduling_policy.min_count(), Some(4));
}

#[test]
fn min_group_count_may_not_exceed_child_groups() {
    let root =
        jobset_item(&set_spec(Some(composite_gang(Some(5))), &[("driver", 1, 1), ("workers", 3, 4)])).expect("tree");
    let errs = validate(root, None);
    assert_eq!(errs.len(), 1);
    assert_eq!(
        errs[0].to_string(),
        "spec.scheduling.schedulingPolicy.gang.minGroupCount: Invalid value: 5: must be less than or equal to the number of child groups (4)"
    );
}

#[test]
fn min_group_count_is_frozen() {
    let old = jobset_item(&set_spec(Some(composite_gang(Some(1))), &[("a", 2, 1)])).expect("tree");
    let new = jobset_item(&set_spec(Some(composite_gang(Some(2))), &[("a", 2, 1)])).expect("tree");
    assert_eq!(paths(&validate(new, Some(&old))), vec!["spec.scheduling.schedulingPolicy.gang.minGroupCount"]);
}

#[test]
fn child_errors_carry_the_replicated_job_path() {
    let mut spec = set_spec(Some(composite_gang(None)), &[("a", 1, 2), ("b", 1, 2)]);
    spec.replicated_jobs[1].template.spec.scheduling = Some(gang(Some(3)));
    let errs = validate(jobset_item(&spec).expect("tree"), None);
    assert_eq!(paths(&errs), vec!["spec.replicatedJobs[1].template.spec.scheduling.schedulingPolicy.gang.minCount"]);
}

#[test]
fn root_template_name_avoids_replicated_job_names() {
    let spec = set_spec(None, &[("jobset", 1, 1), ("jobset-0", 1, 1)]);
    assert_eq!(job::root_template_name(&spec), "jobset-1");
}

#[test]
fn jobset_without_scheduling_has_no_tree() {
    assert!(jobset_item(&set_spec(None, &[("a", 1, 1)])).is_none());
}

fn job(name: &str, spec: MusterJobSpec) -> MusterJob {
    MusterJob::new(name, spec)
}

#[test]
fn jobset_limits_replicated_jobs_with_scheduling() {
    let names: Vec<String> = (0..9).map(|i| format!("r{i}")).collect();
    let rjobs: Vec<(&str, i32, i32)> = names.iter().map(|n| (n.as_str(), 1, 1)).collect();
    let set = MusterJobSet::new("s", set_spec(Some(composite_gang(None)), &rjobs));
    let errs = validate_jobset(&set, None);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].to_string(), "spec.replicatedJobs: Too many: 9: must have at most 8 items");
    let set = MusterJobSet::new("s", set_spec(None, &rjobs));
    assert!(validate_jobset(&set, None).is_empty());
}

#[test]
fn jobset_replicated_job_names_are_unique_labels() {
    let set = MusterJobSet::new("s", set_spec(Some(composite_gang(None)), &[("a", 1, 1), ("a", 1, 1), ("B", 1, 1)]));
    let errs = validate_jobset(&set, None);
    assert_eq!(paths(&errs), vec!["spec.replicatedJobs[1].name", "spec.replicatedJobs[2].name"]);
}

#[test]
fn jobset_shape_is_frozen() {
    let old = MusterJobSet::new("s", set_spec(Some(composite_gang(None)), &[("a", 1, 1)]));
    let new = MusterJobSet::new("s", set_spec(Some(composite_gang(None)), &[("a", 2, 1)]));
    assert_eq!(paths(&validate_jobset(&new, Some(&old))), vec!["spec.replicatedJobs"]);
}

#[test]
fn jobset_child_names_must_fit() {
    let set = MusterJobSet::new(&"s".repeat(40), set_spec(None, &[(&"r".repeat(12), 1, 1)]));
    assert_eq!(paths(&validate_jobset(&set, None)), vec!["spec.replicatedJobs[0].name"]);
}

#[test]
fn job_template_rules() {
    let mut spec = job_spec(2, None);
    let pod = spec.template.spec.as_mut().expect("pod spec");
    pod.restart_policy = Some("Always".into());
    pod.node_name = Some("n1".into());
    let errs = validate_job(&job("j", spec), None);
    assert_eq!(paths(&errs), vec!["spec.template.spec.restartPolicy", "spec.template.spec.nodeName"]);
}

#[test]
fn indexed_job_needs_completions() {
    let mut spec = job_spec(2, None);
    spec.completion_mode = Some(muster_api::batch::CompletionMode::Indexed);
    assert_eq!(paths(&validate_job(&job("j", spec), None)), vec!["spec.completions"]);
}

#[test]
fn job_template_and_completions_are_frozen() {
    let old = job("j", job_spec(2, Some(gang(None))));
    let mut spec = job_spec(3, Some(gang(Some(3))));
    spec.completions = Some(5);
    spec.template.spec.as_mut().expect("pod spec").containers[0].image = Some("other".into());
    let errs = validate_job(&job("j", spec), Some(&old));
    assert_eq!(paths(&errs), vec!["spec.template", "spec.completions"]);
}

#[test]
fn the_scheduling_api_annotation_is_muster_or_upstream_and_frozen_once_set() {
    let key = muster_api::SCHEDULING_API_ANNOTATION;
    let annotated = |meta: &mut ObjectMeta, value: Option<&str>| {
        if let Some(v) = value {
            meta.annotations = Some([(key.to_string(), v.to_string())].into());
        }
    };
    // The same rule for a MusterJob and a MusterJobSet: (new value, old value) -> errors.
    let job_errors = |now: Option<&str>, old: Option<Option<&str>>| {
        let of = |v| {
            let mut j = job("j", job_spec(2, None));
            annotated(&mut j.metadata, v);
            j
        };
        validate_job(&of(now), old.map(of).as_ref())
    };
    let set_errors = |now: Option<&str>, old: Option<Option<&str>>| {
        let of = |v| {
            let mut s = MusterJobSet::new("s", set_spec(Some(composite_gang(None)), &[("a", 1, 1)]));
            annotated(&mut s.metadata, v);
            s
        };
        validate_jobset(&of(now), old.map(of).as_ref())
    };
    let path = format!("metadata.annotations[{key}]");
    for (kind, errors) in [("MusterJob", &job_errors as &dyn Fn(_, _) -> ErrorList), ("MusterJobSet", &set_errors)] {
        assert!(errors(Some("upstream"), None).is_empty(), "{kind}");
        assert!(errors(Some("muster"), None).is_empty(), "{kind}");
        let errs = errors(Some("kube"), None);
        assert_eq!(paths(&errs), vec![path.as_str()], "{kind}");
        assert_eq!(errs[0].kind, ErrorType::NotSupported);
        // Recorded later (by the controller): allowed. Changed or removed after: refused.
        assert!(errors(Some("muster"), Some(None)).is_empty(), "{kind}");
        assert!(errors(Some("upstream"), Some(Some("upstream"))).is_empty(), "{kind}");
        for changed in [Some("upstream"), None] {
            let errs = errors(changed, Some(Some("muster")));
            assert_eq!(paths(&errs), vec![path.as_str()], "{kind} {changed:?}");
            assert_eq!(errs[0].detail, "field is immutable");
        }
    }
}

#[test]
fn scheduling_and_its_policy_cannot_be_set_or_cleared() {
    let basic =
        || PodGroupScheduling { scheduling_policy: Some(PodGroupSchedulingPolicy::basic()), ..Default::default() };
    let none = job("j", job_spec(2, None));
    let errs = validate_job(&job("j", job_spec(2, Some(basic()))), Some(&none));
    assert_eq!(paths(&errs), vec!["spec.scheduling"]);
    assert_eq!(errs[0].detail, "field cannot be set once created");
    let errs = validate_job(&none, Some(&job("j", job_spec(2, Some(gang(Some(2)))))));
    assert_eq!(paths(&errs), vec!["spec.scheduling"], "reported once, not as a policy change too");
    assert_eq!(errs[0].detail, "field cannot be cleared once set");
    let empty = job("j", job_spec(2, Some(PodGroupScheduling::default())));
    let errs = validate_job(&job("j", job_spec(2, Some(basic()))), Some(&empty));
    assert_eq!(paths(&errs), vec!["spec.scheduling.schedulingPolicy"]);
    assert!(
        validate_job(&job("j", job_spec(2, Some(basic()))), Some(&job("j", job_spec(2, Some(basic()))))).is_empty()
    );
}

#[test]
fn job_names_leave_room_for_pod_names() {
    let errs = validate_job(&job(&"j".repeat(53), job_spec(1, None)), None);
    assert_eq!(paths(&errs), vec!["metadata.name"]);
}

// === build ===

#[test]
fn workload_has_owner_and_controller_ref() {
    let w = Builder::new(leaf(&job_spec(2, None)), opts()).build_workload().cloned().expect("builds");
    assert_eq!(w.metadata.owner_references, Some(vec![owner()]));
    let r = w.spec.controller_ref.expect("controllerRef");
    assert_eq!(
        (r.api_group.as_deref(), r.kind.as_str(), r.name.as_str()),
        (Some("batch.muster.dev"), "MusterJob", "train")
    );
    assert!(w.spec.composite_pod_group_templates.is_none());
}

#[test]
fn building_needs_an_owner() {
    let b = Builder::new(leaf(&job_spec(2, None)), BuildOptions::all_allowed("w", "ns", None));
    assert_eq!(b.build_workload().err(), Some(BuildError::MissingOwner));
}

#[test]
fn workload_is_built_once() {
    let b = Builder::new(leaf(&job_spec(2, None)), opts());
    let first = b.build_workload().expect("builds") as *const Workload;
    let second = b.build_workload().expect("builds") as *const Workload;
    assert_eq!(first, second);
}

#[test]
fn pod_group_copies_the_template() {
    let s = PodGroupScheduling {
        scheduling_constraints: Some(SchedulingConstraints::topology("rack")),
        resource_claims: Some(vec![claim("a", Some("x"), None)]),
        ..gang(Some(2))
    };
    let b = Builder::new(leaf(&job_spec(2, Some(s))), opts());
    let pg = b.new_pod_group("train", "main").expect("pod group");
    assert_eq!(pg.metadata.namespace.as_deref(), Some("ns"));
    assert_eq!(pg.metadata.owner_references, Some(vec![owner()]));
    let r = pg.spec.workload_ref.expect("workloadRef");
    assert_eq!((r.workload_name.as_str(), r.template_name.as_str()), ("train", "main"));
    assert_eq!(pg.spec.scheduling_policy.min_count(), Some(2));
    assert_eq!(
        pg.spec.scheduling_constraints.and_then(|c| c.topology_key().map(str::to_string)).as_deref(),
        Some("rack")
    );
    assert_eq!(pg.spec.resource_claims.map(|c| c.len()), Some(1));
    assert_eq!(pg.spec.disruption_mode, DisruptionMode::single(), "PodGroup defaults to single");
    assert_eq!(pg.spec.parent_composite_pod_group_name, None);
}

#[test]
fn runtime_groups_from_an_existing_workload() {
    let root =
        jobset_item(&set_spec(Some(composite_gang(None)), &[("driver", 1, 1), ("workers", 2, 4)])).expect("tree");
    let w = Builder::new(root, opts()).build_workload().cloned().expect("builds");
    let child = Builder::from_existing_workload(w, BuildOptions::all_allowed("", "ns", Some(owner())));
    let pg = child.new_pod_group("s-workers-1", "workers").expect("pod group");
    assert_eq!(pg.spec.scheduling_policy.min_count(), Some(4));
    let cpg = child.new_composite_pod_group("s", "jobset").expect("composite");
    assert_eq!(cpg.spec.scheduling_policy.min_group_count(), Some(3));
    assert_eq!(cpg.spec.workload_ref.template_name, "jobset");
    assert!(matches!(child.new_pod_group("x", "nope"), Err(BuildError::TemplateNotFound { .. })));
    assert!(matches!(child.new_composite_pod_group("x", "workers"), Err(BuildError::TemplateNotFound { .. })));
}

// === property tests ===

fn arb_policy() -> impl Strategy<Value = Option<PodGroupSchedulingPolicy>> {
    prop_oneof![
        Just(None),
        Just(Some(PodGroupSchedulingPolicy::basic())),
        (proptest::option::of(-1i32..12)).prop_map(|m| Some(PodGroupSchedulingPolicy::gang(m))),
        Just(Some(PodGroupSchedulingPolicy::default())),
    ]
}

fn arb_mode() -> impl Strategy<Value = Option<DisruptionMode>> {
    prop_oneof![
        Just(None),
        Just(Some(DisruptionMode::single())),
        Just(Some(DisruptionMode::all())),
        Just(Some(DisruptionMode::default()))
    ]
}

fn arb_constraints() -> impl Strategy<Value = Option<SchedulingConstraints>> {
    prop_oneof![
        Just(None),
        Just(Some(SchedulingConstraints::topology("topology.muster.dev/rack"))),
        Just(Some(SchedulingConstraints::topology("bad key"))),
        Just(Some(SchedulingConstraints { topology: Some(vec![]) })),
    ]
}

fn arb_claims() -> impl Strategy<Value = Option<Vec<PodGroupResourceClaim>>> {
    proptest::option::of(proptest::collection::vec(
        (prop_oneof![Just("a"), Just("b"), Just("c"), Just("d"), Just("e")], any::<bool>())
            .prop_map(|(n, t)| if t { claim(n, None, Some("tpl")) } else { claim(n, Some("claim"), None) }),
        0..6,
    ))
}

fn arb_scheduling() -> impl Strategy<Value = Option<PodGroupScheduling>> {
    proptest::option::of((arb_policy(), arb_constraints(), arb_mode(), arb_claims()).prop_map(|(p, c, m, r)| {
        PodGroupScheduling { scheduling_policy: p, scheduling_constraints: c, disruption_mode: m, resource_claims: r }
    }))
}

fn arb_job_spec() -> impl Strategy<Value = MusterJobSpec> {
    (0i32..10, arb_scheduling()).prop_map(|(p, s)| job_spec(p, s))
}

/// Random trees up to 6 deep and 10 wide, names from a small pool so duplicates happen.
fn arb_tree() -> impl Strategy<Value = WorkloadItem> {
    let leaf = (0u8..24, arb_scheduling(), 0i32..6).prop_map(|(n, s, p)| {
        let spec = job_spec(p, s);
        job_item(&spec, &format!("t{n}"), &FieldPath::new(&format!("t{n}")))
    });
    leaf.prop_recursive(5, 64, 10, |inner| {
        (0u8..24, proptest::collection::vec(inner, 1..10), proptest::option::of(0i32..6), 1i32..3).prop_map(
            |(n, children, min, replicas)| {
                let mut item = WorkloadItem::new(format!("t{n}"), FieldPath::new(&format!("t{n}")));
                item.input.policy = Some(Block::new(
                    PolicyInput::Composite(match min {
                        Some(0) => CompositePodGroupSchedulingPolicy::basic(),
                        m => CompositePodGroupSchedulingPolicy::gang(m),
                    }),
                    item.path.child("schedulingPolicy"),
                ));
                item.children = children;
                let groups = item.child_group_count();
                item.callbacks.push(Arc::new(move |c: &mut SchedulingConfig| {
                    if let Some(g) = c.policy.as_mut().and_then(|p| p.gang.as_mut())
                        && g.min_count.is_none()
                    {
                        g.min_count = Some(groups.max(1));
                    }
                }));
                item.replicas = replicas;
                item
            },
        )
    })
}

fn check_template_limits(t: &muster_api::PodGroupTemplate) {
    assert!(crate::workloadbuilder::field::is_dns_label(&t.name));
    assert!(t.scheduling_policy.kind().is_some());
    if let Some(m) = t.scheduling_policy.gang.as_ref() {
        assert!(m.min_count.is_some_and(|m| m >= 1));
    }
    assert!(t.resource_claims.as_ref().is_none_or(|c| !c.is_empty() && c.len() <= MAX_RESOURCE_CLAIMS));
    assert!(t.scheduling_constraints.as_ref().is_none_or(|c| c.topology.as_ref().is_some_and(|t| t.len() == 1)));
}

fn check_composite_limits(t: &muster_api::CompositePodGroupTemplate, depth: usize) {
    assert!(depth <= MAX_DEPTH);
    assert!(t.scheduling_policy.kind().is_some());
    if let Some(g) = t.scheduling_policy.gang.as_ref() {
        assert!(g.min_group_count.is_some_and(|m| m >= 1));
    }
    let leaves = t.pod_group_templates.as_deref().unwrap_or_default();
    let composites = t.composite_pod_group_templates.as_deref().unwrap_or_default();
    assert!(!leaves.is_empty() || !composites.is_empty());
    assert!(leaves.len() <= MAX_TEMPLATES && composites.len() <= MAX_TEMPLATES);
    leaves.iter().for_each(check_template_limits);
    composites.iter().for_each(|c| check_composite_limits(c, depth + 1));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_tree_that_validates_also_builds_within_limits(root in arb_tree()) {
        let b = Builder::new(root, opts());
        if b.validate(None).is_empty() {
            let w = b.build_workload().expect("a valid tree builds");
            let leaves = w.spec.pod_group_templates.as_deref().unwrap_or_default();
            let composites = w.spec.composite_pod_group_templates.as_deref().unwrap_or_default();
            prop_assert_eq!(leaves.len() + composites.len(), 1);
            leaves.iter().for_each(check_template_limits);
            composites.iter().for_each(|c| check_composite_limits(c, 1));
            let json = serde_json::to_value(w).expect("serializes");
            let back: Workload = serde_json::from_value(json).expect("deserializes");
            prop_assert_eq!(&back, w);
        }
    }

    #[test]
    fn any_valid_job_spec_builds_its_pod_group(spec in arb_job_spec()) {
        let b = Builder::new(leaf(&spec), opts());
        if b.validate(None).is_empty() {
            let pg = b.new_pod_group("train", "main").expect("a valid job builds its PodGroup");
            let min = pg.spec.scheduling_policy.min_count();
            prop_assert!(min.is_none_or(|m| m >= 1 && m <= spec.parallelism.max(1)));
        }
    }

    /// The CRDs of the compiled kinds carry no rules: muster checks its own writes of them with
    /// `objects`' rules (`own_write_refusal`), so whatever a valid job or set compiles to must
    /// pass them, made anew and applied again over itself.
    #[test]
    fn what_a_valid_tree_compiles_to_passes_musters_check_of_its_own_writes(root in arb_tree()) {
        let b = Builder::new(root, opts());
        if b.validate(None).is_empty() {
            let w = b.build_workload().expect("a valid tree builds").clone();
            prop_assert_eq!(objects::validate_workload(&w, None), vec![]);
            prop_assert_eq!(objects::validate_workload(&w, Some(&w)), vec![]);
            let composites = w.spec.composite_pod_group_templates.as_deref().unwrap_or_default();
            for t in composites {
                let cpg = b.new_composite_pod_group("root", &t.name).expect("the root composite builds");
                prop_assert_eq!(objects::validate_composite_pod_group(&cpg, None), vec![]);
                prop_assert_eq!(objects::validate_composite_pod_group(&cpg, Some(&cpg)), vec![]);
            }
            for t in w.spec.pod_group_templates.as_deref().unwrap_or_default() {
                let pg = b.new_pod_group("leaf", &t.name).expect("the leaf builds");
                prop_assert_eq!(objects::validate_pod_group(&pg, None), vec![]);
                prop_assert_eq!(objects::validate_pod_group(&pg, Some(&pg)), vec![]);
            }
        }
    }

    #[test]
    fn what_a_valid_job_compiles_to_passes_musters_check_of_its_own_writes(spec in arb_job_spec(), min in 1i32..10) {
        let b = Builder::new(leaf(&spec), opts());
        if b.validate(None).is_empty() {
            let pg = b.new_pod_group("train", "main").expect("a valid job builds its PodGroup");
            prop_assert_eq!(objects::validate_pod_group(&pg, None), vec![]);
            // A new minCount (the one field that may change) passes; the rest is the same.
            let mut resized = pg.clone();
            if let Some(g) = resized.spec.scheduling_policy.gang.as_mut() {
                g.min_count = Some(min);
            }
            prop_assert_eq!(objects::validate_pod_group(&resized, Some(&pg)), vec![]);
        }
    }

    #[test]
    fn merge_is_idempotent(spec in arb_job_spec()) {
        let item = leaf(&spec);
        let once = item.resolve();
        let mut again = item.clone();
        again.default_config = once.clone();
        prop_assert_eq!(again.resolve(), once);
    }

    #[test]
    fn updates_never_panic(old in arb_job_spec(), new in arb_job_spec()) {
        let _ = validate(leaf(&new), Some(&leaf(&old)));
    }

    #[test]
    fn changing_only_min_count_and_parallelism_adds_no_update_error(old in arb_job_spec(), parallelism in 0i32..10, min in proptest::option::of(1i32..10)) {
        prop_assume!(validate(leaf(&old), None).is_empty());
        let mut new = old.clone();
        new.parallelism = parallelism;
        if let Some(g) = new.scheduling.as_mut().and_then(|s| s.scheduling_policy.as_mut()).and_then(|p| p.gang.as_mut()) {
            g.min_count = min;
        }
        prop_assert_eq!(validate(leaf(&new), Some(&leaf(&old))), validate(leaf(&new), None));
    }

    #[test]
    fn job_specs_round_trip_through_json(spec in arb_job_spec()) {
        let json = serde_json::to_value(&spec).expect("serializes");
        let back: MusterJobSpec = serde_json::from_value(json).expect("deserializes");
        prop_assert_eq!(back, spec);
    }
}

fn gpu_spec(gpus: &str, gpu_claims: serde_json::Value, scheduling: serde_json::Value) -> MusterJobSpec {
    serde_json::from_value(serde_json::json!({
        "parallelism": 2,
        "gpuClaims": gpu_claims,
        "scheduling": scheduling,
        "template": {"spec": {"restartPolicy": "Never",
            "resourceClaims": [{"name": "own", "resourceClaimName": "x"}],
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}},
    }))
    .expect("valid spec fixture")
}

#[test]
fn gpu_claims_rules() {
    use serde_json::json;
    let none = json!(null);
    let cases: Vec<(&str, MusterJobSpec, Vec<&str>)> = vec![
        ("default_device_class_is_fine", gpu_spec("2", json!({}), none.clone()), vec![]),
        (
            "a_dns_subdomain_class_is_fine",
            gpu_spec("2", json!({"deviceClassName": "gpu.example.com"}), none.clone()),
            vec![],
        ),
        (
            "device_class_must_be_a_dns_subdomain",
            gpu_spec("2", json!({"deviceClassName": "GPU_class"}), none.clone()),
            vec!["spec.gpuClaims.deviceClassName"],
        ),
        (
            "empty_device_class_is_invalid",
            gpu_spec("2", json!({"deviceClassName": ""}), none.clone()),
            vec!["spec.gpuClaims.deviceClassName"],
        ),
        (
            "gpu_counts_must_be_whole_numbers",
            gpu_spec("500m", json!({}), none.clone()),
            vec!["spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]"],
        ),
        ("fractions_are_only_checked_when_opted_in", gpu_spec("500m", none.clone(), none.clone()), vec![]),
        (
            "a_shared_claim_may_not_reuse_a_pod_claim_name",
            gpu_spec("1", none.clone(), json!({"resourceClaims": [{"name": "own", "resourceClaimName": "y"}]})),
            vec!["spec.scheduling.resourceClaims[0].name"],
        ),
        (
            "a_shared_claim_may_not_take_the_gpu_claim_name",
            gpu_spec(
                "1",
                json!({}),
                json!({"resourceClaims": [{"name": "muster-gpus", "resourceClaimTemplateName": "t"}]}),
            ),
            vec!["spec.scheduling.resourceClaims[0].name"],
        ),
        (
            "muster_gpus_is_free_without_gpu_claims",
            gpu_spec(
                "1",
                none.clone(),
                json!({"resourceClaims": [{"name": "muster-gpus", "resourceClaimTemplateName": "t"}]}),
            ),
            vec![],
        ),
    ];
    for (name, spec, want) in cases {
        assert_eq!(paths(&validate_job(&job("j", spec), None)), want, "{name}");
    }
    let mut own = gpu_spec("1", json!({}), none.clone());
    own.template.spec.as_mut().expect("pod").resource_claims.as_mut().expect("claims")[0].name = "muster-gpus".into();
    assert_eq!(paths(&validate_job(&job("j", own), None)), vec!["spec.template.spec.resourceClaims[0].name"]);
    let errs = validate_job(&job("j", gpu_spec("2", json!({"deviceClassName": "GPU_class"}), none.clone())), None);
    assert!(
        errs[0]
            .to_string()
            .starts_with("spec.gpuClaims.deviceClassName: Invalid value: \"GPU_class\": must be a DeviceClass name"),
        "{}",
        errs[0]
    );
}

#[test]
fn gpu_claims_are_frozen() {
    use serde_json::json;
    let old = job("j", gpu_spec("2", json!(null), json!(null)));
    let new = job("j", gpu_spec("2", json!({}), json!(null)));
    assert_eq!(paths(&validate_job(&new, Some(&old))), vec!["spec.gpuClaims"]);
    let other = job("j", gpu_spec("2", json!({"deviceClassName": "b.example.com"}), json!(null)));
    assert_eq!(paths(&validate_job(&other, Some(&new))), vec!["spec.gpuClaims"]);
    assert!(validate_job(&new, Some(&new)).is_empty());
}

#[test]
fn gpu_claims_are_checked_in_jobset_templates() {
    use serde_json::json;
    let mut spec = set_spec(None, &[("w", 1, 1)]);
    spec.replicated_jobs[0].template.spec = gpu_spec("1", json!({"deviceClassName": "Bad"}), json!(null));
    let set = MusterJobSet::new("s", spec);
    assert_eq!(
        paths(&validate_jobset(&set, None)),
        vec!["spec.replicatedJobs[0].template.spec.gpuClaims.deviceClassName"]
    );
}

#[test]
fn dra_fields_are_named_for_an_api_server_without_dra() {
    let claim = PodGroupResourceClaim {
        name: "shared".into(),
        resource_claim_template_name: Some("slice".into()),
        ..Default::default()
    };
    let mut with_group_claims = gang(Some(1));
    with_group_claims.resource_claims = Some(vec![claim]);
    let mut pod_claims = job_spec(1, None);
    pod_claims.template.spec.get_or_insert_default().resource_claims =
        Some(vec![k8s_openapi::api::core::v1::PodResourceClaim { name: "c".into(), ..Default::default() }]);
    let mut gpu_claims = job_spec(1, None);
    gpu_claims.gpu_claims = Some(muster_api::batch::GpuClaims::default());
    let mut empty_claims = gang(Some(1));
    empty_claims.resource_claims = Some(vec![]);
    let cases: Vec<(&str, MusterJobSpec, Vec<&str>)> = vec![
        ("count-based GPUs only", job_spec(2, Some(gang(None))), vec![]),
        ("an empty list of group claims", job_spec(1, Some(empty_claims)), vec![]),
        ("group claims", job_spec(1, Some(with_group_claims)), vec!["spec.scheduling.resourceClaims"]),
        ("pod claims", pod_claims, vec!["spec.template.spec.resourceClaims"]),
        ("GPU claims", gpu_claims, vec!["spec.gpuClaims"]),
    ];
    for (case, spec, want) in cases {
        let errs = super::job::needs_dra(&spec);
        assert_eq!(paths(&errs), want, "{case}");
        assert!(errs.iter().all(|e| e.to_string().contains("resource.k8s.io/v1")), "{case}: {errs:?}");
    }
}
