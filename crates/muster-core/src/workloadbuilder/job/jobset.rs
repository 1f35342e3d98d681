//! PURE: JobSet v1alpha2's rules for a MusterJobSet's own fields (kubernetes-sigs/jobset's
//! webhook and CRD rules): `startupPolicy` and `dependsOn`, `failurePolicy` rules, the
//! targets of rules and of `successPolicy`, `coordinator`, `network.subdomain`, `managedBy`,
//! and on update the fields JobSet freezes. Each error names the field it is about (JobSet's
//! webhook gives most of them without a path).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use muster_api::batch::{CompletionMode, MusterJobSet, MusterJobSetSpec, MusterJobSpec, StartupPolicyOrder};

use super::batchv1::{label_value_errors, managed_by_errors};
use crate::workloadbuilder::field::{ErrorList, FieldError, FieldPath, dns_subdomain_errors, quote};

/// The `Failed` reasons of a child job a failure policy rule may name (batch/v1's).
pub const JOB_FAILURE_REASONS: [&str; 5] =
    ["BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes", "MaxFailedIndexesExceeded", "PodFailurePolicy"];
/// Longest failure policy rule name.
pub const MAX_RULE_NAME_LENGTH: usize = 128;
/// The message of JobSet's CEL rule on `startupPolicy` with `dependsOn`.
pub const STARTUP_AND_DEPENDS_ON: &str = "StartupPolicy and DependsOn APIs are mutually exclusive";
/// The message of JobSet's immutability rules.
pub const VALUE_IS_IMMUTABLE: &str = "Value is immutable";

/// The spec of a replicatedJob's template as its children run it: `Indexed` when the mode is
/// unset (as JobSet defaults its Jobs), with `completions` defaulting to `parallelism`.
pub fn child_spec(spec: &MusterJobSpec) -> Cow<'_, MusterJobSpec> {
    if spec.completion_mode.is_some() {
        return Cow::Borrowed(spec);
    }
    let mut s = spec.clone();
    s.completion_mode = Some(CompletionMode::Indexed);
    s.completions = s.completions.or(Some(s.parallelism));
    Cow::Owned(s)
}

/// True for a failure policy rule name: `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`.
pub fn is_rule_name(name: &str) -> bool {
    let b = name.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b',' | b':');
    !b.is_empty()
        && b[0].is_ascii_alphabetic()
        && b.iter().all(inner)
        && (b.len() == 1 || b[b.len() - 1].is_ascii_alphanumeric() || b[b.len() - 1] == b'_')
}

/// DNS-1035 label messages (a Service name: starts with a letter).
fn dns1035_errors(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    if value.len() > 63 {
        out.push("must be no more than 63 characters".to_string());
    }
    let b = value.as_bytes();
    let ok = !b.is_empty()
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-';
    if !ok {
        out.push("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')".to_string());
    }
    out
}

/// Why an ordered start (`startupPolicy: InOrder`, `dependsOn`) is refused under a gang
/// `spec.scheduling`.
pub const ORDERED_START_WITH_GANG: &str = "may not be combined with spec.scheduling.schedulingPolicy.gang: the set's \
     CompositePodGroup admits all its children together, so children created later would keep the earlier ones from \
     ever starting; use schedulingPolicy.basic (each child keeps its own gang) or drop the ordering";

