//! The floors hold: each crate of the workspace depends only on the floors below it (the
//! compiler then refuses an import that goes up one), and the floors below the manager bring no
//! Kubernetes client, async runtime or network stack with them, not even indirectly. Read from
//! `cargo tree`, so a dependency added to a floor's Cargo.toml fails here.

use std::collections::BTreeSet;
use std::process::Command;

/// The workspace's crates and the ones each may depend on (normal dependencies).
const FLOORS: [(&str, &[&str]); 6] = [
    ("muster-api", &[]),
    ("muster-core", &["muster-api"]),
    ("muster-podresources", &[]),
    ("muster-dev", &["muster-api", "muster-core", "muster-podresources"]),
    ("muster", &["muster-api", "muster-core", "muster-dev", "muster-podresources"]),
    ("kubectl-muster", &["muster-api", "muster-core"]),
];

/// What the API types and the pure core never pull in, directly or through a dependency.
const NOT_BELOW_THE_SHELL: [&str; 9] =
    ["kube-client", "kube-runtime", "tokio", "hyper", "reqwest", "tonic", "axum", "tower", "rustls"];

/// The names of `package`'s normal dependencies, `depth` levels down (`None`: all of them).
fn dependencies(package: &str, depth: Option<u32>) -> BTreeSet<String> {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["tree", "--quiet", "-p", package, "-e", "normal", "--prefix", "none", "--format", "{p}"]);
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
    if let Some(d) = depth {
        cmd.args(["--depth", &d.to_string()]);
    }
    let out = cmd.output().expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != package)
        .map(str::to_string)
        .collect()
}

#[test]
fn each_crate_depends_only_on_the_floors_below_it() {
    let ours: BTreeSet<&str> = FLOORS.iter().map(|(name, _)| *name).collect();
    for (package, allowed) in FLOORS {
        let direct = dependencies(package, Some(1));
        let workspace: BTreeSet<&str> = direct.iter().map(String::as_str).filter(|d| ours.contains(d)).collect();
        let allowed: BTreeSet<&str> = allowed.iter().copied().collect();
        assert_eq!(workspace, allowed, "{package} depends on these crates of the workspace");
    }
}

#[test]
fn the_api_types_and_the_core_bring_no_client_runtime_or_network() {
    for package in ["muster-api", "muster-core"] {
        let all = dependencies(package, None);
        let found: Vec<&str> = NOT_BELOW_THE_SHELL.iter().copied().filter(|d| all.contains(*d)).collect();
        assert!(found.is_empty(), "{package} pulls in {found:?}");
    }
}
