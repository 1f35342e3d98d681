//! PURE: what the builder compiled, as the native `scheduling.k8s.io/v1beta1` Workload and
//! PodGroup and the `v1alpha3` CompositePodGroup (muster's upstream scheduling API,
//! `--scheduling-api=upstream`). muster's shapes mirror upstream's field for field, so a spec
//! converts as it is; only the API group changes. The groups' `priority` is left to the API
//! server's Priority admission plugin, which resolves it from `priorityClassName` as it does
//! for the Job controller's PodGroups.

use k8s_openapi::api::scheduling::v1alpha3;
use k8s_openapi::api::scheduling::v1beta1 as native;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::crds::batch::MusterJobSetSpec;
use crate::crds::scheduling::{CompositePodGroup, PodGroup, Workload};

/// Which scheduling API a MusterJob's groups are compiled to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SchedulingApi {
    /// muster's own `scheduling.muster.dev` objects; muster admits the gang.
    #[default]
    Muster,
    /// The native `scheduling.k8s.io` objects; kube-scheduler admits the gang.
    Upstream,
}

impl SchedulingApi {
    /// The value of the job annotation and the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            SchedulingApi::Muster => "muster",
            SchedulingApi::Upstream => "upstream",
        }
    }

    /// Reads an annotation value.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "muster" => Some(SchedulingApi::Muster),
            "upstream" => Some(SchedulingApi::Upstream),
            _ => None,
        }
    }
}

/// PURE: the API new jobs are compiled to. `requested` is the flag (`None`: `auto`);
/// `served` whether the API server serves the native Workload and PodGroup. Returns the choice
/// and why, for the log line: `auto` picks upstream where it is served; an `upstream` asked
/// for where it is not falls back to muster's API (nothing could be admitted otherwise).
pub fn choose(requested: Option<SchedulingApi>, served: bool) -> (SchedulingApi, &'static str) {
    match (requested, served) {
        (Some(SchedulingApi::Muster), _) => (SchedulingApi::Muster, "--scheduling-api=muster"),
        (Some(SchedulingApi::Upstream), true) => (SchedulingApi::Upstream, "--scheduling-api=upstream"),
        (Some(SchedulingApi::Upstream), false) => (
            SchedulingApi::Muster,
            "--scheduling-api=upstream, but scheduling.k8s.io/v1beta1 Workload and PodGroup are not served (feature gate GenericWorkload off?): muster's API instead",
        ),
        (None, true) => (SchedulingApi::Upstream, "auto: scheduling.k8s.io/v1beta1 Workload and PodGroup are served"),
        (None, false) => {
            (SchedulingApi::Muster, "auto: scheduling.k8s.io/v1beta1 Workload and PodGroup are not served")
        }
    }
}

/// PURE: the scheduling API a job not recorded yet gets, and why when it is not the default:
/// a job muster compiled before (its muster PodGroup exists) keeps muster's; in upstream mode,
/// what the native path does not carry yet stays on muster's (a MusterJobSet's child, GPU
/// claims, the group's shared claims).
pub fn first_scheduling_api(
    spec: &crate::crds::batch::MusterJobSpec,
    child: bool,
    default: SchedulingApi,
    muster_group_exists: bool,
) -> (SchedulingApi, Option<String>) {
    if muster_group_exists {
        return (SchedulingApi::Muster, None);
    }
    if default == SchedulingApi::Muster {
        return (SchedulingApi::Muster, None);
    }
    let claims = spec.scheduling.as_ref().and_then(|s| s.resource_claims.as_ref()).is_some_and(|c| !c.is_empty());
    let why = if child {
        Some(
            "a MusterJobSet's child without the set's scheduling API (made before its set recorded one) compiles to muster's API",
        )
    } else if spec.gpu_claims.is_some() {
        Some("spec.gpuClaims is allocated by muster: the job compiles to muster's API")
    } else if claims {
        Some("spec.scheduling.resourceClaims are made by muster: the job compiles to muster's API")
    } else {
        None
    };
    match why {
        Some(why) => (SchedulingApi::Muster, Some(why.to_string())),
        None => (SchedulingApi::Upstream, None),
    }
}