/// PURE: JobSet's create-time rules on a MusterJobSet's own fields (rerun on update).
pub fn set_errors(set: &MusterJobSet) -> ErrorList {
    let spec = &set.spec;
    let spec_path = FieldPath::new("spec");
    let rjobs_path = spec_path.child("replicatedJobs");
    let mut errs = Vec::new();
    let in_order = spec.startup_policy.as_ref().is_some_and(|p| p.startup_policy_order == StartupPolicyOrder::InOrder);
    if in_order && spec.replicated_jobs.iter().any(|r| !r.depends_on.is_empty()) {
        errs.push(FieldError::invalid(&spec_path, quote("object"), STARTUP_AND_DEPENDS_ON));
    }
    // muster's own rule: a gang CompositePodGroup admits every child together, so children made
    // only once earlier ones are ready would keep those from ever starting.
    let gang = spec.scheduling.as_ref().and_then(|s| s.scheduling_policy.as_ref()).is_some_and(|p| p.gang.is_some());
    if gang && in_order {
        errs.push(FieldError::invalid(
            &spec_path.child("startupPolicy").child("startupPolicyOrder"),
            quote("InOrder"),
            ORDERED_START_WITH_GANG,
        ));
    }
    let index: BTreeMap<&str, usize> =
        spec.replicated_jobs.iter().enumerate().map(|(i, r)| (r.name.as_str(), i)).rev().collect();
    for (i, rjob) in spec.replicated_jobs.iter().enumerate() {
        if let Some(group) = rjob.group_name.as_deref() {
            for m in dns1035_errors(group) {
                let m = if m.contains("must be no more than 63 characters") {
                    ".spec.replicatedJob[].groupName is too long, must be less than 63 characters".to_string()
                } else {
                    m
                };
                errs.push(FieldError::invalid(&rjobs_path.index(i).child("groupName"), quote(group), m));
            }
        }
        let path = rjobs_path.index(i).child("dependsOn");
        if gang && !rjob.depends_on.is_empty() {
            errs.push(FieldError::forbidden(&path, ORDERED_START_WITH_GANG));
        }
        if i == 0 && !rjob.depends_on.is_empty() {
            errs.push(FieldError::forbidden(&path, "DependsOn can't be set for the first ReplicatedJob"));
            continue;
        }
        for (j, dep) in rjob.depends_on.iter().enumerate() {
            if index.get(dep.name.as_str()).is_none_or(|k| *k >= i) {
                errs.push(FieldError::invalid(
                    &path.index(j).child("name"),
                    quote(&dep.name),
                    format!(
                        "must name an earlier replicatedJob (replicatedJob: {} cannot depend on replicatedJob: {})",
                        rjob.name, dep.name
                    ),
                ));
            }
        }
    }
    if let Some(sub) = spec.network.as_ref().and_then(|n| n.subdomain.as_deref()).filter(|s| !s.is_empty()) {
        let path = spec_path.child("network").child("subdomain");
        let mut msgs = dns_subdomain_errors(sub);
        msgs.extend(dns1035_errors(sub).into_iter().map(|m| {
            if m.contains("must be no more than 63 characters") {
                ".spec.network.subdomain is too long, must be less than 63 characters".to_string()
            } else {
                m
            }
        }));
        errs.extend(msgs.into_iter().map(|m| FieldError::invalid(&path, quote(sub), m)));
    }
    if let Some(m) = &spec.managed_by {
        errs.extend(managed_by_errors(m, &spec_path.child("managedBy")));
    }
    errs.extend(failure_policy_errors(spec, &spec_path.child("failurePolicy")));
    errs.extend(coordinator_errors(set, &spec_path.child("coordinator")));
    errs
}

fn failure_policy_errors(spec: &MusterJobSetSpec, path: &FieldPath) -> ErrorList {
    let mut errs = Vec::new();
    let Some(policy) = &spec.failure_policy else { return errs };
    let rules_path = path.child("rules");
    let mut by_name: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, rule) in policy.rules.iter().enumerate() {
        let rule_path = rules_path.index(i);
        by_name.entry(rule.name.as_str()).or_default().push(i);
        let name_path = rule_path.child("name");
        if rule.name.is_empty() {
            errs.push(FieldError::required(&name_path, ""));
        } else if rule.name.len() > MAX_RULE_NAME_LENGTH {
            errs.push(FieldError::too_long(&name_path, MAX_RULE_NAME_LENGTH));
        } else if !is_rule_name(&rule.name) {
            errs.push(FieldError::invalid(
                &name_path,
                quote(&rule.name),
                "a failure policy rule name must start with an alphabetic character, optionally followed by a string of alphanumeric characters or '_,:', and must end with an alphanumeric character or '_'",
            ));
        }
        for (k, target) in rule.target_replicated_jobs.iter().enumerate() {
            if !spec.replicated_jobs.iter().any(|r| &r.name == target) {
                errs.push(FieldError::invalid(
                    &rule_path.child("targetReplicatedJobs").index(k),
                    quote(target),
                    "must name a replicatedJob of this set",
                ));
            }
        }
        for (k, pattern) in rule.on_job_failure_message_patterns.iter().enumerate() {
            if let Some(why) = regex_error(pattern) {
                errs.push(FieldError::invalid(
                    &rule_path.child("onJobFailureMessagePatterns").index(k),
                    quote(pattern),
                    format!("must be a regular expression: {why}"),
                ));
            }
        }
        for (k, reason) in rule.on_job_failure_reasons.iter().enumerate() {
            if !JOB_FAILURE_REASONS.contains(&reason.as_str()) {
                errs.push(FieldError::not_supported(
                    &rule_path.child("onJobFailureReasons").index(k),
                    quote(reason),
                    &JOB_FAILURE_REASONS,
                ));
            }
        }
    }
    for (name, at) in by_name.iter().filter(|(_, at)| at.len() > 1) {
        let list: Vec<String> = at.iter().map(|i| i.to_string()).collect();
        errs.push(FieldError::invalid(
            &rules_path,
            quote(name),
            format!("rule names are not unique, rules with indices [{}] all have the same name", list.join(" ")),
        ));
    }
    errs
}

