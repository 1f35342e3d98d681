//! PURE: who besides muster may refuse a pin. A pin is one UPDATE of a pod (node selector,
//! gate removed); the only parts of the API server that judge such an update by their
//! configuration are admission webhooks and admission policies whose rules match a pod UPDATE.
//! When none does, the dry run of every pin before the first is ungated asks a question whose
//! answer is known, and the commit skips it (one request per pod less); when one does, every
//! pin is dry-run first, so a refusal stops the gang before any pod of it starts. A pin refused
//! anyway (an error, a configuration not seen yet) still rolls the attempt back.
//!
//! A rule is read the way the API server matches it, erring toward "may judge": API versions,
//! selectors, match conditions, exclusions and bindings are not read (any of them can only
//! narrow a match), and a policy without match constraints counts.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingWebhookConfiguration, NamedRuleWithOperations, RuleWithOperations,
    ValidatingAdmissionPolicy, ValidatingWebhookConfiguration,
};

/// The rule fields that decide whether a request for a resource matches.
struct Rule<'a> {
    groups: &'a Option<Vec<String>>,
    resources: &'a Option<Vec<String>>,
    operations: &'a Option<Vec<String>>,
    scope: &'a Option<String>,
}

impl Rule<'_> {
    /// Whether an UPDATE of a pod (core group, resource `pods`, no subresource, namespaced)
    /// matches: `*` or `""` in the groups, `*`, `*/*` or `pods` in the resources (`pods/*`
    /// names subresources only), `*` or `UPDATE` in the operations, and a scope that is not
    /// `Cluster`. A list left out matches nothing.
    fn matches_pod_update(&self) -> bool {
        let has = |list: &Option<Vec<String>>, wanted: &[&str]| {
            list.as_ref().is_some_and(|l| l.iter().any(|v| wanted.contains(&v.as_str())))
        };
        has(self.groups, &["*", ""])
            && has(self.resources, &["*", "*/*", "pods"])
            && has(self.operations, &["*", "UPDATE"])
            && self.scope.as_deref() != Some("Cluster")
    }
}

fn webhook_rule(r: &RuleWithOperations) -> Rule<'_> {
    Rule { groups: &r.api_groups, resources: &r.resources, operations: &r.operations, scope: &r.scope }
}

fn policy_rule(r: &NamedRuleWithOperations) -> Rule<'_> {
    Rule { groups: &r.api_groups, resources: &r.resources, operations: &r.operations, scope: &r.scope }
}

/// Label on a ValidatingAdmissionPolicy whose match conditions leave muster's own requests
/// out (value `false`): it never judges a pin, however its rules read. The chart's tenant
/// policies carry it; only cluster admins create policies, and a policy labelled so that does
/// refuse a pin only costs the dry run it skipped (the refused pin rolls the attempt back).
pub const JUDGES_MUSTER_LABEL: &str = "muster.dev/judges-muster";

/// Whether a policy with these match-constraint rules may judge a pod UPDATE (`None`: the
/// policy names no constraints, and is counted).
fn policy_matches(rules: Option<&Vec<NamedRuleWithOperations>>) -> bool {
    rules.is_none_or(|rules| rules.iter().any(|r| policy_rule(r).matches_pod_update()))
}