/// PURE: the scheduling API a MusterJobSet not recorded yet gets, and why when it is not the
/// default. Its children follow it (the set stamps its API on each), so the whole tree is in
/// one API: a set with `spec.scheduling` needs the native CompositePodGroup
/// (`composite_served`), and a template using what muster allocates (`spec.gpuClaims`,
/// `spec.scheduling.resourceClaims`) keeps the set on muster's API. `muster_root_exists`: muster
/// compiled the set before (its Workload or CompositePodGroup exists).
pub fn first_set_scheduling_api(
    spec: &MusterJobSetSpec,
    default: SchedulingApi,
    muster_root_exists: bool,
    composite_served: bool,
) -> (SchedulingApi, Option<String>) {
    if muster_root_exists || default == SchedulingApi::Muster {
        return (SchedulingApi::Muster, None);
    }
    let uses = |f: fn(&crate::crds::batch::MusterJobSpec) -> bool| {
        spec.replicated_jobs.iter().find(|r| f(&r.template.spec)).map(|r| r.name.clone())
    };
    let claims = |s: &crate::crds::batch::MusterJobSpec| {
        s.scheduling.as_ref().and_then(|x| x.resource_claims.as_ref()).is_some_and(|c| !c.is_empty())
    };
    let why = if spec.scheduling.is_some() && !composite_served {
        Some("the API server does not serve scheduling.k8s.io/v1alpha3 CompositePodGroup (feature gate CompositePodGroup): the set compiles to muster's API".to_string())
    } else if let Some(r) = uses(|s| s.gpu_claims.is_some()) {
        Some(format!("replicatedJob {r} uses spec.gpuClaims, which muster allocates: the set compiles to muster's API"))
    } else {
        uses(claims).map(|r| {
            format!(
                "replicatedJob {r} uses spec.scheduling.resourceClaims, which muster makes: the set compiles to muster's API"
            )
        })
    };
    match why {
        Some(why) => (SchedulingApi::Muster, Some(why)),
        None => (SchedulingApi::Upstream, None),
    }
}

/// Why a job that recorded an API cannot go on with it: a reason and a message.
pub type ApiRefusal = (&'static str, String);

/// PURE: the API of a job that recorded `recorded` (validated already), and whether it can go on
/// with it. `muster_group` and `native_group`: whether the job's PodGroup exists in muster's
/// API and in the native one; a group in the other API means the annotation was changed
/// behind the webhook, and muster does not move a job between APIs. `served`: whether the
/// native kinds it needs are served (the Workload and PodGroup; for a MusterJobSet with
/// `spec.scheduling` and its children, the CompositePodGroup too).
pub fn recorded_scheduling_api(
    recorded: &str,
    muster_group: bool,
    native_group: bool,
    served: bool,
) -> Result<SchedulingApi, ApiRefusal> {
    use crate::crds::SCHEDULING_API_ANNOTATION;
    let api = SchedulingApi::parse(recorded).unwrap_or_default();
    let other = match api {
        SchedulingApi::Upstream => muster_group,
        SchedulingApi::Muster => native_group,
    };
    if other {
        let message = format!(
            "{SCHEDULING_API_ANNOTATION} changed to {recorded} after the job's PodGroup was made in the other API; muster does not move a job between APIs (set it back)"
        );
        return Err(("SchedulingAPIChanged", message));
    }
    if api == SchedulingApi::Upstream && !served {
        let message = format!(
            "{SCHEDULING_API_ANNOTATION} is upstream, but the API server does not serve the scheduling.k8s.io/v1beta1 Workload and PodGroup (feature gate GenericWorkload) or, for a MusterJobSet with spec.scheduling and its children, the v1alpha3 CompositePodGroup (feature gate CompositePodGroup)"
        );
        return Err(("UpstreamNotServed", message));
    }
    Ok(api)
}

/// A compiled spec the native API has no room for (a field muster added that upstream lacks).
#[derive(Debug, thiserror::Error)]
#[error("{kind} {name}: the compiled spec is not a native scheduling.k8s.io {kind}: {source}")]
pub struct NativeError {
    /// `Workload`, `PodGroup` or `CompositePodGroup`.
    pub kind: &'static str,
    /// The object's name.
    pub name: String,
    /// What did not convert.
    pub source: serde_json::Error,
}

fn convert<From: Serialize, To: DeserializeOwned>(
    kind: &'static str,
    meta: &ObjectMeta,
    spec: &From,
) -> Result<To, NativeError> {
    let name = meta.name.clone().unwrap_or_default();
    let error = |source| NativeError { kind, name: name.clone(), source };
    serde_json::to_value(spec).and_then(serde_json::from_value).map_err(error)
}

/// What the native object keeps of the compiled one's metadata: name, namespace, labels,
/// annotations and owners.
fn metadata(meta: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        labels: meta.labels.clone(),
        annotations: meta.annotations.clone(),
        owner_references: meta.owner_references.clone(),
        ..Default::default()
    }
}

