//! Markdown for mdBook: text with code spans kept, escaped so HTML eats nothing and smart
//! punctuation changes no flag name, and table cells.

/// `text` (markdown as written in doc comments: code spans in backticks) made safe for a page:
/// outside code spans `<` becomes `&lt;`, `--` is escaped (mdBook's smart punctuation would make
/// it a dash), and `{{#` cannot start an mdBook directive. An unclosed backtick is escaped.
pub fn text(s: &str) -> String {
    escape(s, false)
}

/// `s` as the text of one table cell: [`text`], a paragraph break as `<br><br>`, other line
/// breaks as spaces, and `|` escaped (also inside code spans, as GFM tables need).
pub fn cell(s: &str) -> String {
    let paragraphs: Vec<String> = s
        .trim()
        .split("\n\n")
        .map(|p| p.split('\n').map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" "))
        .filter(|p| !p.is_empty())
        .collect();
    escape(&paragraphs.join("\n\n"), true).replace("\n\n", "<br><br>")
}

/// `s` as one code span (in a table cell when `in_table`: `|` escaped), with enough backticks
/// to hold any it contains.
pub fn code(s: &str, in_table: bool) -> String {
    let longest = s.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    let pad = if s.starts_with('`') || s.ends_with('`') || s.is_empty() { " " } else { "" };
    let body = s.replace('\n', " ");
    let body = if in_table { body.replace('|', "\\|") } else { body };
    format!("{fence}{pad}{body}{pad}{fence}")
}

/// `s` ending with a full stop, as a scrape's `# HELP` line and a page have it.
pub fn sentence(s: &str) -> String {
    let s = s.trim();
    if s.is_empty() || s.ends_with(['.', '!', '?', ':']) { s.to_string() } else { format!("{s}.") }
}

fn escape(s: &str, in_table: bool) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '`' {
            let run = chars[i..].iter().take_while(|&&c| c == '`').count();
            // The closing run: the next run of exactly `run` backticks.
            let mut j = i + run;
            let mut close = None;
            while j < chars.len() {
                if chars[j] == '`' {
                    let r = chars[j..].iter().take_while(|&&c| c == '`').count();
                    if r == run {
                        close = Some(j);
                        break;
                    }
                    j += r;
                } else {
                    j += 1;
                }
            }
            match close {
                Some(j) => {
                    let inner: String = chars[i + run..j].iter().collect();
                    out.extend(std::iter::repeat_n('`', run));
                    out.push_str(&if in_table { inner.replace('|', "\\|") } else { inner });
                    out.extend(std::iter::repeat_n('`', run));
                    i = j + run;
                }
                None => {
                    for _ in 0..run {
                        out.push_str("\\`");
                    }
                    i += run;
                }
            }
            continue;
        }
        match c {
            '<' => out.push_str("&lt;"),
            '|' if in_table => out.push_str("\\|"),
            '-' if chars.get(i + 1) == Some(&'-') => {
                out.push_str("\\-");
            }
            '{' if chars.get(i + 1) == Some(&'{') => out.push_str("\\{"),
            '\\' => out.push_str("\\\\"),
            _ => out.push(c),
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_keeps_code_spans_and_escapes_what_html_or_mdbook_would_eat() {
        assert_eq!(text("pods named `<set>-<i>` or <none>"), "pods named `<set>-<i>` or &lt;none>");
        assert_eq!(text("under --driver-root"), "under \\--driver-root");
        assert_eq!(text("`--driver-root`"), "`--driver-root`");
        assert_eq!(text("a {{#include x}}"), "a \\{{#include x}}");
        assert_eq!(text("an ` alone"), "an \\` alone");
        assert_eq!(text("C:\\path"), "C:\\\\path");
    }

    #[test]
    fn cells_hold_one_line_and_escape_pipes_also_in_code() {
        assert_eq!(cell("a\nb\n\nc | d `x || y`"), "a b<br><br>c \\| d `x \\|\\| y`");
        assert_eq!(code("a|b", true), "`a\\|b`");
        assert_eq!(code("has `tick`", false), "`` has `tick` ``");
    }
}
