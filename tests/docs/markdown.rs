//! One Markdown page as the checks see it: the ids a link's `#anchor` may name, its links and
//! images, its fenced code blocks, each with the line of the page it is on. Parsed with
//! pulldown-cmark and the options mdBook 0.5.4 gives it (`mdbook-markdown`'s
//! `new_cmark_parser`: tables, footnotes, strikethrough, task lists, heading attributes, smart
//! punctuation, definition lists, GFM); a page on GitHub (README.md) without the last three
//! mdBook-only ones.

use std::collections::HashSet;
use std::path::Path;

use pulldown_cmark::{BrokenLink, CodeBlockKind, Event, LinkType, Options, Parser, Tag, TagEnd};

use crate::slug::{heading_id, numbered_id};

/// Where a page is read: in the book (mdBook) or on GitHub.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// A page of docs/src: mdBook's options, `{{#include}}` expanded.
    Book,
    /// README.md, the chart's README: GitHub renders them as they are.
    GitHub,
}

/// A link or image on a page.
#[derive(Debug, Clone)]
pub struct Link {
    pub dest: String,
    pub line: usize,
    /// An image (`![alt](src)` or `<img src>`), not a link.
    pub image: bool,
}

/// A fenced code block.
#[derive(Debug, Clone)]
pub struct Block {
    /// The info string after the fence (` ```yaml,invalid ` gives `yaml,invalid`).
    pub info: String,
    pub text: String,
    /// The line of the opening fence.
    pub line: usize,
}

/// A parsed page.
#[derive(Debug, Default)]
pub struct Page {
    /// Every id a `#anchor` may name: headings' (mdBook's rule), `{#explicit}` ones, and
    /// `id="..."` in raw HTML.
    pub ids: HashSet<String>,
    pub links: Vec<Link>,
    pub blocks: Vec<Block>,
    /// Problems found while reading it (an include that cannot be read, a reference link with
    /// no definition), as `(line, message)`.
    pub problems: Vec<(usize, String)>,
}

/// pulldown-cmark's options for `flavor`, as mdBook 0.5.4 sets them (all its defaults on).
fn options(flavor: Flavor) -> Options {
    let mut opts = Options::empty();
    opts.insert(Options::ENABLE_TABLES);
    opts.insert(Options::ENABLE_FOOTNOTES);
    opts.insert(Options::ENABLE_STRIKETHROUGH);
    opts.insert(Options::ENABLE_TASKLISTS);
    opts.insert(Options::ENABLE_HEADING_ATTRIBUTES);
    if flavor == Flavor::Book {
        opts.insert(Options::ENABLE_SMART_PUNCTUATION);
        opts.insert(Options::ENABLE_DEFINITION_LIST);
        opts.insert(Options::ENABLE_GFM);
    }
    opts
}

/// Parses `text`, the page at `path` (its folder resolves `{{#include}}` paths).
pub fn parse(path: &Path, text: &str, flavor: Flavor) -> Page {
    let mut page = Page::default();
    let (text, line_map) = match flavor {
        Flavor::Book => expand_includes(text, path.parent().unwrap_or(Path::new(".")), &mut page.problems),
        Flavor::GitHub => (text.to_string(), (1..=text.lines().count().max(1)).collect()),
    };
    let starts: Vec<usize> = std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
    // The line of the page (before includes were expanded) a byte offset is on.
    let line_of = |offset: usize| {
        let idx = starts.partition_point(|&s| s <= offset).saturating_sub(1);
        line_map.get(idx).copied().unwrap_or(idx + 1)
    };

    let mut broken = Vec::new();
    let mut used = HashSet::new();
    {
        let callback = |link: BrokenLink<'_>| {
            // `[text][label]` and `[text][]` with no `[label]: url` render as plain text: a
            // link the author meant and the reader does not get. A bare `[word]` is ordinary
            // text and is left alone.
            if matches!(link.link_type, LinkType::Reference | LinkType::Collapsed) {
                broken.push((link.span.start, link.reference.to_string()));
            }
            None
        };
        let parser = Parser::new_with_broken_link_callback(&text, options(flavor), Some(callback));
        // The text of the heading (or definition term) being read, and its `{#id}`.
        let mut heading: Option<(String, Option<String>)> = None;
        let mut image_depth = 0usize;
        let mut block: Option<Block> = None;
        for (event, range) in parser.into_offset_iter() {
            match event {
                Event::Start(Tag::Heading { id, .. }) => heading = Some((String::new(), id.map(|i| i.to_string()))),
                Event::Start(Tag::DefinitionListTitle) => heading = Some((String::new(), None)),
                Event::End(TagEnd::Heading(_) | TagEnd::DefinitionListTitle) => {
                    if let Some((content, explicit)) = heading.take() {
                        // As mdBook's `add_header_links`: an explicit id is taken as written
                        // and does not enter the set that makes generated ids unique.
                        let id = match explicit {
                            Some(id) => id,
                            None => numbered_id(&heading_id(&content), &mut used),
                        };
                        page.ids.insert(id);
                    }
                }
                Event::Start(Tag::Link { link_type, dest_url, .. }) if link_type != LinkType::Email => {
                    page.links.push(Link { dest: dest_url.to_string(), line: line_of(range.start), image: false });
                }
                Event::Start(Tag::Image { dest_url, .. }) => {
                    image_depth += 1;
                    page.links.push(Link { dest: dest_url.to_string(), line: line_of(range.start), image: true });
                }
                Event::End(TagEnd::Image) => image_depth = image_depth.saturating_sub(1),
                Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(info))) => {
                    block =
                        Some(Block { info: info.trim().to_string(), text: String::new(), line: line_of(range.start) });
                }
                Event::End(TagEnd::CodeBlock) => page.blocks.extend(block.take()),
                Event::Text(t) | Event::Code(t) => {
                    if let Some(b) = block.as_mut() {
                        b.text.push_str(&t);
                    } else if let Some((content, _)) = heading.as_mut() {
                        // An image's alt text is an attribute in mdBook's HTML, not a text node.
                        if image_depth == 0 {
                            content.push_str(&t);
                        }
                    }
                }
                Event::SoftBreak | Event::HardBreak => {
                    if let Some((content, _)) = heading.as_mut() {
                        content.push('\n');
                    }
                }
                Event::Html(html) | Event::InlineHtml(html) if block.is_none() => {
                    let line = line_of(range.start);
                    page.ids.extend(attribute_values(&html, "id"));
                    for dest in attribute_values(&html, "href") {
                        page.links.push(Link { dest, line, image: false });
                    }
                    for dest in attribute_values(&html, "src") {
                        page.links.push(Link { dest, line, image: true });
                    }
                }
                _ => {}
            }
        }
    }
    for (offset, reference) in broken {
        page.problems.push((line_of(offset), format!("reference link [{reference}] has no definition")));
    }
    page
}

