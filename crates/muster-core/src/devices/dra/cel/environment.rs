//! The CEL environment selectors compile and run in: the functions and operators a selector may
//! call, the standard library with the strings extension, and the Kubernetes `quantity` and
//! `semver` functions registered for evaluation.

use std::sync::{Arc, OnceLock};

use cel::extractors::This;
use cel::objects::Opaque;
use cel::{Context, Env, ExecutionError, Value};

use super::quantity::Quantity;
use super::semver::Semver;

/// Functions and operators a selector may call: the standard ones, the string extension and
/// the Kubernetes `quantity` and `semver` libraries as far as muster implements them. Anything
/// else is refused when the selector is compiled, never evaluated to a silent false.
pub(super) const SUPPORTED_FUNCTIONS: &[&str] = &[
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

pub(super) fn env() -> Arc<Env> {
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

pub(super) fn register_functions(ctx: &mut Context) {
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
