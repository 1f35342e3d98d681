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
        if expression.len() > MAX_EXPRESSION_BYTES {
            // Refused without being kept: the text is no key of the cache.
            return compile(expression).map(Arc::new);
        }
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

/// The longest selector muster compiles, in bytes (`CELSelectorExpressionMaxLength`).
pub(crate) const MAX_EXPRESSION_BYTES: usize = 10 * 1024;
/// The most a selector may cost on one device, in the worst case (`CELSelectorExpressionMaxCost`;
/// one unit is about one node evaluated, a tenth of a unit one byte of a string scanned).
pub(crate) const MAX_COST: f64 = 1_000_000.0;
/// The deepest syntax tree muster evaluates: evaluation recurses once per level, on whatever
/// thread runs the admission cycle (2 MiB stacks, and unoptimised builds need ~35 KiB a level).
pub(crate) const MAX_DEPTH: usize = 48;
/// Stack of the thread that parses and checks one selector: the parser recurses once per
/// operator of a left-nested chain, and 10 KiB of `+1` needs ~16 MiB in an unoptimised build.
const COMPILER_STACK_BYTES: usize = 64 << 20;
/// The longest error text a selector can produce (parse errors quote the source line).
const MAX_ERROR_BYTES: usize = 1024;

/// Compiles a selector and checks that it only uses what muster evaluates and that its
/// evaluation is bounded (see the module docs). The parser and the checks run on a thread with
/// a large stack, so a deep expression is an error here, never a stack overflow.
fn compile(expression: &str) -> Result<Selector, String> {
    if expression.len() > MAX_EXPRESSION_BYTES {
        return Err(format!(
            "the expression is {} bytes long, over the limit of {MAX_EXPRESSION_BYTES} bytes",
            expression.len()
        ));
    }
    let text = expression.to_string();
    let worker = std::thread::Builder::new()
        .name("muster-cel-compile".to_string())
        .stack_size(COMPILER_STACK_BYTES)
        .spawn(move || compile_bounded(&text));
    match worker {
        Ok(handle) => {
            handle.join().unwrap_or_else(|_| Err("the CEL compiler failed (panicked) on this expression".to_string()))
        }
        Err(e) => Err(format!("cannot start the CEL compiler: {e}")),
    }
}

fn compile_bounded(expression: &str) -> Result<Selector, String> {
    let program = env().compile(expression).map_err(|e| bounded(format!("compilation failed: {e}")))?;
    let depth = depth(program.expression());
    if depth > MAX_DEPTH {
        return Err(format!(
            "the expression nests {depth} levels deep, over the limit of {MAX_DEPTH} (split long chains of operators)"
        ));
    }
    let mut check = Check::default();
    check.walk(program.expression(), &mut Vec::new());
    if let Some(why) = check.refused {
        return Err(why);
    }
    let mut estimator = Estimator { vars: Vec::new(), extra_domains: check.domains.len() as f64 };
    let (cost, _) = estimator.estimate(program.expression())?;
    // NaN (never made: every step is clamped) would be refused as well.
    if cost.is_nan() || cost > MAX_COST {
        return Err(format!(
            "too complex: its estimated worst-case cost on one device is {}, over the limit of {}",
            show_cost(cost),
            show_cost(MAX_COST)
        ));
    }
    Ok(Selector { program, domains: check.domains.into_iter().collect() })
}

/// The estimated worst-case cost of a selector on one device; Err when it is refused before
/// the cost is known (see [`compile`]).
#[cfg(test)]
pub(crate) fn estimated_cost(expression: &str) -> Result<f64, String> {
    let program = env().compile(expression).map_err(|e| bounded(format!("compilation failed: {e}")))?;
    let mut check = Check::default();
    check.walk(program.expression(), &mut Vec::new());
    let mut estimator = Estimator { vars: Vec::new(), extra_domains: check.domains.len() as f64 };
    estimator.estimate(program.expression()).map(|(cost, _)| cost)
}

fn show_cost(cost: f64) -> String {
    if cost.is_finite() && cost < 1e15 { format!("{cost:.0}") } else { format!("{cost:e}") }
}

/// `why`, cut to [`MAX_ERROR_BYTES`] on a character boundary.
fn bounded(mut why: String) -> String {
    if why.len() > MAX_ERROR_BYTES {
        let mut cut = MAX_ERROR_BYTES;
        while !why.is_char_boundary(cut) {
            cut -= 1;
        }
        why.truncate(cut);
        why.push_str("...");
    }
    why
}

