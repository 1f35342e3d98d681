//! The metrics reference, from the registry of [`Metrics`]: every family registered (name,
//! type, help), the series a scrape shows for it, and its label names as the label sets encode
//! them (one series of each labelled family is made here, so a scrape names its labels).

use std::collections::BTreeMap;

use crate::controllers::metrics::{
    AttemptLabels, BuildLabels, ControllerLabels, ErrorLabels, GpuProblemLabels, HeapLabels, Metrics, NamespaceLabels,
    NodeLabels, ObjectErrorLabels, PathLabels, ReasonLabels, SchedulingApiLabels, WebhookLabels,
};

use super::md;

/// One family as the page shows it.
#[derive(Debug)]
struct Family {
    name: String,
    kind: String,
    help: String,
    /// The sample names a scrape shows (`muster_x_total`, `muster_x_bucket`, ...).
    series: Vec<String>,
    /// Label names, `le` of histogram buckets aside.
    labels: Vec<String>,
}

/// A series of every labelled family (their values are placeholders, only the names count).
fn sample(m: &Metrics) {
    let s = || "x".to_string();
    m.reconciles.get_or_create(&ControllerLabels { controller: s() }).inc();
    m.reconcile_errors.get_or_create(&ErrorLabels { controller: s(), reason: s() }).inc();
    m.reconcile_duration.get_or_create(&ControllerLabels { controller: s() }).observe(0.0);
    m.gangs_waiting.get_or_create(&NamespaceLabels { namespace: s() }).set(0);
    m.admission_attempts.get_or_create(&AttemptLabels { result: s() }).inc();
    m.build_info.get_or_create(&BuildLabels { version: s() }).set(1);
    m.unschedulable_attempts.get_or_create(&ReasonLabels { reason: s() }).inc();
    m.object_errors.get_or_create(&ObjectErrorLabels { kind: s(), reason: s() }).inc();
    m.gpus_allocated.get_or_create(&NodeLabels { node: s() }).set(0);
    m.gpus_total.get_or_create(&NodeLabels { node: s() }).set(0);
    m.gpus_unhealthy.get_or_create(&NodeLabels { node: s() }).set(0);
    m.gpu_node_problems.get_or_create(&GpuProblemLabels { node: s(), kind: s() }).set(0);
    m.device_patch_errors.get_or_create(&ReasonLabels { reason: s() }).inc();
    m.webhook_requests.get_or_create(&WebhookLabels { path: s(), outcome: s() }).inc();
    m.webhook_duration.get_or_create(&PathLabels { path: s() }).observe(0.0);
    m.heap_bytes.get_or_create(&HeapLabels { kind: s() }).set(0);
    m.scheduling_api.get_or_create(&SchedulingApiLabels { api: s(), requested: s() }).set(1);
}

/// The suffixes a sample name adds to its family's name (OpenMetrics).
const SUFFIXES: &[&str] = &["", "_total", "_bucket", "_sum", "_count", "_created", "_info"];

/// Families of `m` with the series and label names `text` (a scrape of `m`) shows for them; an
/// error names a family no series of which is in the scrape (a labelled family [`sample`] does
/// not fill yet).
fn families(m: &Metrics, text: &str) -> Result<Vec<Family>, String> {
    let mut out: Vec<Family> = m
        .families()
        .map(|(name, kind, help)| Family {
            name: name.to_string(),
            kind: kind.to_string(),
            help: help.to_string(),
            series: Vec::new(),
            labels: Vec::new(),
        })
        .collect();
    let index: BTreeMap<String, usize> = out.iter().enumerate().map(|(i, f)| (f.name.clone(), i)).collect();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let sample = &line[..name_end];
        // The family: the longest registered name the sample name is a suffix away from.
        let Some(&i) = SUFFIXES
            .iter()
            .filter_map(|suffix| sample.strip_suffix(suffix))
            .filter_map(|family| index.get(family))
            .max_by_key(|&&i| out[i].name.len())
        else {
            return Err(format!("a scrape has a sample {sample} of no registered family"));
        };
        let family = &mut out[i];
        if !family.series.iter().any(|s| s == sample) {
            family.series.push(sample.to_string());
        }
        if let Some(labels) = line[name_end..].strip_prefix('{').and_then(|l| l.split_once('}')).map(|(l, _)| l) {
            for pair in labels.split("\",").filter(|p| !p.is_empty()) {
                let Some((label, _)) = pair.split_once('=') else { continue };
                if label != "le" && !family.labels.iter().any(|l| l == label) {
                    family.labels.push(label.to_string());
                }
            }
        }
    }
    let rank = |sample: &str, family: &str| {
        SUFFIXES.iter().position(|s| sample.strip_prefix(family) == Some(s)).unwrap_or(SUFFIXES.len())
    };
    for f in &mut out {
        let name = f.name.clone();
        f.series.sort_by_key(|s| rank(s, &name));
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(f) = out.iter().find(|f| f.series.is_empty()) {
        return Err(format!(
            "metric family {} has no series in a scrape: give it one in src/docs/metrics.rs (sample), so the \
             reference names its labels",
            f.name
        ));
    }
    Ok(out)
}

