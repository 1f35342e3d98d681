//! Device selectors: CEL expressions compiled once per text and evaluated against one device,
//! in the environment kube-scheduler's structured allocator gives them
//! (`k8s.io/dynamic-resource-allocation/cel/compile.go`): a `device` variable with `driver`,
//! `allowMultipleAllocations`, `attributes[domain].name` and `capacity[domain].name`, where a
//! domain a device does not have reads as an empty map. No client, no clock.
//!
//! Selectors come from tenants (ResourceClaims, ResourceClaimTemplates), so each one is bounded
//! before it ever runs, as the apiserver bounds it (`CELSelectorExpressionMaxLength`,
//! `CELSelectorExpressionMaxCost`): the `cel` crate has neither a cost estimator nor an
//! evaluation limit, so [`compile`] refuses an expression that is too long, whose syntax tree is
//! too deep for the evaluator's stack, or whose worst-case cost on any device the API allows
//! (estimated from the tree: comprehensions multiply by their range, string functions by the
//! lengths they can reach, `matches` by the size of its pattern) is over the budget. Parsing
//! happens on a thread of its own with a large stack, since the parser recurses once per
//! operator of a chain like `1+1+...+1`.
//!
//! Its parts: the environment a selector compiles and runs in (`environment`, with the
//! `quantity` and `semver` values it adds), the compilation (`compile`) and the bounds it
//! enforces (`limits`, `check`, `cost`, `regex_cost`), and the device a selector is evaluated
//! against (`device`).

mod check;
mod compile;
mod cost;
mod device;
mod environment;
mod limits;
mod quantity;
mod regex_cost;
mod semver;
#[cfg(test)]
mod test_support;

use cel::Program;

pub(crate) use compile::SelectorCache;
pub(crate) use device::CelDevice;

/// The one variable a selector sees.
const DEVICE_VAR: &str = "device";

/// A compiled selector: the program, and the attribute and capacity domains it indexes by a
/// literal (those read as empty maps on devices that lack them, as in kube-scheduler).
#[derive(Debug)]
pub(crate) struct Selector {
    program: Program,
    domains: Vec<String>,
}