/// The depth of a syntax tree (a lone node is 1).
fn depth(e: &IdedExpr) -> usize {
    let children = match &e.expr {
        Expr::Select(s) => depth(&s.operand),
        Expr::Call(c) => c.target.iter().map(|t| depth(t)).chain(c.args.iter().map(depth)).max().unwrap_or(0),
        Expr::List(l) => l.elements.iter().map(depth).max().unwrap_or(0),
        Expr::Map(m) => m.entries.iter().map(entry_depth).max().unwrap_or(0),
        Expr::Struct(s) => s.entries.iter().map(entry_depth).max().unwrap_or(0),
        Expr::Comprehension(c) => [&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result]
            .into_iter()
            .map(depth)
            .max()
            .unwrap_or(0),
        Expr::Unspecified | Expr::Literal(_) | Expr::Ident(_) => 0,
    };
    1 + children
}

fn entry_depth(entry: &cel::common::ast::IdedEntryExpr) -> usize {
    match &entry.expr {
        EntryExpr::MapEntry(m) => depth(&m.key).max(depth(&m.value)),
        EntryExpr::StructField(f) => depth(&f.value),
    }
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

// === worst-case cost ===
//
// The sizes the API allows a device (`k8s.io/api/resource/v1`), which [`CelDevice::new`]
// enforces so that the estimate holds for every device muster evaluates a selector on.

/// `ResourceSliceMaxAttributesAndCapacitiesPerDevice`.
const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// `ResourceSliceMaxAttributeValuesPerDevice`: list values, summed over a device's attributes.
const MAX_LIST_VALUES: usize = 48;
/// `DeviceAttributeMaxValueLength` is 64 characters; in bytes, at most four times that.
const MAX_VALUE_BYTES: usize = 4 * 64;
/// `DeviceMaxDomainLength`, and the driver name's `DriverNameMaxLength`.
const MAX_DOMAIN_BYTES: usize = 63;
/// `DeviceMaxIDLength`.
const MAX_ID_BYTES: usize = 32;

/// Cost of scanning one byte of a string (cel-go's `StringTraversalCostFactor`).
const BYTE: f64 = 0.1;
/// Lengths above this are all "too large" (keeps the arithmetic finite).
const HUGE: f64 = 1e30;
/// Regex compile cost of a character class (`\w`, `\pL`, `[^...]`): Unicode classes compile to
/// thousands of states (`\w` took ~260 us to compile, a literal character ~0.07 us).
const REGEX_CLASS: f64 = 4096.0;
/// Regex compile cost of `.` (any character, as UTF-8 sequences: ~5 us).
const REGEX_ANY: f64 = 64.0;
/// What each compile costs besides its pattern (~8 us for `a`).
const REGEX_BASE: f64 = 100.0;
/// Case-insensitive matching folds each character into its variants (`(?i)k` also matches the
/// Kelvin sign): measured ~35 times the states of the plain pattern.
const REGEX_FOLD: f64 = 64.0;
/// The largest counted repetition (`x{n}`) a pattern may have (RE2's, so kube-scheduler's).
const REGEX_MAX_REPEAT: u32 = 1000;

fn clamp(x: f64) -> f64 {
    if x.is_nan() { HUGE } else { x.min(HUGE) }
}

/// What the estimator knows of a value: the most bytes (string), items (list) or entries
/// (map) it can have, and the same of what it holds. Scalars have length 0. It does not track
/// types: a shape bounds every value an expression can take.
#[derive(Clone, Debug, Default)]
struct Shape {
    len: f64,
    /// A list's items.
    item: Option<Box<Shape>>,
    /// A map's keys.
    key: Option<Box<Shape>>,
    /// A map's values.
    value: Option<Box<Shape>>,
}

fn join_opt(a: &Option<Box<Shape>>, b: &Option<Box<Shape>>) -> Option<Box<Shape>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(Box::new(a.join(b))),
        (Some(x), None) | (None, Some(x)) => Some(x.clone()),
        (None, None) => None,
    }
}

fn opt_shape(s: &Option<Box<Shape>>) -> Shape {
    s.as_deref().cloned().unwrap_or_default()
}

impl Shape {
    fn string(len: f64) -> Shape {
        Shape { len: clamp(len), ..Shape::default() }
    }

    fn list(len: f64, item: Shape) -> Shape {
        Shape { len: clamp(len), item: Some(Box::new(item)), ..Shape::default() }
    }

    fn map(len: f64, key: Shape, value: Shape) -> Shape {
        Shape { len: clamp(len), key: Some(Box::new(key)), value: Some(Box::new(value)), ..Shape::default() }
    }

    fn join(&self, other: &Shape) -> Shape {
        Shape {
            len: self.len.max(other.len),
            item: join_opt(&self.item, &other.item),
            key: join_opt(&self.key, &other.key),
            value: join_opt(&self.value, &other.value),
        }
    }

