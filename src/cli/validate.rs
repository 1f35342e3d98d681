//! `muster validate`: the schema-level and builder validation the cluster would run, offline.
//! Exit 0 when every MusterJob/MusterJobSet is valid (or there is none), 1 when one is not, 2 on
//! unreadable or unparsable input. Other kinds are skipped with a note on stderr.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::crds::{MusterJob, MusterJobSet};
use crate::workloadbuilder::field::{ErrorList, FieldError, FieldPath, quote};
use crate::workloadbuilder::job::{validate_job, validate_jobset};

/// Arguments of `muster validate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Manifest file(s) or directories to check (multi-document YAML or JSON; a directory means
    /// its `*.yaml`, `*.yml` and `*.json` files, not recursive; `-` reads standard input).
    #[arg(short = 'f', long = "filename", required = true)]
    files: Vec<PathBuf>,
    /// The objects as they are now: the manifests are then checked as updates of them.
    #[arg(long = "old")]
    old: Vec<PathBuf>,
}

/// One MusterJob or MusterJobSet read from a manifest.
#[derive(Debug)]
pub enum Manifest {
    /// A MusterJob.
    Job(Box<MusterJob>),
    /// A MusterJobSet.
    JobSet(Box<MusterJobSet>),
}

/// One document of a manifest file, as far as `muster validate` is concerned.
#[derive(Debug)]
pub enum Document {
    /// A muster object that decoded; `unknown` lists fields the schema does not know.
    Object { kind: String, namespace: Option<String>, name: String, manifest: Manifest, unknown: ErrorList },
    /// A muster object that does not decode (wrong types, unknown fields).
    Undecodable { kind: String, name: String, errors: ErrorList },
    /// Some other kind; not muster's to check.
    Other { kind: String },
}

/// Reads every YAML document of `text`.
pub fn parse_documents(text: &str) -> Result<Vec<Document>, String> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?;
    Ok(docs.into_iter().filter(|v| !v.is_null()).map(classify).collect())
}

fn classify(value: Value) -> Document {
    let api_version = value.get("apiVersion").and_then(Value::as_str).unwrap_or_default().to_string();
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
    let name = value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
    let namespace = value.pointer("/metadata/namespace").and_then(Value::as_str).map(String::from);
    let group = api_version.split_once('/').map(|(g, _)| g).unwrap_or_default();
    if group != crate::crds::batch::GROUP {
        return Document::Other { kind };
    }
    let decoded = match kind.as_str() {
        "MusterJob" => decode::<MusterJob>(&value).map(|(j, u)| (Manifest::Job(Box::new(j)), u)),
        "MusterJobSet" => decode::<MusterJobSet>(&value).map(|(s, u)| (Manifest::JobSet(Box::new(s)), u)),
        _ => {
            Err(vec![FieldError::not_supported(&FieldPath::new("kind"), quote(&kind), &["MusterJob", "MusterJobSet"])])
        }
    };
    match decoded {
        Ok((manifest, unknown)) => Document::Object { kind, namespace, name, manifest, unknown },
        Err(errors) => Document::Undecodable { kind, name, errors },
    }
}

/// Decodes `value`, reporting a type error with its field path, and every field the schema
/// does not know (the apiserver would refuse them under kubectl's strict field validation).
fn decode<T: DeserializeOwned + serde::Serialize>(value: &Value) -> Result<(T, ErrorList), ErrorList> {
    let typed: T = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = FieldPath::new(&e.path().to_string());
        let mut err = FieldError::invalid(&path, "", e.into_inner().to_string());
        err.value = None;
        vec![err]
    })?;
    let round_trip = serde_json::to_value(&typed).unwrap_or(Value::Null);
    let mut unknown = Vec::new();
    unknown_fields(value, &round_trip, &FieldPath::default(), &mut unknown);
    Ok((typed, unknown))
}

fn unknown_fields(input: &Value, known: &Value, path: &FieldPath, out: &mut ErrorList) {
    match (input, known) {
        (Value::Object(i), Value::Object(k)) => {
            for (key, v) in i {
                match k.get(key) {
                    Some(kv) => unknown_fields(v, kv, &path.child(key), out),
                    None if !v.is_null() => {
                        out.push(FieldError::forbidden(&path.child(key), format!("unknown field {}", quote(key))));
                    }
                    None => {}
                }
            }
        }
        (Value::Array(i), Value::Array(k)) => {
            for (n, (iv, kv)) in i.iter().zip(k.iter()).enumerate() {
                unknown_fields(iv, kv, &path.index(n), out);
            }
        }
        _ => {}
    }
}

