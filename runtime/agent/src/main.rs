//! `bosun-agent`: runs one node's NodeTask steps. Connects with the usual kubeconfig rules
//! (`KUBECONFIG`, `~/.kube/config`, or in-cluster) and runs until SIGTERM / Ctrl-C.
//!
//! `main` (about 130 lines) is kept whole on purpose: it wires each flag to the part it
//! configures, top to bottom, in the order the agent starts them.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use bosun_agent::Agent;
use bosun_agent::plugins::Store;
use bosun_fetch::{FetchConfig, Fetcher};
use bosun_host::{Host, HostConfig};
use bosun_trust::TrustRoots;
use clap::Parser;

/// The workspace's version and the git commit this binary was built from
/// (runtime/build/version.rs), as `--version` prints it.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("BOSUN_GIT_COMMIT"),
    ")"
);

/// Runs this node's Bosun steps as signed WebAssembly plugins.
#[derive(Debug, Parser)]
#[command(name = "bosun-agent", version = VERSION)]
struct Args {
    /// The Kubernetes Node this agent works for.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The node's root file system as this process sees it (`/`, `/host`, or a lab node's
    /// directory). Every grant is resolved under it.
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// Public keys (SPKI PEM files, or directories of them) trusted to sign plugins. At
    /// least one: with none, no plugin can run.
    #[arg(long = "trust-root", required = true)]
    trust_roots: Vec<PathBuf>,
    /// Local content-addressed store of plugin bytes (`<sha256>.wasm`).
    #[arg(long, default_value = "/var/lib/bosun/plugins")]
    plugin_dir: PathBuf,
    /// Extra CA certificates (PEM files) trusted for https plugin sources and registries,
    /// besides the platform's roots. Repeatable.
    #[arg(long = "plugin-ca-file")]
    plugin_ca_files: Vec<PathBuf>,
    /// Extra CA certificates (PEM files) trusted for the https GETs plugins make through
    /// their `http` grants (a mirror of dl.k8s.io behind the site's own CA), besides the
    /// Mozilla roots built into the agent. Never the node's CA bundle. Repeatable.
    #[arg(long = "http-ca-file")]
    http_ca_files: Vec<PathBuf>,
    /// Largest plugin accepted from a url or oci source, in MiB; larger bodies are refused.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    plugin_max_mib: u64,
    /// Deadline for fetching one plugin (connect, redirects, body; every request of an OCI
    /// pull together), in seconds.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=3600))]
    plugin_fetch_timeout_seconds: u64,
    /// An OCI registry (`HOST:PORT`) that may be reached over plain http. Repeatable. None
    /// by default: every registry is reached over https.
    #[arg(long = "insecure-registry")]
    insecure_registries: Vec<String>,
    /// Pull credentials for OCI registries: a Docker config file (`{"auths": {...}}`), such
    /// as the `.dockerconfigjson` key of a `kubernetes.io/dockerconfigjson` Secret mounted
    /// into the agent. Without it, pulls are anonymous.
    #[arg(long)]
    registry_auth_file: Option<PathBuf>,
    /// Cache of compiled plugin code (optional).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Field manager name for server-side apply (default: `bosun-agent-<node>`).
    #[arg(long)]
    field_manager: Option<String>,
    /// Act only on NodeTasks labelled `bosun.dev/instance=NAME`; without it, only on
    /// NodeTasks without that label. Must match the controller's `--instance`. For running
    /// installs side by side, and tests.
    #[arg(long, env = "BOSUN_INSTANCE")]
    instance: Option<String>,
    /// Keep this node's NodeReport current (versions, OS, certificate expiry) for the
    /// controller's ClusterLifecycle. Default: true without `--instance`, false with one
    /// (the report is one per node, so of side-by-side installs only one should write it).
    #[arg(long)]
    node_report: Option<bool>,
    /// Seconds between two reads of the node's facts for its NodeReport (written only when
    /// they changed).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86400))]
    node_report_seconds: u64,
    /// Least free space (MiB) on the host root's file system for a step to start (the
    /// built-in `agent/disk-space` preflight check).
    #[arg(long, default_value_t = 1024)]
    min_free_disk_mib: u64,
    /// Keep compiled plugins in memory between steps. By default the agent gives that
    /// memory back after each step (a node runs a step a few times a year) and the next
    /// step maps the code from --cache-dir again, a few milliseconds (docs/benchmarks.md,
    /// "The agent after a step"); without --cache-dir nothing is given back either way.
    #[arg(long)]
    keep_compiled_plugins: bool,
    /// How `service` grants reach the node's services: `auto` (the default) uses OpenRC
    /// when OpenRC booted the node (`/run/openrc/softlevel` under the host root) and systemd
    /// did not, else systemd; `systemd` runs the node's systemctl; `openrc` runs its
    /// `rc-service` (docs/security.md, "Services on OpenRC nodes"); `simulated` acts on no
    /// unit and only remembers what was asked (a started or restarted unit then reports
    /// active/running), for the lab's simulated nodes, which have no init system.
    /// `simulated` is refused when the host root is `/` (a real node).
    #[arg(long, value_enum, default_value_t = ServiceBackendArg::Auto)]
    service_backend: ServiceBackendArg,
    /// For the lab only: read the node's boot identity from the last line of this file
    /// instead of /proc (the lab's simulated nodes share one kernel and one init, so a test
    /// "reboots" one by writing a new line and restarting its agent). Refused when the host
    /// root is `/`: a real node's boot identity comes from /proc, which no plugin can write.
    #[arg(long, hide = true)]
    boot_identity_file: Option<PathBuf>,
    /// Log filter (tracing-subscriber EnvFilter syntax).
    #[arg(long, env = "BOSUN_LOG", default_value = "info")]
    log: String,
    #[command(flatten)]
    telemetry: bosun_telemetry::TelemetryArgs,
}

