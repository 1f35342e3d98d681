//! `muster run`: the controller manager against the cluster of `--kubeconfig`/`$KUBECONFIG`
//! or, inside a pod, its service account.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::controllers::{self, Config, ManagerOptions, PlacementStrategy};
use crate::webhook::certs::Lifetimes;
use crate::webhook::config::Endpoint;
use crate::webhook::{CertSource, WebhookOptions};
use crate::workloadbuilder::native::SchedulingApi;

/// Log output format.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Arguments of `muster run`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, or the in-cluster service account).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Log level filter (tracing EnvFilter syntax, e.g. `info,muster=debug`).
    #[arg(long, env = "MUSTER_LOG", default_value = "info")]
    log_level: String,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Address serving /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_bind_address: SocketAddr,
    /// Serve /metrics over HTTPS on this address instead, to scrapers whose bearer token a
    /// TokenReview authenticates and a SubjectAccessReview allows `get` on the non-resource URL
    /// /metrics (the plain address then serves /healthz and /readyz only).
    #[arg(long)]
    metrics_secure_bind_address: Option<SocketAddr>,
    /// tls.crt and tls.key of the HTTPS metrics endpoint (default: a self-signed certificate
    /// made at start).
    #[arg(long, requires = "metrics_secure_bind_address")]
    metrics_cert_dir: Option<PathBuf>,
    /// Run the reconcilers only on the replica holding the Lease.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Seconds the leader's Lease lasts unrenewed: the longest a failover waits.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..))]
    leader_elect_lease_duration: u64,
    /// Seconds before its Lease expires that the leader renews it (less than the duration).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    leader_elect_renew_grace: u64,
    /// muster's own namespace (Lease, certificate Secret).
    #[arg(long, env = "POD_NAMESPACE", default_value = "muster-system")]
    namespace: String,
    /// This replica's identity (pod name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Seconds a committed pod may stay unbound: then a gang not yet started whole is rolled back
    /// (its pods recreated gated), and a gang that had started whole fails with BindTimeout.
    #[arg(long, default_value_t = 60)]
    bind_timeout: u64,
    /// GPUs hotter than this (Celsius) are not offered.
    #[arg(long, default_value_t = 80.0)]
    gpu_max_temperature: f64,
    /// GPUs with less free memory than this fraction of the total are not offered.
    #[arg(long, default_value_t = 0.3)]
    gpu_min_free_memory: f64,
    /// Prometheus that scrapes NVIDIA DCGM exporter, for GPU health (off when unset).
    #[arg(long)]
    prometheus_url: Option<String>,
    /// Seconds GPU metrics are cached.
    #[arg(long, default_value_t = 10)]
    gpu_metrics_ttl: u64,
    /// How admission places pods among nodes that fit.
    #[arg(long, value_enum, default_value = "bin-pack")]
    placement_strategy: PlacementStrategy,
    /// Multi-GPU pods must get GPUs of one NUMA node.
    #[arg(long, default_value_t = false)]
    require_single_numa: bool,
    /// Address of the admission webhook server (`off` disables it).
    #[arg(long, default_value = "0.0.0.0:9443")]
    webhook_bind_address: String,
    /// Reach the webhooks at this URL (muster outside the cluster, e.g. `https://127.0.0.1:9443`)
    /// instead of through the Service.
    #[arg(long)]
    webhook_url: Option<String>,
    /// The Service in front of the webhook server (inside the cluster).
    #[arg(long, default_value = "muster-webhook")]
    webhook_service: String,
    /// Port of that Service.
    #[arg(long, default_value_t = 443)]
    webhook_service_port: i32,
    /// Read tls.crt/tls.key (and ca.crt) from this folder (e.g. cert-manager) instead of
    /// managing a certificate in a Secret.
    #[arg(long)]
    webhook_cert_dir: Option<PathBuf>,
    /// Secret holding the self-managed webhook certificate.
    #[arg(long, default_value = "muster-webhook-tls")]
    webhook_secret: String,
    /// Seconds a self-managed serving certificate is valid.
    #[arg(long, default_value_t = 365 * 24 * 3600)]
    webhook_cert_validity: u64,
    /// Renew the serving certificate this many seconds before it expires.
    #[arg(long, default_value_t = 30 * 24 * 3600)]
    webhook_cert_rotate_before: u64,
    /// Seconds between certificate checks.
    #[arg(long, default_value_t = 60)]
    webhook_resync: u64,
    /// Create and update the webhook configurations (when no chart installed them).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    webhook_manage_configurations: bool,
    /// Apply muster's CRDs (server-side apply) at start, so an upgrade brings the new schema
    /// (Helm never upgrades a chart's crds/).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    install_crds: bool,
    /// DeviceClass of the GPUs claimed by a MusterJob with `spec.gpuClaims` that names none.
    #[arg(long, env = "MUSTER_DRA_GPU_DEVICE_CLASS", default_value = crate::controllers::context::DEFAULT_DRA_GPU_DEVICE_CLASS, value_parser = device_class)]
    dra_gpu_device_class: String,
    /// The scheduling API new MusterJobs compile to: `muster` (muster's PodGroups, admitted
    /// by muster with GPU-topology-aware placement), `upstream` (the native scheduling.k8s.io
    /// Workload and PodGroup, admitted by kube-scheduler's GangScheduling), or `auto` (upstream
    /// where the API server serves the native kinds, else muster). A job keeps the API it was
    /// first synced with; a job may choose its own with the annotation
    /// `batch.muster.dev/scheduling-api` at creation.
    #[arg(long, value_enum, env = "MUSTER_SCHEDULING_API", default_value = "muster")]
    scheduling_api: SchedulingApiFlag,
    /// The most pods one MusterJob or MusterJobSet may plan (parallelism, completions, and a
    /// set's replicas × parallelism summed), at most 100000 (batch/v1's bound on an Indexed
    /// Job). The webhook refuses a job over it; one that got past the webhook is Invalid and
    /// makes no pods.
    #[arg(long, default_value_t = crate::workloadbuilder::job::MAX_JOB_PODS,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::workloadbuilder::job::MAX_JOB_PODS)))]
    max_job_pods: u32,
    /// The most API requests muster has in flight at once, watches aside (0: no bound), of them
    /// at most a quarter events and job statuses. The rest wait their turn in muster, so a burst
    /// of gangs does not queue every other client of the API server behind muster's requests.
    #[arg(long, env = "MUSTER_KUBE_API_IN_FLIGHT", default_value_t = DEFAULT_API_IN_FLIGHT)]
    kube_api_in_flight: usize,
}

