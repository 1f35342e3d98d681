//! Validation of an item tree: tree shape, structural rules per block, allow-lists on the
//! resolved config, cross-field rules, muster's satisfiability rules, and on update the frozen
//! fields compared with the old tree.

use std::collections::{BTreeMap, BTreeSet};

use muster_api::blocks::{
    DisruptionMode, DisruptionModeKind, PodGroupResourceClaim, PodGroupSchedulingPolicy, PolicyKind,
    SchedulingConstraints,
};
use muster_api::scheduling::{MAX_DEPTH, MAX_TEMPLATES};

use super::BuildOptions;
use super::field::{
    ErrorList, FieldError, FieldPath, dns_label_errors, dns_subdomain_errors, is_dns_label, label_key_errors, quote,
};
use super::item::{PolicyInput, SchedulingConfig, WorkloadItem};

/// Validates `root` (and, on update, compares it with `old`); an empty list means valid.
pub(super) fn validate_tree(root: &WorkloadItem, old: Option<&WorkloadItem>, opts: &BuildOptions) -> ErrorList {
    let mut errs = tree_errors(root, old);
    if !errs.is_empty() {
        return errs;
    }
    let old_items: BTreeMap<&str, &WorkloadItem> = old.map(index_by_name).unwrap_or_default();
    let mut new_names = BTreeSet::new();
    root.walk(1, &mut |item, _| {
        new_names.insert(item.name.as_str());
        let old_item = old_items.get(item.name.as_str()).copied();
        if old.is_some() && old_item.is_none() {
            errs.push(FieldError::forbidden(&item.path, "templates may not be added or removed"));
        }
        if !opts.disable_structural_validation {
            errs.extend(structural_errors(item, old_item));
        }
        errs.extend(resolved_errors(item, opts));
        if let Some(old_item) = old_item {
            errs.extend(frozen_field_errors(item, old_item));
        }
    });
    for (name, old_item) in &old_items {
        if !new_names.contains(name) {
            errs.push(FieldError::forbidden(&old_item.path, "templates may not be added or removed"));
        }
    }
    errs
}

fn index_by_name(root: &WorkloadItem) -> BTreeMap<&str, &WorkloadItem> {
    let mut out = BTreeMap::new();
    root.walk(1, &mut |item, _| {
        out.insert(item.name.as_str(), item);
    });
    out
}

/// Errors a user cannot cause through the API (the embedding controller built a bad tree),
/// plus the Workload's size limits.
fn tree_errors(root: &WorkloadItem, old: Option<&WorkloadItem>) -> ErrorList {
    let mut errs = Vec::new();
    let mut seen = BTreeSet::new();
    root.walk(1, &mut |item, depth| {
        if item.name.is_empty() {
            errs.push(FieldError::internal(&item.path, "template name must not be empty"));
        } else if !is_dns_label(&item.name) {
            errs.push(FieldError::internal(&item.path, format!("template name {:?} is not a DNS label", item.name)));
        } else if !seen.insert(item.name.as_str()) {
            errs.push(FieldError::internal(
                &item.path,
                format!("template name {:?} is used twice in the tree", item.name),
            ));
        }
        if depth > MAX_DEPTH {
            errs.push(FieldError::internal(
                &item.path,
                format!("the template tree may be at most {MAX_DEPTH} levels deep"),
            ));
        }
        let leaves = item.children.iter().filter(|c| !c.is_composite()).count();
        let composites = item.children.len() - leaves;
        if leaves > MAX_TEMPLATES || composites > MAX_TEMPLATES {
            errs.push(FieldError::too_many(&item.path, leaves.max(composites), MAX_TEMPLATES));
        }
        match (&item.input.policy, item.is_composite()) {
            (Some(b), true) if matches!(b.data, PolicyInput::PodGroup(_)) => {
                errs.push(FieldError::internal(&b.path, "a composite item needs a composite scheduling policy"))
            }
            (Some(b), false) if matches!(b.data, PolicyInput::Composite(_)) => {
                errs.push(FieldError::internal(&b.path, "a leaf item needs a PodGroup scheduling policy"))
            }
            _ => {}
        }
        if item.is_composite()
            && (item.input.resource_claims.is_some() || !item.default_config.resource_claims.is_empty())
        {
            errs.push(FieldError::internal(
                &item.resource_claims_path(),
                "resource claims are not supported on composite groups",
            ));
        }
    });
    if let Some(old) = old
        && old.name != root.name
    {
        errs.push(FieldError::internal(&root.path, format!("the root name may not change (was {:?})", old.name)));
    }
    errs
}