/// The configurations that may judge a pin, by kind and name (`<configuration>/<webhook>` for
/// webhooks), in the order given; empty: no dry run is needed.
pub fn pod_update_judges<'a>(
    validating: impl IntoIterator<Item = &'a ValidatingWebhookConfiguration>,
    mutating: impl IntoIterator<Item = &'a MutatingWebhookConfiguration>,
    validating_policies: impl IntoIterator<Item = &'a ValidatingAdmissionPolicy>,
    mutating_policies: impl IntoIterator<Item = &'a MutatingAdmissionPolicy>,
) -> Vec<String> {
    let name = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| m.name.clone().unwrap_or_default();
    let mut judges = Vec::new();
    let hooks = |kind: &str, config: String, hooks: Vec<(&str, Option<&Vec<RuleWithOperations>>)>| {
        hooks
            .into_iter()
            .filter(|(_, rules)| rules.is_some_and(|rules| rules.iter().any(|r| webhook_rule(r).matches_pod_update())))
            .map(|(hook, _)| format!("{kind} {config}/{hook}"))
            .collect::<Vec<_>>()
    };
    for c in validating {
        let list = c.webhooks.iter().flatten().map(|w| (w.name.as_str(), w.rules.as_ref())).collect();
        judges.extend(hooks("ValidatingWebhookConfiguration", name(&c.metadata), list));
    }
    for c in mutating {
        let list = c.webhooks.iter().flatten().map(|w| (w.name.as_str(), w.rules.as_ref())).collect();
        judges.extend(hooks("MutatingWebhookConfiguration", name(&c.metadata), list));
    }
    let exempts_muster = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.labels.as_ref().and_then(|l| l.get(JUDGES_MUSTER_LABEL)).is_some_and(|v| v == "false")
    };
    for p in validating_policies.into_iter().filter(|p| !exempts_muster(&p.metadata)) {
        let rules = p.spec.as_ref().and_then(|s| s.match_constraints.as_ref()).map(|m| m.resource_rules.as_ref());
        if policy_matches(rules.unwrap_or(None)) {
            judges.push(format!("ValidatingAdmissionPolicy {}", name(&p.metadata)));
        }
    }
    for p in mutating_policies {
        let rules = p.spec.as_ref().and_then(|s| s.match_constraints.as_ref()).map(|m| m.resource_rules.as_ref());
        if policy_matches(rules.unwrap_or(None)) {
            judges.push(format!("MutatingAdmissionPolicy {}", name(&p.metadata)));
        }
    }
    judges
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(groups: &[&str], resources: &[&str], operations: &[&str], scope: Option<&str>) -> serde_json::Value {
        let mut r =
            json!({"apiGroups": groups, "apiVersions": ["*"], "resources": resources, "operations": operations});
        if let Some(scope) = scope {
            r["scope"] = json!(scope);
        }
        r
    }

    #[test]
    fn rules_match_a_pod_update_as_the_api_server_does() {
        let cases = [
            (rule(&[""], &["pods"], &["UPDATE"], None), true),
            (rule(&["*"], &["*"], &["*"], None), true),
            (rule(&["", "apps"], &["*/*"], &["CREATE", "UPDATE"], Some("*")), true),
            (rule(&[""], &["pods"], &["UPDATE"], Some("Namespaced")), true),
            (rule(&[""], &["pods"], &["CREATE"], None), false),
            (rule(&[""], &["pods/status", "pods/*"], &["UPDATE"], None), false),
            (rule(&[""], &["nodes"], &["UPDATE"], None), false),
            (rule(&["batch.muster.dev"], &["*"], &["*"], None), false),
            (rule(&["*"], &["*"], &["*"], Some("Cluster")), false),
            (json!({"apiGroups": [""], "resources": ["pods"]}), false),
        ];
        for (r, want) in cases {
            let parsed: RuleWithOperations = serde_json::from_value(r.clone()).expect("rule");
            assert_eq!(webhook_rule(&parsed).matches_pod_update(), want, "webhook rule {r}");
            let named: NamedRuleWithOperations = serde_json::from_value(r.clone()).expect("named rule");
            assert_eq!(policy_rule(&named).matches_pod_update(), want, "policy rule {r}");
        }
    }

    #[test]
    fn the_judges_are_the_configurations_with_a_matching_rule() {
        let webhooks = |rules: Vec<serde_json::Value>| {
            json!({"metadata": {"name": "cfg"}, "webhooks": rules.into_iter().enumerate().map(|(i, r)| json!({
                "name": format!("w{i}.example.com"), "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "clientConfig": {"url": "https://127.0.0.1"}, "rules": [r],
            })).collect::<Vec<_>>()})
        };
        // muster's own configurations: pod CREATE, its own kinds: no judge of a pin.
        let own_mutating: MutatingWebhookConfiguration =
            serde_json::from_value(webhooks(vec![rule(&[""], &["pods"], &["CREATE"], None)])).expect("mutating");
        let own_validating: ValidatingWebhookConfiguration =
            serde_json::from_value(webhooks(vec![rule(&["batch.muster.dev"], &["musterjobs"], &["*"], None)]))
                .expect("validating");
        // The node agent's policy (nodes) is no judge either.
        let node_policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "metadata": {"name": "node-agent"},
            "spec": {"matchConstraints": {"resourceRules": [rule(&[""], &["nodes"], &["UPDATE"], None)]}},
        }))
        .expect("policy");
        let none: [&MutatingAdmissionPolicy; 0] = [];
        assert!(pod_update_judges([&own_validating], [&own_mutating], [&node_policy], none).is_empty());

        let hook: ValidatingWebhookConfiguration = serde_json::from_value(webhooks(vec![
            rule(&[""], &["configmaps"], &["*"], None),
            rule(&["*"], &["*"], &["UPDATE"], None),
        ]))
        .expect("webhook");
        let lock: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "metadata": {"name": "lock"},
            "spec": {"matchConstraints": {"resourceRules": [rule(&[""], &["pods"], &["UPDATE"], None)]}},
        }))
        .expect("policy");
        // The chart's tenant policy matches pod UPDATEs but leaves muster's requests out.
        let tenant: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "metadata": {"name": "tenant-pods", "labels": {JUDGES_MUSTER_LABEL: "false"}},
            "spec": {"matchConstraints": {"resourceRules": [rule(&[""], &["pods"], &["CREATE", "UPDATE"], None)]}},
        }))
        .expect("policy");
        let unconstrained: MutatingAdmissionPolicy =
            serde_json::from_value(json!({"metadata": {"name": "open"}, "spec": {}})).expect("mutating policy");
        assert_eq!(
            pod_update_judges(
                [&own_validating, &hook],
                [&own_mutating],
                [&node_policy, &lock, &tenant],
                [&unconstrained]
            ),
            vec![
                "ValidatingWebhookConfiguration cfg/w1.example.com".to_string(),
                "ValidatingAdmissionPolicy lock".to_string(),
                "MutatingAdmissionPolicy open".to_string(),
            ]
        );
    }
}
