//! A device as selectors see it: its driver, attributes and capacity as CEL values, within the
//! sizes the API allows, and the evaluation of a compiled selector against it.

use std::collections::HashMap;
use std::sync::Arc;

use cel::objects::{Key, Map};
use cel::{Context, Value};
use k8s_openapi::api::resource::v1::Device;

use super::compile::bounded;
use super::environment::{env, register_functions};
use super::limits::{MAX_ATTRIBUTES_AND_CAPACITIES, MAX_DOMAIN_BYTES, MAX_ID_BYTES, MAX_LIST_VALUES, MAX_VALUE_BYTES};
use super::quantity::Quantity;
use super::semver::Semver;
use super::{DEVICE_VAR, Selector};

/// A device as selectors see it, built once per device.
#[derive(Clone, Debug)]
pub(crate) struct CelDevice {
    driver: Value,
    allow_multiple: bool,
    attributes: HashMap<String, HashMap<String, Value>>,
    capacity: HashMap<String, HashMap<String, Value>>,
    /// The `device` value when no selector needs a domain the device lacks.
    value: Value,
}

impl CelDevice {
    /// The device's CEL view; an attribute kube-scheduler would fail to convert (a bad version)
    /// is an error naming it.
    ///
    /// A device over the sizes the API allows (which the apiserver never stores, and which
    /// selector cost estimates rely on) is an error as well.
    pub(crate) fn new(driver: &str, device: &Device) -> Result<Self, String> {
        if driver.len() > MAX_DOMAIN_BYTES {
            return Err(format!("the driver name is longer than {MAX_DOMAIN_BYTES} bytes"));
        }
        let count = device.attributes.as_ref().map_or(0, |a| a.len()) + device.capacity.as_ref().map_or(0, |c| c.len());
        if count > MAX_ATTRIBUTES_AND_CAPACITIES {
            return Err(format!(
                "{count} attributes and capacities, over the API's limit of {MAX_ATTRIBUTES_AND_CAPACITIES}"
            ));
        }
        let mut list_values = 0;
        let mut attributes: HashMap<String, HashMap<String, Value>> = HashMap::new();
        for (name, attribute) in device.attributes.iter().flatten() {
            let (domain, id) = qualified_within_limits(name, driver)?;
            list_values += attribute_size(attribute).map_err(|why| format!("attribute {name}: {why}"))?;
            if list_values > MAX_LIST_VALUES {
                return Err(format!("attribute {name}: over the API's limit of {MAX_LIST_VALUES} list values"));
            }
            let value = attribute_value(attribute).map_err(|why| format!("attribute {name}: {why}"))?;
            attributes.entry(domain).or_default().insert(id, value);
        }
        let mut capacity: HashMap<String, HashMap<String, Value>> = HashMap::new();
        for (name, c) in device.capacity.iter().flatten() {
            let (domain, id) = qualified_within_limits(name, driver)?;
            let q = Quantity::parse(&c.value.0).map_err(|why| format!("capacity {name}: {why}"))?;
            capacity.entry(domain).or_default().insert(id, Value::Opaque(Arc::new(q)));
        }
        let mut device = CelDevice {
            driver: Value::from(driver.to_string()),
            allow_multiple: device.allow_multiple_allocations.unwrap_or(false),
            attributes,
            capacity,
            value: Value::Null,
        };
        device.value = device.build(&[]);
        Ok(device)
    }

    fn build(&self, domains: &[String]) -> Value {
        let nested = |maps: &HashMap<String, HashMap<String, Value>>| {
            let mut outer: HashMap<Key, Value> =
                maps.iter().map(|(d, m)| (Key::from(d.as_str()), Value::from(m.clone()))).collect();
            for d in domains {
                outer
                    .entry(Key::from(d.as_str()))
                    .or_insert_with(|| Value::Map(Map::from(HashMap::<Key, Value>::new())));
            }
            Value::Map(Map::from(outer))
        };
        let mut fields: HashMap<Key, Value> = HashMap::new();
        fields.insert(Key::from("driver"), self.driver.clone());
        fields.insert(Key::from("allowMultipleAllocations"), Value::Bool(self.allow_multiple));
        fields.insert(Key::from("attributes"), nested(&self.attributes));
        fields.insert(Key::from("capacity"), nested(&self.capacity));
        Value::Map(Map::from(fields))
    }

    /// Whether the selector matches; Err carries a runtime error (or a non-bool result).
    pub(crate) fn matches(&self, selector: &Selector) -> Result<bool, String> {
        let missing =
            selector.domains.iter().any(|d| !self.attributes.contains_key(d) || !self.capacity.contains_key(d));
        let value = if missing { self.build(&selector.domains) } else { self.value.clone() };
        let mut ctx = Context::with_env(env());
        register_functions(&mut ctx);
        ctx.add_variable_from_value(DEVICE_VAR, value);
        // The evaluator is a library over tenant input: a panic in it fails this selector on
        // this device, not the admission cycle.
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| selector.program.execute(&ctx)));
        match run {
            Ok(Ok(Value::Bool(b))) => Ok(b),
            Ok(Ok(other)) => Err(format!("the result is {:?}, not a bool", other.type_of())),
            Ok(Err(e)) => Err(bounded(e.to_string())),
            Err(_) => Err("the CEL evaluator failed (panicked)".to_string()),
        }
    }
}

