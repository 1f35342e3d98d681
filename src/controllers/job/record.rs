//! The record the job controller's pod cache keeps of each pod: what a reconcile reads of it
//! ([`ObservedPod`], the core's), with the namespace, job label and controller that say which
//! job it belongs to; keyed in the reflector store as the pod is.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::Pod;

use super::plan::ObservedPod;
use crate::crds::JOB_NAME_LABEL;

/// What the job controller's watch cache keeps of one of its pods: the job it belongs to and
/// what the job logic reads ([`ObservedPod`]). A few hundred bytes: the trimmed `Pod` it
/// replaced was about 4 KiB (13 MiB for the 3,000 pods of a 5,000-node bench run).
#[derive(Clone, Debug, PartialEq)]
pub struct JobPod {
    /// The pod's namespace.
    pub namespace: String,
    /// Its job name label.
    pub job: Option<String>,
    /// The UID of its controller (owner reference).
    pub controller_uid: Option<String>,
    /// What the job logic reads.
    pub observed: ObservedPod,
}

impl JobPod {
    /// Reads the record of `pod`.
    pub fn of(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        JobPod {
            namespace: meta.namespace.clone().unwrap_or_default(),
            job: meta.labels.as_ref().and_then(|l| l.get(JOB_NAME_LABEL)).cloned(),
            controller_uid: crate::controllers::controller_uid(meta).map(str::to_string),
            observed: ObservedPod::from_pod(pod),
        }
    }

    /// Whether it is a pod of the job `name` in `namespace` with UID `uid`.
    pub fn of_job(&self, namespace: &str, name: &str, uid: &str) -> bool {
        self.namespace == namespace && self.job.as_deref() == Some(name) && self.controller_uid.as_deref() == Some(uid)
    }
}

/// A reflector store of records keys them by name and namespace, as it does pods.
impl kube::runtime::reflector::Lookup for JobPod {
    type DynamicType = ();

    fn kind(_: &()) -> Cow<'_, str> {
        "Pod".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "pods".into()
    }

    fn name(&self) -> Option<Cow<'_, str>> {
        Some(self.observed.name.as_str().into())
    }

    fn namespace(&self) -> Option<Cow<'_, str>> {
        Some(self.namespace.as_str().into())
    }

    fn resource_version(&self) -> Option<Cow<'_, str>> {
        None
    }

    fn uid(&self) -> Option<Cow<'_, str>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::job::plan::{NewPod, new_pod};
    use crate::crds::ROLLED_BACK_ANNOTATION;
    use crate::crds::batch::{CompletionMode, MusterJob, MusterJobSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn spec(parallelism: i32, completions: Option<i32>, mode: CompletionMode) -> MusterJobSpec {
        let mut s: MusterJobSpec = serde_json::from_value(serde_json::json!({
            "parallelism": parallelism,
            "template": {"spec": {"containers": [{"name": "c", "image": "busybox",
                "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}},
        }))
        .expect("fixture");
        s.completions = completions;
        s.completion_mode = mode;
        s
    }

    #[test]
    fn a_job_pod_record_reads_as_the_whole_pod_and_names_its_job() {
        let mut job = MusterJob::new("train", spec(2, Some(2), CompletionMode::Indexed));
        job.metadata.uid = Some("uid".into());
        let mut pod = new_pod(&job, &NewPod { index: Some(1), attempt: 1 }, "train", Some("train"), 2);
        pod.metadata.name = Some("train-1-abc".into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.annotations.get_or_insert_default().insert(ROLLED_BACK_ANNOTATION.into(), "plan-1".into());
        pod.metadata.annotations.get_or_insert_default().insert("other.example.com/note".into(), "x".repeat(4096));
        pod.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let status: k8s_openapi::api::core::v1::PodStatus = serde_json::from_value(serde_json::json!({
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "main", "image": "img", "imageID": "id", "ready": true, "restartCount": 2,
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}],
            "initContainerStatuses": [{"name": "init", "image": "img", "imageID": "id", "ready": false, "restartCount": 1}],
        }))
        .expect("status");
        pod.status = Some(status);
        for gated in [true, false] {
            if !gated {
                pod.spec.as_mut().expect("spec").scheduling_gates = None;
            }
            let record = JobPod::of(&pod);
            assert_eq!(record.observed, ObservedPod::from_pod(&pod), "gated: {gated}");
            assert_eq!((record.observed.restarts, record.observed.gated, record.observed.ready), (3, gated, true));
            assert!(record.observed.terminating && record.observed.rolled_back);
            assert!(record.of_job("ns", "train", "uid"));
            assert!(!record.of_job("other", "train", "uid"), "another namespace");
            assert!(!record.of_job("ns", "train-2", "uid"), "another job");
            assert!(!record.of_job("ns", "train", "uid-2"), "a job of the same name made again");
            // Keyed in a reflector store as the pod is.
            let key = kube::runtime::reflector::Lookup::to_object_ref(&record, ());
            assert_eq!((key.name.as_str(), key.namespace.as_deref()), ("train-1-abc", Some("ns")));
        }
        // A pod without the job label or a controller belongs to no job.
        pod.metadata.labels.as_mut().expect("labels").remove(JOB_NAME_LABEL);
        pod.metadata.owner_references = None;
        let record = JobPod::of(&pod);
        assert_eq!((record.job.as_deref(), record.controller_uid.as_deref()), (None, None));
        assert!(!record.of_job("ns", "train", "uid"));
    }
}
