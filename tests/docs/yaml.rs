//! The fenced YAML blocks of the docs, by their tag (the info string):
//! - ` ```yaml `: whole Kubernetes objects; every document has apiVersion and kind, and
//!   `muster validate` accepts the block (exit 0);
//! - ` ```yaml,invalid `: a manifest shown as an intentional error; `muster validate` refuses
//!   it (exit 1) and names at least one field path;
//! - ` ```yaml,values `: values of charts/muster; `helm template muster charts/muster -f` renders;
//! - ` ```yaml,excerpt `: part of an object; it parses as YAML.
//!
//! Any other tag starting with `yaml` or `yml` is an error: an unchecked block.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// What a YAML block is, by its tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Manifest,
    Invalid,
    Values,
    Excerpt,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Manifest, Kind::Invalid, Kind::Values, Kind::Excerpt];

    pub fn tag(self) -> &'static str {
        match self {
            Kind::Manifest => "yaml",
            Kind::Invalid => "yaml,invalid",
            Kind::Values => "yaml,values",
            Kind::Excerpt => "yaml,excerpt",
        }
    }
}

/// The kind of a block with info string `info`: None when it is not YAML, an error for a tag
/// outside the convention.
pub fn kind_of(info: &str) -> Option<Result<Kind, String>> {
    let tag = info.split_whitespace().next().unwrap_or("");
    let lower = tag.to_ascii_lowercase();
    if !lower.starts_with("yaml") && !lower.starts_with("yml") {
        return None;
    }
    Some(Kind::ALL.into_iter().find(|k| k.tag() == tag).ok_or_else(|| {
        format!("unknown YAML block tag ```{tag}: use ```yaml, ```yaml,invalid, ```yaml,values or ```yaml,excerpt")
    }))
}

/// The programs the checks run.
pub struct Tools {
    /// The muster binary under test.
    pub muster: PathBuf,
    /// helm (`$MUSTER_K8S_BIN/helm`).
    pub helm: PathBuf,
    /// Where the blocks are written to be checked.
    pub tmp: tempfile::TempDir,
}

/// What checking one block found.
#[derive(Debug, Default)]
pub struct Verdict {
    pub failures: Vec<String>,
    /// MusterJobs and MusterJobSets `muster validate` checked.
    pub objects: usize,
}

