//! `lab`: start, inspect and stop the Bosun lab (see the library docs and docs/lab.md).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use bosun_lab::{LabOptions, LabStatus};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "lab",
    about = "A real Kubernetes control plane on loopback, with simulated kubeadm nodes"
)]
struct Cli {
    /// The lab's state directory.
    #[arg(long, env = "BOSUN_LAB_DIR", global = true)]
    dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the lab, or reuse the running one and bring its nodes to the requested shape.
    Up {
        /// Number of simulated nodes.
        #[arg(long, env = "BOSUN_LAB_NODES", default_value_t = bosun_lab::DEFAULT_NODES)]
        nodes: u32,
        /// How many of them are control-plane nodes.
        #[arg(long, env = "BOSUN_LAB_CONTROL_PLANES", default_value_t = bosun_lab::DEFAULT_CONTROL_PLANES)]
        control_planes: u32,
        /// First of the four loopback ports (kube-apiserver, etcd client, etcd peer,
        /// kube-controller-manager).
        #[arg(long, env = "BOSUN_LAB_PORT_BASE", default_value_t = bosun_lab::DEFAULT_PORT_BASE)]
        port_base: u16,
        /// A directory with prebuilt binaries instead of building them.
        #[arg(long, env = "BOSUN_LAB_BIN")]
        bin: Option<PathBuf>,
    },
    /// Show the processes, nodes and host roots; exits 1 when the lab is not running.
    Status,
    /// Print shell exports for using the lab (`eval "$(lab env)"`).
    Env,
    /// Add or remove fleet nodes: many cheap simulated Nodes for scale benchmarks (see
    /// docs/lab.md). The lab must be running.
    Nodes {
        #[command(subcommand)]
        command: NodesCommand,
    },
    /// The real-node cluster lab (kubeadm nodes in podman containers; needs root): runs
    /// tests/cluster/cluster.sh with these arguments, e.g. `lab cluster up --version v1.33.13
    /// --control-planes 2 --workers 1`, `lab cluster status`, `lab cluster env`, `lab cluster
    /// down` (docs/lab.md, "The real-node cluster lab").
    #[command(disable_help_flag = true)]
    Cluster {
        /// up [--control-planes M] [--workers N] [--version vX.Y.Z] | load-images vX.Y.Z |
        /// import DIR | check-nodes vX.Y.Z | status | env | down | check-clean
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Stop the lab's processes; keeps PKI, etcd data and node roots unless --purge.
    Down {
        /// Also delete the state directory's contents.
        #[arg(long)]
        purge: bool,
    },
}

#[derive(Subcommand)]
enum NodesCommand {
    /// Add (or bring back) COUNT Ready fleet nodes named PREFIX0001..., each with a small
    /// host root under the state directory's nodes/.
    Add {
        #[arg(long)]
        count: u32,
        #[arg(long, default_value = "fleet-")]
        prefix: String,
    },
    /// Remove the fleet nodes named PREFIX... and their host roots (never the lab's own).
    Remove {
        #[arg(long, default_value = "fleet-")]
        prefix: String,
    },
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The messages carry the remedy; a backtrace would bury it.
            eprintln!("lab: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    let mut opts = LabOptions::from_env()?;
    if let Some(dir) = cli.dir {
        opts.state_dir = dir;
    }
    match cli.command {
        Command::Up {
            nodes,
            control_planes,
            port_base,
            bin,
        } => {
            let started = Instant::now();
            let opts = LabOptions {
                nodes,
                control_planes,
                port_base,
                bin_dir: bin,
                ..opts
            };
            let lab = bosun_lab::up(&opts).await?;
            eprintln!(
                "lab: up in {:.1}s: Kubernetes {} at https://127.0.0.1:{} with {} nodes",
                started.elapsed().as_secs_f64(),
                lab.kubernetes_version,
                lab.ports.apiserver,
                lab.nodes.len()
            );
            println!("export KUBECONFIG={}", lab.kubeconfig.display());
        }
        Command::Status => {
            let status = bosun_lab::status(&opts.state_dir).await?;
            print_status(&status);
            if !status.running() {
                std::process::exit(1);
            }
        }
        Command::Env => {
            let status = bosun_lab::status(&opts.state_dir).await?;
            let Some(state) = &status.state else {
                anyhow::bail!(bosun_lab::LabError::NotRunning {
                    dir: opts.state_dir
                });
            };
            if !status.running() {
                eprintln!(
                    "lab: warning: the lab in {} is not running; `lab up` starts it",
                    opts.state_dir.display()
                );
            }
            println!(
                "export KUBECONFIG={}",
                status.paths.super_admin_kubeconfig().display()
            );
            println!("export BOSUN_LAB_BIN={}", state.bin_dir.display());
            println!("# host roots:");
            for node in &state.nodes {
                println!(
                    "#   {:<16} {:<14} {}",
                    node.name,
                    node.role,
                    node.host_root.display()
                );
            }
        }
        Command::Nodes { command } => {
            let lab = bosun_lab::running(&opts.state_dir).await?;
            let started = Instant::now();
            match command {
                NodesCommand::Add { count, prefix } => {
                    let nodes = bosun_lab::add_fleet_nodes(&lab, &prefix, count).await?;
                    eprintln!(
                        "lab: {} fleet nodes {prefix}0001..{prefix}{count:04} Ready in {:.1}s",
                        nodes.len(),
                        started.elapsed().as_secs_f64()
                    );
                }
                NodesCommand::Remove { prefix } => {
                    let n = bosun_lab::remove_fleet_nodes(&lab, &prefix).await?;
                    eprintln!(
                        "lab: removed {n} fleet nodes {prefix}* in {:.1}s",
                        started.elapsed().as_secs_f64()
                    );
                }
            }
        }
        Command::Cluster { args } => {
            let script = bosun_lab::cluster_script();
            // exec: the script's output, exit status and signals are the command's own.
            let err = std::os::unix::process::CommandExt::exec(
                std::process::Command::new("bash").arg(&script).args(&args),
            );
            anyhow::bail!(
                "could not run {} ({err}); set BOSUN_CLUSTER_SCRIPT to tests/cluster/cluster.sh of a Bosun checkout",
                script.display()
            );
        }
        Command::Down { purge } => {
            let stopped = bosun_lab::down(&opts.state_dir, purge).await?;
            if stopped.is_empty() {
                eprintln!("lab: nothing was running in {}", opts.state_dir.display());
            } else {
                eprintln!("lab: stopped {}", stopped.join(", "));
            }
            if purge {
                eprintln!("lab: removed the state in {}", opts.state_dir.display());
            }
        }
    }
    Ok(())
}

fn print_status(status: &LabStatus) {
    let state_word = if status.running() {
        "running"
    } else {
        "not running"
    };
    println!("lab: {} ({state_word})", status.paths.state_dir.display());
    let Some(state) = &status.state else {
        println!("  never started here; `lab up` starts it");
        return;
    };
    println!(
        "  Kubernetes {}  binaries {}",
        state.kubernetes_version,
        state.bin_dir.display()
    );
    println!(
        "  KUBECONFIG={}",
        status.paths.super_admin_kubeconfig().display()
    );
    let ports = [
        state.ports.etcd_client,
        state.ports.apiserver,
        state.ports.controller_manager,
    ];
    for (d, port) in status.daemons.iter().zip(ports) {
        let pid = d
            .pid
            .map_or_else(|| "stopped".to_string(), |p| format!("pid {p}"));
        println!(
            "  {:<24} {:<12} 127.0.0.1:{:<6} log {}",
            d.daemon.name,
            pid,
            port,
            d.daemon.log.display()
        );
    }
    println!(
        "  {:<16} {:<14} {:<8} {:<32} HOST ROOT",
        "NODE", "ROLE", "READY", "OS"
    );
    for node in &state.nodes {
        let ready = status
            .node_ready
            .iter()
            .find(|(n, _)| *n == node.name)
            .map_or("?", |(_, r)| if *r { "True" } else { "False" });
        println!(
            "  {:<16} {:<14} {:<8} {:<32} {}",
            node.name,
            node.role,
            ready,
            node.os,
            node.host_root.display()
        );
    }
}
