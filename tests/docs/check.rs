//! The checks over README.md, charts/muster/README.md and every page of docs/src: links and
//! anchors, SUMMARY.md, YAML blocks. Every problem is collected (with its page and line), none
//! stops the others.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

use crate::markdown::{self, Flavor, Link, Page};
use crate::yaml::{self, Kind, Tools};

/// The book's sources, from the repository root.
pub const BOOK_SRC: &str = "docs/src";

/// What a page is, for the rules its links follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// README.md: its relative links go into docs/src (the repository's front page points at
    /// the docs, nothing else).
    Readme,
    /// charts/muster/README.md: relative links resolve to files.
    Chart,
    /// A page of the book: relative links stay inside docs/src (the book is published without
    /// the repository; repository files are named in code spans).
    Book,
}

/// Everything one run found.
#[derive(Debug, Default)]
pub struct Report {
    pub failures: Vec<String>,
    pub pages: usize,
    pub internal: usize,
    pub external: usize,
    pub blocks: BTreeMap<&'static str, usize>,
    pub objects: usize,
}

impl Report {
    pub fn summary(&self) -> String {
        let blocks: Vec<String> = Kind::ALL
            .iter()
            .map(|k| format!("{} {}", self.blocks.get(k.tag()).copied().unwrap_or(0), k.tag()))
            .collect();
        format!(
            "docs checks: {} pages; {} links checked ({} internal, {} external, not fetched); YAML blocks: {}; \
             {} MusterJob/MusterJobSet objects checked by `muster validate`; {} problems",
            self.pages,
            self.internal + self.external,
            self.internal,
            self.external,
            blocks.join(", "),
            self.objects,
            self.failures.len()
        )
    }
}

/// Checks the tree at `root` (the repository, or a test's copy of its layout).
pub fn check_tree(root: &Path, tools: &Tools) -> Report {
    let mut c = Checker { root: root.to_path_buf(), tools, ids: HashMap::new(), report: Report::default(), blocks: 0 };
    let mut pages: Vec<(PathBuf, Role)> =
        vec![(PathBuf::from("README.md"), Role::Readme), (PathBuf::from("charts/muster/README.md"), Role::Chart)];
    let mut book = Vec::new();
    if let Err(e) = markdown_files(&root.join(BOOK_SRC), &mut book) {
        c.fail(format!("{BOOK_SRC}: {e}"));
    }
    book.sort();
    pages.extend(book.iter().map(|p| (p.strip_prefix(root).unwrap_or(p).to_path_buf(), Role::Book)));

    let mut parsed = Vec::new();
    for (rel, role) in pages {
        let flavor = if role == Role::Book { Flavor::Book } else { Flavor::GitHub };
        match std::fs::read_to_string(root.join(&rel)) {
            Ok(text) => {
                let page = markdown::parse(&root.join(&rel), &text, flavor);
                c.ids.insert(normalize(&root.join(&rel)), page.ids.clone());
                parsed.push((rel, role, page));
            }
            Err(e) => c.fail(format!("{}: cannot read: {e}", rel.display())),
        }
    }
    c.report.pages = parsed.len();
    for (rel, role, page) in &parsed {
        c.check_page(rel, *role, page);
    }
    c.check_summary(&parsed);
    c.report
}

struct Checker<'a> {
    root: PathBuf,
    tools: &'a Tools,
    /// The anchors of every page read so far, by normalized absolute path.
    ids: HashMap<PathBuf, HashSet<String>>,
    report: Report,
    blocks: usize,
}

