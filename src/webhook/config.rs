//! PURE: muster's webhook configurations. Scope and safety are decided here: muster's kinds and
//! opted-in pods only (objectSelector), never muster's own namespace or kube-system, short
//! timeouts, `failurePolicy: Fail` only where the selector already limits the webhook to
//! objects that opted in.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    JSONPatch, MatchCondition, MatchResources, MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding,
    MutatingAdmissionPolicyBindingSpec, MutatingAdmissionPolicySpec, MutatingWebhook, MutatingWebhookConfiguration,
    Mutation, NamedRuleWithOperations, RuleWithOperations, ServiceReference, ValidatingWebhook,
    ValidatingWebhookConfiguration, Variable, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};

use crate::crds::POD_GROUP_LABEL;
use crate::workloadbuilder::native::SchedulingApi;

/// Name of the ValidatingWebhookConfiguration.
pub const VALIDATING_NAME: &str = "muster-validating";
/// Name of the MutatingWebhookConfiguration.
pub const MUTATING_NAME: &str = "muster-mutating";
/// Webhook validating MusterJob and MusterJobSet.
pub const VALIDATE_BATCH: &str = "validate.batch.muster.dev";
/// Webhook validating Workload, PodGroup and CompositePodGroup.
pub const VALIDATE_SCHEDULING: &str = "validate.scheduling.muster.dev";
/// Webhook gating pods that join a PodGroup.
pub const MUTATE_PODS: &str = "gate.pods.muster.dev";
/// Webhook recording the scheduling API of a MusterJob or MusterJobSet, where the API server
/// serves no MutatingAdmissionPolicy.
pub const RECORD_API: &str = "api.batch.muster.dev";
/// MutatingAdmissionPolicy (and its binding) recording the scheduling API of a MusterJob or
/// MusterJobSet inside the API server, where it is served.
pub const RECORD_API_POLICY: &str = "muster-scheduling-api";
/// Seconds the apiserver waits for muster.
pub const TIMEOUT_SECONDS: i32 = 5;

/// Where the apiserver reaches the webhook server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A URL (muster running outside the cluster), e.g. `https://127.0.0.1:9443`.
    Url(String),
    /// muster's Service inside the cluster.
    Service {
        /// Service namespace.
        namespace: String,
        /// Service name.
        name: String,
        /// Service port.
        port: i32,
    },
}

fn client_config(endpoint: &Endpoint, path: &str, ca_bundle: Option<&str>) -> WebhookClientConfig {
    let ca_bundle = ca_bundle.map(|c| ByteString(c.as_bytes().to_vec()));
    match endpoint {
        Endpoint::Url(base) => {
            WebhookClientConfig { url: Some(format!("{}{path}", base.trim_end_matches('/'))), ca_bundle, service: None }
        }
        Endpoint::Service { namespace, name, port } => WebhookClientConfig {
            url: None,
            ca_bundle,
            service: Some(ServiceReference {
                namespace: namespace.clone(),
                name: name.clone(),
                path: Some(path.into()),
                port: Some(*port),
            }),
        },
    }
}

/// The namespaces muster's webhooks never see: its own and kube-system (a broken webhook must
/// never block the control plane's or muster's own pods). Pods there are never gated, so
/// admission does not manage groups there either.
pub fn excluded_namespaces(own_namespace: &str) -> [String; 2] {
    [own_namespace.to_string(), "kube-system".into()]
}

/// Why muster does not run gangs in `namespace`, when it is one its webhooks skip.
pub fn excluded_namespace(namespace: &str, own_namespace: &str) -> Option<String> {
    excluded_namespaces(own_namespace).contains(&namespace.to_string()).then(|| {
        format!(
            "namespace {namespace} is one muster's webhooks skip (muster's own and kube-system, so a broken \
             webhook never blocks them): pods there are never checked or gated, so muster runs no gangs there; \
             use another namespace"
        )
    })
}

