//! PURE: batch/v1's `podFailurePolicy` and `successPolicy`, matched as the Job controller of
//! Kubernetes 1.37 matches them.

use std::collections::BTreeSet;

use muster_api::batch::{JobSuccessPolicy, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement};

use super::ObservedPod;
use crate::pods::Lifecycle;

/// What a `podFailurePolicy` rule does with a failed pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// The job fails at once (reason `PodFailurePolicy`).
    FailJob,
    /// The pod's index fails at once (with `backoffLimitPerIndex`).
    FailIndex,
    /// The failure counts toward no limit; the pod is replaced.
    Ignore,
    /// The failure counts, as without a rule.
    Count,
}

impl Action {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "FailJob" => Action::FailJob,
            "FailIndex" => Action::FailIndex,
            "Ignore" => Action::Ignore,
            "Count" => Action::Count,
            _ => return None,
        })
    }
}

/// The first rule of `policy` a failed pod matches: its action and, for `FailJob`, the job's
/// failure message (upstream's words: `Container main for pod ns/p failed with exit code 42
/// matching FailJob rule at index 0`). Only pods in phase Failed are matched.
pub fn match_pod_failure_policy(
    policy: &PodFailurePolicy,
    namespace: &str,
    pod: &ObservedPod,
) -> Option<(Action, Option<String>)> {
    if pod.phase != Lifecycle::Failed {
        return None;
    }
    for (index, rule) in policy.rules.iter().enumerate() {
        let Some(action) = Action::parse(&rule.action) else { continue };
        let message = if let Some(req) = &rule.on_exit_codes {
            let Some((container, code)) = matching_exit_code(pod, req) else { continue };
            format!(
                "Container {container} for pod {namespace}/{} failed with exit code {code} matching {} rule at index {index}",
                pod.name, rule.action
            )
        } else if let Some(patterns) = &rule.on_pod_conditions {
            let matched = pod.conditions.iter().find(|(type_, status)| {
                patterns.iter().any(|p| &p.type_ == type_ && p.status.as_deref().unwrap_or("True") == status)
            });
            let Some((type_, _)) = matched else { continue };
            format!("Pod {namespace}/{} has condition {type_} matching {} rule at index {index}", pod.name, rule.action)
        } else {
            continue;
        };
        return Some((action, (action == Action::FailJob).then_some(message)));
    }
    None
}

/// The first terminated container (containers before init containers, as the pod lists them)
/// whose non-zero exit code meets `req`: exit code 0 never matches, not even `NotIn`.
fn matching_exit_code<'a>(
    pod: &'a ObservedPod,
    req: &PodFailurePolicyOnExitCodesRequirement,
) -> Option<(&'a str, i32)> {
    pod.exit_codes
        .iter()
        .filter(|(name, code)| *code != 0 && req.container_name.as_deref().is_none_or(|c| c == name))
        .find(|(_, code)| match req.operator.as_str() {
            "In" => req.values.contains(code),
            "NotIn" => !req.values.contains(code),
            _ => false,
        })
        .map(|(name, code)| (name.as_str(), *code))
}

/// The message of the first `successPolicy` rule the succeeded indexes meet (`Matched rules at
/// index N`), if any. `completions` bounds the rules' `succeededIndexes`.
pub fn match_success_policy(policy: &JobSuccessPolicy, completions: i32, succeeded: &BTreeSet<i32>) -> Option<String> {
    if succeeded.is_empty() {
        return None;
    }
    for (index, rule) in policy.rules.iter().enumerate() {
        let met = if let Some(text) = &rule.succeeded_indexes {
            let required = super::parse_indexes(text, completions);
            if required.is_empty() {
                continue;
            }
            let contained = required.intersection(succeeded).count();
            contained == required.len() || rule.succeeded_count.is_some_and(|n| contained as i64 >= i64::from(n))
        } else if let Some(n) = rule.succeeded_count {
            succeeded.len() as i64 >= i64::from(n)
        } else {
            false
        };
        if met {
            return Some(format!("Matched rules at index {index}"));
        }
    }
    None
}
