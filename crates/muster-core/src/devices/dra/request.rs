//! What muster allocates for one claim ([`DeviceRequestSet`]) and why a claim spec is out of
//! that subset ([`ClaimError`], each naming the field).

use std::sync::Arc;

use k8s_openapi::api::resource::v1::{
    DeviceClaimConfiguration, DeviceClassConfiguration, DeviceSelector, ResourceClaimSpec,
};

use super::ALLOCATION_MODE_EXACT_COUNT;
use super::cel::{Selector, SelectorCache};

/// Why a claim spec cannot be allocated by muster, or a chosen set of devices cannot be
/// written: each names the field or object and says why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// A field outside the subset muster allocates.
    #[error("{field}: {why}")]
    Unsupported {
        /// The field path in the claim spec.
        field: String,
        /// Why muster refuses it.
        why: String,
    },
    /// The request names a DeviceClass that does not exist.
    #[error("{field}: DeviceClass {class:?} not found")]
    UnknownClass {
        /// The field path (`spec.devices.requests[i].exactly.deviceClassName`).
        field: String,
        /// The class name.
        class: String,
    },
    /// A CEL selector muster cannot compile or does not support.
    #[error("{field}: CEL selector {expression:?}: {why}")]
    Selector {
        /// `spec.devices.requests[i].exactly.selectors[j].cel.expression` or
        /// `DeviceClass x spec.selectors[j].cel.expression`.
        field: String,
        /// The expression text.
        expression: String,
        /// Why it cannot be used.
        why: String,
    },
    /// A selector failed on a device at run time. As in kube-scheduler's allocator, this fails
    /// the allocation (it does not merely skip the device).
    #[error("{field}: CEL selector {expression:?} on device {device}: runtime error: {why}")]
    Runtime {
        /// The selector's field path, as in [`ClaimError::Selector`].
        field: String,
        /// The expression text.
        expression: String,
        /// The device it failed on (`driver/pool/device`).
        device: String,
        /// The runtime error.
        why: String,
    },
    /// The claim has no device requests.
    #[error("spec.devices.requests: the claim requests no devices")]
    NoRequests,
    /// The chosen devices cannot be allocated (not offered, wrong number).
    #[error("allocation on node {node}: {why}")]
    Allocation {
        /// The node the allocation was for (empty for a shared allocation).
        node: String,
        /// Why.
        why: String,
    },
}

/// One compiled selector and where it came from (for error messages).
#[derive(Clone, Debug)]
pub(crate) struct CompiledSelector {
    pub(crate) field: String,
    pub(crate) expression: String,
    pub(crate) selector: Arc<Selector>,
}

/// What muster can allocate for one claim: every request `exactly`, allocationMode ExactCount
/// (the default), count >= 1, all requests of one DeviceClass with the same selectors.
#[derive(Clone, Debug)]
pub struct DeviceRequestSet {
    pub(crate) class: String,
    pub(crate) requests: Vec<(String, u32)>,
    /// The class's selectors, then the requests' (shared by every request).
    pub(crate) selectors: Vec<CompiledSelector>,
    pub(crate) class_config: Vec<DeviceClassConfiguration>,
    pub(crate) claim_config: Vec<DeviceClaimConfiguration>,
}

impl DeviceRequestSet {
    /// Devices the claim needs: the sum of the requests' counts.
    pub fn total(&self) -> u32 {
        self.requests.iter().map(|(_, c)| *c).fold(0, u32::saturating_add)
    }

    /// The DeviceClass every request names.
    pub fn class(&self) -> &str {
        &self.class
    }

    /// `(request name, count)` in spec order.
    pub fn requests(&self) -> &[(String, u32)] {
        &self.requests
    }

    /// The selector expressions (class first), as written.
    pub fn selector_texts(&self) -> impl Iterator<Item = &str> {
        self.selectors.iter().map(|s| s.expression.as_str())
    }
}

