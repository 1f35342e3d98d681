//! PURE: the child MusterJobs of a set as JobSet makes its Jobs: JobSet's labels and
//! annotations (on the child and its pod template), `completionMode: Indexed` unless the
//! template says otherwise, the pods' `subdomain`, and the set's `suspend`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::workloadbuilder::job::child_job_name;
use crate::workloadbuilder::native::SchedulingApi;
use muster_api::batch::{MusterJob, MusterJobSet, MusterJobSetSpec};
use muster_api::{
    GROUP_TEMPLATE_ANNOTATION, JOBSET_NAME_LABEL, PARENT_COMPOSITE_ANNOTATION, REPLICATED_JOB_LABEL,
    SCHEDULING_API_ANNOTATION,
};

/// Child annotation: the restart attempt it was created in.
pub const RESTART_ATTEMPT_ANNOTATION: &str = "batch.muster.dev/restart-attempt";
/// JobSet's `groupName` when a replicatedJob names none.
pub const DEFAULT_GROUP_NAME: &str = "default";

/// The label and annotation keys JobSet writes on its Jobs and their pods
/// (`api/jobset/v1alpha2/jobset_types.go`, `pkg/constants`); muster writes them on a set's
/// children and their pod templates, with the same values.
pub mod keys {
    /// The set's name.
    pub const JOBSET_NAME: &str = "jobset.sigs.k8s.io/jobset-name";
    /// The set's uid.
    pub const JOBSET_UID: &str = "jobset.sigs.k8s.io/jobset-uid";
    /// The child's replicatedJob.
    pub const REPLICATED_JOB_NAME: &str = "jobset.sigs.k8s.io/replicatedjob-name";
    /// `replicas` of the child's replicatedJob.
    pub const REPLICATED_JOB_REPLICAS: &str = "jobset.sigs.k8s.io/replicatedjob-replicas";
    /// Children of the whole set.
    pub const GLOBAL_REPLICAS: &str = "jobset.sigs.k8s.io/global-replicas";
    /// The child's index in its replicatedJob.
    pub const JOB_INDEX: &str = "jobset.sigs.k8s.io/job-index";
    /// The child's index in the whole set (replicatedJobs in list order).
    pub const JOB_GLOBAL_INDEX: &str = "jobset.sigs.k8s.io/job-global-index";
    /// The set's `status.restarts` when the child was made.
    pub const RESTART_ATTEMPT: &str = "jobset.sigs.k8s.io/restart-attempt";
    /// The replicatedJob's `groupName`.
    pub const GROUP_NAME: &str = "jobset.sigs.k8s.io/group-name";
    /// Children of the replicatedJobs of that group.
    pub const GROUP_REPLICAS: &str = "jobset.sigs.k8s.io/group-replicas";
    /// The child's index in its group.
    pub const JOB_GROUP_INDEX: &str = "jobset.sigs.k8s.io/job-group-index";
    /// The coordinator pod's stable DNS name (with `spec.coordinator`).
    pub const COORDINATOR: &str = "jobset.sigs.k8s.io/coordinator";
}

/// Whether the set's pods get DNS hostnames through a headless Service
/// (`network.enableDNSHostnames`, default true as JobSet's webhook defaults it).
pub fn dns_hostnames(spec: &MusterJobSetSpec) -> bool {
    spec.network.as_ref().and_then(|n| n.enable_dns_hostnames).unwrap_or(true)
}

/// `network.publishNotReadyAddresses` (default true).
pub fn publish_not_ready_addresses(spec: &MusterJobSetSpec) -> bool {
    spec.network.as_ref().and_then(|n| n.publish_not_ready_addresses).unwrap_or(true)
}

/// The set's subdomain, its headless Service's name: `network.subdomain`, else the set's name
/// (JobSet's `GetSubdomain`).
pub fn subdomain(set: &MusterJobSet) -> String {
    set.spec
        .network
        .as_ref()
        .and_then(|n| n.subdomain.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| set.metadata.name.clone().unwrap_or_default())
}

/// The coordinator's stable DNS name, `<set>-<rjob>-<jobIndex>-<podIndex>.<subdomain>`
/// (JobSet's `CoordinatorEndpoint`), with `spec.coordinator`.
pub fn coordinator_endpoint(set: &MusterJobSet) -> Option<String> {
    let c = set.spec.coordinator.as_ref()?;
    let name = set.metadata.name.as_deref().unwrap_or_default();
    Some(format!("{name}-{}-{}-{}.{}", c.replicated_job, c.job_index, c.pod_index, subdomain(set)))
}

fn group_of(rjob: &muster_api::batch::ReplicatedJob) -> &str {
    rjob.group_name.as_deref().filter(|g| !g.is_empty()).unwrap_or(DEFAULT_GROUP_NAME)
}