/// Excludes muster's own namespace and kube-system.
pub fn namespace_selector(own_namespace: &str) -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "kubernetes.io/metadata.name".into(),
            operator: "NotIn".into(),
            values: Some(excluded_namespaces(own_namespace).to_vec()),
        }]),
        match_labels: None,
    }
}

/// Name of the match condition that keeps muster's own requests away from its webhooks.
pub const NOT_MUSTER: &str = "not-muster-itself";

/// PURE: the match conditions that let muster's own writes (the pods, groups and child jobs it
/// builds and has checked already) skip its webhooks, when muster runs as the ServiceAccount
/// `user`: the API server then makes no review for them (in a burst, 5 of every 7 reviews), and
/// muster's pod creates do not wait on its own webhook server. Only a ServiceAccount
/// (`system:serviceaccount:...`) is ever exempted: a person's or an admin's identity may be
/// shared with tenants, so muster running as one gets no such condition.
pub fn own_requests_skipped(user: Option<&str>) -> Option<Vec<MatchCondition>> {
    let user = user.filter(|u| u.starts_with("system:serviceaccount:") && u.len() <= 512)?;
    let quoted = user.replace('\\', "\\\\").replace('\'', "\\'");
    Some(vec![MatchCondition {
        name: NOT_MUSTER.into(),
        expression: format!("request.userInfo.username != '{quoted}'"),
    }])
}

fn rule(group: &str, resources: &[&str], operations: &[&str]) -> RuleWithOperations {
    RuleWithOperations {
        api_groups: Some(vec![group.into()]),
        api_versions: Some(vec!["*".into()]),
        operations: Some(operations.iter().map(|s| s.to_string()).collect()),
        resources: Some(resources.iter().map(|s| s.to_string()).collect()),
        scope: Some("Namespaced".into()),
    }
}

fn validating(
    name: &str,
    rules: Vec<RuleWithOperations>,
    endpoint: &Endpoint,
    ca: Option<&str>,
    own_namespace: &str,
    own_user: Option<&str>,
) -> ValidatingWebhook {
    ValidatingWebhook {
        match_conditions: own_requests_skipped(own_user),
        name: name.into(),
        admission_review_versions: vec!["v1".into()],
        client_config: client_config(endpoint, "/validate", ca),
        // Only muster's own kinds reach this webhook, so refusing while muster is down blocks
        // nothing else.
        failure_policy: Some("Fail".into()),
        match_policy: Some("Equivalent".into()),
        namespace_selector: Some(namespace_selector(own_namespace)),
        rules: Some(rules),
        side_effects: "None".into(),
        timeout_seconds: Some(TIMEOUT_SECONDS),
        ..Default::default()
    }
}

/// The ValidatingWebhookConfiguration for muster's kinds.
pub fn validating_configuration(
    endpoint: &Endpoint,
    ca: Option<&str>,
    own_namespace: &str,
    own_user: Option<&str>,
) -> ValidatingWebhookConfiguration {
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta { name: Some(VALIDATING_NAME.into()), ..Default::default() },
        webhooks: Some(vec![
            validating(
                VALIDATE_BATCH,
                vec![rule("batch.muster.dev", &["musterjobs", "musterjobsets"], &["CREATE", "UPDATE"])],
                endpoint,
                ca,
                own_namespace,
                own_user,
            ),
            validating(
                VALIDATE_SCHEDULING,
                vec![rule(
                    "scheduling.muster.dev",
                    &["workloads", "podgroups", "compositepodgroups"],
                    &["CREATE", "UPDATE"],
                )],
                endpoint,
                ca,
                own_namespace,
                own_user,
            ),
        ]),
    }
}

/// What records the scheduling API of a new MusterJob or MusterJobSet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiRecorder {
    /// muster's webhook [`RECORD_API`]: a review sent to muster for every create and update.
    Webhook,
    /// The MutatingAdmissionPolicy [`RECORD_API_POLICY`] ([`record_api_policy`]): the API server
    /// evaluates it in process, so a job's create waits on one review of muster's, not two.
    Policy,
}