/// The values of `name="..."` (or `'...'`) attributes in a piece of raw HTML.
pub fn attribute_values(html: &str, name: &str) -> Vec<String> {
    let mut out = Vec::new();
    let lower = html.to_ascii_lowercase();
    let mut from = 0;
    while let Some(pos) = lower[from..].find(name) {
        let at = from + pos;
        from = at + name.len();
        // A whole attribute name: preceded by whitespace, followed by `=` (spaces allowed).
        let before = lower[..at].chars().next_back();
        if !before.is_some_and(char::is_whitespace) {
            continue;
        }
        let rest = lower[from..].trim_start();
        let Some(rest) = rest.strip_prefix('=') else { continue };
        let rest = rest.trim_start();
        let start = lower.len() - rest.len();
        let Some(quote) = rest.chars().next().filter(|c| *c == '"' || *c == '\'') else { continue };
        if let Some(end) = html[start + 1..].find(quote) {
            out.push(html[start + 1..start + 1 + end].to_string());
            from = start + 1 + end;
        }
    }
    out
}

/// mdBook's `{{#include path}}` (also `path:N`, `path:N:M`, `path::M`, `path:N:`, and
/// `path:anchor` between `ANCHOR: anchor` and `ANCHOR_END: anchor` lines), expanded as mdBook's
/// links preprocessor does, relative to `dir` (the page's folder); `\{{#include ...}}` is left
/// as written. Returns the text and, per line of it, the line of the page it comes from (the
/// include's line for included text).
pub fn expand_includes(text: &str, dir: &Path, problems: &mut Vec<(usize, String)>) -> (String, Vec<usize>) {
    const OPEN: &str = "{{#include ";
    let mut out = String::new();
    let mut map = Vec::new();
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let n = n + 1;
        let mut expanded = String::new();
        let mut rest = line;
        while let Some(pos) = rest.find(OPEN) {
            let escaped = rest[..pos].ends_with('\\');
            let Some(end) = rest[pos..].find("}}") else { break };
            expanded.push_str(&rest[..pos]);
            let directive = &rest[pos..pos + end + 2];
            if escaped {
                expanded.push_str(directive);
            } else {
                let arg = directive[OPEN.len()..directive.len() - 2].trim();
                match include(arg, dir) {
                    Ok(content) => expanded.push_str(content.strip_suffix('\n').unwrap_or(&content)),
                    Err(e) => {
                        problems.push((n, format!("{{{{#include {arg}}}}}: {e}")));
                        expanded.push_str(directive);
                    }
                }
            }
            rest = &rest[pos + end + 2..];
        }
        expanded.push_str(rest);
        map.extend(std::iter::repeat_n(n, expanded.split_inclusive('\n').count().max(1)));
        out.push_str(&expanded);
    }
    (out, map)
}

