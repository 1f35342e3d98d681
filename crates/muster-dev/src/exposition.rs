//! PURE: the samples of a Prometheus or OpenMetrics text exposition (`name{labels} value`, or
//! `name value`), as the bench tools read the API server's and muster's `/metrics`.

/// One sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample<'a> {
    /// The series' name.
    pub name: &'a str,
    /// Its labels as written between the braces (empty without).
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

/// The samples of `text` that carry a number; comments and lines that do not parse are left
/// out. An unlabelled sample has empty labels, so `has("")` holds for it. (A comma inside a
/// label's value is not supported.)
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter(|l| !l.starts_with('#')).filter_map(|line| {
        let (name, labels, value) = match line.split_once('{') {
            Some((name, rest)) => {
                let (labels, value) = rest.split_once('}')?;
                (name, labels, value)
            }
            None => {
                let (name, value) = line.split_once(' ')?;
                (name, "", value)
            }
        };
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
        assert_eq!(s.len(), 3, "the comment and the bad value are left out");
        assert_eq!((s[0].name, s[0].value, s[0].label("verb")), ("up", 1.0, None));
        assert!(s[0].has("") && !s[1].has(""), "an unlabelled sample has empty labels");
        assert_eq!((s[1].name, s[1].value, s[1].label("verb")), ("a_total", 3.0, Some("POST")));
        assert_eq!((s[2].value, s[2].label("verb"), s[2].label("codex")), (2.5, Some("PATCH"), None));
        assert!(s[2].has("code=\"409\"") && !s[2].has("code=\"40\""));
    }
}