/// The MutatingWebhookConfiguration: pods labelled with a PodGroup are gated, and (with
/// [`ApiRecorder::Webhook`]) a MusterJob or MusterJobSet gets the scheduling API it compiles to
/// recorded at creation.
pub fn mutating_configuration(
    endpoint: &Endpoint,
    ca: Option<&str>,
    own_namespace: &str,
    own_user: Option<&str>,
    recorder: ApiRecorder,
) -> MutatingWebhookConfiguration {
    // What both webhooks share: muster's `/mutate`, its own requests and namespaces skipped.
    let base = MutatingWebhook {
        admission_review_versions: vec!["v1".into()],
        client_config: client_config(endpoint, "/mutate", ca),
        match_conditions: own_requests_skipped(own_user),
        match_policy: Some("Equivalent".into()),
        namespace_selector: Some(namespace_selector(own_namespace)),
        side_effects: "None".into(),
        timeout_seconds: Some(TIMEOUT_SECONDS),
        ..Default::default()
    };
    let mut webhooks = vec![MutatingWebhook {
        name: MUTATE_PODS.into(),
        // The objectSelector limits this to pods that opted in; letting them through
        // ungated while muster is down would start half gangs.
        failure_policy: Some("Fail".into()),
        object_selector: Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: POD_GROUP_LABEL.into(),
                operator: "Exists".into(),
                values: None,
            }]),
            match_labels: None,
        }),
        reinvocation_policy: Some("IfNeeded".into()),
        rules: Some(vec![rule("", &["pods"], &["CREATE"])]),
        ..base.clone()
    }];
    if recorder == ApiRecorder::Webhook {
        webhooks.push(MutatingWebhook {
            name: RECORD_API.into(),
            // The controller records the API itself on a job's first sync when this did not (it
            // saves a write per job), so a webhook that cannot answer refuses nothing.
            failure_policy: Some("Ignore".into()),
            reinvocation_policy: Some("Never".into()),
            rules: Some(vec![rule("batch.muster.dev", &["musterjobs", "musterjobsets"], &["CREATE", "UPDATE"])]),
            ..base
        });
    }
    MutatingWebhookConfiguration {
        metadata: ObjectMeta { name: Some(MUTATING_NAME.into()), ..Default::default() },
        webhooks: Some(webhooks),
    }
}

