//! Self-managed webhook certificates: a CA and a serving certificate (rcgen) kept in one
//! Secret that every replica shares. Creation and rotation use optimistic concurrency, so
//! replicas never fight: the first writer wins and the others read what it wrote.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use muster_core::owners::with_owner;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// Secret annotation: when the serving certificate expires (RFC 3339).
pub const CERT_NOT_AFTER_ANNOTATION: &str = "muster.dev/cert-not-after";
/// Secret annotation: when the CA expires (RFC 3339).
pub const CA_NOT_AFTER_ANNOTATION: &str = "muster.dev/ca-not-after";
/// Secret annotation: the names the serving certificate is valid for.
pub const SANS_ANNOTATION: &str = "muster.dev/sans";
const CA_COMMON_NAME: &str = "muster-webhook-ca";

/// Errors of certificate handling.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen failed.
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    /// The API server failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The Secret kept changing under us.
    #[error("the certificate Secret kept changing; giving up for now")]
    Contended,
}

/// How long certificates live and when they are renewed.
#[derive(Clone, Copy, Debug)]
pub struct Lifetimes {
    /// Validity of a serving certificate.
    pub cert_validity: Duration,
    /// Renew the serving certificate this long before it expires.
    pub rotate_before: Duration,
    /// Validity of the CA.
    pub ca_validity: Duration,
}

impl Default for Lifetimes {
    fn default() -> Self {
        Self {
            cert_validity: Duration::from_secs(365 * 24 * 3600),
            rotate_before: Duration::from_secs(30 * 24 * 3600),
            ca_validity: Duration::from_secs(10 * 365 * 24 * 3600),
        }
    }
}

/// The certificates as stored and served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertBundle {
    /// CA certificate(s), PEM; several during a CA rotation (the caBundle).
    pub ca_pem: String,
    /// The signing CA's key, PEM.
    pub ca_key_pem: String,
    /// Serving certificate, PEM.
    pub cert_pem: String,
    /// Serving key, PEM.
    pub key_pem: String,
    /// When the serving certificate expires.
    pub cert_not_after: Timestamp,
    /// When the CA expires.
    pub ca_not_after: Timestamp,
    /// Names the serving certificate covers.
    pub sans: Vec<String>,
}

fn offset(t: Timestamp) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(t.as_second()).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn plus(now: Timestamp, d: Duration) -> Timestamp {
    Timestamp::from_second(now.as_second().saturating_add(d.as_secs() as i64)).unwrap_or(now)
}

fn ca_params(now: Timestamp, not_after: Timestamp) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_COMMON_NAME);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.not_before = offset(now);
    params.not_after = offset(not_after);
    params
}

/// A new CA and serving certificate for `sans` (DNS names or IP addresses).
pub fn generate(sans: &[String], now: Timestamp, life: &Lifetimes) -> Result<CertBundle, CertError> {
    let ca_key = KeyPair::generate()?;
    let ca_not_after = plus(now, life.ca_validity);
    let ca = ca_params(now, ca_not_after).self_signed(&ca_key)?;
    let mut bundle = CertBundle {
        ca_pem: ca.pem(),
        ca_key_pem: ca_key.serialize_pem(),
        cert_pem: String::new(),
        key_pem: String::new(),
        cert_not_after: now,
        ca_not_after,
        sans: sans.to_vec(),
    };
    renew_serving(&mut bundle, sans, now, life)?;
    Ok(bundle)
}

/// Issues a new serving certificate from the bundle's CA.
pub fn renew_serving(
    bundle: &mut CertBundle,
    sans: &[String],
    now: Timestamp,
    life: &Lifetimes,
) -> Result<(), CertError> {
    let ca_key = KeyPair::from_pem(&bundle.ca_key_pem)?;
    let issuer = Issuer::new(ca_params(now, bundle.ca_not_after), ca_key);
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, sans.first().map(String::as_str).unwrap_or("muster-webhook"));
    params.distinguished_name = dn;
    params.subject_alt_names = sans
        .iter()
        .map(|s| match s.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => s.clone().try_into().map(SanType::DnsName),
        })
        .collect::<Result<_, _>>()?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let not_after = plus(now, life.cert_validity).min(bundle.ca_not_after);
    params.not_before = offset(now);
    params.not_after = offset(not_after);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    bundle.cert_pem = cert.pem();
    bundle.key_pem = key.serialize_pem();
    bundle.cert_not_after = not_after;
    bundle.sans = sans.to_vec();
    Ok(())
}

/// What must happen to a stored bundle at `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Keep it.
    Keep,
    /// Issue a new serving certificate from the same CA.
    Serving,
    /// Make a new CA (and serving certificate); the old CA stays in the bundle for a while.
    Everything,
}

