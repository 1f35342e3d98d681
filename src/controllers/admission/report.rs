//! What admission tells about a root, and nothing else: Events on the root group and its
//! controller owner, and an error met on a root (logged, counted by reason, reported once per
//! distinct error, the root backed off alone). The bottom of the admission shell: `commit`,
//! `preemption`, `status` and `cycle` call down to it, and it calls none of them.

use std::time::Instant;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::reflector;

use super::{Admitter, CONTROLLER, RootKey, error_backoff};
use crate::controllers::context::Error;
use crate::controllers::metrics::ObjectErrorLabels;
use crate::scheduler::GroupTree;

impl Admitter {
    /// Events on a root group and its owner.
    pub(super) fn root_event(&self, key: &RootKey, warning: bool, reason: &str, message: &str) {
        for r in self.root_refs(key) {
            self.ctx.event(&r, warning, reason, "Admit", message.to_string());
        }
    }

    /// Events on the root group and on its owner (the MusterJob or MusterJobSet).
    pub(super) fn group_event(&self, tree: &GroupTree, warning: bool, reason: &str, message: &str) {
        self.root_event(&RootKey::of(&tree.namespace, &tree.root), warning, reason, message);
    }

    /// The root group and its controller owner, as event targets.
    pub(super) fn root_refs(&self, key: &RootKey) -> Vec<ObjectReference> {
        let (ns, name) = (key.ns.as_str(), key.name.as_str());
        let obj_ref = if key.composite {
            self.caches
                .composites
                .get(&reflector::ObjectRef::new(name).within(ns))
                .map(|c| (c.object_ref(&()), c.metadata.owner_references.clone()))
        } else {
            self.caches
                .pod_groups
                .get(&reflector::ObjectRef::new(name).within(ns))
                .map(|g| (g.object_ref(&()), g.metadata.owner_references.clone()))
        };
        let Some((me, owners)) = obj_ref else { return vec![] };
        let mut out = vec![me];
        if let Some(o) = owners.iter().flatten().find(|o| o.controller == Some(true)) {
            out.push(ObjectReference {
                api_version: Some(o.api_version.clone()),
                kind: Some(o.kind.clone()),
                name: Some(o.name.clone()),
                namespace: Some(ns.to_string()),
                uid: Some(o.uid.clone()),
                ..Default::default()
            });
        }
        out
    }

    /// Reports an error met on one root (log, metric by reason, a Warning event on the group
    /// once per distinct error) and backs the root off alone, doubling per error in a row.
    /// Returns when to try it again; the cycle goes on with the other roots.
    pub(super) fn root_error(&mut self, key: &RootKey, what: &str, e: &Error) -> Instant {
        let kind = if key.composite { "CompositePodGroup" } else { "PodGroup" };
        self.ctx.metrics.attempt(crate::controllers::metrics::AttemptResult::Error);
        self.ctx.metrics.reconcile_error(CONTROLLER, e.metric_label());
        self.ctx.metrics.object_errors.get_or_create(&object_labels(kind, e.reason())).inc();
        let memory = self.roots.entry(key.clone()).or_default();
        memory.errors = memory.errors.saturating_add(1);
        let backoff = error_backoff(memory.errors);
        let at = Instant::now() + backoff;
        memory.error_until = Some(at);
        let note = format!("admission could not {what}: {e}");
        memory.error = Some(note.clone());
        tracing::warn!(group = %key, error = %e, errors = memory.errors, backoff_s = backoff.as_secs(), "admission could not {what}");
        if memory.last_event.as_deref() != Some(note.as_str()) {
            memory.last_event = Some(note.clone());
            self.root_event(key, true, "AdmissionError", &note);
        }
        at
    }
}

/// Labels of [`crate::controllers::metrics::Metrics::object_errors`].
pub(super) fn object_labels(kind: &str, reason: &str) -> ObjectErrorLabels {
    ObjectErrorLabels { kind: kind.into(), reason: reason.into() }
}