/// The metrics page.
pub fn page() -> Result<String, String> {
    let m = Metrics::default();
    sample(&m);
    let fams = families(&m, &m.encode())?;
    let mut out = String::new();
    out.push_str("# Metrics\n\n");
    out.push_str(
        "`muster run` serves these families at `/metrics` (OpenMetrics text) on `--metrics-bind-address`, or \
         over HTTPS on `--metrics-secure-bind-address` (see [the flags](muster-run.md#--metrics-secure-bind-address)). \
         Every family is listed in a scrape, also one with no series yet. This page is made from the registry in \
         `src/controllers/metrics.rs`: the name, the type and the help of each family as registered, the samples \
         a scrape shows for it, and its label names.\n\n",
    );
    out.push_str(&format!("## The controller manager ({} families) {{#controller-manager}}\n\n", fams.len()));
    out.push_str("| Family | Type | Samples | Labels | Help |\n|---|---|---|---|---|\n");
    for f in &fams {
        out.push_str(&format!(
            "| <a id=\"{}\"></a>{} | {} | {} | {} | {} |\n",
            f.name,
            md::code(&f.name, true),
            f.kind,
            f.series.iter().map(|s| md::code(s, true)).collect::<Vec<_>>().join("<br>"),
            f.labels.iter().map(|l| md::code(l, true)).collect::<Vec<_>>().join(", "),
            md::cell(&md::sentence(&f.help)),
        ));
    }
    out.push('\n');
    out.push_str("## The node agent {#node-agent}\n\n");
    out.push_str(
        "`muster node-agent` exports no metrics: with `--probe-bind-address` it serves `/healthz` and `/readyz` \
         only. What it measures of the GPUs it publishes in the node's NodeGPUReport (see \
         [NodeGPUReport](api/nodegpureport.md)).\n",
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_listed_with_its_samples_and_labels() {
        let page = page().unwrap_or_else(|e| panic!("{e}"));
        let m = Metrics::default();
        let n = m.families().count();
        assert!(n > 20, "{n}");
        for (name, kind, _) in m.families() {
            assert!(page.contains(&format!("| <a id=\"{name}\"></a>`{name}` | {kind} |")), "{name}: {page}");
        }
        assert!(
            page.contains("| `muster_reconcile_errors_total` | `controller`, `reason` | Reconcile errors by reason. |"),
            "{page}"
        );
        assert!(
            page.contains(
                "`muster_webhook_duration_seconds_bucket`<br>`muster_webhook_duration_seconds_sum`<br>`muster_webhook_duration_seconds_count` | `path` |"
            ),
            "{page}"
        );
        assert!(page.contains("| `muster_gangs_pending` |  |"), "an unlabelled gauge: {page}");
    }

    #[test]
    fn a_labelled_family_with_no_series_fails_generation() {
        // A fresh registry: the labelled families have no series, so their labels are unknown.
        let m = Metrics::default();
        let e = families(&m, &m.encode()).map(|_| ()).unwrap_err();
        assert!(e.contains("has no series"), "{e}");
    }

    #[test]
    fn the_node_agent_exports_no_metrics_as_the_page_says() {
        // The page says the agent serves no /metrics: true while its code registers none.
        for (file, src) in [
            ("src/cli/node_agent.rs", include_str!("../cli/node_agent.rs")),
            ("src/agent/mod.rs", include_str!("../agent/mod.rs")),
            ("src/agent/kubelet.rs", include_str!("../agent/kubelet.rs")),
            ("src/agent/nvml.rs", include_str!("../agent/nvml.rs")),
        ] {
            for word in ["prometheus_client", "\"/metrics\"", "Metrics::default"] {
                assert!(!src.contains(word), "{file} uses {word}: list the agent's metrics in src/docs/metrics.rs");
            }
        }
    }
}