/// Decides whether a bundle needs renewing (expiry close, or names changed).
pub fn renewal(bundle: &CertBundle, sans: &[String], now: Timestamp, life: &Lifetimes) -> Renewal {
    let due = |t: Timestamp| t.as_second() - now.as_second() <= life.rotate_before.as_secs() as i64;
    if due(bundle.ca_not_after) {
        Renewal::Everything
    } else if due(bundle.cert_not_after) || bundle.sans != sans {
        Renewal::Serving
    } else {
        Renewal::Keep
    }
}

/// The first PEM block of a bundle (the current CA comes first), newline-terminated.
fn first_pem_block(bundle: &str) -> Option<String> {
    const END: &str = "-----END CERTIFICATE-----";
    let end = bundle.find(END)? + END.len();
    Some(format!("{}\n", bundle[..end].trim_start()))
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    secret.data.as_ref()?.get(key).and_then(|b| String::from_utf8(b.0.clone()).ok())
}

fn annotation_time(secret: &Secret, key: &str) -> Option<Timestamp> {
    secret.metadata.annotations.as_ref()?.get(key)?.parse().ok()
}

/// Reads a bundle from its Secret; `None` when anything is missing.
pub fn from_secret(secret: &Secret) -> Option<CertBundle> {
    Some(CertBundle {
        ca_pem: text(secret, "ca.crt")?,
        ca_key_pem: text(secret, "ca.key")?,
        cert_pem: text(secret, "tls.crt")?,
        key_pem: text(secret, "tls.key")?,
        cert_not_after: annotation_time(secret, CERT_NOT_AFTER_ANNOTATION)?,
        ca_not_after: annotation_time(secret, CA_NOT_AFTER_ANNOTATION)?,
        sans: secret
            .metadata
            .annotations
            .as_ref()?
            .get(SANS_ANNOTATION)?
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
    })
}

/// Writes a bundle into a Secret's data and annotations.
pub fn to_secret(bundle: &CertBundle, mut secret: Secret) -> Secret {
    let data = BTreeMap::from([
        ("ca.crt".to_string(), ByteString(bundle.ca_pem.clone().into_bytes())),
        ("ca.key".to_string(), ByteString(bundle.ca_key_pem.clone().into_bytes())),
        ("tls.crt".to_string(), ByteString(bundle.cert_pem.clone().into_bytes())),
        ("tls.key".to_string(), ByteString(bundle.key_pem.clone().into_bytes())),
    ]);
    secret.data = Some(data);
    secret.type_ = Some("kubernetes.io/tls".into());
    let annotations = secret.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(CERT_NOT_AFTER_ANNOTATION.into(), bundle.cert_not_after.to_string());
    annotations.insert(CA_NOT_AFTER_ANNOTATION.into(), bundle.ca_not_after.to_string());
    annotations.insert(SANS_ANNOTATION.into(), bundle.sans.join(","));
    secret
}

