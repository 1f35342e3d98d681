//! The guard behind the catalog's checks: a plain text scan of Rust sources, not a parser.
//!
//! A file is read once into a *masked* copy of the same length, in which comments are blanked
//! and the contents of string and char literals are blanked (their quotes kept), so that
//! parentheses and commas in the masked text are code; the literals' values are kept on the
//! side, by the offset of their opening quote. Then:
//!
//! - **keys**: every string literal that is a `muster.dev` key (`muster.dev/<name>` or
//!   `<part>.muster.dev/<name>`, no whitespace) or starts with `jobset.sigs.k8s.io/` is a
//!   [`What::Key`] (Kubernetes' own `*kubernetes.io/*` literals are not looked for: device
//!   attributes, taints and test fixtures share the form);
//! - **calls**: a literal passed whole as a known argument is what that argument is: the
//!   reason of `.event(object, warning, reason, ..)`, `root_event(key, warning, reason, ..)`,
//!   `root_event_detached(..)`, `group_event(..)` and `events.push((object, warning, reason,
//!   ..))` is an [`What::EventReason`]; the reason of `set_invalid(object, ctx, reason, ..)` is
//!   both an event reason and a condition reason ([`What::InvalidReason`]); the type and reason
//!   of `conditions::set(list, type, status, reason, ..)` and of the set logic's
//!   `conds.set(type, status, reason, ..)` are a [`What::ConditionType`] and a
//!   [`What::ConditionReason`];
//! - **reason-shaped literals** (`UpperCamel`, no spaces) where a reason is plainly being
//!   made: a struct field `reason: "X"`, a refusal `Err(("X", ..))` or `("X", format!(..))`,
//!   anything in a `let` statement whose pattern binds `reason`, and a `const *_REASON: &str`,
//!   are [`What::Reason`] (an event or a condition reason);
//! - **constant modules**: each `const` of a `mod condition { .. }` is a condition type, each
//!   of a `mod reason { .. }` (but `*_MESSAGE`) a reason, its first literal the value.
//!
//! What it does not catch: a reason or key built at run time (`format!`), passed through a
//! variable or a constant outside those shapes (the constant's own literal is caught only when
//! it is in one of them), or passed in an argument position other than those listed; commas
//! at the top level of a closure argument confuse the argument split; `#[cfg(test)]` items
//! other than a trailing `mod tests { .. }` are scanned as code (see [`strip_tests`]). Raw
//! strings are read; byte strings count as strings.

use std::path::{Path, PathBuf};

/// What a found literal is taken to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum What {
    /// A `muster.dev` (or JobSet) label, annotation, gate or finalizer key.
    Key,
    /// An event reason.
    EventReason,
    /// A reason of `Invalid` that is also published as an event.
    InvalidReason,
    /// A condition type.
    ConditionType,
    /// A condition reason.
    ConditionReason,
    /// An event or a condition reason.
    Reason,
}

/// One literal found, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// What it is taken to be.
    pub what: What,
    /// Its value.
    pub value: String,
    /// The file, relative to the workspace root.
    pub file: String,
    /// Its 1-based line.
    pub line: usize,
}

/// A source file read for scanning: masked text and literals by offset.
pub struct Scanned {
    /// Comments and literal contents blanked, same length as the source.
    pub masked: Vec<u8>,
    /// (offset of the opening quote in `masked`, value), in order.
    pub literals: Vec<(usize, String)>,
}

impl Scanned {
    fn literal_at(&self, offset: usize) -> Option<&str> {
        self.literals.binary_search_by_key(&offset, |(o, _)| *o).ok().map(|i| self.literals[i].1.as_str())
    }
}