/// [`qualified`], Err when a part is longer than the API allows.
fn qualified_within_limits(name: &str, driver: &str) -> Result<(String, String), String> {
    let (domain, id) = qualified(name, driver);
    if domain.len() > MAX_DOMAIN_BYTES || id.len() > MAX_ID_BYTES {
        return Err(format!(
            "attribute or capacity name {name:?} is longer than the API allows ({MAX_DOMAIN_BYTES}-byte domain, {MAX_ID_BYTES}-byte name)"
        ));
    }
    Ok((domain, id))
}

/// How many list values an attribute holds (0 for a scalar); Err when a string or version is
/// longer than the API allows.
fn attribute_size(a: &k8s_openapi::api::resource::v1::DeviceAttribute) -> Result<usize, String> {
    let long = |s: &String| s.len() > MAX_VALUE_BYTES;
    let mut strings = a.strings.iter().flatten().chain(a.versions.iter().flatten()).chain(&a.string).chain(&a.version);
    if strings.any(long) {
        return Err(format!("a value is longer than {MAX_VALUE_BYTES} bytes"));
    }
    let lists = [
        a.ints.as_ref().map(Vec::len),
        a.bools.as_ref().map(Vec::len),
        a.strings.as_ref().map(Vec::len),
        a.versions.as_ref().map(Vec::len),
    ];
    Ok(lists.into_iter().flatten().sum())
}

/// `name` split as kube-scheduler does: unqualified names live under the driver's domain.
fn qualified(name: &str, driver: &str) -> (String, String) {
    match name.split_once('/') {
        Some((domain, id)) => (domain.to_string(), id.to_string()),
        None => (driver.to_string(), name.to_string()),
    }
}

fn attribute_value(a: &k8s_openapi::api::resource::v1::DeviceAttribute) -> Result<Value, String> {
    let semver = |s: &String| Semver::parse(s).map(|v| Value::Opaque(Arc::new(v)));
    if let Some(v) = &a.ints {
        return Ok(Value::List(Arc::new(v.iter().map(|i| Value::Int(*i)).collect())));
    }
    if let Some(v) = &a.bools {
        return Ok(Value::List(Arc::new(v.iter().map(|b| Value::Bool(*b)).collect())));
    }
    if let Some(v) = &a.strings {
        return Ok(Value::List(Arc::new(v.iter().map(|s| Value::from(s.clone())).collect())));
    }
    if let Some(v) = &a.versions {
        return Ok(Value::List(Arc::new(v.iter().map(semver).collect::<Result<_, _>>()?)));
    }
    if let Some(i) = a.int {
        return Ok(Value::Int(i));
    }
    if let Some(b) = a.bool {
        return Ok(Value::Bool(b));
    }
    if let Some(s) = &a.string {
        return Ok(Value::from(s.clone()));
    }
    if let Some(v) = &a.version {
        return semver(v);
    }
    Err("unsupported attribute value".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_over_the_api_sizes_are_errors() {
        use k8s_openapi::api::resource::v1::DeviceAttribute;
        use std::collections::BTreeMap;
        let with = |attributes: BTreeMap<String, DeviceAttribute>| Device {
            name: "d".to_string(),
            attributes: Some(attributes),
            ..Default::default()
        };
        let string = |s: String| DeviceAttribute { string: Some(s), ..Default::default() };
        let ok = with(BTreeMap::from([("productName".to_string(), string("x".repeat(64)))]));
        assert!(CelDevice::new("gpu.nvidia.com", &ok).is_ok());
        let long = with(BTreeMap::from([("productName".to_string(), string("x".repeat(MAX_VALUE_BYTES + 1)))]));
        assert!(CelDevice::new("gpu.nvidia.com", &long).is_err_and(|e| e.contains("longer than")));
        let many = with((0..=MAX_ATTRIBUTES_AND_CAPACITIES).map(|i| (format!("a{i}"), string("x".into()))).collect());
        assert!(CelDevice::new("gpu.nvidia.com", &many).is_err_and(|e| e.contains("over the API's limit")));
        let lists = with(
            (0..2)
                .map(|i| (format!("l{i}"), DeviceAttribute { ints: Some(vec![1; 30]), ..Default::default() }))
                .collect(),
        );
        assert!(CelDevice::new("gpu.nvidia.com", &lists).is_err_and(|e| e.contains("list values")));
        let name =
            with(BTreeMap::from([(format!("example.com/{}", "n".repeat(MAX_ID_BYTES + 1)), string("x".into()))]));
        assert!(CelDevice::new("gpu.nvidia.com", &name).is_err_and(|e| e.contains("longer than the API allows")));
    }
}