/// The native Workload of a compiled one.
pub fn workload(w: &Workload) -> Result<native::Workload, NativeError> {
    Ok(native::Workload { metadata: metadata(&w.metadata), spec: convert("Workload", &w.metadata, &w.spec)? })
}

/// The native PodGroup of a compiled one (its spec only: the status is kube-scheduler's).
pub fn pod_group(g: &PodGroup) -> Result<native::PodGroup, NativeError> {
    let mut spec: native::PodGroupSpec = convert("PodGroup", &g.metadata, &g.spec)?;
    spec.priority = None;
    Ok(native::PodGroup { metadata: metadata(&g.metadata), spec, status: None })
}

/// The gang `minCount` of every PodGroup template in a native Workload's tree, by template
/// name (the one field of it that may change after creation).
fn template_min_counts(w: &native::Workload) -> Vec<(&str, Option<i32>)> {
    fn leaves<'a>(templates: Option<&'a Vec<native::PodGroupTemplate>>, out: &mut Vec<(&'a str, Option<i32>)>) {
        for t in templates.into_iter().flatten() {
            out.push((t.name.as_str(), t.scheduling_policy.gang.as_ref().map(|g| g.min_count)));
        }
    }
    fn walk<'a>(templates: Option<&'a Vec<native::CompositePodGroupTemplate>>, out: &mut Vec<(&'a str, Option<i32>)>) {
        for t in templates.into_iter().flatten() {
            leaves(t.pod_group_templates.as_ref(), out);
            walk(t.composite_pod_group_templates.as_ref(), out);
        }
    }
    let mut out = Vec::new();
    leaves(w.spec.pod_group_templates.as_ref(), &mut out);
    walk(w.spec.composite_pod_group_templates.as_ref(), &mut out);
    out
}

/// PURE: whether a native Workload must be applied again because a gang `minCount` of its
/// templates changed (a MusterJob's `gang.minCount`, or a set's template resized), as the
/// Job controller syncs it (`syncGangMinCount`); nothing else of it may change.
pub fn workload_min_counts_changed(existing: &native::Workload, desired: &native::Workload) -> bool {
    template_min_counts(existing) != template_min_counts(desired)
}

/// The native CompositePodGroup (`v1alpha3`, the one version serving it) of a compiled one
/// (its spec only: the status is kube-scheduler's).
pub fn composite_pod_group(g: &CompositePodGroup) -> Result<v1alpha3::CompositePodGroup, NativeError> {
    let mut spec: v1alpha3::CompositePodGroupSpec = convert("CompositePodGroup", &g.metadata, &g.spec)?;
    spec.priority = None;
    Ok(v1alpha3::CompositePodGroup { metadata: metadata(&g.metadata), spec, status: None })
}

