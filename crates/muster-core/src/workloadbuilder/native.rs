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

use muster_api::batch::MusterJobSetSpec;
use muster_api::blocks::{PodGroupResourceClaim, SchedulingConstraints};
use muster_api::scheduling::{CompositePodGroup, PodGroup, Workload};

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

/// What the API server keeps of a native PodGroup's optional fields that a feature gate
/// guards. Where a gate is off the API server drops its field from a new object without a word,
/// so kube-scheduler would gang-schedule without it: a job using such a field stays on muster's
/// API, which honours it. Probed once at start with a server-side dry run of
/// [`probe_pod_group`] ([`NativeFields::kept`] reads the answer); unknown means not kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NativeFields {
    /// `schedulingConstraints` (feature gate `TopologyAwareWorkloadScheduling`).
    pub scheduling_constraints: bool,
    /// `resourceClaims` (feature gate `DRAWorkloadResourceClaims`).
    pub resource_claims: bool,
}

/// Name of the PodGroup the start-up probe dry-runs.
pub const PROBE_NAME: &str = "muster-native-fields-probe";

/// The PodGroup the start-up probe sends (dry run: nothing is stored): every gated optional
/// field muster compiles, set.
pub fn probe_pod_group(namespace: &str) -> native::PodGroup {
    native::PodGroup {
        metadata: ObjectMeta { name: Some(PROBE_NAME.into()), namespace: Some(namespace.into()), ..Default::default() },
        spec: native::PodGroupSpec {
            scheduling_policy: native::PodGroupSchedulingPolicy {
                basic: Some(native::BasicSchedulingPolicy(serde_json::json!({}))),
                ..Default::default()
            },
            scheduling_constraints: Some(native::PodGroupSchedulingConstraints {
                topology: Some(vec![native::TopologyConstraint { key: "kubernetes.io/hostname".into() }]),
            }),
            resource_claims: Some(vec![native::PodGroupResourceClaim {
                name: "probe".into(),
                resource_claim_name: Some(PROBE_NAME.into()),
                resource_claim_template_name: None,
            }]),
            ..Default::default()
        },
        status: None,
    }
}

impl NativeFields {
    /// Every field kept (a cluster with all the gates on).
    pub const ALL: NativeFields = NativeFields { scheduling_constraints: true, resource_claims: true };

    /// PURE: what the API server kept of [`probe_pod_group`], from the object it answered.
    pub fn kept(answer: &native::PodGroupSpec) -> Self {
        NativeFields {
            scheduling_constraints: answer
                .scheduling_constraints
                .as_ref()
                .and_then(|c| c.topology.as_ref())
                .is_some_and(|t| !t.is_empty()),
            resource_claims: answer.resource_claims.as_ref().is_some_and(|c| !c.is_empty()),
        }
    }

    /// PURE: the fields the API server drops, each as `<field> (feature gate <gate> off)`.
    pub fn missing(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if !self.scheduling_constraints {
            out.push("schedulingConstraints (feature gate TopologyAwareWorkloadScheduling off)");
        }
        if !self.resource_claims {
            out.push("resourceClaims (feature gate DRAWorkloadResourceClaims off)");
        }
        out
    }

    /// PURE: the fields of gang blocks at `path` (`constraints`, `claims`) that the API server
    /// would drop, each as `<path>.<field> (feature gate <gate> off)`. Empty ones drop nothing.
    pub fn dropped(
        &self,
        path: &str,
        constraints: Option<&SchedulingConstraints>,
        claims: Option<&[PodGroupResourceClaim]>,
    ) -> Vec<String> {
        let used = NativeFields {
            scheduling_constraints: constraints.and_then(|c| c.topology.as_ref()).is_some_and(|t| !t.is_empty()),
            resource_claims: claims.is_some_and(|c| !c.is_empty()),
        };
        let lost = NativeFields {
            scheduling_constraints: !used.scheduling_constraints || self.scheduling_constraints,
            resource_claims: !used.resource_claims || self.resource_claims,
        };
        lost.missing().into_iter().map(|f| format!("{path}.{f}")).collect()
    }

