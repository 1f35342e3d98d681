//! The `gpu.muster.dev/indices` annotation: how a set of GPU indices is spelled, and the one
//! parser that reads it back.

use crate::devices::gpuset::{GpuSet, MAX_GPUS};

/// Why a `gpu.muster.dev/indices` value cannot be read at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IndicesError {
    /// The value is empty or only whitespace.
    #[error("no GPU indices")]
    Empty,
    /// An element that is not a decimal number: empty (`0,,1`, `0,`), signed, or not digits.
    #[error("{0:?} is not a GPU index")]
    BadIndex(String),
    /// A number no node can have as a GPU index (64 or more).
    #[error("GPU index {0} is beyond the {MAX_GPUS} GPUs a node may have")]
    TooLarge(String),
}

/// Reads a `gpu.muster.dev/indices` value such as `0,1,4,5`: the one parser of the annotation,
/// for the ledger, admission and the tools alike.
///
/// The value names a set of GPU indices. Muster always writes the canonical spelling
/// ([`format_indices`]: ascending, comma separated, no spaces, no repeats), but a value read
/// from a live pod may have been written by hand or by another tool, and a pod must not lose
/// its claim over spelling. So, besides the canonical form, this accepts:
/// - ASCII whitespace around the value and around each element (`" 0, 1 "` is `0,1`);
/// - leading zeros (`01` is `1`);
/// - any order and repeats (`4,1,1` is `1,4`).
///
/// Refused, because nothing sure can be read from them: an empty value, an empty element
/// (`0,,1`, `0,`), anything but decimal digits in an element (`+1`, `0x1`, `a`), and indices of
/// 64 or more. Whether the node has the indices is not checked here (see
/// [`Ledger::observe`](super::Ledger::observe)).
pub fn parse_indices(value: &str) -> Result<GpuSet, IndicesError> {
    let value = value.trim_ascii();
    if value.is_empty() {
        return Err(IndicesError::Empty);
    }
    let mut set = GpuSet::EMPTY;
    for element in value.split(',') {
        let token = element.trim_ascii();
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
            return Err(IndicesError::BadIndex(element.to_string()));
        }
        let digits = token.trim_start_matches('0');
        let index = if digits.is_empty() { Some(0) } else { digits.parse::<usize>().ok() };
        set = index
            .and_then(|i| set.with(i))
            .ok_or_else(|| IndicesError::TooLarge(if digits.is_empty() { "0" } else { digits }.to_string()))?;
    }
    Ok(set)
}

/// The annotation value for `set`: ascending, comma separated (the canonical spelling).
pub fn format_indices(set: GpuSet) -> String {
    set.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::ledger::test_support::set;
    use proptest::prelude::*;

    #[test]
    fn annotation_spellings() {
        let cases: &[(&str, &str, Result<GpuSet, IndicesError>)] = &[
            ("canonical list", "0,1,4,5", Ok(set(&[0, 1, 4, 5]))),
            ("single index", "7", Ok(set(&[7]))),
            ("highest index", "63", Ok(set(&[63]))),
            ("space after a comma", "0, 1", Ok(set(&[0, 1]))),
            ("spaces and tabs everywhere", " 0 ,\t1 , 4 ", Ok(set(&[0, 1, 4]))),
            ("leading zero", "01", Ok(set(&[1]))),
            ("zero spelled long", "000", Ok(set(&[0]))),
            ("descending", "4,1", Ok(set(&[1, 4]))),
            ("repeated", "1,1", Ok(set(&[1]))),
            ("empty value", "", Err(IndicesError::Empty)),
            ("only whitespace", "  ", Err(IndicesError::Empty)),
            ("empty element", "0,,1", Err(IndicesError::BadIndex(String::new()))),
            ("trailing comma", "0,", Err(IndicesError::BadIndex(String::new()))),
            ("blank element", "0, ,1", Err(IndicesError::BadIndex(" ".into()))),
            ("sign", "+1", Err(IndicesError::BadIndex("+1".into()))),
            ("space inside a number", "1 2", Err(IndicesError::BadIndex("1 2".into()))),
            ("hex", "0x1", Err(IndicesError::BadIndex("0x1".into()))),
            ("not a number", "a", Err(IndicesError::BadIndex("a".into()))),
            ("non-ASCII digit", "\u{0661}", Err(IndicesError::BadIndex("\u{0661}".into()))),
            ("64 is beyond any node", "0,64", Err(IndicesError::TooLarge("64".into()))),
            ("overflow", "99999999999999999999999", Err(IndicesError::TooLarge("99999999999999999999999".into()))),
            ("overflow after zeros", "00070", Err(IndicesError::TooLarge("70".into()))),
        ];
        for (rule, value, want) in cases {
            assert_eq!(&parse_indices(value), want, "{rule}");
        }
        assert_eq!(format_indices(set(&[5, 0, 1, 4])), "0,1,4,5");
    }

    proptest! {
        #[test]
        fn indices_round_trip_and_never_panic(bits in 1u64.., junk in ".*") {
            let set = GpuSet::from_bits(bits);
            prop_assert_eq!(parse_indices(&format_indices(set)), Ok(set));
            let _ = parse_indices(&junk);
        }

        /// Any spelling of a set (order, repeats, whitespace, leading zeros) reads as that set.
        #[test]
        fn every_spelling_of_a_set_reads_as_the_set(
            indices in prop::collection::vec((0usize..64, 0usize..3, prop::sample::select(vec!["", " ", "\t", "  "])), 1..12),
            ordered in any::<bool>(),
        ) {
            let mut indices = indices;
            if ordered {
                indices.sort();
            }
            let want = GpuSet::from_indices(indices.iter().map(|(i, _, _)| *i));
            let value: Vec<String> = indices.iter().map(|(i, zeros, pad)| format!("{pad}{}{i}{pad}", "0".repeat(*zeros))).collect();
            prop_assert_eq!(parse_indices(&value.join(",")).ok(), want);
        }
    }
}
