//! Compiling a selector: the parse on a thread with a large stack, the checks and the cost bound
//! it must pass, and the cache of compiled selectors by expression text.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Selector;
use super::check::{Check, depth};
use super::cost::Estimator;
use super::environment::env;
use super::limits::{MAX_COST, MAX_DEPTH, MAX_EXPRESSION_BYTES};

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

/// Stack of the thread that parses and checks one selector: the parser recurses once per
/// operator of a left-nested chain, and 10 KiB of `+1` needs ~16 MiB in an unoptimised build.
const COMPILER_STACK_BYTES: usize = 64 << 20;
/// The longest error text a selector can produce (parse errors quote the source line).
const MAX_ERROR_BYTES: usize = 1024;

/// Compiles a selector and checks that it only uses what muster evaluates and that its
/// evaluation is bounded (see the module docs). The parser and the checks run on a thread with
/// a large stack, so a deep expression is an error here, never a stack overflow.
pub(super) fn compile(expression: &str) -> Result<Selector, String> {
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
pub(super) fn bounded(mut why: String) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::dra::cel::CelDevice;
    use crate::devices::dra::cel::test_support::{nested_all, refusal};
    use k8s_openapi::api::resource::v1::Device;

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
}