    /// What a comprehension binds its variable to: a list's items or a map's keys.
    fn iterated(&self) -> Shape {
        opt_shape(&join_opt(&self.item, &self.key))
    }

    /// What `x[i]` yields: a list's items or a map's values.
    fn indexed(&self) -> Shape {
        opt_shape(&join_opt(&self.item, &self.value))
    }

    /// What `x.f` yields: a map's values.
    fn field(&self) -> Shape {
        opt_shape(&self.value)
    }

    /// The work of visiting all of it (comparing, hashing or copying it deeply).
    fn weight(&self) -> f64 {
        let per =
            [&self.item, &self.key, &self.value].iter().filter_map(|s| s.as_deref()).map(Shape::weight).sum::<f64>();
        clamp(1.0 + self.len * per.max(BYTE))
    }
}

/// An attribute value: a string or version of at most [`MAX_VALUE_BYTES`], or a list of at
/// most [`MAX_LIST_VALUES`] such values, or a scalar.
fn attribute_shape() -> Shape {
    let one = Shape::string(MAX_VALUE_BYTES as f64);
    Shape::list(MAX_VALUE_BYTES.max(MAX_LIST_VALUES) as f64, one)
}

/// `device.attributes` or `device.capacity`: at most 32 domains, plus the empty maps muster adds
/// for the domains the selector names.
fn domains_shape(extra_domains: f64, leaf: Shape) -> Shape {
    let inner = Shape::map(MAX_ATTRIBUTES_AND_CAPACITIES as f64, Shape::string(MAX_ID_BYTES as f64), leaf);
    Shape::map(MAX_ATTRIBUTES_AND_CAPACITIES as f64 + extra_domains, Shape::string(MAX_DOMAIN_BYTES as f64), inner)
}

/// A field of `device`; None for a field it does not have.
fn device_field(field: &str, extra_domains: f64) -> Option<Shape> {
    match field {
        "driver" => Some(Shape::string(MAX_DOMAIN_BYTES as f64)),
        "allowMultipleAllocations" => Some(Shape::default()),
        "attributes" => Some(domains_shape(extra_domains, attribute_shape())),
        "capacity" => Some(domains_shape(extra_domains, Shape::default())),
        _ => None,
    }
}

fn device_shape(extra_domains: f64) -> Shape {
    let fields = ["driver", "allowMultipleAllocations", "attributes", "capacity"];
    let value = fields.iter().filter_map(|f| device_field(f, extra_domains)).fold(Shape::default(), |a, b| a.join(&b));
    Shape::map(fields.len() as f64, Shape::string("allowMultipleAllocations".len() as f64), value)
}

/// Estimates the worst-case cost of evaluating a (checked) selector on any device the API
/// allows, cel-go style: one unit per node, a tenth per byte scanned, a comprehension's body
/// times the most items its range can have.
struct Estimator {
    /// Variables bound by comprehensions, innermost last.
    vars: Vec<(String, Shape)>,
    /// Domains the selector names by a literal (each an extra, empty map on a device).
    extra_domains: f64,
}

impl Estimator {
    fn var(&self, name: &str) -> Option<Shape> {
        if let Some((_, s)) = self.vars.iter().rev().find(|(n, _)| n == name) {
            return Some(s.clone());
        }
        (name == DEVICE_VAR).then(|| device_shape(self.extra_domains))
    }

    fn is_device(&self, e: &IdedExpr) -> bool {
        matches!(&e.expr, Expr::Ident(n) if n == DEVICE_VAR && !self.vars.iter().any(|(v, _)| v == n))
    }