/// `--kube-api-in-flight`'s default: enough for admission's commits and the job reconcilers to
/// keep the API server busy (it is CPU-bound in a burst: more in flight only queues other
/// clients behind muster), with a quarter of them for events and job statuses. At 5,000 nodes
/// muster's pace was the same at 8 as at 12 on two days, and an ordinary user's requests
/// waited less (docs/src/operations/sizing.md).
pub const DEFAULT_API_IN_FLIGHT: usize = 8;

/// `--scheduling-api`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SchedulingApiFlag {
    /// Upstream where the native kinds are served, else muster.
    Auto,
    /// muster's own API.
    Muster,
    /// The native scheduling.k8s.io API.
    Upstream,
}

impl SchedulingApiFlag {
    /// The API asked for (`None`: auto).
    pub fn requested(self) -> Option<SchedulingApi> {
        match self {
            SchedulingApiFlag::Auto => None,
            SchedulingApiFlag::Muster => Some(SchedulingApi::Muster),
            SchedulingApiFlag::Upstream => Some(SchedulingApi::Upstream),
        }
    }
}

fn device_class(s: &str) -> Result<String, String> {
    match crate::workloadbuilder::field::dns_subdomain_errors(s).first() {
        None => Ok(s.to_string()),
        Some(e) => Err(format!("must be a DeviceClass name (a DNS subdomain): {e}")),
    }
}

