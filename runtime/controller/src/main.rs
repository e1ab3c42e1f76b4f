//! `bosun-controller`: the Bosun controller binary. Connects with the usual kubeconfig
//! rules (`KUBECONFIG`, `~/.kube/config`, or in-cluster) and runs until SIGTERM / Ctrl-C.

use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;

/// The workspace's version and the git commit this binary was built from
/// (runtime/build/version.rs), as `--version` prints it.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("BOSUN_GIT_COMMIT"),
    ")"
);

/// Plans Bosun Operations into NodeTasks and drives them in plan order.
#[derive(Debug, Parser)]
#[command(name = "bosun-controller", version = VERSION)]
struct Args {
    /// Field manager name for server-side apply.
    #[arg(long, default_value = bosun_controller::FIELD_MANAGER)]
    field_manager: String,
    /// Seconds between reconciles of a running Operation when nothing changes.
    #[arg(long, default_value_t = 30)]
    resync_seconds: u64,
    /// Act only on Operations labelled `bosun.dev/instance=NAME` (and label their
    /// NodeTasks so); without it, only on Operations without that label. For running
    /// installs side by side, and tests.
    #[arg(long, env = "BOSUN_INSTANCE")]
    instance: Option<String>,
    /// Reconcile the ClusterLifecycle `cluster` (and create it from the cluster when there
    /// is none). Default: true without `--instance`, false with one (the ClusterLifecycle
    /// is one per cluster, so of side-by-side installs only one may own it: pass
    /// `--lifecycle true` to that one).
    #[arg(long)]
    lifecycle: Option<bool>,
    /// `HOST:PORT` of a Prometheus the reboot gates may ask over plain http (repeatable).
    /// Any other `http://` alerts URL is refused; https is verified against the system's
    /// trust roots.
    #[arg(long = "prometheus-plain-http", value_name = "HOST:PORT")]
    prometheus_plain_http: Vec<String>,
    #[command(flatten)]
    leader: LeaderArgs,
    /// Log filter (tracing-subscriber EnvFilter syntax).
    #[arg(long, env = "BOSUN_LOG", default_value = "info")]
    log: String,
    #[command(flatten)]
    telemetry: bosun_telemetry::TelemetryArgs,
}

/// Leader election: of several replicas sharing a Lease, only the holder acts.
#[derive(Debug, clap::Args)]
struct LeaderArgs {
    /// Act without holding the Lease. Only for a single replica: two replicas without
    /// leader election would both act.
    #[arg(long)]
    no_leader_election: bool,
    /// The Lease's name. Default: `bosun-controller`, or `bosun-controller-<instance>`
    /// with `--instance`, so side-by-side installs elect separately.
    #[arg(long)]
    lease_name: Option<String>,
    /// The Lease's namespace (must exist).
    #[arg(long, env = "POD_NAMESPACE", default_value = "bosun-system")]
    lease_namespace: String,
    /// This replica's identity in the Lease and in Events. Default: `$POD_NAME`, else
    /// host name and process id.
    #[arg(long)]
    identity: Option<String>,
    /// Seconds a leader's claim lasts without renewal; a standby takes over after this.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,
    /// Seconds between renewals (shorter than the lease duration).
    #[arg(long, default_value_t = 5)]
    lease_renew_seconds: u64,
}

// The leader's work runs on a runtime of its own per term (see `leader`); this one only
// elects, serves the admin endpoints and waits for signals.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    bosun_telemetry::init_logging(&args.log, args.telemetry.log_format)?;
    let admin = match args.telemetry.admin_addr {
        Some(addr) => Some(bosun_telemetry::AdminServer::start(addr).await?),
        None => None,
    };
    let identity = args
        .leader
        .identity
        .clone()
        .unwrap_or_else(bosun_controller::leader::default_identity);
    let mut config = kube::Config::infer()
        .await
        .context("finding the API server (set KUBECONFIG to the cluster's kubeconfig)")?;
    // No client-side retries: kube's default retries a 429 for minutes inside one call, and
    // an eviction refused by a PodDisruptionBudget is a 429 the drain must see at once (it
    // tries again on its own schedule). Every other failed call is retried by the
    // reconcile's requeue.
    config.default_retry = false;
    // Every request says which replica sent it (an audit log tells the replicas apart).
    bosun_cluster::client::identify(&mut config, "bosun-controller", &identity);
    let client = kube::Client::try_from(config.clone()).context("connecting to the API server")?;
    // Ready (admin server's /ready) once the API server has answered with these credentials.
    // An API server that is down (kubeadm restarts it) is waited for, not a reason to exit.
    bosun_cluster::client::wait_for_api_server(&client)
        .await
        .context("asking the API server for its version (are the credentials valid?)")?;
    admin.iter().for_each(|a| a.readiness.set(true));
    tracing::info!(manager = %args.field_manager, instance = args.instance.as_deref().unwrap_or(""), "bosun-controller starting");
    let resync = Duration::from_secs(args.resync_seconds);
    let lifecycle = args.lifecycle.unwrap_or(args.instance.is_none());
    let gates = bosun_controller::reboot_gate::Gates::new(&args.prometheus_plain_http)
        .map_err(|e| anyhow::anyhow!("{e}").context("--prometheus-plain-http"))?;
    if args.leader.no_leader_election {
        bosun_controller::run(
            client,
            args.field_manager,
            resync,
            args.instance,
            identity,
            lifecycle,
            gates,
        )
        .await;
    } else {
        let lease = bosun_controller::leader::LeaseConfig {
            name: args
                .leader
                .lease_name
                .clone()
                .unwrap_or_else(|| match &args.instance {
                    Some(i) => format!("bosun-controller-{i}"),
                    None => "bosun-controller".to_string(),
                }),
            namespace: args.leader.lease_namespace.clone(),
            identity: identity.clone(),
            duration: Duration::from_secs(args.leader.lease_duration_seconds),
            renew_every: Duration::from_secs(args.leader.lease_renew_seconds),
            version: VERSION.to_owned(),
        };
        let (manager, instance) = (args.field_manager, args.instance);
        // One call per term of leadership, each with the term's own fenced client.
        let work = move |client: kube::Client| {
            bosun_controller::run(
                client,
                manager.clone(),
                resync,
                instance.clone(),
                identity.clone(),
                lifecycle,
                gates.clone(),
            )
        };
        bosun_controller::leader::run_as_leader(client, config, lease, work).await?;
    }
    tracing::info!("bosun-controller stopped");
    Ok(())
}
