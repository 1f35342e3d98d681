//! The API reference, from the CustomResourceDefinitions muster serves ([`crate::crds::all`]):
//! an index, and a page per CRD with its names, versions, printer columns and every field of
//! its schema. Embedded Kubernetes types (the pod template, a label selector, conditions) are
//! not expanded: the generator stops at the paths of [`CUTS`] and names the type.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::md;

/// Where the field table stops: a path of a CRD whose schema is a type documented elsewhere.
pub struct Cut {
    /// The CRD's kind.
    pub kind: &'static str,
    /// The field path (`[]`: the items of an array), e.g. `spec.template`.
    pub path: &'static str,
    /// What the field is.
    pub target: Target,
}

/// What a cut field is.
pub enum Target {
    /// A Kubernetes type: its name, API group/version and where it is documented.
    Kubernetes { ty: &'static str, api: &'static str, url: &'static str },
    /// The same schema as a field of another page (checked: equal but for the description).
    SameAs { kind: &'static str, path: &'static str },
}

const CONDITION: Target = Target::Kubernetes {
    ty: "Condition",
    api: "meta/v1",
    url: "https://pkg.go.dev/k8s.io/apimachinery/pkg/apis/meta/v1#Condition",
};

/// The cut points. A path here that is not in its CRD fails generation, and so does a page
/// over [`super::MAX_PAGE_BYTES`] (an embedded type new in the schema and not cut yet).
pub const CUTS: &[Cut] = &[
    Cut {
        kind: "MusterJob",
        path: "spec.template",
        target: Target::Kubernetes {
            ty: "PodTemplateSpec",
            api: "core/v1",
            url: "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-template-v1/#PodTemplateSpec",
        },
    },
    Cut {
        kind: "MusterJob",
        path: "spec.selector",
        target: Target::Kubernetes {
            ty: "LabelSelector",
            api: "meta/v1",
            url: "https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/label-selector/#LabelSelector",
        },
    },
    Cut {
        kind: "MusterJob",
        path: "spec.podFailurePolicy",
        target: Target::Kubernetes {
            ty: "PodFailurePolicy",
            api: "batch/v1",
            url: "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/job-v1/#JobSpec",
        },
    },
    Cut {
        kind: "MusterJob",
        path: "spec.successPolicy",
        target: Target::Kubernetes {
            ty: "SuccessPolicy",
            api: "batch/v1",
            url: "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/job-v1/#JobSpec",
        },
    },
    Cut { kind: "MusterJob", path: "status.conditions[]", target: CONDITION },
    Cut {
        kind: "MusterJobSet",
        path: "spec.replicatedJobs[].template.spec",
        target: Target::SameAs { kind: "MusterJob", path: "spec" },
    },
    Cut { kind: "MusterJobSet", path: "status.conditions[]", target: CONDITION },
    Cut { kind: "Workload", path: "status.conditions[]", target: CONDITION },
    Cut { kind: "PodGroup", path: "status.conditions[]", target: CONDITION },
    Cut { kind: "CompositePodGroup", path: "status.conditions[]", target: CONDITION },
];

/// An object subtree with at least this many schemas in it, equal to one already shown on the
/// page, is shown as a link to it (the Workload's template tree repeats its leaf templates).
const SAME_AS_MIN_NODES: usize = 8;

/// The anchor of a field path: lowercased, `.` as `-`, `[]` and `{}` left out
/// (`spec.scheduling.schedulingPolicy.gang.minCount` is
/// `spec-scheduling-schedulingpolicy-gang-mincount`).
pub fn anchor(path: &str) -> String {
    path.replace("[]", "").replace("{}", "").replace('.', "-").to_lowercase()
}

/// The file name of a kind's page.
pub fn file_name(kind: &str) -> String {
    format!("{}.md", kind.to_lowercase())
}

/// The CRDs as JSON.
fn crds() -> Result<Vec<Value>, String> {
    crate::crds::all().iter().map(|c| serde_json::to_value(c).map_err(|e| format!("CRD as JSON: {e}"))).collect()
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn strs(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

/// The index page and one page per CRD: (file name, markdown).
pub fn pages() -> Result<Vec<(String, String)>, String> {
    pages_with(&crds()?, CUTS)
}

fn pages_with(crds: &[Value], cuts: &[Cut]) -> Result<Vec<(String, String)>, String> {
    let mut out = vec![("README.md".to_string(), index(crds))];
    let by_kind: BTreeMap<String, &Value> =
        crds.iter().map(|c| (str_of(&c["spec"]["names"], "kind").to_string(), c)).collect();
    for crd in crds {
        let kind = str_of(&crd["spec"]["names"], "kind");
        out.push((file_name(kind), crd_page(crd, cuts, &by_kind)?));
    }
    for cut in cuts {
        if !by_kind.contains_key(cut.kind) {
            return Err(format!("cut point {} {}: muster serves no such kind", cut.kind, cut.path));
        }
    }
    Ok(out)
}

fn index(crds: &[Value]) -> String {
    let mut out = String::new();
    out.push_str("# API\n\n");
    out.push_str(
        "The custom resources muster serves, from their CustomResourceDefinitions (`muster crds` prints them; \
         the chart installs them from `charts/muster/crds/`). Each page lists the fields of the schema the API \
         server validates against, with their limits and validation rules.\n\n",
    );
    out.push_str("| Kind | API version | Scope | Plural | Short names | Categories |\n|---|---|---|---|---|---|\n");
    for crd in crds {
        let spec = &crd["spec"];
        let names = &spec["names"];
        let kind = str_of(names, "kind");
        let versions: Vec<String> = spec["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["served"].as_bool() == Some(true))
            .map(|v| md::code(&format!("{}/{}", str_of(spec, "group"), str_of(v, "name")), true))
            .collect();
        out.push_str(&format!(
            "| [{kind}]({}) | {} | {} | {} | {} | {} |\n",
            file_name(kind),
            versions.join(", "),
            str_of(spec, "scope"),
            md::code(str_of(names, "plural"), true),
            strs(names, "shortNames").iter().map(|s| md::code(s, true)).collect::<Vec<_>>().join(", "),
            strs(names, "categories").iter().map(|s| md::code(s, true)).collect::<Vec<_>>().join(", "),
        ));
    }
    // A category every kind is in: `kubectl get <category>` lists them all.
    let shared = crds.first().map(|c| strs(&c["spec"]["names"], "categories")).unwrap_or_default();
    for category in
        shared.iter().filter(|cat| crds.iter().all(|c| strs(&c["spec"]["names"], "categories").contains(cat)))
    {
        out.push_str(&format!(
            "\nEvery kind is in the category {}: {} lists the objects of all of them.\n",
            md::code(category, false),
            md::code(&format!("kubectl get {category}"), false),
        ));
    }
    out
}

fn crd_page(crd: &Value, cuts: &[Cut], by_kind: &BTreeMap<String, &Value>) -> Result<String, String> {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let kind = str_of(names, "kind");
    let group = str_of(spec, "group");
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    let mut out = String::new();
    out.push_str(&format!("# {kind}\n\n"));
    if let Some(root) = versions.iter().find(|v| v["storage"].as_bool() == Some(true)).or(versions.first()) {
        let desc = str_of(&root["schema"]["openAPIV3Schema"], "description");
        if !desc.is_empty() {
            out.push_str(&format!("{}\n\n", md::text(desc.trim())));
        }
    }
    let version_list: Vec<String> = versions
        .iter()
        .map(|v| {
            let mut what = Vec::new();
            if v["served"].as_bool() == Some(true) {
                what.push("served");
            }
            if v["storage"].as_bool() == Some(true) {
                what.push("storage");
            }
            if v["deprecated"].as_bool() == Some(true) {
                what.push("deprecated");
            }
            format!("{} ({})", md::code(str_of(v, "name"), true), what.join(", "))
        })
        .collect();
    let subresources: BTreeSet<String> = versions
        .iter()
        .filter_map(|v| v["subresources"].as_object())
        .flat_map(|s| s.keys().cloned())
        .map(|s| md::code(&s, true))
        .collect();
    let rows = [
        ("Group", md::code(group, true)),
        ("Kind", md::code(kind, true)),
        ("Scope", str_of(spec, "scope").to_string()),
        ("Plural", md::code(str_of(names, "plural"), true)),
        ("Singular", md::code(str_of(names, "singular"), true)),
        ("Short names", strs(names, "shortNames").iter().map(|s| md::code(s, true)).collect::<Vec<_>>().join(", ")),
        ("Categories", strs(names, "categories").iter().map(|s| md::code(s, true)).collect::<Vec<_>>().join(", ")),
        ("Versions", version_list.join(", ")),
        (
            "Subresources",
            if subresources.is_empty() {
                "none".into()
            } else {
                subresources.into_iter().collect::<Vec<_>>().join(", ")
            },
        ),
    ];
    out.push_str("| | |\n|---|---|\n");
    for (k, v) in rows {
        out.push_str(&format!("| {k} | {v} |\n"));
    }
    out.push('\n');
    let multi = versions.len() > 1;
    let mut ids = BTreeSet::new();
    let mut used: BTreeSet<String> = BTreeSet::new();
    for v in &versions {
        let version = str_of(v, "name");
        let prefix = if multi { format!("{version}-") } else { String::new() };
        let title = if multi { format!(" of {version}") } else { String::new() };
        printer_columns(&mut out, &mut ids, v, str_of(names, "plural"), &prefix, &title)?;
        let schema = &v["schema"]["openAPIV3Schema"];
        let mut reported: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        walk("", schema, &mut |path, s| {
            for rule in s.get("x-kubernetes-validations").and_then(Value::as_array).into_iter().flatten() {
                let field = str_of(rule, "fieldPath");
                // A plain path (`.a.b`); a subscript (`.a['b']`, `.a[0]`) is not followed.
                if field.len() > 1 && field.starts_with('.') && !field.contains(['[', '\'', '"']) {
                    let target = if path.is_empty() { field[1..].to_string() } else { format!("{path}{field}") };
                    reported.entry(target).or_default().insert(path.to_string());
                }
            }
        });
        let mut page = Fields {
            kind,
            cuts,
            by_kind,
            out: String::new(),
            ids: &mut ids,
            used: &mut used,
            shown: Vec::new(),
            prefix,
            reported,
        };
        let id = page.id("fields")?;
        page.out.push_str(&format!("## Fields{title} {{#{id}}}\n\n"));
        page.out.push_str(
            "Each object below lists its fields. Required: the field must be set. Limits are those of the schema. \
             The rules (CEL, `x-kubernetes-validations`) are checked by the API server; a rule naming `oldSelf` \
             compares with the object before an update and is checked on updates only.\n\n",
        );
        page.object("", schema, &md::code(kind, false))?;
        out.push_str(&page.out);
    }
    for cut in cuts.iter().filter(|c| c.kind == kind) {
        if !used.contains(cut.path) {
            return Err(format!(
                "cut point {kind} {}: no such field in the schema (update CUTS in src/docs/api.rs)",
                cut.path
            ));
        }
    }
    Ok(out)
}

fn printer_columns(
    out: &mut String,
    ids: &mut BTreeSet<String>,
    version: &Value,
    plural: &str,
    prefix: &str,
    title: &str,
) -> Result<(), String> {
    let id = format!("{prefix}printer-columns");
    if !ids.insert(id.clone()) {
        return Err(format!("anchor {id} twice"));
    }
    out.push_str(&format!("## Printer columns{title} {{#{id}}}\n\n"));
    let columns = version["additionalPrinterColumns"].as_array().cloned().unwrap_or_default();
    if columns.is_empty() {
        out.push_str(&format!("`kubectl get {plural}` shows the name and age only.\n\n"));
        return Ok(());
    }
    out.push_str(&format!(
        "The columns of `kubectl get {plural}`; those of priority above 0 only with `-o wide`.\n\n\
         | Column | Type | JSONPath | Priority | Description |\n|---|---|---|---|---|\n"
    ));
    for c in &columns {
        let ty = match str_of(c, "format") {
            "" => str_of(c, "type").to_string(),
            f => format!("{} ({f})", str_of(c, "type")),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            md::cell(str_of(c, "name")),
            ty,
            md::code(str_of(c, "jsonPath"), true),
            c["priority"].as_i64().unwrap_or(0),
            md::cell(str_of(c, "description")),
        ));
    }
    out.push('\n');
    Ok(())
}

/// The fields of one version's schema, being written.
struct Fields<'a> {
    kind: &'a str,
    cuts: &'a [Cut],
    by_kind: &'a BTreeMap<String, &'a Value>,
    out: String,
    ids: &'a mut BTreeSet<String>,
    used: &'a mut BTreeSet<String>,
    /// Objects given a section so far (their schema without its description, the section's
    /// path), for links to them.
    shown: Vec<(Value, String)>,
    prefix: String,
    /// The rules reporting at a field (by its `fieldPath`) that sit on another: the field's
    /// path to the paths of the objects the rules sit on.
    reported: BTreeMap<String, BTreeSet<String>>,
}

/// A rule as the page lists it.
struct RuleRow {
    on: String,
    rule: Value,
}

impl<'a> Fields<'a> {
    fn id(&mut self, base: &str) -> Result<String, String> {
        let id = format!("{}{base}", self.prefix);
        if !self.ids.insert(id.clone()) {
            return Err(format!("{}: anchor {id} twice on the page", self.kind));
        }
        Ok(id)
    }

    fn cut(&mut self, path: &str) -> Option<&'a Cut> {
        let (kind, cuts) = (self.kind, self.cuts);
        let cut = cuts.iter().find(|c| c.kind == kind && c.path == path)?;
        self.used.insert(cut.path.to_string());
        Some(cut)
    }

    /// The object (or array of objects, or map of objects) whose fields `schema` at `path` has:
    /// (the schema with `properties`, the path of its fields' parent). None for a scalar, a cut
    /// or a container of scalars.
    fn container<'s>(&mut self, path: &str, schema: &'s Value) -> Option<(&'s Value, String)> {
        if self.cut(path).is_some() {
            return None;
        }
        if schema.get("properties").and_then(Value::as_object).is_some_and(|p| !p.is_empty()) {
            return Some((schema, path.to_string()));
        }
        if let Some(items) = schema.get("items") {
            return self.container(&format!("{path}[]"), items);
        }
        if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
            return self.container(&format!("{path}{{}}"), values);
        }
        None
    }

    /// The type of `schema` at `path`, in words, with links for cut types.
    fn type_of(&mut self, path: &str, schema: &Value) -> Result<String, String> {
        if let Some(cut) = self.cut(path) {
            return Ok(match &cut.target {
                Target::Kubernetes { ty, api, url } => format!("[{ty}]({url}) ({api})"),
                Target::SameAs { kind, path: other } => {
                    let theirs = self
                        .by_kind
                        .get(*kind)
                        .and_then(|crd| find(&crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"], other))
                        .ok_or_else(|| format!("cut point {} {path}: {kind} has no field {other}", self.kind))?;
                    if without_description(theirs) != without_description(schema) {
                        return Err(format!(
                            "cut point {} {path}: its schema is no longer {kind}'s {other}; expand it or fix CUTS",
                            self.kind
                        ));
                    }
                    format!("{kind} [`{other}`]({}#{})", file_name(kind), anchor(other))
                }
            });
        }
        if schema.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true) {
            return Ok("integer or string".into());
        }
        let ty = str_of(schema, "type");
        Ok(match ty {
            "array" => match schema.get("items") {
                Some(items) => format!("array of {}", self.type_of(&format!("{path}[]"), items)?),
                None => "array".into(),
            },
            "object" | "" => {
                let has_props = schema.get("properties").and_then(Value::as_object).is_some_and(|p| !p.is_empty());
                if has_props {
                    "object".into()
                } else if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
                    format!("map of string to {}", self.type_of(&format!("{path}{{}}"), values)?)
                } else if schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true) {
                    "object (any fields kept)".into()
                } else if ty.is_empty() {
                    "any".into()
                } else {
                    "object".into()
                }
            }
            t => match str_of(schema, "format") {
                "" => t.to_string(),
                f => format!("{t} ({f})"),
            },
        })
    }

    /// A section for the object at `path` (`""`: the root), then one for each of its
    /// object fields.
    fn object(&mut self, path: &str, schema: &Value, title: &str) -> Result<(), String> {
        let Some((fields_of, parent)) = self.container(path, schema) else { return Ok(()) };
        let id = self.id(&if path.is_empty() { "root".to_string() } else { anchor(path) })?;
        let mut rules = Vec::new();
        if path.is_empty() {
            self.out.push_str(&format!("### {title} {{#{id}}}\n\n"));
        } else {
            self.out.push_str(&format!("### {} {{#{id}}}\n\n", md::code(path, false)));
            let mut facts = vec![self.type_of(path, schema)?];
            if schema.get("nullable").and_then(Value::as_bool) == Some(true) {
                facts.push("nullable".into());
            }
            facts.extend(limits(schema, false));
            if let Some(d) = schema.get("default") {
                facts.push(format!("default {}", md::code(&d.to_string(), false)));
            }
            self.out.push_str(&format!("{}\n\n", facts.join(" · ")));
            let desc = str_of(schema, "description");
            if !desc.is_empty() {
                self.out.push_str(&format!("{}\n\n", md::text(desc.trim())));
            }
            if let Some(also) = self.also_checked(path) {
                self.out.push_str(&format!("{also}\n\n"));
            }
            // Of the items (or values), when they say more.
            if !std::ptr::eq(fields_of, schema) {
                let item = str_of(fields_of, "description");
                if !item.is_empty() && item != desc {
                    self.out.push_str(&format!("Each item: {}\n\n", md::text(item.trim())));
                }
            }
        }
        let this = if std::ptr::eq(fields_of, schema) { "this object" } else { "this list" };
        push_rules(this.to_string(), schema, &mut rules);
        let mut inner = step(schema);
        while let Some(i) = inner {
            push_rules("each item".to_string(), i, &mut rules);
            inner = if std::ptr::eq(i, fields_of) { None } else { step(i) };
        }
        let required: BTreeSet<String> = strs(fields_of, "required").into_iter().collect();
        let props = fields_of["properties"].as_object().cloned().unwrap_or_default();
        let mut children = Vec::new();
        self.out.push_str("| Field | Type | Required | Default | Limits | Description |\n|---|---|---|---|---|---|\n");
        for (name, child) in &props {
            let child_path = if parent.is_empty() { name.clone() } else { format!("{parent}.{name}") };
            let shown = self.same_as(&child_path, child);
            let container = if shown.is_none() { self.container(&child_path, child) } else { None };
            let sectioned = container.is_some();
            // Claimed now, shown below: a later field with the same fields links to it.
            if let Some((fields, _)) = container {
                self.shown.push((without_description(fields), child_path.clone()));
            }
            let field = if sectioned {
                format!("[{}](#{}{})", md::code(name, true), self.prefix, anchor(&child_path))
            } else {
                let id = self.id(&anchor(&child_path))?;
                format!("<a id=\"{id}\"></a>{}", md::code(name, true))
            };
            let mut ty = match &shown {
                Some(other) => format!(
                    "{}: the fields of [{}](#{}{})",
                    self.type_of(&child_path, child)?,
                    md::code(other, true),
                    self.prefix,
                    anchor(other)
                ),
                None => self.type_of(&child_path, child)?,
            };
            if child.get("nullable").and_then(Value::as_bool) == Some(true) {
                ty.push_str(", nullable");
            }
            let mut lim = limits(child, true);
            // An array or map of scalars: the limits of its items.
            let mut inner = step(child);
            while let Some(i) = inner {
                let l = limits(i, true);
                if !l.is_empty() {
                    lim.push(format!("each: {}", l.join(", ")));
                }
                inner = step(i);
            }
            self.out.push_str(&format!(
                "| {field} | {ty} | {} | {} | {} | {} |\n",
                if required.contains(name) { "yes" } else { "" },
                child.get("default").map(|d| md::code(&d.to_string(), true)).unwrap_or_default(),
                lim.join("<br>"),
                match self.also_checked(&child_path) {
                    Some(also) => format!("{}<br><br>{also}", md::cell(str_of(child, "description"))),
                    None => md::cell(str_of(child, "description")),
                },
            ));
            if sectioned {
                children.push((child_path, child.clone()));
                continue;
            }
            // The rules of a field without a section of its own are listed here: those inside
            // a Kubernetes type cut short too; a link to another section or page lists the
            // rules of the fields it links to there.
            let cut = self.cut_in(&child_path, child);
            // Where the rules are listed elsewhere: at and below a cut to another page, at and
            // below the fields linked to.
            let elsewhere = match (&shown, cut.map(|c| &c.target)) {
                (Some(_), _) => {
                    let (mut at, mut at_path) = (child, child_path.clone());
                    while at.get("properties").is_none() {
                        at_path.push_str(if at.get("items").is_some() { "[]" } else { "{}" });
                        match step(at) {
                            Some(next) => at = next,
                            None => break,
                        }
                    }
                    Some(at_path)
                }
                (None, Some(Target::SameAs { .. })) => cut.map(|c| c.path.to_string()),
                _ => None,
            };
            let mut below = Vec::new();
            walk(&child_path, child, &mut |p, s| below.push((p.to_string(), s.clone())));
            for (p, s) in below {
                if elsewhere.as_deref().is_some_and(|base| under(&p, base)) {
                    continue;
                }
                let rel = p.strip_prefix(parent.as_str()).map(|r| r.trim_start_matches('.')).unwrap_or(&p);
                push_rules(md::code(rel, true), &s, &mut rules);
            }
        }
        self.out.push('\n');
        if !rules.is_empty() {
            self.out.push_str("Rules:\n\n| On | Rule | Message | Reported at | Reason |\n|---|---|---|---|---|\n");
            for r in &rules {
                let message = match (r.rule.get("message").and_then(Value::as_str), r.rule.get("messageExpression")) {
                    (Some(m), _) => md::cell(m),
                    (None, Some(Value::String(e))) => format!("{} (expression)", md::code(e, true)),
                    _ => String::new(),
                };
                self.out.push_str(&format!(
                    "| {} | {} | {message} | {} | {} |\n",
                    r.on,
                    md::code(str_of(&r.rule, "rule"), true),
                    match str_of(&r.rule, "fieldPath") {
                        "" => String::new(),
                        f => md::code(f, true),
                    },
                    md::cell(str_of(&r.rule, "reason")),
                ));
            }
            self.out.push('\n');
        }
        for (child_path, child) in children {
            self.object(&child_path, &child, "")?;
        }
        Ok(())
    }

    /// "Also checked by a rule on ..." for a field that rules elsewhere report at.
    fn also_checked(&self, path: &str) -> Option<String> {
        let sources = self.reported.get(path)?;
        let links: Vec<String> = sources
            .iter()
            .map(|src| {
                let (name, id) = if src.is_empty() {
                    (self.kind.to_string(), "root".to_string())
                } else {
                    (src.clone(), anchor(src))
                };
                format!("[{}](#{}{id})", md::code(&name, true), self.prefix)
            })
            .collect();
        let rules = if links.len() == 1 { "a rule" } else { "rules" };
        Some(format!("Also checked by {rules} on {}.", links.join(", ")))
    }

    /// The cut at `path` or at the items/values under it.
    fn cut_in(&mut self, path: &str, schema: &Value) -> Option<&'a Cut> {
        if let Some(c) = self.cut(path) {
            return Some(c);
        }
        if let Some(items) = schema.get("items") {
            return self.cut_in(&format!("{path}[]"), items);
        }
        schema
            .get("additionalProperties")
            .filter(|v| v.is_object())
            .and_then(|v| self.cut_in(&format!("{path}{{}}"), v))
    }

    /// The section (path) of an object shown already whose fields are those of `schema`'s
    /// (descriptions of the objects aside), when they are many enough to be worth a link.
    fn same_as(&self, path: &str, schema: &Value) -> Option<String> {
        if self.cuts.iter().any(|c| c.kind == self.kind && c.path.starts_with(path)) {
            return None;
        }
        let mut at = schema;
        while at.get("properties").is_none() {
            at = step(at)?;
        }
        if nodes(at) < SAME_AS_MIN_NODES {
            return None;
        }
        let bare = without_description(at);
        self.shown.iter().find(|(s, _)| *s == bare).map(|(_, p)| p.clone())
    }
}

