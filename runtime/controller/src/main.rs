//! `bosun-controller`: the Bosun controller binary. Connects with the usual kubeconfig
//! rules (`KUBECONFIG`, `~/.kube/config`, or in-cluster) and runs until SIGTERM / Ctrl-C.

use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;

/// Plans Bosun Operations into NodeTasks and drives them in plan order.
#[derive(Debug, Parser)]
#[command(name = "bosun-controller", version)]
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
    /// Log filter (tracing-subscriber EnvFilter syntax).
    #[arg(long, env = "BOSUN_LOG", default_value = "info")]
    log: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&args.log))
        .with_writer(std::io::stderr)
        .init();
    let client = kube::Client::try_default()
        .await
        .context("connecting to the API server (set KUBECONFIG to the cluster's kubeconfig)")?;
    tracing::info!(manager = %args.field_manager, instance = args.instance.as_deref().unwrap_or(""), "bosun-controller starting");
    bosun_controller::run(client, args.field_manager, Duration::from_secs(args.resync_seconds), args.instance).await;
    tracing::info!("bosun-controller stopped");
    Ok(())
}
