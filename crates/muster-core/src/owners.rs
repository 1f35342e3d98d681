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

/// Whether the object's controlling owner is of API group `group` (any version): the native
/// groups a MusterJob or MusterJobSet made are controlled by one (`batch.muster.dev`), those
/// the Job controller made for batch/v1 Jobs by a Job.
pub fn controlled_by_group(meta: &ObjectMeta, group: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .is_some_and(|o| o.api_version.split_once('/').is_some_and(|(g, _)| g == group))
}

/// Why a ServiceAccount token names no owner.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenOwnerError {
    /// Not three dot-separated parts.
    #[error("not a JWT (header.payload.signature)")]
    NotJwt,
    /// The payload is not base64url JSON.
    #[error("the token's payload is not base64url JSON: {0}")]
    Payload(String),
    /// A legacy (unbound) token, or one of another issuer: no ServiceAccount uid in it.
    #[error("the token names no ServiceAccount uid (kubernetes.io.serviceaccount)")]
    NoServiceAccount,
}

/// The owner reference to the ServiceAccount a bound token (the one kubelet mounts into a pod)
/// was issued for, read from its `kubernetes.io.serviceaccount` claims. What muster creates at
/// run time (its leader Lease, its webhook certificate Secret) is owned by it, so deleting the
/// install (`helm uninstall` deletes the ServiceAccount) lets the garbage collector take them.
/// The signature is not checked: the token is muster's own, read from its own filesystem, and
/// only names an owner, which the API server resolves by uid.
pub fn service_account_owner(token: &str) -> Result<OwnerReference, TokenOwnerError> {
    use base64::Engine as _;
    let mut parts = token.trim().split('.');
    let (Some(_), Some(payload), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(TokenOwnerError::NotJwt);
    };
    // A ServiceAccount token's payload is a few hundred bytes; refuse anything absurd.
    if payload.len() > 16 * 1024 {
        return Err(TokenOwnerError::Payload(format!("{} bytes", payload.len())));
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|e| TokenOwnerError::Payload(e.to_string()))?;
    let claims: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| TokenOwnerError::Payload(e.to_string()))?;
    let sa = &claims["kubernetes.io"]["serviceaccount"];
    match (sa["name"].as_str(), sa["uid"].as_str()) {
        (Some(name), Some(uid)) if !name.is_empty() && !uid.is_empty() => Ok(OwnerReference {
            api_version: "v1".into(),
            kind: "ServiceAccount".into(),
            name: name.into(),
            uid: uid.into(),
            controller: None,
            block_owner_deletion: None,
        }),
        _ => Err(TokenOwnerError::NoServiceAccount),
    }
}

/// `meta`'s owner references with `owner` added, or `None` when it is already there (by uid).
pub fn with_owner(meta: &ObjectMeta, owner: &OwnerReference) -> Option<Vec<OwnerReference>> {
    let refs = meta.owner_references.clone().unwrap_or_default();
    if refs.iter().any(|r| r.uid == owner.uid) {
        return None;
    }
    let mut refs = refs;
    refs.push(owner.clone());
    Some(refs)
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;

    use super::*;

    #[test]
    fn the_controlling_owners_group() {
        let owner = |api_version: &str, controller: Option<bool>| OwnerReference {
            api_version: api_version.into(),
            kind: "K".into(),
            name: "n".into(),
            uid: "u".into(),
            controller,
            ..Default::default()
        };
        let meta = |refs: Vec<OwnerReference>| ObjectMeta { owner_references: Some(refs), ..Default::default() };
        let group = "batch.muster.dev";
        assert!(controlled_by_group(&meta(vec![owner("batch.muster.dev/v1alpha1", Some(true))]), group));
        // A plain owner of the group (a standalone job's PodGroup is also owned by its Workload)
        // is no controller; a Job controls the groups the Job controller made.
        let job = owner("batch/v1", Some(true));
        assert!(!controlled_by_group(&meta(vec![owner("batch.muster.dev/v1alpha1", None), job.clone()]), group));
        assert!(!controlled_by_group(&meta(vec![job]), group));
        // The group must match whole, and a core-group owner ("v1") has none.
        assert!(!controlled_by_group(&meta(vec![owner("batch.muster.dev.evil/v1", Some(true))]), group));
        assert!(!controlled_by_group(&meta(vec![owner("v1", Some(true))]), group));
        assert!(!controlled_by_group(&ObjectMeta::default(), group));
    }

    fn jwt(claims: &serde_json::Value) -> String {
        let e = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        format!("{}.{}.{}", e(br#"{"alg":"RS256"}"#), e(claims.to_string().as_bytes()), e(b"sig"))
    }

    #[test]
    fn a_bound_token_names_its_service_account() {
        let token = jwt(&serde_json::json!({
            "iss": "https://kubernetes.default.svc.cluster.local",
            "kubernetes.io": {
                "namespace": "muster-system",
                "pod": {"name": "muster-abc", "uid": "p-1"},
                "serviceaccount": {"name": "muster", "uid": "sa-1"},
            },
            "sub": "system:serviceaccount:muster-system:muster",
        }));
        let owner = service_account_owner(&format!("{token}\n")).expect("owner");
        assert_eq!((owner.api_version.as_str(), owner.kind.as_str()), ("v1", "ServiceAccount"));
        assert_eq!((owner.name.as_str(), owner.uid.as_str()), ("muster", "sa-1"));
        assert_eq!((owner.controller, owner.block_owner_deletion), (None, None));
    }

    #[test]
    fn tokens_without_an_owner_say_why() {
        let cases = [
            ("a.b", TokenOwnerError::NotJwt),
            ("a.b.c.d", TokenOwnerError::NotJwt),
            (&*jwt(&serde_json::json!({"sub": "system:serviceaccount:ns:legacy"})), TokenOwnerError::NoServiceAccount),
            (
                &*jwt(&serde_json::json!({"kubernetes.io": {"serviceaccount": {"name": "muster", "uid": ""}}})),
                TokenOwnerError::NoServiceAccount,
            ),
        ];
        for (token, want) in cases {
            assert_eq!(service_account_owner(token).unwrap_err(), want, "{token}");
        }
        assert!(matches!(service_account_owner("a.!!!.c"), Err(TokenOwnerError::Payload(_))));
        let huge = format!("a.{}.c", "A".repeat(20_000));
        assert!(matches!(service_account_owner(&huge), Err(TokenOwnerError::Payload(_))));
    }

    #[test]
    fn an_owner_is_added_once() {
        let owner = OwnerReference { uid: "sa-1".into(), name: "muster".into(), ..Default::default() };
        let other = OwnerReference { uid: "x".into(), ..Default::default() };
        let mut meta = ObjectMeta { owner_references: Some(vec![other.clone()]), ..Default::default() };
        let refs = with_owner(&meta, &owner).expect("added");
        assert_eq!(refs, vec![other, owner.clone()]);
        meta.owner_references = Some(refs);
        assert_eq!(with_owner(&meta, &owner), None);
    }
}
