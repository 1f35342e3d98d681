//! How large a selector and a device may be: the apiserver's bounds on a selector's length and
//! cost, the evaluator's on its depth, and the sizes the API allows a device.

/// The longest selector muster compiles, in bytes (`CELSelectorExpressionMaxLength`).
pub(crate) const MAX_EXPRESSION_BYTES: usize = 10 * 1024;
/// The most a selector may cost on one device, in the worst case (`CELSelectorExpressionMaxCost`;
/// one unit is about one node evaluated, a tenth of a unit one byte of a string scanned).
pub(crate) const MAX_COST: f64 = 1_000_000.0;
/// The deepest syntax tree muster evaluates: evaluation recurses once per level, on whatever
/// thread runs the admission cycle (2 MiB stacks, and unoptimised builds need ~35 KiB a level).
pub(crate) const MAX_DEPTH: usize = 48;

// The sizes the API allows a device (`k8s.io/api/resource/v1`), which [`CelDevice::new`]
// enforces so that the estimate holds for every device muster evaluates a selector on.

/// `ResourceSliceMaxAttributesAndCapacitiesPerDevice`.
pub(super) const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// `ResourceSliceMaxAttributeValuesPerDevice`: list values, summed over a device's attributes.
pub(super) const MAX_LIST_VALUES: usize = 48;
/// `DeviceAttributeMaxValueLength` is 64 characters; in bytes, at most four times that.
pub(super) const MAX_VALUE_BYTES: usize = 4 * 64;
/// `DeviceMaxDomainLength`, and the driver name's `DriverNameMaxLength`.
pub(super) const MAX_DOMAIN_BYTES: usize = 63;
/// `DeviceMaxIDLength`.
pub(super) const MAX_ID_BYTES: usize = 32;