/// The rules the blocks' schemas carry (unions, limits, formats). On update, a block equal to
/// the old one is not checked again (ratcheting).
fn structural_errors(item: &WorkloadItem, old: Option<&WorkloadItem>) -> ErrorList {
    let mut errs = Vec::new();
    if let Some(b) = &item.input.policy
        && old.and_then(|o| o.input.policy.as_ref()).is_none_or(|o| o.data != b.data)
    {
        errs.extend(policy_block_errors(&b.data, &b.path));
    }
    if let Some(b) = &item.input.constraints
        && old.and_then(|o| o.input.constraints.as_ref()).is_none_or(|o| o.data != b.data)
    {
        errs.extend(constraints_errors(&b.data, &b.path));
    }
    if let Some(b) = &item.input.disruption_mode
        && old.and_then(|o| o.input.disruption_mode.as_ref()).is_none_or(|o| o.data != b.data)
    {
        errs.extend(disruption_mode_errors(&b.data, &b.path));
    }
    if let Some(b) = &item.input.resource_claims
        && old.and_then(|o| o.input.resource_claims.as_ref()).is_none_or(|o| o.data != b.data)
    {
        errs.extend(claims_errors(&b.data, &b.path));
    }
    errs
}

fn union_error(path: &FieldPath, members: &[&str], set: usize) -> Option<FieldError> {
    let list = members.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", ");
    match set {
        0 => Some(FieldError::invalid(path, quote(""), format!("must specify one of: {list}"))),
        1 => None,
        _ => Some(FieldError::invalid(path, quote(""), format!("must specify exactly one of: {list}"))),
    }
}

pub(super) fn policy_block_errors(policy: &PolicyInput, path: &FieldPath) -> ErrorList {
    let common = policy.to_config();
    let mut errs: ErrorList =
        union_error(path, &["basic", "gang"], common.basic.is_some() as usize + common.gang.is_some() as usize)
            .into_iter()
            .collect();
    if let Some(count) = common.min_count()
        && count < 1
    {
        errs.push(FieldError::invalid(
            &path.child("gang").child(policy.count_field()),
            count,
            "must be greater than or equal to 1",
        ));
    }
    errs
}

pub(super) fn constraints_errors(constraints: &SchedulingConstraints, path: &FieldPath) -> ErrorList {
    let mut errs = Vec::new();
    let Some(topology) = &constraints.topology else { return errs };
    let tpath = path.child("topology");
    if topology.len() > muster_api::blocks::MAX_TOPOLOGY_CONSTRAINTS {
        errs.push(FieldError::too_many(&tpath, topology.len(), muster_api::blocks::MAX_TOPOLOGY_CONSTRAINTS));
    }
    for (i, t) in topology.iter().enumerate() {
        let kpath = tpath.index(i).child("key");
        if t.key.is_empty() {
            errs.push(FieldError::required(&kpath, ""));
        } else {
            for msg in label_key_errors(&t.key) {
                errs.push(FieldError::invalid(&kpath, quote(&t.key), msg));
            }
        }
    }
    errs
}

pub(super) fn disruption_mode_errors(mode: &DisruptionMode, path: &FieldPath) -> ErrorList {
    union_error(path, &["single", "all"], mode.single.is_some() as usize + mode.all.is_some() as usize)
        .into_iter()
        .collect()
}

pub(super) fn claims_errors(claims: &[PodGroupResourceClaim], path: &FieldPath) -> ErrorList {
    let mut errs = Vec::new();
    if claims.len() > muster_api::blocks::MAX_RESOURCE_CLAIMS {
        errs.push(FieldError::too_many(path, claims.len(), muster_api::blocks::MAX_RESOURCE_CLAIMS));
    }
    let mut names = BTreeSet::new();
    for (i, claim) in claims.iter().enumerate() {
        let cpath = path.index(i);
        let npath = cpath.child("name");
        if claim.name.is_empty() {
            errs.push(FieldError::required(&npath, ""));
        } else {
            for msg in dns_label_errors(&claim.name) {
                errs.push(FieldError::invalid(&npath, quote(&claim.name), msg));
            }
            if !names.insert(claim.name.as_str()) {
                errs.push(FieldError::duplicate(&npath, quote(&claim.name)));
            }
        }
        let set = claim.resource_claim_name.is_some() as usize + claim.resource_claim_template_name.is_some() as usize;
        errs.extend(union_error(&cpath, &["resourceClaimName", "resourceClaimTemplateName"], set));
        for (field, value) in [
            ("resourceClaimName", &claim.resource_claim_name),
            ("resourceClaimTemplateName", &claim.resource_claim_template_name),
        ] {
            if let Some(v) = value {
                for msg in dns_subdomain_errors(v) {
                    errs.push(FieldError::invalid(&cpath.child(field), quote(v), msg));
                }
            }
        }
    }
    errs
}

/// The resolved policy kind: an unset policy compiles to basic.
pub(super) fn policy_kind(config: &SchedulingConfig) -> PolicyKind {
    config.policy.as_ref().and_then(PodGroupSchedulingPolicy::kind).unwrap_or(PolicyKind::Basic)
}

fn kind_name(kind: PolicyKind) -> &'static str {
    match kind {
        PolicyKind::Basic => "basic",
        PolicyKind::Gang => "gang",
    }
}

