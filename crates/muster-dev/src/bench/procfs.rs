//! The machine's cost from /proc: the pure parsers of /proc/<pid>/status and /proc/<pid>/stat,
//! CPU seconds per command over a path, and the readers and RSS sampler that feed them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// USER_HZ: the unit of utime/stime in /proc/<pid>/stat (100 on every Linux muster targets).
pub(super) const CLOCK_TICKS_PER_S: f64 = 100.0;
const RSS_SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// PURE: a `kB` field (`VmRSS`, `VmHWM`) of /proc/<pid>/status, in KiB.
pub fn status_kib(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// PURE: utime + stime (clock ticks) from /proc/<pid>/stat. The command name in parentheses
/// may hold spaces, so the fields are counted after its closing parenthesis.
pub fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. of proc(5) follow; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// PURE: the command name of a /proc/<pid>/stat line (between the first `(` and the last `)`).
pub fn stat_command(stat: &str) -> Option<&str> {
    stat.get(stat.find('(')? + 1..stat.rfind(')')?)
}

/// PURE: CPU seconds per command during a path, from `(command, ticks)` of every process
/// before and after it (a process gone by the end is left out; one started during the path
/// counts from zero). Largest first; commands under 0.05 s are left out.
pub fn cpu_by_command(before: &HashMap<u32, (String, u64)>, after: &HashMap<u32, (String, u64)>) -> Vec<(String, f64)> {
    let mut by: BTreeMap<&str, u64> = BTreeMap::new();
    for (pid, (command, ticks)) in after {
        // A pid reused by another command counts from zero too.
        let earlier = before.get(pid).filter(|(c, _)| c == command).map_or(0, |(_, t)| *t);
        *by.entry(command.as_str()).or_default() += ticks.saturating_sub(earlier);
    }
    let mut out: Vec<(String, f64)> = by
        .into_iter()
        .map(|(c, t)| (c.to_string(), t as f64 / CLOCK_TICKS_PER_S))
        .filter(|(_, s)| *s >= 0.05)
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// `(command, CPU ticks)` of every process this user can read, by pid; this process is named
/// `bench` (it is a `muster` too).
pub(super) fn process_ticks() -> HashMap<u32, (String, u64)> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else { return HashMap::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = read_proc(pid, "stat")?;
            let command = if pid == me { "bench" } else { stat_command(&stat)? };
            Some((pid, (command.to_string(), stat_cpu_ticks(&stat)?)))
        })
        .collect()
}

pub(super) fn read_proc(pid: u32, file: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()
}

/// One sample of a process's resident memory, KiB: VmRSS and its two parts that matter here,
/// anonymous memory (the heap, stacks) and file pages mapped (the binary's code and data as the
/// kernel faulted them in).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rss {
    pub total: u64,
    pub anon: u64,
    pub file: u64,
}

impl Rss {
    /// PURE: the sample in a /proc/<pid>/status (`None` without VmRSS; a part it lacks is 0).
    pub fn of_status(status: &str) -> Option<Self> {
        Some(Rss {
            total: status_kib(status, "VmRSS")?,
            anon: status_kib(status, "RssAnon").unwrap_or_default(),
            file: status_kib(status, "RssFile").unwrap_or_default(),
        })
    }
}

/// Samples the RSS of `pid` until `stop`; returns the sample of the largest VmRSS.
pub(super) async fn sample_rss(pid: u32, stop: Arc<AtomicBool>) -> Option<Rss> {
    let mut peak: Option<Rss> = None;
    while !stop.load(Ordering::Relaxed) {
        if let Some(now) = read_proc(pid, "status").and_then(|s| Rss::of_status(&s))
            && peak.is_none_or(|p| now.total > p.total)
        {
            peak = Some(now);
        }
        tokio::time::sleep(RSS_SAMPLE_EVERY).await;
    }
    peak
}

pub(super) fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_per_command_over_a_path() {
        let at = |rows: &[(u32, &str, u64)]| -> HashMap<u32, (String, u64)> {
            rows.iter().map(|(pid, c, t)| (*pid, (c.to_string(), *t))).collect()
        };
        let before =
            at(&[(1, "kube-apiserver", 1000), (2, "etcd", 500), (3, "muster", 10), (4, "gone", 7), (6, "old", 900)]);
        let after = at(&[
            (1, "kube-apiserver", 9000),
            (2, "etcd", 700),
            (3, "muster", 3010),
            // Started during the path: counted from zero.
            (5, "kube-apiserver", 1000),
            // pid 6 reused by another command: from zero too.
            (6, "kwok", 300),
            // Idle: left out.
            (7, "sleep", 2),
        ]);
        assert_eq!(
            cpu_by_command(&before, &after),
            vec![
                ("kube-apiserver".to_string(), 90.0),
                ("muster".into(), 30.0),
                ("kwok".into(), 3.0),
                ("etcd".into(), 2.0)
            ]
        );
    }
}
