//! Compiling resolved items into a Workload, and templates into runtime groups.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use muster_api::blocks::{
    CompositeGangSchedulingPolicy, CompositePodGroupSchedulingPolicy, DisruptionMode, PolicyKind,
};
use muster_api::scheduling::{
    CompositePodGroup, CompositePodGroupSpec, CompositePodGroupTemplate, PodGroup, PodGroupSpec, PodGroupTemplate,
    Workload, WorkloadControllerRef, WorkloadReference, WorkloadSpec,
};

use super::item::WorkloadItem;
use super::validate::policy_kind;
use super::{BuildError, BuildOptions};

/// The API group part of an `apiVersion` (`batch.muster.dev/v1alpha1` -> `batch.muster.dev`).
pub(super) fn api_group(api_version: &str) -> Option<String> {
    api_version.split_once('/').map(|(g, _)| g.to_string())
}

pub(super) fn workload(root: &WorkloadItem, opts: &BuildOptions) -> Result<Workload, BuildError> {
    let owner = opts.owner.clone().ok_or(BuildError::MissingOwner)?;
    let mut spec = WorkloadSpec {
        controller_ref: Some(WorkloadControllerRef {
            api_group: api_group(&owner.api_version),
            kind: owner.kind.clone(),
            name: owner.name.clone(),
        }),
        ..Default::default()
    };
    if root.is_composite() {
        spec.composite_pod_group_templates = Some(vec![composite_template(root)?]);
    } else {
        spec.pod_group_templates = Some(vec![leaf_template(root)?]);
    }
    Ok(Workload {
        metadata: ObjectMeta {
            name: Some(opts.name.clone()),
            namespace: Some(opts.namespace.clone()),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec,
        status: None,
    })
}

fn leaf_template(item: &WorkloadItem) -> Result<PodGroupTemplate, BuildError> {
    let config = item.resolve();
    let mut policy = config.policy.clone().unwrap_or_else(muster_api::blocks::PodGroupSchedulingPolicy::basic);
    if policy.kind().is_none() {
        policy = muster_api::blocks::PodGroupSchedulingPolicy::basic();
    }
    if policy_kind(&config) == PolicyKind::Gang && policy.min_count().is_none() {
        return Err(BuildError::MissingCount { template: item.name.clone(), field: "minCount" });
    }
    Ok(PodGroupTemplate {
        name: item.name.clone(),
        scheduling_policy: policy,
        scheduling_constraints: config.constraints.filter(|c| !c.is_empty()),
        resource_claims: Some(config.resource_claims).filter(|c| !c.is_empty()),
        disruption_mode: config.disruption_mode.filter(|m| m.kind().is_some()),
        priority_class_name: config.priority_class_name,
        priority: None,
        preemption_policy: None,
    })
}

fn composite_template(item: &WorkloadItem) -> Result<CompositePodGroupTemplate, BuildError> {
    let config = item.resolve();
    let policy = match (policy_kind(&config), config.policy.as_ref().and_then(|p| p.min_count())) {
        (PolicyKind::Basic, _) => CompositePodGroupSchedulingPolicy::basic(),
        (PolicyKind::Gang, Some(min_group_count)) => CompositePodGroupSchedulingPolicy {
            basic: None,
            gang: Some(CompositeGangSchedulingPolicy { min_group_count: Some(min_group_count) }),
        },
        (PolicyKind::Gang, None) => {
            return Err(BuildError::MissingCount { template: item.name.clone(), field: "minGroupCount" });
        }
    };
    let mut leaves = Vec::new();
    let mut composites = Vec::new();
    for child in &item.children {
        if child.is_composite() {
            composites.push(composite_template(child)?);
        } else {
            leaves.push(leaf_template(child)?);
        }
    }
    Ok(CompositePodGroupTemplate {
        name: item.name.clone(),
        scheduling_policy: policy,
        scheduling_constraints: config.constraints.filter(|c| !c.is_empty()),
        disruption_mode: config.disruption_mode.filter(|m| m.kind().is_some()),
        priority_class_name: config.priority_class_name,
        priority: None,
        preemption_policy: None,
        pod_group_templates: Some(leaves).filter(|l| !l.is_empty()),
        composite_pod_group_templates: Some(composites).filter(|c| !c.is_empty()),
    })
}

/// Finds a leaf template anywhere in the tree.
pub fn find_pod_group_template<'a>(workload: &'a Workload, name: &str) -> Option<&'a PodGroupTemplate> {
    fn in_composite<'a>(c: &'a CompositePodGroupTemplate, name: &str) -> Option<&'a PodGroupTemplate> {
        c.pod_group_templates
            .iter()
            .flatten()
            .find(|t| t.name == name)
            .or_else(|| c.composite_pod_group_templates.iter().flatten().find_map(|cc| in_composite(cc, name)))
    }
    workload
        .spec
        .pod_group_templates
        .iter()
        .flatten()
        .find(|t| t.name == name)
        .or_else(|| workload.spec.composite_pod_group_templates.iter().flatten().find_map(|c| in_composite(c, name)))
}

