//! The compile cost of a `matches` pattern: a scan of the pattern bounding the work of compiling
//! it with the `regex` crate, which refuses repetitions over RE2's limit.

use super::cost::clamp;

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

/// An upper bound on the work of compiling `pattern` with the `regex` crate (which `matches`
/// does on every call): its atoms, with counted repetitions unrolled as the compiler unrolls
/// them and Unicode classes at their compiled size. Err for a repetition over
/// [`REGEX_MAX_REPEAT`].
pub(super) fn regex_cost(pattern: &str) -> Result<f64, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
