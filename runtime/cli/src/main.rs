//! `kubectl-bosun`: the Bosun kubectl plugin (`kubectl bosun ...` once it is on `PATH`).
//!
//! Today it carries the plugin author's and the administrator's plugin tools under
//! `kubectl bosun plugin`: key generation, signing, verification, inspection, running one
//! action against a host-root directory, scaffolding a new plugin crate, and publishing a
//! signed plugin to a cluster. Beside `plugin` are the operator commands on Operations and
//! their NodeTasks: `status`, `approve`, `retry`, `skip`, `pause`, `resume`, `logs`.
//!
//! Exit codes: 0 success; 1 the command failed (bad input, refused verification, host
//! error); 2 the plugin itself reported an error or a failing preflight check, or the
//! decision `policy eval` explained denied.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod ops;
mod plugin;
mod policy;
mod terminal;

/// Bosun: kubeadm lifecycle work across a cluster's nodes, run as signed WebAssembly plugins.
#[derive(Debug, Parser)]
#[command(name = "kubectl-bosun", bin_name = "kubectl-bosun", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Work with plugins: keys, signatures, inspection, local runs, scaffolding, publishing.
    #[command(subcommand)]
    Plugin(ops::publish::PluginCommand),
    #[command(flatten)]
    Ops(ops::Command),
    /// Test policies and explain decisions offline: `policy test DIR`, `policy eval --input FILE`.
    #[command(subcommand)]
    Policy(policy::Command),
}

/// What a command reports when it did not fail outright.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// Everything succeeded.
    Success,
    /// The plugin ran and reported an error or a failing check (exit code 2).
    PluginFailed,
    /// `policy eval`: the decision denied (exit code 2).
    Denied,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plugin(cmd) => ops::publish::execute(cmd),
        Command::Ops(cmd) => ops::execute(cmd),
        Command::Policy(cmd) => policy::execute(cmd),
    };
    match result {
        Ok(Status::Success) => ExitCode::SUCCESS,
        Ok(Status::PluginFailed | Status::Denied) => ExitCode::from(2),
        Err(e) => {
            // Errors may quote a plugin (its metadata, its stderr): no raw control characters.
            eprintln!("error: {}", terminal::clean(&error_chain(&e)));
            ExitCode::from(1)
        }
    }
}

/// The error and its causes joined by ": ", leaving out a cause whose text the message
/// already contains (library errors often include their source in their own message).
fn error_chain(e: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn repeated_causes_are_printed_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = anyhow::Error::new(io)
            .context("reading x: no such file")
            .context("verifying");
        assert_eq!(super::error_chain(&e), "verifying: reading x: no such file");
    }

    #[test]
    fn command_tree_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
