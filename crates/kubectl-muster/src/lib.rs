//! `kubectl muster` (the binary `kubectl-muster`): `list` shows every gang with its phase, wait
//! and reason on one screen, `why` explains one, `suspend` / `resume` set a job's
//! `spec.suspend`. The logic is pure ([`gangs`], [`why`](mod@why)); this shell only reads the objects
//! (muster's kinds and, where the cluster serves them, the native `scheduling.k8s.io` ones),
//! the events, and patches jobs.

pub mod gangs;
pub mod why;

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Event as KubeEvent, Pod};
use k8s_openapi::api::scheduling::{v1alpha3, v1beta1};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use gangs::{Gang, Objects, Owner, Target};
use muster_api::{JOBSET_NAME_LABEL, MusterJob, MusterJobSet};

/// The field manager of the plugin's writes (`spec.suspend`).
const FIELD_MANAGER: &str = "kubectl-muster";

/// kubectl muster: where every gang stands, and why.
#[derive(Parser, Debug)]
#[command(name = "kubectl muster", bin_name = "kubectl muster", version, about)]
pub struct Cli {
    #[command(flatten)]
    kube: KubeArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

/// How to reach the cluster, as kubectl takes it.
#[derive(clap::Args, Debug)]
struct KubeArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true, value_name = "NAME")]
    context: Option<String>,
    /// The namespace (default: the context's, else `default`).
    #[arg(short = 'n', long, global = true, value_name = "NAME")]
    namespace: Option<String>,
    /// List the gangs of every namespace.
    #[arg(short = 'A', long, global = true)]
    all_namespaces: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// One line per gang: its job, phase, pods bound of those needed, how long it has waited,
    /// and why (the default).
    List,
    /// Why a gang is where it is: the quorum shortfall or the per-node reasons it does not fit,
    /// and its recent Warning events. NAME: a MusterJob, MusterJobSet or PodGroup (or
    /// `mjob/NAME`, `mjobset/NAME`, `mpg/NAME`).
    Why {
        /// The job, set or group.
        name: String,
    },
    /// Suspend a MusterJob or MusterJobSet (`spec.suspend: true`): its pods are deleted and
    /// none are created until it is resumed.
    Suspend {
        /// The job or set (`mjob/NAME`, `mjobset/NAME` when both exist).
        name: String,
    },
    /// Resume a suspended MusterJob or MusterJobSet (`spec.suspend: false`).
    Resume {
        /// The job or set (`mjob/NAME`, `mjobset/NAME` when both exist).
        name: String,
    },
}

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] KubeconfigError),
    /// The API server refused or could not be reached.
    #[error("{0}")]
    Kube(#[from] kube::Error),
    /// Nothing of that name.
    #[error("{0}")]
    NotFound(String),
    /// The command line asks for something the plugin does not do.
    #[error("{0}")]
    Usage(String),
}

type Result<T, E = Error> = std::result::Result<T, E>;

