//! What a selector's syntax tree holds, read before it runs: whether it uses only the `device`
//! variable and the supported functions, how deep it nests, and which attribute and capacity
//! domains it names by a literal.

use std::collections::HashSet;

use cel::IdedExpr;
use cel::common::ast::{EntryExpr, Expr, LiteralValue};

use super::DEVICE_VAR;
use super::environment::SUPPORTED_FUNCTIONS;

/// The depth of a syntax tree (a lone node is 1).
pub(super) fn depth(e: &IdedExpr) -> usize {
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
pub(super) struct Check {
    pub(super) refused: Option<String>,
    pub(super) domains: HashSet<String>,
}

impl Check {
    fn refuse(&mut self, why: String) {
        self.refused.get_or_insert(why);
    }

    pub(super) fn walk(&mut self, e: &IdedExpr, bound: &mut Vec<String>) {
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