/// The errors of one decoded object, as an update of `old` when given.
pub fn errors_of(manifest: &Manifest, old: Option<&Manifest>) -> ErrorList {
    match (manifest, old) {
        (Manifest::Job(job), Some(Manifest::Job(o))) => validate_job(job, Some(o)),
        (Manifest::Job(job), _) => validate_job(job, None),
        (Manifest::JobSet(set), Some(Manifest::JobSet(o))) => validate_jobset(set, Some(o)),
        (Manifest::JobSet(set), _) => validate_jobset(set, None),
    }
}

/// Extensions of the manifest files read from a directory.
const MANIFEST_EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

/// The files `paths` name: each file as given, each directory as its manifest files, sorted
/// (like `kubectl apply -f DIR`, not recursive).
pub fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for p in paths {
        if p.as_os_str() == "-" || !p.is_dir() {
            out.push(p.clone());
            continue;
        }
        let entries = std::fs::read_dir(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let mut files = Vec::new();
        for entry in entries {
            let path = entry.map_err(|e| format!("{}: {e}", p.display()))?.path();
            let manifest = path.extension().and_then(|e| e.to_str()).is_some_and(|e| MANIFEST_EXTENSIONS.contains(&e));
            if manifest && path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        out.extend(files);
    }
    Ok(out)
}

fn read(path: &Path) -> Result<String, String> {
    if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map_err(|e| format!("stdin: {e}"))?;
        Ok(s)
    } else {
        std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
    }
}

fn load(paths: &[PathBuf]) -> Result<Vec<(String, Document)>, String> {
    let mut out = Vec::new();
    for p in &expand(paths)? {
        let text = read(p)?;
        let docs = parse_documents(&text).map_err(|e| format!("{}: {e}", p.display()))?;
        out.extend(docs.into_iter().map(|d| (p.display().to_string(), d)));
    }
    Ok(out)
}

/// Runs `muster validate`.
pub fn run(args: Args) -> ExitCode {
    ExitCode::from(check(&args.files, &args.old))
}

