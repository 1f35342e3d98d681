//! PURE: the Rust counterpart of upstream's workloadbuilder. An item tree (leaf items become
//! PodGroupTemplates, items with children CompositePodGroupTemplates) is validated with exact
//! field paths and compiled into Workload, PodGroup and CompositePodGroup objects.
//! No client, no clock: plain data in, plain data out.

mod build;
pub mod field;
mod item;
pub mod job;
pub mod native;
pub mod objects;
mod validate;

use std::sync::OnceLock;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use muster_api::blocks::{DisruptionModeKind, PolicyKind};
use muster_api::scheduling::Workload;

pub use field::{ErrorList, ErrorType, FieldError, FieldPath};
pub use item::{Block, Callback, PolicyInput, SchedulingConfig, WorkloadInput, WorkloadItem};

/// What the builder may produce and for whom (upstream `BuildOptions`).
#[derive(Clone, Debug, Default)]
pub struct BuildOptions {
    /// Name of the Workload.
    pub name: String,
    /// Namespace of everything built.
    pub namespace: String,
    /// Owner of everything built; required to build.
    pub owner: Option<OwnerReference>,
    /// Policies this controller supports; an empty list allows nothing.
    pub allowed_policies: Vec<PolicyKind>,
    /// Disruption modes this controller supports; an empty list allows nothing.
    pub allowed_disruption_modes: Vec<DisruptionModeKind>,
    /// Skip the rules the blocks' schemas carry (the apiserver already checked them).
    pub disable_structural_validation: bool,
}

impl BuildOptions {
    /// Options allowing basic+gang and single+all, as upstream's Job integration does.
    pub fn all_allowed(name: impl Into<String>, namespace: impl Into<String>, owner: Option<OwnerReference>) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            owner,
            allowed_policies: vec![PolicyKind::Basic, PolicyKind::Gang],
            allowed_disruption_modes: vec![DisruptionModeKind::Single, DisruptionModeKind::All],
            disable_structural_validation: false,
        }
    }
}

/// Why something could not be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BuildError {
    /// `BuildOptions.owner` is required to build.
    #[error("an owner is required to build a Workload")]
    MissingOwner,
    /// A gang template has no count after defaults and callbacks.
    #[error("template {template:?}: gang policy without {field}")]
    MissingCount {
        /// Template name.
        template: String,
        /// `minCount` or `minGroupCount`.
        field: &'static str,
    },
    /// The tree does not validate.
    #[error("invalid workload tree: {}", field::joined(.0))]
    Invalid(ErrorList),
    /// No template of that name and kind in the Workload.
    #[error("the Workload has no {kind} named {name:?}")]
    TemplateNotFound {
        /// `PodGroupTemplate` or `CompositePodGroupTemplate`.
        kind: &'static str,
        /// The name asked for.
        name: String,
    },
    /// A builder made from an existing Workload cannot build another.
    #[error("a builder made from an existing Workload only makes runtime groups")]
    ExistingWorkload,
}

enum Source {
    Items(Box<WorkloadItem>),
    Existing(Box<Workload>),
}

/// Validates an item tree and compiles it; or, made from an existing Workload, makes the
/// runtime groups of its templates.
pub struct Builder {
    source: Source,
    opts: BuildOptions,
    workload: OnceLock<Workload>,
}

impl Builder {
    /// A builder for the tree under `root`.
    pub fn new(root: WorkloadItem, opts: BuildOptions) -> Self {
        Self { source: Source::Items(Box::new(root)), opts, workload: OnceLock::new() }
    }

    /// A builder that only makes PodGroups and CompositePodGroups from `workload`'s templates
    /// (for child controllers whose parent compiled the Workload).
    pub fn from_existing_workload(workload: Workload, opts: BuildOptions) -> Self {
        Self { source: Source::Existing(Box::new(workload)), opts, workload: OnceLock::new() }
    }

    /// The options this builder was made with.
    pub fn options(&self) -> &BuildOptions {
        &self.opts
    }

    /// The item tree, unless this builder was made from an existing Workload.
    pub fn root(&self) -> Option<&WorkloadItem> {
        match &self.source {
            Source::Items(root) => Some(root),
            Source::Existing(_) => None,
        }
    }

    /// Validates the tree; with `old_root`, also the update rules against the old tree.
    pub fn validate(&self, old_root: Option<&WorkloadItem>) -> ErrorList {
        match &self.source {
            Source::Items(root) => validate::validate_tree(root, old_root, &self.opts),
            Source::Existing(_) => Vec::new(),
        }
    }

    /// The compiled Workload (built once, then cached).
    pub fn build_workload(&self) -> Result<&Workload, BuildError> {
        if let Some(w) = self.workload.get() {
            return Ok(w);
        }
        let built = match &self.source {
            Source::Items(root) => build::workload(root, &self.opts)?,
            Source::Existing(w) => return Ok(w),
        };
        Ok(self.workload.get_or_init(|| built))
    }

    /// A PodGroup named `name` from the leaf template `template`; the caller sets the parent.
    pub fn new_pod_group(&self, name: &str, template: &str) -> Result<muster_api::PodGroup, BuildError> {
        build::pod_group(self.build_workload()?, &self.opts, name, template)
    }

    /// A CompositePodGroup named `name` from the composite template `template`.
    pub fn new_composite_pod_group(
        &self,
        name: &str,
        template: &str,
    ) -> Result<muster_api::CompositePodGroup, BuildError> {
        build::composite_pod_group(self.build_workload()?, &self.opts, name, template)
    }
}

#[cfg(test)]
mod tests;
