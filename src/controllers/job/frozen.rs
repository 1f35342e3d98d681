//! The fields of a job frozen after creation: their hashes, recorded on its PodGroup, and the
//! parts that changed since, to notice changes that got past the webhook.

use std::collections::BTreeMap;

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::controllers::context::Result;
use crate::crds::batch::MusterJob;

/// PodGroup annotation: hashes of the job fields frozen after creation, to notice changes
/// that got past the webhook.
pub const FROZEN_HASH_ANNOTATION: &str = "batch.muster.dev/frozen-fields";

/// Hashes of the fields frozen after creation, as `part=hash` pairs.
pub(super) fn frozen_hashes(job: &MusterJob) -> Result<String> {
    let mut scheduling = serde_json::to_value(&job.spec.scheduling)?;
    if let Some(gang) = scheduling.pointer_mut("/schedulingPolicy/gang").and_then(|g| g.as_object_mut()) {
        gang.remove("minCount");
    }
    let parts = [
        ("template", serde_json::to_value(&job.spec.template)?),
        ("completions", json!([job.spec.completions, job.spec.completion_mode])),
        ("scheduling", scheduling),
        ("gpuClaims", serde_json::to_value(&job.spec.gpu_claims)?),
    ];
    Ok(parts
        .iter()
        .map(|(name, v)| {
            let digest = Sha256::digest(v.to_string().as_bytes());
            format!("{name}={}", &hex::encode(digest)[..12])
        })
        .collect::<Vec<_>>()
        .join(","))
}

/// The frozen parts of `job` that changed from the hashes `old`: `spec.completions` may change
/// in an elastic Indexed job (batch/v1: with parallelism, the two equal).
pub(super) fn changed_frozen_parts(job: &MusterJob, old: &str, new: &str) -> Vec<String> {
    let elastic = job.spec.indexed() && job.spec.completions == Some(job.spec.parallelism);
    changed_parts(old, new).into_iter().filter(|c| !(elastic && c == "spec.completions")).collect()
}

pub(super) fn changed_parts(old: &str, new: &str) -> Vec<String> {
    let parse = |s: &str| -> BTreeMap<String, String> {
        s.split(',').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    let (o, n) = (parse(old), parse(new));
    n.iter().filter(|(k, v)| o.get(*k).is_some_and(|ov| ov != *v)).map(|(k, _)| format!("spec.{k}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_hashes_ignore_min_count_and_parallelism() {
        let mut job: MusterJob = serde_json::from_value(json!({
            "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob",
            "metadata": {"name": "j"},
            "spec": {"parallelism": 2, "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
                     "scheduling": {"schedulingPolicy": {"gang": {"minCount": 2}}}},
        }))
        .expect("fixture");
        let before = frozen_hashes(&job).expect("hash");
        job.spec.parallelism = 4;
        if let Some(g) =
            job.spec.scheduling.as_mut().and_then(|s| s.scheduling_policy.as_mut()).and_then(|p| p.gang.as_mut())
        {
            g.min_count = Some(4);
        }
        assert!(changed_parts(&before, &frozen_hashes(&job).expect("hash")).is_empty());
        job.spec.scheduling = None;
        job.spec.completions = Some(9);
        assert_eq!(
            changed_parts(&before, &frozen_hashes(&job).expect("hash")),
            vec!["spec.completions", "spec.scheduling"]
        );
    }

    #[test]
    fn an_elastic_indexed_job_may_change_its_completions_with_parallelism() {
        let mut job: MusterJob = serde_json::from_value(json!({
            "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob",
            "metadata": {"name": "j"},
            "spec": {"parallelism": 4, "completions": 4, "completionMode": "Indexed",
                     "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
        }))
        .expect("fixture");
        let before = frozen_hashes(&job).expect("hash");
        // (parallelism, completions, mode) -> refused parts
        let table = [
            (2, Some(2), "Indexed", vec![]),
            (6, Some(6), "Indexed", vec![]),
            (4, Some(2), "Indexed", vec!["spec.completions"]),
            (2, Some(2), "NonIndexed", vec!["spec.completions"]),
        ];
        for (parallelism, completions, mode, want) in table {
            job.spec.parallelism = parallelism;
            job.spec.completions = completions;
            job.spec.completion_mode = serde_json::from_value(json!(mode)).expect("mode");
            let now = frozen_hashes(&job).expect("hash");
            assert_eq!(changed_frozen_parts(&job, &before, &now), want, "{parallelism} {completions:?} {mode}");
        }
    }
}
