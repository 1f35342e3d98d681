//! The catalog against the code: what the code uses is catalogued, what is catalogued is used,
//! and the pages are well formed.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;

use super::render::{condition_anchor, condition_reason_anchor, event_anchor, key_anchor};
use super::scan::{self, Found, What};
use super::{CONDITIONS, EVENTS, KEYS, pages, slug};

/// `muster.dev` literals in code that are not labels, annotations, gates or finalizers.
const KEY_ALLOW: &[&str] = &[
    // API group/versions of muster's kinds.
    "batch.muster.dev/v1alpha1",
    "scheduling.muster.dev/v1alpha1",
    "gpu.muster.dev/v1alpha1",
    // The prefix an owner reference's apiVersion is tested with.
    "batch.muster.dev/",
    // Values of `spec.managedBy` naming muster's own controllers.
    "batch.muster.dev/job-controller",
    "batch.muster.dev/jobset-controller",
    // Admission's in-memory marks on a pod kept as a minimal record, never written to the API
    // server: an annotation, and the resource such a pod asks for.
    "scheduling.muster.dev/kept-minimal",
    "scheduling.muster.dev/pod-too-large",
    // Labels the benchmark tools (`muster dev bench`, `muster dev agent-load`) put on the
    // objects they make in their test clusters, to find them again.
    "bench.muster.dev/pod",
    "bench.muster.dev/node",
    "bench.muster.dev/user-probe",
    "agent-load.muster.dev/node",
    // The prefix of JobSet's keys, which a set's children pass on to their pods.
    "jobset.sigs.k8s.io/",
];

/// Reason-shaped literals the reason rules catch that are neither event nor condition reasons.
const REASON_ALLOW: &[&str] = &[
    // Short reasons of a group that does not fit (`status.reason` of a PodGroup or
    // CompositePodGroup, the `reason` label of `muster_unschedulable_total`), not conditions.
    "PlanTooLarge",
    "ClaimsPending",
    // The `reason` label of a metric for a reason that is not muster's own word.
    "Other",
    // What `conditions::set` writes for an empty reason; every caller passes one.
    "Unknown",
];

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// Every non-dynamic reason of the events page.
fn event_reasons() -> HashSet<&'static str> {
    EVENTS.iter().filter(|e| !e.dynamic).map(|e| e.reason).collect()
}

/// Every non-dynamic reason of the conditions page.
fn condition_reasons() -> HashSet<&'static str> {
    CONDITIONS.iter().flat_map(|c| c.reasons.iter()).filter(|r| !r.dynamic).map(|r| r.reason).collect()
}

/// What of `found` the catalog (and the allow-lists) lack, one line each, naming the file.
fn missing(found: &[Found]) -> Vec<String> {
    let keys: HashSet<&str> = KEYS.iter().map(|k| k.key).chain(KEY_ALLOW.iter().copied()).collect();
    let events = event_reasons();
    let reasons = condition_reasons();
    let invalid: HashSet<&str> =
        CONDITIONS.iter().filter(|c| c.type_ == "Invalid").flat_map(|c| c.reasons.iter()).map(|r| r.reason).collect();
    let types: HashSet<&str> = CONDITIONS.iter().map(|c| c.type_).collect();
    let mut out = BTreeSet::new();
    for f in found {
        let v = f.value.as_str();
        let (ok, want) = match f.what {
            What::Key => (keys.contains(v), "a key in catalog/keys.rs (or KEY_ALLOW)"),
            What::EventReason => (events.contains(v), "an event reason in catalog/events.rs"),
            What::InvalidReason => (
                events.contains(v) && invalid.contains(v),
                "an event reason in catalog/events.rs and an `Invalid` reason in catalog/conditions.rs",
            ),
            What::ConditionType => (types.contains(v), "a condition type in catalog/conditions.rs"),
            What::ConditionReason => (reasons.contains(v), "a condition reason in catalog/conditions.rs"),
            What::Reason => (
                events.contains(v) || reasons.contains(v) || REASON_ALLOW.contains(&v),
                "an event or condition reason in the catalog (or REASON_ALLOW)",
            ),
        };
        if !ok {
            out.insert(format!("{}:{}: {v:?} is not {want}", f.file, f.line));
        }
    }
    out.into_iter().collect()
}