/// Masks `text` (see the module doc).
pub fn mask(text: &str) -> Scanned {
    let b = text.as_bytes();
    let mut masked = b.to_vec();
    let mut literals = Vec::new();
    let blank = |m: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut m[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            let end = b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |p| i + p);
            blank(&mut masked, i, end);
            i = end;
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if b[j] == b'/' && b.get(j + 1) == Some(&b'*') {
                    depth += 1;
                    j += 2;
                } else if b[j] == b'*' && b.get(j + 1) == Some(&b'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut masked, i, j);
            i = j;
        } else if c == b'r' && (i == 0 || !ident(b[i - 1])) && matches!(b.get(i + 1), Some(b'"' | b'#')) {
            // A raw string r"..", r#".."#: its value runs to the quote followed by as many #.
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let start = i + 1 + hashes + 1;
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            let end =
                b[start..].windows(close.len()).position(|w| w == close.as_slice()).map_or(b.len(), |p| start + p);
            literals.push((i, text[start..end].to_string()));
            let stop = (end + close.len()).min(b.len());
            blank(&mut masked, i, stop);
            masked[i] = b'"';
            masked[stop - 1] = b'"';
            i = stop;
        } else if c == b'"' {
            let mut j = i + 1;
            let mut value = Vec::new();
            while j < b.len() && b[j] != b'"' {
                if b[j] == b'\\' && j + 1 < b.len() {
                    match b[j + 1] {
                        b'"' | b'\\' => value.push(b[j + 1]),
                        other => value.extend_from_slice(&[b'\\', other]),
                    }
                    j += 2;
                } else {
                    value.push(b[j]);
                    j += 1;
                }
            }
            literals.push((i, String::from_utf8_lossy(&value).into_owned()));
            blank(&mut masked, i + 1, j.min(b.len()));
            i = j + 1;
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}', '"') is blanked; a lifetime is left alone.
            let end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..].iter().position(|&c| c == b'\'').map(|p| i + 2 + p)
            } else {
                let len = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + len) == Some(&b'\'')).then_some(i + 1 + len)
            };
            match end {
                Some(end) => {
                    blank(&mut masked, i + 1, end);
                    i = end + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    Scanned { masked, literals }
}

/// `text` without its trailing test module: everything from a line `#[cfg(test)]` whose next
/// line opens `mod tests {` (or `mod <name> {` of a name ending in `tests`) is cut. A
/// `#[cfg(test)] mod tests;` declaration cuts nothing (the file it names is skipped by name).
pub fn strip_tests(text: &str) -> &str {
    let mut offset = 0;
    let mut lines = text.split_inclusive('\n').peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && let Some(next) = lines.peek()
        {
            let next = next.trim();
            let module = next.strip_prefix("pub ").unwrap_or(next).strip_prefix("mod ");
            if module.is_some_and(|m| m.ends_with('{') && m.trim_end_matches('{').trim().ends_with("tests")) {
                return &text[..offset];
            }
        }
        offset += line.len();
    }
    text
}

fn line_of(text: &[u8], offset: usize) -> usize {
    text[..offset].iter().filter(|&&c| c == b'\n').count() + 1
}

/// Whether `value` has the shape of a reason: `UpperCamel`, letters, digits and `_` only.
pub fn reason_shaped(value: &str) -> bool {
    value.starts_with(|c: char| c.is_ascii_uppercase()) && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// JobSet's keys, which muster writes as JobSet does: a literal under it is a key too.
pub const JOBSET_PREFIX: &str = "jobset.sigs.k8s.io/";

/// Whether `value` is a `muster.dev` key: `muster.dev/<name>` or `<a.b->.muster.dev/<name>`.
pub fn muster_key(value: &str) -> bool {
    let Some((prefix, name)) = value.split_once('/') else { return false };
    let domain = prefix == "muster.dev"
        || prefix.strip_suffix(".muster.dev").is_some_and(|p| {
            !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
        });
    domain && !value.chars().any(char::is_whitespace) && !name.starts_with('/')
}

/// The arguments of the call whose `(` is at `open` in `masked`: (start, end) of each, split at
/// top-level commas, up to the matching `)`.
fn args(masked: &[u8], open: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, open + 1);
    for (i, &c) in masked.iter().enumerate().skip(open + 1) {
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' if depth == 0 => {
                out.push((start, i));
                return out;
            }
            b')' | b']' | b'}' => depth -= 1,
            b',' if depth == 0 => {
                out.push((start, i + 1));
                start = i + 1;
            }
            _ => {}
        }
    }
    out
}