/// Finds a composite template anywhere in the tree.
pub fn find_composite_template<'a>(workload: &'a Workload, name: &str) -> Option<&'a CompositePodGroupTemplate> {
    fn in_composite<'a>(c: &'a CompositePodGroupTemplate, name: &str) -> Option<&'a CompositePodGroupTemplate> {
        if c.name == name {
            return Some(c);
        }
        c.composite_pod_group_templates.iter().flatten().find_map(|cc| in_composite(cc, name))
    }
    workload.spec.composite_pod_group_templates.iter().flatten().find_map(|c| in_composite(c, name))
}

fn runtime_meta(workload: &Workload, opts: &BuildOptions, name: &str) -> Result<ObjectMeta, BuildError> {
    let owner = opts.owner.clone().ok_or(BuildError::MissingOwner)?;
    Ok(ObjectMeta {
        name: Some(name.to_string()),
        namespace: workload.metadata.namespace.clone().or_else(|| Some(opts.namespace.clone())),
        owner_references: Some(vec![owner]),
        ..Default::default()
    })
}

fn workload_ref(workload: &Workload, template: &str) -> WorkloadReference {
    WorkloadReference {
        workload_name: workload.metadata.name.clone().unwrap_or_default(),
        template_name: template.to_string(),
    }
}

pub(super) fn pod_group(
    workload: &Workload,
    opts: &BuildOptions,
    name: &str,
    template: &str,
) -> Result<PodGroup, BuildError> {
    let t = find_pod_group_template(workload, template)
        .ok_or_else(|| BuildError::TemplateNotFound { kind: "PodGroupTemplate", name: template.to_string() })?;
    Ok(PodGroup {
        metadata: runtime_meta(workload, opts, name)?,
        spec: PodGroupSpec {
            parent_composite_pod_group_name: None,
            workload_ref: Some(workload_ref(workload, template)),
            scheduling_policy: t.scheduling_policy.clone(),
            scheduling_constraints: t.scheduling_constraints.clone(),
            resource_claims: t.resource_claims.clone(),
            disruption_mode: t.disruption_mode.clone().unwrap_or_else(DisruptionMode::single),
            priority_class_name: t.priority_class_name.clone(),
            priority: t.priority,
            preemption_policy: None,
        },
        status: None,
    })
}

pub(super) fn composite_pod_group(
    workload: &Workload,
    opts: &BuildOptions,
    name: &str,
    template: &str,
) -> Result<CompositePodGroup, BuildError> {
    let t = find_composite_template(workload, template).ok_or_else(|| BuildError::TemplateNotFound {
        kind: "CompositePodGroupTemplate",
        name: template.to_string(),
    })?;
    Ok(CompositePodGroup {
        metadata: runtime_meta(workload, opts, name)?,
        spec: CompositePodGroupSpec {
            parent_composite_pod_group_name: None,
            workload_ref: workload_ref(workload, template),
            scheduling_policy: t.scheduling_policy.clone(),
            scheduling_constraints: t.scheduling_constraints.clone(),
            disruption_mode: t.disruption_mode.clone().unwrap_or_else(DisruptionMode::single),
            priority_class_name: t.priority_class_name.clone(),
            priority: t.priority,
            preemption_policy: None,
        },
        status: None,
    })
}
