//! Field paths and field errors, printed the way kubectl prints apiserver validation errors
//! (`spec.scheduling.schedulingPolicy.gang.minCount: Invalid value: 0: must be ...`).

use std::fmt;

/// A path to a field of an object, e.g. `spec.replicatedJobs[0].template.spec`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FieldPath(String);

impl FieldPath {
    /// A path starting at `root` (e.g. `spec`).
    pub fn new(root: &str) -> Self {
        Self(root.to_string())
    }
    /// The path of a named child field.
    pub fn child(&self, name: &str) -> Self {
        if self.0.is_empty() { Self(name.to_string()) } else { Self(format!("{}.{name}", self.0)) }
    }
    /// The path of a list element.
    pub fn index(&self, i: usize) -> Self {
        Self(format!("{}[{i}]", self.0))
    }
    /// The path of a map entry.
    pub fn key(&self, k: &str) -> Self {
        Self(format!("{}[{k}]", self.0))
    }
    /// The path as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The kind of a field error, as in `k8s.io/apimachinery/pkg/util/validation/field`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorType {
    /// A required field is missing.
    Required,
    /// The value is not valid.
    Invalid,
    /// The field may not be set (or may not be set to this value).
    Forbidden,
    /// A list item or name occurs twice.
    Duplicate,
    /// A list has too many items.
    TooMany,
    /// A value is not one of the supported ones.
    NotSupported,
    /// A referenced object does not exist.
    NotFound,
    /// A value is too long.
    TooLong,
    /// The input is inconsistent in a way a user cannot cause through the API.
    InternalError,
}

/// One validation error: what is wrong, where, and why.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldError {
    /// The kind of error.
    pub kind: ErrorType,
    /// The path of the offending field.
    pub path: FieldPath,
    /// The offending value, already formatted (strings quoted), when it helps.
    pub value: Option<String>,
    /// Why it is wrong.
    pub detail: String,
}

/// A list of field errors; empty means valid.
pub type ErrorList = Vec<FieldError>;

/// Formats a string value the way apimachinery does (quoted).
pub fn quote(s: &str) -> String {
    format!("{s:?}")
}

impl FieldError {
    fn new(kind: ErrorType, path: &FieldPath, value: Option<String>, detail: impl Into<String>) -> Self {
        Self { kind, path: path.clone(), value, detail: detail.into() }
    }
    /// `Required value: detail`.
    pub fn required(path: &FieldPath, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Required, path, None, detail)
    }
    /// `Invalid value: value: detail`.
    pub fn invalid(path: &FieldPath, value: impl fmt::Display, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Invalid, path, Some(value.to_string()), detail)
    }
    /// `Forbidden: detail`.
    pub fn forbidden(path: &FieldPath, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Forbidden, path, None, detail)
    }
    /// `Duplicate value: value`.
    pub fn duplicate(path: &FieldPath, value: impl fmt::Display) -> Self {
        Self::new(ErrorType::Duplicate, path, Some(value.to_string()), "")
    }
    /// `Too many: n: must have at most max items`.
    pub fn too_many(path: &FieldPath, actual: usize, max: usize) -> Self {
        let noun = if max == 1 { "item" } else { "items" };
        Self::new(ErrorType::TooMany, path, Some(actual.to_string()), format!("must have at most {max} {noun}"))
    }
    /// `Unsupported value: value: supported values: ...`.
    pub fn not_supported(path: &FieldPath, value: impl fmt::Display, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| quote(s)).collect();
        Self::new(
            ErrorType::NotSupported,
            path,
            Some(value.to_string()),
            format!("supported values: {}", list.join(", ")),
        )
    }
    /// `Not found: value`.
    pub fn not_found(path: &FieldPath, value: impl fmt::Display) -> Self {
        Self::new(ErrorType::NotFound, path, Some(value.to_string()), "")
    }
    /// `Too long: may not be more than max bytes`.
    pub fn too_long(path: &FieldPath, max: usize) -> Self {
        Self::new(ErrorType::TooLong, path, None, format!("may not be more than {max} bytes"))
    }
    /// `Internal error: detail`.
    pub fn internal(path: &FieldPath, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::InternalError, path, None, detail)
    }

    /// The part after the path, as apimachinery's `ErrorBody`.
    pub fn body(&self) -> String {
        let head = match self.kind {
            ErrorType::Required => "Required value",
            ErrorType::Invalid => "Invalid value",
            ErrorType::Forbidden => "Forbidden",
            ErrorType::Duplicate => "Duplicate value",
            ErrorType::TooMany => "Too many",
            ErrorType::NotSupported => "Unsupported value",
            ErrorType::NotFound => "Not found",
            ErrorType::TooLong => "Too long",
            ErrorType::InternalError => "Internal error",
        };
        let mut out = head.to_string();
        if let Some(v) = &self.value {
            out.push_str(": ");
            out.push_str(v);
        }
        if !self.detail.is_empty() {
            out.push_str(": ");
            out.push_str(&self.detail);
        }
        out
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.body())
    }
}

impl std::error::Error for FieldError {}

/// Field errors as one message, `; ` between them (a condition's or a log line's text).
pub fn joined(errors: &[FieldError]) -> String {
    errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ")
}

/// Checks a DNS-1123 label (`my-name`), returning the apimachinery messages.
pub fn dns_label_errors(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    if value.len() > 63 {
        out.push("must be no more than 63 characters".to_string());
    }
    if !is_dns_label(value) {
        out.push("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')".to_string());
    }
    out
}

