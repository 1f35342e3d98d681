//! PURE: the arithmetic of one path's pod times: nearest-rank percentiles, per-gang admission
//! latency, bind throughput and the ratio to the plain path.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What the pod watch saw of one pod, in seconds since its path started.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PodTimes {
    /// The gang (the name of the pod's controlling Job or MusterJob).
    pub gang: String,
    /// First seen by the watch.
    pub first_seen: f64,
    /// First seen without muster's admission gate (at first sight for pods never gated).
    pub ungated: Option<f64>,
    /// First seen with `spec.nodeName` set.
    pub bound: Option<f64>,
    /// First seen with GPU indices (`gpu.muster.dev/indices`).
    #[serde(default)]
    pub indexed: Option<f64>,
}

/// PURE: the nearest-rank `p`-th percentile (0 < p <= 100) of `values`, in any order: the
/// smallest value that at least p% of the values do not exceed. None when there are none.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// PURE: per gang that has `size` pods and all of them ungated, the admission latency: from
/// the time its last pod was first seen (the gang became complete) to the time its last pod
/// was seen ungated. Gangs still incomplete or gated are left out. In gang-name order.
pub fn gang_admission_latencies(pods: &[PodTimes], size: usize) -> Vec<f64> {
    let mut gangs: BTreeMap<&str, Vec<&PodTimes>> = BTreeMap::new();
    for p in pods {
        gangs.entry(p.gang.as_str()).or_default().push(p);
    }
    gangs
        .values()
        .filter(|members| members.len() >= size && members.iter().all(|p| p.ungated.is_some()))
        .map(|members| {
            let complete = members.iter().map(|p| p.first_seen).fold(f64::NEG_INFINITY, f64::max);
            let admitted = members.iter().filter_map(|p| p.ungated).fold(f64::NEG_INFINITY, f64::max);
            admitted - complete
        })
        .collect()
}

/// One request of the ordinary user: when it was sent (seconds since the path started), its
/// latency from request to response and whether it succeeded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UserSample {
    pub at_s: f64,
    pub seconds: f64,
    pub ok: bool,
}

/// The ordinary user's request latency during a path (every request, failed ones included:
/// a request refused with 429 after a wait is a slow request).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UserLatency {
    /// Requests made.
    pub count: usize,
    /// Requests that failed (or timed out).
    pub errors: usize,
    /// Median, 99th percentile and largest latency, seconds.
    pub p50_s: Option<f64>,
    pub p99_s: Option<f64>,
    pub max_s: Option<f64>,
    /// p99_s / the plain path's p99_s.
    pub p99_vs_plain: Option<f64>,
    /// The requests sent while the path's jobs were still being created (before its last
    /// successful create returned), and their p99: where the tail comes from, the creates'
    /// burst or the work after. With a request a second, each part's p99 is its slowest
    /// request (nearest rank over fewer than 100).
    pub creating_count: usize,
    pub creating_p99_s: Option<f64>,
    /// The requests sent from the last create on, and their p99.
    pub after_count: usize,
    pub after_p99_s: Option<f64>,
}

/// PURE: the latency numbers of `samples`, of a path whose last create was at `last_create`
/// (seconds since the path started; `None`: no create, every request counts as after).
pub fn user_latency(samples: &[UserSample], last_create: Option<f64>) -> UserLatency {
    let seconds: Vec<f64> = samples.iter().map(|s| s.seconds).collect();
    let creating = |s: &&UserSample| last_create.is_some_and(|c| s.at_s < c);
    let (during, after): (Vec<&UserSample>, Vec<&UserSample>) = samples.iter().partition(creating);
    let p99 = |part: &[&UserSample]| percentile(&part.iter().map(|s| s.seconds).collect::<Vec<_>>(), 99.0);
    UserLatency {
        count: samples.len(),
        errors: samples.iter().filter(|s| !s.ok).count(),
        p50_s: percentile(&seconds, 50.0),
        p99_s: percentile(&seconds, 99.0),
        max_s: seconds.iter().copied().reduce(f64::max),
        p99_vs_plain: None,
        creating_count: during.len(),
        creating_p99_s: p99(&during),
        after_count: after.len(),
        after_p99_s: p99(&after),
    }
}

/// When a path's bound pods got their GPU indices (`gpu.muster.dev/indices`), against their
/// bind: muster writes them in the patch that ungates the pods it admits, and after the bind
/// for pods kube-scheduler placed on its own (plain Jobs, the gang path, upstream mode).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IndexTimes {
    /// Bound pods seen with their indices before their bind, or in the same event.
    pub before_bind: usize,
    /// Bound pods whose indices were first seen after their bind.
    pub after_bind: usize,
    /// Bound pods not seen with indices by the path's end.
    pub never: usize,
    /// Of the pods indexed after their bind, the time from bind to indices: median, 99th
    /// percentile and the most, seconds.
    pub after_p50_s: Option<f64>,
    pub after_p99_s: Option<f64>,
    pub after_max_s: Option<f64>,
}

