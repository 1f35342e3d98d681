//! PURE: batch/v1's Job rules for the JobSpec fields a MusterJob shares with it
//! (`podFailurePolicy`, `backoffLimitPerIndex`, `maxFailedIndexes`, `successPolicy`,
//! `podReplacementPolicy`, `managedBy`, `selector`/`manualSelector`, elastic Indexed jobs),
//! with the field paths and, as near as they can be, the messages of Kubernetes 1.37's
//! `pkg/apis/batch/validation`. The CRD's CEL rules repeat the ones CEL can state at the same
//! paths; these run in the webhook, the controllers and `muster validate`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use muster_api::JOB_NAME_LABEL;
use muster_api::batch::{
    JobSuccessPolicy, MusterJobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule, PodReplacementPolicy,
};

use crate::workloadbuilder::field::{ErrorList, FieldError, FieldPath, dns_subdomain_errors, label_key_errors, quote};

/// Most rules of a `podFailurePolicy`.
pub const MAX_POD_FAILURE_POLICY_RULES: usize = 20;
/// Most values of an `onExitCodes` requirement.
pub const MAX_ON_EXIT_CODES_VALUES: usize = 255;
/// Most patterns of an `onPodConditions` requirement.
pub const MAX_ON_POD_CONDITIONS_PATTERNS: usize = 20;
/// Longest `managedBy`.
pub const MAX_MANAGED_BY_LENGTH: usize = 63;
/// Longest `succeededIndexes` of a success policy rule.
pub const MAX_SUCCEEDED_INDEXES_LENGTH: usize = 64 * 1024;
/// Most rules of a `successPolicy`.
pub const MAX_SUCCESS_POLICY_RULES: usize = 20;
/// Most failed indexes an Indexed job may tolerate (`maxFailedIndexes`).
pub const MAX_FAILED_INDEXES: i32 = 100_000;
/// Above this many completions, `backoffLimitPerIndex` needs `maxFailedIndexes`, and both it
/// and `parallelism` are bounded lower.
pub const COMPLETIONS_SOFT_LIMIT: i32 = 100_000;
/// `parallelism` and `maxFailedIndexes` bound above [`COMPLETIONS_SOFT_LIMIT`] completions
/// with `backoffLimitPerIndex`.
pub const LIMIT_FOR_HIGH_COMPLETIONS: i32 = 10_000;

const ACTIONS: [&str; 4] = ["Count", "FailIndex", "FailJob", "Ignore"];
const OPERATORS: [&str; 2] = ["In", "NotIn"];
const STATUSES: [&str; 3] = ["False", "True", "Unknown"];
const INDEXED: &str = "requires indexed completion mode";

