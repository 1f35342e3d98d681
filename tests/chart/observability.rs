//! The chart's Grafana dashboard (`dashboards.enabled`) and PrometheusRule (`prometheusRule.enabled`):
//! rendered only when asked for, valid PromQL (`promtool check rules`), and every expression names
//! only metrics muster exports: the names a running muster lists on `/metrics` (its `# TYPE`
//! lines, so a family with no series yet counts), plus a short allow-list of standard metrics.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support::{Muster, Release, chart_dir, eventually, exclusive, free_port, http_get, of_kind, one, render};

const NS: &str = "muster-system";

/// Metrics that are not muster's and that the dashboard or rules use on purpose.
const STANDARD_METRICS: &[&str] = &[
    // Prometheus's own per-target series: is a replica scraped at all.
    "up",
];

/// What every dashboard and rule set must show (the issue's list): gangs pending and admitted,
/// admission latency, unschedulable reasons, bind timeouts and rollbacks, GPUs allocated and
/// unhealthy per node, webhook errors.
const MUST_SHOW: &[&str] = &[
    "muster_gangs_pending",
    "muster_gangs_admitted_total",
    "muster_admission_latency_seconds_bucket",
    "muster_unschedulable_attempts_total",
    "muster_bind_timeouts_total",
    "muster_gang_rollbacks_total",
    "muster_gpus_allocated",
    "muster_gpus_unhealthy",
    "muster_webhook_requests_total",
];

/// The alerts the PrometheusRule must have.
const MUST_ALERT: &[&str] = &[
    "muster_admission_idle_wakeups_total",
    "muster_gangs_pending",
    "muster_bind_timeouts_total",
    "muster_gang_rollbacks_total",
    "muster_gpus_unhealthy",
    "muster_webhook_requests_total",
    "up",
];

/// PromQL keywords and aggregation operators: never metric names.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "atan2",
    "inf",
    "nan",
    "start",
    "end",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// Keywords followed by a parenthesised list of label names (not expressions).
const LABEL_LISTS: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];