/// The literal that is the whole of `masked[from..to]` (whitespace and a trailing comma
/// aside), if one is.
fn whole_literal(s: &Scanned, from: usize, to: usize) -> Option<&str> {
    let part = std::str::from_utf8(&s.masked[from..to]).ok()?;
    let lead = part.len() - part.trim_start().len();
    let body = part.trim().trim_end_matches(',').trim_end();
    (body.len() >= 2 && body.starts_with('"') && body.ends_with('"') && !body[1..body.len() - 1].contains('"'))
        .then(|| s.literal_at(from + lead))
        .flatten()
}

/// Every offset where `pattern` starts in `masked`.
fn find_all<'a>(masked: &'a [u8], pattern: &'a str) -> impl Iterator<Item = usize> + 'a {
    let p = pattern.as_bytes();
    masked.windows(p.len()).enumerate().filter(move |(_, w)| *w == p).map(|(i, _)| i)
}

/// Scans one file's text (its test module not yet stripped). `reasons`: apply the reason
/// rules (the controllers and the core); the key rule applies everywhere.
pub fn scan(file: &str, text: &str, reasons: bool) -> Vec<Found> {
    let text = strip_tests(text);
    let s = mask(text);
    let m = &s.masked;
    let mut out = Vec::new();
    let mut push = |what: What, value: &str, offset: usize| {
        out.push(Found { what, value: value.to_string(), file: file.to_string(), line: line_of(m, offset) });
    };
    for (offset, value) in &s.literals {
        if muster_key(value) || value.starts_with(JOBSET_PREFIX) {
            push(What::Key, value, *offset);
        }
    }
    if !reasons {
        return out;
    }
    // Calls: (pattern ending in `(`, argument index, what).
    let calls: [(&str, usize, What); 10] = [
        (".event(", 2, What::EventReason),
        ("root_event(", 2, What::EventReason),
        ("root_event_detached(", 2, What::EventReason),
        ("group_event(", 2, What::EventReason),
        ("set_invalid(", 2, What::InvalidReason),
        ("conditions::set(", 1, What::ConditionType),
        ("conditions::set(", 3, What::ConditionReason),
        ("conds.set(", 0, What::ConditionType),
        ("conds.set(", 2, What::ConditionReason),
        ("events.push((", 2, What::EventReason),
    ];
    for (pattern, index, what) in calls {
        for at in find_all(m, pattern) {
            let before = &m[..at];
            if before.ends_with(b"fn ")
                || (at > 0 && !pattern.starts_with('.') && {
                    let c = m[at - 1];
                    c.is_ascii_alphanumeric() || c == b'_'
                })
            {
                continue;
            }
            let open = at + pattern.len() - 1;
            if let Some(&(from, to)) = args(m, open).get(index)
                && let Some(value) = whole_literal(&s, from, to)
            {
                push(what, value, from);
            }
        }
    }
    // Reason-shaped literals where a reason is made.
    for (offset, value) in &s.literals {
        if !reason_shaped(value) {
            continue;
        }
        let before = std::str::from_utf8(&m[..*offset]).unwrap_or_default().trim_end();
        let end = offset + 2 + value.len();
        let after = std::str::from_utf8(&m[end.min(m.len())..]).unwrap_or_default().trim_start();
        let field = before.ends_with("reason:");
        let refusal = before.ends_with("Err((")
            || (before.ends_with('(')
                && after.strip_prefix(',').is_some_and(|a| a.trim_start().starts_with("format!(")));
        let constant = before.ends_with('=') && {
            let stmt = &before[before.rfind(['\n', ';', '{']).map_or(0, |i| i + 1)..];
            stmt.contains("const ") && stmt.split(':').next().is_some_and(|n| n.trim().ends_with("_REASON"))
        };
        if field || refusal || constant {
            push(What::Reason, value, *offset);
        }
    }
    // `let` statements whose pattern binds `reason`.
    for at in find_all(m, "let ") {
        if at > 0 && (m[at - 1].is_ascii_alphanumeric() || m[at - 1] == b'_') {
            continue;
        }
        let rest = &m[at..];
        let Some(eq) = rest.windows(3).position(|w| {
            w[1] == b'=' && w[0] != b'=' && w[0] != b'!' && w[0] != b'<' && w[0] != b'>' && w[2] != b'=' && w[2] != b'>'
        }) else {
            continue;
        };
        let pattern = String::from_utf8_lossy(&rest[..eq + 1]);
        let binds = pattern.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).any(|w| w == "reason");
        if !binds || pattern.contains(';') {
            continue;
        }
        // The statement ends at the first `;` outside brackets.
        let mut depth = 0i32;
        let mut stop = m.len();
        for (i, &c) in m.iter().enumerate().skip(at + eq + 1) {
            match c {
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => depth -= 1,
                b';' if depth <= 0 => {
                    stop = i;
                    break;
                }
                _ => {}
            }
        }
        for (offset, value) in s.literals.iter().filter(|(o, _)| (at..stop).contains(o)) {
            if reason_shaped(value) {
                push(What::Reason, value, *offset);
            }
        }
    }
    // `mod condition { .. }` and `mod reason { .. }`.
    for (module, what) in [("mod condition {", What::ConditionType), ("mod reason {", What::Reason)] {
        for at in find_all(m, module) {
            let open = at + module.len() - 1;
            let Some(&(_, close)) = args(m, open).last() else { continue };
            for c in find_all(&m[open..close], "const ").map(|c| open + c) {
                let stmt_end = m[c..close].iter().position(|&b| b == b';').map_or(close, |p| c + p);
                let name = String::from_utf8_lossy(&m[c + 6..stmt_end]);
                let name = name.split(':').next().unwrap_or_default().trim().to_string();
                if name.ends_with("_MESSAGE") {
                    continue;
                }
                if let Some((offset, value)) = s.literals.iter().find(|(o, _)| (c..stmt_end).contains(o)) {
                    push(what, value, *offset);
                }
            }
        }
    }
    out.sort_by(|a, b| (a.line, a.what, &a.value).cmp(&(b.line, b.what, &b.value)));
    out.dedup();
    out
}