    /// PURE: what a MusterJob's `spec.scheduling` (at `path`) uses that the API server drops.
    pub fn dropped_by_job(&self, spec: &muster_api::batch::MusterJobSpec, path: &str) -> Vec<String> {
        let s = spec.scheduling.as_ref();
        self.dropped(
            path,
            s.and_then(|s| s.scheduling_constraints.as_ref()),
            s.and_then(|s| s.resource_claims.as_deref()),
        )
    }

    /// PURE: what a MusterJobSet's tree uses that the API server drops: the set's own
    /// `spec.scheduling` and every replicatedJob template's.
    pub fn dropped_by_set(&self, spec: &MusterJobSetSpec) -> Vec<String> {
        let own = spec.scheduling.as_ref().and_then(|s| s.scheduling_constraints.as_ref());
        let mut out = self.dropped("spec.scheduling", own, None);
        for (i, r) in spec.replicated_jobs.iter().enumerate() {
            out.extend(
                self.dropped_by_job(&r.template.spec, &format!("spec.replicatedJobs[{i}].template.spec.scheduling")),
            );
        }
        out
    }
}

/// The message of a job or set kept on (or refused) the native path because the API server
/// drops fields it uses.
fn dropped_message(dropped: &[String]) -> String {
    format!(
        "the API server drops {} from a native PodGroup, and kube-scheduler would schedule the gang without it",
        dropped.join(" and ")
    )
}

/// PURE: the scheduling API a job not recorded yet gets, and why when it is not the default:
/// a job muster compiled before (its muster PodGroup exists) keeps muster's; in upstream mode,
/// a MusterJobSet's child made before its set recorded an API, and a job using a field the API
/// server drops from a native PodGroup (`dropped`, see [`NativeFields::dropped_by_job`]), stay
/// on muster's. GPU claims (`spec.gpuClaims`) go either way: in upstream mode kube-scheduler
/// allocates the claims made from muster's template, and the allocation states the indices.
pub fn first_scheduling_api(
    child: bool,
    default: SchedulingApi,
    muster_group_exists: bool,
    dropped: &[String],
) -> (SchedulingApi, Option<String>) {
    if muster_group_exists || default == SchedulingApi::Muster {
        return (SchedulingApi::Muster, None);
    }
    if child {
        let why = "a MusterJobSet's child without the set's scheduling API (made before its set recorded one) compiles to muster's API";
        return (SchedulingApi::Muster, Some(why.to_string()));
    }
    if !dropped.is_empty() {
        return (
            SchedulingApi::Muster,
            Some(format!("{}: the job compiles to muster's API", dropped_message(dropped))),
        );
    }
    (SchedulingApi::Upstream, None)
}

/// PURE: the scheduling API a MusterJobSet not recorded yet gets, and why when it is not the
/// default. Its children follow it (the set stamps its API on each), so the whole tree is in
/// one API: a set with `spec.scheduling` needs the native CompositePodGroup
/// (`composite_served`), and a tree using a field the API server drops (`dropped`, see
/// [`NativeFields::dropped_by_set`]) keeps the set on muster's API. `muster_root_exists`: muster
/// compiled the set before (its Workload or CompositePodGroup exists).
pub fn first_set_scheduling_api(
    spec: &MusterJobSetSpec,
    default: SchedulingApi,
    muster_root_exists: bool,
    composite_served: bool,
    dropped: &[String],
) -> (SchedulingApi, Option<String>) {
    if muster_root_exists || default == SchedulingApi::Muster {
        return (SchedulingApi::Muster, None);
    }
    let why = if spec.scheduling.is_some() && !composite_served {
        Some("the API server does not serve scheduling.k8s.io/v1alpha3 CompositePodGroup (feature gate CompositePodGroup): the set compiles to muster's API".to_string())
    } else if !dropped.is_empty() {
        Some(format!("{}: the set compiles to muster's API", dropped_message(dropped)))
    } else {
        None
    };
    match why {
        Some(why) => (SchedulingApi::Muster, Some(why)),
        None => (SchedulingApi::Upstream, None),
    }
}

