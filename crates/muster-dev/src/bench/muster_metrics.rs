//! muster's own figures from its /metrics: admission cycles, webhook reviews and heap, read by
//! the pure [`MusterMetrics::read`] from the text [`fetch_metrics`] gets.

/// The admission controller's series of `muster_reconciles_total`: one per admission cycle.
const CYCLES_METRIC: &str = "muster_reconciles_total";
const CYCLES_LABEL: &str = "controller=\"admission\"";
/// The job controller's series: one per MusterJob reconcile.
const JOB_RECONCILES_LABEL: &str = "controller=\"job\"";
const HEAP_METRIC: &str = "muster_heap_bytes";

/// PURE: the value of the series `name{...}` whose labels include `label` in a Prometheus or
/// OpenMetrics text exposition.
pub fn counter_value(text: &str, name: &str, label: &str) -> Option<f64> {
    crate::exposition::samples(text).find(|s| s.name == name && s.has(label)).map(|s| s.value)
}

pub(super) async fn fetch_metrics(http: &reqwest::Client, url: &str) -> Option<MusterMetrics> {
    let text = match http.get(url).send().await.and_then(reqwest::Response::error_for_status) {
        Ok(r) => r.text().await.ok()?,
        Err(e) => {
            eprintln!("bench: {url}: {e}");
            return None;
        }
    };
    Some(MusterMetrics::read(&text))
}

/// What the bench reads of muster's /metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MusterMetrics {
    /// Admission cycles run (the series appears with the first).
    pub cycles: f64,
    /// MusterJob reconciles run.
    pub job_reconciles: f64,
    /// Webhook reviews answered, and the seconds they took in all.
    pub webhook_reviews: f64,
    pub webhook_seconds: f64,
    /// The allocator's live bytes and its resident bytes.
    pub heap_allocated: Option<f64>,
    pub heap_resident: Option<f64>,
    /// Events muster dropped, its writers' queues full (`muster_events_dropped_total`).
    pub events_dropped: f64,
}

impl MusterMetrics {
    /// PURE: reads them from muster's /metrics text.
    pub fn read(text: &str) -> Self {
        let sum = |name: &str| {
            ["path=\"/validate\"", "path=\"/mutate\""].iter().filter_map(|l| counter_value(text, name, l)).sum()
        };
        let heap = |kind: &str| counter_value(text, HEAP_METRIC, &format!("kind=\"{kind}\""));
        MusterMetrics {
            cycles: counter_value(text, CYCLES_METRIC, CYCLES_LABEL).unwrap_or(0.0),
            job_reconciles: counter_value(text, CYCLES_METRIC, JOB_RECONCILES_LABEL).unwrap_or(0.0),
            webhook_reviews: sum("muster_webhook_duration_seconds_count"),
            webhook_seconds: sum("muster_webhook_duration_seconds_sum"),
            heap_allocated: heap("allocated"),
            heap_resident: heap("resident"),
            events_dropped: counter_value(text, "muster_events_dropped_total", "").unwrap_or(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::procfs::{Rss, stat_command, stat_cpu_ticks, status_kib};

    #[test]
    fn musters_figures_are_read_from_its_metrics() {
        let text = "# TYPE muster_heap_bytes gauge\n\
            muster_reconciles_total{controller=\"job\"} 3\n\
            muster_reconciles_total{controller=\"admission\"} 12\n\
            muster_webhook_duration_seconds_sum{path=\"/validate\"} 0.5\n\
            muster_webhook_duration_seconds_count{path=\"/validate\"} 10\n\
            muster_webhook_duration_seconds_bucket{le=\"0.001\",path=\"/mutate\"} 4\n\
            muster_webhook_duration_seconds_sum{path=\"/mutate\"} 0.25\n\
            muster_webhook_duration_seconds_count{path=\"/mutate\"} 10\n\
            muster_heap_bytes{kind=\"allocated\"} 1048576\n\
            muster_heap_bytes{kind=\"resident\"} 2097152\n\
            muster_events_dropped_total 3\n";
        let m = MusterMetrics::read(text);
        assert_eq!(
            m,
            MusterMetrics {
                cycles: 12.0,
                job_reconciles: 3.0,
                webhook_reviews: 20.0,
                webhook_seconds: 0.75,
                heap_allocated: Some(1048576.0),
                heap_resident: Some(2097152.0),
                events_dropped: 3.0,
            }
        );
        assert_eq!(MusterMetrics::read("").heap_allocated, None, "no allocator figures: none shown");
    }

    #[test]
    fn proc_and_metrics_parsers() {
        let status = "Name:\tmuster\nVmPeak:\t 999 kB\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n";
        assert_eq!(status_kib(status, "VmRSS"), Some(102400));
        assert_eq!(status_kib(status, "VmHWM"), Some(204800));
        assert_eq!(status_kib(status, "VmSwap"), None);
        // The sample's parts; a kernel that does not split RSS gives them as 0.
        let split = "VmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nRssAnon:\t   70000 kB\nRssFile:\t   32000 kB\nRssShmem:\t 400 kB\n";
        assert_eq!(Rss::of_status(split), Some(Rss { total: 102400, anon: 70000, file: 32000 }));
        assert_eq!(Rss::of_status(status), Some(Rss { total: 102400, anon: 0, file: 0 }));
        assert_eq!(Rss::of_status("Name:\tmuster\n"), None);
        // A command name with spaces and a parenthesis; utime 250, stime 50.
        let stat = "4242 (mus ter) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 1000 0 0";
        assert_eq!(stat_cpu_ticks(stat), Some(300));
        assert_eq!(stat_command(stat), Some("mus ter) x"));
        assert_eq!(stat_command("4242 no command"), None);
        assert_eq!(stat_cpu_ticks("4242 (muster) S 1"), None);
        let metrics = "# TYPE muster_reconciles counter\n\
            muster_reconciles_total{controller=\"job\"} 5\n\
            muster_reconciles_total{controller=\"admission\"} 42\n\
            muster_reconciles_total_other{controller=\"admission\"} 7\n# EOF\n";
        assert_eq!(counter_value(metrics, CYCLES_METRIC, CYCLES_LABEL), Some(42.0));
        assert_eq!(counter_value(metrics, CYCLES_METRIC, "controller=\"devices\""), None);
    }
}
