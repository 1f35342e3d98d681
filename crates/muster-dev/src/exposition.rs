//! PURE: the labelled samples of a Prometheus or OpenMetrics text exposition
//! (`name{labels} value`), as the bench tools read the API server's and muster's `/metrics`.

/// One labelled sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample<'a> {
    /// The series' name.
    pub name: &'a str,
    /// Its labels as written between the braces.
    labels: &'a str,
    /// Its value.
    pub value: f64,
}

impl<'a> Sample<'a> {
    /// The value of label `name`, when the sample has it.
    pub fn label(&self, name: &str) -> Option<&'a str> {
        self.labels.split(',').find_map(|l| l.trim().strip_prefix(name)?.strip_prefix("=\"")?.strip_suffix('"'))
    }

    /// Whether one of its labels is written exactly as `pair` (`key="value"`).
    pub fn has(&self, pair: &str) -> bool {
        self.labels.split(',').any(|l| l.trim() == pair)
    }
}

/// The samples of `text` that carry labels and a number; comments, unlabelled samples and
/// lines that do not parse are left out. (A comma inside a label's value is not supported.)
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter(|l| !l.starts_with('#')).filter_map(|line| {
        let (name, rest) = line.split_once('{')?;
        let (labels, value) = rest.split_once('}')?;
        let value = value.split_whitespace().next()?.parse().ok()?;
        Some(Sample { name, labels, value })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_and_their_labels() {
        let text = "# HELP x y\n\
                    up 1\n\
                    a_total{code=\"200\",verb=\"POST\"} 3\n\
                    a_total{code=\"409\", verb=\"PATCH\"} 2.5 1700000000\n\
                    b{k=\"v\"} not-a-number\n";
        let s: Vec<Sample> = samples(text).collect();
        assert_eq!(s.len(), 2, "the comment, the unlabelled sample and the bad value are left out");
        assert_eq!((s[0].name, s[0].value, s[0].label("verb")), ("a_total", 3.0, Some("POST")));
        assert_eq!((s[1].value, s[1].label("verb"), s[1].label("codex")), (2.5, Some("PATCH"), None));
        assert!(s[1].has("code=\"409\"") && !s[1].has("code=\"40\""));
    }
}