impl Cli {
    /// Runs the chosen subcommand; prints its output, or the error on stderr (exit code 1).
    pub fn run(self) -> ExitCode {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: tokio runtime: {e}");
                return ExitCode::from(2);
            }
        };
        match runtime.block_on(self.execute()) {
            Ok(out) => {
                print!("{out}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        }
    }

    async fn execute(self) -> Result<String> {
        let (client, namespace) = connect(&self.kube).await?;
        let scope = if self.kube.all_namespaces { None } else { Some(namespace.as_str()) };
        match self.command.unwrap_or(Command::List) {
            Command::List => list(&client, scope).await,
            Command::Why { name } => why(&client, &namespace, &name).await,
            Command::Suspend { name } => set_suspend(&client, &namespace, &name, true).await,
            Command::Resume { name } => set_suspend(&client, &namespace, &name, false).await,
        }
    }
}

/// A client and the namespace to use, from the kubeconfig as kubectl reads it.
async fn connect(args: &KubeArgs) -> Result<(Client, String)> {
    let options = KubeConfigOptions { context: args.context.clone(), ..KubeConfigOptions::default() };
    let config = match &args.kubeconfig {
        Some(path) => Config::from_custom_kubeconfig(Kubeconfig::read_from(path)?, &options).await?,
        None => match Config::from_kubeconfig(&options).await {
            Ok(config) => config,
            // No kubeconfig at all: inside a pod, its ServiceAccount.
            Err(e) if args.context.is_none() => Config::incluster().map_err(|_| e)?,
            Err(e) => return Err(e.into()),
        },
    };
    let namespace = args.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
    Ok((Client::try_from(config)?, namespace))
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Every object of a kind; none when the cluster does not serve the kind (404).
async fn list_served<K>(api: Api<K>) -> Result<Vec<K>>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// Like [`list_served`] for the native kinds, which are optional: an error reading them (no
/// RBAC for them, say) is a warning on stderr, not a failure.
async fn list_native<K>(api: Api<K>, kind: &str) -> Vec<K>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    list_served(api).await.unwrap_or_else(|e| {
        eprintln!("warning: cannot list {kind}: {e}");
        Vec::new()
    })
}

/// The objects of one namespace (or all): muster's kinds, the native ones where served, and
/// the pods that join a native PodGroup.
async fn fetch(client: &Client, namespace: Option<&str>) -> Result<Objects> {
    let (pod_groups, composites, jobs, sets, native_groups, native_composites) = futures::try_join!(
        list_served(api(client, namespace)),
        list_served(api(client, namespace)),
        list_served(api(client, namespace)),
        list_served(api(client, namespace)),
        async { Ok(list_native::<v1beta1::PodGroup>(api(client, namespace), "podgroups.scheduling.k8s.io").await) },
        async {
            Ok(list_native::<v1alpha3::CompositePodGroup>(
                api(client, namespace),
                "compositepodgroups.scheduling.k8s.io",
            )
            .await)
        },
    )?;
    let pods = if native_groups.is_empty() {
        Vec::new()
    } else {
        let joins = |p: &Pod| p.spec.as_ref().is_some_and(|s| s.scheduling_group.is_some());
        list_served::<Pod>(api(client, namespace)).await?.into_iter().filter(joins).collect()
    };
    Ok(Objects { pod_groups, composites, native_groups, native_composites, jobs, sets, pods })
}

async fn list(client: &Client, namespace: Option<&str>) -> Result<String> {
    let objects = fetch(client, namespace).await?;
    let gangs = gangs::gangs(&objects);
    let rows = gangs::rows(&objects, &gangs, Timestamp::now());
    if rows.is_empty() {
        match namespace {
            Some(ns) => eprintln!("No gangs found in {ns} namespace."),
            None => eprintln!("No gangs found."),
        }
        return Ok(String::new());
    }
    Ok(gangs::table(&rows, namespace.is_none()))
}

async fn why(client: &Client, namespace: &str, arg: &str) -> Result<String> {
    let (target, name) = Target::parse(arg).ok_or_else(|| Error::Usage(format!("{arg}: not a kind `why` knows")))?;
    let objects = fetch(client, Some(namespace)).await?;
    let gangs = gangs::gangs(&objects);
    let now = Timestamp::now();
    if let Some(gang) = gangs::find(&gangs, target, name) {
        let mut events = events(client, namespace, &names(gang)).await?;
        events.extend(pod_events(client, namespace, &native_pods(gang, &objects.pods)).await?);
        return Ok(why::explain(gang, &events, now));
    }
    let named = |m: &kube::api::ObjectMeta| m.name.as_deref() == Some(name);
    let job = objects.jobs.iter().find(|j| named(&j.metadata)).filter(|_| matches!(target, Target::Any | Target::Job));
    let set =
        objects.sets.iter().find(|s| named(&s.metadata)).filter(|_| matches!(target, Target::Any | Target::JobSet));
    let owner = match (job, set) {
        (Some(j), _) => Owner { kind: "MusterJob".into(), name: name.into(), says: gangs::job_says(j) },
        (None, Some(s)) => Owner { kind: "MusterJobSet".into(), name: name.into(), says: gangs::set_says(s) },
        (None, None) => {
            return Err(Error::NotFound(format!(
                "no MusterJob, MusterJobSet, PodGroup or CompositePodGroup named {name} in namespace {namespace}"
            )));
        }
    };
    let events = events(client, namespace, &BTreeSet::from([name.to_string()])).await?;
    Ok(why::explain_job(&owner, namespace, &events, now))
}

/// The names a gang's events are about: its groups and their jobs.
fn names(gang: &Gang) -> BTreeSet<String> {
    let mut out = BTreeSet::from([gang.name.clone()]);
    out.extend(gang.owner.as_ref().map(|o| o.name.clone()));
    for child in &gang.children {
        out.extend(names(child));
    }
    out
}

/// The Warning events about objects of these names in the namespace.
async fn events(client: &Client, namespace: &str, names: &BTreeSet<String>) -> Result<Vec<why::Event>> {
    let api: Api<KubeEvent> = Api::namespaced(client.clone(), namespace);
    let mut out = Vec::new();
    for name in names {
        let params = ListParams::default().fields(&format!("involvedObject.name={name},type=Warning"));
        out.extend(api.list(&params).await?.items.into_iter().map(event));
    }
    Ok(out)
}

/// The Warning events about these pods (kube-scheduler's `FailedScheduling`, with its per-node
/// reasons, for the pods of a native gang).
async fn pod_events(client: &Client, namespace: &str, pods: &BTreeSet<String>) -> Result<Vec<why::Event>> {
    if pods.is_empty() {
        return Ok(Vec::new());
    }
    let api: Api<KubeEvent> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().fields("involvedObject.kind=Pod,type=Warning");
    let about = |e: &KubeEvent| e.involved_object.name.as_ref().is_some_and(|n| pods.contains(n));
    Ok(api.list(&params).await?.items.into_iter().filter(about).map(event).collect())
}

fn event(e: KubeEvent) -> why::Event {
    let at = e
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
        .or(e.last_timestamp.as_ref().map(|t| t.0))
        .or(e.event_time.as_ref().map(|t| t.0))
        .or(e.first_timestamp.as_ref().map(|t| t.0))
        .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let object = &e.involved_object;
    why::Event {
        type_: e.type_.unwrap_or_default(),
        reason: e.reason.unwrap_or_default(),
        object: format!("{}/{}", object.kind.as_deref().unwrap_or("?"), object.name.as_deref().unwrap_or("?")),
        message: e.message.unwrap_or_default(),
        at,
    }
}

/// The pods that join the native PodGroups of a gang.
fn native_pods(gang: &Gang, pods: &[Pod]) -> BTreeSet<String> {
    fn groups(g: &Gang, out: &mut BTreeSet<String>) {
        if g.kind == gangs::GangKind::NativePodGroup {
            out.insert(g.name.clone());
        }
        for c in &g.children {
            groups(c, out);
        }
    }
    let mut names = BTreeSet::new();
    groups(gang, &mut names);
    let joins = |p: &&Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.scheduling_group.as_ref())
            .and_then(|g| g.pod_group_name.as_ref())
            .is_some_and(|n| names.contains(n))
    };
    pods.iter().filter(joins).map(|p| p.name_any()).collect()
}

