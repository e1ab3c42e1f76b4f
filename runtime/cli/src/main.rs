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

/// The workspace's version and the git commit this binary was built from
/// (runtime/build/version.rs), as `--version` prints it.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("BOSUN_GIT_COMMIT"),
    ")"
);

/// Bosun: kubeadm lifecycle work across a cluster's nodes, run as signed WebAssembly plugins.
#[derive(Debug, Parser)]
#[command(name = "kubectl-bosun", bin_name = "kubectl-bosun", version = VERSION)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Work with plugins: keys, signatures, inspection, local runs, scaffolding, publishing.
    #[command(subcommand)]
    Plugin(plugin::Command),
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
    /// `status --watch`: the Operation is Blocked and waits for a person (exit code 3).
    Blocked,
}

fn main() -> ExitCode {
    exit_quietly_on_broken_pipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plugin(cmd) => plugin::execute(cmd),
        Command::Ops(cmd) => ops::execute(cmd),
        Command::Policy(cmd) => policy::execute(cmd),
    };
    match result {
        Ok(Status::Success) => ExitCode::SUCCESS,
        Ok(Status::PluginFailed | Status::Denied) => ExitCode::from(2),
        Ok(Status::Blocked) => ExitCode::from(3),
        Err(e) => {
            // Errors may quote a plugin (its metadata, its stderr), a policy or the cluster:
            // no raw control characters, and on one line.
            terminal::errln!("error: {}", terminal::clean(&error_chain(&e)));
            ExitCode::from(1)
        }
    }
}

/// The exit code when the reader of our output went away (`kubectl bosun ... | head`):
/// 128 + SIGPIPE, what a program killed by SIGPIPE reports.
const BROKEN_PIPE_EXIT: i32 = 141;

/// Makes every command exit quietly, with [`BROKEN_PIPE_EXIT`], when its stdout or stderr
/// is a pipe whose reader has gone (EPIPE), instead of panicking with `failed printing to
/// stdout: Broken pipe`. Rust ignores SIGPIPE and `println!` panics on the write error;
/// this hook recognises that one panic and ends the process without a message. Every other
/// panic is reported as usual.
fn exit_quietly_on_broken_pipe() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if is_broken_pipe_panic(message) {
            std::process::exit(BROKEN_PIPE_EXIT);
        }
        report(info);
    }));
}

/// Whether a panic message is std's report of a print to a closed pipe.
fn is_broken_pipe_panic(message: &str) -> bool {
    message.starts_with("failed printing to std")
        && (message.contains("Broken pipe") || message.contains("os error 32"))
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

    #[test]
    fn approve_shows_its_arguments_in_the_order_it_takes_them() {
        let mut cli = super::Cli::command();
        let approve = cli
            .find_subcommand_mut("approve")
            .expect("an approve command");
        let usage = approve.render_usage().to_string();
        assert!(
            usage.contains("approve [OPTIONS] <OPERATION> <NODE>...")
                && usage.contains("approve [OPTIONS] <OPERATION> --all"),
            "{usage}"
        );
        // And it parses what it shows.
        for args in [
            ["kubectl-bosun", "approve", "op1", "node-a"],
            ["kubectl-bosun", "approve", "op1", "--all"],
        ] {
            let parsed = <super::Cli as clap::Parser>::try_parse_from(args);
            let Ok(super::Cli {
                command: super::Command::Ops(crate::ops::Command::Approve(a)),
            }) = parsed
            else {
                panic!("{args:?} did not parse as approve: {parsed:?}");
            };
            assert_eq!(a.operation, "op1");
        }
    }
}