/// Whether `path` is `base` or a path below it.
fn under(path: &str, base: &str) -> bool {
    path == base || (path.starts_with(base) && matches!(path[base.len()..].chars().next(), Some('.' | '[' | '{')))
}

/// The items of an array or the values of a map.
fn step(schema: &Value) -> Option<&Value> {
    schema.get("items").or(schema.get("additionalProperties").filter(|v| v.is_object()))
}

/// Rules on `schema`, listed as being on `on`.
fn push_rules(on: String, schema: &Value, out: &mut Vec<RuleRow>) {
    for rule in schema.get("x-kubernetes-validations").and_then(Value::as_array).into_iter().flatten() {
        out.push(RuleRow { on: on.clone(), rule: rule.clone() });
    }
}

/// Calls `f` on every schema under `schema` (itself included) with its path.
fn walk(path: &str, schema: &Value, f: &mut dyn FnMut(&str, &Value)) {
    f(path, schema);
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            walk(&if path.is_empty() { name.clone() } else { format!("{path}.{name}") }, child, f);
        }
    }
    if let Some(items) = schema.get("items") {
        walk(&format!("{path}[]"), items, f);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        walk(&format!("{path}{{}}"), values, f);
    }
}

fn nodes(schema: &Value) -> usize {
    let mut n = 0;
    walk("", schema, &mut |_, _| n += 1);
    n
}

