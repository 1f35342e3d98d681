//! PURE: the human summary of a [`Report`]: one row per path with its status, the top API
//! writes, conflicts, CPU and API server time per path, and muster's own cost.

use super::BenchPath;
use super::report::{PathReport, Report};
use super::setup::GPUS_PER_NODE;
use muster_api::GPU_INDICES_ANNOTATION;

/// PURE: one line per path whose `rows` are not empty, after a blank line: `<path> path:
/// <head of the rows' total>: <the first 8 rows>` (the rows come largest first).
fn top_lines<T>(
    out: &mut String,
    report: &Report,
    rows: impl Fn(&PathReport) -> &[T],
    value: impl Fn(&T) -> f64,
    item: impl Fn(&PathReport, &T) -> String,
    head: impl Fn(&PathReport, f64) -> String,
) {
    for p in report.paths.iter().filter(|p| !rows(p).is_empty()) {
        let total: f64 = rows(p).iter().map(&value).sum();
        let top: Vec<String> = rows(p).iter().take(8).map(|r| item(p, r)).collect();
        let path = p.path.map_or("?", BenchPath::name);
        out.push_str(&format!("\n{path} path: {}: {}", head(p, total), top.join(", ")));
    }
}

pub(super) fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.decimals$}"))
}

/// PURE: the human summary of `report`.
pub fn format_table(report: &Report) -> String {
    let paced = if report.rate > 0.0 { format!(", created at {} gangs/s", report.rate) } else { String::new() };
    let mut out = format!(
        "bench: {} nodes ({} GPUs each; created in {:.1} s, all Ready after {:.1} s), {} gangs x {} pods per path{paced}\n\n",
        report.nodes, GPUS_PER_NODE, report.nodes_create_s, report.nodes_ready_s, report.gangs, report.size
    );
    out.push_str(&format!(
        "{:<8} {:>11} {:>10} {:>9} {:>22} {:>16} {:>15} {:>13}  {}\n",
        "path",
        "pods bound",
        "bound/s",
        "vs plain",
        "last create->last bind",
        "schedulingGroup",
        "user p99 (ms)",
        "user p99 vs",
        "status"
    ));
    for p in &report.paths {
        let status = if p.ok() {
            "ok".to_string()
        } else {
            let mut why = Vec::new();
            if p.timed_out {
                why.push("TIMED OUT".to_string());
            }
            if p.scheduling_dropped {
                why.push("spec.scheduling DROPPED by the API".to_string());
            } else if p.gang_not_honoured() {
                why.push("pods WITHOUT schedulingGroup".to_string());
            }
            if p.create_errors > 0 {
                why.push(format!("{} create errors", p.create_errors));
            }
            why.join(", ")
        };
        out.push_str(&format!(
            "{:<8} {:>11} {:>10} {:>9} {:>22} {:>16} {:>15} {:>13}  {}\n",
            p.path.map_or("?", BenchPath::name),
            format!("{}/{}", p.throughput.pods_bound, p.pods_expected),
            opt(p.throughput.bound_per_s, 1),
            p.ratio_to_plain.map_or_else(|| "-".to_string(), |r| format!("{r:.2}x")),
            format!("{} s", opt(p.throughput.last_create_to_last_bind_s, 2)),
            format!("{}/{}", p.pods_with_scheduling_group, p.pods_seen),
            opt(p.user.as_ref().and_then(|u| u.p99_s).map(|s| s * 1000.0), 1),
            p.user.as_ref().and_then(|u| u.p99_vs_plain).map_or_else(|| "-".to_string(), |r| format!("{r:.2}x")),
            status
        ));
    }
    if report.paths.iter().any(|p| p.user.is_some()) {
        let who = report.user_identity.as_deref().unwrap_or("?");
        let every = match report.user_every_ms() {
            1000 => "every second".to_string(),
            ms => format!("every {ms} ms"),
        };
        out.push_str(&format!(
            "\nan ordinary user's requests during each path (a ConfigMap create {every}, as {who}):\n"
        ));
        out.push_str(&format!(
            "{:<16} {:>6} {:>7} {:>9} {:>9} {:>9} {:>12} {:>21} {:>21}\n",
            "path",
            "count",
            "errors",
            "p50 ms",
            "p99 ms",
            "max ms",
            "p99 vs plain",
            "creating: n, p99 ms",
            "after: n, p99 ms"
        ));
        for p in &report.paths {
            let ms = |v: Option<f64>| opt(v.map(|s| s * 1000.0), 1);
            let [count, errors, p50, p99, max, vs, creating, after] = match &p.user {
                Some(u) => [
                    u.count.to_string(),
                    u.errors.to_string(),
                    ms(u.p50_s),
                    ms(u.p99_s),
                    ms(u.max_s),
                    u.p99_vs_plain.map_or_else(|| "-".to_string(), |r| format!("{r:.2}x")),
                    format!("{}, {}", u.creating_count, ms(u.creating_p99_s)),
                    format!("{}, {}", u.after_count, ms(u.after_p99_s)),
                ],
                None => std::array::from_fn(|_| "-".to_string()),
            };
            out.push_str(&format!(
                "{:<16} {count:>6} {errors:>7} {p50:>9} {p99:>9} {max:>9} {vs:>12} {creating:>21} {after:>21}\n",
                p.path.map_or("?", BenchPath::name)
            ));
        }
    }
    if report.paths.iter().any(|p| p.gpu_indices.is_some()) {
        out.push_str(&format!(
            "\nGPU indices ({GPU_INDICES_ANNOTATION}) of each path's bound pods, against the bind:\n"
        ));
        out.push_str(&format!(
            "{:<16} {:>12} {:>11} {:>6} {:>24}\n",
            "path", "before bind", "after bind", "never", "after: p50/p99/max ms"
        ));
        for p in &report.paths {
            let Some(g) = &p.gpu_indices else { continue };
            let ms = |v: Option<f64>| opt(v.map(|s| s * 1000.0), 0);
            out.push_str(&format!(
                "{:<16} {:>12} {:>11} {:>6} {:>24}\n",
                p.path.map_or("?", BenchPath::name),
                g.before_bind,
                g.after_bind,
                g.never,
                format!("{}/{}/{}", ms(g.after_p50_s), ms(g.after_p99_s), ms(g.after_max_s))
            ));
        }
    }
    top_lines(
        &mut out,
        report,
        |p| &p.api_writes,
        |(_, n)| *n,
        |p, (k, n)| format!("{k} {:.2}", n / p.pods_expected.max(1) as f64),
        |p, total| format!("{total:.0} API writes, {:.2} per pod", total / p.pods_expected.max(1) as f64),
    );
    top_lines(
        &mut out,
        report,
        |p| &p.tail_writes,
        |(_, n)| *n,
        |p, (k, n)| format!("{k} {:.2}", n / p.pods_expected.max(1) as f64),
        |p, total| {
            format!(
                "after its last bind, {total:.0} API writes ({:.2} per pod) in the {} s until the API server was quiet",
                total / p.pods_expected.max(1) as f64,
                opt(p.settle_s, 1)
            )
        },
    );
    top_lines(
        &mut out,
        report,
        |p| &p.api_conflicts,
        |(_, n)| *n,
        |_, (k, n)| format!("{k} {n:.0}"),
        |_, total| format!("{total:.0} writes refused as conflicts (409)"),
    );
    top_lines(
        &mut out,
        report,
        |p| &p.cpu_s_by_process,
        |(_, s)| *s,
        |_, (c, s)| format!("{c} {s:.1}"),
        |p, total| {
            format!("CPU seconds {total:.1} ({:.2} per pod bound)", total / p.throughput.pods_bound.max(1) as f64)
        },
    );
    top_lines(
        &mut out,
        report,
        |p| &p.api_time,
        |(_, s, _)| *s,
        |_, (k, s, each)| format!("{k} {s:.0} s ({:.0} ms each)", each * 1000.0),
        |_, total| format!("the API server's time on requests {total:.0} s"),
    );
    if report.paths.iter().any(|p| !p.api_writes.is_empty()) {
        out.push('\n');
    }
    for p in &report.paths {
        if let Some(m) = &p.muster {
            out.push_str(&format!(
                "\nmuster during the {} path: peak RSS {} MiB ({} anonymous, {} file pages; VmHWM {} MiB, since start), CPU {} s\n",
                p.path.map_or("?", BenchPath::name),
                opt(m.rss_peak_mib, 1),
                opt(m.rss_anon_mib, 1),
                opt(m.rss_file_mib, 1),
                opt(m.vm_hwm_mib, 1),
                opt(m.cpu_s, 2)
            ));
            out.push_str(&format!(
                "  admission latency over {} gangs: p50 {} s, p99 {} s; admission cycles {}; job reconciles {}\n",
                m.gangs_admitted,
                opt(m.admission_p50_s, 3),
                opt(m.admission_p99_s, 3),
                opt(m.cycles, 0),
                opt(m.job_reconciles, 0)
            ));
            out.push_str(&format!(
                "  heap at the end: {} MiB allocated, {} MiB resident; webhook: {} reviews, mean {} ms; events dropped {}\n",
                opt(m.heap_allocated_mib, 1),
                opt(m.heap_resident_mib, 1),
                opt(m.webhook_reviews, 0),
                opt(m.webhook_mean_ms, 1),
                opt(m.events_dropped, 0)
            ));
        }
    }
    out.push_str(&format!(
        "\ncluster at the end: {} pods, {} nodes\n",
        report.cluster_pods.map_or_else(|| "?".to_string(), |n| n.to_string()),
        report.cluster_nodes.map_or_else(|| "?".to_string(), |n| n.to_string())
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::MusterNumbers;
    use crate::bench::stats::{IndexTimes, Throughput, UserLatency};

    #[test]
    fn the_table_says_what_failed() {
        let report = Report {
            nodes: 100,
            gangs: 2,
            size: 3,
            paths: vec![
                PathReport {
                    path: Some(BenchPath::Plain),
                    pods_expected: 6,
                    pods_seen: 6,
                    throughput: Throughput { pods_bound: 6, bound_per_s: Some(12.0), ..Throughput::default() },
                    ratio_to_plain: Some(1.0),
                    ..PathReport::default()
                },
                PathReport {
                    path: Some(BenchPath::Gang),
                    pods_expected: 6,
                    pods_seen: 6,
                    pods_with_scheduling_group: 0,
                    throughput: Throughput { pods_bound: 6, ..Throughput::default() },
                    ..PathReport::default()
                },
                PathReport {
                    path: Some(BenchPath::Muster),
                    pods_expected: 6,
                    pods_seen: 6,
                    timed_out: true,
                    throughput: Throughput { pods_bound: 3, ..Throughput::default() },
                    muster: Some(MusterNumbers {
                        rss_peak_mib: Some(50.0),
                        rss_anon_mib: Some(30.0),
                        rss_file_mib: Some(19.5),
                        cycles: Some(4.0),
                        job_reconciles: Some(9.0),
                        heap_allocated_mib: Some(20.0),
                        webhook_mean_ms: Some(3.5),
                        ..MusterNumbers::default()
                    }),
                    ..PathReport::default()
                },
            ],
            cluster_pods: Some(15),
            cluster_nodes: Some(100),
            ..Report::default()
        };
        let table = format_table(&report);
        let line = |p: &str| table.lines().find(|l| l.starts_with(p)).unwrap_or_default().to_string();
        assert!(
            line("plain ").contains("6/6") && line("plain ").contains("12.0") && line("plain ").ends_with("ok"),
            "{table}"
        );
        assert!(line("gang ").contains("pods WITHOUT schedulingGroup"), "{table}");
        assert!(line("muster ").contains("3/6") && line("muster ").contains("TIMED OUT"), "{table}");
        assert!(
            table.contains("peak RSS 50.0 MiB (30.0 anonymous, 19.5 file pages")
                && table.contains("admission cycles 4; job reconciles 9"),
            "{table}"
        );
        assert!(table.contains("20.0 MiB allocated") && table.contains("mean 3.5 ms"), "{table}");
        assert!(table.contains("15 pods, 100 nodes"), "{table}");
        assert!(report.paths[0].ok() && !report.paths[1].ok() && !report.paths[2].ok());
        // Without a user, its columns say '-' and there is no user section.
        assert!(line("plain ").split_whitespace().filter(|w| *w == "-").count() >= 2, "{table}");
        assert!(!table.contains("an ordinary user's requests"), "{table}");
        assert!(!table.contains("after its last bind"), "no tail measured, none told: {table}");

        let mut with_tail = report.clone();
        with_tail.paths[0].settle_s = Some(7.5);
        with_tail.paths[0].tail_writes = vec![("PUT jobs/status".into(), 3.0), ("PUT leases".into(), 9.0)];
        let table = format_table(&with_tail);
        assert!(
            table.contains(
                "plain path: after its last bind, 12 API writes (2.00 per pod) in the 7.5 s until the API server \
                 was quiet: PUT jobs/status 0.50, PUT leases 1.50"
            ),
            "{table}"
        );

        assert!(!table.contains("GPU indices"), "none measured, none told: {table}");
        let mut with_indices = report.clone();
        with_indices.paths[0].gpu_indices = Some(IndexTimes {
            before_bind: 0,
            after_bind: 6,
            never: 0,
            after_p50_s: Some(0.25),
            after_p99_s: Some(0.6),
            after_max_s: Some(0.61),
        });
        with_indices.paths[2].gpu_indices = Some(IndexTimes { before_bind: 3, ..IndexTimes::default() });
        let table = format_table(&with_indices);
        let section: Vec<&str> = table.lines().skip_while(|l| !l.starts_with("GPU indices")).take(4).collect();
        assert_eq!(section.len(), 4, "{table}");
        assert_eq!(
            section[2].split_whitespace().collect::<Vec<_>>(),
            ["plain", "0", "6", "0", "250/600/610"],
            "{table}"
        );
        assert_eq!(section[3].split_whitespace().collect::<Vec<_>>(), ["muster", "3", "0", "0", "-/-/-"], "{table}");

        let mut with_user = report.clone();
        with_user.user_identity = Some("system:serviceaccount:bench-user:bench-user".into());
        with_user.paths[0].user = Some(UserLatency {
            count: 20,
            errors: 0,
            p50_s: Some(0.004),
            p99_s: Some(0.010),
            max_s: Some(0.012),
            p99_vs_plain: Some(1.0),
            creating_count: 4,
            creating_p99_s: Some(0.011),
            after_count: 16,
            after_p99_s: Some(0.009),
        });
        with_user.paths[2].user = Some(UserLatency {
            count: 30,
            errors: 2,
            p50_s: Some(0.005),
            p99_s: Some(0.025),
            max_s: Some(0.030),
            p99_vs_plain: Some(2.5),
            creating_count: 0,
            creating_p99_s: None,
            after_count: 30,
            after_p99_s: Some(0.025),
        });
        let table = format_table(&with_user);
        let line = |p: &str| table.lines().find(|l| l.starts_with(p)).unwrap_or_default().to_string();
        assert!(line("plain ").contains("10.0") && line("plain ").contains("1.00x"), "{table}");
        assert!(line("muster ").contains("25.0") && line("muster ").contains("2.50x"), "{table}");
        assert!(table.contains("as system:serviceaccount:bench-user:bench-user"), "{table}");
        assert!(table.contains("a ConfigMap create every second, as"), "{table}");
        let mut denser = with_user.clone();
        denser.user_interval_ms = Some(200);
        assert!(format_table(&denser).contains("a ConfigMap create every 200 ms, as"), "{table}");
        let rows: Vec<&str> = table.lines().skip_while(|l| !l.contains("an ordinary user's")).collect();
        let row = |p: &str| rows.iter().find(|l| l.starts_with(p)).map(|l| l.split_whitespace().collect::<Vec<_>>());
        assert_eq!(
            row("plain "),
            Some(vec!["plain", "20", "0", "4.0", "10.0", "12.0", "1.00x", "4,", "11.0", "16,", "9.0"]),
            "{table}"
        );
        assert_eq!(row("gang "), Some(vec!["gang", "-", "-", "-", "-", "-", "-", "-", "-"]), "{table}");
        assert_eq!(
            row("muster "),
            Some(vec!["muster", "30", "2", "5.0", "25.0", "30.0", "2.50x", "0,", "-", "30,", "25.0"]),
            "{table}"
        );
    }
}