/// The index just after the bracket that closes the one at `open` (`(`, `{` or `[`), skipping
/// quoted strings; the end of `s` when it is not closed.
fn skip_group(s: &[char], open: usize) -> usize {
    let mut depth = 0usize;
    let mut i = open;
    while i < s.len() {
        match s[i] {
            '"' | '\'' | '`' => i = skip_string(s, i) - 1,
            '(' | '{' | '[' => depth += 1,
            ')' | '}' | ']' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    s.len()
}

/// The index just after the string literal starting at `start`.
fn skip_string(s: &[char], start: usize) -> usize {
    let quote = s[start];
    let mut i = start + 1;
    while i < s.len() {
        if s[i] == '\\' && quote != '`' {
            i += 2;
            continue;
        }
        if s[i] == quote {
            return i + 1;
        }
        i += 1;
    }
    s.len()
}

fn ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// `__name__="x"` matchers of a selector's braces (the name of a selector written without one
/// in front). A regex matcher's pattern is returned as it is, so it never passes for a metric.
fn name_matchers(block: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = block;
    while let Some(at) = rest.find("__name__") {
        rest = &rest[at + "__name__".len()..];
        let value = rest.trim_start().trim_start_matches(['=', '~', '!']).trim_start();
        if let Some(q) = value.chars().next().filter(|c| matches!(c, '"' | '\'' | '`'))
            && let Some(end) = value[1..].find(q)
        {
            out.push(value[1..1 + end].to_string());
        }
    }
    out
}

/// Splits `s` at its top-level commas.
fn top_level_args(s: &str) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    let (mut out, mut start, mut i) = (Vec::new(), 0, 0);
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => {
                i = skip_string(&chars, i);
                continue;
            }
            '(' | '{' | '[' => {
                i = skip_group(&chars, i);
                continue;
            }
            ',' => {
                out.push(chars[start..i].iter().collect::<String>().trim().to_string());
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    out.push(chars[start..].iter().collect::<String>().trim().to_string());
    out
}

/// The metric names a PromQL expression selects. Also takes Grafana's variable query
/// `label_values(<selector>, <label>)` (its selector's names; `label_values(<label>)` has none)
/// and Grafana variables (`$job`, `${datasource}`, `$__rate_interval`), which name no metric.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let trimmed = expr.trim();
    if let Some(inner) = trimmed.strip_prefix("label_values(").and_then(|r| r.strip_suffix(')')) {
        let args = top_level_args(inner);
        return if args.len() == 2 { metric_names(&args[0]) } else { BTreeSet::new() };
    }
    let s: Vec<char> = trimmed.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if matches!(c, '"' | '\'' | '`') {
            i = skip_string(&s, i);
        } else if c == '{' {
            let end = skip_group(&s, i);
            names.extend(name_matchers(&s[i..end].iter().collect::<String>()));
            i = end;
        } else if c == '[' {
            i = skip_group(&s, i);
        } else if c == '#' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '$' {
            // A Grafana variable: `$name` or `${name}`.
            i += 1;
            if i < s.len() && s[i] == '{' {
                i = skip_group(&s, i);
            } else {
                while i < s.len() && ident_char(s[i]) {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() || (c == '.' && s.get(i + 1).is_some_and(char::is_ascii_digit)) {
            // A number or a duration (`0.99`, `5m`, `1e3`, `0x1f`).
            while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == '.' || s[i] == '_') {
                i += 1;
            }
        } else if ident_start(c) {
            let start = i;
            while i < s.len() && ident_char(s[i]) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let mut next = i;
            while next < s.len() && s[next].is_whitespace() {
                next += 1;
            }
            let call = next < s.len() && s[next] == '(';
            if LABEL_LISTS.contains(&word.as_str()) {
                if call {
                    i = skip_group(&s, next);
                }
            } else if !call && !KEYWORDS.contains(&word.as_str()) {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The series names of a `/metrics` exposition: every family of its `# TYPE` lines with the
/// suffixes its type's samples carry (so families without series count too), and every sample.
pub fn exported_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total", "_created"],
                "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count", "_created", "_gcount", "_gsum"],
                "summary" => &["", "_sum", "_count", "_created"],
                "info" => &["_info"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

/// Names in `exprs` that are neither in `exported` nor standard: `(expression, name)`.
fn unknown<'a>(exprs: &'a [(String, String)], exported: &BTreeSet<String>) -> Vec<(&'a str, String)> {
    exprs
        .iter()
        .flat_map(|(where_, e)| metric_names(e).into_iter().map(move |n| (where_.as_str(), n)))
        .filter(|(_, n)| !exported.contains(n) && !STANDARD_METRICS.contains(&n.as_str()))
        .collect()
}

/// A rendering with the dashboard and the rules on.
fn observability_render(extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["--set", "dashboards.enabled=true", "--set", "prometheusRule.enabled=true"];
    args.extend_from_slice(extra);
    render(NS, &args)
}

/// The dashboard JSON of the rendered ConfigMap.
fn dashboard(docs: &[Value]) -> Value {
    let cm = one(docs, "ConfigMap");
    let text = cm["data"]["muster.json"].as_str().expect("muster.json in the dashboard ConfigMap");
    serde_json::from_str(text).unwrap_or_else(|e| panic!("the dashboard is not JSON: {e}"))
}

/// Every panel of a dashboard, rows' collapsed panels included.
fn panels(dashboard: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().into_iter().flatten() {
        out.push(p.clone());
        out.extend(p["panels"].as_array().into_iter().flatten().cloned());
    }
    out
}

/// `(where, expression)` of every panel target and every query variable.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in panels(dashboard) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("panel {:?}: a target without expr", p["title"]));
            out.push((format!("panel {:?} {}", p["title"].as_str().unwrap_or_default(), t["refId"]), expr.to_string()));
        }
    }
    for v in dashboard["templating"]["list"].as_array().into_iter().flatten().filter(|v| v["type"] == "query") {
        let q = v["query"]["query"].as_str().or(v["query"].as_str()).expect("variable query");
        out.push((format!("variable {}", v["name"]), q.to_string()));
    }
    out
}

/// `(alert, expression)` of every rule of the rendered PrometheusRule.
fn rule_exprs(docs: &[Value]) -> Vec<(String, String)> {
    let rule = one(docs, "PrometheusRule");
    let mut out = Vec::new();
    for group in rule["spec"]["groups"].as_array().expect("groups") {
        for r in group["rules"].as_array().expect("rules") {
            let name = r["alert"].as_str().or(r["record"].as_str()).expect("alert or record");
            out.push((name.to_string(), r["expr"].as_str().expect("expr").to_string()));
        }
    }
    out
}

#[test]
fn extractor_finds_metric_names_and_catches_unknown_ones() {
    let cases: &[(&str, &[&str])] = &[
        ("muster_gangs_pending", &["muster_gangs_pending"]),
        (
            r#"histogram_quantile(0.99, sum by (le, path) (rate(muster_webhook_duration_seconds_bucket{job=~"$job", le!="+Inf"}[$__rate_interval])))"#,
            &["muster_webhook_duration_seconds_bucket"],
        ),
        (r#"absent(up{job="muster-metrics", namespace="x"} == 1)"#, &["up"]),
        (
            "(sum(increase(a_total[10m])) or vector(0)) + (sum(b_total offset 5m) or vector(0)) == 0 and on() count(up == 1) > 0",
            &["a_total", "b_total", "up"],
        ),
        ("a / on(node) group_left(kind) b * ignoring (x) c", &["a", "b", "c"]),
        ("sum(rate(x[5m])) by (le) > bool 0.5e3", &["x"]),
        ("max without (instance) (y) unless z @ start()", &["y", "z"]),
        (r#"count by (version) (muster_build_info{version=~"0\\.1.*"})"#, &["muster_build_info"]),
        (r#"{__name__="hidden_total", job="x"}"#, &["hidden_total"]),
        (r#"label_values(muster_gpus{job=~"$job"}, node)"#, &["muster_gpus"]),
        ("label_values(job)", &[]),
        ("sum(rate(muster_x[${__range}])) * 60 # per minute", &["muster_x"]),
        (r#"label_replace(m, "dst", "$1", "src", "(.*)")"#, &["m"]),
    ];
    for (expr, want) in cases {
        let got = metric_names(expr);
        let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
        assert_eq!(got, want, "{expr}");
    }
    // The check fails on a name muster does not export, and only on that one.
    let exported = exported_names(
        "# HELP muster_gangs_admitted Gangs admitted.\n# TYPE muster_gangs_admitted counter\n\
         # HELP muster_admission_latency_seconds x.\n# TYPE muster_admission_latency_seconds histogram\n\
         # TYPE muster_gangs_pending gauge\nmuster_gangs_pending 0\n# EOF\n",
    );
    let exprs = vec![
        ("good".to_string(), "sum(rate(muster_gangs_admitted_total[5m])) + max(muster_gangs_pending)".to_string()),
        ("histogram".to_string(), "histogram_quantile(0.9, rate(muster_admission_latency_seconds_bucket[5m]))".into()),
        ("standard".to_string(), "up == 0".to_string()),
        ("made up".to_string(), "rate(muster_made_up_total[5m]) / rate(muster_gangs_admitted_total[5m])".to_string()),
        ("counter without _total".to_string(), "rate(muster_gangs_admitted[5m])".to_string()),
    ];
    assert_eq!(
        unknown(&exprs, &exported),
        [("made up", "muster_made_up_total".to_string()), ("counter without _total", "muster_gangs_admitted".into())]
    );
}

#[test]
fn dashboard_and_rules_render_only_when_enabled() {
    let off = render(NS, &[]);
    assert!(of_kind(&off, "ConfigMap").is_empty() && of_kind(&off, "PrometheusRule").is_empty());

    let docs = observability_render(&[]);
    let cm = one(&docs, "ConfigMap");
    assert_eq!(cm["metadata"]["name"], "muster-dashboards");
    assert_eq!(cm["metadata"]["namespace"], NS);
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1", "the Grafana sidecar's default label");
    // The ConfigMap carries the file as it is.
    let file = std::fs::read_to_string(chart_dir().join("dashboards/muster.json")).expect("dashboards/muster.json");
    assert_eq!(cm["data"]["muster.json"].as_str().map(str::trim), Some(file.trim()));
    let d = dashboard(&docs);
    assert_eq!(d["uid"], "muster-overview");
    let vars: Vec<&str> =
        d["templating"]["list"].as_array().expect("variables").iter().filter_map(|v| v["name"].as_str()).collect();
    assert_eq!(vars, ["datasource", "job", "node"]);
    for p in panels(&d).iter().filter(|p| p["type"] != "row") {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "panel {:?}", p["title"]);
        assert!(p["targets"].as_array().is_some_and(|t| !t.is_empty()), "panel {:?} has no query", p["title"]);
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_default();
            assert!(expr.contains(r#"job=~"$job""#), "panel {:?}: {expr} ignores $job", p["title"]);
        }
    }
    // Each id once (Grafana keys panels by it).
    let ids: Vec<i64> = panels(&d).iter().filter_map(|p| p["id"].as_i64()).collect();
    assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), ids.len(), "duplicate panel ids");

    let rule = one(&docs, "PrometheusRule");
    assert_eq!(rule["metadata"]["namespace"], NS);
    let alerts = rule_exprs(&docs);
    let names: Vec<&str> = alerts.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "MusterDown",
            "MusterNoLeader",
            "MusterGangsPending",
            "MusterAdmissionSlow",
            "MusterBindTimeouts",
            "MusterGangRollbacks",
            "MusterGPUsUnhealthy",
            "MusterGPUConflicts",
            "MusterWebhookErrors",
            "MusterReconcileErrors",
            "MusterAdmissionObjectErrors",
        ]
    );
    // Muster's series by the job the chart's ServiceMonitor gives them; `up` also by namespace.
    for (name, expr) in &alerts {
        assert!(expr.contains(r#"job="muster-metrics""#), "{name}: {expr}");
    }
    let rules = rule["spec"]["groups"][0]["rules"].as_array().expect("rules");
    for r in rules {
        assert!(r["labels"]["severity"].is_string(), "{r}");
        assert!(r["annotations"]["summary"].is_string() && r["annotations"]["description"].is_string(), "{r}");
    }
    let down = &alerts[0].1;
    assert!(down.contains(r#"up{job="muster-metrics", namespace="muster-system"}"#), "{down}");
    let all_rules: BTreeSet<String> = alerts.iter().flat_map(|(_, e)| metric_names(e)).collect();
    for m in MUST_ALERT {
        assert!(all_rules.contains(*m), "no alert on {m}");
    }
    let all_panels: BTreeSet<String> = dashboard_queries(&d).iter().flat_map(|(_, e)| metric_names(e)).collect();
    for m in MUST_SHOW {
        assert!(all_panels.contains(*m), "no panel shows {m}");
    }
}

#[test]
fn dashboard_and_rule_values_take_effect() {
    let full = chart_dir().join("ci/full-values.yaml").display().to_string();
    let docs = render(NS, &["-f", &full]);
    let cm = one(&docs, "ConfigMap");
    assert_eq!(cm["metadata"]["namespace"], "monitoring");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard_muster"], "yes");
    assert_eq!(cm["metadata"]["annotations"]["grafana_folder"], "muster");
    let rule = one(&docs, "PrometheusRule");
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
    let rules = rule["spec"]["groups"][0]["rules"].as_array().expect("rules").clone();
    let by = |alert: &str| rules.iter().find(|r| r["alert"] == alert).unwrap_or_else(|| panic!("no {alert}")).clone();
    for r in &rules {
        assert_eq!(r["labels"]["team"], "platform", "alertLabels: {r}");
        let expr = r["expr"].as_str().unwrap_or_default();
        assert!(expr.contains(r#"job="muster-full""#), "prometheusRule.job: {expr}");
    }
    let pending = by("MusterGangsPending");
    assert!(pending["expr"].as_str().unwrap_or_default().trim_end().ends_with("> 5"), "{pending}");
    assert_eq!((&pending["for"], &pending["labels"]["severity"]), (&Value::from("1h"), &Value::from("info")));
    let down = by("MusterDown");
    assert_eq!((&down["for"], &down["labels"]["severity"]), (&Value::from("3m"), &Value::from("page")));
    let no_leader = by("MusterNoLeader");
    assert!(no_leader["expr"].as_str().unwrap_or_default().contains("[15m]"), "{no_leader}");
    let slow = by("MusterAdmissionSlow");
    assert!(slow["expr"].as_str().unwrap_or_default().trim_end().ends_with("> 1800"), "{slow}");
    let bind = by("MusterBindTimeouts");
    assert!(bind["expr"].as_str().unwrap_or_default().contains("[30m])) > 2"), "{bind}");
    let rollbacks = by("MusterGangRollbacks");
    assert!(rollbacks["expr"].as_str().unwrap_or_default().contains("[1h])) > 10"), "{rollbacks}");
    let webhook = by("MusterWebhookErrors");
    assert!(webhook["expr"].as_str().unwrap_or_default().trim_end().ends_with("> 0.01"), "{webhook}");
    assert_eq!(webhook["labels"]["severity"], "critical");
    let reconcile = by("MusterReconcileErrors");
    assert!(reconcile["expr"].as_str().unwrap_or_default().trim_end().ends_with("> 0.5"), "{reconcile}");
    let objects = by("MusterAdmissionObjectErrors");
    assert!(objects["expr"].as_str().unwrap_or_default().contains("[30m])) > 50"), "{objects}");
    assert_eq!(by("MusterGPUsUnhealthy")["for"], "30m");
    assert!(by("MusterGPUConflicts")["expr"].as_str().unwrap_or_default().contains("[30m]"));
}

/// `promtool check rules` on `groups` (a rule file); its output, or what went wrong.
fn promtool_check(dir: &Path, name: &str, groups: &Value) -> Result<String, String> {
    let file = dir.join(name);
    std::fs::write(&file, serde_saphyr::to_string(groups).expect("yaml")).expect("rule file");
    let out = Command::new("promtool").arg("check").arg("rules").arg(&file).output().map_err(|e| {
        format!("promtool: {e} (it comes with Prometheus: `make host-deps`, Debian package prometheus)")
    })?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() { Ok(text) } else { Err(text) }
}

/// A dashboard query with Grafana's variables replaced by PromQL that means the same.
fn as_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("${__range}", "6h")
        .replace("$__range", "6h")
        .replace("$job", ".*")
        .replace("$node", ".*")
}

#[test]
fn rules_and_dashboard_queries_are_valid_promql() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, extra) in [
        ("default", vec![]),
        ("full", vec!["-f".to_string(), chart_dir().join("ci/full-values.yaml").display().to_string()]),
    ] {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let docs = observability_render(&extra);
        let rule = one(&docs, "PrometheusRule");
        let out = promtool_check(dir.path(), &format!("{name}-rules.yaml"), &rule["spec"])
            .unwrap_or_else(|e| panic!("{name}: promtool refused the PrometheusRule:\n{e}"));
        assert!(out.contains("SUCCESS: 11 rules found"), "{name}: {out}");
    }
    // Each panel query and variable query as a recording rule (label_values(...) is Grafana's:
    // its selector is checked).
    let d = dashboard(&observability_render(&[]));
    let queries = dashboard_queries(&d);
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, (_, q))| {
            let q = q.trim();
            let expr = match q.strip_prefix("label_values(").and_then(|r| r.strip_suffix(')')) {
                Some(inner) => top_level_args(inner)[0].clone(),
                None => q.to_string(),
            };
            serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": as_promql(&expr)})
        })
        .collect();
    let groups = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let out = promtool_check(dir.path(), "dashboard.yaml", &groups).unwrap_or_else(|e| {
        panic!(
            "promtool refused a dashboard query:\n{e}\nqueries:\n{}",
            serde_saphyr::to_string(&groups).unwrap_or_default()
        )
    });
    assert!(out.contains(&format!("SUCCESS: {} rules found", queries.len())), "{out}");
}

#[test]
fn dashboard_and_rules_name_only_metrics_muster_exports() {
    let docs = observability_render(&[]);
    let mut exprs = dashboard_queries(&dashboard(&docs));
    exprs.extend(rule_exprs(&docs));

    // muster as the chart runs it (its Deployment's arguments, the chart's ServiceAccount).
    let _lock = exclusive();
    let port = free_port();
    let release =
        Release::install(&chart_dir(), "muster-metrics", &["--set", &format!("webhook.url=https://127.0.0.1:{port}")]);
    let kubeconfig = release.service_account_kubeconfig();
    let deployment = one(&release.manifest(), "Deployment").clone();
    let muster = Muster::start(&deployment, &kubeconfig, &release.namespace, port, &[]);
    let exposition = eventually(
        "muster's /metrics",
        Duration::from_secs(30),
        || http_get(&muster.metrics, "/metrics").filter(|(code, _)| *code == 200).map(|(_, body)| body),
        || muster.log_text(),
    );
    let exported = exported_names(&exposition);
    eprintln!("muster exports {} series names: {exported:?}", exported.len());
    // What the check stands on: muster's families are listed before they have series.
    for family in
        ["muster_gangs_admitted_total", "muster_bind_timeouts_total", "muster_admission_latency_seconds_bucket"]
    {
        assert!(exported.contains(family), "{family} not on /metrics:\n{exposition}");
    }
    let unknown = unknown(&exprs, &exported);
    assert!(
        unknown.is_empty(),
        "the dashboard and rules name metrics muster does not export ({} of {} expressions checked):\n{}\n/metrics:\n{exposition}",
        unknown.len(),
        exprs.len(),
        unknown.iter().map(|(w, n)| format!("  {n} in {w}")).collect::<Vec<_>>().join("\n")
    );
    drop(muster);
    drop(release);
}
