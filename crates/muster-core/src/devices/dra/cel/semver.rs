//! Semantic versions, as Kubernetes' CEL `semver` library parses and orders them.

use cel::objects::Opaque;

/// A semantic version (`MAJOR.MINOR.PATCH[-PRE][+BUILD]`), ordered by semver precedence; build
/// metadata is ignored for order and equality, as in Kubernetes' `semver` library.
#[derive(Clone, Debug)]
pub(crate) struct Semver {
    pub(super) core: [u64; 3],
    pre: Vec<PreId>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum PreId {
    // Numeric identifiers sort before alphanumeric ones.
    Num(u64),
    Alpha(String),
}

impl Semver {
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("invalid semantic version {s:?}: {why}");
        let (rest, _build) = match s.split_once('+') {
            Some((r, b)) if !b.is_empty() && b.split('.').all(valid_ident) => (r, b),
            Some(_) => return Err(bad("bad build metadata")),
            None => (s, ""),
        };
        let (core, pre) = match rest.split_once('-') {
            Some((c, p)) => (c, Some(p)),
            None => (rest, None),
        };
        let parts: Vec<&str> = core.split('.').collect();
        let [a, b, c] = parts.as_slice() else {
            return Err(bad("want MAJOR.MINOR.PATCH"));
        };
        let num = |p: &str| -> Result<u64, String> {
            if p.is_empty() || !p.bytes().all(|c| c.is_ascii_digit()) || (p.len() > 1 && p.starts_with('0')) {
                return Err(bad("bad version number"));
            }
            p.parse().map_err(|_| bad("version number overflows"))
        };
        let core = [num(a)?, num(b)?, num(c)?];
        let mut ids = Vec::new();
        if let Some(pre) = pre {
            for id in pre.split('.') {
                if !valid_ident(id) {
                    return Err(bad("bad prerelease"));
                }
                if id.bytes().all(|c| c.is_ascii_digit()) {
                    ids.push(PreId::Num(num(id)?));
                } else {
                    ids.push(PreId::Alpha(id.to_string()));
                }
            }
        }
        Ok(Semver { core, pre: ids })
    }
}

fn valid_ident(id: &str) -> bool {
    !id.is_empty() && id.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
}

impl PartialEq for Semver {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Semver {}

impl PartialOrd for Semver {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Semver {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.core.cmp(&other.core).then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
            (true, true) => std::cmp::Ordering::Equal,
            (true, false) => std::cmp::Ordering::Greater,
            (false, true) => std::cmp::Ordering::Less,
            (false, false) => self.pre.cmp(&other.pre),
        })
    }
}

impl Opaque for Semver {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Semver"
    }
}
