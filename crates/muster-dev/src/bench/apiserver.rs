//! The API server's work during a path, from its /metrics: the pure parsers of its request
//! counts, seconds and conflicts by kind, the deltas over a path, and the read that takes them.

use std::collections::BTreeMap;

use kube::Client;

/// PURE: the API server's requests by kind, from its `apiserver_request_total` series (summed
/// over codes and scopes): `"VERB resource[/subresource][ (dry run)]"` -> count.
pub fn request_counts(text: &str) -> BTreeMap<String, f64> {
    request_series(text, "apiserver_request_total", None)
}

/// PURE: the requests the API server answered `409 Conflict`, by kind as [`request_counts`]
/// keys them: writes fenced by a resourceVersion that had moved on (or creates of names taken),
/// each a round trip spent for nothing.
pub fn request_conflicts(text: &str) -> BTreeMap<String, f64> {
    request_series(text, "apiserver_request_total", Some("409"))
}

/// PURE: the seconds the API server spent on its requests, by kind as [`request_counts`] keys
/// them (`apiserver_request_duration_seconds_sum`, long-running watches not included).
pub fn request_seconds(text: &str) -> BTreeMap<String, f64> {
    request_series(text, "apiserver_request_duration_seconds_sum", None)
}

/// The series `name` summed by request kind; with `code`, only the series answered with it.
fn request_series(text: &str, name: &str, code: Option<&str>) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for sample in crate::exposition::samples(text).filter(|s| s.name == name) {
        let label = |name: &str| sample.label(name);
        if code.is_some_and(|c| label("code") != Some(c)) {
            continue;
        }
        let (verb, resource) = (label("verb").unwrap_or("?"), label("resource").unwrap_or("?"));
        let mut key = format!("{verb} {resource}");
        if let Some(sub) = label("subresource").filter(|s| !s.is_empty()) {
            key = format!("{key}/{sub}");
        }
        if label("dry_run").is_some_and(|d| !d.is_empty()) {
            key.push_str(" (dry run)");
        }
        *out.entry(key).or_insert(0.0) += sample.value;
    }
    out
}

/// PURE: what `after` counts more than `before`, largest first (reads and watches left out:
/// they are served from the watch cache).
pub fn request_delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> Vec<(String, f64)> {
    let reads = ["GET ", "LIST ", "WATCH "];
    let mut delta: Vec<(String, f64)> = after
        .iter()
        .filter(|(k, _)| !reads.iter().any(|r| k.starts_with(r)))
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect();
    delta.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    delta
}

/// PURE: the request kinds the API server spent most time on during a path, reads (GET, LIST)
/// included, watches not (they are long-running): `(kind, seconds, seconds per request)`,
/// largest first, from the [`request_seconds`] and [`request_counts`] before and after it.
pub fn request_time(
    seconds: (&BTreeMap<String, f64>, &BTreeMap<String, f64>),
    counts: (&BTreeMap<String, f64>, &BTreeMap<String, f64>),
) -> Vec<(String, f64, f64)> {
    let delta = |before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>| {
        let mut d: Vec<(String, f64)> = after
            .iter()
            .filter(|(k, _)| !k.starts_with("WATCH "))
            .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
            .filter(|(_, d)| *d > 0.0)
            .collect();
        d.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        d
    };
    let served = delta(counts.0, counts.1);
    delta(seconds.0, seconds.1)
        .into_iter()
        .filter_map(|(kind, secs)| {
            let n = served.iter().find(|(k, _)| *k == kind).map(|(_, n)| *n)?;
            Some((kind, secs, secs / n))
        })
        .collect()
}

/// Write kinds a cluster at rest goes on making (node and leader-election leases, node status):
/// left out when [`busy_writes`] judges whether a path's tail is over.
pub const AT_REST: [&str; 3] = ["PUT leases", "PATCH leases", "PATCH nodes/status"];

/// PURE: the writes in `delta` (a [`request_delta`]) other than those of a cluster at rest
/// ([`AT_REST`]): what a path's controllers, kube-scheduler, kwok's pod updates and muster
/// still write after the path's last bind.
pub fn busy_writes(delta: &[(String, f64)]) -> f64 {
    delta.iter().filter(|(k, _)| !AT_REST.contains(&k.as_str())).map(|(_, n)| n).sum()
}

/// The API server's request counts, seconds and conflicts by kind now, from its `/metrics`
/// (`None` when it cannot be read).
pub(super) async fn api_requests(client: &Client) -> Option<ApiRequests> {
    let request = axum::http::Request::get("/metrics").body(Vec::new()).ok()?;
    match client.request_text(request).await {
        Ok(text) => Some(ApiRequests {
            counts: request_counts(&text),
            seconds: request_seconds(&text),
            conflicts: request_conflicts(&text),
        }),
        Err(e) => {
            eprintln!("bench: WARNING: the API server's /metrics: {e}");
            None
        }
    }
}