/// PURE: the scheduling API muster's mutating webhook writes on a MusterJob or MusterJobSet
/// it is asked about, so the controller's first sync finds it recorded and makes no write of
/// its own (at 5,000 nodes, one merge patch of a whole custom resource per job, validated by
/// the API server against the whole pod template). `old`: the annotation before an update
/// (`None` on create); `new`: the one the request carries; `default`: `--scheduling-api`
/// (`None`: `auto`).
///
/// - On create, a job without the annotation gets `muster` where the flag says `muster`: that
///   is what [`first_scheduling_api`] chooses then, whatever else holds. Under `auto` or
///   `upstream` the choice needs what only the controller knows (what the API server serves,
///   which fields it drops, whether the job is a set's child), so the webhook leaves it to the
///   controller's first sync.
/// - On update, a recorded API the request drops is kept: it is frozen, and a user's
///   server-side apply of the same manifest, whose field manager owns the annotation the webhook
///   wrote at create, would otherwise remove it and be refused. A change to another value is
///   left to the validating webhook, which refuses it with the field path.
pub fn api_to_record(old: Option<&str>, new: Option<&str>, default: Option<SchedulingApi>) -> Option<String> {
    match (old, new) {
        (_, Some(_)) => None,
        (Some(recorded), None) => Some(recorded.to_string()),
        (None, None) => (default == Some(SchedulingApi::Muster)).then(|| SchedulingApi::Muster.as_str().to_string()),
    }
}

/// The CEL of the MutatingAdmissionPolicy that records what [`api_to_record`] records, inside
/// the API server: the match condition that lets a request through (`unrecorded`), the
/// variable `api` it reads the value from, and the JSON patch that writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiRecordCel {
    /// Match condition: a request that names its API never reaches the mutation; without a
    /// `muster` default, only an update that drops a recorded API does.
    pub unrecorded: String,
    /// Variable `api`: the dropped API on such an update, `muster` otherwise.
    pub api: String,
    /// The JSON patch adding the annotation with `variables.api`.
    pub patch: String,
}

/// PURE: [`ApiRecordCel`] for `default` (`--scheduling-api`; `None`: `auto`).
pub fn api_record_cel(default: Option<SchedulingApi>) -> ApiRecordCel {
    use muster_api::SCHEDULING_API_ANNOTATION as KEY;
    let recorded = |o: &str| format!("has({o}.metadata.annotations) && '{KEY}' in {o}.metadata.annotations");
    // An UPDATE that drops the annotation the object had (`oldObject` is null on CREATE; `&&`
    // stops at the operation).
    let dropped = format!("request.operation == 'UPDATE' && {}", recorded("oldObject"));
    let unrecorded = match default {
        Some(SchedulingApi::Muster) => format!("!({})", recorded("object")),
        _ => format!("!({}) && {dropped}", recorded("object")),
    };
    let api = format!("{dropped} ? oldObject.metadata.annotations['{KEY}'] : '{}'", SchedulingApi::Muster.as_str());
    // `/` in a key is `~1` in a JSON pointer.
    let pointer = KEY.replace('~', "~0").replace('/', "~1");
    let patch = format!(
        "has(object.metadata.annotations) \
         ? [JSONPatch{{op: 'add', path: '/metadata/annotations/{pointer}', value: variables.api}}] \
         : [JSONPatch{{op: 'add', path: '/metadata/annotations', value: {{'{KEY}': variables.api}}}}]"
    );
    ApiRecordCel { unrecorded, api, patch }
}