/// Checks one block (`text`, of kind `kind`); `at` (`page:line`) starts every failure, `n`
/// names its temporary file, `chart` is charts/muster.
pub fn check(kind: Kind, text: &str, at: &str, n: usize, tools: &Tools, chart: &Path) -> Verdict {
    let mut v = Verdict::default();
    let tag = kind.tag();
    let docs: Vec<Value> = match serde_saphyr::from_multiple::<Value>(text) {
        Ok(d) => d.into_iter().filter(|d| !d.is_null()).collect(),
        Err(e) => {
            v.failures.push(format!("{at}: ```{tag} block is not valid YAML: {}", one_line(&e.to_string())));
            return v;
        }
    };
    if docs.is_empty() {
        v.failures.push(format!("{at}: ```{tag} block holds no YAML document"));
        return v;
    }
    let file = tools.tmp.path().join(format!("block-{n}.yaml"));
    if let Err(e) = std::fs::write(&file, text) {
        v.failures.push(format!("{at}: cannot write {}: {e}", file.display()));
        return v;
    }
    match kind {
        Kind::Excerpt => {}
        Kind::Manifest | Kind::Invalid => {
            if kind == Kind::Manifest {
                for (i, d) in docs.iter().enumerate() {
                    for field in ["apiVersion", "kind"] {
                        if !d.get(field).is_some_and(Value::is_string) {
                            v.failures.push(format!(
                                "{at}: ```yaml block, document {}: no {field} (a whole object needs apiVersion and kind; \
                                 mark a fragment ```yaml,excerpt)",
                                i + 1
                            ));
                        }
                    }
                }
            }
            let out = match run(Command::new(&tools.muster).arg("validate").arg("-f").arg(&file)) {
                Ok(o) => o,
                Err(e) => {
                    v.failures.push(format!("{at}: {e}"));
                    return v;
                }
            };
            let stdout = String::from_utf8_lossy(&out.stdout);
            v.objects = stdout.lines().filter(|l| l.ends_with("): valid") || l.ends_with(") is invalid:")).count();
            let code = out.status.code();
            if kind == Kind::Manifest && code != Some(0) {
                v.failures.push(format!(
                    "{at}: ```yaml block fails `muster validate` (exit {code:?}; mark an intentional error \
                     ```yaml,invalid):\n{}",
                    indent(&out)
                ));
            }
            if kind == Kind::Invalid {
                if code != Some(1) {
                    v.failures.push(format!(
                        "{at}: ```yaml,invalid block: `muster validate` exits {code:?}, not 1 (an intentional \
                         error must be refused by validation):\n{}",
                        indent(&out)
                    ));
                } else if !stdout.lines().any(names_a_field) {
                    v.failures.push(format!(
                        "{at}: ```yaml,invalid block: `muster validate` names no field path:\n{}",
                        indent(&out)
                    ));
                }
            }
        }
        Kind::Values => {
            if !docs.iter().all(Value::is_object) || docs.len() != 1 {
                v.failures.push(format!("{at}: ```yaml,values block is not one mapping of chart values"));
            }
            match run(Command::new(&tools.helm).arg("template").arg("muster").arg(chart).arg("-f").arg(&file)) {
                Ok(out) if out.status.success() => {}
                Ok(out) => v.failures.push(format!(
                    "{at}: ```yaml,values block: `helm template muster charts/muster -f` fails ({}):\n{}",
                    out.status,
                    indent(&Output { stdout: Vec::new(), ..out })
                )),
                Err(e) => v.failures.push(format!("{at}: {e} (helm comes with `make controlplane`)")),
            }
        }
    }
    v
}

fn run(cmd: &mut Command) -> Result<Output, String> {
    cmd.output().map_err(|e| format!("cannot run {}: {e}", cmd.get_program().to_string_lossy()))
}

/// A line of `muster validate`'s verdict that names a field: `spec.template: Invalid value: ...`.
pub fn names_a_field(line: &str) -> bool {
    line.split_once(": ").is_some_and(|(path, _)| {
        !path.is_empty()
            && path.chars().all(|c| c.is_ascii_alphanumeric() || "._-[]/".contains(c))
            && path.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
    })
}

