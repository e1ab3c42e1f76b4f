//! `bosun-bench`: fleet-scale benchmarks against the lab (see the library docs and
//! docs/benchmarks.md). Uses the lab of `$BOSUN_LAB_DIR` (started if needed) and the
//! `bosun-controller` / `bosun-agent` binaries of `$CARGO_TARGET_DIR` built with the bench's
//! own profile (build them first: `cargo build --workspace --locked --bins`, with
//! `--release` for `cargo run --release -p bosun-bench`).

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "bosun-bench",
    about = "Fleet-scale benchmarks of Bosun against the lab"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// N agents in this process, the real controller, one Operation (cordon, no-op plugin
    /// step, uncordon) per --max-unavailable, each followed by the plain-client floor.
    Fleet {
        #[arg(long, default_value_t = 100)]
        nodes: u32,
        /// Repeatable: each value is one run over the same fleet (`1`, `10%`, `100%`).
        #[arg(long = "max-unavailable", default_values_t = vec!["1".to_string()])]
        max_unavailable: Vec<String>,
        /// Name prefix of the fleet nodes.
        #[arg(long, default_value = "fleet-")]
        prefix: String,
        /// The controller's --resync-seconds (its default is 30).
        #[arg(long, default_value_t = 30)]
        resync_seconds: u64,
        /// Skip the floor runs.
        #[arg(long)]
        no_floor: bool,
        /// Kill the controller (SIGKILL) when this share of each Operation's tasks has
        /// Succeeded (`50%`), start it again with the same binary and arguments, and
        /// report how long it took to lead and to resume.
        #[arg(long, value_parser = bosun_bench::parse_percent)]
        restart_controller_at: Option<u32>,
        /// Run the controller with a fixed `--identity`, so that the restarted process
        /// holds the Lease the killed one held (as a container restarted in its pod),
        /// instead of waiting for it to expire.
        #[arg(long)]
        same_identity: bool,
    },
    /// The real agent binary alone: idle RSS and CPU with its watch open, then RSS after a
    /// step.
    AgentIdle {
        /// Idle period (300 in the real bench).
        #[arg(long, default_value_t = 300)]
        idle_secs: u64,
        /// The agent binary to measure, e.g. a release build
        /// (`cargo build --release -p bosun-agent`); default: the workspace's debug build.
        #[arg(long)]
        agent: Option<std::path::PathBuf>,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    // kube-client logs every failed request at ERROR, including each of the lab's readiness
    // probes while its API server starts (a screen of "500 Internal Server Error" before any
    // figure); the callers report the errors that matter. `BOSUN_LOG` overrides the default.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BOSUN_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,kube_client::client::builder=off")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let lab = bosun_lab::ensure_lab().await?;
    println!("load average at start: {}", bosun_bench::load_average());
    match Cli::parse().command {
        Command::Fleet {
            nodes,
            max_unavailable,
            prefix,
            resync_seconds,
            no_floor,
            restart_controller_at,
            same_identity,
        } => {
            let opts = bosun_bench::FleetOptions {
                nodes,
                prefix,
                resync_seconds,
                fixed_identity: same_identity,
            };
            let restart =
                restart_controller_at.map(|at_percent| bosun_bench::RestartPlan { at_percent });
            let mut env = bosun_bench::FleetEnv::start(lab, &opts).await?;
            print!("{}", bosun_bench::fleet_report(&env));
            let mut outcome = Ok(());
            let mut twice = Vec::new();
            for mu in &max_unavailable {
                match bosun_bench::run_once(&mut env, mu, !no_floor, restart).await {
                    Ok(r) => {
                        print!("{}", bosun_bench::report(&env, &r));
                        // Fails the bench at the end; the other runs still run.
                        if !r.once.passed() {
                            twice.push(format!(
                                "maxUnavailable {mu}: {} recorded, {} unrecorded",
                                r.once.violations.len(),
                                r.once.unrecorded_reruns.len()
                            ));
                        }
                    }
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                }
            }
            println!(
                "bench RSS after the runs: {:.1} MiB",
                bosun_bench::procfs::own()?.rss_kib as f64 / 1024.0
            );
            env.finish().await?;
            outcome?;
            anyhow::ensure!(
                twice.is_empty(),
                "steps ran twice or tasks were created twice (listed in the reports above): {}",
                twice.join("; ")
            );
            Ok(())
        }
        Command::AgentIdle { idle_secs, agent } => {
            let agent = match agent {
                Some(path) => path,
                None => bosun_e2e::binary_of(bosun_bench::PROFILE, "bosun-agent")?,
            };
            println!("agent binary: {}", agent.display());
            // The agent as shipped (compiled plugins dropped after each step), and beside
            // it in the same run the alternative: kept in memory between steps. Then the
            // agent as shipped again, restarted on the first run's cache (what a node sees
            // on every step after its first of a plugin version: no compile in the process).
            let cache = bosun_bench::work_dir(&bosun_e2e::unique("idle-cache"));
            let fresh = |name: &str| cache.join(name);
            for (variant, args, cache_dir) in [
                ("as shipped, empty cache", &[][..], fresh("shipped")),
                (
                    "--keep-compiled-plugins, empty cache",
                    &["--keep-compiled-plugins"][..],
                    fresh("kept"),
                ),
                (
                    "as shipped, restarted on the first run's cache",
                    &[][..],
                    fresh("shipped"),
                ),
            ] {
                let r = bosun_bench::agent_idle(&lab, idle_secs, &agent, args, &cache_dir).await?;
                let mib = |kib: u64| kib as f64 / 1024.0;
                println!("agent alone, {variant}:");
                println!(
                    "  RSS {:.1} MiB after {} s idle with its watches open, {:.3} CPU s in that period",
                    mib(r.rss_idle_kib),
                    r.idle_secs,
                    r.cpu_idle_secs
                );
                println!(
                    "  first step (verify, compile unless cached, describe, run): {:.3} s, peak RSS {:.1} MiB; RSS {:.1} MiB 3 s after it",
                    r.first_step_secs,
                    mib(r.hwm_first_step_kib),
                    mib(r.rss_after_step_kib)
                );
                println!(
                    "  second step (verify, code from the disk cache or memory, describe, run): {:.3} s; RSS {:.1} MiB 3 s after it",
                    r.second_step_secs,
                    mib(r.rss_after_second_step_kib)
                );
                println!(
                    "  steady: RSS {:.1} MiB {} s after the second step (the blocking threads that ran it have exited)",
                    mib(r.rss_steady_kib),
                    bosun_bench::STEADY_AFTER_SECS
                );
                println!(
                    "  anonymous / file-backed: {:.1} / {:.1} MiB idle, {:.1} / {:.1} MiB after the first step",
                    mib(r.anon_file_idle_kib.0),
                    mib(r.anon_file_idle_kib.1),
                    mib(r.anon_file_after_step_kib.0),
                    mib(r.anon_file_after_step_kib.1)
                );
            }
            println!("load average now: {}", bosun_bench::load_average());
            Ok(())
        }
    }
}
