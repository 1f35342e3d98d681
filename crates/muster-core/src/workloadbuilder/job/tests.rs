//! The bounded sizes of MusterJobs and MusterJobSets, and muster's own keys in pod templates:
//! tables at and just over every limit, and properties over the whole i32 range.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::test_support::merge;
use super::*;
use muster_api::{MusterJob, MusterJobSet};

fn job(spec: Value) -> MusterJob {
    let mut spec_json = json!({
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}},
    });
    merge(&mut spec_json, spec);
    serde_json::from_value(json!({
        "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob",
        "metadata": {"name": "j"}, "spec": spec_json,
    }))
    .expect("job fixture")
}

/// A set of replicatedJobs `(replicas, parallelism)`, with `spec.scheduling` when `scheduled`.
fn set(rjobs: &[(i32, i32)], scheduled: bool) -> MusterJobSet {
    let rjobs: Vec<Value> = rjobs
        .iter()
        .enumerate()
        .map(|(i, (replicas, parallelism))| {
            json!({"name": format!("r{i}"), "replicas": replicas, "template": {"spec": {"parallelism": parallelism,
                "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}})
        })
        .collect();
    let mut spec = json!({"replicatedJobs": rjobs});
    if scheduled {
        spec["scheduling"] = json!({"schedulingPolicy": {"basic": {}}});
    }
    serde_json::from_value(json!({
        "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJobSet",
        "metadata": {"name": "s"}, "spec": spec,
    }))
    .expect("set fixture")
}

fn lines(errs: &ErrorList) -> Vec<String> {
    errs.iter().map(|e| e.to_string()).collect()
}

fn paths(errs: &ErrorList) -> Vec<String> {
    errs.iter().map(|e| e.path.to_string()).collect()
}

const MAX: i32 = MAX_JOB_PODS as i32;

#[test]
fn job_sizes_are_bounded_like_an_indexed_batch_job() {
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        ("indexed at the limit", json!({"completionMode": "Indexed", "completions": MAX, "parallelism": MAX}), vec![]),
        (
            "indexed parallelism one over",
            json!({"completionMode": "Indexed", "completions": MAX, "parallelism": MAX + 1}),
            vec![
                "spec.parallelism: Invalid value: 100001: must be less than or equal to 100000 when completion mode is Indexed",
            ],
        ),
        (
            "indexed completions one over",
            json!({"completionMode": "Indexed", "completions": MAX + 1, "parallelism": 4}),
            vec![
                "spec.completions: Invalid value: 100001: must be less than or equal to 100000 when completion mode is Indexed",
            ],
        ),
        (
            "the fifty million pod indexed job",
            json!({"completionMode": "Indexed", "completions": 50_000_000, "parallelism": 50_000_000}),
            vec![
                "spec.parallelism: Invalid value: 50000000: must be less than or equal to 100000 when completion mode is Indexed",
                "spec.completions: Invalid value: 50000000: must be less than or equal to 100000 when completion mode is Indexed",
            ],
        ),
        ("non-indexed at the limit", json!({"completions": MAX, "parallelism": MAX}), vec![]),
        (
            "non-indexed parallelism one over (completions default to it)",
            json!({"parallelism": MAX + 1}),
            vec![
                "spec.parallelism: Invalid value: 100001: must be less than or equal to 100000 (muster plans a pod for each)",
            ],
        ),
        (
            "non-indexed completions one over",
            json!({"completions": MAX + 1, "parallelism": 1}),
            vec![
                "spec.completions: Invalid value: 100001: must be less than or equal to 100000 (muster plans a pod for each)",
            ],
        ),
        (
            "the fifty million pod job",
            json!({"completions": 50_000_000, "parallelism": 50_000_000}),
            vec![
                "spec.parallelism: Invalid value: 50000000: must be less than or equal to 100000 (muster plans a pod for each)",
                "spec.completions: Invalid value: 50000000: must be less than or equal to 100000 (muster plans a pod for each)",
            ],
        ),
        (
            "i32::MAX",
            json!({"completions": i32::MAX, "parallelism": i32::MAX}),
            vec![
                "spec.parallelism: Invalid value: 2147483647: must be less than or equal to 100000 (muster plans a pod for each)",
                "spec.completions: Invalid value: 2147483647: must be less than or equal to 100000 (muster plans a pod for each)",
            ],
        ),
        (
            "negative counts are told once, as negative",
            json!({"completions": i32::MIN, "parallelism": -1}),
            vec![
                "spec.parallelism: Invalid value: -1: must be greater than or equal to 0",
                "spec.completions: Invalid value: -2147483648: must be greater than or equal to 0",
            ],
        ),
    ];
    for (case, spec, want) in cases {
        assert_eq!(lines(&validate_job(&job(spec), None)), want, "{case}");
    }
}

#[test]
fn a_cluster_bound_names_the_field_and_the_flag() {
    let spec = job(json!({"completionMode": "Indexed", "completions": 501, "parallelism": 500})).spec;
    let path = FieldPath::new("spec");
    assert!(job_size_errors(&spec, &path, 501).is_empty());
    assert_eq!(
        lines(&job_size_errors(&spec, &path, 500)),
        vec![
            "spec.completions: Invalid value: 501: must be less than or equal to 500 when completion mode is Indexed (the limit of this cluster: muster run --max-job-pods)"
        ]
    );
    let spec = job(json!({"parallelism": 7})).spec;
    assert_eq!(
        lines(&job_size_errors(&spec, &path, 6)),
        vec![
            "spec.parallelism: Invalid value: 7: must be less than or equal to 6 (the limit of this cluster: muster run --max-job-pods)"
        ]
    );
    // The hard bound is what validate_job applies; a cluster bound equal to it says the same.
    let spec = job(json!({"parallelism": MAX + 1})).spec;
    assert_eq!(job_size_errors(&spec, &path, MAX_JOB_PODS), validate_job(&job(json!({"parallelism": MAX + 1})), None));
}

#[test]
fn set_sizes_are_bounded_per_replicated_job_and_summed() {
    let over_product = "spec.replicatedJobs[1].replicas: Invalid value: 1001: replicas × parallelism = 1001 × 100 = 100100 pods, more than 100000 (at most 100000 per MusterJobSet: muster plans a pod for each)";
    /// (case, replicatedJobs as (replicas, parallelism), the errors).
    type Case = (&'static str, Vec<(i32, i32)>, Vec<String>);
    let cases: Vec<Case> = vec![
        ("one replicatedJob at the limit", vec![(1000, 100)], vec![]),
        ("two summing to the limit", vec![(500, 100), (1000, 50)], vec![]),
        ("one over in the second", vec![(1, 1), (1001, 100)], vec![over_product.to_string()]),
        (
            "the sum one over, told at the replicatedJob that passes it",
            vec![(500, 100), (1, 1), (1, 50_000)],
            vec!["spec.replicatedJobs[2].replicas: Invalid value: 1: replicatedJobs[0..=2] make 100001 pods (replicas × parallelism, summed), more than 100000 (at most 100000 per MusterJobSet: muster plans a pod for each)".to_string()],
        ),
        (
            "replicas × parallelism past i32 and u32",
            vec![(i32::MAX, 3)],
            vec![format!(
                "spec.replicatedJobs[0].replicas: Invalid value: {}: replicas × parallelism = {} × 3 = {} pods, more than 100000 (at most 100000 per MusterJobSet: muster plans a pod for each)",
                i32::MAX,
                i32::MAX,
                3 * i64::from(i32::MAX)
            )],
        ),
        (
            "parallelism over the limit is told at the template, not again at replicas",
            vec![(2, MAX + 1)],
            vec!["spec.replicatedJobs[0].template.spec.parallelism: Invalid value: 100001: must be less than or equal to 100000 (muster plans a pod for each)".to_string()],
        ),
        (
            "children without pods are still bounded",
            vec![(MAX + 1, 0)],
            vec!["spec.replicatedJobs[0].replicas: Invalid value: 100001: 100001 child MusterJobs, more than 100000 (at most 100000 per MusterJobSet: muster plans a pod for each)".to_string()],
        ),
        (
            "children summed",
            vec![(MAX, 0), (1, 0)],
            vec!["spec.replicatedJobs[1].replicas: Invalid value: 1: replicatedJobs[0..=1] make 100001 child MusterJobs (replicas, summed), more than 100000 (at most 100000 per MusterJobSet: muster plans a pod for each)".to_string()],
        ),
        (
            "negative replicas count for nothing and are told as negative",
            vec![(-5, 10), (1, 10)],
            vec!["spec.replicatedJobs[0].replicas: Invalid value: -5: must be greater than or equal to 0".to_string()],
        ),
    ];
    for (case, rjobs, want) in cases {
        for scheduled in [false, true] {
            let errs = validate_jobset(&set(&rjobs, scheduled), None);
            assert_eq!(lines(&errs), want, "{case} (scheduled: {scheduled})");
        }
    }
}

#[test]
fn set_sums_past_u64_are_over_any_bound() {
    // replicatedJobs of i32::MAX × i32::MAX pods: each product fits u64, and four of them too
    // (18446744056529682436), the fifth does not; with no bound below u64::MAX, the sum that
    // overflows is the one told.
    let rjobs = vec![(i32::MAX, i32::MAX); 8];
    let spec = set(&rjobs, false).spec;
    let errs = set_size_errors(&spec, u64::MAX);
    assert_eq!(paths(&errs), vec!["spec.replicatedJobs[4].replicas"], "{errs:?}");
    assert!(
        errs[0].to_string().contains(&format!("make more than {} pods", u64::MAX)),
        "the overflowing sum is said to be past u64: {}",
        errs[0]
    );
    // Every set of 32 such replicatedJobs (2^64 × 8 pods) is refused without a panic, at the
    // first template's parallelism.
    for scheduled in [false, true] {
        let errs = validate_jobset(&set(&vec![(i32::MAX, i32::MAX); 32], scheduled), None);
        assert!(!errs.is_empty());
        assert!(errs.iter().all(|e| e.path.as_str().starts_with("spec.replicatedJobs")), "{errs:?}");
    }
    let errs = validate_jobset(&set(&rjobs, false), None);
    assert_eq!(paths(&errs)[0], "spec.replicatedJobs[0].template.spec.parallelism", "{errs:?}");
}

#[test]
fn a_cluster_bound_on_a_set() {
    let spec = set(&[(10, 10), (1, 1)], false).spec;
    assert!(jobset_size_errors(&spec, 101).is_empty());
    assert_eq!(
        lines(&jobset_size_errors(&spec, 100)),
        vec![
            "spec.replicatedJobs[1].replicas: Invalid value: 1: replicatedJobs[0..=1] make 101 pods (replicas × parallelism, summed), more than 100 (the limit of this cluster: muster run --max-job-pods)"
        ]
    );
    assert_eq!(paths(&jobset_size_errors(&spec, 9)), vec!["spec.replicatedJobs[0].template.spec.parallelism"]);
}

#[test]
fn muster_keys_in_pod_templates_are_forbidden_at_their_path() {
    let forbidden = "Forbidden: muster's own key; muster sets the *.muster.dev/ keys of the pods and jobs it makes, and reads them as its own";
    let cases: Vec<(&str, Value, Vec<String>)> = vec![
        (
            "the GPU indices annotation",
            json!({"annotations": {"gpu.muster.dev/indices": "0,1"}}),
            vec![format!("spec.template.metadata.annotations[gpu.muster.dev/indices]: {forbidden}")],
        ),
        (
            "the PodGroup label",
            json!({"labels": {"scheduling.muster.dev/pod-group": "other"}}),
            vec![format!("spec.template.metadata.labels[scheduling.muster.dev/pod-group]: {forbidden}")],
        ),
        (
            "the job name label and a key muster has not made yet",
            json!({"labels": {"batch.muster.dev/job-name": "x", "new.muster.dev/thing": "y", "app": "ok"}}),
            vec![
                format!("spec.template.metadata.labels[batch.muster.dev/job-name]: {forbidden}"),
                format!("spec.template.metadata.labels[new.muster.dev/thing]: {forbidden}"),
            ],
        ),
        (
            "the simulator's, the tests' and other keys are fine",
            json!({"labels": {"e2e.muster.dev/gang": "g", "bench.muster.dev/pod": "true", "example.com/a": "b"},
                   "annotations": {"sim.muster.dev/succeed-after": "10s"}}),
            vec![],
        ),
    ];
    for (case, metadata, want) in cases {
        let j = job(json!({"parallelism": 1, "template": {"metadata": metadata.clone()}}));
        assert_eq!(lines(&validate_job(&j, None)), want, "{case}");
        let mut s = set(&[(1, 1)], false);
        s.spec.replicated_jobs[0].template.spec.template.metadata =
            Some(serde_json::from_value(metadata).expect("meta"));
        let want_in_set: Vec<String> =
            want.iter().map(|w| w.replace("spec.template", "spec.replicatedJobs[0].template.spec.template")).collect();
        assert_eq!(lines(&validate_jobset(&s, None)), want_in_set, "{case} (in a set)");
    }
}

#[test]
fn muster_keys_on_a_replicated_jobs_metadata_are_forbidden() {
    let mut s = set(&[(1, 1)], true);
    s.spec.replicated_jobs[0].template.metadata = Some(
        serde_json::from_value(json!({"annotations": {"scheduling.muster.dev/parent-composite-podgroup": "other"},
            "labels": {"team": "a"}}))
        .expect("meta"),
    );
    assert_eq!(
        paths(&validate_jobset(&s, None)),
        vec!["spec.replicatedJobs[0].template.metadata.annotations[scheduling.muster.dev/parent-composite-podgroup]"]
    );
}

fn arb_count() -> impl Strategy<Value = i32> {
    prop_oneof![any::<i32>(), -2..=2i32, (MAX - 2)..=(MAX + 2), Just(i32::MAX), Just(i32::MIN), Just(50_000_000)]
}

fn arb_rjobs() -> impl Strategy<Value = Vec<(i32, i32)>> {
    prop::collection::vec((arb_count(), arb_count()), 1..=8)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_job_size_validates_without_panic_and_errors_carry_paths(
        parallelism in arb_count(),
        completions in prop::option::of(arb_count()),
        indexed in any::<bool>(),
        max in prop_oneof![Just(MAX_JOB_PODS), 1..=MAX_JOB_PODS],
    ) {
        let mode = if indexed { "Indexed" } else { "NonIndexed" };
        let j = job(json!({"parallelism": parallelism, "completions": completions, "completionMode": mode}));
        let errs = validate_job(&j, None);
        prop_assert!(errs.iter().all(|e| e.path.as_str().starts_with("spec.")), "{errs:?}");
        let over = |v: i32| i64::from(v) > i64::from(MAX_JOB_PODS);
        prop_assert_eq!(over(parallelism), paths(&errs).contains(&"spec.parallelism".to_string()) && parallelism >= 0);
        if completions.is_some_and(over) {
            prop_assert!(paths(&errs).contains(&"spec.completions".to_string()));
        }
        let cluster = job_size_errors(&j.spec, &FieldPath::new("spec"), max);
        prop_assert_eq!(cluster.is_empty(), parallelism <= max as i32 && completions.is_none_or(|c| c <= max as i32));
    }

    #[test]
    fn any_set_size_validates_without_panic_and_errors_carry_paths(
        rjobs in arb_rjobs(),
        scheduled in any::<bool>(),
        max in prop_oneof![Just(MAX_JOB_PODS), 1..=MAX_JOB_PODS, Just(u32::MAX)],
    ) {
        let s = set(&rjobs, scheduled);
        let errs = validate_jobset(&s, None);
        prop_assert!(errs.iter().all(|e| e.path.as_str().starts_with("spec.") || e.path.as_str() == "metadata.name"), "{errs:?}");
        // What the set plans, exactly (i128: no overflow at all).
        let count = |v: i32| i128::from(v.max(0));
        let pods: i128 = rjobs.iter().map(|(r, p)| count(*r) * count(*p)).sum();
        let children: i128 = rjobs.iter().map(|(r, _)| count(*r)).sum();
        let sizes = jobset_size_errors(&s.spec, max);
        prop_assert!(sizes.iter().all(|e| e.path.as_str().starts_with("spec.replicatedJobs[")), "{sizes:?}");
        let within = pods <= i128::from(max) && children <= i128::from(max);
        let templates_within = rjobs.iter().all(|(_, p)| i128::from(*p) <= i128::from(max));
        prop_assert_eq!(sizes.is_empty(), within && templates_within, "{:?}", sizes);
        if !(pods <= i128::from(MAX_JOB_PODS) && children <= i128::from(MAX_JOB_PODS)) {
            prop_assert!(!errs.is_empty());
        }
    }
}

#[test]
fn a_set_states_only_the_classes_of_replicated_jobs_that_make_pods() {
    let mut s = set(&[(1, 2), (0, 1), (2, 1)], true);
    let class = |name: &str| {
        Some(k8s_openapi::api::core::v1::PodSpec { priority_class_name: Some(name.into()), ..Default::default() })
    };
    s.spec.replicated_jobs[1].template.spec.template.spec = class("forged-high");
    s.spec.replicated_jobs[2].template.spec.template.spec = class("low");
    let classes: Vec<Option<&str>> = pod_making_classes(&s.spec).collect();
    assert_eq!(classes, vec![None, Some("low")]);
}