/// Checks the manifests in `files` (as updates of those in `old`), prints the verdicts, and
/// returns the exit status: 0 valid (or nothing to check), 1 invalid, 2 unreadable.
fn check(files: &[PathBuf], old: &[PathBuf]) -> u8 {
    let (new, old) = match (load(files), load(old)) {
        (Ok(n), Ok(o)) => (n, o),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let olds: Vec<Old<'_>> = old
        .iter()
        .filter_map(|(file, d)| match d {
            Document::Object { kind, namespace, name, manifest, .. } => {
                Some(Old { file, kind, namespace: namespace.as_deref(), name, manifest })
            }
            _ => None,
        })
        .collect();
    let mut matched = std::collections::BTreeSet::new();
    let mut invalid = false;
    let mut checked = 0;
    for (file, doc) in &new {
        let (kind, name, errors) = match doc {
            Document::Other { kind } => {
                eprintln!("{file}: skipping {kind:?}: not a MusterJob or MusterJobSet");
                continue;
            }
            Document::Undecodable { kind, name, errors } => (kind, name, errors.clone()),
            Document::Object { kind, namespace, name, manifest, unknown } => {
                let mut errors = unknown.clone();
                let previous = if olds.is_empty() {
                    None
                } else {
                    match find_old(&olds, kind, namespace.as_deref(), name) {
                        OldMatch::One(i) => {
                            matched.insert(i);
                            Some(olds[i].manifest)
                        }
                        miss => {
                            eprintln!(
                                "warning: {file}: {kind} {}: {}; checked as a create",
                                show(namespace, name),
                                miss.why()
                            );
                            None
                        }
                    }
                };
                errors.extend(errors_of(manifest, previous));
                (kind, name, errors)
            }
        };
        checked += 1;
        if errors.is_empty() {
            println!("{kind}/{name} ({file}): valid");
        } else {
            invalid = true;
            println!("The {kind} {name:?} ({file}) is invalid:");
            for e in &errors {
                println!("{e}");
            }
        }
    }
    for (i, o) in olds.iter().enumerate() {
        if !matched.contains(&i) {
            eprintln!(
                "warning: {}: {} {}: no object of that kind, namespace and name among the manifests checked",
                o.file,
                o.kind,
                show(&o.namespace.map(String::from), o.name)
            );
        }
    }
    if checked == 0 {
        eprintln!("note: no MusterJob or MusterJobSet found; nothing to check");
    }
    u8::from(invalid)
}

/// `namespace/name`, or the name alone when no namespace is given.
fn show(namespace: &Option<String>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

/// An object of the `--old` files.
#[derive(Debug)]
pub struct Old<'a> {
    /// The file it is in.
    pub file: &'a str,
    /// Its kind.
    pub kind: &'a str,
    /// Its namespace, when the manifest names one.
    pub namespace: Option<&'a str>,
    /// Its name.
    pub name: &'a str,
    /// The object.
    pub manifest: &'a Manifest,
}

/// What an object of the manifests checked matches among the `--old` objects.
#[derive(Debug, PartialEq, Eq)]
pub enum OldMatch {
    /// The old object at this index.
    One(usize),
    /// None of that kind, namespace and name.
    None,
    /// No namespace given, and that kind and name is in several namespaces.
    Ambiguous(usize),
}

impl OldMatch {
    fn why(&self) -> String {
        match self {
            OldMatch::One(_) => String::new(),
            OldMatch::None => "no old object of that kind, namespace and name in the --old files".into(),
            OldMatch::Ambiguous(n) => {
                format!("no namespace given, and the --old files have {n} objects of that kind and name")
            }
        }
    }
}

/// PURE: the old object an object is an update of: the same kind and name, and the same
/// namespace where both name one; a manifest naming none (applied to the context's
/// namespace) matches the one old object of that kind and name, whatever its namespace.
pub fn find_old(olds: &[Old<'_>], kind: &str, namespace: Option<&str>, name: &str) -> OldMatch {
    let same: Vec<usize> = olds
        .iter()
        .enumerate()
        .filter(|(_, o)| o.kind == kind && o.name == name)
        .filter(|(_, o)| match (namespace, o.namespace) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        })
        .map(|(i, _)| i)
        .collect();
    match same.as_slice() {
        [] => OldMatch::None,
        [one] => OldMatch::One(*one),
        many => OldMatch::Ambiguous(many.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID_JOB: &str = "apiVersion: batch.muster.dev/v1alpha1\nkind: MusterJob\nmetadata: {name: ok}\nspec:\n  template: {spec: {containers: [{name: c, image: x}]}}\n";
    const INVALID_JOB: &str = "apiVersion: batch.muster.dev/v1alpha1\nkind: MusterJob\nmetadata: {name: bad}\nspec:\n  parallelism: 1\n  scheduling: {schedulingPolicy: {gang: {minCount: 2}}}\n  template: {spec: {containers: [{name: c, image: x}]}}\n";
    const CONFIG_MAP: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\ndata: {a: b}\n";

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write fixture");
        path
    }

    #[test]
    fn a_directory_means_its_manifest_files_sorted_not_recursive() {
        let dir = tempfile::tempdir().expect("tempdir");
        let b = write(dir.path(), "b.yml", VALID_JOB);
        let a = write(dir.path(), "a.yaml", VALID_JOB);
        let c = write(dir.path(), "c.json", "{}");
        write(dir.path(), "README.md", "# not a manifest");
        std::fs::create_dir(dir.path().join("nested.yaml")).expect("mkdir");
        write(&dir.path().join("nested.yaml"), "deep.yaml", INVALID_JOB);
        let single = write(dir.path(), "single.txt", VALID_JOB);
        let listed = expand(&[dir.path().to_path_buf(), single.clone()]).expect("expand");
        assert_eq!(listed, vec![a, b, c, single], "a file named on its own is read whatever its name");
    }

    #[test]
    fn a_directory_of_valid_manifests_and_other_kinds_exits_0() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "job.yaml", VALID_JOB);
        write(dir.path(), "mixed.yaml", &format!("{CONFIG_MAP}---\n{VALID_JOB}"));
        write(dir.path(), "service.json", r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}"#);
        assert_eq!(check(&[dir.path().to_path_buf()], &[]), 0);
    }

    #[test]
    fn an_invalid_manifest_in_a_directory_exits_1() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "a.yaml", VALID_JOB);
        write(dir.path(), "b.yaml", INVALID_JOB);
        assert_eq!(check(&[dir.path().to_path_buf()], &[]), 1);
    }

    #[test]
    fn no_muster_object_at_all_is_not_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cm = write(dir.path(), "cm.yaml", CONFIG_MAP);
        assert_eq!(check(std::slice::from_ref(&cm), &[]), 0);
        let empty = tempfile::tempdir().expect("tempdir");
        assert_eq!(check(&[empty.path().to_path_buf()], &[]), 0);
    }

    #[test]
    fn unreadable_or_unparsable_input_exits_2() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(check(&[dir.path().join("missing.yaml")], &[]), 2);
        let broken = write(dir.path(), "broken.yaml", "kind: [unclosed\n");
        assert_eq!(check(&[broken], &[]), 2);
        write(dir.path(), "ok.yaml", VALID_JOB);
        write(dir.path(), "z-broken.json", "{\"kind\": ");
        assert_eq!(check(&[dir.path().to_path_buf()], &[]), 2, "one unparsable file in a directory");
    }

    /// A valid MusterJob `name` in `namespace` (none when empty), its container's image `image`.
    fn job(namespace: &str, name: &str, image: &str) -> String {
        let ns = if namespace.is_empty() { String::new() } else { format!(", namespace: {namespace}") };
        format!(
            "apiVersion: batch.muster.dev/v1alpha1\nkind: MusterJob\nmetadata: {{name: {name}{ns}}}\nspec:\n  template: {{spec: {{containers: [{{name: c, image: {image}}}]}}}}\n"
        )
    }

    #[test]
    fn an_update_is_checked_against_the_old_object_of_its_kind_namespace_and_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = write(
            dir.path(),
            "old.yaml",
            &format!("{}---\n{}", job("a", "train", "img-x"), job("b", "other", "img-x")),
        );
        // The template is frozen: a changed image is refused as an update of a/train.
        let changed = write(dir.path(), "new.yaml", &job("a", "train", "img-y"));
        assert_eq!(check(std::slice::from_ref(&changed), std::slice::from_ref(&old)), 1);
        // Without a namespace it is applied to the context's: the one old a/train matches.
        let bare = write(dir.path(), "bare.yaml", &job("", "train", "img-y"));
        assert_eq!(check(std::slice::from_ref(&bare), std::slice::from_ref(&old)), 1);
        // In another namespace it has no old object: a create (with a warning), valid.
        let elsewhere = write(dir.path(), "elsewhere.yaml", &job("c", "train", "img-y"));
        assert_eq!(check(std::slice::from_ref(&elsewhere), std::slice::from_ref(&old)), 0);
    }

    #[test]
    fn yaml_is_read_as_kubectl_reads_it() {
        let docs = parse_documents(&job("", "train", "y")).expect("parse");
        let [Document::Undecodable { errors, .. }] = docs.as_slice() else { panic!("{docs:?}") };
        assert!(errors[0].to_string().contains("boolean"), "{errors:?}");
        let value: Value = serde_saphyr::from_str("a: no\nb: on\nc: \"y\"\nd: 4\n").expect("yaml");
        assert_eq!(value, serde_json::json!({"a": false, "b": true, "c": "y", "d": 4}));
    }

    #[test]
    fn old_objects_match_by_kind_namespace_and_name() {
        let Document::Object { manifest, .. } = classify(serde_saphyr::from_str(VALID_JOB).expect("yaml")) else {
            panic!("a MusterJob")
        };
        let old = |kind, namespace, name| Old { file: "old.yaml", kind, namespace, name, manifest: &manifest };
        let olds = [
            old("MusterJob", Some("a"), "train"),
            old("MusterJob", Some("b"), "train"),
            old("MusterJobSet", Some("a"), "set"),
        ];
        let cases = [
            ("same kind, namespace and name", "MusterJob", Some("a"), "train", OldMatch::One(0)),
            ("the other namespace", "MusterJob", Some("b"), "train", OldMatch::One(1)),
            ("a namespace with none", "MusterJob", Some("c"), "train", OldMatch::None),
            ("another kind of that name", "MusterJobSet", Some("a"), "train", OldMatch::None),
            ("no namespace, in two", "MusterJob", None, "train", OldMatch::Ambiguous(2)),
            ("no namespace, in one", "MusterJobSet", None, "set", OldMatch::One(2)),
            ("no such name", "MusterJob", Some("a"), "eval", OldMatch::None),
        ];
        for (case, kind, namespace, name, want) in cases {
            assert_eq!(find_old(&olds, kind, namespace, name), want, "{case}");
        }
        let unnamespaced = [old("MusterJob", None, "train")];
        assert_eq!(
            find_old(&unnamespaced, "MusterJob", Some("z"), "train"),
            OldMatch::One(0),
            "an old manifest naming none"
        );
    }

    #[test]
    fn the_repository_examples_are_valid() {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        assert_eq!(check(&[examples.clone(), examples.join("dra")], &[]), 0);
    }
}
