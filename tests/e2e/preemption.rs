//! Gang preemption and the reservation that keeps a waiting gang from starving, against the
//! real control plane: a priority-1000 gang preempts two lower-priority gangs wholly (their
//! disruption mode is `all`) and is admitted; one whose `preemptionPolicy` is `Never` never
//! preempts, reserves the node instead, and is admitted once the lower-priority pods already
//! running finish, while newer lower-priority jobs wait behind it; the room a preemption frees
//! is nominated to the preemptor, so kube-scheduler places nothing of lower priority there.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use muster::crds::PodGroup;
use serde_json::{Value, json};

use crate::gangs::{LONG, TestNodes, all_bound, apply, events_until, gpu_job, job_pods, node_of};
use crate::harness::manager::muster;
use crate::harness::{client, cluster, namespace, wait_for};

/// Creates PriorityClass `name` unless it exists (tests may race to make it).
pub(crate) fn priority_class(name: &str, value: i32, never: bool) {
    let mut args = vec!["create".to_string(), "priorityclass".into(), name.into(), format!("--value={value}")];
    if never {
        args.push("--preemption-policy=Never".into());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match cluster().kubectl(&args) {
        Ok(_) => {}
        Err(e) if e.contains("AlreadyExists") || e.contains("already exists") => {}
        Err(e) => panic!("{e}"),
    }
}

/// `job` with its pods in PriorityClass `class`.
pub(crate) fn with_class(mut job: Value, class: &str) -> Value {
    job["spec"]["template"]["spec"]["priorityClassName"] = json!(class);
    job
}

/// A finalizer that holds a victim pod after its eviction (removed by the test).
pub(crate) const HOLD: &str = "e2e.muster.dev/hold";

fn gang_all(min_count: u32) -> Value {
    json!({"schedulingPolicy": {"gang": {"minCount": min_count}}, "disruptionMode": {"all": {}}})
}

async fn group_message(groups: &Api<PodGroup>, name: &str) -> String {
    groups.get(name).await.ok().and_then(|g| g.status).and_then(|s| s.message).unwrap_or_default()
}

#[tokio::test]
async fn a_high_priority_gang_preempts_lower_gangs_wholly_and_a_never_one_waits() {
    let muster = muster().await;
    let ns = namespace("preempt");
    priority_class("e2e-preempt-high", 1000, false);
    priority_class("e2e-preempt-never", 1000, true);
    // One node of 8 GPUs, held by two gangs of 2 x 2 GPUs at priority 0, disruption mode all.
    let nodes = TestNodes::add(&ns.name, 1, 8, 1).await;
    let c = client().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns.name);
    let groups: Api<PodGroup> = Api::namespaced(c.clone(), &ns.name);
    // low-a's pods carry a finalizer, so an evicted one stays (terminating) long enough to read
    // the condition muster puts on it; the test removes it after.
    for low in ["low-a", "low-b"] {
        let mut job = gpu_job(low, 2, 2, &nodes, gang_all(2), json!({}));
        if low == "low-a" {
            job["spec"]["template"]["metadata"]["finalizers"] = json!([HOLD]);
        }
        apply(&ns.name, &job);
    }
    let before: Vec<String> = [all_bound(&pods, "low-a", 2).await, all_bound(&pods, "low-b", 2).await]
        .concat()
        .iter()
        .map(|p| p.metadata.uid.clone().unwrap_or_default())
        .collect();

    // preemptionPolicy Never (from its PriorityClass): it waits, says why, reserves the node.
    apply(&ns.name, &with_class(gpu_job("never", 1, 8, &nodes, gang_all(1), json!({})), "e2e-preempt-never"));
    let message = wait_for("the Never gang's reason", LONG, || async {
        let m = group_message(&groups, "never").await;
        m.contains("preemptionPolicy is Never").then_some(m)
    })
    .await;
    assert!(message.contains("reserved for it"), "{message}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still: Vec<Pod> = [job_pods(&pods, "low-a").await, job_pods(&pods, "low-b").await].concat();
    assert_eq!(still.len(), 4, "a Never gang preempts nothing");
    assert!(still.iter().all(|p| before.contains(p.metadata.uid.as_ref().expect("uid"))), "the same pods run");
    let jobs: Api<muster::crds::MusterJob> = Api::namespaced(c.clone(), &ns.name);
    jobs.delete("never", &DeleteParams::foreground()).await.expect("delete never");
    wait_for("the Never gang gone", LONG, || async { groups.get_opt("never").await.ok()?.is_none().then_some(()) })
        .await;

    // Priority 1000 that may preempt: both lower gangs go whole, and it is admitted.
    apply(&ns.name, &with_class(gpu_job("high", 1, 8, &nodes, gang_all(1), json!({})), "e2e-preempt-high"));
    // Each evicted pod of low-a says muster preempted it, and for whom.
    // (Held by their finalizer, they still count on the node: the high gang waits for them.)
    let held: Vec<Pod> = wait_for("low-a's two pods evicted, held by their finalizer", LONG, || async {
        let all = pods.list(&kube::api::ListParams::default()).await.ok()?.items;
        let held: Vec<Pod> = all
            .into_iter()
            .filter(|p| before.contains(p.metadata.uid.as_ref().expect("uid")) && p.metadata.finalizers.is_some())
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .collect();
        (held.len() == 2).then_some(held)
    })
    .await;
    for pod in &held {
        let name = pod.metadata.name.clone().expect("name");
        assert!(pod.metadata.deletion_timestamp.is_some(), "{name} is terminating");
        let condition = wait_for(&format!("DisruptionTarget on {name}"), LONG, || async {
            let p = pods.get(&name).await.ok()?;
            let c = p.status?.conditions?.into_iter().find(|c| c.type_ == "DisruptionTarget")?;
            (c.reason.as_deref() == Some("PreemptionByMuster")).then_some(c)
        })
        .await;
        assert_eq!(condition.status, "True");
        assert!(
            condition.message.as_deref().is_some_and(|m| m.contains("high") && m.contains("1000")),
            "{condition:?}"
        );
        let patch = json!({"metadata": {"finalizers": null}});
        pods.patch(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await.expect("unhold");
    }
    let bound = all_bound(&pods, "high", 1).await;
    assert_eq!(node_of(&bound[0]), Some(nodes.names[0].as_str()));
    for low in ["low-a", "low-b"] {
        let preempted = |e: &[(String, String, String)]| {
            e.iter().any(|(t, r, m)| t == "Warning" && r == "Preempted" && m.contains("high"))
        };
        let events = events_until(&ns.name, low, preempted).await;
        assert!(preempted(&events), "{low}: {events:?}");
        // Its pods were all evicted (none of the old ones is left bound); the job makes new
        // ones, which wait: the node is the high gang's.
        let now = job_pods(&pods, low).await;
        assert!(
            now.iter().all(|p| !before.contains(p.metadata.uid.as_ref().expect("uid")) && node_of(p).is_none()),
            "{low}: {:?}",
            now.iter().map(|p| (&p.metadata.name, node_of(p))).collect::<Vec<_>>()
        );
    }
    // The Preempting event counts the pods muster evicted: the first eviction of a low gang
    // disrupts it, and its job controller may delete that gang's other pods (a gang restart)
    // before muster reaches them, so it names 1 to 4 of the 4 victims, which are all gone
    // (above) either way.
    let evicted = |m: &str| {
        m.strip_prefix("preempting ").and_then(|m| m.split_once(" pod(s)")).and_then(|(n, _)| n.parse::<u32>().ok())
    };
    let events = events_until(&ns.name, "high", |e| e.iter().any(|(_, r, _)| r == "Preempting")).await;
    let counts: Vec<u32> =
        events.iter().filter(|(_, r, _)| r == "Preempting").filter_map(|(_, _, m)| evicted(m)).collect();
    assert!(counts.iter().any(|n| (1..=4).contains(n)), "{events:?}");
    let metrics = muster.metrics().await;
    assert!(crate::harness::metric(&metrics, "muster_preemptions_total", &[]) >= 1.0);
    assert!(crate::harness::metric(&metrics, "muster_preemption_victims_total", &[]) >= 1.0);
    // low-a's new pods carry the finalizer too: let the namespace go.
    jobs.delete("low-a", &DeleteParams::background()).await.expect("delete low-a");
    let lp = kube::api::ListParams::default().labels(&format!("{}=low-a", muster::crds::JOB_NAME_LABEL));
    for pod in pods.list(&lp).await.expect("list").items {
        let patch = json!({"metadata": {"finalizers": null}});
        let name = pod.metadata.name.expect("name");
        let _ = pods.patch(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await;
    }
}

#[tokio::test]
async fn a_waiting_gang_that_may_not_preempt_is_admitted_before_newer_small_jobs() {
    let _muster = muster().await;
    let ns = namespace("starve");
    priority_class("e2e-preempt-never", 1000, true);
    let nodes = TestNodes::add(&ns.name, 1, 8, 1).await;
    let c = client().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns.name);
    // 1-GPU jobs that run until the test ends them (the annotation set to a value that is no
    // duration ends a pod at once), so the stream below runs whatever the machine's pace.
    let small = |name: &str| gpu_job(name, 1, 1, &nodes, json!({}), json!({"sim.muster.dev/succeed-after": "1h"}));
    let end = |pods: &Api<Pod>, job: String| {
        let pods = pods.clone();
        async move {
            for pod in job_pods(&pods, &job).await {
                let patch = json!({"metadata": {"annotations": {"sim.muster.dev/succeed-after": "now"}}});
                let name = pod.metadata.name.expect("name");
                pods.patch(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
                    .await
                    .expect("end a small job's pod");
            }
        }
    };
    // The node full of 1-GPU jobs.
    for i in 0..8 {
        apply(&ns.name, &small(&format!("small-{i}")));
    }
    for i in 0..8 {
        all_bound(&pods, &format!("small-{i}"), 1).await;
    }
    // The 8-GPU gang at priority 1000 that may not preempt.
    apply(&ns.name, &with_class(gpu_job("big", 1, 8, &nodes, gang_all(1), json!({})), "e2e-preempt-never"));
    let groups: Api<PodGroup> = Api::namespaced(c.clone(), &ns.name);
    let message = wait_for("the big gang waiting with the node reserved", LONG, || async {
        let m = group_message(&groups, "big").await;
        m.contains("reserved for it").then_some(m)
    })
    .await;
    assert!(message.contains("preemptionPolicy is Never"), "{message}");
    // A stream of newer 1-GPU jobs, one every 700 ms; from the fourth on, one running job ends
    // with each newer one, so each freed GPU meets a newer job waiting for it.
    let mut newer = Vec::new();
    let mut ended = 0;
    let mut freed_at = None;
    let big = loop {
        if let Some(p) = job_pods(&pods, "big").await.into_iter().find(|p| node_of(p).is_some()) {
            break p;
        }
        if let Some(at) = freed_at {
            assert!(
                Instant::now().duration_since(at) < LONG,
                "the big gang was not admitted {LONG:?} after the node freed"
            );
        }
        if newer.len() < 16 {
            let name = format!("newer-{}", newer.len());
            apply(&ns.name, &small(&name));
            newer.push(name);
        }
        if newer.len() > 3 && ended < 8 {
            end(&pods, format!("small-{ended}")).await;
            ended += 1;
            if ended == 8 {
                freed_at = Some(Instant::now());
            }
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
    };
    let waited = freed_at.map(|at| at.elapsed());
    eprintln!(
        "the big gang was admitted {waited:?} after the last running job ended; {} newer 1-GPU jobs were created meanwhile",
        newer.len()
    );
    assert_eq!(ended, 8, "the big gang was admitted before the node was free");
    assert_eq!(node_of(&big), Some(nodes.names[0].as_str()));
    // None of the newer jobs took a GPU before it: backfill never delayed it.
    for name in &newer {
        let live = job_pods(&pods, name).await;
        assert!(live.iter().all(|p| node_of(p).is_none()), "{name} started on the reserved node");
    }
}

#[tokio::test]
async fn a_victim_a_disruption_budget_protects_is_passed_over_for_another_or_the_gang_waits_and_says_why() {
    let _muster = muster().await;
    let ns = namespace("preempt-pdb");
    priority_class("e2e-preempt-high", 1000, false);
    let nodes = TestNodes::add(&ns.name, 1, 8, 1).await;
    let c = client().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns.name);
    let groups: Api<PodGroup> = Api::namespaced(c.clone(), &ns.name);
    for low in ["low-a", "low-b"] {
        apply(&ns.name, &gpu_job(low, 2, 2, &nodes, gang_all(2), json!({})));
    }
    let protected: Vec<String> =
        all_bound(&pods, "low-a", 2).await.iter().filter_map(|p| p.metadata.uid.clone()).collect();
    all_bound(&pods, "low-b", 2).await;
    // low-a may lose none of its pods.
    apply(
        &ns.name,
        &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep-low-a"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {muster::crds::JOB_NAME_LABEL: "low-a"}}}}),
    );
    // 4 GPUs at priority 1000: low-a or low-b would do; the budget leaves low-b.
    apply(&ns.name, &with_class(gpu_job("half", 1, 4, &nodes, gang_all(1), json!({})), "e2e-preempt-high"));
    all_bound(&pods, "half", 1).await;
    let kept = job_pods(&pods, "low-a").await;
    assert_eq!(
        kept.iter().filter(|p| protected.contains(p.metadata.uid.as_ref().expect("uid"))).count(),
        2,
        "low-a kept"
    );
    let preempted = |e: &[(String, String, String)]| e.iter().any(|(_, r, m)| r == "Preempted" && m.contains("half"));
    assert!(preempted(&events_until(&ns.name, "low-b", preempted).await));
    // 4 GPUs more: only with low-a gone (half holds the rest, at the same priority), which its
    // budget refuses: it waits and says why.
    apply(&ns.name, &with_class(gpu_job("rest", 1, 4, &nodes, gang_all(1), json!({})), "e2e-preempt-high"));
    let started = Instant::now();
    let message = loop {
        let m = group_message(&groups, "rest").await;
        if m.contains("PodDisruptionBudget") {
            break m;
        }
        assert!(started.elapsed() < LONG, "no budget named in the waiting gang's reason after {LONG:?}: {m:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(message.contains("low-a"), "{message}");
    let kept = job_pods(&pods, "low-a").await;
    assert_eq!(
        kept.iter().filter(|p| protected.contains(p.metadata.uid.as_ref().expect("uid"))).count(),
        2,
        "low-a kept"
    );
}

#[tokio::test]
async fn a_pod_muster_does_not_manage_is_preempted_by_the_same_rules() {
    let _muster = muster().await;
    let ns = namespace("preempt-plain");
    priority_class("e2e-preempt-high", 1000, false);
    let nodes = TestNodes::add(&ns.name, 1, 8, 1).await;
    let c = client().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns.name);
    // A plain pod (no PodGroup: kube-scheduler places it) holding every GPU, priority 0.
    let mut spec = json!({"containers": [{"name": "main", "image": "registry.invalid/none",
        "resources": {"limits": {"nvidia.com/gpu": "8"}}}]});
    crate::gangs::merge(&mut spec, nodes.placement());
    apply(&ns.name, &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"}, "spec": spec}));
    let plain = wait_for("the plain pod bound", LONG, || async {
        pods.get("plain").await.ok().filter(|p| node_of(p).is_some())
    })
    .await;
    let plain_uid = plain.metadata.uid.clone().expect("uid");
    apply(&ns.name, &with_class(gpu_job("high", 1, 8, &nodes, gang_all(1), json!({})), "e2e-preempt-high"));
    all_bound(&pods, "high", 1).await;
    let gone = pods.get_opt("plain").await.expect("get");
    assert!(gone.is_none_or(|p| p.metadata.uid.as_deref() != Some(&plain_uid)), "the plain pod was preempted");
    let preempting =
        |e: &[(String, String, String)]| e.iter().any(|(_, r, m)| r == "Preempting" && m.contains("plain"));
    let events = events_until(&ns.name, "high", preempting).await;
    assert!(preempting(&events), "{events:?}");
}

#[tokio::test]
async fn the_room_a_preemption_frees_is_held_against_pods_kube_scheduler_places() {
    let _muster = muster().await;
    let ns = namespace("preempt-nominate");
    priority_class("e2e-preempt-high", 1000, false);
    let nodes = TestNodes::add(&ns.name, 1, 8, 1).await;
    let node = nodes.names[0].clone();
    let c = client().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns.name);
    // The node full with one 8-GPU pod at priority 0; held by a finalizer once evicted, so the
    // room it frees comes free only when the test says.
    apply(&ns.name, &gpu_job("low", 1, 8, &nodes, gang_all(1), json!({})));
    let low = all_bound(&pods, "low", 1).await.remove(0);
    let low_name = low.metadata.name.clone().expect("name");
    let hold = json!({"metadata": {"finalizers": [HOLD]}});
    pods.patch(&low_name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&hold)).await.expect("hold");
    // The priority-1000 gang preempts it, and its waiting pod is nominated to the node.
    apply(&ns.name, &with_class(gpu_job("high", 1, 8, &nodes, gang_all(1), json!({})), "e2e-preempt-high"));
    let nominated = wait_for("the high gang's pod nominated to the node", LONG, || async {
        let p = job_pods(&pods, "high").await.into_iter().next()?;
        (p.status.as_ref()?.nominated_node_name.as_deref() == Some(node.as_str())).then_some(p)
    })
    .await;
    assert!(node_of(&nominated).is_none());
    let terminating = pods.get(&low_name).await.expect("low");
    assert!(terminating.metadata.deletion_timestamp.is_some(), "the victim is terminating");
    // A plain 1-GPU pod at priority 0, which kube-scheduler places by itself: nothing fits
    // while the victim terminates.
    let mut spec = json!({"containers": [{"name": "main", "image": "registry.invalid/none",
        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]});
    crate::gangs::merge(&mut spec, nodes.placement());
    apply(&ns.name, &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sneak"}, "spec": spec}));
    let sneak = wait_for("kube-scheduler finding no room for the plain pod", LONG, || async {
        let p = pods.get("sneak").await.ok()?;
        let scheduled = p.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "PodScheduled")?;
        (scheduled.status == "False").then_some(p)
    })
    .await;
    let sneak_uid = sneak.metadata.uid.clone().expect("uid");
    // The victim goes: kube-scheduler retries the plain pod at once, and counts the nominated
    // pod on the node, so the room is the high gang's.
    let unhold = json!({"metadata": {"finalizers": null}});
    pods.patch(&low_name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&unhold)).await.expect("unhold");
    let high = all_bound(&pods, "high", 1).await;
    assert_eq!(node_of(&high[0]), Some(node.as_str()));
    let sneak = pods.get("sneak").await.expect("the plain pod is still there");
    assert_eq!(
        sneak.metadata.uid.as_deref(),
        Some(sneak_uid.as_str()),
        "the plain pod was not preempted and made again"
    );
    assert!(node_of(&sneak).is_none(), "the plain pod took the room the preemption freed");
    // One preemption: the plain pod never had to be preempted in turn.
    // Events are sent after the step they report: wait for the first.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(c.clone(), &ns.name);
    let list = || async {
        let items = events.list(&kube::api::ListParams::default()).await.expect("events").items;
        let preemptions: Vec<_> = items
            .into_iter()
            .filter(|e| {
                e.involved_object.kind.as_deref() == Some("PodGroup") && e.reason.as_deref() == Some("Preempting")
            })
            .map(|e| (e.involved_object.name, e.message, e.count))
            .collect();
        Some(preemptions).filter(|p| !p.is_empty())
    };
    let preemptions = crate::harness::wait_for_opt(Duration::from_secs(30), list).await.unwrap_or_default();
    assert_eq!(preemptions.len(), 1, "{preemptions:?}");
    assert_eq!(preemptions[0].2.unwrap_or(1), 1, "{preemptions:?}");
}
