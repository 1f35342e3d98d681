//! The worst-case cost of a selector on any device the API allows, estimated from its syntax
//! tree before it runs: comprehensions multiply by their range, string functions by the lengths
//! they can reach, `matches` by the compile cost of its pattern.

use cel::IdedExpr;
use cel::common::ast::{EntryExpr, Expr, LiteralValue};

use super::DEVICE_VAR;
use super::limits::{MAX_ATTRIBUTES_AND_CAPACITIES, MAX_DOMAIN_BYTES, MAX_ID_BYTES, MAX_LIST_VALUES, MAX_VALUE_BYTES};
use super::regex_cost::regex_cost;

/// Cost of scanning one byte of a string (cel-go's `StringTraversalCostFactor`).
const BYTE: f64 = 0.1;
/// Lengths above this are all "too large" (keeps the arithmetic finite).
const HUGE: f64 = 1e30;

pub(super) fn clamp(x: f64) -> f64 {
    if x.is_nan() { HUGE } else { x.min(HUGE) }
}

/// What the estimator knows of a value: the most bytes (string), items (list) or entries
/// (map) it can have, and the same of what it holds. Scalars have length 0. It does not track
/// types: a shape bounds every value an expression can take.
#[derive(Clone, Debug, Default)]
pub(super) struct Shape {
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
pub(super) struct Estimator {
    /// Variables bound by comprehensions, innermost last.
    pub(super) vars: Vec<(String, Shape)>,
    /// Domains the selector names by a literal (each an extra, empty map on a device).
    pub(super) extra_domains: f64,
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

    pub(super) fn estimate(&mut self, e: &IdedExpr) -> Result<(f64, Shape), String> {
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

#[cfg(test)]
mod tests {
    use crate::devices::dra::cel::compile::{compile, estimated_cost};
    use crate::devices::dra::cel::limits::MAX_COST;
    use crate::devices::dra::cel::test_support::nested_all;

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
}