/// Every literal of the workspace's non-test sources, and everything the scanner finds.
fn workspace() -> (HashSet<String>, Vec<Found>) {
    let sources = scan::workspace_sources(root());
    assert!(sources.len() > 100, "read only {} source files from {}", sources.len(), root().display());
    let mut literals = HashSet::new();
    let mut found = Vec::new();
    for (path, text) in &sources {
        literals.extend(scan::mask(scan::strip_tests(text)).literals.into_iter().map(|(_, v)| v));
        found.extend(scan::scan(path, text, scan::reason_scope(path)));
    }
    (literals, found)
}

#[test]
fn every_key_and_reason_the_code_uses_is_catalogued() {
    let (_, found) = workspace();
    // The scan finds the well-known ones (a scanner gone blind would pass everything).
    for (what, value) in [
        (What::Key, "scheduling.muster.dev/pod-group"),
        (What::EventReason, "SuccessfulCreate"),
        (What::EventReason, "Admitted"),
        (What::InvalidReason, "InvalidSpec"),
        (What::ConditionType, "Admitted"),
        (What::ConditionReason, "WaitingForQuorum"),
        (What::Reason, "GPUConflict"),
    ] {
        assert!(found.iter().any(|f| f.what == what && f.value == value), "the scan no longer finds {what:?} {value}");
    }
    let missing = missing(&found);
    assert!(missing.is_empty(), "used in code, missing from the catalog:\n{}", missing.join("\n"));
}

#[test]
fn no_catalog_entry_is_stale() {
    let (literals, _) = workspace();
    // The simulated kubelet of the test clusters reads its keys in its KWOK stages, not in Rust.
    let stages = std::fs::read_to_string(root().join("hack/kwok/stages.yaml")).expect("hack/kwok/stages.yaml");
    let mut stale = Vec::new();
    for k in KEYS {
        let in_stages = k.origin == super::Origin::DevTools && stages.contains(&format!("\"{}\"", k.key));
        if !literals.contains(k.key) && !in_stages {
            stale.push(format!("key {}", k.key));
        }
    }
    for e in EVENTS.iter().filter(|e| !e.dynamic) {
        if !literals.contains(e.reason) {
            stale.push(format!("event reason {} ({})", e.reason, e.on));
        }
    }
    for c in CONDITIONS {
        if !literals.contains(c.type_) {
            stale.push(format!("condition type {} ({})", c.type_, c.kind));
        }
        for r in c.reasons.iter().filter(|r| !r.dynamic) {
            if !literals.contains(r.reason) {
                stale.push(format!("condition reason {} of {} ({})", r.reason, c.type_, c.kind));
            }
        }
    }
    for allowed in KEY_ALLOW.iter().chain(REASON_ALLOW) {
        if !literals.contains(*allowed) {
            stale.push(format!("allow-listed {allowed}"));
        }
    }
    assert!(stale.is_empty(), "in the catalog, in no source:\n{}", stale.join("\n"));
}

