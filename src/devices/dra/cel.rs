//! Device selectors: CEL expressions compiled once per text and evaluated against one device,
//! in the environment kube-scheduler's structured allocator gives them
//! (`k8s.io/dynamic-resource-allocation/cel/compile.go`): a `device` variable with `driver`,
//! `allowMultipleAllocations`, `attributes[domain].name` and `capacity[domain].name`, where a
//! domain a device does not have reads as an empty map. No client, no clock.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use cel::common::ast::{EntryExpr, Expr, LiteralValue};
use cel::extractors::This;
use cel::objects::{Key, Map, Opaque};
use cel::{Context, Env, ExecutionError, IdedExpr, Program, Value};
use k8s_openapi::api::resource::v1::Device;

use crate::scheduler::parse_milli_value;
use crate::scheduler::parse_value;

/// Functions and operators a selector may call: the standard ones, the string extension and
/// the Kubernetes `quantity` and `semver` libraries as far as muster implements them. Anything
/// else is refused when the selector is compiled, never evaluated to a silent false.
const SUPPORTED_FUNCTIONS: &[&str] = &[
    "_?_:_",
    "_&&_",
    "_||_",
    "!_",
    "_-_",
    "_+_",
    "_*_",
    "_/_",
    "_%_",
    "_==_",
    "_!=_",
    "_>=_",
    "_<=_",
    "_>_",
    "_<_",
    "-_",
    "_[_]",
    "@in",
    "@not_strictly_false",
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "string",
    "int",
    "uint",
    "double",
    "bool",
    "lowerAscii",
    "upperAscii",
    "split",
    "join",
    "replace",
    "substring",
    "indexOf",
    "lastIndexOf",
    "trim",
    "charAt",
    "quantity",
    "isQuantity",
    "semver",
    "isSemver",
    "compareTo",
    "isGreaterThan",
    "isLessThan",
    "asInteger",
    "major",
    "minor",
    "patch",
];

/// The one variable a selector sees.
const DEVICE_VAR: &str = "device";

/// A compiled selector: the program, and the attribute and capacity domains it indexes by a
/// literal (those read as empty maps on devices that lack them, as in kube-scheduler).
#[derive(Debug)]
pub(crate) struct Selector {
    program: Program,
    domains: Vec<String>,
}

/// Compiled selectors by expression text; an error is cached as well, so a broken class costs
/// one compilation per inventory.
#[derive(Debug, Default)]
pub(crate) struct SelectorCache {
    compiled: Mutex<HashMap<String, Result<Arc<Selector>, String>>>,
}

impl SelectorCache {
    /// The compiled selector for `expression`, or why it cannot be used.
    pub(crate) fn get(&self, expression: &str) -> Result<Arc<Selector>, String> {
        let mut compiled = match self.compiled.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        compiled.entry(expression.to_string()).or_insert_with(|| compile(expression).map(Arc::new)).clone()
    }
}

fn env() -> Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Env::stdlib();
        // The strings extension is part of Kubernetes' base CEL environment.
        if env.add_extension(cel::extensions::strings).is_err() {
            return Arc::new(Env::stdlib());
        }
        Arc::new(env)
    })
    .clone()
}

/// Compiles a selector and checks that it only uses what muster evaluates.
fn compile(expression: &str) -> Result<Selector, String> {
    let program = env().compile(expression).map_err(|e| format!("compilation failed: {e}"))?;
    let mut check = Check::default();
    check.walk(program.expression(), &mut Vec::new());
    if let Some(why) = check.refused {
        return Err(why);
    }
    Ok(Selector { program, domains: check.domains.into_iter().collect() })
}

/// What a walk over a selector's syntax tree found.
#[derive(Default)]
struct Check {
    refused: Option<String>,
    domains: HashSet<String>,
}

impl Check {
    fn refuse(&mut self, why: String) {
        self.refused.get_or_insert(why);
    }

    fn walk(&mut self, e: &IdedExpr, bound: &mut Vec<String>) {
        match &e.expr {
            Expr::Unspecified => self.refuse("the expression is empty".to_string()),
            Expr::Literal(_) => {}
            Expr::Ident(name) => {
                if name != DEVICE_VAR && !bound.iter().any(|b| b == name) {
                    self.refuse(format!("undeclared reference to `{name}` (only `device` is declared)"));
                }
            }
            Expr::Select(select) => {
                if let Some(domain) = map_field_domain(&select.operand, &select.field) {
                    self.domains.insert(domain);
                }
                self.walk(&select.operand, bound);
            }
            Expr::Call(call) => {
                if !SUPPORTED_FUNCTIONS.contains(&call.func_name.as_str()) {
                    self.refuse(format!("function `{}` is not supported by muster's CEL evaluator", call.func_name));
                }
                if call.func_name == "_[_]"
                    && let [operand, key] = call.args.as_slice()
                    && let Expr::Literal(LiteralValue::String(s)) = &key.expr
                    && let Some(domain) = map_field_domain(operand, s.inner())
                {
                    self.domains.insert(domain);
                }
                if let Some(target) = &call.target {
                    self.walk(target, bound);
                }
                for arg in &call.args {
                    self.walk(arg, bound);
                }
            }
            Expr::List(list) => {
                if !list.optional_indices.is_empty() {
                    self.refuse("optional list elements are not supported".to_string());
                }
                for element in &list.elements {
                    self.walk(element, bound);
                }
            }
            Expr::Map(map) => {
                for entry in &map.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(m) if !m.optional => {
                            self.walk(&m.key, bound);
                            self.walk(&m.value, bound);
                        }
                        _ => self.refuse("optional map entries are not supported".to_string()),
                    }
                }
            }
            Expr::Struct(s) => self.refuse(format!("message construction (`{}{{...}}`) is not supported", s.type_name)),
            Expr::Comprehension(c) => {
                self.walk(&c.iter_range, bound);
                self.walk(&c.accu_init, bound);
                let depth = bound.len();
                bound.push(c.iter_var.clone());
                bound.extend(c.iter_var2.clone());
                bound.push(c.accu_var.clone());
                self.walk(&c.loop_cond, bound);
                self.walk(&c.loop_step, bound);
                self.walk(&c.result, bound);
                bound.truncate(depth);
            }
        }
    }
}