/// PURE: the MutatingAdmissionPolicy and its binding that record the scheduling API of a
/// MusterJob or MusterJobSet inside the API server, as the [`RECORD_API`] webhook does
/// ([`crate::workloadbuilder::native::api_to_record`]): a job that names its API keeps it, an
/// update that drops a recorded API gets it back, and where `default` (`--scheduling-api`) is
/// `muster` a new job that names none gets `muster`; anything else is left to the controller.
/// Same scope as the webhooks (muster's own requests and namespaces skipped); a policy that
/// fails refuses nothing (the controller records the API then, with a write of its own).
pub fn record_api_policy(
    default: Option<SchedulingApi>,
    own_namespace: &str,
    own_user: Option<&str>,
) -> (MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding) {
    let cel = crate::workloadbuilder::native::api_record_cel(default);
    let mut conditions = own_requests_skipped(own_user).unwrap_or_default();
    conditions.push(MatchCondition { name: "unrecorded".into(), expression: cel.unrecorded });
    let policy = MutatingAdmissionPolicy {
        metadata: ObjectMeta { name: Some(RECORD_API_POLICY.into()), ..Default::default() },
        spec: Some(MutatingAdmissionPolicySpec {
            failure_policy: Some("Ignore".into()),
            match_conditions: Some(conditions),
            match_constraints: Some(MatchResources {
                match_policy: Some("Equivalent".into()),
                namespace_selector: Some(namespace_selector(own_namespace)),
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec!["batch.muster.dev".into()]),
                    api_versions: Some(vec!["*".into()]),
                    operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                    resources: Some(vec!["musterjobs".into(), "musterjobsets".into()]),
                    scope: Some("Namespaced".into()),
                    resource_names: None,
                }]),
                ..Default::default()
            }),
            mutations: Some(vec![Mutation {
                patch_type: "JSONPatch".into(),
                json_patch: Some(JSONPatch { expression: Some(cel.patch) }),
                apply_configuration: None,
            }]),
            reinvocation_policy: Some("Never".into()),
            variables: Some(vec![Variable { name: "api".into(), expression: cel.api }]),
            param_kind: None,
        }),
    };
    let binding = MutatingAdmissionPolicyBinding {
        metadata: ObjectMeta { name: Some(RECORD_API_POLICY.into()), ..Default::default() },
        spec: Some(MutatingAdmissionPolicyBindingSpec {
            policy_name: Some(RECORD_API_POLICY.into()),
            match_resources: None,
            param_ref: None,
        }),
    };
    (policy, binding)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_and_safety() {
        let ep = Endpoint::Service { namespace: "muster-system".into(), name: "muster-webhook".into(), port: 443 };
        let v = validating_configuration(&ep, Some("CA"), "muster-system", None);
        for w in v.webhooks.iter().flatten() {
            assert_eq!(w.failure_policy.as_deref(), Some("Fail"));
            assert_eq!(w.side_effects, "None");
            assert_eq!(w.timeout_seconds, Some(5));
            assert_eq!(w.match_policy.as_deref(), Some("Equivalent"));
            let sel = w.namespace_selector.as_ref().and_then(|s| s.match_expressions.as_ref()).expect("selector");
            assert_eq!(sel[0].values.as_deref(), Some(&["muster-system".to_string(), "kube-system".to_string()][..]));
            assert!(excluded_namespace("kube-system", "muster-system").is_some_and(|m| m.contains("kube-system")));
            assert!(excluded_namespace("muster-system", "muster-system").is_some());
            assert_eq!(excluded_namespace("team-a", "muster-system"), None);
            let groups: Vec<&str> =
                w.rules.iter().flatten().flat_map(|r| r.api_groups.iter().flatten()).map(String::as_str).collect();
            assert!(groups.iter().all(|g| g.ends_with("muster.dev")), "{groups:?}");
            assert_eq!(w.client_config.service.as_ref().and_then(|s| s.path.as_deref()), Some("/validate"));
        }
        let m = mutating_configuration(
            &Endpoint::Url("https://127.0.0.1:9443/".into()),
            None,
            "muster-system",
            None,
            ApiRecorder::Webhook,
        );
        let w = &m.webhooks.as_ref().expect("webhooks")[0];
        assert_eq!(w.client_config.url.as_deref(), Some("https://127.0.0.1:9443/mutate"));
        let obj = w.object_selector.as_ref().and_then(|s| s.match_expressions.as_ref()).expect("object selector");
        assert_eq!((obj[0].key.as_str(), obj[0].operator.as_str()), (POD_GROUP_LABEL, "Exists"));
        assert_eq!(w.rules.as_ref().map(|r| r[0].operations.clone()), Some(Some(vec!["CREATE".to_string()])));
        assert_eq!(w.match_conditions, None, "no identity known: every request is reviewed");
        // The API record: muster's job kinds only, every one of them (no object selector), and
        // a webhook that cannot answer refuses nothing (the controller records it then).
        let w = &m.webhooks.as_ref().expect("webhooks")[1];
        assert_eq!(w.name, RECORD_API);
        assert_eq!(w.failure_policy.as_deref(), Some("Ignore"));
        assert_eq!(w.object_selector, None);
        assert_eq!(w.client_config.url.as_deref(), Some("https://127.0.0.1:9443/mutate"));
        let rule = &w.rules.as_ref().expect("rules")[0];
        assert_eq!(rule.api_groups, Some(vec!["batch.muster.dev".to_string()]));
        assert_eq!(rule.resources, Some(vec!["musterjobs".to_string(), "musterjobsets".to_string()]));
        assert_eq!(rule.operations, Some(vec!["CREATE".to_string(), "UPDATE".to_string()]));
        let sel = w.namespace_selector.as_ref().and_then(|s| s.match_expressions.as_ref()).expect("selector");
        assert_eq!(sel[0].values.as_deref(), Some(&["muster-system".to_string(), "kube-system".to_string()][..]));
    }

    #[test]
    fn only_a_service_account_identity_of_muster_skips_its_webhooks() {
        let ep = Endpoint::Url("https://127.0.0.1:9443".into());
        let sa = "system:serviceaccount:muster-system:muster";
        let conditions = |user: Option<&str>| {
            let v = validating_configuration(&ep, None, "muster-system", user);
            let m = mutating_configuration(&ep, None, "muster-system", user, ApiRecorder::Webhook);
            let mut all: Vec<Option<Vec<MatchCondition>>> =
                v.webhooks.into_iter().flatten().map(|w| w.match_conditions).collect();
            all.extend(m.webhooks.into_iter().flatten().map(|w| w.match_conditions));
            all
        };
        let with_sa = conditions(Some(sa));
        assert_eq!(with_sa.len(), 4, "two validating webhooks, the pod gate and the API record");
        for c in &with_sa {
            let c = c.as_deref().unwrap_or_else(|| panic!("a condition on every webhook"));
            assert_eq!(c.len(), 1);
            assert_eq!(c[0].name, NOT_MUSTER);
            assert_eq!(c[0].expression, format!("request.userInfo.username != '{sa}'"));
        }
        // An admin's or a person's identity, or none: every request is reviewed.
        for user in [None, Some("muster-admin"), Some("kubernetes-admin"), Some("system:serviceaccount-x:a:b")] {
            assert!(conditions(user).iter().all(Option::is_none), "{user:?}");
        }
        let odd = own_requests_skipped(Some("system:serviceaccount:ns:it's")).unwrap_or_default();
        assert_eq!(odd[0].expression, r"request.userInfo.username != 'system:serviceaccount:ns:it\'s'");
        assert_eq!(own_requests_skipped(Some(&format!("system:serviceaccount:{}", "a".repeat(600)))), None);
    }

    /// The policy: muster's own requests skipped, then the core's condition, variable and patch
    /// ([`crate::workloadbuilder::native::api_record_cel`], whose test evaluates them against the
    /// webhook's decision); a failing policy refuses nothing; the binding names it.
    #[test]
    fn the_policy_records_what_the_webhook_records() {
        use crate::workloadbuilder::native::api_record_cel;
        let sa = "system:serviceaccount:muster-system:muster";
        for default in [Some(SchedulingApi::Muster), Some(SchedulingApi::Upstream), None] {
            let cel = api_record_cel(default);
            let (policy, binding) = record_api_policy(default, "muster-system", Some(sa));
            assert_eq!(binding.spec.and_then(|s| s.policy_name).as_deref(), Some(RECORD_API_POLICY));
            let spec = policy.spec.unwrap_or_default();
            assert_eq!(spec.failure_policy.as_deref(), Some("Ignore"), "a failing policy refuses nothing");
            let conditions: Vec<(String, String)> =
                spec.match_conditions.into_iter().flatten().map(|c| (c.name, c.expression)).collect();
            let own = own_requests_skipped(Some(sa)).unwrap_or_default();
            assert_eq!(
                conditions[0],
                (NOT_MUSTER.to_string(), own[0].expression.clone()),
                "muster's own requests skip it"
            );
            assert_eq!(conditions[1], ("unrecorded".to_string(), cel.unrecorded.clone()));
            let variables: Vec<(String, String)> =
                spec.variables.into_iter().flatten().map(|v| (v.name, v.expression)).collect();
            assert_eq!(variables, [("api".to_string(), cel.api.clone())]);
            let patches: Vec<Option<String>> =
                spec.mutations.into_iter().flatten().map(|m| m.json_patch.and_then(|p| p.expression)).collect();
            assert_eq!(patches, [Some(cel.patch.clone())]);
        }
    }
}
