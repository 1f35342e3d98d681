//! PURE: what each path creates: the one pod template every path shares and a gang's manifest
//! (a plain Job, a gang Job or a MusterJob).

use muster_api::GPU_RESOURCE;
use serde_json::{Value, json};

use super::BenchPath;

/// Label on every pod template the bench creates.
pub const BENCH_POD_LABEL: &str = "bench.muster.dev/pod";

/// The pod template of every path: one container, one GPU, restartPolicy Never.
pub fn pod_template() -> Value {
    let resources = json!({GPU_RESOURCE: "1", "cpu": "100m", "memory": "128Mi"});
    json!({
        "metadata": {"labels": {BENCH_POD_LABEL: "true"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "worker",
                // kwok runs no container: the image is never pulled.
                "image": "muster-bench",
                "resources": {"requests": resources, "limits": resources},
            }],
        },
    })
}

/// PURE: gang `name` of `path` with `size` pods, as the manifest to create.
pub fn gang_manifest(path: BenchPath, name: &str, size: u32) -> Value {
    let gang = json!({"schedulingPolicy": {"gang": {"minCount": size}}});
    let mut spec = json!({"parallelism": size, "completions": size, "template": pod_template()});
    match path {
        BenchPath::Plain => {}
        BenchPath::Gang | BenchPath::Muster | BenchPath::MusterUpstream => spec["scheduling"] = gang,
    }
    let (api_version, kind) = match path {
        BenchPath::Plain | BenchPath::Gang => ("batch/v1", "Job"),
        BenchPath::Muster | BenchPath::MusterUpstream => ("batch.muster.dev/v1alpha1", "MusterJob"),
    };
    let mut metadata = json!({"name": name});
    if path == BenchPath::MusterUpstream {
        metadata["annotations"] = json!({muster_api::SCHEDULING_API_ANNOTATION: "upstream"});
    }
    json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec})
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::Job;
    use muster_api::MusterJob;

    #[test]
    fn the_paths_share_one_pod_template() {
        let plain = gang_manifest(BenchPath::Plain, "plain-00000", 3);
        let gang = gang_manifest(BenchPath::Gang, "gang-00000", 3);
        let muster = gang_manifest(BenchPath::Muster, "muster-00000", 3);
        let upstream = gang_manifest(BenchPath::MusterUpstream, "muster-upstream-00000", 3);
        // The upstream-mode MusterJob is the muster one, recorded as upstream.
        let mut recorded = muster.clone();
        recorded["metadata"] = json!({"name": "muster-upstream-00000",
            "annotations": {muster_api::SCHEDULING_API_ANNOTATION: "upstream"}});
        assert_eq!(upstream, recorded);
        assert!(muster["metadata"].get("annotations").is_none(), "the muster path takes muster's default");
        assert_eq!(serde_json::to_value(BenchPath::MusterUpstream).expect("json"), "muster-upstream");
        for m in [&plain, &gang, &muster] {
            assert_eq!(m["spec"]["template"], pod_template());
            assert_eq!((m["spec"]["parallelism"].as_u64(), m["spec"]["completions"].as_u64()), (Some(3), Some(3)));
        }
        assert!(plain["spec"].get("scheduling").is_none());
        assert_eq!(gang["spec"]["scheduling"]["schedulingPolicy"]["gang"]["minCount"], 3);
        assert_eq!(muster["spec"]["scheduling"]["schedulingPolicy"]["gang"]["minCount"], 3);
        assert_eq!((gang["kind"].as_str(), muster["kind"].as_str()), (Some("Job"), Some("MusterJob")));
        let c = &pod_template()["spec"]["containers"][0]["resources"];
        assert_eq!(c["limits"], json!({"nvidia.com/gpu": "1", "cpu": "100m", "memory": "128Mi"}));
        assert_eq!(c["requests"], c["limits"]);
        // The typed Job and MusterJob keep what the manifest says.
        let job: Job = serde_json::from_value(gang).expect("job");
        assert!(job.spec.and_then(|s| s.scheduling).is_some());
        let mj: MusterJob = serde_json::from_value(muster).expect("musterjob");
        assert_eq!(mj.spec.parallelism, 3);
    }
}