/// The hidden subcommand the agent compiles plugins with, in a child process of its own.
const COMPILE_PLUGIN: &str = "compile-plugin";

/// `--service-backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ServiceBackendArg {
    Auto,
    Systemd,
    Openrc,
    Simulated,
}

/// `bosun-agent self-test`: checks the kernel boundary of granted commands on this node,
/// as the agent is deployed, and exits 0 only if every probe held and the kernel lacks
/// nothing (docs/security.md, "The kernel boundary of a granted command"). Run it in the
/// agent's container: `kubectl -n bosun-system exec POD -- bosun-agent self-test --host-root /host`.
#[derive(Debug, Parser)]
#[command(name = "bosun-agent self-test")]
struct SelfTestArgs {
    /// The node's root file system as this process sees it, as for the agent.
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// Where on the node the probes may write (a directory of their own beside it, removed
    /// afterwards).
    #[arg(long, default_value = "/var/lib/bosun/self-test")]
    scratch: String,
}

fn self_test(args: SelfTestArgs) -> anyhow::Result<std::process::ExitCode> {
    let report = bosun_host::confinement_self_test(
        &args.host_root,
        bosun_host::ExecIsolation::Chroot,
        &args.scratch,
    )
    .map_err(anyhow::Error::msg)?;
    println!(
        "kernel: Landlock ABI {}, seccomp {}",
        report.support.landlock_abi,
        if report.support.seccomp { "yes" } else { "no" }
    );
    for missing in report.support.missing() {
        println!("MISSING  {missing}");
    }
    match bosun_host::command_cgroup() {
        Some(c) => println!("cgroup: {c}"),
        None => println!("MISSING  {}", bosun_host::NO_COMMAND_CGROUP),
    }
    for p in &report.probes {
        println!(
            "{}  {}\n         {}",
            if p.held { "held   " } else { "ESCAPED" },
            p.name,
            p.detail
        );
    }
    let passed = report.passed();
    println!(
        "{}",
        if passed {
            "the boundary held"
        } else {
            "the boundary did NOT hold"
        }
    );
    Ok(if passed {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    // The agent's own plugin compiler (see `config.compiler` below): a component on stdin,
    // the compiled artifact on stdout.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == COMPILE_PLUGIN)
    {
        return Ok(match bosun_host::compile_stdin_to_stdout() {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(message) => {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "{message}");
                std::process::ExitCode::FAILURE
            }
        });
    }
    if std::env::args_os().nth(1).is_some_and(|a| a == "self-test") {
        let args = SelfTestArgs::parse_from(std::env::args_os().skip(1));
        return self_test(args);
    }
    let args = Args::parse();
    let simulated_services = args.service_backend == ServiceBackendArg::Simulated;
    if simulated_services
        && args
            .host_root
            .canonicalize()
            .is_ok_and(|p| p == std::path::Path::new("/"))
    {
        anyhow::bail!(
            "--service-backend=simulated with --host-root /: simulated services are for the lab's simulated \
             nodes (a directory per node); on a real node units are driven by systemd, so drop the flag"
        );
    }
    if args.boot_identity_file.is_some()
        && args
            .host_root
            .canonicalize()
            .is_ok_and(|p| p == std::path::Path::new("/"))
    {
        anyhow::bail!(
            "--boot-identity-file with --host-root /: the file is for the lab's simulated nodes; on a real node \
             the boot identity is read from /proc, so drop the flag"
        );
    }
    bosun_telemetry::init_logging(&args.log, args.telemetry.log_format)?;
    let admin = match args.telemetry.admin_addr {
        Some(addr) => Some(bosun_telemetry::AdminServer::start(addr).await?),
        None => None,
    };
    let roots = TrustRoots::load(&args.trust_roots).context("loading the trust roots")?;
    let mut config = HostConfig::new(&args.host_root, roots);
    config.cache_dir = args.cache_dir.clone();
    for path in &args.http_ca_files {
        let n = config
            .http
            .add_ca_file(path, "--http-ca-file")
            .map_err(anyhow::Error::msg)?;
        tracing::info!(file = %path.display(), certificates = n, "trusted for plugins' https GETs");
    }
    // Plugins are compiled by a child process of this same binary: the compiler's code,
    // threads and caches never become part of the agent's resident memory, which a node
    // keeps for months between steps (docs/benchmarks.md, "The agent after a step").
    config.compiler = bosun_host::Compiler::Subprocess {
        // The running binary itself, even if its file was replaced since (an upgrade).
        program: "/proc/self/exe".into(),
        args: vec![COMPILE_PLUGIN.into()],
    };
    let manager = match args.service_backend {
        ServiceBackendArg::Auto => bosun_host::openrc::detect(&args.host_root),
        ServiceBackendArg::Systemd => bosun_host::ServiceManager::Systemd,
        ServiceBackendArg::Openrc => bosun_host::ServiceManager::OpenRc,
        ServiceBackendArg::Simulated => bosun_host::ServiceManager::Systemd,
    };
    if simulated_services {
        tracing::warn!(
            "services are simulated (--service-backend=simulated): no unit is ever touched"
        );
        config.service_backend = Arc::new(bosun_host::RecordingBackend::in_memory());
    } else if manager == bosun_host::ServiceManager::OpenRc {
        config.service_backend = Arc::new(bosun_host::OpenRcBackend::default());
    }
    tracing::info!(
        manager = config.service_backend.manager(),
        "services of this node are driven through {}",
        config.service_backend.manager()
    );
    let host = Host::new(config).context("starting the plugin host")?;
    let store = Store::new(&args.plugin_dir).context("opening the plugin store")?;
    let fetcher = Fetcher::new(&FetchConfig {
        ca_files: args.plugin_ca_files.clone(),
        max_body_bytes: args.plugin_max_mib.saturating_mul(1024 * 1024),
        timeout: std::time::Duration::from_secs(args.plugin_fetch_timeout_seconds),
        insecure_registries: args.insecure_registries.clone(),
        registry_auth_file: args.registry_auth_file.clone(),
    })
    .context("setting up the plugin fetcher")?;
    let mut config = kube::Config::infer()
        .await
        .context("finding the API server (set KUBECONFIG to the cluster's kubeconfig)")?;
    // Every request says which node's agent sent it (an audit log tells the agents apart).
    bosun_cluster::client::identify(&mut config, "bosun-agent", &args.node_name);
    // Requests other than watches are cut when the API server does not answer
    // (`AnswerDeadline`): a step result written to a stalled API server is then sent again
    // on another connection instead of hanging.
    let client = kube::client::ClientBuilder::try_from(config)
        .context("connecting to the API server")?
        .with_layer(&bosun_cluster::client::AnswerDeadline(
            bosun_cluster::client::ANSWER_DEADLINE,
        ))
        .build();
    // Ready (admin server's /ready) once the API server has answered with these credentials.
    // An API server that is down (kubeadm restarts it) is waited for, not a reason to exit.
    bosun_cluster::client::wait_for_api_server(&client)
        .await
        .context("asking the API server for its version (are the credentials valid?)")?;
    admin.iter().for_each(|a| a.readiness.set(true));
    let manager = args
        .field_manager
        .unwrap_or_else(|| format!("bosun-agent-{}", args.node_name));
    tracing::info!(node = %args.node_name, host_root = %args.host_root.display(), "bosun-agent starting");
    // Granted commands run with what the kernel offers; say plainly what it does not, here
    // and in the NodeReport (commandConfinement), so that a policy can refuse the node.
    let confinement = bosun_agent::facts::command_confinement();
    if confinement.missing.is_empty() {
        tracing::info!(
            landlock_abi = confinement.landlock_abi,
            seccomp = confinement.seccomp,
            "granted commands are confined by the kernel: Landlock file, TCP and scope rules and a seccomp filter"
        );
    } else {
        for missing in &confinement.missing {
            tracing::warn!(
                landlock_abi = confinement.landlock_abi,
                seccomp = confinement.seccomp,
                "this kernel lacks part of the boundary of granted commands: {missing}"
            );
        }
    }
    let mut agent = Agent::new(
        client,
        args.node_name,
        Arc::new(host),
        store,
        fetcher,
        manager,
    );
    let node_report = args.node_report.unwrap_or(args.instance.is_none());
    agent.instance = args.instance;
    agent.preflight.min_free_bytes = args.min_free_disk_mib.saturating_mul(1024 * 1024);
    agent.preflight.service_program = agent.host.config().service_backend.program();
    if let Some(file) = args.boot_identity_file {
        tracing::warn!(file = %file.display(), "the boot identity is read from a file (--boot-identity-file): for the lab only");
        agent.boot = bosun_agent::boot::BootSource::LabFile(file);
    }
    // A node runs a step a few times a year: give the host's memory back after each one.
    agent.release_memory_after_step = !args.keep_compiled_plugins;
    let agent = Arc::new(agent);
    if node_report {
        tokio::spawn(bosun_agent::report::run(
            agent.clone(),
            std::time::Duration::from_secs(args.node_report_seconds),
        ));
    }
    bosun_agent::run(agent).await;
    tracing::info!("bosun-agent stopped");
    Ok(std::process::ExitCode::SUCCESS)
}
