//! The gang a name on the command line stands for: a `kind/name` argument parsed as kubectl
//! takes it ([`Target`]), then looked up among the gangs ([`find`]).

use super::gang::{Gang, holds};

/// The gang a name given to `why` stands for, found in `gangs` (in one namespace): the gang of
/// the MusterJob or MusterJobSet of that name, else the root group of that name, else the root
/// whose tree holds a group of that name (a MusterJobSet's child). `kind` narrows the search
/// to jobs, sets or groups.
pub fn find<'a>(gangs: &'a [Gang], kind: Target, name: &str) -> Option<&'a Gang> {
    let owned = |g: &&Gang| {
        g.owner.as_ref().is_some_and(|o| {
            o.name == name
                && match kind {
                    Target::Any => true,
                    Target::Job => o.kind == "MusterJob",
                    Target::JobSet => o.kind == "MusterJobSet",
                    Target::Group => false,
                }
        })
    };
    let by_job =
        gangs.iter().find(owned).or_else(|| gangs.iter().find(|g| g.children.iter().any(|c| holds(c, &owned))));
    if by_job.is_some() || matches!(kind, Target::Job | Target::JobSet) {
        return by_job;
    }
    gangs.iter().find(|g| g.name == name).or_else(|| gangs.iter().find(|g| holds(g, &|c: &&Gang| c.name == name)))
}

/// What a name given on the command line names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Whatever has that name: a job, a set, a group.
    Any,
    /// A MusterJob.
    Job,
    /// A MusterJobSet.
    JobSet,
    /// A PodGroup or CompositePodGroup (muster's or native).
    Group,
}

impl Target {
    /// Splits `kind/name` (`mjob/train`, `musterjobset/ray`, `mpg/kv-cache`) as kubectl takes it;
    /// a bare name is [`Target::Any`]. `None` for a kind the plugin does not know.
    pub fn parse(arg: &str) -> Option<(Target, &str)> {
        let Some((kind, name)) = arg.split_once('/') else { return Some((Target::Any, arg)) };
        let kind = kind.split('.').next().unwrap_or_default().to_ascii_lowercase();
        let target = match kind.as_str() {
            "musterjob" | "musterjobs" | "mjob" => Target::Job,
            "musterjobset" | "musterjobsets" | "mjobset" => Target::JobSet,
            "podgroup" | "podgroups" | "mpg" | "compositepodgroup" | "compositepodgroups" | "mcpg" => Target::Group,
            _ => return None,
        };
        Some((target, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_take_kubectls_kind_prefixes() {
        assert_eq!(Target::parse("train"), Some((Target::Any, "train")));
        assert_eq!(Target::parse("mjob/train"), Some((Target::Job, "train")));
        assert_eq!(Target::parse("musterjobsets.batch.muster.dev/ray"), Some((Target::JobSet, "ray")));
        assert_eq!(Target::parse("mpg/kv"), Some((Target::Group, "kv")));
        assert_eq!(Target::parse("deployment/x"), None);
    }
}
