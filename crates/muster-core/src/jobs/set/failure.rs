//! PURE: JobSet's `failurePolicy` (`pkg/controllers/failure_policy.go`): which rule a failed
//! child matches, and what the set does about it.

use k8s_openapi::jiff::Timestamp;

use super::ObservedChild;
use muster_api::batch::{FailurePolicy, FailurePolicyAction, FailurePolicyRule};

/// Condition reasons and messages JobSet writes (`pkg/constants`).
pub mod reason {
    /// Failed: a child failed and the set has no failure policy.
    pub const FAILED_JOBS: &str = "FailedJobs";
    /// Its message.
    pub const FAILED_JOBS_MESSAGE: &str = "jobset failed due to one or more job failures";
    /// Failed: `RestartJobSet` with `restartsCountTowardsMax >= maxRestarts`.
    pub const REACHED_MAX_RESTARTS: &str = "ReachedMaxRestarts";
    /// Its message.
    pub const REACHED_MAX_RESTARTS_MESSAGE: &str = "jobset failed due to reaching max number of restarts";
    /// Failed: a rule with action `FailJobSet` matched.
    pub const FAIL_JOBSET_ACTION: &str = "FailJobSetFailurePolicyAction";
    /// Its message.
    pub const FAIL_JOBSET_ACTION_MESSAGE: &str = "applying FailJobSet failure policy action";
    /// Event of a `RestartJobSet`.
    pub const RESTART_JOBSET_ACTION: &str = "RestartJobSetFailurePolicyAction";
    /// Its message.
    pub const RESTART_JOBSET_ACTION_MESSAGE: &str = "applying RestartJobSet failure policy action";
    /// Event of a `RestartJobSetAndIgnoreMaxRestarts`.
    pub const RESTART_IGNORE_MAX_ACTION: &str = "RestartJobSetAndIgnoreMaxRestartsFailurePolicyAction";
    /// Its message.
    pub const RESTART_IGNORE_MAX_ACTION_MESSAGE: &str =
        "applying RestartJobSetAndIgnoreMaxRestarts failure policy action";
    /// `RestartingJobSet` reason of a restart no rule matched.
    pub const DEFAULT_FAILURE_POLICY: &str = "DefaultFailurePolicy";
}

/// A child's `Failed` condition: reason, message and when it became true (`None` for a child
/// seen failed without one; it sorts after every dated failure).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChildFailure {
    /// Reason of the child's `Failed` condition (`BackoffLimitExceeded`, `PodFailurePolicy`...).
    pub reason: String,
    /// Its message.
    pub message: String,
    /// Its `lastTransitionTime`.
    pub at: Option<Timestamp>,
}

/// What a failed child does to the set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The set fails with this `Failed` reason and message.
    Fail {
        /// Condition reason.
        reason: &'static str,
        /// Condition message.
        message: String,
    },
    /// Every child is recreated: `status.restarts` +1, and `restartsCountTowardsMax` +1 when
    /// `counts`.
    Restart {
        /// `RestartJobSet` (true) or `RestartJobSetAndIgnoreMaxRestarts` (false).
        counts: bool,
        /// `RestartingJobSet` reason: `FailurePolicy_<rule>` or `DefaultFailurePolicy`.
        condition_reason: String,
        /// Event reason.
        event_reason: &'static str,
        /// Condition and event message.
        message: String,
    },
}

/// JobSet's `messageWithFirstFailedJob`.
fn with_job(message: &str, child: &str) -> String {
    format!("{message} (first failed job: {child})")
}

/// Whether `pattern` (RE2 syntax, as Go's `regexp.MatchString`: found anywhere in the text)
/// matches `message`. The core has CEL, whose `matches` is that search over the `regex`
/// crate; a pattern that does not compile matches nothing (JobSet logs it and goes on).
pub fn message_matches(pattern: &str, message: &str) -> bool {
    use std::sync::{Arc, OnceLock};
    static PROGRAM: OnceLock<Option<cel::Program>> = OnceLock::new();
    let Some(program) = PROGRAM.get_or_init(|| cel::Program::compile("m.matches(p)").ok()) else {
        return false;
    };
    let mut ctx = cel::Context::default();
    ctx.add_variable_from_value("m", cel::Value::String(Arc::new(message.to_string())));
    ctx.add_variable_from_value("p", cel::Value::String(Arc::new(pattern.to_string())));
    matches!(program.execute(&ctx), Ok(cel::Value::Bool(true)))
}