impl Checker<'_> {
    fn fail(&mut self, message: String) {
        self.report.failures.push(message);
    }

    fn book_src(&self) -> PathBuf {
        normalize(&self.root.join(BOOK_SRC))
    }

    fn check_page(&mut self, rel: &Path, role: Role, page: &Page) {
        let shown = rel.display().to_string();
        for (line, problem) in &page.problems {
            self.fail(format!("{shown}:{line}: {problem}"));
        }
        let summary = role == Role::Book && rel == Path::new(BOOK_SRC).join("SUMMARY.md");
        for link in &page.links {
            self.check_link(rel, role, summary, link);
        }
        for block in &page.blocks {
            let at = format!("{shown}:{}", block.line);
            match yaml::kind_of(&block.info) {
                None => {}
                Some(Err(e)) => self.fail(format!("{at}: {e}")),
                // In the book, an include that could not be read is reported with the page's
                // problems; the directive left in its place is not YAML to check. GitHub does
                // not expand includes at all.
                Some(Ok(_)) if block.text.contains("{{#include ") && role == Role::Book => {}
                Some(Ok(_)) if block.text.contains("{{#include ") => {
                    self.fail(format!("{at}: {{{{#include}}}} in a page GitHub renders: it is shown as written"));
                }
                Some(Ok(kind)) => {
                    *self.report.blocks.entry(kind.tag()).or_default() += 1;
                    self.blocks += 1;
                    let v =
                        yaml::check(kind, &block.text, &at, self.blocks, self.tools, &self.root.join("charts/muster"));
                    self.report.objects += v.objects;
                    self.report.failures.extend(v.failures);
                }
            }
        }
    }

    fn check_link(&mut self, rel: &Path, role: Role, summary: bool, link: &Link) {
        let at = format!("{}:{}", rel.display(), link.line);
        let what = if link.image { "image" } else { "link" };
        let dest = link.dest.trim();
        if dest.is_empty() {
            // `[Title]()` in SUMMARY.md is a draft chapter; anywhere else a link to nowhere.
            if !summary {
                self.fail(format!("{at}: {what} with an empty target"));
            }
            return;
        }
        if is_external(dest) {
            self.report.external += 1;
            let scheme = dest.split(':').next().unwrap_or("").to_ascii_lowercase();
            if !dest.starts_with("//") && !["http", "https", "mailto"].contains(&scheme.as_str()) {
                self.fail(format!("{at}: {what} {dest}: only http(s) and mailto are external links"));
            }
            return;
        }
        self.report.internal += 1;
        let (path_part, anchor) = match dest.split_once('#') {
            Some((p, a)) => (p, Some(percent_decode(a))),
            None => (dest, None),
        };
        let path_part = path_part.split('?').next().unwrap_or("");
        let page_abs = normalize(&self.root.join(rel));
        let target = if path_part.is_empty() {
            page_abs.clone()
        } else if path_part.starts_with('/') {
            self.fail(format!("{at}: {what} {dest}: an absolute path; write it relative to the page"));
            return;
        } else {
            normalize(&page_abs.parent().unwrap_or(Path::new("/")).join(percent_decode(path_part)))
        };
        let book_src = self.book_src();
        match role {
            Role::Book if !target.starts_with(&book_src) => {
                self.fail(format!(
                    "{at}: {what} {dest} leaves {BOOK_SRC} (the book is published without the repository): \
                     name a repository file in a code span instead"
                ));
                return;
            }
            Role::Readme if !target.starts_with(&book_src) && target != page_abs => {
                self.fail(format!("{at}: {what} {dest}: README.md links only into {BOOK_SRC} or to external sites"));
                return;
            }
            _ => {}
        }
        if target.is_dir() {
            self.fail(format!("{at}: {what} {dest} names a folder; link a page"));
            return;
        }
        if !target.is_file() {
            self.fail(format!("{at}: {what} {dest}: no such file ({})", self.shown(&target)));
            return;
        }
        let Some(anchor) = anchor else { return };
        if target.extension().and_then(|e| e.to_str()) != Some("md") {
            self.fail(format!("{at}: {what} {dest}: an anchor into a file that is not a Markdown page"));
            return;
        }
        let shown_target = self.shown(&target);
        let ids = self.ids_of(&target);
        if !ids.contains(&anchor) {
            // Ids that share a prefix with the anchor (a renamed or misspelt heading).
            let common = |i: &str| i.chars().zip(anchor.chars()).take_while(|(a, b)| a == b).count();
            let mut near: Vec<&String> = ids.iter().filter(|i| common(i) >= anchor.chars().count().min(5)).collect();
            near.sort();
            let hint = if near.is_empty() {
                String::new()
            } else {
                format!(
                    " (ids there like it: {})",
                    near.iter().take(5).map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                )
            };
            self.fail(format!("{at}: {what} {dest}: {shown_target} has no heading or id \"{anchor}\"{hint}"));
        }
    }

    /// The anchors of the page at `path` (normalized, absolute), read now if not yet read.
    fn ids_of(&mut self, path: &Path) -> &HashSet<String> {
        if !self.ids.contains_key(path) {
            let flavor = if path.starts_with(self.book_src()) { Flavor::Book } else { Flavor::GitHub };
            let ids = std::fs::read_to_string(path).map(|t| markdown::parse(path, &t, flavor).ids).unwrap_or_default();
            self.ids.insert(path.to_path_buf(), ids);
        }
        &self.ids[path]
    }

    fn shown(&self, path: &Path) -> String {
        path.strip_prefix(normalize(&self.root)).unwrap_or(path).display().to_string()
    }

    /// Every page of docs/src is listed in SUMMARY.md: mdBook builds only the pages it lists,
    /// so a page left out is not in the book and a link to it is broken there. (A listed page
    /// that does not exist is a broken link of SUMMARY.md, reported with the links.)
    fn check_summary(&mut self, parsed: &[(PathBuf, Role, Page)]) {
        let summary_rel = Path::new(BOOK_SRC).join("SUMMARY.md");
        let Some((_, _, summary)) = parsed.iter().find(|(rel, _, _)| *rel == summary_rel) else {
            self.fail(format!("{}: missing (mdBook's table of contents)", summary_rel.display()));
            return;
        };
        let dir = normalize(&self.root.join(BOOK_SRC));
        let listed: HashSet<PathBuf> = summary
            .links
            .iter()
            .filter(|l| !l.dest.trim().is_empty() && !is_external(&l.dest))
            .map(|l| {
                let path = l.dest.split('#').next().unwrap_or("");
                normalize(&dir.join(percent_decode(path)))
            })
            .collect();
        for (rel, role, _) in parsed {
            if *role == Role::Book && *rel != summary_rel && !listed.contains(&normalize(&self.root.join(rel))) {
                self.fail(format!(
                    "{}: not listed in {} (mdBook builds only the pages listed there)",
                    rel.display(),
                    summary_rel.display()
                ));
            }
        }
    }
}

