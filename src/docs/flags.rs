//! The flag reference of a subcommand, from clap: what `muster <sub> --help` knows, as a page.

use clap::{Arg, ArgAction, CommandFactory};

use super::md;

/// One flag as the page shows it.
struct Flag {
    long: String,
    short: Option<char>,
    /// The value's name, when the flag takes a value.
    value: Option<String>,
    env: Option<String>,
    default: Vec<String>,
    /// (value, help) of each possible value, when clap knows them.
    possible: Vec<(String, String)>,
    repeatable: bool,
    required: bool,
    /// Long names of the flags it may not be given with (either way round).
    conflicts: Vec<String>,
    /// Other long names it answers to.
    aliases: Vec<String>,
    help: String,
}

/// The anchor of a flag on its page: the long name with its dashes, e.g. `--kube-api-in-flight`.
pub fn anchor(long: &str) -> String {
    format!("--{long}")
}

fn flags(sub: &str) -> Result<(String, Vec<Flag>), String> {
    let cli = crate::cli::Cli::command();
    let cmd = cli.find_subcommand(sub).ok_or_else(|| format!("muster has no subcommand {sub}"))?;
    let about = cmd.get_long_about().or(cmd.get_about()).map(|s| s.to_string()).unwrap_or_default();
    let mut out = Vec::new();
    for arg in cmd.get_arguments() {
        if arg.is_hide_set() {
            continue;
        }
        let mut f = flag(sub, arg)?;
        let mut conflicts: Vec<String> = cmd
            .get_arguments()
            .filter(|other| other.get_id() != arg.get_id())
            .filter(|other| {
                cmd.get_arg_conflicts_with(arg).iter().any(|c| c.get_id() == other.get_id())
                    || cmd.get_arg_conflicts_with(other).iter().any(|c| c.get_id() == arg.get_id())
            })
            .filter_map(|other| other.get_long().map(str::to_string))
            .collect();
        conflicts.sort();
        f.conflicts = conflicts;
        out.push(f);
    }
    Ok((about, out))
}

fn flag(sub: &str, arg: &Arg) -> Result<Flag, String> {
    let long =
        arg.get_long().ok_or_else(|| format!("muster {sub}: argument {} has no long name", arg.get_id()))?.to_string();
    let takes_value = arg.get_action().takes_values();
    let value = takes_value.then(|| {
        arg.get_value_names()
            .map(|names| names.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| arg.get_id().as_str().to_uppercase())
    });
    let possible = if takes_value {
        arg.get_possible_values()
            .iter()
            .filter(|p| !p.is_hide_set())
            .map(|p| (p.get_name().to_string(), p.get_help().map(|h| h.to_string()).unwrap_or_default()))
            .collect()
    } else {
        Vec::new()
    };
    let default = if takes_value {
        arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect()
    } else {
        Vec::new()
    };
    let help = arg.get_long_help().or(arg.get_help()).map(|h| h.to_string()).unwrap_or_default();
    if help.trim().is_empty() {
        return Err(format!("muster {sub} --{long} has no help text"));
    }
    Ok(Flag {
        long,
        short: arg.get_short(),
        value,
        // Only the variable's name: its value where the page is made is nobody's business.
        env: arg.get_env().map(|e| e.to_string_lossy().into_owned()),
        default,
        possible,
        repeatable: matches!(arg.get_action(), ArgAction::Append | ArgAction::Count),
        required: arg.is_required_set(),
        conflicts: Vec::new(),
        aliases: arg.get_visible_aliases().unwrap_or_default().into_iter().map(str::to_string).collect(),
        help,
    })
}

