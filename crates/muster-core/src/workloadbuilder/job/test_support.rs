//! What the validation tables of jobs and sets share.

use serde_json::Value;

/// Merges `from` into `into` as a JSON merge patch (RFC 7386): objects member by member, `null`
/// removes a member, anything else replaces.
pub fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                if v.is_null() {
                    a.remove(&k);
                } else {
                    merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

/// Whether the errors `got` are those a table row wants: a single bare path in `want` asks for
/// one error at that path, whatever its message; otherwise the lines must be equal.
pub fn errors_match(want: &[&str], got: &[String]) -> bool {
    if want.len() == 1 && !want[0].contains(": ") {
        got.len() == 1 && got[0].starts_with(&format!("{}: ", want[0]))
    } else {
        got == want
    }
}