/// Allow-lists, cross-field rules and muster's satisfiability rules, on the resolved config.
fn resolved_errors(item: &WorkloadItem, opts: &BuildOptions) -> ErrorList {
    let mut errs = Vec::new();
    let config = item.resolve();
    let kind = policy_kind(&config);
    let policy_path = item.policy_path();
    let policy_well_formed = config.policy.as_ref().is_none_or(|p| p.kind().is_some());
    if policy_well_formed && !opts.allowed_policies.contains(&kind) {
        errs.push(FieldError::forbidden(
            &policy_path,
            format!("{} scheduling policy is not supported by this controller", kind_name(kind)),
        ));
    }
    let mode = config.disruption_mode.as_ref().and_then(DisruptionMode::kind);
    if let Some(mode) = mode
        && !opts.allowed_disruption_modes.contains(&mode)
    {
        let name = match mode {
            DisruptionModeKind::Single => "single",
            DisruptionModeKind::All => "all",
        };
        errs.push(FieldError::forbidden(
            &item.disruption_mode_path(),
            format!("the disruptionMode `{name}` is not supported by this controller"),
        ));
    }
    if policy_well_formed && kind == PolicyKind::Basic && mode == Some(DisruptionModeKind::All) {
        errs.push(FieldError::invalid(
            &item.disruption_mode_path(),
            quote(""),
            "the disruptionMode `all` is not supported with the Basic scheduling policy",
        ));
    }
    let count_path = policy_path.child("gang").child(item.count_field());
    if policy_well_formed && kind == PolicyKind::Gang && config.policy.as_ref().and_then(|p| p.min_count()).is_none() {
        errs.push(FieldError::required(&count_path, "the controller supplied no default"));
    }
    // muster: a quorum that can never be reached is refused up front.
    let explicit = item.input.policy.as_ref().and_then(|b| b.data.to_config().min_count());
    if let Some(count) = explicit
        && count >= 1
    {
        if item.is_composite() {
            let groups = item.child_group_count();
            if count > groups {
                errs.push(FieldError::invalid(
                    &count_path,
                    count,
                    format!("must be less than or equal to the number of child groups ({groups})"),
                ));
            }
        } else if let Some(pods) = item.pod_count
            && count > pods
        {
            errs.push(FieldError::invalid(
                &count_path,
                count,
                format!("must be less than or equal to parallelism ({pods})"),
            ));
        }
    }
    errs
}

fn normalized_constraints(c: &Option<SchedulingConstraints>) -> Option<&SchedulingConstraints> {
    c.as_ref().filter(|c| !c.is_empty())
}

fn normalized_mode(m: &Option<DisruptionMode>) -> DisruptionModeKind {
    m.as_ref().and_then(DisruptionMode::kind).unwrap_or(DisruptionModeKind::Single)
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// On update, every field but a leaf's `gang.minCount` is frozen (compared resolved, so a
/// default written out explicitly is no change).
fn frozen_field_errors(item: &WorkloadItem, old: &WorkloadItem) -> ErrorList {
    let mut errs = Vec::new();
    let new_config = item.resolve();
    let old_config = old.resolve();
    let (new_kind, old_kind) = (policy_kind(&new_config), policy_kind(&old_config));
    if new_kind != old_kind {
        errs.push(FieldError::invalid(
            &item.policy_path(),
            quote(kind_name(new_kind)),
            format!(
                "field is immutable: the scheduling policy may not change from `{}` to `{}`",
                kind_name(old_kind),
                kind_name(new_kind)
            ),
        ));
    } else if item.is_composite()
        && new_config.policy.as_ref().and_then(|p| p.min_count())
            != old_config.policy.as_ref().and_then(|p| p.min_count())
    {
        let count = new_config.policy.as_ref().and_then(|p| p.min_count()).unwrap_or_default();
        errs.push(FieldError::invalid(
            &item.policy_path().child("gang").child("minGroupCount"),
            count,
            "field is immutable",
        ));
    }
    if normalized_constraints(&new_config.constraints) != normalized_constraints(&old_config.constraints) {
        errs.push(FieldError::invalid(&item.constraints_path(), json(&new_config.constraints), "field is immutable"));
    }
    if normalized_mode(&new_config.disruption_mode) != normalized_mode(&old_config.disruption_mode) {
        errs.push(FieldError::invalid(
            &item.disruption_mode_path(),
            json(&new_config.disruption_mode),
            "field is immutable",
        ));
    }
    if new_config.resource_claims != old_config.resource_claims {
        errs.push(FieldError::invalid(
            &item.resource_claims_path(),
            json(&new_config.resource_claims),
            "field is immutable",
        ));
    }
    if new_config.priority_class_name != old_config.priority_class_name {
        errs.push(FieldError::invalid(
            &item.path.child("priorityClassName"),
            quote(new_config.priority_class_name.as_deref().unwrap_or("")),
            "field is immutable",
        ));
    }
    errs
}