/// A native Workload read back as muster's shape, so the builder can make a child's PodGroup
/// from the set's templates (as it does from muster's Workload).
pub fn from_native_workload(w: &native::Workload) -> Result<Workload, NativeError> {
    let mut out = Workload::new("", convert("Workload", &w.metadata, &w.spec)?);
    out.metadata = metadata(&w.metadata);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::workloadbuilder::job::{JOB_TEMPLATE_NAME, build_options, job_item};
    use crate::workloadbuilder::{Builder, FieldPath};

    /// A MusterJob spec with `scheduling`, compiled as the job controller compiles it.
    fn compiled(scheduling: Value) -> (Workload, PodGroup) {
        let spec: crate::crds::batch::MusterJobSpec = serde_json::from_value(json!({
            "parallelism": 4,
            "template": {"spec": {"priorityClassName": "high", "containers": [{"name": "c", "image": "x"}]}},
            "scheduling": scheduling,
        }))
        .expect("spec");
        let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "batch.muster.dev/v1alpha1".into(),
            kind: "MusterJob".into(),
            name: "train".into(),
            uid: "uid-1".into(),
            controller: Some(true),
            ..Default::default()
        };
        let item = job_item(&spec, JOB_TEMPLATE_NAME, &FieldPath::new("spec"));
        let builder = Builder::new(item, build_options("train", "ns", Some(owner)));
        let workload = builder.build_workload().expect("workload").clone();
        let mut group = builder.new_pod_group("train", JOB_TEMPLATE_NAME).expect("group");
        group.spec.priority = Some(1000);
        (workload, group)
    }

    /// `v` as JSON without `null` members, for comparison.
    fn json<T: serde::Serialize>(v: &T) -> Value {
        let mut v = serde_json::to_value(v).expect("json");
        fn walk(v: &mut Value) {
            match v {
                Value::Object(m) => {
                    m.retain(|_, x| !x.is_null());
                    m.values_mut().for_each(walk);
                }
                Value::Array(a) => a.iter_mut().for_each(walk),
                _ => {}
            }
        }
        walk(&mut v);
        v
    }

    #[test]
    fn auto_picks_upstream_where_it_is_served_and_upstream_falls_back_where_it_is_not() {
        use SchedulingApi::{Muster, Upstream};
        let table = [
            (None, true, Upstream),
            (None, false, Muster),
            (Some(Muster), true, Muster),
            (Some(Muster), false, Muster),
            (Some(Upstream), true, Upstream),
            (Some(Upstream), false, Muster),
        ];
        for (requested, served, want) in table {
            let (got, why) = choose(requested, served);
            assert_eq!(got, want, "{requested:?} served={served}: {why}");
            assert!(!why.is_empty());
        }
        for api in [Muster, Upstream] {
            assert_eq!(SchedulingApi::parse(api.as_str()), Some(api));
        }
        assert_eq!(SchedulingApi::parse("Upstream"), None);
    }

    #[test]
    fn a_new_job_gets_the_default_api_unless_muster_compiled_it_or_the_native_path_lacks_what_it_uses() {
        use crate::crds::batch::{CompletionMode, MusterJobSpec};
        use SchedulingApi::{Muster, Upstream};
        let plain: MusterJobSpec = serde_json::from_value(json!({
            "parallelism": 2,
            "template": {"spec": {"containers": [{"name": "c", "image": "x",
                "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}},
        }))
        .expect("fixture");
        assert_eq!(plain.completion_mode, CompletionMode::NonIndexed);
        let mut gpu_claims = plain.clone();
        gpu_claims.gpu_claims = Some(Default::default());
        let claims: MusterJobSpec = serde_json::from_value(json!({
            "parallelism": 2,
            "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
            "scheduling": {"resourceClaims": [{"name": "shared", "resourceClaimName": "dataset"}]},
        }))
        .expect("fixture");
        let empty_claims: MusterJobSpec = serde_json::from_value(json!({
            "parallelism": 2,
            "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
            "scheduling": {"resourceClaims": []},
        }))
        .expect("fixture");
        // (spec, child, default, muster group exists) -> api, a reason given
        let table = [
            (&plain, false, Upstream, false, Upstream, false),
            (&plain, false, Muster, false, Muster, false),
            (&plain, false, Upstream, true, Muster, false),
            (&plain, true, Upstream, false, Muster, true),
            (&plain, true, Muster, false, Muster, false),
            (&gpu_claims, false, Upstream, false, Muster, true),
            (&claims, false, Upstream, false, Muster, true),
            (&empty_claims, false, Upstream, false, Upstream, false),
        ];
        for (i, (spec, child, default, exists, want, reason)) in table.into_iter().enumerate() {
            let (api, why) = first_scheduling_api(spec, child, default, exists);
            assert_eq!((api, why.is_some()), (want, reason), "row {i}: {why:?}");
        }
    }

    #[test]
    fn a_new_set_gets_the_default_api_unless_its_tree_needs_what_only_muster_has() {
        use SchedulingApi::{Muster, Upstream};
        let set = |scheduling: bool, template: Value| -> MusterJobSetSpec {
            let mut spec = json!({"replicatedJobs": [
                {"name": "driver", "replicas": 1, "template": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}},
                {"name": "workers", "replicas": 1, "template": {"spec": template}},
            ]});
            if scheduling {
                spec["scheduling"] = json!({"schedulingPolicy": {"gang": {}}});
            }
            serde_json::from_value(spec).expect("fixture")
        };
        let plain = json!({"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}});
        let mut gpu_claims = plain.clone();
        gpu_claims["gpuClaims"] = json!({});
        let mut claims = plain.clone();
        claims["scheduling"] = json!({"resourceClaims": [{"name": "shared", "resourceClaimName": "dataset"}]});
        // (set, default, muster root exists, composite served) -> api, the reason names
        let table = [
            (set(true, plain.clone()), Upstream, false, true, Upstream, None),
            (set(true, plain.clone()), Muster, false, true, Muster, None),
            (set(true, plain.clone()), Upstream, true, true, Muster, None),
            (set(true, plain.clone()), Upstream, false, false, Muster, Some("CompositePodGroup")),
            // Without spec.scheduling there is no composite: the children are standalone.
            (set(false, plain.clone()), Upstream, false, false, Upstream, None),
            (
                set(true, gpu_claims.clone()),
                Upstream,
                false,
                true,
                Muster,
                Some("replicatedJob workers uses spec.gpuClaims"),
            ),
            (set(false, gpu_claims), Upstream, false, true, Muster, Some("spec.gpuClaims")),
            (
                set(true, claims),
                Upstream,
                false,
                true,
                Muster,
                Some("replicatedJob workers uses spec.scheduling.resourceClaims"),
            ),
        ];
        for (i, (spec, default, exists, served, want, reason)) in table.into_iter().enumerate() {
            let (api, why) = first_set_scheduling_api(&spec, default, exists, served);
            assert_eq!(api, want, "row {i}: {why:?}");
            match reason {
                Some(r) => assert!(why.as_deref().is_some_and(|w| w.contains(r)), "row {i}: {why:?}"),
                None => assert_eq!(why, None, "row {i}"),
            }
        }
    }

    #[test]
    fn a_sets_native_workload_and_composite_carry_the_compiled_tree() {
        use crate::workloadbuilder::job::{jobset_item, root_template_name};
        let spec: MusterJobSetSpec = serde_json::from_value(json!({
            "scheduling": {"schedulingPolicy": {"gang": {}}, "disruptionMode": {"all": {}},
                           "schedulingConstraints": {"topology": [{"key": "topology.muster.dev/rack"}]}},
            "replicatedJobs": [
                {"name": "driver", "replicas": 1, "template": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}},
                {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 4,
                    "scheduling": {"schedulingPolicy": {"gang": {"minCount": 3}}},
                    "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}},
            ],
        }))
        .expect("fixture");
        let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "batch.muster.dev/v1alpha1".into(),
            kind: "MusterJobSet".into(),
            name: "s".into(),
            uid: "uid-s".into(),
            controller: Some(true),
            ..Default::default()
        };
        let item = jobset_item(&spec).expect("a tree");
        let builder = Builder::new(item, build_options("s", "ns", Some(owner)));
        let compiled = builder.build_workload().expect("workload").clone();
        let mut cpg = builder.new_composite_pod_group("s", &root_template_name(&spec)).expect("composite");
        cpg.spec.priority = Some(7);
        let nw = workload(&compiled).expect("native workload");
        let ncpg = composite_pod_group(&cpg).expect("native composite");
        assert_eq!(json(&nw.spec), json(&compiled.spec));
        let mut want = json(&cpg.spec);
        want.as_object_mut().expect("object").remove("priority");
        assert_eq!(json(&ncpg.spec), want);
        assert_eq!(
            ncpg.spec.scheduling_policy.gang.as_ref().map(|g| g.min_group_count),
            Some(3),
            "1 driver + 2 workers"
        );
        assert_eq!(serde_json::to_value(&ncpg).expect("json")["apiVersion"], "scheduling.k8s.io/v1alpha3");
        assert_eq!(ncpg.metadata.owner_references, cpg.metadata.owner_references);
        // A child's PodGroup made from the native Workload read back equals one made from the
        // compiled Workload (what muster's API does), parent aside.
        let child = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            kind: "MusterJob".into(),
            name: "s-x-0".into(),
            uid: "uid-c".into(),
            ..Default::default()
        };
        let back = from_native_workload(&nw).expect("read back");
        let from_native = Builder::from_existing_workload(back, build_options("s", "ns", Some(child.clone())));
        let from_compiled = Builder::from_existing_workload(compiled, build_options("s", "ns", Some(child.clone())));
        for template in ["driver", "workers"] {
            let a = from_native.new_pod_group("s-x-0", template).expect("from native");
            let b = from_compiled.new_pod_group("s-x-0", template).expect("from compiled");
            assert_eq!(json(&a.spec), json(&b.spec), "{template}");
        }
        let workers = from_native.new_pod_group("s-workers-0", "workers").expect("workers");
        assert_eq!(workers.spec.scheduling_policy.gang.as_ref().and_then(|g| g.min_count), Some(3));
        // Applied again only when a template's gang minCount changed.
        assert!(!workload_min_counts_changed(&nw, &nw.clone()));
        let mut resized = spec.clone();
        resized.replicated_jobs[1].template.spec.scheduling =
            serde_json::from_value(json!({"schedulingPolicy": {"gang": {"minCount": 2}}})).expect("scheduling");
        let again = Builder::new(jobset_item(&resized).expect("tree"), build_options("s", "ns", Some(child)));
        let renamed = workload(again.build_workload().expect("workload")).expect("native");
        assert!(workload_min_counts_changed(&nw, &renamed));
        assert!(!workload_min_counts_changed(&renamed, &renamed.clone()));
    }

    #[test]
    fn a_recorded_api_goes_on_unless_the_group_is_in_the_other_api_or_upstream_is_not_served() {
        use SchedulingApi::{Muster, Upstream};
        // (recorded, muster group, native group, served) -> api or refusal reason
        let table = [
            ("muster", false, false, false, Ok(Muster)),
            ("muster", true, false, true, Ok(Muster)),
            ("upstream", false, false, true, Ok(Upstream)),
            ("upstream", false, true, true, Ok(Upstream)),
            ("upstream", false, false, false, Err("UpstreamNotServed")),
            ("upstream", true, false, true, Err("SchedulingAPIChanged")),
            ("muster", false, true, true, Err("SchedulingAPIChanged")),
        ];
        for (i, (recorded, muster_group, native_group, served, want)) in table.into_iter().enumerate() {
            let got = recorded_scheduling_api(recorded, muster_group, native_group, served);
            assert_eq!(got.as_ref().map_err(|(reason, _)| *reason), want.as_ref().map_err(|r| *r), "row {i}: {got:?}");
            if let Err((_, message)) = got {
                assert!(message.contains(crate::crds::SCHEDULING_API_ANNOTATION), "{message}");
            }
        }
    }

    #[test]
    fn the_native_objects_carry_the_compiled_specs_field_for_field() {
        let cases = [
            json!({"schedulingPolicy": {"gang": {"minCount": 3}}}),
            json!({"schedulingPolicy": {"basic": {}}, "disruptionMode": {"single": {}}}),
            json!({"schedulingPolicy": {"gang": {}}, "disruptionMode": {"all": {}},
                   "schedulingConstraints": {"topology": [{"key": "topology.muster.dev/rack"}]}}),
            json!({"schedulingPolicy": {"gang": {}}, "resourceClaims": [
                {"name": "slice", "resourceClaimTemplateName": "gpu-slice"},
                {"name": "shared", "resourceClaimName": "dataset"}]}),
        ];
        for scheduling in cases {
            let (w, g) = compiled(scheduling.clone());
            let nw = workload(&w).expect("native workload");
            let ng = pod_group(&g).expect("native group");
            assert_eq!(json(&nw.spec), json(&w.spec), "Workload spec of {scheduling}");
            // Everything but the priority, which the API server's Priority plugin resolves.
            let mut want = json(&g.spec);
            want.as_object_mut().expect("object").remove("priority");
            assert_eq!(json(&ng.spec), want, "PodGroup spec of {scheduling}");
            assert_eq!(ng.spec.priority, None);
            assert_eq!(ng.spec.priority_class_name.as_deref(), Some("high"));
            for (native, compiled) in [(&nw.metadata, &w.metadata), (&ng.metadata, &g.metadata)] {
                assert_eq!(native.name, compiled.name);
                assert_eq!(native.namespace.as_deref(), Some("ns"));
                assert_eq!(native.owner_references, compiled.owner_references);
                assert!(native.owner_references.as_ref().is_some_and(|o| o[0].uid == "uid-1"));
            }
            // And the JSON the API server gets names the native group.
            let body = serde_json::to_value(&nw).expect("json");
            assert_eq!(body["apiVersion"], "scheduling.k8s.io/v1beta1");
            assert_eq!(serde_json::to_value(&ng).expect("json")["kind"], "PodGroup");
        }
    }
}