/// The text one include names.
fn include(arg: &str, dir: &Path) -> Result<String, String> {
    let (file, selector) = match arg.split_once(':') {
        Some((f, s)) => (f, Some(s)),
        None => (arg, None),
    };
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let lines: Vec<&str> = text.lines().collect();
    let Some(selector) = selector else { return Ok(text) };
    let number = |s: &str| -> Result<Option<usize>, String> {
        if s.is_empty() { Ok(None) } else { s.parse().map(Some).map_err(|_| format!("bad line number {s:?}")) }
    };
    let selected: Vec<&str> = if selector.chars().next().is_some_and(|c| c.is_ascii_digit() || c == ':') {
        // `N` is line N alone; `N:M`, `N:`, `:M` a range (1-based, inclusive).
        let (from, to) = match selector.split_once(':') {
            Some((a, b)) => (number(a)?.unwrap_or(1), number(b)?.unwrap_or(lines.len())),
            None => {
                let n = number(selector)?.unwrap_or(1);
                (n, n)
            }
        };
        lines.iter().skip(from.saturating_sub(1)).take((to + 1).saturating_sub(from.max(1))).copied().collect()
    } else {
        let start = lines
            .iter()
            .position(|l| l.contains(&format!("ANCHOR: {selector}")))
            .ok_or_else(|| format!("no ANCHOR: {selector} in {}", path.display()))?;
        let end = lines[start..]
            .iter()
            .position(|l| l.contains(&format!("ANCHOR_END: {selector}")))
            .map(|e| start + e)
            .ok_or_else(|| format!("no ANCHOR_END: {selector} in {}", path.display()))?;
        lines[start + 1..end].iter().filter(|l| !l.contains("ANCHOR:") && !l.contains("ANCHOR_END:")).copied().collect()
    };
    Ok(selected.join("\n") + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headings_get_the_ids_mdbook_0_5_4_gives_them() {
        // Each id below is what `mdbook build` (0.5.4) wrote for this page (checked once with
        // the binary hack/mdbook.sh installs: `grep -o 'id="[^"]*"' book/intro.html`).
        let text = "# Intro\n\n## `--passes`: add more rustdoc passes\n\n## Method-call 🐙 expressions\n\n\
                    ## Upgrade\n\n## Upgrade\n\n## Upgrade {#custom-up}\n\n## Upgrade\n\n\
                    ## \"Quoted\" -- dashes... and it's\n\n\
                    ## A [link](other.md) and <code>html</code> and ![img](x.png) end\n\n\
                    ## Über 中文 CJK_title-2\n\nterm\n: definition\n\nterm\n: again\n\n## Trailing space   \n";
        let page = parse(Path::new("intro.md"), text, Flavor::Book);
        let mut ids: Vec<_> = page.ids.iter().map(String::as_str).collect();
        ids.sort();
        let mut want = vec![
            "intro",
            "--passes-add-more-rustdoc-passes",
            "method-call--expressions",
            "upgrade",
            "upgrade-1",
            "custom-up",
            "upgrade-2",
            "quoted--dashes-and-its",
            "a-link-and-html-and--end",
            "über-中文-cjk_title-2",
            "term",
            "term-1",
            "trailing-space",
        ];
        want.sort();
        assert_eq!(ids, want);
    }

    #[test]
    fn github_pages_keep_plain_punctuation() {
        // No smart punctuation on GitHub: ` -- ` stays two hyphens, each kept.
        let page = parse(Path::new("README.md"), "## A -- b\n", Flavor::GitHub);
        assert!(page.ids.contains("a----b"), "{:?}", page.ids);
    }

    #[test]
    fn links_blocks_and_html_ids_carry_their_lines() {
        let text = "# T\n\nsee [x](a.md#b)\nand <a id=\"here\"></a> <a href=\"c.md\">c</a>\n\n```yaml,invalid\nk: v\n```\n\n[ref][missing]\n";
        let page = parse(Path::new("p.md"), text, Flavor::Book);
        let links: Vec<_> = page.links.iter().map(|l| (l.dest.as_str(), l.line)).collect();
        assert_eq!(links, [("a.md#b", 3), ("c.md", 4)]);
        assert!(page.ids.contains("here"));
        assert_eq!(page.blocks.len(), 1);
        assert_eq!(
            (page.blocks[0].info.as_str(), page.blocks[0].line, page.blocks[0].text.as_str()),
            ("yaml,invalid", 6, "k: v\n")
        );
        assert_eq!(page.problems, [(10, "reference link [missing] has no definition".to_string())]);
    }

    #[test]
    fn includes_expand_and_keep_the_page_lines() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x.yaml"), "a: 1\n# ANCHOR: part\nb: 2\n# ANCHOR_END: part\nc: 3\n").unwrap();
        let mut problems = Vec::new();
        let text = "one\n{{#include x.yaml}}\n{{#include x.yaml:part}}\n{{#include x.yaml:5}}\n\\{{#include x.yaml}}\n{{#include nope.yaml}}\nlast\n";
        let (out, map) = expand_includes(text, dir.path(), &mut problems);
        assert_eq!(
            out,
            "one\na: 1\n# ANCHOR: part\nb: 2\n# ANCHOR_END: part\nc: 3\nb: 2\nc: 3\n\\{{#include x.yaml}}\n{{#include nope.yaml}}\nlast\n"
        );
        assert_eq!(map, [1, 2, 2, 2, 2, 2, 3, 4, 5, 6, 7]);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].0, 6);
        assert!(problems[0].1.contains("cannot read"), "{problems:?}");
    }
}