/// What the API server's `/metrics` said of its requests at one moment.
pub(super) struct ApiRequests {
    pub(super) counts: BTreeMap<String, f64>,
    pub(super) seconds: BTreeMap<String, f64>,
    pub(super) conflicts: BTreeMap<String, f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_servers_time_is_told_per_write_kind_with_its_mean() {
        let text = |posts: u32, post_s: f64, patch_s: f64| {
            format!(
                "apiserver_request_total{{code=\"201\",dry_run=\"\",resource=\"musterjobs\",subresource=\"\",verb=\"POST\"}} {posts}\n\
                 apiserver_request_total{{code=\"200\",dry_run=\"\",resource=\"pods\",subresource=\"\",verb=\"PATCH\"}} 10\n\
                 apiserver_request_duration_seconds_sum{{component=\"apiserver\",dry_run=\"\",group=\"batch.muster.dev\",resource=\"musterjobs\",scope=\"resource\",subresource=\"\",verb=\"POST\",version=\"v1alpha1\"}} {post_s}\n\
                 apiserver_request_duration_seconds_count{{dry_run=\"\",resource=\"musterjobs\",subresource=\"\",verb=\"POST\"}} {posts}\n\
                 apiserver_request_duration_seconds_sum{{dry_run=\"\",resource=\"pods\",subresource=\"\",verb=\"PATCH\"}} {patch_s}\n\
                 apiserver_request_duration_seconds_sum{{dry_run=\"\",resource=\"nodes\",subresource=\"\",verb=\"WATCH\"}} 99\n"
            )
        };
        let (before, after) = (text(10, 1.0, 0.5), text(110, 51.0, 0.5));
        assert_eq!(request_seconds(&after).get("POST musterjobs"), Some(&51.0));
        let time = request_time(
            (&request_seconds(&before), &request_seconds(&after)),
            (&request_counts(&before), &request_counts(&after)),
        );
        assert_eq!(time, vec![("POST musterjobs".to_string(), 50.0, 0.5)], "no time spent: left out");
    }

    #[test]
    fn a_cluster_at_rest_writes_only_leases_and_node_status() {
        let delta = |rows: &[(&str, f64)]| rows.iter().map(|(k, n)| (k.to_string(), *n)).collect::<Vec<_>>();
        assert_eq!(
            busy_writes(&delta(&[("PUT leases", 900.0), ("PATCH nodes/status", 40.0), ("PATCH leases", 2.0)])),
            0.0
        );
        assert_eq!(
            busy_writes(&delta(&[("PUT leases", 900.0), ("APPLY musterjobs/status", 7.0), ("PATCH pods/status", 3.0)])),
            10.0
        );
        assert_eq!(busy_writes(&[]), 0.0);
    }

    #[test]
    fn api_writes_are_counted_by_kind_and_reads_left_out() {
        let before = request_counts(
            "# HELP apiserver_request_total x\n\
             apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"resource\",subresource=\"binding\",verb=\"POST\",version=\"v1\"} 10\n\
             apiserver_request_total{code=\"200\",dry_run=\"\",resource=\"pods\",subresource=\"\",verb=\"PATCH\"} 4\n\
             apiserver_request_total{code=\"200\",dry_run=\"\",resource=\"nodes\",subresource=\"\",verb=\"LIST\"} 7\n",
        );
        let after = request_counts(
            "apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"resource\",subresource=\"binding\",verb=\"POST\",version=\"v1\"} 16\n\
             apiserver_request_total{code=\"200\",dry_run=\"\",resource=\"pods\",subresource=\"\",verb=\"PATCH\"} 5\n\
             apiserver_request_total{code=\"409\",dry_run=\"\",resource=\"pods\",subresource=\"\",verb=\"PATCH\"} 2\n\
             apiserver_request_total{code=\"200\",dry_run=\"All\",resource=\"pods\",subresource=\"\",verb=\"PATCH\"} 3\n\
             apiserver_request_total{code=\"200\",dry_run=\"\",resource=\"nodes\",subresource=\"\",verb=\"LIST\"} 9\n",
        );
        assert_eq!(after.get("PATCH pods"), Some(&7.0), "codes are summed: {after:?}");
        assert_eq!(
            request_delta(&before, &after),
            vec![
                ("POST pods/binding".to_string(), 6.0),
                ("PATCH pods".to_string(), 3.0),
                ("PATCH pods (dry run)".to_string(), 3.0)
            ]
        );
        let conflicts = request_conflicts(
            "apiserver_request_total{code=\"409\",dry_run=\"\",resource=\"podgroups\",subresource=\"status\",verb=\"PATCH\"} 4\n\
             apiserver_request_total{code=\"200\",dry_run=\"\",resource=\"podgroups\",subresource=\"status\",verb=\"PATCH\"} 9\n\
             apiserver_request_total{code=\"409\",dry_run=\"\",resource=\"pods\",subresource=\"\",verb=\"PATCH\"} 2\n",
        );
        let want: BTreeMap<String, f64> =
            [("PATCH podgroups/status".to_string(), 4.0), ("PATCH pods".to_string(), 2.0)].into();
        assert_eq!(conflicts, want, "only the 409 answers");
    }
}