/// The schema at `path` under `root`.
fn find<'a>(root: &'a Value, path: &str) -> Option<&'a Value> {
    let mut at = root;
    for part in path.split('.') {
        let (name, mut suffix) = match part.find(['[', '{']) {
            Some(i) => part.split_at(i),
            None => (part, ""),
        };
        at = at.get("properties")?.get(name)?;
        while let Some(rest) = suffix.strip_prefix("[]") {
            at = at.get("items")?;
            suffix = rest;
        }
        while let Some(rest) = suffix.strip_prefix("{}") {
            at = at.get("additionalProperties")?;
            suffix = rest;
        }
    }
    Some(at)
}

fn without_description(schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Some(o) = s.as_object_mut() {
        o.remove("description");
    }
    s
}

fn number(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        _ => v.to_string(),
    }
}

/// The limits of `schema` in words (format, nullable and default aside).
fn limits(schema: &Value, in_table: bool) -> Vec<String> {
    let mut out = Vec::new();
    let exclusive = |key: &str| schema.get(key).and_then(Value::as_bool) == Some(true);
    if let Some(v) = schema.get("minimum") {
        out.push(format!("minimum {}{}", number(v), if exclusive("exclusiveMinimum") { " (exclusive)" } else { "" }));
    }
    if let Some(v) = schema.get("maximum") {
        out.push(format!("maximum {}{}", number(v), if exclusive("exclusiveMaximum") { " (exclusive)" } else { "" }));
    }
    for (key, words) in [
        ("minLength", "minLength"),
        ("maxLength", "maxLength"),
        ("minItems", "minItems"),
        ("maxItems", "maxItems"),
        ("minProperties", "minProperties"),
        ("maxProperties", "maxProperties"),
        ("multipleOf", "multipleOf"),
    ] {
        if let Some(v) = schema.get(key) {
            out.push(format!("{words} {}", number(v)));
        }
    }
    if schema.get("uniqueItems").and_then(Value::as_bool) == Some(true) {
        out.push("items unique".into());
    }
    if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
        out.push(format!("pattern {}", md::code(p, in_table)));
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values
            .iter()
            .map(|v| md::code(v.as_str().map_or_else(|| v.to_string(), str::to_string).as_str(), in_table))
            .collect();
        out.push(format!("one of {}", values.join(", ")));
    }
    match str_of(schema, "x-kubernetes-list-type") {
        "" => {}
        "map" => out.push(format!(
            "list type map, keyed by {}",
            strs(schema, "x-kubernetes-list-map-keys")
                .iter()
                .map(|k| md::code(k, in_table))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        t => out.push(format!("list type {t}")),
    }
    if let Some(t) = schema.get("x-kubernetes-map-type").and_then(Value::as_str) {
        out.push(format!("map type {t}"));
    }
    if schema.get("x-kubernetes-embedded-resource").and_then(Value::as_bool) == Some(true) {
        out.push("an embedded object (apiVersion, kind, metadata)".into());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(kind: &str) -> String {
        pages()
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .find(|(n, _)| *n == file_name(kind))
            .map(|(_, p)| p)
            .unwrap_or_else(|| panic!("{kind}"))
    }

    #[test]
    fn the_musterjob_page_expands_scheduling_with_its_rules() {
        let p = page("MusterJob");
        assert!(p.contains("| Short names | `mjob` |"), "{p}");
        assert!(
            p.contains("### `spec.scheduling.schedulingPolicy.gang` {#spec-scheduling-schedulingpolicy-gang}"),
            "{p}"
        );
        assert!(p.contains("| <a id=\"spec-scheduling-schedulingpolicy-gang-mincount\"></a>`minCount` | integer (int32), nullable |"), "{p}");
        assert!(p.contains("minimum 1"), "{p}");
        // The rule on spec is named at the field it reports at.
        assert!(p.contains("Also checked by a rule on [`spec`](#spec). |"), "{p}");
        // A rule on spec about a field below it, with its message and where it is reported.
        assert!(
            p.contains("| must be less than or equal to parallelism | `.scheduling.schedulingPolicy.gang.minCount` |"),
            "{p}"
        );
        // A rule on the policy itself.
        assert!(p.contains("`has(self.basic) != has(self.gang)`"), "{p}");
        // A printer column with its JSONPath.
        assert!(p.contains("| Phase | string | `.status.phase` | 0 |"), "{p}");
    }

    #[test]
    fn the_index_lists_every_crd_muster_serves_with_a_link_to_its_page() {
        let pages = pages().unwrap_or_else(|e| panic!("{e}"));
        let index = &pages.iter().find(|(n, _)| n == "README.md").unwrap_or_else(|| panic!("no index")).1;
        let crds = crate::crds::all();
        assert_eq!(pages.len(), crds.len() + 1);
        for crd in &crds {
            let names = &crd.spec.names;
            let short = names.short_names.clone().unwrap_or_default().join("");
            let row = format!("| [{}]({}) | `{}/", names.kind, file_name(&names.kind), crd.spec.group);
            assert!(index.contains(&row), "{row}: {index}");
            assert!(index.contains(&format!("| `{}` | `{short}` |", names.plural)), "{short}: {index}");
        }
        assert!(
            index.contains("| [PodGroup](podgroup.md) | `scheduling.muster.dev/v1alpha1` | Namespaced |"),
            "{index}"
        );
    }

    #[test]
    fn the_pod_template_is_cut_and_named_not_expanded() {
        let p = page("MusterJob");
        assert!(p.contains("`template` | [PodTemplateSpec](https://kubernetes.io/"), "{p}");
        assert!(p.contains("(core/v1) |"), "{p}");
        assert!(!p.contains("spec.template.spec"), "expanded: {p}");
        assert!(!p.contains("initContainers"), "expanded: {p}");
        // The set's child spec is the MusterJob's spec: a link, checked equal.
        let s = page("MusterJobSet");
        assert!(s.contains("MusterJob [`spec`](musterjob.md#spec)"), "{s}");
        assert!(!s.contains("initContainers"), "expanded: {s}");
    }

    #[test]
    fn every_page_is_under_the_limit_and_every_anchor_is_unique() {
        for (name, p) in pages().unwrap_or_else(|e| panic!("{e}")) {
            assert!(p.len() < super::super::MAX_PAGE_BYTES, "{name}: {}", p.len());
            let mut ids = BTreeSet::new();
            for id in p.split("{#").skip(1).chain(p.split("<a id=\"").skip(1)) {
                let id = &id[..id.find(['}', '"']).unwrap_or(0)];
                assert!(ids.insert(id.to_string()), "{name}: anchor {id} twice");
            }
        }
    }

    /// A CRD of one kind whose spec embeds `big` (a schema) at `spec.embedded`.
    fn synthetic(big: Value) -> Value {
        serde_json::json!({
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"kind": "Thing", "plural": "things", "singular": "thing"},
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {"embedded": big, "n": {"type": "integer"}}}
                    }}}
                }]
            }
        })
    }

    /// An object `depth` levels deep with `fields` fields each, no two subtrees alike.
    fn wide(fields: usize, depth: usize, n: &mut usize) -> Value {
        let mut props = serde_json::Map::new();
        for i in 0..fields {
            *n += 1;
            let child = if depth == 0 {
                serde_json::json!({"type": "string", "description": format!("Field {n}, described at some length so the page grows.")})
            } else {
                wide(fields, depth - 1, n)
            };
            props.insert(format!("field{i}"), child);
        }
        serde_json::json!({"type": "object", "description": "An embedded type.", "properties": props})
    }

    #[test]
    fn an_embedded_type_not_cut_trips_the_page_size_guard_and_a_cut_stops_it() {
        let crd = synthetic(wide(12, 3, &mut 0));
        // Not cut: expanded field by field, over the limit.
        let pages = pages_with(std::slice::from_ref(&crd), &[]).unwrap_or_else(|e| panic!("{e}"));
        let big = pages.iter().find(|(n, _)| n == "thing.md").map(|(_, p)| p.len()).unwrap_or(0);
        assert!(big > super::super::MAX_PAGE_BYTES, "{big}");
        for (name, text) in &pages {
            let guard = super::super::size_guard(name, text);
            if name == "thing.md" {
                let e = guard.unwrap_err();
                assert!(e.contains("thing.md would be") && e.contains("add a cut point"), "{e}");
            } else {
                assert_eq!(guard, Ok(()));
            }
        }
        // Cut: one row naming the type.
        let cuts = [Cut {
            kind: "Thing",
            path: "spec.embedded",
            target: Target::Kubernetes { ty: "Huge", api: "example/v1", url: "https://example.com/huge" },
        }];
        let pages = pages_with(std::slice::from_ref(&crd), &cuts).unwrap_or_else(|e| panic!("{e}"));
        let p = &pages.iter().find(|(n, _)| n == "thing.md").unwrap_or_else(|| panic!("no page")).1;
        assert!(p.len() < 4096, "{p}");
        assert!(p.contains("`embedded` | [Huge](https://example.com/huge) (example/v1) |"), "{p}");
        assert!(!p.contains("field0"), "{p}");
    }

    #[test]
    fn a_cut_point_that_matches_nothing_fails_generation() {
        let crd = synthetic(serde_json::json!({"type": "string"}));
        let cuts = [Cut {
            kind: "Thing",
            path: "spec.gone",
            target: Target::Kubernetes { ty: "Gone", api: "v1", url: "https://example.com" },
        }];
        let e = pages_with(std::slice::from_ref(&crd), &cuts).map(|_| ()).unwrap_err();
        assert!(e.contains("spec.gone"), "{e}");
    }
}