/// Returns the current bundle from Secret `name`, creating or renewing it when needed. With an
/// `owner` (the ServiceAccount muster runs as: `controllers::owner`), the Secret is owned by it,
/// so it goes with the install; an existing Secret without it gets it at the next write.
pub async fn ensure(
    client: &Client,
    namespace: &str,
    name: &str,
    sans: &[String],
    life: &Lifetimes,
    owner: Option<&OwnerReference>,
) -> Result<CertBundle, CertError> {
    let api = Api::<Secret>::namespaced(client.clone(), namespace);
    for _ in 0..5 {
        let now = Timestamp::now();
        match api.get_opt(name).await? {
            None => {
                let bundle = generate(sans, now, life)?;
                let secret = to_secret(
                    &bundle,
                    Secret {
                        metadata: ObjectMeta {
                            name: Some(name.into()),
                            namespace: Some(namespace.into()),
                            owner_references: owner.map(|o| vec![o.clone()]),
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                );
                match api.create(&PostParams::default(), &secret).await {
                    Ok(_) => {
                        tracing::info!(secret = name, "created the webhook certificate");
                        return Ok(bundle);
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Some(secret) => {
                let current = from_secret(&secret);
                let (mut bundle, what) = match current {
                    Some(b) => {
                        let r = renewal(&b, sans, now, life);
                        (b, r)
                    }
                    None => (generate(sans, now, life)?, Renewal::Everything),
                };
                let owners = owner.and_then(|o| with_owner(&secret.metadata, o));
                match what {
                    Renewal::Keep if owners.is_none() => return Ok(bundle),
                    // Only the owner is missing: written below with the same certificate.
                    Renewal::Keep => {}
                    Renewal::Serving => renew_serving(&mut bundle, sans, now, life)?,
                    Renewal::Everything => {
                        let old_ca = bundle.ca_pem.clone();
                        bundle = generate(sans, now, life)?;
                        // Trust the previous CA a little longer, for clients that still have it
                        // (only that one: the bundle does not grow with every rotation).
                        if let Some(previous) = first_pem_block(&old_ca)
                            && from_secret(&secret).is_some()
                        {
                            bundle.ca_pem = format!("{}{previous}", bundle.ca_pem);
                        }
                    }
                }
                // replace() carries the resourceVersion: a concurrent writer makes this fail
                // with 409 and we read its result instead.
                let mut updated = to_secret(&bundle, secret);
                if let Some(refs) = owners {
                    updated.metadata.owner_references = Some(refs);
                }
                match api.replace(name, &PostParams::default(), &updated).await {
                    Ok(_) => {
                        tracing::info!(secret = name, renewal = ?what, not_after = %bundle.cert_not_after, "renewed the webhook certificate");
                        return Ok(bundle);
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Err(CertError::Contended)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("ts")
    }

    #[test]
    fn generates_a_ca_signed_serving_certificate() {
        let life = Lifetimes::default();
        let sans = vec!["muster-webhook.muster-system.svc".to_string(), "127.0.0.1".to_string()];
        // The handshake checks validity against the real clock.
        let now = Timestamp::now();
        let b = generate(&sans, now, &life).expect("generate");
        assert!(b.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(b.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(b.key_pem.contains("PRIVATE KEY"));
        assert_ne!(b.ca_pem, b.cert_pem);
        assert_eq!(b.cert_not_after.as_second(), now.as_second() + life.cert_validity.as_secs() as i64);
        handshake(&b, "muster-webhook.muster-system.svc");
        handshake(&b, "127.0.0.1");
    }

    /// A real TLS handshake in memory: the client trusts only the bundle's CA and checks the name.
    fn handshake(b: &CertBundle, server_name: &str) {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        use std::sync::Arc;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(b.cert_pem.as_bytes()).collect::<Result<_, _>>().expect("certs");
        let key = PrivateKeyDer::from_pem_slice(b.key_pem.as_bytes()).expect("key");
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("key matches certificate");
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(b.ca_pem.as_bytes()) {
            roots.add(ca.expect("ca")).expect("root");
        }
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from(server_name.to_string()).expect("name");
        let mut c = rustls::ClientConnection::new(Arc::new(client), name).expect("client");
        let mut s = rustls::ServerConnection::new(Arc::new(server)).expect("server");
        for _ in 0..10 {
            let mut buf = Vec::new();
            c.write_tls(&mut buf).expect("client write");
            s.read_tls(&mut buf.as_slice()).expect("server read");
            s.process_new_packets().expect("server accepts the client");
            let mut buf = Vec::new();
            s.write_tls(&mut buf).expect("server write");
            c.read_tls(&mut buf.as_slice()).expect("client read");
            c.process_new_packets().expect("client trusts the server certificate");
            if !c.is_handshaking() && !s.is_handshaking() {
                return;
            }
        }
        panic!("handshake did not complete");
    }

    #[test]
    fn renewal_follows_expiry_and_names() {
        let life = Lifetimes {
            cert_validity: Duration::from_secs(100),
            rotate_before: Duration::from_secs(30),
            ca_validity: Duration::from_secs(1000),
        };
        let sans = vec!["a.svc".to_string()];
        let b = generate(&sans, t(0), &life).expect("generate");
        assert_eq!(renewal(&b, &sans, t(10), &life), Renewal::Keep);
        assert_eq!(renewal(&b, &sans, t(75), &life), Renewal::Serving);
        assert_eq!(renewal(&b, &["b.svc".to_string()], t(10), &life), Renewal::Serving);
        assert_eq!(renewal(&b, &sans, t(980), &life), Renewal::Everything);
    }

    #[test]
    fn a_bundle_keeps_only_the_previous_ca() {
        let a = generate(&["x.svc".to_string()], t(1_000), &Lifetimes::default()).expect("generate");
        let b = generate(&["x.svc".to_string()], t(2_000), &Lifetimes::default()).expect("generate");
        let two = format!("{}{}", b.ca_pem, a.ca_pem);
        assert_eq!(first_pem_block(&two).as_deref(), Some(b.ca_pem.as_str()));
        assert_eq!(first_pem_block("no pem"), None);
    }

    #[test]
    fn secrets_round_trip() {
        let b = generate(&["x.svc".to_string()], t(1_000), &Lifetimes::default()).expect("generate");
        let s = to_secret(&b, Secret::default());
        assert_eq!(from_secret(&s), Some(b));
        assert_eq!(from_secret(&Secret::default()), None);
    }

    #[test]
    fn renewed_certificates_keep_the_ca() {
        let life = Lifetimes::default();
        let mut b = generate(&["x.svc".to_string()], t(1_000), &life).expect("generate");
        let (ca, cert) = (b.ca_pem.clone(), b.cert_pem.clone());
        renew_serving(&mut b, &["x.svc".to_string()], t(2_000), &life).expect("renew");
        assert_eq!(b.ca_pem, ca);
        assert_ne!(b.cert_pem, cert);
    }
}