/// A source with one of each thing the checks must catch, and things they must not.
const PLANTED: &str = r#"
// "scheduling.muster.dev/in-a-comment" is no key.
pub const NEW_ANNOTATION: &str = "scheduling.muster.dev/brand-new";
pub mod condition {
    pub const NEW_TYPE: &str = "BrandNewType";
}
pub mod reason {
    pub const NEW_REASON: (&str, &str) = ("BrandNewModuleReason", "Its message");
    pub const NEW_REASON_MESSAGE: &str = "NotAReason";
}
async fn f(ctx: &Context, r: &ObjectReference, list: &mut Vec<Condition>) {
    ctx.event(r, true, "BrandNewEvent", "Admit", format!("a, b (c)")).await;
    ctx.event(r, false, "SuccessfulCreate", "CreatePods", "known").await;
    conditions::set(list, "PlantedType", true, "PlantedReason", "msg", None, now);
    set_invalid(job, ctx, "PlantedInvalid", &message, now, None).await;
    let (reason, note) = if x { ("PlantedLet", "a note") } else { ("Resumed", "b") };
    let p = Problem { reason: "PlantedField", message: String::new() };
    return Err(("PlantedRefusal", format!("x")));
    let c = '"';
}
#[cfg(test)]
mod tests {
    const IN_TESTS: &str = "scheduling.muster.dev/only-in-tests";
    fn t(ctx: &Context) { ctx.event(r, true, "OnlyInTests", "Admit", "n"); }
}
"#;

#[test]
fn the_scanner_finds_planted_literals() {
    let found = scan::scan("src/controllers/planted.rs", PLANTED, true);
    let values: Vec<(What, &str)> = found.iter().map(|f| (f.what, f.value.as_str())).collect();
    for want in [
        (What::Key, "scheduling.muster.dev/brand-new"),
        (What::ConditionType, "BrandNewType"),
        (What::Reason, "BrandNewModuleReason"),
        (What::EventReason, "BrandNewEvent"),
        (What::EventReason, "SuccessfulCreate"),
        (What::ConditionType, "PlantedType"),
        (What::ConditionReason, "PlantedReason"),
        (What::InvalidReason, "PlantedInvalid"),
        (What::Reason, "PlantedLet"),
        (What::Reason, "PlantedField"),
        (What::Reason, "PlantedRefusal"),
    ] {
        assert!(values.contains(&want), "{want:?} not found in {values:?}");
    }
    for not in [
        "scheduling.muster.dev/in-a-comment",
        "scheduling.muster.dev/only-in-tests",
        "OnlyInTests",
        "NotAReason",
        "a note",
        "Admit",
    ] {
        assert!(!values.iter().any(|(_, v)| *v == not), "{not} found: {values:?}");
    }
    // The check names each planted thing, with its file and line, and not the known ones.
    let missing = missing(&found);
    for name in [
        "scheduling.muster.dev/brand-new",
        "BrandNewType",
        "BrandNewModuleReason",
        "BrandNewEvent",
        "PlantedType",
        "PlantedReason",
        "PlantedInvalid",
        "PlantedLet",
        "PlantedField",
        "PlantedRefusal",
    ] {
        assert!(
            missing.iter().any(|m| m.starts_with("src/controllers/planted.rs:") && m.contains(&format!("{name:?}"))),
            "{name} not reported: {missing:#?}"
        );
    }
    assert!(!missing.iter().any(|m| m.contains("\"SuccessfulCreate\"") || m.contains("\"Resumed\"")), "{missing:#?}");
    assert!(missing.iter().any(|m| m.starts_with("src/controllers/planted.rs:3:")), "line numbers: {missing:#?}");
    // Outside the controllers and the core, only keys are looked for.
    let outside = scan::scan("src/cli/planted.rs", PLANTED, false);
    assert!(outside.iter().all(|f| f.what == What::Key) && !outside.is_empty(), "{outside:?}");
}

#[test]
fn masking_keeps_offsets_and_reads_escapes_and_raw_strings() {
    let text = "let a = \"x\\\"y\"; /* \"no\" */ let b = r#\"q\"w\"#; let c = '(';";
    let s = scan::mask(text);
    assert_eq!(s.masked.len(), text.len());
    let values: Vec<&str> = s.literals.iter().map(|(_, v)| v.as_str()).collect();
    assert_eq!(values, ["x\"y", "q\"w"]);
    assert!(!String::from_utf8_lossy(&s.masked).contains('('), "a char literal's paren is masked");
    assert_eq!(scan::strip_tests("a\n#[cfg(test)]\nmod tests;\nb\n"), "a\n#[cfg(test)]\nmod tests;\nb\n");
    assert_eq!(scan::strip_tests("a\n#[cfg(test)]\nmod tests {\nb\n}\n"), "a\n");
}

