//! Kubernetes' resource quantity, as CEL's `quantity` library parses and compares it.

use cel::objects::Opaque;

use crate::scheduler::parse_milli_value;
use crate::scheduler::parse_value;

/// A resource quantity as CEL's `quantity` library compares it: by value, in thousandths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Quantity {
    pub(super) milli: i128,
}

impl Quantity {
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        match parse_milli_value(s) {
            Ok(m) => Ok(Quantity { milli: i128::from(m) }),
            Err(_) => parse_value(s)
                .map(|v| Quantity { milli: i128::from(v) * 1000 })
                .map_err(|e| format!("invalid quantity {s:?}: {e}")),
        }
    }
}

impl Opaque for Quantity {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}
