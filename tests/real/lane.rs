//! The lane: stages in order, each timed and reported; the first failure stops it.

use std::fmt::Write as _;
use std::time::Instant;

use crate::node::{self, Lane, out_dir};
use crate::stages;

/// What each stage reported, written to `target/e2e-real/report.md` after every stage.
struct Report {
    lines: Vec<String>,
}

impl Report {
    fn write(&self) {
        let mut text =
            String::from("# make e2e-real\n\n| stage | result | seconds | figures |\n| --- | --- | --- | --- |\n");
        for l in &self.lines {
            let _ = writeln!(text, "{l}");
        }
        let _ = std::fs::write(out_dir().join("report.md"), text);
    }

    fn stage<T>(&mut self, name: &str, f: impl FnOnce() -> Result<(T, String), String>) -> T {
        eprintln!("e2e-real: {name} ...");
        let began = Instant::now();
        let result = f();
        let secs = began.elapsed().as_secs_f64();
        match result {
            Ok((value, figures)) => {
                eprintln!("e2e-real: {name}: ok in {secs:.1}s: {figures}");
                self.lines.push(format!("| {name} | ok | {secs:.1} | {} |", figures.replace('\n', "<br>")));
                self.write();
                value
            }
            Err(e) => {
                self.lines.push(format!("| {name} | FAILED | {secs:.1} | {} |", e.replace('\n', "<br>")));
                self.write();
                panic!("e2e-real: stage {name} failed after {secs:.1}s: {e}");
            }
        }
    }
}

#[test]
fn real_node_lane() {
    let mut report = Report { lines: Vec::new() };
    let lane: Lane = report.stage("real node, images, device plugin", || {
        let lane = node::setup()?;
        let figures = lane.image_lines.join("\n");
        Ok((lane, figures))
    });
    report.stage("helm install", || stages::install(&lane).map(|f| ((), f)));
    report.stage("webhooks through their Service", || stages::webhooks(&lane).map(|f| ((), f)));
    report.stage("node agent reads kubelet", || stages::node_agent(&lane).map(|f| ((), f)));
    report.stage("gang jobs run real containers", || stages::gang_jobs(&lane).map(|f| ((), f)));
    report.stage("examples on the real node", || stages::examples(&lane).map(|f| ((), f)));
    report.stage("muster killed mid-admission", || stages::failover(&lane).map(|f| ((), f)));
    report.stage("helm upgrade to a rebuilt image", || stages::upgrade(&lane).map(|f| ((), f)));
    report.stage("helm uninstall", || stages::uninstall(&lane).map(|f| ((), f)));
}