fn unsupported(field: String, why: &str) -> ClaimError {
    ClaimError::Unsupported { field, why: why.to_string() }
}

/// Parses a claim spec against the supported subset; `class_of` finds a DeviceClass's
/// selectors and config by name.
pub(crate) fn parse_spec<'c>(
    spec: &ResourceClaimSpec,
    cache: &SelectorCache,
    class_of: impl Fn(&str) -> Option<(&'c [DeviceSelector], &'c [DeviceClassConfiguration])>,
) -> Result<DeviceRequestSet, ClaimError> {
    let devices = spec.devices.as_ref().ok_or(ClaimError::NoRequests)?;
    if devices.constraints.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err(unsupported(
            "spec.devices.constraints".to_string(),
            "constraints (matchAttribute, distinctAttribute) are not supported; muster's topology chooser places GPUs",
        ));
    }
    let requests = devices.requests.as_deref().unwrap_or_default();
    if requests.is_empty() {
        return Err(ClaimError::NoRequests);
    }
    let mut parsed: Vec<(String, u32)> = Vec::with_capacity(requests.len());
    let mut first: Option<(&str, &[DeviceSelector])> = None;
    for (i, request) in requests.iter().enumerate() {
        let at = format!("spec.devices.requests[{i}]");
        if request.first_available.is_some() {
            return Err(unsupported(
                format!("{at}.firstAvailable"),
                "prioritized lists (firstAvailable) are not supported",
            ));
        }
        let Some(exact) = &request.exactly else {
            return Err(unsupported(format!("{at}.exactly"), "a request must be `exactly`"));
        };
        let at = format!("{at}.exactly");
        if parsed.iter().any(|(n, _)| n == &request.name) {
            return Err(unsupported(format!("spec.devices.requests[{i}].name"), "duplicate request name"));
        }
        if let Some(mode) = exact.allocation_mode.as_deref()
            && mode != ALLOCATION_MODE_EXACT_COUNT
        {
            return Err(unsupported(
                format!("{at}.allocationMode"),
                &format!("allocationMode {mode:?} is not supported (only ExactCount)"),
            ));
        }
        if exact.admin_access == Some(true) {
            return Err(unsupported(format!("{at}.adminAccess"), "admin access is not supported"));
        }
        if exact.capacity.is_some() {
            return Err(unsupported(
                format!("{at}.capacity"),
                "capacity requests (consumable capacity) are not supported",
            ));
        }
        if exact.tolerations.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(unsupported(format!("{at}.tolerations"), "device taint tolerations are not supported"));
        }
        if exact.derived_attributes.as_ref().is_some_and(|d| !d.is_empty()) {
            return Err(unsupported(format!("{at}.derivedAttributes"), "derived attributes are not supported"));
        }
        let count = exact.count.unwrap_or(1);
        let Some(count) = u32::try_from(count).ok().filter(|c| *c >= 1) else {
            return Err(unsupported(
                format!("{at}.count"),
                &format!("count {count} must be between 1 and {}", u32::MAX),
            ));
        };
        let selectors = exact.selectors.as_deref().unwrap_or_default();
        match first {
            None => first = Some((&exact.device_class_name, selectors)),
            Some((class, _)) if class != exact.device_class_name => {
                return Err(unsupported(
                    format!("{at}.deviceClassName"),
                    &format!("all requests must name one DeviceClass ({class:?} in requests[0])"),
                ));
            }
            Some((_, s)) if s != selectors => {
                return Err(unsupported(
                    format!("{at}.selectors"),
                    "all requests must have the same selectors as requests[0]",
                ));
            }
            Some(_) => {}
        }
        parsed.push((request.name.clone(), count));
    }
    let Some((class, request_selectors)) = first else {
        return Err(ClaimError::NoRequests);
    };
    let Some((class_selectors, class_config)) = class_of(class) else {
        return Err(ClaimError::UnknownClass {
            field: "spec.devices.requests[0].exactly.deviceClassName".to_string(),
            class: class.to_string(),
        });
    };
    let mut selectors = Vec::new();
    for (j, s) in class_selectors.iter().enumerate() {
        selectors.push(compile_one(cache, format!("DeviceClass {class} spec.selectors[{j}]"), s)?);
    }
    for (j, s) in request_selectors.iter().enumerate() {
        selectors.push(compile_one(cache, format!("spec.devices.requests[0].exactly.selectors[{j}]"), s)?);
    }
    let mut claim_config = Vec::new();
    for (k, c) in devices.config.iter().flatten().enumerate() {
        if c.opaque.is_none() {
            return Err(unsupported(format!("spec.devices.config[{k}].opaque"), "only opaque configs are supported"));
        }
        if let Some(unknown) = c.requests.iter().flatten().find(|r| !parsed.iter().any(|(n, _)| n == *r)) {
            return Err(unsupported(
                format!("spec.devices.config[{k}].requests"),
                &format!("names request {unknown:?}, which the claim does not have"),
            ));
        }
        claim_config.push(c.clone());
    }
    Ok(DeviceRequestSet {
        class: class.to_string(),
        requests: parsed,
        selectors,
        class_config: class_config.iter().filter(|c| c.opaque.is_some()).cloned().collect(),
        claim_config,
    })
}