    fn estimate(&mut self, e: &IdedExpr) -> Result<(f64, Shape), String> {
        let (cost, shape) = match &e.expr {
            Expr::Unspecified => (1.0, Shape::default()),
            Expr::Literal(LiteralValue::String(s)) => (1.0, Shape::string(s.inner().len() as f64)),
            Expr::Literal(LiteralValue::Bytes(b)) => (1.0, Shape::string(b.inner().len() as f64)),
            Expr::Literal(_) => (1.0, Shape::default()),
            Expr::Ident(name) => (1.0, self.var(name).unwrap_or_default()),
            Expr::Select(select) => {
                let (cost, operand) = self.estimate(&select.operand)?;
                let shape = if select.test {
                    Shape::default()
                } else if self.is_device(&select.operand) {
                    device_field(&select.field, self.extra_domains).unwrap_or_default()
                } else {
                    operand.field()
                };
                (cost + 1.0, shape)
            }
            Expr::List(list) => {
                let mut cost = 1.0 + list.elements.len() as f64;
                let mut item: Option<Shape> = None;
                for element in &list.elements {
                    let (c, s) = self.estimate(element)?;
                    cost += c;
                    item = Some(item.map_or(s.clone(), |i| i.join(&s)));
                }
                let len = list.elements.len() as f64;
                let shape = match item {
                    Some(item) => Shape::list(len, item),
                    None => Shape::string(0.0),
                };
                (cost, shape)
            }
            Expr::Map(map) => {
                let mut cost = 1.0;
                let (mut key, mut value) = (Shape::default(), Shape::default());
                for entry in &map.entries {
                    let EntryExpr::MapEntry(m) = &entry.expr else { continue };
                    let (ck, k) = self.estimate(&m.key)?;
                    let (cv, v) = self.estimate(&m.value)?;
                    cost += ck + cv + k.weight();
                    key = key.join(&k);
                    value = value.join(&v);
                }
                (cost, Shape::map(map.entries.len() as f64, key, value))
            }
            Expr::Struct(_) => (1.0, Shape::default()),
            Expr::Call(call) => self.call(call)?,
            Expr::Comprehension(c) => self.comprehension(c)?,
        };
        Ok((clamp(cost), shape))
    }

    fn call(&mut self, call: &cel::common::ast::CallExpr) -> Result<(f64, Shape), String> {
        let name = call.func_name.as_str();
        let mut ops = Vec::with_capacity(call.args.len() + 1);
        for e in call.target.iter().map(|t| t.as_ref()).chain(call.args.iter()) {
            ops.push(self.estimate(e)?);
        }
        let operands: f64 = ops.iter().map(|(c, _)| c).sum();
        let shape = |i: usize| ops.get(i).map(|(_, s)| s.clone()).unwrap_or_default();
        let len = |i: usize| ops.get(i).map_or(0.0, |(_, s)| s.len);
        let scalar = Shape::default;
        let (own, out) = match name {
            "_?_:_" => {
                let branches = ops.get(1).map_or(0.0, |o| o.0).max(ops.get(2).map_or(0.0, |o| o.0));
                let cond = ops.first().map_or(0.0, |o| o.0);
                return Ok((clamp(1.0 + cond + branches), shape(1).join(&shape(2))));
            }
            "_&&_" | "_||_" | "!_" | "-_" | "_-_" | "_*_" | "_/_" | "_%_" | "@not_strictly_false" => (1.0, scalar()),
            "_+_" => {
                let (a, b) = (shape(0), shape(1));
                let out = Shape {
                    len: clamp(a.len + b.len),
                    item: join_opt(&a.item, &b.item),
                    key: join_opt(&a.key, &b.key),
                    value: join_opt(&a.value, &b.value),
                };
                (1.0 + out.len, out)
            }
            "_==_" | "_!=_" | "_<_" | "_<=_" | "_>_" | "_>=_" => {
                (1.0 + shape(0).weight().min(shape(1).weight()), scalar())
            }
            "_[_]" => (1.0 + shape(1).weight(), shape(0).indexed()),
            "@in" => {
                let (needle, haystack) = (shape(0), shape(1));
                (1.0 + haystack.len * needle.weight().min(haystack.iterated().weight()), scalar())
            }
            "size" => (1.0 + BYTE * len(0), scalar()),
            "contains" | "startsWith" | "endsWith" => (1.0 + BYTE * (len(0) + len(1)), scalar()),
            "string" => {
                let out = len(0).max(32.0);
                (1.0 + BYTE * (len(0) + out), Shape::string(out))
            }
            "int" | "uint" | "double" | "bool" | "quantity" | "isQuantity" | "semver" | "isSemver" => {
                (1.0 + BYTE * len(0), scalar())
            }
            "lowerAscii" | "upperAscii" | "trim" => (1.0 + 2.0 * BYTE * len(0), Shape::string(len(0))),
            // Both collect the string into characters first.
            "substring" => (1.0 + len(0), Shape::string(len(0))),
            "charAt" => (1.0 + len(0), Shape::string(4.0)),
            // A naive search: every position times the needle.
            "indexOf" | "lastIndexOf" => (1.0 + len(0) * (1.0 + len(1)), scalar()),
            "split" => {
                // An empty separator splits into characters.
                let pieces = len(0) + 1.0;
                (1.0 + BYTE * len(0) + pieces, Shape::list(pieces, Shape::string(len(0))))
            }
            "join" => {
                let list = shape(0);
                let out = list.len * (list.iterated().len + len(1));
                (1.0 + list.len + BYTE * out, Shape::string(out))
            }
            "replace" => {
                // Each match (an empty `old` matches between all characters) becomes `new`.
                let out = len(0) + (len(0) + 1.0) * len(2);
                (1.0 + BYTE * (len(0) + len(1) + out), Shape::string(out))
            }
            "matches" => {
                let pattern = call.args.last().ok_or("matches() needs a pattern")?;
                let Expr::Literal(LiteralValue::String(p)) = &pattern.expr else {
                    return Err(
                        "matches() takes a string literal pattern here (muster must know the pattern's compile cost)"
                            .to_string(),
                    );
                };
                // The pattern is compiled on each call, then scanned over the text.
                let compiled = regex_cost(p.inner())?;
                (1.0 + compiled * (1.0 + BYTE * len(0)), scalar())
            }
            "compareTo" | "isGreaterThan" | "isLessThan" | "asInteger" | "major" | "minor" | "patch" => (1.0, scalar()),
            _ => {
                let all = ops.iter().fold(Shape::default(), |a, (_, s)| a.join(s));
                (1.0 + all.weight(), all)
            }
        };
        Ok((clamp(operands + own), out))
    }

