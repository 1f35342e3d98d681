//! The docs cannot rot: checks over README.md, charts/muster/README.md and every page of the
//! book (docs/src/**/*.md), parsed with pulldown-cmark as mdBook parses them.
//! - Links: a relative link names a file that exists (relative to its page) and its `#anchor`
//!   a heading (mdBook's id rule) or an `id="..."` on that page; book pages link only inside
//!   docs/src, README.md only into docs/src; external links are counted, not fetched. Every
//!   page of docs/src is listed in SUMMARY.md.
//! - YAML blocks, by tag: ```yaml passes `muster validate`, ```yaml,invalid is refused by it,
//!   ```yaml,values renders the chart (`helm template`), ```yaml,excerpt parses; mdBook's
//!   `{{#include}}` is expanded first.
//!
//! Every problem is listed in one failure, with its page and line. Run with `make docs-check`
//! (which builds the book with mdBook first); helm is `$MUSTER_K8S_BIN/helm`, else the
//! control plane cache's (`tools/k8s/bindir.sh`, `make controlplane`).

mod check;
mod markdown;
mod slug;
mod yaml;

use std::path::{Path, PathBuf};

#[test]
fn docs_links_and_yaml_blocks() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = match std::env::var_os("MUSTER_K8S_BIN") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let out = std::process::Command::new("bash")
                .arg("tools/k8s/bindir.sh")
                .current_dir(root)
                .output()
                .expect("run tools/k8s/bindir.sh");
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    let tools = yaml::Tools {
        muster: PathBuf::from(env!("CARGO_BIN_EXE_muster")),
        helm: bin.join("helm"),
        tmp: tempfile::tempdir().expect("temporary folder"),
    };
    let report = check::check_tree(root, &tools);
    println!("{}", report.summary());
    assert!(
        report.failures.is_empty(),
        "{} problems in the docs:\n{}\n{}",
        report.failures.len(),
        report.failures.iter().map(|f| format!("- {f}")).collect::<Vec<_>>().join("\n"),
        report.summary()
    );
}