/// JobSet's `ruleIsApplicable`: every requirement of `rule` holds for the failed child.
pub fn rule_applies(rule: &FailurePolicyRule, replicated_job: &str, failure: &ChildFailure) -> bool {
    (rule.on_job_failure_reasons.is_empty() || rule.on_job_failure_reasons.contains(&failure.reason))
        && (rule.on_job_failure_message_patterns.is_empty()
            || rule.on_job_failure_message_patterns.iter().any(|p| message_matches(p, &failure.message)))
        && !replicated_job.is_empty()
        && (rule.target_replicated_jobs.is_empty() || rule.target_replicated_jobs.iter().any(|t| t == replicated_job))
}

/// The earliest failure among `failed` (by the `Failed` condition's transition time, then
/// list order, as JobSet's strict "before" keeps the first of equal times).
fn earliest<'a>(failed: impl Iterator<Item = (&'a ObservedChild, &'a ChildFailure)>) -> Option<&'a ObservedChild> {
    failed.enumerate().min_by_key(|(i, (_, f))| (f.at.is_none(), f.at, *i)).map(|(_, (c, _))| c)
}

/// What the set does when `failed` (children of the current attempt with a failure, in list
/// order) is not empty, given its `failurePolicy` and `restartsCountTowardsMax`. `None` when
/// nothing failed.
pub fn decide(
    policy: Option<&FailurePolicy>,
    restarts_count_towards_max: i32,
    failed: &[&ObservedChild],
) -> Option<Outcome> {
    let with_failure = || failed.iter().filter_map(|c| c.failure.as_ref().map(|f| (*c, f)));
    let first = earliest(with_failure())?;
    let Some(policy) = policy else {
        return Some(Outcome::Fail {
            reason: reason::FAILED_JOBS,
            message: with_job(reason::FAILED_JOBS_MESSAGE, &first.name),
        });
    };
    // The first rule some failed child matches; among its children, the earliest.
    let matched = policy.rules.iter().find_map(|rule| {
        earliest(with_failure().filter(|(c, f)| rule_applies(rule, &c.replicated_job, f))).map(|c| (rule, c))
    });
    let (action, rule, child) = match matched {
        Some((rule, child)) => (rule.action, Some(rule.name.as_str()), child),
        None => (FailurePolicyAction::RestartJobSet, None, first),
    };
    let condition_reason =
        rule.map_or_else(|| reason::DEFAULT_FAILURE_POLICY.to_string(), |name| format!("FailurePolicy_{name}"));
    Some(match action {
        FailurePolicyAction::FailJobSet => Outcome::Fail {
            reason: reason::FAIL_JOBSET_ACTION,
            message: with_job(reason::FAIL_JOBSET_ACTION_MESSAGE, &child.name),
        },
        FailurePolicyAction::RestartJobSet if restarts_count_towards_max >= policy.max_restarts => Outcome::Fail {
            reason: reason::REACHED_MAX_RESTARTS,
            message: with_job(reason::REACHED_MAX_RESTARTS_MESSAGE, &child.name),
        },
        FailurePolicyAction::RestartJobSet => Outcome::Restart {
            counts: true,
            condition_reason,
            event_reason: reason::RESTART_JOBSET_ACTION,
            message: with_job(reason::RESTART_JOBSET_ACTION_MESSAGE, &child.name),
        },
        FailurePolicyAction::RestartJobSetAndIgnoreMaxRestarts => Outcome::Restart {
            counts: false,
            condition_reason,
            event_reason: reason::RESTART_IGNORE_MAX_ACTION,
            message: with_job(reason::RESTART_IGNORE_MAX_ACTION_MESSAGE, &child.name),
        },
    })
}