/// PURE: when the bound `pods` got their GPU indices, against their bind (pods not bound are
/// left out).
pub fn index_times(pods: &[PodTimes]) -> IndexTimes {
    let mut out = IndexTimes::default();
    let mut waits = Vec::new();
    for (bound, indexed) in pods.iter().filter_map(|p| p.bound.map(|b| (b, p.indexed))) {
        match indexed {
            None => out.never += 1,
            Some(i) if i <= bound => out.before_bind += 1,
            Some(i) => waits.push(i - bound),
        }
    }
    out.after_bind = waits.len();
    out.after_p50_s = percentile(&waits, 50.0);
    out.after_p99_s = percentile(&waits, 99.0);
    out.after_max_s = waits.iter().copied().reduce(f64::max);
    out
}

/// How fast a path's pods were bound.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// Pods seen bound.
    pub pods_bound: usize,
    /// The first bind, in seconds since the path started.
    pub first_bind_s: Option<f64>,
    /// The last bind, in seconds since the path started.
    pub last_bind_s: Option<f64>,
    /// Pods bound / (last bind - first create).
    pub bound_per_s: Option<f64>,
    /// Seconds from the last create to the last bind.
    pub last_create_to_last_bind_s: Option<f64>,
}

/// PURE: the throughput of `pods`, whose path made its first create at `first_create` and its
/// last at `last_create` (seconds since the path started).
pub fn throughput(pods: &[PodTimes], first_create: f64, last_create: Option<f64>) -> Throughput {
    let binds: Vec<f64> = pods.iter().filter_map(|p| p.bound).collect();
    let first_bind_s = binds.iter().copied().reduce(f64::min);
    let last_bind_s = binds.iter().copied().reduce(f64::max);
    let bound_per_s =
        last_bind_s.map(|last| last - first_create).filter(|span| *span > 0.0).map(|span| binds.len() as f64 / span);
    let last_create_to_last_bind_s = last_bind_s.zip(last_create).map(|(bind, create)| bind - create);
    Throughput { pods_bound: binds.len(), first_bind_s, last_bind_s, bound_per_s, last_create_to_last_bind_s }
}