fn compile_one(cache: &SelectorCache, at: String, s: &DeviceSelector) -> Result<CompiledSelector, ClaimError> {
    let Some(cel) = &s.cel else {
        return Err(unsupported(at, "only CEL selectors are supported"));
    };
    let field = format!("{at}.cel.expression");
    match cache.get(&cel.expression) {
        Ok(selector) => Ok(CompiledSelector { field, expression: cel.expression.clone(), selector }),
        Err(why) => Err(ClaimError::Selector { field, expression: shortened(&cel.expression), why }),
    }
}

/// The longest selector text a [`ClaimError::Selector`] quotes whole.
const QUOTED_EXPRESSION_BYTES: usize = 256;

/// `expression`, or its start when it is longer than [`QUOTED_EXPRESSION_BYTES`] (a refused
/// selector can be as long as the claim; its error goes into statuses and events).
fn shortened(expression: &str) -> String {
    if expression.len() <= QUOTED_EXPRESSION_BYTES {
        return expression.to_string();
    }
    let mut cut = QUOTED_EXPRESSION_BYTES;
    while !expression.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}... ({} bytes)", &expression[..cut], expression.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overlong_selector_is_refused_and_quoted_short() {
        let huge = format!("device.driver == '{}'", "x".repeat(1_500_000));
        let spec: ResourceClaimSpec = serde_json::from_value(serde_json::json!({"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "c", "selectors": [{"cel": {"expression": huge}}]}}
        ]}}))
        .unwrap_or_else(|e| panic!("{e}"));
        let cache = SelectorCache::default();
        let err = parse_spec(&spec, &cache, |_| Some((&[], &[]))).err();
        match err {
            Some(ClaimError::Selector { field, expression, why }) => {
                assert_eq!(field, "spec.devices.requests[0].exactly.selectors[0].cel.expression");
                assert!(expression.len() < QUOTED_EXPRESSION_BYTES + 32, "{} bytes quoted", expression.len());
                assert!(expression.ends_with(&format!("... ({} bytes)", huge.len())), "{expression}");
                assert!(why.contains("over the limit of 10240 bytes"), "{why}");
            }
            other => panic!("want a selector error, got {other:?}"),
        }
        // A short selector's text is quoted as written.
        assert_eq!(shortened("device.driver == 'x'"), "device.driver == 'x'");
        // Cut on a character boundary: byte 256 falls inside an `é` here.
        assert_eq!(shortened(&format!("a{}", "é".repeat(200))).len(), 255 + "... (401 bytes)".len());
    }
}