    fn comprehension(&mut self, c: &cel::common::ast::ComprehensionExpr) -> Result<(f64, Shape), String> {
        let (range_cost, range) = self.estimate(&c.iter_range)?;
        let (init_cost, init) = self.estimate(&c.accu_init)?;
        // The macros (all, exists, exists_one, map, filter) read the accumulator once per step
        // and add to it (`@result + [x]`, `@result && p`); a step reading it twice could double
        // it on every item, which the estimate below would not bound.
        for (part, e) in [("condition", &c.loop_cond), ("step", &c.loop_step), ("result", &c.result)] {
            if accumulator_uses(e, &c.accu_var) > 1 {
                return Err(format!("comprehension {part} reads its accumulator more than once"));
            }
        }
        let n = range.len;
        let depth = self.vars.len();
        match &c.iter_var2 {
            None => self.vars.push((c.iter_var.clone(), range.iterated())),
            Some(second) => {
                self.vars.push((c.iter_var.clone(), range.iterated()));
                self.vars.push((second.clone(), range.indexed()));
            }
        }
        self.vars.push((c.accu_var.clone(), init.clone()));
        let condition = self.estimate(&c.loop_cond);
        let step = self.estimate(&c.loop_step);
        let (condition_cost, step_cost, first) = match (condition, step) {
            (Ok((cc, _)), Ok((cs, s))) => (cc, cs, s),
            (Err(e), _) | (_, Err(e)) => {
                self.vars.truncate(depth);
                return Err(e);
            }
        };
        let grows = clamp((first.len - init.len).max(0.0));
        let last = Shape {
            len: clamp(init.len + n * grows),
            item: join_opt(&init.item, &first.item),
            key: join_opt(&init.key, &first.key),
            value: join_opt(&init.value, &first.value),
        };
        if let Some((_, accu)) = self.vars.last_mut() {
            *accu = last.clone();
        }
        let result = self.estimate(&c.result);
        self.vars.truncate(depth);
        let (result_cost, out) = result?;
        // A step that adds to the accumulator may copy it whole.
        let copy = if grows > 0.0 { last.len } else { 0.0 };
        let per_item = condition_cost + step_cost + copy;
        Ok((clamp(range_cost + init_cost + n * per_item + result_cost), out))
    }
}

/// How many times one evaluation of `e` can read the variable `accu` (the larger branch of a
/// conditional; an inner comprehension that rebinds the name hides it).
fn accumulator_uses(e: &IdedExpr, accu: &str) -> usize {
    match &e.expr {
        Expr::Ident(name) => usize::from(name == accu),
        Expr::Select(s) => accumulator_uses(&s.operand, accu),
        Expr::Call(call) if call.func_name == "_?_:_" && call.args.len() == 3 => {
            accumulator_uses(&call.args[0], accu)
                + accumulator_uses(&call.args[1], accu).max(accumulator_uses(&call.args[2], accu))
        }
        Expr::Call(call) => {
            call.target.iter().map(|t| accumulator_uses(t, accu)).sum::<usize>()
                + call.args.iter().map(|a| accumulator_uses(a, accu)).sum::<usize>()
        }
        Expr::List(list) => list.elements.iter().map(|x| accumulator_uses(x, accu)).sum(),
        Expr::Map(map) => map
            .entries
            .iter()
            .map(|entry| match &entry.expr {
                EntryExpr::MapEntry(m) => accumulator_uses(&m.key, accu) + accumulator_uses(&m.value, accu),
                EntryExpr::StructField(f) => accumulator_uses(&f.value, accu),
            })
            .sum(),
        Expr::Comprehension(c) => {
            let outer = accumulator_uses(&c.iter_range, accu) + accumulator_uses(&c.accu_init, accu);
            let hidden = c.accu_var == accu || c.iter_var == accu || c.iter_var2.as_deref() == Some(accu);
            if hidden {
                outer
            } else {
                outer
                    + accumulator_uses(&c.loop_cond, accu)
                    + accumulator_uses(&c.loop_step, accu)
                    + accumulator_uses(&c.result, accu)
            }
        }
        Expr::Unspecified | Expr::Literal(_) | Expr::Struct(_) => 0,
    }
}