pub(super) fn init_tracing(level: &str, format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_new(level).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The client, and one that does not retry a 429 (evictions: a PodDisruptionBudget's refusal
/// is an answer, not a transient failure; the default client would retry it for minutes). Both
/// share one bound of `in_flight` requests at once (none when 0). Every request names muster as
/// its agent, and every write asks for no field validation ([`super::request_defaults`]).
async fn client(kubeconfig: Option<&PathBuf>, in_flight: usize) -> anyhow::Result<(Client, Client)> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    let mut no_retry = config.clone();
    no_retry.default_retry = false;
    let limit = (in_flight > 0).then(|| super::api_limit::InFlightLimit::new(in_flight));
    let client = |config| super::request_defaults::client(config, "controller", limit.clone());
    Ok((client(config)?, client(no_retry)?))
}

impl Args {
    fn webhook(&self) -> anyhow::Result<Option<WebhookOptions>> {
        if self.webhook_bind_address == "off" {
            return Ok(None);
        }
        let bind: SocketAddr = self
            .webhook_bind_address
            .parse()
            .with_context(|| format!("--webhook-bind-address {:?}", self.webhook_bind_address))?;
        let endpoint = match &self.webhook_url {
            Some(url) => Endpoint::Url(url.clone()),
            None => Endpoint::Service {
                namespace: self.namespace.clone(),
                name: self.webhook_service.clone(),
                port: self.webhook_service_port,
            },
        };
        let certs = match &self.webhook_cert_dir {
            Some(dir) => CertSource::Files(dir.clone()),
            None => {
                let lifetimes = Lifetimes {
                    cert_validity: Duration::from_secs(self.webhook_cert_validity),
                    rotate_before: Duration::from_secs(self.webhook_cert_rotate_before),
                    ..Lifetimes::default()
                };
                CertSource::SelfManaged { secret: self.webhook_secret.clone(), lifetimes }
            }
        };
        Ok(Some(WebhookOptions {
            bind,
            endpoint,
            certs,
            manage_configurations: self.webhook_manage_configurations,
            namespace: self.namespace.clone(),
            resync: Duration::from_secs(self.webhook_resync.max(1)),
            max_job_pods: self.max_job_pods,
            max_in_flight: crate::webhook::MAX_IN_FLIGHT,
            scheduling_api: self.scheduling_api.requested(),
        }))
    }

    /// The Lease's timings; the grace must be shorter than the duration.
    fn lease(&self) -> anyhow::Result<controllers::LeaseTimings> {
        let (duration, grace) = (self.leader_elect_lease_duration, self.leader_elect_renew_grace);
        if grace >= duration {
            anyhow::bail!(
                "--leader-elect-renew-grace ({grace}) must be less than --leader-elect-lease-duration ({duration})"
            );
        }
        Ok(controllers::LeaseTimings { duration, grace })
    }

    fn config(&self) -> Config {
        let identity = self.identity.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "muster".into());
            format!("{host}-{}", std::process::id())
        });
        Config {
            bind_timeout: Duration::from_secs(self.bind_timeout),
            gpu_max_temperature: self.gpu_max_temperature,
            gpu_min_free_memory: self.gpu_min_free_memory,
            prometheus_url: self.prometheus_url.clone(),
            gpu_metrics_ttl: Duration::from_secs(self.gpu_metrics_ttl),
            placement: self.placement_strategy,
            require_single_numa: self.require_single_numa,
            identity,
            namespace: self.namespace.clone(),
            dra_gpu_device_class: self.dra_gpu_device_class.clone(),
            // Resolved at start, against what the API server serves (`controllers::run`).
            scheduling_api: SchedulingApi::Muster,
            native_scheduling_served: false,
            dra_served: true,
            native_composite_served: false,
            native_fields: Default::default(),
            max_job_pods: self.max_job_pods,
        }
    }
}

/// Runs `muster run`.
pub fn run(args: Args) -> ExitCode {
    init_tracing(&args.log_level, args.log_format);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async {
        let (client, evictions) =
            client(args.kubeconfig.as_ref(), args.kube_api_in_flight).await.context("connecting to the cluster")?;
        let opts = ManagerOptions {
            secure_metrics: args.metrics_secure_bind_address.map(|addr| controllers::secure_metrics::SecureMetrics {
                addr,
                cert_dir: args.metrics_cert_dir.clone(),
            }),
            lease: args.lease()?,
            evictions: Some(controllers::NoRetryClient(evictions)),
            http_addr: args.metrics_bind_address,
            leader_elect: args.leader_elect,
            webhook: args.webhook()?,
            install_crds: args.install_crds,
            scheduling_api: args.scheduling_api.requested(),
        };
        controllers::run(client, args.config(), opts).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "muster stopped");
            ExitCode::FAILURE
        }
    }
}