#[test]
fn pages_are_three_complete_pages_with_unique_anchors() {
    let pages = pages();
    let names: Vec<&str> = pages.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["labels-annotations.md", "events.md", "conditions.md"]);
    assert_eq!(pages, super::pages(), "not deterministic");
    for (name, page) in &pages {
        assert!(page.starts_with("# "), "{name} has no title");
        assert!(page.contains("\n|---|"), "{name} has no table");
        // Every table row has as many cells as its header (no unescaped `|` in a cell).
        let mut columns = 0;
        for line in page.lines().filter(|l| l.starts_with('|')) {
            let cells = line.replace("\\|", "").matches('|').count();
            if line.starts_with("|---") || columns == 0 {
                columns = cells;
            }
            assert_eq!(cells, columns, "{name}: {line}");
        }
        let mut ids = HashSet::new();
        for id in page.split("<a id=\"").skip(1).map(|s| &s[..s.find('"').unwrap_or(0)]) {
            assert!(ids.insert(id), "{name}: anchor {id} twice");
        }
    }
    let [(_, keys), (_, events), (_, conditions)] = &pages[..] else { unreachable!() };
    for k in KEYS {
        assert!(keys.contains(&format!("<a id=\"{}\"></a>`{}`", key_anchor(k.key), k.key)), "{}", k.key);
    }
    for e in EVENTS {
        assert!(events.contains(&format!("<a id=\"{}\"></a>", event_anchor(e.reason))), "{}", e.reason);
    }
    for c in CONDITIONS {
        assert!(conditions.contains(&format!("<a id=\"{}\"></a>", condition_anchor(c.kind, c.type_))));
        for r in c.reasons {
            assert!(
                conditions.contains(&format!("<a id=\"{}\"></a>", condition_reason_anchor(c.kind, c.type_, r.reason)))
            );
        }
    }
    assert_eq!(key_anchor("scheduling.muster.dev/pod-group"), "key-scheduling-muster-dev-pod-group");
    assert_eq!(event_anchor("FailurePolicy_<rule>"), "event-failurepolicy-rule");
    assert_eq!(
        condition_reason_anchor("PodGroup", "Admitted", "WaitingForQuorum"),
        "condition-podgroup-admitted-waitingforquorum"
    );
    assert_eq!(slug("--A|b--"), "a-b");
}

#[test]
fn catalog_entries_are_unique_and_keys_use_the_constants() {
    let mut keys = HashSet::new();
    for k in KEYS {
        assert!(keys.insert(k.key), "key {} twice", k.key);
        assert!(!k.meaning.is_empty() && !k.on.is_empty() && !k.written_by.is_empty() && !k.read_by.is_empty());
    }
    for constant in
        [crate::POD_GROUP_LABEL, crate::ADMISSION_GATE, crate::GPU_INDICES_ANNOTATION, crate::SCHEDULING_API_ANNOTATION]
    {
        assert!(keys.contains(constant), "{constant}");
    }
    let mut events = HashSet::new();
    for e in EVENTS {
        assert!(events.insert((e.reason, e.on, e.action)), "event {} on {} twice", e.reason, e.on);
    }
    let mut types = HashSet::new();
    for c in CONDITIONS {
        assert!(types.insert((c.kind, c.type_)), "condition {} on {} twice", c.type_, c.kind);
        assert!(!c.reasons.is_empty(), "{} on {} has no reasons", c.type_, c.kind);
        let mut reasons = HashSet::new();
        for r in c.reasons {
            assert!(reasons.insert(r.reason), "{} of {} on {} twice", r.reason, c.type_, c.kind);
        }
    }
}