/// JobSet's labels of child `i` of replicatedJob `r` in restart attempt `attempt` (also its
/// annotations: JobSet writes the same keys as both). Counts add up in i64: replicas may be
/// anything the API allows.
pub fn jobset_keys(set: &MusterJobSet, r: usize, i: i32, attempt: i32) -> BTreeMap<String, String> {
    let rjobs = &set.spec.replicated_jobs;
    let Some(rjob) = rjobs.get(r) else { return BTreeMap::new() };
    let replicas = |it: &mut dyn Iterator<Item = &muster_api::batch::ReplicatedJob>| -> i64 {
        it.map(|r| i64::from(r.replicas.max(0))).sum()
    };
    let group = group_of(rjob);
    let before = replicas(&mut rjobs[..r].iter());
    let group_before = replicas(&mut rjobs[..r].iter().filter(|o| group_of(o) == group));
    let mut keys = BTreeMap::from([
        (keys::JOBSET_NAME, set.metadata.name.clone().unwrap_or_default()),
        (keys::JOBSET_UID, set.metadata.uid.clone().unwrap_or_default()),
        (keys::REPLICATED_JOB_NAME, rjob.name.clone()),
        (keys::REPLICATED_JOB_REPLICAS, rjob.replicas.to_string()),
        (keys::GLOBAL_REPLICAS, replicas(&mut rjobs.iter()).to_string()),
        (keys::JOB_INDEX, i.to_string()),
        (keys::JOB_GLOBAL_INDEX, (before + i64::from(i)).to_string()),
        (keys::RESTART_ATTEMPT, attempt.to_string()),
        (keys::GROUP_NAME, group.to_string()),
        (keys::GROUP_REPLICAS, replicas(&mut rjobs.iter().filter(|o| group_of(o) == group)).to_string()),
        (keys::JOB_GROUP_INDEX, (group_before + i64::from(i)).to_string()),
    ]);
    if let Some(endpoint) = coordinator_endpoint(set) {
        keys.insert(keys::COORDINATOR, endpoint);
    }
    keys.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// The child MusterJob `i` of replicatedJob `r`, for restart attempt `attempt`, in the set's
/// scheduling API (`api`, stamped on it: the whole tree is in one API).
///
/// As JobSet makes a Job: the template's spec, `completionMode: Indexed` when the template
/// leaves it unset (JobSet's webhook default; a template saying `NonIndexed` keeps it) with
/// `completions` defaulting to `parallelism`,
/// `suspend` as the set's, JobSet's labels and annotations ([`jobset_keys`]) on the child and
/// its pod template, and with DNS hostnames the pods' `subdomain`. muster's own keys (the set,
/// the replicatedJob, the attempt, the delegation to the set's CompositePodGroup) come from
/// muster alone.
pub fn child_job(set: &MusterJobSet, r: usize, i: i32, attempt: i32, api: SchedulingApi) -> Option<MusterJob> {
    let rjob = set.spec.replicated_jobs.get(r)?;
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let meta = rjob.template.metadata.clone().unwrap_or_default();
    let jobset = jobset_keys(set, r, i, attempt);
    // muster's own keys on a child come from muster alone (the webhook refuses a template's).
    let own = |k: &String| crate::workloadbuilder::field::is_muster_key(k);
    let mut labels = meta.labels;
    labels.retain(|k, _| !own(k));
    labels.extend(jobset.clone());
    labels.insert(JOBSET_NAME_LABEL.into(), set_name.clone());
    labels.insert(REPLICATED_JOB_LABEL.into(), rjob.name.clone());
    let mut annotations = meta.annotations;
    annotations.retain(|k, _| !own(k));
    annotations.extend(jobset.clone());
    annotations.insert(RESTART_ATTEMPT_ANNOTATION.into(), attempt.to_string());
    annotations.insert(SCHEDULING_API_ANNOTATION.into(), api.as_str().into());
    if set.spec.scheduling.is_some() {
        annotations.insert(GROUP_TEMPLATE_ANNOTATION.into(), rjob.name.clone());
        annotations.insert(PARENT_COMPOSITE_ANNOTATION.into(), set_name.clone());
    }
    // Indexed when the template leaves the mode unset, `completions` then defaulting to
    // `parallelism` (as the set's validation reads the template).
    let mut spec = crate::workloadbuilder::job::jobset::child_spec(&rjob.template.spec).into_owned();
    spec.suspend = set.spec.suspend;
    let template_meta = spec.template.metadata.get_or_insert_with(Default::default);
    template_meta.labels.get_or_insert_with(BTreeMap::new).extend(jobset.clone());
    template_meta.annotations.get_or_insert_with(BTreeMap::new).extend(jobset);
    if dns_hostnames(&set.spec) {
        spec.template.spec.get_or_insert_with(Default::default).subdomain = Some(subdomain(set));
    }
    Some(MusterJob {
        metadata: ObjectMeta {
            name: Some(child_job_name(&set_name, &rjob.name, i)),
            namespace: set.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: crate::owners::controller_ref(set).map(|o| vec![o]),
            ..Default::default()
        },
        spec,
        status: None,
    })
}