/// A link with a scheme (`https:`, `mailto:`) or protocol-relative (`//host`).
fn is_external(dest: &str) -> bool {
    if dest.starts_with("//") {
        return true;
    }
    let scheme: String = dest.chars().take_while(|c| c.is_ascii_alphanumeric() || "+.-".contains(*c)).collect();
    !scheme.is_empty()
        && scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && dest[scheme.len()..].starts_with(':')
}

/// `%20` and friends decoded (a link's path or anchor as the browser resolves it).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Every `*.md` under `dir`, recursively.
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            markdown_files(&path, out)?;
        } else if path.extension().and_then(|e| e.to_str()) == Some("md") {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repository layout in a temporary folder: the three kinds of page, each as given.
    fn fixture(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let defaults = [
            ("README.md", "# muster\n\nSee [the docs](docs/src/introduction.md).\n"),
            ("charts/muster/README.md", "# Chart\n"),
            ("docs/src/SUMMARY.md", "# Summary\n\n[Introduction](introduction.md)\n\n- [Install](tasks/install.md)\n"),
            ("docs/src/introduction.md", "# Introduction\n\nRead [Install](tasks/install.md#upgrade).\n"),
            ("docs/src/tasks/install.md", "# Install and upgrade\n\n## Upgrade\n\n## Upgrade\n"),
        ];
        for (path, text) in defaults.iter().chain(files) {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    fn run(files: &[(&str, &str)]) -> Report {
        let dir = fixture(files);
        let tools = Tools {
            muster: PathBuf::from(env!("CARGO_BIN_EXE_muster")),
            helm: PathBuf::from("/bin/false"),
            tmp: tempfile::tempdir().unwrap(),
        };
        check_tree(dir.path(), &tools)
    }

    #[test]
    fn a_clean_tree_passes() {
        let r = run(&[]);
        assert!(r.failures.is_empty(), "{:#?}", r.failures);
        assert_eq!(r.pages, 5);
        // README 1, SUMMARY 2, introduction 1.
        assert_eq!(r.internal, 4);
    }

    #[test]
    fn broken_links_and_anchors_are_reported() {
        let r = run(&[(
            "docs/src/introduction.md",
            "# Introduction\n\n[gone](tasks/gone.md)\n[bad anchor](tasks/install.md#upgrades)\n\
             [fine](tasks/install.md#upgrade-1)\n[here](#introduction)\n[not here](#nowhere)\n\
             [out](../../examples/x.yaml)\n[web](https://example.com/x#y)\n",
        )]);
        let want = [
            "docs/src/introduction.md:3: link tasks/gone.md: no such file (docs/src/tasks/gone.md)",
            "docs/src/introduction.md:4: link tasks/install.md#upgrades: docs/src/tasks/install.md has no heading or id \"upgrades\" (ids there like it: upgrade, upgrade-1)",
            "docs/src/introduction.md:7: link #nowhere: docs/src/introduction.md has no heading or id \"nowhere\"",
            "docs/src/introduction.md:8: link ../../examples/x.yaml leaves docs/src (the book is published without the repository): name a repository file in a code span instead",
        ];
        assert_eq!(r.failures, want);
        assert_eq!(r.external, 1);
    }

    #[test]
    fn readme_links_go_into_the_book() {
        let r = run(&[
            (
                "README.md",
                "# muster\n\n[dev](DEVELOPMENT.md)\n[install](docs/src/tasks/install.md#upgrade)\n[top](#muster)\n",
            ),
            ("DEVELOPMENT.md", "# Dev\n"),
        ]);
        assert_eq!(
            r.failures,
            ["README.md:3: link DEVELOPMENT.md: README.md links only into docs/src or to external sites"]
        );
    }

    #[test]
    fn summary_must_list_every_page() {
        let r = run(&[
            ("docs/src/orphan.md", "# Orphan\n"),
            (
                "docs/src/SUMMARY.md",
                "# Summary\n\n[Introduction](introduction.md)\n\n- [Install](tasks/install.md)\n- [Draft]()\n- [Later](tasks/later.md)\n",
            ),
        ]);
        assert_eq!(
            r.failures,
            [
                "docs/src/SUMMARY.md:7: link tasks/later.md: no such file (docs/src/tasks/later.md)",
                "docs/src/orphan.md: not listed in docs/src/SUMMARY.md (mdBook builds only the pages listed there)",
            ]
        );
    }

    #[test]
    fn yaml_blocks_are_checked_with_page_and_line() {
        let page = "# Introduction\n\n```yaml,invalid\napiVersion: batch.muster.dev/v1alpha1\nkind: MusterJob\n\
                    metadata: {name: ok}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      \
                    containers: [{name: a, image: busybox}]\n```\n\n```yaml,foo\na: 1\n```\n\n\
                    ```yaml\n{{#include ../../examples/bad.yaml}}\n```\n\n```yaml,values\nx: 1\n```\n\n\
                    ```yaml,excerpt\nstatus: {phase: Running}\n```\n";
        let r = run(&[
            ("docs/src/introduction.md", page),
            (
                "examples/bad.yaml",
                "apiVersion: batch.muster.dev/v1alpha1\nkind: MusterJob\nmetadata: {name: bad}\nspec: {}\n",
            ),
        ]);
        assert_eq!(r.failures.len(), 4, "{:#?}", r.failures);
        assert!(
            r.failures[0]
                .starts_with("docs/src/introduction.md:3: ```yaml,invalid block: `muster validate` exits Some(0)"),
            "{:#?}",
            r.failures
        );
        assert!(
            r.failures[1].starts_with("docs/src/introduction.md:14: unknown YAML block tag ```yaml,foo"),
            "{:#?}",
            r.failures
        );
        assert!(
            r.failures[2].starts_with("docs/src/introduction.md:18: ```yaml block fails `muster validate`"),
            "{:#?}",
            r.failures
        );
        assert!(
            r.failures[3].starts_with("docs/src/introduction.md:22: ```yaml,values block: `helm template"),
            "{:#?}",
            r.failures
        );
        assert_eq!(r.blocks.values().sum::<usize>(), 4);
        assert_eq!(r.objects, 2);
    }

    #[test]
    fn includes_outside_the_book_are_reported() {
        let r = run(&[("charts/muster/README.md", "# Chart\n\n```yaml,values\n{{#include values.yaml}}\n```\n")]);
        assert_eq!(
            r.failures,
            ["charts/muster/README.md:3: {{#include}} in a page GitHub renders: it is shown as written"]
        );
    }

    #[test]
    fn helpers() {
        assert!(is_external("https://x"));
        assert!(is_external("mailto:a@b"));
        assert!(!is_external("a.md#b:c"));
        assert!(!is_external("../x.md"));
        assert_eq!(percent_decode("a%20b%zz"), "a b%zz");
        assert_eq!(normalize(Path::new("/r/docs/src/tasks/../x.md")), Path::new("/r/docs/src/x.md"));
    }
}