/// The labels a pod of a job gets without `manualSelector` (batch/v1's generated ones, and
/// muster's job-name label). The uid is unknown to `muster validate`; no selector can match
/// the empty stand-in but by `Exists`, as no hand-written selector can match a uid not yet
/// given.
fn generated_labels(name: &str, uid: &str) -> BTreeMap<String, String> {
    [
        ("controller-uid", uid),
        ("batch.kubernetes.io/controller-uid", uid),
        ("job-name", name),
        ("batch.kubernetes.io/job-name", name),
        (JOB_NAME_LABEL, name),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The name and uid of the job a spec belongs to, for the generated-selector rule; `None` for
/// a replicatedJob's template (its children's names differ per replica).
#[derive(Clone, Copy, Debug, Default)]
pub struct Owner<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.uid` (empty before the API server gives one).
    pub uid: &'a str,
}

/// PURE: the create-time rules of batch/v1 for the new JobSpec fields of a spec at `path`
/// (run again on update, as upstream does).
pub fn spec_errors(spec: &MusterJobSpec, path: &FieldPath, owner: Option<Owner<'_>>) -> ErrorList {
    let mut errs = Vec::new();
    let non_negative = |errs: &mut ErrorList, p: FieldPath, v: i32| {
        if v < 0 {
            errs.push(FieldError::invalid(&p, v, "must be greater than or equal to 0"));
        }
    };
    if let Some(b) = spec.backoff_limit_per_index {
        non_negative(&mut errs, path.child("backoffLimitPerIndex"), b);
    }
    if let Some(m) = spec.max_failed_indexes {
        non_negative(&mut errs, path.child("maxFailedIndexes"), m);
        if spec.backoff_limit_per_index.is_none() {
            errs.push(FieldError::required(&path.child("backoffLimitPerIndex"), "when maxFailedIndexes is specified"));
        }
    }
    if let Some(m) = &spec.managed_by {
        errs.extend(managed_by_errors(m, &path.child("managedBy")));
    }
    if spec.indexed() {
        if let (Some(c), Some(m)) = (spec.completions, spec.max_failed_indexes)
            && m > c
        {
            errs.push(FieldError::invalid(
                &path.child("maxFailedIndexes"),
                m,
                "must be less than or equal to completions",
            ));
        }
        if let Some(m) = spec.max_failed_indexes.filter(|m| *m > MAX_FAILED_INDEXES) {
            errs.push(FieldError::invalid(
                &path.child("maxFailedIndexes"),
                m,
                format!("must be less than or equal to {MAX_FAILED_INDEXES}"),
            ));
        }
        if spec.completions.is_some_and(|c| c > COMPLETIONS_SOFT_LIMIT) && spec.backoff_limit_per_index.is_some() {
            let why =
                format!("when completions are above {COMPLETIONS_SOFT_LIMIT} and used with backoff limit per index");
            match spec.max_failed_indexes {
                None => errs.push(FieldError::required(
                    &path.child("maxFailedIndexes"),
                    format!("must be specified when completions is above {COMPLETIONS_SOFT_LIMIT}"),
                )),
                Some(m) if m > LIMIT_FOR_HIGH_COMPLETIONS => errs.push(FieldError::invalid(
                    &path.child("maxFailedIndexes"),
                    m,
                    format!("must be less than or equal to {LIMIT_FOR_HIGH_COMPLETIONS} {why}"),
                )),
                Some(_) => {}
            }
            if spec.parallelism > LIMIT_FOR_HIGH_COMPLETIONS {
                errs.push(FieldError::invalid(
                    &path.child("parallelism"),
                    spec.parallelism,
                    format!("must be less than or equal to {LIMIT_FOR_HIGH_COMPLETIONS} {why}"),
                ));
            }
        }
    } else {
        if let Some(b) = spec.backoff_limit_per_index {
            errs.push(FieldError::invalid(&path.child("backoffLimitPerIndex"), b, INDEXED));
        }
        if let Some(m) = spec.max_failed_indexes {
            errs.push(FieldError::invalid(&path.child("maxFailedIndexes"), m, INDEXED));
        }
    }
    if let Some(policy) = &spec.pod_failure_policy {
        errs.extend(pod_failure_policy_errors(spec, policy, &path.child("podFailurePolicy")));
    }
    if let Some(policy) = &spec.success_policy {
        if !spec.indexed() {
            errs.push(FieldError::invalid(&path.child("successPolicy"), "{...}", INDEXED));
        } else if let Some(completions) = spec.completions {
            errs.extend(success_policy_errors(policy, completions, &path.child("successPolicy")));
        }
    }
    if spec.pod_failure_policy.is_some()
        && spec.pod_replacement_policy.is_some_and(|p| p != PodReplacementPolicy::Failed)
    {
        errs.push(FieldError::not_supported(
            &path.child("podReplacementPolicy"),
            quote("TerminatingOrFailed"),
            &["Failed"],
        ));
    }
    if spec.pod_failure_policy.is_some() {
        let policy = spec.template.spec.as_ref().and_then(|s| s.restart_policy.as_deref());
        if policy == Some("OnFailure") {
            errs.push(FieldError::invalid(
                &path.child("template").child("spec").child("restartPolicy"),
                quote("OnFailure"),
                "only \"Never\" is supported when podFailurePolicy is specified",
            ));
        }
    }
    errs.extend(selector_errors(spec, path, owner));
    errs
}

/// `managedBy` as upstream checks it: a domain-prefixed path (`acme.io/foo`) of at most 63
/// characters.
pub fn managed_by_errors(value: &str, path: &FieldPath) -> ErrorList {
    let mut errs = domain_prefixed_path_errors(value, path);
    if value.len() > MAX_MANAGED_BY_LENGTH {
        errs.push(FieldError::too_long(path, MAX_MANAGED_BY_LENGTH));
    }
    errs
}

/// apimachinery's `IsDomainPrefixedPath`.
fn domain_prefixed_path_errors(value: &str, path: &FieldPath) -> ErrorList {
    if value.is_empty() {
        return vec![FieldError::required(path, "")];
    }
    let Some((host, rest)) = value.split_once('/').filter(|(h, r)| !h.is_empty() && !r.is_empty()) else {
        return vec![FieldError::invalid(
            path,
            quote(value),
            "must be a domain-prefixed path (such as \"acme.io/foo\")",
        )];
    };
    let mut errs: ErrorList =
        dns_subdomain_errors(host).into_iter().map(|m| FieldError::invalid(path, quote(host), m)).collect();
    let http_path = |c: char| c.is_ascii_alphanumeric() || "/-._~%!$&'()*+,;=:".contains(c);
    if !rest.chars().all(http_path) {
        errs.push(FieldError::invalid(
            path,
            quote(rest),
            "Invalid path (regex used for validation is '[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+')",
        ));
    }
    errs
}

fn pod_failure_policy_errors(spec: &MusterJobSpec, policy: &PodFailurePolicy, path: &FieldPath) -> ErrorList {
    let mut errs = Vec::new();
    let rules_path = path.child("rules");
    if policy.rules.len() > MAX_POD_FAILURE_POLICY_RULES {
        errs.push(FieldError::too_many(&rules_path, policy.rules.len(), MAX_POD_FAILURE_POLICY_RULES));
    }
    let pod = spec.template.spec.as_ref();
    let containers: BTreeSet<&str> = pod
        .into_iter()
        .flat_map(|p| p.containers.iter().chain(p.init_containers.iter().flatten()))
        .map(|c| c.name.as_str())
        .collect();
    for (i, rule) in policy.rules.iter().enumerate() {
        errs.extend(rule_errors(spec, rule, &rules_path.index(i), &containers));
    }
    errs
}

fn rule_errors(
    spec: &MusterJobSpec,
    rule: &PodFailurePolicyRule,
    path: &FieldPath,
    containers: &BTreeSet<&str>,
) -> ErrorList {
    let mut errs = Vec::new();
    let action_path = path.child("action");
    match rule.action.as_str() {
        "" => errs.push(FieldError::required(&action_path, format!("valid values: {}", go_list(&ACTIONS)))),
        "FailIndex" if spec.backoff_limit_per_index.is_none() => errs.push(FieldError::invalid(
            &action_path,
            quote("FailIndex"),
            "requires the backoffLimitPerIndex to be set",
        )),
        a if !ACTIONS.contains(&a) => errs.push(FieldError::not_supported(&action_path, quote(a), &ACTIONS)),
        _ => {}
    }
    if let Some(on) = &rule.on_exit_codes {
        errs.extend(exit_codes_errors(on, &path.child("onExitCodes"), containers));
    }
    let conditions = rule.on_pod_conditions.as_deref().unwrap_or_default();
    if !conditions.is_empty() {
        errs.extend(pod_conditions_errors(conditions, &path.child("onPodConditions")));
    }
    match (rule.on_exit_codes.is_some(), !conditions.is_empty()) {
        (true, true) => {
            errs.push(omitted_value(path, "specifying both OnExitCodes and OnPodConditions is not supported"))
        }
        (false, false) => {
            errs.push(omitted_value(path, "specifying one of OnExitCodes and OnPodConditions is required"))
        }
        _ => {}
    }
    errs
}

fn exit_codes_errors(
    on: &PodFailurePolicyOnExitCodesRequirement,
    path: &FieldPath,
    containers: &BTreeSet<&str>,
) -> ErrorList {
    let mut errs = Vec::new();
    let operator_path = path.child("operator");
    match on.operator.as_str() {
        "" => errs.push(FieldError::required(&operator_path, format!("valid values: {}", go_list(&OPERATORS)))),
        o if !OPERATORS.contains(&o) => errs.push(FieldError::not_supported(&operator_path, quote(o), &OPERATORS)),
        _ => {}
    }
    if let Some(name) = on.container_name.as_deref().filter(|n| !containers.contains(n)) {
        errs.push(FieldError::invalid(
            &path.child("containerName"),
            quote(name),
            "must be one of the container or initContainer names in the pod template",
        ));
    }
    let values_path = path.child("values");
    let shown = || format!("{:?}", on.values);
    if on.values.is_empty() {
        errs.push(FieldError::invalid(&values_path, "[]", "at least one value is required"));
    } else if on.values.len() > MAX_ON_EXIT_CODES_VALUES {
        errs.push(FieldError::too_many(&values_path, on.values.len(), MAX_ON_EXIT_CODES_VALUES));
    }
    let mut seen = BTreeSet::new();
    for (j, v) in on.values.iter().enumerate() {
        let value_path = values_path.index(j);
        if on.operator == "In" && *v == 0 {
            errs.push(FieldError::invalid(&value_path, v, "must not be 0 for the In operator"));
        }
        if !seen.insert(*v) {
            errs.push(FieldError::duplicate(&value_path, v));
        }
    }
    if on.values.windows(2).any(|w| w[0] > w[1]) {
        errs.push(FieldError::invalid(&values_path, shown(), "must be ordered"));
    }
    errs
}

fn pod_conditions_errors(patterns: &[PodFailurePolicyOnPodConditionsPattern], path: &FieldPath) -> ErrorList {
    let mut errs = Vec::new();
    if patterns.len() > MAX_ON_POD_CONDITIONS_PATTERNS {
        errs.push(FieldError::too_many(path, patterns.len(), MAX_ON_POD_CONDITIONS_PATTERNS));
    }
    for (j, p) in patterns.iter().enumerate() {
        let pattern_path = path.index(j);
        for msg in label_key_errors(&p.type_) {
            errs.push(FieldError::invalid(&pattern_path.child("type"), quote(&p.type_), msg));
        }
        // An unset (or empty) status is defaulted to True, as batch/v1 defaults it.
        if let Some(status) = p.status.as_deref().filter(|s| !s.is_empty() && !STATUSES.contains(s)) {
            errs.push(FieldError::not_supported(&pattern_path.child("status"), quote(status), &STATUSES));
        }
    }
    errs
}

fn success_policy_errors(policy: &JobSuccessPolicy, completions: i32, path: &FieldPath) -> ErrorList {
    let mut errs = Vec::new();
    let rules_path = path.child("rules");
    if policy.rules.is_empty() {
        errs.push(FieldError::required(
            &rules_path,
            "at least one rules must be specified when the successPolicy is specified",
        ));
    }
    if policy.rules.len() > MAX_SUCCESS_POLICY_RULES {
        errs.push(FieldError::too_many(&rules_path, policy.rules.len(), MAX_SUCCESS_POLICY_RULES));
    }
    for (i, rule) in policy.rules.iter().enumerate() {
        let rule_path = rules_path.index(i);
        if rule.succeeded_count.is_none() && rule.succeeded_indexes.is_none() {
            errs.push(FieldError::required(
                &rule_path,
                "at least one of succeededCount or succeededIndexes must be specified",
            ));
        }
        let mut total = 0;
        if let Some(indexes) = &rule.succeeded_indexes {
            let p = rule_path.child("succeededIndexes");
            if indexes.len() > MAX_SUCCEEDED_INDEXES_LENGTH {
                errs.push(FieldError::too_long(&p, MAX_SUCCEEDED_INDEXES_LENGTH));
            }
            match indexes_total(indexes, completions) {
                Ok(t) => total = t,
                Err(e) => {
                    errs.push(FieldError::invalid(&p, quote(indexes), format!("error parsing succeededIndexes: {e}")))
                }
            }
        }
        if let Some(count) = rule.succeeded_count {
            let p = rule_path.child("succeededCount");
            if count < 0 {
                errs.push(FieldError::invalid(&p, count, "must be greater than or equal to 0"));
            }
            if count > completions {
                errs.push(FieldError::invalid(
                    &p,
                    count,
                    format!("must be less than or equal to {completions} (the number of specified completions)"),
                ));
            }
            if rule.succeeded_indexes.is_some() && i64::from(count) > total {
                errs.push(FieldError::invalid(
                    &p,
                    count,
                    format!(
                        "must be less than or equal to {total} (the number of indexes in the specified succeededIndexes field)"
                    ),
                ));
            }
        }
    }
    errs
}

/// PURE: the number of indexes in an interval list like `0-2,5` (batch/v1's format: increasing,
/// each below `completions`), or why it is not one. Empty is zero indexes.
pub fn indexes_total(indexes: &str, completions: i32) -> Result<i64, String> {
    if indexes.is_empty() {
        return Ok(0);
    }
    let mut last: Option<i64> = None;
    let mut total = 0i64;
    for interval in indexes.split(',') {
        let (x, y) = parse_interval(interval, completions)?;
        if let Some(l) = last.filter(|l| *l >= x) {
            return Err(format!("non-increasing order, previous: {l}, current: {x}"));
        }
        total += y - x + 1;
        last = Some(y);
    }
    Ok(total)
}

fn parse_interval(interval: &str, completions: i32) -> Result<(i64, i64), String> {
    let parts: Vec<&str> = interval.split('-').collect();
    if parts.len() > 2 {
        return Err(format!(
            "the fragment {interval:?} violates the requirement that an index interval can have at most two parts separated by '-'"
        ));
    }
    let number = |s: &str| -> Result<i64, String> {
        let v: i64 = s.parse().map_err(|_| format!("cannot convert string to integer for index: {s:?}"))?;
        if v >= i64::from(completions) {
            return Err(format!("too large index: {s:?}"));
        }
        Ok(v)
    };
    let x = number(parts[0])?;
    let Some(second) = parts.get(1) else { return Ok((x, x)) };
    let y = number(second)?;
    if x >= y {
        return Err(format!("non-increasing order, previous: {x}, current: {y}"));
    }
    Ok((x, y))
}

/// `Invalid value: detail`, without the value (upstream's `field.OmitValueType`).
fn omitted_value(path: &FieldPath, detail: &str) -> FieldError {
    FieldError { value: None, ..FieldError::invalid(path, "", detail) }
}

/// Labels as upstream shows them in an error: JSON, `null` when there are none.
fn shown_labels(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() { "null".to_string() } else { serde_json::to_string(labels).unwrap_or_default() }
}

/// Go's `%q` of a string slice: `["a" "b"]`.
fn go_list(values: &[&str]) -> String {
    format!("[{}]", values.iter().map(|v| quote(v)).collect::<Vec<_>>().join(" "))
}

/// `selector` and `manualSelector` as batch/v1 allows them: with `manualSelector: true` the
/// selector is required and must match the template's labels; without it a selector may only
/// select what would be generated (the job's own name and uid labels), so any other selector
/// is refused as not auto-generated.
fn selector_errors(spec: &MusterJobSpec, path: &FieldPath, owner: Option<Owner<'_>>) -> ErrorList {
    let mut errs = Vec::new();
    let manual = spec.manual_selector == Some(true);
    let selector_path = path.child("selector");
    let labels_path = path.child("template").child("metadata").child("labels");
    let mut labels: BTreeMap<String, String> =
        spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    let Some(selector) = &spec.selector else {
        if manual {
            // As upstream: no selector selects nothing, so not the template's labels either.
            errs.push(FieldError::required(&selector_path, ""));
            errs.push(FieldError::invalid(
                &labels_path,
                shown_labels(&labels),
                "`selector` does not match template `labels`",
            ));
        }
        return errs;
    };
    let shape = label_selector_errors(selector, &selector_path);
    let valid = shape.is_empty();
    errs.extend(shape);
    if !valid {
        return errs;
    }
    if !manual {
        let owner = owner.unwrap_or_default();
        let generated = generated_labels(owner.name, owner.uid);
        if !matches(selector, &generated) {
            errs.push(FieldError::invalid(&selector_path, "{...}", "`selector` not auto-generated"));
        }
        labels.extend(generated);
    }
    if !matches(selector, &labels) {
        errs.push(FieldError::invalid(
            &labels_path,
            shown_labels(&labels),
            "`selector` does not match template `labels`",
        ));
    }
    errs
}

/// apimachinery's `ValidateLabelSelector`, on what a typed selector can hold.
fn label_selector_errors(selector: &LabelSelector, path: &FieldPath) -> ErrorList {
    let mut errs = Vec::new();
    for (i, req) in selector.match_expressions.iter().flatten().enumerate() {
        let p = path.child("matchExpressions").index(i);
        match req.operator.as_str() {
            "In" | "NotIn" => {
                if req.values.as_ref().is_none_or(|v| v.is_empty()) {
                    errs.push(FieldError::required(
                        &p.child("values"),
                        "must be specified when `operator` is 'In' or 'NotIn'",
                    ));
                }
            }
            "Exists" | "DoesNotExist" => {
                if req.values.as_ref().is_some_and(|v| !v.is_empty()) {
                    errs.push(FieldError::forbidden(
                        &p.child("values"),
                        "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                    ));
                }
            }
            o => errs.push(FieldError::invalid(&p.child("operator"), quote(o), "not a valid selector operator")),
        }
        for msg in label_key_errors(&req.key) {
            errs.push(FieldError::invalid(&p.child("key"), quote(&req.key), msg));
        }
        for v in req.values.iter().flatten() {
            for msg in label_value_errors(v) {
                errs.push(FieldError::invalid(&p.child("values"), quote(v), msg));
            }
        }
    }
    for (k, v) in selector.match_labels.iter().flatten() {
        let p = path.child("matchLabels");
        for msg in label_key_errors(k) {
            errs.push(FieldError::invalid(&p, quote(k), msg));
        }
        for msg in label_value_errors(v) {
            errs.push(FieldError::invalid(&p, quote(v), msg));
        }
    }
    errs
}

/// A label value: at most 63 characters, alphanumeric at both ends, `-_.` inside; may be empty.
pub fn label_value_errors(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    if value.len() > 63 {
        out.push("must be no more than 63 characters".to_string());
    }
    let b = value.as_bytes();
    let ok = b.is_empty()
        || (b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric());
    if !ok {
        out.push("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_string());
    }
    out
}

/// PURE: whether a (valid) label selector selects `labels`.
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = selector.match_expressions.iter().flatten().all(|req| {
        let value = labels.get(&req.key);
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    by_labels && by_expressions
}

/// PURE: the update rules of batch/v1 for the new fields: `podFailurePolicy`,
/// `backoffLimitPerIndex`, `managedBy`, `successPolicy`, `selector` are immutable; `completions`
/// too, except that an Indexed job may change it together with `parallelism` (elastic Indexed
/// jobs: the new completions must equal the new parallelism).
pub fn update_errors(spec: &MusterJobSpec, old: &MusterJobSpec, path: &FieldPath) -> ErrorList {
    let mut errs = Vec::new();
    let immutable = |errs: &mut ErrorList, name: &str, changed: bool, shown: String| {
        if changed {
            errs.push(FieldError::invalid(&path.child(name), shown, "field is immutable"));
        }
    };
    let shown_i32 = |v: Option<i32>| v.map_or_else(|| "null".to_string(), |v| v.to_string());
    if spec.completions != old.completions {
        let shown = shown_i32(spec.completions);
        match spec.completions {
            // Indexed jobs cannot clear completions; that is told as required, not here.
            None if spec.indexed() => {}
            Some(c) if spec.indexed() => {
                if c != spec.parallelism {
                    errs.push(FieldError::invalid(
                        &path.child("completions"),
                        c,
                        format!("can only be modified in tandem with {}", FieldPath::new("spec").child("parallelism")),
                    ));
                }
            }
            _ => immutable(&mut errs, "completions", true, shown),
        }
    }
    immutable(&mut errs, "podFailurePolicy", spec.pod_failure_policy != old.pod_failure_policy, "{...}".to_string());
    immutable(
        &mut errs,
        "backoffLimitPerIndex",
        spec.backoff_limit_per_index != old.backoff_limit_per_index,
        shown_i32(spec.backoff_limit_per_index),
    );
    immutable(
        &mut errs,
        "managedBy",
        spec.managed_by != old.managed_by,
        spec.managed_by.as_deref().map_or_else(|| "null".to_string(), quote),
    );
    immutable(&mut errs, "successPolicy", spec.success_policy != old.success_policy, "{...}".to_string());
    immutable(&mut errs, "selector", spec.selector != old.selector, "{...}".to_string());
    errs
}

#[cfg(test)]
mod tests;