/// An upper bound on the work of compiling `pattern` with the `regex` crate (which `matches`
/// does on every call): its atoms, with counted repetitions unrolled as the compiler unrolls
/// them and Unicode classes at their compiled size. Err for a repetition over
/// [`REGEX_MAX_REPEAT`].
fn regex_cost(pattern: &str) -> Result<f64, String> {
    let chars: Vec<char> = pattern.chars().collect();
    // Per open group: the cost so far and the cost of the last atom (what a repetition repeats).
    let mut groups: Vec<(f64, f64)> = vec![(0.0, 0.0)];
    let mut fold = false;
    let atom = |groups: &mut Vec<(f64, f64)>, w: f64| {
        if let Some(top) = groups.last_mut() {
            top.0 = clamp(top.0 + w);
            top.1 = w;
        }
    };
    let repeat = |groups: &mut Vec<(f64, f64)>, times: f64| {
        if let Some(top) = groups.last_mut() {
            top.0 = clamp(top.0 + top.1 * (times - 1.0));
            top.1 = clamp(top.1 * times);
        }
    };
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' => {
                i += 1;
                let w = match chars.get(i) {
                    Some('p' | 'P') => {
                        if chars.get(i + 1) == Some(&'{') {
                            while i < chars.len() && chars[i] != '}' {
                                i += 1;
                            }
                        } else {
                            i += 1;
                        }
                        REGEX_CLASS
                    }
                    Some('d' | 'D' | 'w' | 'W' | 's' | 'S') => REGEX_CLASS,
                    Some('x') if chars.get(i + 1) == Some(&'{') => {
                        while i < chars.len() && chars[i] != '}' {
                            i += 1;
                        }
                        1.0
                    }
                    _ => 1.0,
                };
                atom(&mut groups, w);
            }
            '[' => {
                // To the closing bracket: a `]` first (after an optional `^`) is a literal,
                // nested brackets are POSIX or nested classes.
                let start = i;
                i += 1;
                if chars.get(i) == Some(&'^') {
                    i += 1;
                }
                if chars.get(i) == Some(&']') {
                    i += 1;
                }
                let mut nested = 0usize;
                while i < chars.len() {
                    match chars[i] {
                        '\\' => i += 1,
                        '[' => nested += 1,
                        ']' if nested == 0 => break,
                        ']' => nested -= 1,
                        _ => {}
                    }
                    i += 1;
                }
                let body = &chars[start..i.min(chars.len())];
                let simple = body.iter().skip(1).all(|c| c.is_ascii() && !matches!(c, '\\' | '[' | '^'));
                atom(&mut groups, if simple { 1.0 + body.len() as f64 } else { REGEX_CLASS });
            }
            '(' => {
                if chars.get(i + 1) == Some(&'?') {
                    // Flags: `(?i)`, `(?i:...)`, `(?P<name>...)`.
                    let flags: String =
                        chars[i + 2..].iter().take_while(|c| c.is_ascii_alphabetic() || **c == '-').collect();
                    if !flags.starts_with('P') && flags.split('-').next().is_some_and(|on| on.contains('i')) {
                        fold = true;
                    }
                }
                groups.push((0.0, 0.0));
            }
            ')' => {
                if groups.len() > 1 {
                    let (inner, _) = groups.pop().unwrap_or_default();
                    atom(&mut groups, inner);
                } else {
                    atom(&mut groups, 1.0);
                }
            }
            '|' => {
                if let Some(top) = groups.last_mut() {
                    top.1 = 0.0;
                }
            }
            '*' | '+' | '?' => repeat(&mut groups, 2.0),
            '{' => match repetition(&chars[i..]) {
                Some((most, open, span)) => {
                    if most > u64::from(REGEX_MAX_REPEAT) {
                        return Err(format!(
                            "matches() pattern repeats {most} times, over the limit of {REGEX_MAX_REPEAT}"
                        ));
                    }
                    // `x{n,}` unrolls n copies and a star.
                    let times = if open { most + 1 } else { most.max(1) };
                    repeat(&mut groups, times as f64);
                    i += span - 1;
                }
                None => atom(&mut groups, 1.0),
            },
            '.' => atom(&mut groups, REGEX_ANY),
            _ => atom(&mut groups, 1.0),
        }
        i += 1;
    }
    let mut total = 0.0;
    while let Some((inner, _)) = groups.pop() {
        total = clamp(total + inner);
    }
    Ok(clamp(REGEX_BASE + total * if fold { REGEX_FOLD } else { 1.0 }))
}