/// A command's output, indented under the failure it explains (at most 12 lines).
fn indent(out: &Output) -> String {
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().collect();
    let mut shown: Vec<String> = lines.iter().take(12).map(|l| format!("    | {l}")).collect();
    if lines.len() > 12 {
        shown.push(format!("    | ... ({} more lines)", lines.len() - 12));
    }
    shown.join("\n")
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(helm: &str) -> Tools {
        Tools {
            muster: PathBuf::from(env!("CARGO_BIN_EXE_muster")),
            helm: PathBuf::from(helm),
            tmp: tempfile::tempdir().unwrap(),
        }
    }

    const VALID: &str = "apiVersion: batch.muster.dev/v1alpha1\nkind: MusterJob\nmetadata:\n  name: hello\nspec:\n  \
                         template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: main\n        \
                         image: busybox\n";
    const MISSING_TEMPLATE: &str =
        "apiVersion: batch.muster.dev/v1alpha1\nkind: MusterJob\nmetadata:\n  name: x\nspec: {}\n";

    #[test]
    fn tags() {
        assert_eq!(kind_of("yaml"), Some(Ok(Kind::Manifest)));
        assert_eq!(kind_of("yaml,invalid"), Some(Ok(Kind::Invalid)));
        assert_eq!(kind_of("yaml,values title=x"), Some(Ok(Kind::Values)));
        assert_eq!(kind_of("yaml,excerpt"), Some(Ok(Kind::Excerpt)));
        assert!(matches!(kind_of("yaml,foo"), Some(Err(e)) if e.contains("yaml,foo")));
        assert!(matches!(kind_of("yml"), Some(Err(_))));
        assert_eq!(kind_of("console"), None);
        assert_eq!(kind_of(""), None);
    }

    #[test]
    fn manifests_go_through_muster_validate() {
        let t = tools("/bin/false");
        let chart = Path::new("charts/muster");
        let ok = check(Kind::Manifest, VALID, "p.md:3", 1, &t, chart);
        assert!(ok.failures.is_empty(), "{:?}", ok.failures);
        assert_eq!(ok.objects, 1);

        let bad = check(Kind::Manifest, MISSING_TEMPLATE, "p.md:9", 2, &t, chart);
        assert_eq!(bad.failures.len(), 1, "{:?}", bad.failures);
        assert!(bad.failures[0].starts_with("p.md:9: ```yaml block fails `muster validate`"), "{:?}", bad.failures);

        let no_kind = check(Kind::Manifest, "apiVersion: v1\nmetadata: {name: x}\n", "p.md:1", 3, &t, chart);
        assert!(no_kind.failures.iter().any(|f| f.contains("no kind")), "{:?}", no_kind.failures);
    }

    #[test]
    fn an_invalid_block_that_validates_is_reported() {
        let t = tools("/bin/false");
        let chart = Path::new("charts/muster");
        let wrong = check(Kind::Invalid, VALID, "p.md:20", 1, &t, chart);
        assert_eq!(wrong.failures.len(), 1, "{:?}", wrong.failures);
        assert!(wrong.failures[0].starts_with("p.md:20: ```yaml,invalid block: `muster validate` exits Some(0)"));

        let right = check(Kind::Invalid, MISSING_TEMPLATE, "p.md:30", 2, &t, chart);
        assert!(right.failures.is_empty(), "{:?}", right.failures);
        assert_eq!(right.objects, 1);

        // Not YAML muster can read at all (exit 2): not an intentional validation error.
        let garbage = check(
            Kind::Invalid,
            "apiVersion: batch.muster.dev/v1alpha1\nkind: MusterJob\nspec: [\n",
            "p.md:40",
            3,
            &t,
            chart,
        );
        assert_eq!(garbage.failures.len(), 1, "{:?}", garbage.failures);
    }

    #[test]
    fn values_and_excerpts() {
        let chart = Path::new("charts/muster");
        let passing = tools("/bin/true");
        assert!(check(Kind::Values, "replicaCount: 2\n", "v.md:1", 1, &passing, chart).failures.is_empty());
        let failing = tools("/bin/false");
        let v = check(Kind::Values, "replicaCount: 2\n", "v.md:5", 1, &failing, chart);
        assert_eq!(v.failures.len(), 1);
        assert!(v.failures[0].starts_with("v.md:5: ```yaml,values block: `helm template"), "{:?}", v.failures);

        assert!(check(Kind::Excerpt, "status:\n  phase: Running\n", "e.md:1", 1, &failing, chart).failures.is_empty());
        let broken = check(Kind::Excerpt, "status:\n  phase: [Running\n", "e.md:7", 2, &failing, chart);
        assert_eq!(broken.failures.len(), 1);
        assert!(
            broken.failures[0].starts_with("e.md:7: ```yaml,excerpt block is not valid YAML"),
            "{:?}",
            broken.failures
        );
    }

    #[test]
    fn field_paths() {
        assert!(names_a_field("spec: Invalid value: missing field `template`"));
        assert!(names_a_field("spec.template.spec.containers[0].name: Required value"));
        assert!(!names_a_field("The MusterJob \"x\" (/tmp/x.yaml) is invalid:"));
        assert!(!names_a_field("MusterJob/hello (f.yaml): valid"));
    }
}