/// PURE: `rate` as a multiple of the plain path's rate.
pub fn ratio(rate: Option<f64>, plain: Option<f64>) -> Option<f64> {
    rate.zip(plain.filter(|p| *p > 0.0)).map(|(r, p)| r / p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(gang: &str, first_seen: f64, ungated: Option<f64>, bound: Option<f64>) -> PodTimes {
        PodTimes { gang: gang.into(), first_seen, ungated, bound, indexed: None }
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let ten: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        let cases: Vec<(&str, Vec<f64>, f64, Option<f64>)> = vec![
            ("none gives none", vec![], 50.0, None),
            ("one value is every percentile", vec![7.0], 99.0, Some(7.0)),
            ("median of two is the lower", vec![2.0, 1.0], 50.0, Some(1.0)),
            ("median of three is the middle", vec![3.0, 1.0, 2.0], 50.0, Some(2.0)),
            ("p50 of 10..1 is 5 (rank 5)", ten.clone(), 50.0, Some(5.0)),
            ("p99 of 10..1 is the max (rank ceil(9.9) = 10)", ten.clone(), 99.0, Some(10.0)),
            ("p90 of 10..1 is 9", ten, 90.0, Some(9.0)),
            ("p99 of 1..100 is 99", hundred.clone(), 99.0, Some(99.0)),
            ("p100 is the max", hundred.clone(), 100.0, Some(100.0)),
            ("a tiny p is the min", hundred, 0.1, Some(1.0)),
        ];
        for (name, values, p, want) in cases {
            assert_eq!(percentile(&values, p), want, "{name}");
        }
    }

    #[test]
    fn admission_latency_runs_from_the_last_pod_seen_to_the_last_pod_ungated() {
        let cases: Vec<(&str, Vec<PodTimes>, usize, Vec<f64>)> = vec![
            (
                "one gang: last seen 1.5, last ungated 2.25",
                vec![pod("a", 1.0, Some(2.0), None), pod("a", 1.5, Some(2.25), None), pod("a", 0.5, Some(2.0), None)],
                3,
                vec![0.75],
            ),
            (
                "gangs in name order, each its own latency",
                vec![
                    pod("b", 3.0, Some(4.0), None),
                    pod("b", 3.5, Some(3.75), None),
                    pod("a", 0.0, Some(0.5), None),
                    pod("a", 0.25, Some(1.0), None),
                ],
                2,
                vec![0.75, 0.5],
            ),
            (
                "a gang with a pod still gated is left out",
                vec![pod("a", 1.0, Some(2.0), None), pod("a", 1.0, None, None)],
                2,
                vec![],
            ),
            ("a gang with too few pods is left out", vec![pod("a", 1.0, Some(2.0), None)], 2, vec![]),
            (
                "pods never gated: ungated at first sight",
                vec![pod("a", 1.0, Some(1.0), None), pod("a", 2.0, Some(2.0), None)],
                2,
                vec![0.0],
            ),
        ];
        for (name, pods, size, want) in cases {
            assert_eq!(gang_admission_latencies(&pods, size), want, "{name}");
        }
    }

    #[test]
    fn throughput_counts_binds_over_first_create_to_last_bind() {
        let pods = [
            pod("a", 0.5, Some(0.5), Some(1.0)),
            pod("a", 0.5, Some(0.5), Some(4.0)),
            pod("b", 1.0, Some(1.0), Some(2.0)),
            pod("b", 1.0, Some(1.0), None),
        ];
        let t = throughput(&pods, 0.0, Some(1.5));
        assert_eq!(t.pods_bound, 3);
        assert_eq!(t.first_bind_s, Some(1.0));
        assert_eq!(t.last_bind_s, Some(4.0));
        assert_eq!(t.bound_per_s, Some(0.75));
        assert_eq!(t.last_create_to_last_bind_s, Some(2.5));

        let none = throughput(&[pod("a", 0.5, None, None)], 0.0, Some(1.0));
        assert_eq!((none.pods_bound, none.bound_per_s, none.last_create_to_last_bind_s), (0, None, None));
        assert_eq!(ratio(Some(30.0), Some(20.0)), Some(1.5));
        assert_eq!(ratio(Some(30.0), None), None);
        assert_eq!(ratio(Some(30.0), Some(0.0)), None);
    }

    #[test]
    fn gpu_indices_are_told_before_or_after_the_bind() {
        let indexed =
            |bound: Option<f64>, indexed: Option<f64>| PodTimes { indexed, ..pod("a", 0.0, Some(0.0), bound) };
        let pods = [
            // Pinned by muster: the indices came with the ungate, before the bind.
            indexed(Some(2.0), Some(1.5)),
            // In the same event as the bind.
            indexed(Some(2.0), Some(2.0)),
            // Bound by kube-scheduler, indices written after.
            indexed(Some(1.0), Some(1.25)),
            indexed(Some(1.0), Some(1.5)),
            indexed(Some(3.0), Some(4.0)),
            // Bound, no indices seen.
            indexed(Some(3.0), None),
            // Not bound: left out, indices or not.
            indexed(None, Some(1.0)),
            indexed(None, None),
        ];
        let t = index_times(&pods);
        assert_eq!((t.before_bind, t.after_bind, t.never), (2, 3, 1));
        assert_eq!((t.after_p50_s, t.after_p99_s, t.after_max_s), (Some(0.5), Some(1.0), Some(1.0)));

        let none = index_times(&[indexed(Some(1.0), Some(0.5))]);
        assert_eq!((none.before_bind, none.after_bind, none.after_p50_s, none.after_max_s), (1, 0, None, None));
    }

    #[test]
    fn user_latency_counts_every_request_and_its_tail() {
        // One request a second; the first 20 (sent before the last create at 19.5 s) slow.
        let mut samples: Vec<UserSample> = (1..=100)
            .map(|i| UserSample {
                at_s: f64::from(i - 1),
                seconds: f64::from(i) / 1000.0 + if i <= 20 { 1.0 } else { 0.0 },
                ok: true,
            })
            .collect();
        samples[99].ok = false;
        let l = user_latency(&samples, Some(19.5));
        assert_eq!((l.count, l.errors), (100, 1));
        let slow = |i: i32| f64::from(i) / 1000.0 + 1.0;
        assert_eq!((l.p50_s, l.p99_s, l.max_s), (Some(70.0 / 1000.0), Some(slow(19)), Some(slow(20))));
        assert_eq!(l.p99_vs_plain, None);
        assert_eq!((l.creating_count, l.creating_p99_s), (20, Some(slow(20))));
        assert_eq!((l.after_count, l.after_p99_s), (80, Some(100.0 / 1000.0)));
        // A request sent at the last create counts as after it.
        let at_boundary = user_latency(&samples, Some(19.0));
        assert_eq!((at_boundary.creating_count, at_boundary.after_count), (19, 81));
        // No create: every request counts as after.
        let all_after = user_latency(&samples, None);
        assert_eq!((all_after.creating_count, all_after.creating_p99_s, all_after.after_count), (0, None, 100));
        let none = user_latency(&[], Some(1.0));
        assert_eq!((none.count, none.p50_s, none.p99_s, none.max_s), (0, None, None, None));
        assert_eq!(ratio(Some(0.2), Some(0.1)), Some(2.0));
    }
}