/// `key` when `operand` is `device.attributes` or `device.capacity`.
fn map_field_domain(operand: &IdedExpr, key: &str) -> Option<String> {
    match &operand.expr {
        Expr::Select(s) if !s.test && (s.field == "attributes" || s.field == "capacity") => match &s.operand.expr {
            Expr::Ident(name) if name == DEVICE_VAR => Some(key.to_string()),
            _ => None,
        },
        _ => None,
    }
}

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
    pub(crate) fn new(driver: &str, device: &Device) -> Result<Self, String> {
        let mut attributes: HashMap<String, HashMap<String, Value>> = HashMap::new();
        for (name, attribute) in device.attributes.iter().flatten() {
            let value = attribute_value(attribute).map_err(|why| format!("attribute {name}: {why}"))?;
            let (domain, id) = qualified(name, driver);
            attributes.entry(domain).or_default().insert(id, value);
        }
        let mut capacity: HashMap<String, HashMap<String, Value>> = HashMap::new();
        for (name, c) in device.capacity.iter().flatten() {
            let q = Quantity::parse(&c.value.0).map_err(|why| format!("capacity {name}: {why}"))?;
            let (domain, id) = qualified(name, driver);
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
        match selector.program.execute(&ctx) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!("the result is {:?}, not a bool", other.type_of())),
            Err(e) => Err(e.to_string()),
        }
    }
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

fn register_functions(ctx: &mut Context) {
    // Names are not stdlib overloads, so registration cannot fail; a failure would only make
    // the call an undeclared reference, a runtime error, never a silent false.
    let _ = ctx.add_function("quantity", |s: Arc<String>| -> Result<Value, ExecutionError> {
        Quantity::parse(&s)
            .map(|q| Value::Opaque(Arc::new(q)))
            .map_err(|e| ExecutionError::function_error("quantity", e))
    });
    let _ = ctx.add_function("isQuantity", |s: Arc<String>| Quantity::parse(&s).is_ok());
    let _ = ctx.add_function("semver", |s: Arc<String>| -> Result<Value, ExecutionError> {
        Semver::parse(&s).map(|v| Value::Opaque(Arc::new(v))).map_err(|e| ExecutionError::function_error("semver", e))
    });
    let _ = ctx.add_function("isSemver", |s: Arc<String>| Semver::parse(&s).is_ok());
    let _ = ctx.add_function("compareTo", |This(a): This<Arc<dyn Opaque>>, b: Arc<dyn Opaque>| {
        compare("compareTo", &a, &b).map(|o| o as i64)
    });
    let _ = ctx.add_function("isGreaterThan", |This(a): This<Arc<dyn Opaque>>, b: Arc<dyn Opaque>| {
        compare("isGreaterThan", &a, &b).map(|o| o.is_gt())
    });
    let _ = ctx.add_function("isLessThan", |This(a): This<Arc<dyn Opaque>>, b: Arc<dyn Opaque>| {
        compare("isLessThan", &a, &b).map(|o| o.is_lt())
    });
    let _ = ctx.add_function("asInteger", |This(a): This<Arc<dyn Opaque>>| -> Result<i64, ExecutionError> {
        let q = a
            .downcast_ref::<Quantity>()
            .ok_or_else(|| ExecutionError::function_error("asInteger", "not a quantity"))?;
        if q.milli % 1000 != 0 {
            return Err(ExecutionError::function_error("asInteger", "the quantity is not an integer"));
        }
        i64::try_from(q.milli / 1000)
            .map_err(|_| ExecutionError::function_error("asInteger", "the quantity overflows int"))
    });
    for (name, part) in [("major", 0usize), ("minor", 1), ("patch", 2)] {
        let _ = ctx.add_function(name, move |This(a): This<Arc<dyn Opaque>>| -> Result<i64, ExecutionError> {
            let v = a.downcast_ref::<Semver>().ok_or_else(|| ExecutionError::function_error(name, "not a semver"))?;
            i64::try_from(v.core[part])
                .map_err(|_| ExecutionError::function_error(name, "the version part overflows int"))
        });
    }
}

fn compare(function: &str, a: &Arc<dyn Opaque>, b: &Arc<dyn Opaque>) -> Result<std::cmp::Ordering, ExecutionError> {
    if let (Some(x), Some(y)) = (a.downcast_ref::<Quantity>(), b.downcast_ref::<Quantity>()) {
        return Ok(x.milli.cmp(&y.milli));
    }
    if let (Some(x), Some(y)) = (a.downcast_ref::<Semver>(), b.downcast_ref::<Semver>()) {
        return Ok(x.cmp(y));
    }
    Err(ExecutionError::function_error(function, "both sides must be quantities or both semvers"))
}

/// A resource quantity as CEL's `quantity` library compares it: by value, in thousandths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Quantity {
    milli: i128,
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

/// A semantic version (`MAJOR.MINOR.PATCH[-PRE][+BUILD]`), ordered by semver precedence; build
/// metadata is ignored for order and equality, as in Kubernetes' `semver` library.
#[derive(Clone, Debug)]
pub(crate) struct Semver {
    core: [u64; 3],
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
