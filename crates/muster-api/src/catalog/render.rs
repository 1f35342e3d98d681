//! The catalog as mdBook pages: GitHub-flavoured markdown tables, `|` escaped in cells, in a
//! deterministic order, each key, reason and condition with a stable anchor.

use super::{ConditionEntry, EventEntry, KeyEntry, Origin, slug};

/// A table cell: `|` escaped, line breaks made spaces.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// `text` as inline code in a cell (`|` escaped inside too: GitHub's tables split on it).
fn code(text: &str) -> String {
    format!("`{}`", cell(text))
}

fn anchor(id: &str) -> String {
    format!("<a id=\"{id}\"></a>")
}

/// The anchor of a key's row.
pub fn key_anchor(key: &str) -> String {
    format!("key-{}", slug(key))
}

/// The anchor of an event reason's first row.
pub fn event_anchor(reason: &str) -> String {
    format!("event-{}", slug(reason))
}

/// The anchor of a condition type's first row.
pub fn condition_anchor(kind: &str, type_: &str) -> String {
    format!("condition-{}-{}", slug(kind), slug(type_))
}

/// The anchor of one reason of a condition type.
pub fn condition_reason_anchor(kind: &str, type_: &str, reason: &str) -> String {
    format!("condition-{}-{}-{}", slug(kind), slug(type_), slug(reason))
}

/// The page of keys: muster's, then Kubernetes', JobSet's and the test tools', each sorted by key.
pub fn keys_page(keys: &[KeyEntry]) -> String {
    let mut out = String::from("# Labels, annotations, gates and finalizers\n\n");
    out.push_str(
        "Every label, annotation, scheduling gate and finalizer muster writes or reads, on which objects, \
         who writes and reads it, and what it means. muster's own keys are under `muster.dev`; the keys of \
         Kubernetes and JobSet it uses follow, then those of the test clusters. This page is generated from `crates/muster-api/src/catalog/keys.rs`, \
         and `make test` fails when the code uses a `muster.dev` key the catalog lacks.\n",
    );
    let sections: [(Origin, &str, &str); 4] = [
        (Origin::Muster, "muster's keys", ""),
        (
            Origin::Kubernetes,
            "Kubernetes keys muster uses",
            "Keys that belong to Kubernetes, read or written by muster as noted.\n\n",
        ),
        (
            Origin::JobSet,
            "JobSet keys muster writes",
            "muster writes JobSet's keys on a MusterJobSet's children, their pod templates and pods as JobSet does on \
             its Jobs, so selectors and tools written for JobSet keep working.\n\n",
        ),
        (
            Origin::DevTools,
            "Keys of the test tools",
            "Keys of the test clusters (`muster dev`, the simulated nodes of `make demo` and the e2e tests); muster \
             itself gives them no meaning.\n\n",
        ),
    ];
    for (origin, title, intro) in sections {
        let mut rows: Vec<&KeyEntry> = keys.iter().filter(|k| k.origin == origin).collect();
        if rows.is_empty() {
            continue;
        }
        rows.sort_by(|a, b| a.key.cmp(b.key));
        out.push_str(&format!("\n## {title}\n\n{intro}"));
        out.push_str("| Key | Kind | On | Written by | Read by | Meaning |\n|---|---|---|---|---|---|\n");
        for k in rows {
            out.push_str(&format!(
                "| {}{} | {} | {} | {} | {} | {} |\n",
                anchor(&key_anchor(k.key)),
                code(k.key),
                k.kind.as_str(),
                cell(k.on),
                cell(k.written_by),
                cell(k.read_by),
                cell(k.meaning),
            ));
        }
    }
    out
}

/// The page of event reasons, sorted by reason, object and action, the dynamic ones last.
pub fn events_page(events: &[EventEntry]) -> String {
    let mut out = String::from("# Events\n\n");
    out.push_str(
        "Every event muster publishes (reporting controller `muster`), by reason: its type, the object it is on, \
         its action and when it happens. `kubectl events --for <kind>/<name>` shows them. muster sends them from \
         two writers of its own, as client-go's broadcaster does for kube-controller-manager, so nothing waits \
         on them: past 512 waiting per writer (a burst of thousands of new gangs) an event is dropped and \
         counted in `muster_events_dropped_total`. A reason in angle \
         brackets is not fixed: the event carries the reason named there. This page is generated from \
         `crates/muster-api/src/catalog/events.rs`, and `make test` fails when the code publishes a reason the \
         catalog lacks.\n\n",
    );
    out.push_str("| Reason | Type | On | Action | When |\n|---|---|---|---|---|\n");
    let mut rows: Vec<&EventEntry> = events.iter().collect();
    // Fixed reasons first, by reason, object and action; the dynamic ones after.
    rows.sort_by(|a, b| (a.dynamic, a.reason, a.on, a.action).cmp(&(b.dynamic, b.reason, b.on, b.action)));
    let mut previous = "";
    for e in rows {
        // The anchor goes on the first row of a reason; a dynamic one's text is its own anchor.
        let first = e.reason != previous;
        previous = e.reason;
        let id = if first { anchor(&event_anchor(e.reason)) } else { String::new() };
        out.push_str(&format!(
            "| {id}{} | {} | {} | {} | {} |\n",
            code(e.reason),
            e.type_.as_str(),
            cell(e.on),
            code(e.action),
            cell(e.when),
        ));
    }
    out
}

/// The page of conditions: a section per kind (in catalog order), types sorted, reasons in
/// catalog order.
pub fn conditions_page(conditions: &[ConditionEntry]) -> String {
    let mut out = String::from("# Conditions\n\n");
    out.push_str(
        "Every condition muster sets in `status.conditions`, by kind: its type, the reasons it can carry with \
         their status, and what each means. A reason in angle brackets is not fixed: the condition carries the \
         reason named there. This page is generated from `crates/muster-api/src/catalog/conditions.rs`, and \
         `make test` fails when the code sets a condition type or reason the catalog lacks.\n",
    );
    let mut kinds: Vec<&str> = Vec::new();
    for c in conditions {
        if !kinds.contains(&c.kind) {
            kinds.push(c.kind);
        }
    }
    for kind in kinds {
        let mut types: Vec<&ConditionEntry> = conditions.iter().filter(|c| c.kind == kind).collect();
        types.sort_by(|a, b| a.type_.cmp(b.type_));
        out.push_str(&format!("\n## {kind}\n\n"));
        out.push_str("| Type | Meaning | Status | Reason | Reason means |\n|---|---|---|---|---|\n");
        for c in types {
            for (i, r) in c.reasons.iter().enumerate() {
                let (type_cell, meaning) = if i == 0 {
                    (format!("{}{}", anchor(&condition_anchor(kind, c.type_)), code(c.type_)), cell(c.meaning))
                } else {
                    (String::new(), String::new())
                };
                out.push_str(&format!(
                    "| {type_cell} | {meaning} | {} | {}{} | {} |\n",
                    r.status.as_str(),
                    anchor(&condition_reason_anchor(kind, c.type_, r.reason)),
                    code(r.reason),
                    cell(r.meaning),
                ));
            }
        }
    }
    out
}
