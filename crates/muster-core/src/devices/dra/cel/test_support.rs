//! Selectors for the tests of the bounds: nested loops, and the refusal of an expression.

use super::compile::compile;

/// `[0, 1, ..., 9]` nested `levels` deep in `all()`: 10^levels evaluations of the body.
pub(super) fn nested_all(levels: usize) -> String {
    let ten = "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]";
    (0..levels).fold("true".to_string(), |body, k| format!("{ten}.all(x{k}, {body})"))
}

pub(super) fn refusal(expression: &str) -> String {
    match compile(expression) {
        Ok(_) => panic!("{expression:.120}: compiled, want a refusal"),
        Err(why) => why,
    }
}