/// Why a job that recorded an API cannot go on with it: a reason and a message.
pub type ApiRefusal = (&'static str, String);

/// PURE: the API of a job that recorded `recorded` (validated already), and whether it can go on
/// with it. `muster_group` and `native_group`: whether the job's PodGroup exists in muster's
/// API and in the native one; a group in the other API means the annotation was changed
/// behind the webhook, and muster does not move a job between APIs. `served`: whether the
/// native kinds it needs are served (the Workload and PodGroup; for a MusterJobSet with
/// `spec.scheduling` and its children, the CompositePodGroup too). `dropped`: the fields it
/// uses that the API server drops from a native PodGroup; a job recorded as `upstream` (by its
/// user, at creation) whose native group is not made yet is refused with them, as nothing
/// would honour them.
pub fn recorded_scheduling_api(
    recorded: &str,
    muster_group: bool,
    native_group: bool,
    served: bool,
    dropped: &[String],
) -> Result<SchedulingApi, ApiRefusal> {
    use muster_api::SCHEDULING_API_ANNOTATION;
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
    if api == SchedulingApi::Upstream && !native_group && !dropped.is_empty() {
        let message =
            format!("{SCHEDULING_API_ANNOTATION} is upstream, but {} (use muster's API)", dropped_message(dropped));
        return Err(("UpstreamDropsFields", message));
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

/// A native PodGroup's `spec.resourceClaims` in muster's shape (the same fields), for the
/// entries its pods carry.
pub fn group_claims(spec: &native::PodGroupSpec) -> Vec<PodGroupResourceClaim> {
    spec.resource_claims
        .iter()
        .flatten()
        .map(|c| PodGroupResourceClaim {
            name: c.name.clone(),
            resource_claim_name: c.resource_claim_name.clone(),
            resource_claim_template_name: c.resource_claim_template_name.clone(),
        })
        .collect()
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
        let spec: muster_api::batch::MusterJobSpec = serde_json::from_value(json!({
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
    fn the_webhook_records_muster_where_the_flag_decides_alone_and_keeps_a_recorded_api() {
        use SchedulingApi::{Muster, Upstream};
        /// (annotation before, annotation in the request, the flag, what the webhook writes)
        type Row = (Option<&'static str>, Option<&'static str>, Option<SchedulingApi>, Option<&'static str>);
        let s = Some;
        let table: [Row; 11] = [
            // Create: only `--scheduling-api=muster` decides without the controller.
            (None, None, Some(Muster), s("muster")),
            (None, None, Some(Upstream), None),
            (None, None, None, None),
            // Create with the user's own choice: left as it is (the validating webhook checks it).
            (None, Some("upstream"), Some(Muster), None),
            (None, Some("muster"), None, None),
            (None, Some("bogus"), Some(Muster), None),
            // Update dropping the record: kept, whatever the flag says now.
            (Some("upstream"), None, Some(Muster), s("upstream")),
            (Some("muster"), None, None, s("muster")),
            (Some("muster"), None, Some(Upstream), s("muster")),
            // Update keeping or changing it: nothing to add (a change is refused elsewhere).
            (Some("muster"), Some("muster"), Some(Muster), None),
            (Some("muster"), Some("upstream"), Some(Muster), None),
        ];
        for (old, new, default, want) in table {
            assert_eq!(api_to_record(old, new, default).as_deref(), want, "old {old:?}, new {new:?}, flag {default:?}");
        }
    }

    proptest::proptest! {
        /// What the webhook records at create is what the controller's first sync would choose
        /// for a job it has not compiled yet, child or not, whatever the API server drops.
        #[test]
        fn the_webhook_never_records_what_the_controller_would_not_choose(
            flag in proptest::option::of(proptest::bool::ANY),
            child in proptest::bool::ANY,
            composite_served in proptest::bool::ANY,
            dropped in proptest::collection::vec("[a-z.]{1,12}", 0..3),
        ) {
            let default = flag.map(|m| if m { SchedulingApi::Muster } else { SchedulingApi::Upstream });
            if let Some(recorded) = api_to_record(None, None, default) {
                let default = default.unwrap_or_default();
                let job = first_scheduling_api(child, default, false, &dropped).0;
                proptest::prop_assert_eq!(recorded.as_str(), job.as_str());
                let set = MusterJobSetSpec::default();
                let set = first_set_scheduling_api(&set, default, false, composite_served, &dropped).0;
                proptest::prop_assert_eq!(recorded.as_str(), set.as_str());
            }
        }
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

    fn job_spec(v: Value) -> muster_api::batch::MusterJobSpec {
        let mut spec = json!({"parallelism": 2, "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}});
        spec.as_object_mut().expect("object").extend(v.as_object().cloned().unwrap_or_default());
        serde_json::from_value(spec).expect("fixture")
    }

    #[test]
    fn the_fields_a_native_podgroup_loses_are_named_only_where_a_job_uses_them() {
        let none = NativeFields::default();
        let topology = json!({"scheduling": {"schedulingConstraints": {"topology": [{"key": "rack"}]}}});
        let empty_topology = json!({"scheduling": {"schedulingConstraints": {"topology": []}}});
        let claims = json!({"scheduling": {"resourceClaims": [{"name": "shared", "resourceClaimName": "dataset"}]}});
        let empty_claims = json!({"scheduling": {"resourceClaims": []}});
        let both = json!({"scheduling": {"schedulingConstraints": {"topology": [{"key": "rack"}]},
            "resourceClaims": [{"name": "shared", "resourceClaimTemplateName": "t"}]}});
        let gpu_claims = json!({"gpuClaims": {}});
        let constraints_only = NativeFields { scheduling_constraints: true, resource_claims: false };
        // (fields kept, spec) -> the fields named
        let table: [(NativeFields, &Value, &[&str]); 10] = [
            (none, &json!({}), &[]),
            (none, &gpu_claims, &[]),
            (none, &empty_topology, &[]),
            (none, &empty_claims, &[]),
            (
                none,
                &topology,
                &["spec.scheduling.schedulingConstraints (feature gate TopologyAwareWorkloadScheduling off)"],
            ),
            (none, &claims, &["spec.scheduling.resourceClaims (feature gate DRAWorkloadResourceClaims off)"]),
            (
                none,
                &both,
                &[
                    "spec.scheduling.schedulingConstraints (feature gate TopologyAwareWorkloadScheduling off)",
                    "spec.scheduling.resourceClaims (feature gate DRAWorkloadResourceClaims off)",
                ],
            ),
            (constraints_only, &both, &["spec.scheduling.resourceClaims (feature gate DRAWorkloadResourceClaims off)"]),
            (NativeFields::ALL, &both, &[]),
            (NativeFields::ALL, &claims, &[]),
        ];
        for (i, (fields, spec, want)) in table.into_iter().enumerate() {
            assert_eq!(fields.dropped_by_job(&job_spec(spec.clone()), "spec.scheduling"), want, "row {i}");
        }
    }

    #[test]
    fn the_probe_reads_back_what_the_api_server_kept() {
        let sent = probe_pod_group("muster-system");
        assert_eq!(sent.metadata.namespace.as_deref(), Some("muster-system"));
        assert_eq!(NativeFields::kept(&sent.spec), NativeFields::ALL, "everything the probe sets counts as kept");
        let mut no_claims = sent.spec.clone();
        no_claims.resource_claims = None;
        assert_eq!(
            NativeFields::kept(&no_claims),
            NativeFields { scheduling_constraints: true, resource_claims: false }
        );
        let mut none = no_claims.clone();
        none.scheduling_constraints = Some(native::PodGroupSchedulingConstraints { topology: Some(vec![]) });
        assert_eq!(NativeFields::kept(&none), NativeFields::default());
        none.scheduling_constraints = None;
        assert_eq!(NativeFields::kept(&none), NativeFields::default());
    }

    #[test]
    fn a_new_job_gets_the_default_api_unless_muster_compiled_it_or_the_native_path_drops_what_it_uses() {
        use SchedulingApi::{Muster, Upstream};
        let dropped = ["spec.scheduling.resourceClaims (feature gate DRAWorkloadResourceClaims off)".to_string()];
        let (dropped, none): (&[String], &[String]) = (&dropped, &[]);
        // (child, default, muster group exists, dropped) -> api, the reason names
        let table = [
            (false, Upstream, false, none, Upstream, None),
            (false, Muster, false, none, Muster, None),
            (false, Upstream, true, none, Muster, None),
            (true, Upstream, false, none, Muster, Some("MusterJobSet's child")),
            (true, Muster, false, none, Muster, None),
            (false, Upstream, false, dropped, Muster, Some("drops spec.scheduling.resourceClaims")),
            (false, Muster, false, dropped, Muster, None),
        ];
        for (i, (child, default, exists, dropped, want, reason)) in table.into_iter().enumerate() {
            let (api, why) = first_scheduling_api(child, default, exists, dropped);
            assert_eq!(api, want, "row {i}: {why:?}");
            match reason {
                Some(r) => assert!(why.as_deref().is_some_and(|w| w.contains(r)), "row {i}: {why:?}"),
                None => assert_eq!(why, None, "row {i}"),
            }
        }
    }

    #[test]
    fn a_new_set_gets_the_default_api_unless_its_tree_needs_what_only_muster_has() {
        use SchedulingApi::{Muster, Upstream};
        let set = |scheduling: Value, template: Value| -> MusterJobSetSpec {
            let mut spec = json!({"replicatedJobs": [
                {"name": "driver", "replicas": 1, "template": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}},
                {"name": "workers", "replicas": 1, "template": {"spec": template}},
            ]});
            if !scheduling.is_null() {
                spec["scheduling"] = scheduling;
            }
            serde_json::from_value(spec).expect("fixture")
        };
        let gang = json!({"schedulingPolicy": {"gang": {}}});
        let racked =
            json!({"schedulingPolicy": {"gang": {}}, "schedulingConstraints": {"topology": [{"key": "rack"}]}});
        let plain = json!({"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}});
        let mut gpu_claims = plain.clone();
        gpu_claims["gpuClaims"] = json!({});
        let mut claims = plain.clone();
        claims["scheduling"] = json!({"resourceClaims": [{"name": "shared", "resourceClaimName": "dataset"}]});
        let none = NativeFields::default();
        // (set, default, muster root exists, composite served, fields kept) -> api, the reason names
        let table = [
            (set(gang.clone(), plain.clone()), Upstream, false, true, none, Upstream, None),
            (set(gang.clone(), plain.clone()), Muster, false, true, none, Muster, None),
            (set(gang.clone(), plain.clone()), Upstream, true, true, none, Muster, None),
            (set(gang.clone(), plain.clone()), Upstream, false, false, none, Muster, Some("CompositePodGroup")),
            // Without spec.scheduling there is no composite: the children are standalone.
            (set(Value::Null, plain.clone()), Upstream, false, false, none, Upstream, None),
            // GPU claims are kube-scheduler's to allocate in upstream mode.
            (set(gang.clone(), gpu_claims.clone()), Upstream, false, true, none, Upstream, None),
            (
                set(gang.clone(), claims.clone()),
                Upstream,
                false,
                true,
                none,
                Muster,
                Some(
                    "spec.replicatedJobs[1].template.spec.scheduling.resourceClaims (feature gate DRAWorkloadResourceClaims off)",
                ),
            ),
            (set(gang.clone(), claims), Upstream, false, true, NativeFields::ALL, Upstream, None),
            (
                set(racked.clone(), plain.clone()),
                Upstream,
                false,
                true,
                none,
                Muster,
                Some("spec.scheduling.schedulingConstraints (feature gate TopologyAwareWorkloadScheduling off)"),
            ),
            (set(racked, plain), Upstream, false, true, NativeFields::ALL, Upstream, None),
        ];
        for (i, (spec, default, exists, served, fields, want, reason)) in table.into_iter().enumerate() {
            let dropped = fields.dropped_by_set(&spec);
            let (api, why) = first_set_scheduling_api(&spec, default, exists, served, &dropped);
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
    fn a_recorded_api_goes_on_unless_the_group_is_in_the_other_api_or_upstream_cannot_honour_it() {
        use SchedulingApi::{Muster, Upstream};
        let dropped = ["spec.scheduling.resourceClaims (feature gate DRAWorkloadResourceClaims off)".to_string()];
        let (dropped, none): (&[String], &[String]) = (&dropped, &[]);
        // (recorded, muster group, native group, served, dropped) -> api or refusal reason
        let table: [(_, _, _, _, _, Result<SchedulingApi, &str>); 10] = [
            ("muster", false, false, false, none, Ok(Muster)),
            ("muster", true, false, true, none, Ok(Muster)),
            ("muster", false, false, true, dropped, Ok(Muster)),
            ("upstream", false, false, true, none, Ok(Upstream)),
            ("upstream", false, true, true, none, Ok(Upstream)),
            ("upstream", false, false, false, none, Err("UpstreamNotServed")),
            ("upstream", true, false, true, none, Err("SchedulingAPIChanged")),
            ("muster", false, true, true, none, Err("SchedulingAPIChanged")),
            ("upstream", false, false, true, dropped, Err("UpstreamDropsFields")),
            // Compiled already: it goes on with what its native group holds.
            ("upstream", false, true, true, dropped, Ok(Upstream)),
        ];
        for (i, (recorded, muster_group, native_group, served, dropped, want)) in table.into_iter().enumerate() {
            let got = recorded_scheduling_api(recorded, muster_group, native_group, served, dropped);
            assert_eq!(got.as_ref().map_err(|(reason, _)| *reason), want.as_ref().map_err(|r| *r), "row {i}: {got:?}");
            if let Err((_, message)) = got {
                assert!(message.contains(muster_api::SCHEDULING_API_ANNOTATION), "{message}");
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

    /// The policy's match condition and its `api` variable, evaluated as the API server would
    /// (CEL), decide what the webhook decides ([`api_to_record`]) for every operation, old and
    /// new annotation and default.
    #[test]
    fn the_policy_records_what_the_webhook_records() {
        use cel::{Context, Program, Value};
        use muster_api::SCHEDULING_API_ANNOTATION;
        use std::collections::HashMap;
        let object = |api: Option<&str>, other: bool| -> Value {
            let mut annotations: HashMap<String, Value> = HashMap::new();
            if let Some(api) = api {
                annotations.insert(SCHEDULING_API_ANNOTATION.into(), api.into());
            }
            if other {
                annotations.insert("team".into(), "a".into());
            }
            let mut metadata: HashMap<String, Value> = HashMap::from([("name".into(), "j".into())]);
            if api.is_some() || other {
                metadata.insert("annotations".into(), annotations.into());
            }
            HashMap::from([("metadata".to_string(), Value::from(metadata))]).into()
        };
        let defaults = [Some(SchedulingApi::Muster), Some(SchedulingApi::Upstream), None];
        let apis = [None, Some("muster"), Some("upstream")];
        let mut cases = 0;
        for default in defaults {
            let cel = api_record_cel(default);
            for operation in ["CREATE", "UPDATE"] {
                for (old, new, other) in
                    apis.iter().flat_map(|o| apis.iter().flat_map(move |n| [(o, n, false), (o, n, true)]))
                {
                    if operation == "CREATE" && old.is_some() {
                        continue;
                    }
                    let mut ctx = Context::default();
                    let request: HashMap<String, Value> = HashMap::from([("operation".to_string(), operation.into())]);
                    ctx.add_variable_from_value("request", request);
                    ctx.add_variable_from_value("object", object(*new, other));
                    let old_object = if operation == "CREATE" { Value::Null } else { object(*old, other) };
                    ctx.add_variable_from_value("oldObject", old_object);
                    let eval = |expression: &str| {
                        Program::compile(expression)
                            .unwrap_or_else(|e| panic!("{expression}: {e}"))
                            .execute(&ctx)
                            .unwrap_or_else(|e| panic!("{expression}: {e}"))
                    };
                    let matched = eval(&cel.unrecorded) == Value::Bool(true);
                    let recorded = matched.then(|| match eval(&cel.api) {
                        Value::String(s) => s.to_string(),
                        other => panic!("api is {other:?}"),
                    });
                    let want = api_to_record(*old, *new, default);
                    assert_eq!(
                        recorded, want,
                        "{default:?} {operation} old {old:?} new {new:?} other annotations {other}"
                    );
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, 3 * (3 * 2 + 9 * 2));
    }
}
