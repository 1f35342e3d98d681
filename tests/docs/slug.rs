//! The ids mdBook 0.5.4 gives headings (the rule its HTML renderer applies, written here from
//! its documented behaviour and checked against a real build), the anchors a link may name.

use std::collections::HashSet;

/// The id mdBook makes of a heading's text: trimmed, lowercased; alphanumerics, `_` and `-`
/// kept, whitespace turned into `-`, everything else dropped.
pub fn heading_id(content: &str) -> String {
    content
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|ch| {
            if ch.is_alphanumeric() || ch == '_' || ch == '-' {
                Some(ch)
            } else if ch.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// `id`, or `id-1`, `id-2`, ... when the page already used it.
pub fn numbered_id(id: &str, used: &mut HashSet<String>) -> String {
    if used.insert(id.to_string()) {
        return id.to_string();
    }
    let mut counter: u32 = 1;
    loop {
        let candidate = format!("{id}-{counter}");
        if used.insert(candidate.clone()) {
            return candidate;
        }
        counter += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_match_mdbook() {
        // Headings and the ids mdBook 0.5.4 gives them.
        assert_eq!(heading_id("`--passes`: add more rustdoc passes"), "--passes-add-more-rustdoc-passes");
        assert_eq!(heading_id("Method-call 🐙 expressions \u{1f47c}"), "method-call--expressions-");
        assert_eq!(heading_id("_-_12345"), "_-_12345");
        assert_eq!(heading_id("12345"), "12345");
        assert_eq!(heading_id("中文"), "中文");
        assert_eq!(heading_id(""), "");
        assert_eq!(heading_id("中文標題 CJK title"), "中文標題-cjk-title");
        assert_eq!(heading_id("Über"), "über");
        // Headings of these docs.
        assert_eq!(heading_id("Install and upgrade"), "install-and-upgrade");
        assert_eq!(heading_id("muster.dev/gpu-topology: what it means"), "musterdevgpu-topology-what-it-means");
        assert_eq!(heading_id("  PodGroup (v1alpha2)  "), "podgroup-v1alpha2");
    }

    #[test]
    fn repeats_are_numbered() {
        let mut used = HashSet::new();
        assert_eq!(numbered_id("upgrade", &mut used), "upgrade");
        assert_eq!(numbered_id("upgrade", &mut used), "upgrade-1");
        assert_eq!(numbered_id("upgrade", &mut used), "upgrade-2");
        // A heading literally named "Upgrade 1" after that takes the next free one.
        assert_eq!(numbered_id("upgrade-1", &mut used), "upgrade-1-1");
    }
}