/// Sets `spec.suspend` of the MusterJob or MusterJobSet named `arg`.
async fn set_suspend(client: &Client, namespace: &str, arg: &str, suspend: bool) -> Result<String> {
    let usage = || Error::Usage(format!("{arg}: suspend and resume take a MusterJob or a MusterJobSet"));
    let (target, name) = Target::parse(arg).ok_or_else(usage)?;
    if target == Target::Group {
        return Err(usage());
    }
    let jobs: Api<MusterJob> = Api::namespaced(client.clone(), namespace);
    let sets: Api<MusterJobSet> = Api::namespaced(client.clone(), namespace);
    let job = if target == Target::JobSet { None } else { jobs.get_opt(name).await? };
    let set = if target == Target::Job { None } else { sets.get_opt(name).await? };
    let verb = if suspend { "suspended" } else { "resumed" };
    let body = json!({"spec": {"suspend": suspend}});
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..PatchParams::default() };
    match (job, set) {
        (Some(_), Some(_)) => Err(Error::Usage(format!(
            "both a MusterJob and a MusterJobSet are named {name}: say mjob/{name} or mjobset/{name}"
        ))),
        (Some(job), None) => {
            if let Some(parent) = job.labels().get(JOBSET_NAME_LABEL) {
                return Err(Error::Usage(format!(
                    "MusterJob {name} belongs to MusterJobSet {parent}, which would undo it: `kubectl muster {} mjobset/{parent}`",
                    if suspend { "suspend" } else { "resume" }
                )));
            }
            if job.spec.suspend == suspend {
                return Ok(format!("musterjob.batch.muster.dev/{name} already {verb}\n"));
            }
            jobs.patch(name, &params, &Patch::Merge(&body)).await?;
            Ok(format!("musterjob.batch.muster.dev/{name} {verb}\n"))
        }
        (None, Some(set)) => {
            if set.spec.suspend == suspend {
                return Ok(format!("musterjobset.batch.muster.dev/{name} already {verb}\n"));
            }
            sets.patch(name, &params, &Patch::Merge(&body)).await?;
            Ok(format!("musterjobset.batch.muster.dev/{name} {verb}\n"))
        }
        (None, None) => {
            Err(Error::NotFound(format!("no MusterJob or MusterJobSet named {name} in namespace {namespace}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_reads_like_kubectls() {
        let cli = Cli::try_parse_from(["kubectl-muster"]).expect("no arguments: list");
        assert!(cli.command.is_none() && !cli.kube.all_namespaces);
        let cli = Cli::try_parse_from(["kubectl-muster", "list", "-A", "--context", "kind"]).expect("list -A");
        assert!(cli.kube.all_namespaces);
        assert_eq!(cli.kube.context.as_deref(), Some("kind"));
        let cli = Cli::try_parse_from(["kubectl-muster", "-n", "ml", "why", "too-big", "--kubeconfig", "/k"])
            .expect("flags before and after the subcommand");
        assert_eq!(cli.kube.namespace.as_deref(), Some("ml"));
        assert_eq!(cli.kube.kubeconfig.as_deref(), Some(std::path::Path::new("/k")));
        assert!(matches!(cli.command, Some(Command::Why { name }) if name == "too-big"));
        assert!(Cli::try_parse_from(["kubectl-muster", "suspend"]).is_err(), "suspend needs a name");
    }
}