/// Why `pattern` is not a regular expression (compiled as the set controller matches it, by
/// CEL's `matches`), or `None` when it is one.
pub fn regex_error(pattern: &str) -> Option<String> {
    static PROGRAM: OnceLock<Option<cel::Program>> = OnceLock::new();
    let program = PROGRAM.get_or_init(|| cel::Program::compile("''.matches(p)").ok()).as_ref()?;
    let mut ctx = cel::Context::default();
    ctx.add_variable_from_value("p", cel::Value::String(Arc::new(pattern.to_string())));
    program.execute(&ctx).err().map(|e| e.to_string())
}

/// The coordinator names a replicatedJob, a child of it (`jobIndex` < `replicas`) and a pod of
/// that child (`podIndex` < its Indexed template's `completions`); its DNS name, the value of
/// the coordinator label, must be a label value.
fn coordinator_errors(set: &MusterJobSet, path: &FieldPath) -> ErrorList {
    let spec = &set.spec;
    let mut errs = Vec::new();
    let Some(c) = &spec.coordinator else { return errs };
    let Some(rjob) = spec.replicated_jobs.iter().find(|r| r.name == c.replicated_job) else {
        errs.push(FieldError::invalid(
            &path.child("replicatedJob"),
            quote(&c.replicated_job),
            "must name a replicatedJob of this set",
        ));
        return errs;
    };
    if c.job_index < 0 || c.job_index >= rjob.replicas {
        errs.push(FieldError::invalid(
            &path.child("jobIndex"),
            c.job_index,
            format!("must be less than {} (the replicas of replicatedJob {})", rjob.replicas, rjob.name),
        ));
        return errs;
    }
    let child = child_spec(&rjob.template.spec);
    let Some(completions) = child.completions.filter(|_| child.indexed()) else {
        errs.push(FieldError::invalid(
            &path.child("replicatedJob"),
            quote(&c.replicated_job),
            "job for coordinator pod must be indexed completion mode, and completions number must be set",
        ));
        return errs;
    };
    if c.pod_index < 0 || c.pod_index >= completions {
        errs.push(FieldError::invalid(
            &path.child("podIndex"),
            c.pod_index,
            format!("must be less than {completions} (the completions of replicatedJob {})", rjob.name),
        ));
        return errs;
    }
    let set_name = set.metadata.name.as_deref().unwrap_or_default();
    if !set_name.is_empty() {
        let subdomain = spec.network.as_ref().and_then(|n| n.subdomain.as_deref()).filter(|s| !s.is_empty());
        let endpoint =
            format!("{set_name}-{}-{}-{}.{}", rjob.name, c.job_index, c.pod_index, subdomain.unwrap_or(set_name));
        let msgs = label_value_errors(&endpoint);
        if !msgs.is_empty() {
            errs.push(FieldError::invalid(
                path,
                quote(&endpoint),
                format!(
                    "spec will lead to invalid label value for the coordinator label (long MusterJobSet / replicatedJob / subdomain name?): {}",
                    msgs.join(", ")
                ),
            ));
        }
    }
    errs
}

/// PURE: the fields JobSet freezes: `network`, `successPolicy`, `failurePolicy`,
/// `startupPolicy`, `managedBy`, and each replicatedJob's `dependsOn`.
pub fn set_update_errors(spec: &MusterJobSetSpec, old: &MusterJobSetSpec) -> ErrorList {
    let spec_path = FieldPath::new("spec");
    let mut errs = Vec::new();
    let mut frozen = |name: &str, changed: bool| {
        if changed {
            errs.push(FieldError::invalid(&spec_path.child(name), quote("object"), VALUE_IS_IMMUTABLE));
        }
    };
    frozen("network", spec.network != old.network);
    frozen("successPolicy", spec.success_policy != old.success_policy);
    frozen("failurePolicy", spec.failure_policy != old.failure_policy);
    frozen("startupPolicy", spec.startup_policy != old.startup_policy);
    if spec.managed_by != old.managed_by {
        errs.push(FieldError::invalid(
            &spec_path.child("managedBy"),
            spec.managed_by.as_deref().map_or_else(|| "null".to_string(), quote),
            "field is immutable",
        ));
    }
    for (i, rjob) in spec.replicated_jobs.iter().enumerate() {
        if let Some(o) = old.replicated_jobs.iter().find(|o| o.name == rjob.name)
            && o.depends_on != rjob.depends_on
        {
            errs.push(FieldError::invalid(
                &spec_path.child("replicatedJobs").index(i).child("dependsOn"),
                quote("array"),
                VALUE_IS_IMMUTABLE,
            ));
        }
    }
    errs
}

#[cfg(test)]
mod tests;