/// A counted repetition (`{n}`, `{n,}`, `{n,m}`) at the start of `chars`: its largest count,
/// whether it is open-ended, and how many characters it spans. None when `{` is a literal.
fn repetition(chars: &[char]) -> Option<(u64, bool, usize)> {
    let end = chars.iter().position(|c| *c == '}')?;
    let body: String = chars.get(1..end)?.iter().collect();
    let count = |n: &str| -> Option<u64> {
        let n = n.trim();
        // Too many digits for a u64 is still a (far too large) count.
        (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then(|| n.parse().unwrap_or(u64::MAX))
    };
    match body.split_once(',') {
        None => Some((count(&body)?, false, end + 1)),
        Some((least, most)) if most.trim().is_empty() => Some((count(least)?, true, end + 1)),
        Some((least, most)) => Some((count(most)?.max(count(least)?), false, end + 1)),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `[0, 1, ..., 9]` nested `levels` deep in `all()`: 10^levels evaluations of the body.
    fn nested_all(levels: usize) -> String {
        let ten = "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]";
        (0..levels).fold("true".to_string(), |body, k| format!("{ten}.all(x{k}, {body})"))
    }

    fn refusal(expression: &str) -> String {
        match compile(expression) {
            Ok(_) => panic!("{expression:.120}: compiled, want a refusal"),
            Err(why) => why,
        }
    }

    #[test]
    fn expensive_selectors_are_refused_before_they_run() {
        let replace = (0..12).fold("'a'".to_string(), |e, _| format!("{e}.replace('a', 'aaaa')"));
        let long = format!("device.driver == '{}'", "x".repeat(MAX_EXPRESSION_BYTES));
        let chain = format!("1{} > 0", " + 1".repeat(2500));
        let table: Vec<(&str, String, &str)> = vec![
            // Unbounded, 10^8 iterations run for ~30 s (release build): see the report.
            ("nested comprehensions multiply", format!("{} && device.driver != ''", nested_all(8)), "too complex"),
            ("string growth by replace", format!("{replace}.size() > 0"), "too complex"),
            (
                "split then nested loops over the pieces",
                "device.attributes['a'].s.split('').all(x, device.attributes['a'].s.split('').all(y, device.attributes['a'].s.split('').all(z, x + y + z != '')))".to_string(),
                "too complex",
            ),
            (
                "joined lists grow the string",
                "[1,2,3,4,5,6,7,8,9,10].map(i, device.driver).join('').split('').map(c, [1,2,3,4,5,6,7,8,9,10].map(i, c + c).join('')).join('').size() > 0".to_string(),
                "too complex",
            ),
            ("longer than 10 KiB", long, "bytes long"),
            ("a chain too deep for the evaluator's stack", chain, "levels deep"),
            ("a regex that compiles to a huge program", "device.driver.matches('(\\\\w{100}){10}')".to_string(), "too complex"),
            ("a regex repetition over 1000", "device.driver.matches('a{1001}')".to_string(), "over the limit of 1000"),
            ("nested regex repetitions", "device.driver.matches('((a{1000}){1000}){1000}')".to_string(), "too complex"),
            ("a pattern built at run time", "device.driver.matches(device.driver + '{1000}')".to_string(), "string literal pattern"),
        ];
        for (rule, expression, want) in table {
            let why = refusal(&expression);
            assert!(why.contains(want), "{rule}: {why}");
            assert!(why.len() <= MAX_ERROR_BYTES + 3, "{rule}: the error is {} bytes", why.len());
        }
    }

    #[test]
    fn ordinary_selectors_stay_far_under_the_budget() {
        let table = [
            "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'",
            "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
            "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^nvidia h100.*$')",
            "device.attributes['gpu.nvidia.com'].uuid.matches('^GPU-[0-9a-f]{8}')",
            "[2, 5].exists(i, device.attributes['gpu.nvidia.com'].index == i)",
            "device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('550.54.15'))",
            "device.attributes.exists(d, d.startsWith('gpu.') && device.attributes[d].exists(k, k == 'uuid'))",
            "['A100', 'H100', 'H200'].exists(p, device.attributes['gpu.nvidia.com'].productName.contains(p))",
            "device.attributes['gpu.nvidia.com'].productName.split(' ').filter(w, w.size() > 3).size() >= 2",
        ];
        for expression in table {
            let cost = match estimated_cost(expression) {
                Ok(c) => c,
                Err(e) => panic!("{expression}: {e}"),
            };
            assert!(cost < MAX_COST / 10.0, "{expression}: estimated {cost}");
            if let Err(e) = compile(expression) {
                panic!("{expression}: {e}");
            }
        }
    }

    #[test]
    fn the_estimate_follows_the_loops() {
        // Each level of nesting multiplies by the range: the estimate of 10^k loops grows
        // tenfold per level, and the first level over the budget is refused.
        let mut last = 0.0;
        for levels in 1..=6 {
            let cost = estimated_cost(&nested_all(levels)).unwrap_or(f64::INFINITY);
            assert!(cost >= 10.0 * last && cost >= 10f64.powi(levels as i32), "{levels} levels: {cost} after {last}");
            last = cost;
        }
        assert!(compile(&nested_all(4)).is_ok(), "10^4 loops are cheap");
        assert!(compile(&nested_all(6)).is_err(), "10^6 loops cost over 1e6");
        // map() grows its accumulator by one item per item: a map over a map of ten is a
        // list of 100 items at most, and a size() over it costs little.
        let map = "[1,2,3,4,5,6,7,8,9,10].map(a, [1,2,3,4,5,6,7,8,9,10].map(b, a * b))";
        let cost = estimated_cost(&format!("size({map}) > 0")).unwrap_or(f64::INFINITY);
        assert!(cost > 100.0 && cost < 10_000.0, "{cost}");
    }

    #[test]
    fn regex_cost_follows_the_compiled_size() {
        let cost = |p: &str| regex_cost(p).unwrap_or(f64::INFINITY);
        assert!(cost("abc") < cost("\\w"), "a class costs more than literals");
        assert!(cost("a{100}") >= 100.0 && cost("a{100}") < 300.0, "{}", cost("a{100}"));
        assert!(cost("(a{10}){10}") >= 100.0, "nested repetitions multiply: {}", cost("(a{10}){10}"));
        assert!(cost("(?i)k{10}") - REGEX_BASE > 10.0 * (cost("k{10}") - REGEX_BASE), "case folding multiplies");
        assert_eq!(cost("[a]{2}"), cost("[a][a]"), "a simple class repeated");
        assert!(cost("[^a]") >= REGEX_CLASS && cost("[\\w]") >= REGEX_CLASS && cost("\\p{Greek}") >= REGEX_CLASS);
        assert!(cost("a{2,}") > cost("a{2}"), "an open repetition adds a star");
        assert_eq!(cost("a{x}"), cost("a{x}"), "a brace that is no repetition is a literal");
        assert!(
            regex_cost("a{1001}").is_err()
                && regex_cost("a{2,1001}").is_err()
                && regex_cost("a{99999999999999999999}").is_err()
        );
    }

    #[test]
    fn the_deepest_accepted_selectors_evaluate_on_a_small_stack() {
        // Unoptimised test builds need the most stack per level: what compiles must evaluate
        // on the test thread's 2 MiB.
        let device = CelDevice::new("gpu.nvidia.com", &Device::default()).unwrap_or_else(|e| panic!("{e}"));
        let plus = format!("1{} > 0", " + 1".repeat(MAX_DEPTH - 2));
        let select = format!("device.driver{} != ''", ".lowerAscii()".repeat(MAX_DEPTH - 4));
        let nested = (0..MAX_DEPTH / 2 - 2).fold("true".to_string(), |body, k| format!("[1].all(x{k}, {body})"));
        for expression in [plus, select, nested] {
            let selector = match compile(&expression) {
                Ok(s) => s,
                Err(e) => panic!("{expression:.80}: {e}"),
            };
            assert!(depth(selector.program.expression()) >= MAX_DEPTH - 3, "{expression:.80}");
            assert_eq!(device.matches(&selector), Ok(true), "{expression:.80}");
        }
        assert!(refusal(&format!("1{} > 0", " + 1".repeat(MAX_DEPTH))).contains("levels deep"));
    }

    #[test]
    fn the_longest_chain_is_refused_without_overflowing_the_stack() {
        // 10 KiB of `+1`: the parser recurses 5000 deep (16 MiB of stack, unoptimised).
        let chain = format!("1{}", "+1".repeat((MAX_EXPRESSION_BYTES - 1) / 2));
        assert!(chain.len() <= MAX_EXPRESSION_BYTES);
        assert!(refusal(&chain).contains("levels deep"));
    }

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
