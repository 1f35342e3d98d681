//! The job controller's pod cache: a record of each pod (the core's [`JobPod`]: what a
//! reconcile reads of it and which job it belongs to), keyed in the reflector store as the pod
//! is. The record is pure and lives in the core; the key is the store's, so it lives here.

use std::borrow::Cow;
use std::ops::Deref;

use super::plan::JobPod;

/// A [`JobPod`] as the reflector store keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct CachedPod(pub JobPod);

impl Deref for CachedPod {
    type Target = JobPod;

    fn deref(&self) -> &JobPod {
        &self.0
    }
}

/// A reflector store of records keys them by name and namespace, as it does pods.
impl kube::runtime::reflector::Lookup for CachedPod {
    type DynamicType = ();

    fn kind(_: &()) -> Cow<'_, str> {
        "Pod".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "pods".into()
    }

    fn name(&self) -> Option<Cow<'_, str>> {
        Some(self.observed.name.as_str().into())
    }

    fn namespace(&self) -> Option<Cow<'_, str>> {
        Some(self.namespace.as_str().into())
    }

    fn resource_version(&self) -> Option<Cow<'_, str>> {
        None
    }

    fn uid(&self) -> Option<Cow<'_, str>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    #[test]
    fn a_job_pod_record_is_keyed_in_the_store_as_its_pod() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "train-1-abc", "namespace": "ns"},
            "spec": {"containers": [{"name": "c"}]},
        }))
        .expect("pod");
        // Keyed in a reflector store as the pod is.
        let key = kube::runtime::reflector::Lookup::to_object_ref(&CachedPod(JobPod::of(&pod)), ());
        assert_eq!((key.name.as_str(), key.namespace.as_deref()), ("train-1-abc", Some("ns")));
    }
}