/// The workspace's Rust sources muster runs: `src/` and `crates/*/src/`, without test files
/// (`tests.rs`, `*_tests.rs`, anything under a `tests` folder) and without the catalog itself.
/// (relative path, text), sorted by path.
pub fn workspace_sources(root: &Path) -> Vec<(String, String)> {
    let mut dirs = vec![root.join("src")];
    if let Ok(crates) = std::fs::read_dir(root.join("crates")) {
        dirs.extend(crates.flatten().map(|e| e.path().join("src")));
    }
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for path in entries.flatten().map(|e| e.path()) {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            if path.is_dir() {
                if name != "tests" {
                    dirs.push(path);
                }
            } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
                files.push(path);
            }
        }
    }
    let catalog: PathBuf = root.join("crates/muster-api/src/catalog");
    let mut out: Vec<(String, String)> = files
        .into_iter()
        .filter(|p| !p.starts_with(&catalog) && *p != catalog.with_extension("rs"))
        .filter_map(|p| {
            let text = std::fs::read_to_string(&p).ok()?;
            let rel = p.strip_prefix(root).unwrap_or(&p).to_string_lossy().into_owned();
            Some((rel, text))
        })
        .collect();
    out.sort();
    out
}

/// Whether the reason rules apply to the file at `path`: the controllers and the core.
pub fn reason_scope(path: &str) -> bool {
    path.starts_with("src/controllers/") || path.starts_with("crates/muster-core/src/")
}