/// Checks a DNS-1123 subdomain (`example.com`), returning the apimachinery messages.
pub fn dns_subdomain_errors(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    if value.len() > 253 {
        out.push("must be no more than 253 characters".to_string());
    }
    if !is_dns_subdomain(value) {
        out.push("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".to_string());
    }
    out
}

/// Checks a label key (`example.com/rack`), returning the apimachinery messages.
pub fn label_key_errors(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (prefix, name) = match value.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, value),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            out.push("prefix part must be non-empty".to_string());
        } else {
            out.extend(dns_subdomain_errors(p).into_iter().map(|m| format!("prefix part {m}")));
        }
        if name.contains('/') {
            out.push("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".to_string());
            return out;
        }
    }
    if name.is_empty() {
        out.push("name part must be non-empty".to_string());
    } else {
        if name.len() > 63 {
            out.push("name part must be no more than 63 characters".to_string());
        }
        if !is_qualified_name_part(name) {
            out.push("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".to_string());
        }
    }
    out
}

/// Prefixes under `muster.dev` that muster never reads: the local simulator's (`sim.muster.dev/`,
/// kwok finishes a pod after `succeed-after`), the end-to-end tests' and the benchmarks'. A pod
/// template may carry them.
pub const FREE_MUSTER_PREFIXES: [&str; 3] = ["sim.muster.dev", "e2e.muster.dev", "bench.muster.dev"];

/// True for a label or annotation key of muster's own (`muster.dev/...` or
/// `<anything>.muster.dev/...`, e.g. `gpu.muster.dev/indices`, `scheduling.muster.dev/pod-group`,
/// `batch.muster.dev/job-name`), other than the [`FREE_MUSTER_PREFIXES`]. Only muster sets them
/// on the pods it makes; a pod template may not carry them. The prefix is compared as the API
/// server stores it (case-sensitive, as label keys are).
pub fn is_muster_key(key: &str) -> bool {
    let Some((prefix, _)) = key.split_once('/') else { return false };
    (prefix == "muster.dev" || prefix.ends_with(".muster.dev")) && !FREE_MUSTER_PREFIXES.contains(&prefix)
}

/// True for a DNS-1123 label of at most 63 characters.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// True for a DNS-1123 subdomain of at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_join_into_one_message() {
        let a = FieldError::required(&FieldPath::new("spec").child("a"), "x");
        let b = FieldError::required(&FieldPath::new("spec").child("b"), "y");
        assert_eq!(joined(&[]), "");
        assert_eq!(joined(std::slice::from_ref(&a)), a.to_string());
        assert_eq!(joined(&[a.clone(), b.clone()]), format!("{a}; {b}"));
    }

    #[test]
    fn paths_render_like_kubectl() {
        let p = FieldPath::new("spec").child("replicatedJobs").index(2).child("template").key("x");
        assert_eq!(p.to_string(), "spec.replicatedJobs[2].template[x]");
    }

    #[test]
    fn error_bodies_match_apimachinery() {
        let p = FieldPath::new("spec").child("x");
        assert_eq!(FieldError::required(&p, "").to_string(), "spec.x: Required value");
        assert_eq!(
            FieldError::invalid(&p, 0, "must be greater than or equal to 1").to_string(),
            "spec.x: Invalid value: 0: must be greater than or equal to 1"
        );
        assert_eq!(
            FieldError::invalid(&p, quote(""), "must specify one of: `basic`, `gang`").to_string(),
            "spec.x: Invalid value: \"\": must specify one of: `basic`, `gang`"
        );
        assert_eq!(FieldError::too_many(&p, 5, 4).to_string(), "spec.x: Too many: 5: must have at most 4 items");
        assert_eq!(FieldError::duplicate(&p, quote("a")).to_string(), "spec.x: Duplicate value: \"a\"");
        assert_eq!(
            FieldError::not_supported(&p, quote("Always"), &["Never", "OnFailure"]).to_string(),
            "spec.x: Unsupported value: \"Always\": supported values: \"Never\", \"OnFailure\""
        );
        assert_eq!(FieldError::forbidden(&p, "no").to_string(), "spec.x: Forbidden: no");
    }

    #[test]
    fn label_keys() {
        for ok in ["rack", "example.com/rack", "topology.kubernetes.io/zone", "a_b.c-d", "A"] {
            assert!(label_key_errors(ok).is_empty(), "{ok}");
        }
        for bad in ["", "/rack", "Example.com/rack", "a/b/c", "-rack", "rack-", &"x".repeat(64), "a b"] {
            assert!(!label_key_errors(bad).is_empty(), "{bad}");
        }
    }

    #[test]
    fn muster_keys() {
        for own in [
            "gpu.muster.dev/indices",
            "scheduling.muster.dev/pod-group",
            "batch.muster.dev/job-name",
            "muster.dev/version",
            "new.part.muster.dev/anything",
        ] {
            assert!(is_muster_key(own), "{own}");
        }
        for other in [
            "sim.muster.dev/succeed-after",
            "e2e.muster.dev/gang",
            "bench.muster.dev/pod",
            "app",
            "example.com/x",
            "notmuster.dev/x",
            "muster.dev.example.com/x",
            "muster.dev",
            "gpu.muster.devx/indices",
        ] {
            assert!(!is_muster_key(other), "{other}");
        }
    }

    #[test]
    fn dns_names() {
        assert!(is_dns_label("a-1"));
        assert!(!is_dns_label("A"));
        assert!(!is_dns_label("a."));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain("a.b-c.d"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_dns_subdomain(""));
    }
}
