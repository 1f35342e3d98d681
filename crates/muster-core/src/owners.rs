//! PURE: owner references as muster's controllers write and read them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// A controller reference to `owner` that also blocks the owner's foreground deletion until
/// the dependent is gone (so a recreated child never meets its predecessor's objects).
pub fn controller_ref<K: kube_core::Resource<DynamicType = ()>>(owner: &K) -> Option<OwnerReference> {
    owner.controller_owner_ref(&()).map(|o| OwnerReference { block_owner_deletion: Some(true), ..o })
}

/// The controlling owner's uid of an object, if any.
pub fn controller_uid(meta: &ObjectMeta) -> Option<&str> {
    meta.owner_references.iter().flatten().find(|o| o.controller == Some(true)).map(|o| o.uid.as_str())
}