/// The page of `muster <sub>`'s flags, titled `title`.
pub fn page(sub: &str, title: &str) -> Result<String, String> {
    let (about, flags) = flags(sub)?;
    let mut out = String::new();
    out.push_str(&format!("# {title}\n\n"));
    out.push_str(&format!("{}: {}\n\n", md::code(&format!("muster {sub}"), false), md::text(&md::sentence(&about))));
    out.push_str(
        "Every flag is also accepted as `--flag=value`. A flag with an environment variable reads it when the \
         flag is not given; a flag given wins over its variable, and the variable over the default. This page is \
         made from the command's definition: `muster ",
    );
    out.push_str(sub);
    out.push_str(" --help` prints the same.\n\n");
    out.push_str("| Flag | Value | Default | Environment variable |\n|---|---|---|---|\n");
    for f in &flags {
        out.push_str(&format!(
            "| [{}](#{}) | {} | {} | {} |\n",
            md::code(&format!("--{}", f.long), true),
            anchor(&f.long),
            f.value.as_deref().map(|v| md::code(v, true)).unwrap_or_else(|| "(none: a switch)".into()),
            f.default.iter().map(|d| md::code(d, true)).collect::<Vec<_>>().join(", "),
            f.env.as_deref().map(|e| md::code(e, true)).unwrap_or_default(),
        ));
    }
    out.push('\n');
    for f in &flags {
        let usage = match &f.value {
            Some(v) => format!("--{} <{v}>", f.long),
            None => format!("--{}", f.long),
        };
        out.push_str(&format!("## {} {{#{}}}\n\n", md::code(&format!("--{}", f.long), false), anchor(&f.long)));
        let mut facts = vec![format!("Usage: {}", md::code(&usage, false))];
        if let Some(s) = f.short {
            facts.push(format!("Short: {}", md::code(&format!("-{s}"), false)));
        }
        if let Some(env) = &f.env {
            facts.push(format!("Environment variable: {}", md::code(env, false)));
        }
        match (&f.value, f.default.is_empty()) {
            (None, _) => facts.push("A switch: off unless given.".into()),
            (Some(_), false) => facts.push(format!(
                "Default: {}",
                f.default.iter().map(|d| md::code(d, false)).collect::<Vec<_>>().join(", ")
            )),
            (Some(_), true) => facts.push("Default: none (unset)".into()),
        }
        if f.required {
            facts.push("Required.".into());
        }
        if f.repeatable {
            facts.push("Repeatable: may be given more than once.".into());
        }
        if !f.aliases.is_empty() {
            let aliases: Vec<String> = f.aliases.iter().map(|a| md::code(&format!("--{a}"), false)).collect();
            facts.push(format!("Also: {}", aliases.join(", ")));
        }
        if !f.conflicts.is_empty() {
            let others: Vec<String> = f
                .conflicts
                .iter()
                .map(|c| format!("[{}](#{})", md::code(&format!("--{c}"), false), anchor(c)))
                .collect();
            facts.push(format!("Not with: {}", others.join(", ")));
        }
        for fact in facts {
            out.push_str(&format!("- {fact}\n"));
        }
        if !f.possible.is_empty() {
            out.push_str("- Possible values:\n");
            for (value, help) in &f.possible {
                if help.is_empty() {
                    out.push_str(&format!("  - {}\n", md::code(value, false)));
                } else {
                    out.push_str(&format!("  - {}: {}\n", md::code(value, false), md::text(&md::sentence(help))));
                }
            }
        }
        out.push('\n');
        out.push_str(&md::text(&md::sentence(&f.help)));
        out.push_str("\n\n");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section<'a>(page: &'a str, long: &str) -> &'a str {
        let head = format!("## `--{long}` {{#--{long}}}\n");
        let start = page.find(&head).unwrap_or_else(|| panic!("no section for --{long}:\n{page}"));
        let rest = &page[start + head.len()..];
        &rest[..rest.find("\n## ").unwrap_or(rest.len())]
    }

    #[test]
    fn the_run_page_lists_the_api_bound_with_its_variable_and_default() {
        let page = page("run", "muster run flags").unwrap_or_else(|e| panic!("{e}"));
        let s = section(&page, "kube-api-in-flight");
        assert!(s.contains("- Environment variable: `MUSTER_KUBE_API_IN_FLIGHT`"), "{s}");
        assert!(s.contains("- Default: `8`"), "{s}");
        assert!(s.contains("API requests muster has in flight"), "{s}");
        assert!(page.contains("| [`--kube-api-in-flight`](#--kube-api-in-flight) |"), "{page}");
        // Possible values of an enum flag, with their help.
        let s = section(&page, "scheduling-api");
        assert!(s.contains("  - `upstream`: "), "{s}");
        assert!(s.contains("- Environment variable: `MUSTER_SCHEDULING_API`"), "{s}");
        // A switch taking a value (`--leader-elect false`) shows it and its default.
        let s = section(&page, "leader-elect");
        assert!(s.contains("- Usage: `--leader-elect <LEADER_ELECT>`"), "{s}");
        assert!(s.contains("- Default: `true`"), "{s}");
    }

    #[test]
    fn every_flag_of_clap_is_on_its_page_and_no_other() {
        for sub in ["run", "node-agent"] {
            let page = page(sub, "t").unwrap_or_else(|e| panic!("{e}"));
            let cli = crate::cli::Cli::command();
            let cmd = cli.find_subcommand(sub).unwrap_or_else(|| panic!("{sub}"));
            let longs: Vec<&str> =
                cmd.get_arguments().filter(|a| !a.is_hide_set()).filter_map(|a| a.get_long()).collect();
            assert!(longs.len() > 5, "{sub}: {longs:?}");
            for long in &longs {
                section(&page, long);
            }
            assert_eq!(page.matches("\n## ").count(), longs.len(), "{sub}");
        }
    }

    #[test]
    fn the_node_agent_page_has_its_switches_and_its_environment() {
        let page = page("node-agent", "muster node-agent flags").unwrap_or_else(|e| panic!("{e}"));
        let s = section(&page, "print");
        assert!(s.contains("- A switch: off unless given."), "{s}");
        // A conflict shows on both sides.
        let s = section(&page, "probe-file");
        assert!(s.contains("- Not with: [`--query-file`](#--query-file), [`--topo-file`](#--topo-file)"), "{s}");
        let s = section(&page, "topo-file");
        assert!(s.contains("- Not with: [`--probe-file`](#--probe-file)"), "{s}");
        let s = section(&page, "node-name");
        assert!(s.contains("- Environment variable: `NODE_NAME`"), "{s}");
        assert!(s.contains("- Default: none (unset)"), "{s}");
    }
}
