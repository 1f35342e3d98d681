//! Kubernetes `Quantity` strings (`100m`, `1.5`, `2Gi`, `1e3`, `500M`) to exact integers,
//! rounded up the way apimachinery's `Value()` and `MilliValue()` round.
//! Parsing only; what a resource means lives in `resources`.

/// Why a quantity string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The string is not `<number><suffix>`.
    #[error("quantity {0:?} is not a number with an optional suffix")]
    Syntax(String),
    /// The suffix is not one apimachinery knows.
    #[error("quantity {0:?} has an unknown suffix")]
    Suffix(String),
    /// A resource amount below zero.
    #[error("quantity {0:?} is negative")]
    Negative(String),
    /// The value does not fit in 64 bits at the wanted scale.
    #[error("quantity {0:?} is out of range")]
    Range(String),
}

/// The value in base units (bytes, GPUs, pods), rounded up.
pub fn parse_value(s: &str) -> Result<i64, QuantityError> {
    parse_scaled(s, 0)
}

/// The value in thousandths of the base unit (millicores), rounded up.
pub fn parse_milli_value(s: &str) -> Result<i64, QuantityError> {
    parse_scaled(s, 3)
}

/// A parsed quantity: `digits * 10^exp10 * 2^exp2`.
struct Parsed {
    negative: bool,
    digits: u128,
    exp10: i32,
    exp2: u32,
}

/// The value times `10^scale`, rounded towards positive infinity.
fn parse_scaled(s: &str, scale: i32) -> Result<i64, QuantityError> {
    let p = parse(s)?;
    if p.negative && p.digits != 0 {
        return Err(QuantityError::Negative(s.to_string()));
    }
    let range = || QuantityError::Range(s.to_string());
    let mut value = p.digits.checked_mul(1u128.checked_shl(p.exp2).ok_or_else(range)?).ok_or_else(range)?;
    let exp = p.exp10.checked_add(scale).ok_or_else(range)?;
    if exp >= 0 {
        for _ in 0..exp {
            value = value.checked_mul(10).ok_or_else(range)?;
        }
    } else {
        // Dividing by more than 10^39 leaves at most a remainder, so the rounded result is 0 or 1.
        let mut rounded_up = false;
        for _ in 0..exp.unsigned_abs().min(40) {
            rounded_up |= !value.is_multiple_of(10);
            value /= 10;
        }
        if rounded_up {
            value += 1;
        }
    }
    i64::try_from(value).map_err(|_| range())
}

fn parse(s: &str) -> Result<Parsed, QuantityError> {
    let syntax = || QuantityError::Syntax(s.to_string());
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut negative = false;
    if let Some(&c) = bytes.first()
        && (c == b'+' || c == b'-')
    {
        negative = c == b'-';
        i = 1;
    }
    let mut digits: u128 = 0;
    let mut significant = 0usize;
    let mut fraction_digits: i32 = 0;
    let mut seen_digit = false;
    let mut seen_point = false;
    let mut dropped_nonzero = false;
    let mut exp10: i32 = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_digit() {
            seen_digit = true;
            let d = u128::from(c - b'0');
            if significant < 36 {
                if digits != 0 || d != 0 {
                    significant += 1;
                }
                digits = digits * 10 + d;
                if seen_point {
                    fraction_digits += 1;
                }
            } else if seen_point {
                // Beyond 36 significant digits: later fraction digits only decide the rounding.
                dropped_nonzero |= d != 0;
            } else {
                exp10 += 1;
                dropped_nonzero |= d != 0;
            }
        } else if c == b'.' && !seen_point {
            seen_point = true;
        } else {
            break;
        }
        i += 1;
    }
    if !seen_digit {
        return Err(syntax());
    }
    if dropped_nonzero {
        // Round the truncated mantissa up so the final value still rounds up.
        digits += 1;
    }
    let suffix = &s[i..];
    let (suffix_exp10, exp2) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        _ if suffix.starts_with(['e', 'E']) && suffix.len() > 1 => {
            (parse_exponent(&suffix[1..]).ok_or_else(syntax)?, 0)
        }
        _ => return Err(QuantityError::Suffix(s.to_string())),
    };
    let exp10 = exp10
        .checked_add(suffix_exp10)
        .and_then(|e| e.checked_sub(fraction_digits))
        .ok_or_else(|| QuantityError::Range(s.to_string()))?;
    Ok(Parsed { negative, digits, exp10, exp2 })
}

/// A signed decimal exponent, bounded so later arithmetic cannot overflow.
fn parse_exponent(s: &str) -> Option<i32> {
    let (negative, digits) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 4 {
        return None;
    }
    let value: i32 = digits.parse().ok()?;
    Some(if negative { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_up_like_apimachinery() {
        let cases: &[(&str, i64)] = &[
            ("0", 0),
            ("1", 1),
            ("2Gi", 2 << 30),
            ("1Ki", 1024),
            ("500M", 500_000_000),
            ("1e3", 1000),
            ("1E3", 1000),
            ("1.5", 2),
            ("1.5Ki", 1536),
            ("100m", 1),
            ("1k", 1000),
            ("+3", 3),
            ("12e-1", 2),
            (".5", 1),
            ("5.", 5),
            ("1Ei", 1 << 60),
            ("8E", 8_000_000_000_000_000_000),
            ("-0", 0),
            ("0.000000000000000000000000000000000000000000000000001", 1),
        ];
        for (input, want) in cases {
            assert_eq!(parse_value(input), Ok(*want), "value of {input}");
        }
    }

    #[test]
    fn milli_values_round_up() {
        let cases: &[(&str, i64)] = &[
            ("100m", 100),
            ("1.5", 1500),
            ("2", 2000),
            ("0.1", 100),
            ("1e-3", 1),
            ("1n", 1),
            ("1500u", 2),
            ("250m", 250),
            ("1k", 1_000_000),
            ("64", 64_000),
            ("1.0001", 1001),
        ];
        for (input, want) in cases {
            assert_eq!(parse_milli_value(input), Ok(*want), "milli value of {input}");
        }
    }

    #[test]
    fn malformed_quantities_are_errors() {
        assert_eq!(parse_value(""), Err(QuantityError::Syntax(String::new())));
        assert_eq!(parse_value("Gi"), Err(QuantityError::Syntax("Gi".into())));
        assert_eq!(parse_value("1Gb"), Err(QuantityError::Suffix("1Gb".into())));
        assert_eq!(parse_value("1 Gi"), Err(QuantityError::Suffix("1 Gi".into())));
        assert_eq!(parse_value("1e"), Err(QuantityError::Suffix("1e".into())));
        assert_eq!(parse_value("1e+"), Err(QuantityError::Syntax("1e+".into())));
        assert_eq!(parse_value("1.2.3"), Err(QuantityError::Suffix("1.2.3".into())));
        assert_eq!(parse_value("-1"), Err(QuantityError::Negative("-1".into())));
        assert_eq!(parse_value("16Ei"), Err(QuantityError::Range("16Ei".into())));
        assert_eq!(parse_value("1e99999"), Err(QuantityError::Syntax("1e99999".into())));
        assert_eq!(parse_milli_value("10E"), Err(QuantityError::Range("10E".into())));
    }

    #[test]
    fn very_long_mantissas_still_round_up() {
        let long = format!("1{}", "0".repeat(40));
        assert_eq!(parse_value(&long), Err(QuantityError::Range(long.clone())));
        let long_fraction = format!("1.{}1", "0".repeat(50));
        assert_eq!(parse_value(&long_fraction), Ok(2));
    }
}
