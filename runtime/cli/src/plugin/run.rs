//! `run`: the plugin author's inner loop. Verifies the plugin as the agent would, runs its
//! preflight and one action against a host-root directory under the grants in a YAML file,
//! and prints checks, logs, progress and the outcome.
//!
//! `run` (about 130 lines) is kept whole on purpose: it is the local run's steps in the order
//! they happen and print (the plugin, its signature, grants and trust roots read; the plugin
//! verified and loaded; preflight; the run; the report).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use bosun_api::grants::Grants;
use bosun_host::{
    Captured, CheckStatus, ExecIsolation, Host, HostConfig, LoadedPlugin, NodeContext, PluginPin,
    RecordingBackend, RunOptions,
};
use bosun_policy::capabilities::RequestedCapabilities;
use bosun_policy::input::PluginInfo;
use bosun_policy::{Limits, PolicySet, PolicySource, load_policies};
use bosun_trust::{SignatureBundle, TrustRoots};
use clap::{Args, ValueEnum};

use super::PluginFile;
use crate::Status;
use crate::terminal::{clean, errln, outln};

/// How granted commands are started (see the host's `ExecIsolation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Isolation {
    /// chroot into the host root before exec (needs root); what the agent does.
    Chroot,
    /// Resolve commands under the host root but do not chroot (unprivileged development only).
    ResolveOnly,
}

/// Where `service` calls go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ServiceBackend {
    /// Drive the real systemd with systemctl (only meaningful with --host-root /).
    Systemctl,
    /// Record calls in HOST_ROOT/var/log/bosun-services.log instead of touching systemd.
    Record,
    /// Drive OpenRC with HOST_ROOT's /sbin/rc-service, chrooted into it (needs root), as an
    /// agent on an OpenRC node does.
    Openrc,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The plugin file (`.wasm` component), signed (FILE.sig.json next to it, or --bundle).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The action to run.
    #[arg(value_name = "ACTION")]
    pub action: String,
    /// Params as a JSON document, or @FILE to read them from a file.
    #[arg(long, default_value = "{}", value_name = "JSON|@FILE")]
    pub params: String,
    /// Grants: a YAML file holding the `grants` of a Plugin resource, or a Plugin manifest
    /// (its `spec.grants` are used, for example deploy/examples/plugins/certs.yaml).
    /// Without it nothing is granted.
    #[arg(long, value_name = "FILE")]
    pub grants: Option<PathBuf>,
    /// Capabilities policies to judge the plugin by, as the agent does after requested ⊆
    /// granted (`data.bosun.capabilities.deny`): a directory of policy directories, a
    /// .rego file, or a YAML file of Policy manifests. Repeatable. Without it only
    /// requested ⊆ granted is checked.
    #[arg(long = "policy", value_name = "PATH")]
    pub policies: Vec<PathBuf>,
    /// The directory standing in for the node's root file system.
    #[arg(long, value_name = "DIR")]
    pub host_root: PathBuf,
    /// Trusted public key (SPKI PEM) or a directory of them; repeatable. Required: the
    /// plugin is verified exactly as the agent verifies it.
    #[arg(long = "trust-root", value_name = "PEM", required = true)]
    pub trust_roots: Vec<PathBuf>,
    /// Signature bundle. Default: FILE.sig.json.
    #[arg(long, value_name = "PATH")]
    pub bundle: Option<PathBuf>,
    /// Ask the plugin not to change anything (it reports what it would do).
    #[arg(long)]
    pub dry_run: bool,
    /// Tell the plugin the previous attempt of this step was interrupted
    /// (`run-context.resumed`), as the agent does when it re-runs an interrupted step.
    #[arg(long)]
    pub resumed: bool,
    /// Skip the preflight checks (by default a failing check stops the run, as in the agent).
    #[arg(long)]
    pub skip_preflight: bool,
    /// Node name the plugin sees in its facts.
    #[arg(long, default_value = "local", value_name = "NAME")]
    pub node_name: String,
    /// Node role the plugin sees (`control-plane`, `worker`); repeatable.
    #[arg(long = "role", value_name = "ROLE")]
    pub roles: Vec<String>,
    /// kubelet version the plugin sees in its facts, for example v1.34.1.
    #[arg(long, value_name = "VERSION")]
    pub kubelet_version: Option<String>,
    /// Wall-clock limit for the action, in seconds. Default: the host's default.
    #[arg(long, value_name = "SECONDS")]
    pub deadline: Option<u64>,
    /// How granted commands are started.
    #[arg(long, value_enum, default_value_t = Isolation::Chroot)]
    pub exec_isolation: Isolation,
    /// Where `service` calls go.
    #[arg(long, value_enum, default_value_t = ServiceBackend::Record)]
    pub service_backend: ServiceBackend,
}

pub fn run(args: &RunArgs) -> Result<Status> {
    let file = PluginFile::read(&args.file)?;
    let params = read_params(&args.params)?;
    let grants = super::grants::read_grants(args.grants.as_ref())?;
    let bundle_path = args
        .bundle
        .clone()
        .unwrap_or_else(|| SignatureBundle::path_for(&args.file));
    let bundle = SignatureBundle::read(&bundle_path).with_context(|| {
        format!(
            "{} has no usable signature bundle; sign it first: kubectl bosun plugin sign --key KEY {}",
            args.file.display(),
            args.file.display()
        )
    })?;
    let roots = TrustRoots::load(&args.trust_roots)?;
    let mut policies = Vec::new();
    for p in &args.policies {
        policies.extend(
            load_policies(p).with_context(|| format!("loading policies from {}", p.display()))?,
        );
    }

    let mut config = HostConfig::new(&args.host_root, roots);
    config.exec_isolation = match args.exec_isolation {
        Isolation::Chroot => ExecIsolation::Chroot,
        Isolation::ResolveOnly => ExecIsolation::ResolveOnly,
    };
    match args.service_backend {
        ServiceBackend::Record => {
            config.service_backend = Arc::new(RecordingBackend::logging_to_host_root());
        }
        ServiceBackend::Openrc => {
            config.service_backend = Arc::new(bosun_host::OpenRcBackend::default());
        }
        ServiceBackend::Systemctl => {}
    }
    let host = Host::new(config).context("starting the plugin host")?;
    let plugin = host.load(&file.bytes, &PluginPin::from(&bundle))?;
    print_header(&plugin);
    if !capabilities_allowed(&plugin, &grants, &policies, &args.node_name) {
        return Ok(Status::Denied);
    }

    let node = NodeContext {
        node_name: args.node_name.clone(),
        roles: args.roles.clone(),
        kubelet_version: args.kubelet_version.clone(),
    };
    if !args.skip_preflight {
        outln!("preflight {}:", clean(&args.action));
        let report = host
            .preflight_with(&plugin, &grants, &node, &args.action, &params, args.dry_run)
            .inspect_err(|f| print_captured(&f.captured))
            .context("preflight")?;
        print_captured(&report.captured);
        match report.result {
            Ok(checks) => {
                for c in &checks {
                    let status = match c.status {
                        CheckStatus::Pass => "pass",
                        CheckStatus::Warn => "WARN",
                        CheckStatus::Fail => "FAIL",
                    };
                    outln!("  {status:<4} {}: {}", clean(&c.name), clean(&c.message));
                }
                if checks.is_empty() {
                    outln!("  (no checks)");
                }
                let failed: Vec<&str> = checks
                    .iter()
                    .filter(|c| c.status == CheckStatus::Fail)
                    .map(|c| c.name.as_str())
                    .collect();
                if !failed.is_empty() {
                    errln!(
                        "error: preflight check(s) failed: {}; the action did not run",
                        clean(&failed.join(", "))
                    );
                    return Ok(Status::PluginFailed);
                }
            }
            Err(e) => {
                errln!(
                    "error: preflight failed: {} (code {}{})",
                    clean(&e.message),
                    clean(&e.code),
                    retry_note(e.retryable)
                );
                return Ok(Status::PluginFailed);
            }
        }
    }

    outln!(
        "run {}{}:",
        clean(&args.action),
        match (args.dry_run, args.resumed) {
            (false, false) => "",
            (true, false) => " (dry run)",
            (false, true) => " (resumed)",
            (true, true) => " (dry run, resumed)",
        }
    );
    let options = RunOptions {
        dry_run: args.dry_run,
        resumed: args.resumed,
        deadline: args.deadline.map(Duration::from_secs),
    };
    let report = host
        .run(&plugin, &grants, &node, &args.action, &params, options)
        .inspect_err(|f| print_captured(&f.captured))
        .context("run")?;
    print_captured(&report.captured);
    match report.result {
        Ok(outcome) => {
            outln!(
                "outcome: {}: {}",
                if outcome.changed {
                    "changed"
                } else {
                    "unchanged"
                },
                clean(&outcome.message)
            );
            for (k, v) in &outcome.outputs {
                outln!("  {} = {}", clean(k), clean(v));
            }
            Ok(Status::Success)
        }
        Err(e) => {
            errln!(
                "error: the plugin failed: {} (code {}{})",
                clean(&e.message),
                clean(&e.code),
                retry_note(e.retryable)
            );
            Ok(Status::PluginFailed)
        }
    }
}

/// The agent's capabilities gate (`bosun_policy::Evaluator::capabilities`): every request
/// covered by a grant, then the capabilities policies. Prints the decision; `false` when it
/// denies (nothing of the plugin runs then, as on a node).
fn capabilities_allowed(
    plugin: &LoadedPlugin,
    grants: &Grants,
    policies: &[PolicySource],
    node: &str,
) -> bool {
    let c = &plugin.metadata().capabilities;
    let requested = RequestedCapabilities::from_parts(&c.filesystem, &c.exec, &c.services, &c.http);
    let meta = plugin.metadata();
    let info = PluginInfo {
        name: meta.name.clone(),
        version: meta.version.clone(),
        digest: plugin.digest().to_string(),
        signer: plugin.verified().map(|v| format!("{:#}", v.key_id)),
    };
    let set = PolicySet::compile(policies, Limits::default());
    let decision = set
        .evaluator()
        .capabilities(&info, &requested, grants, Some(node));
    // The findings quote the plugin's requests (commands, arguments, paths, units, hosts)
    // and policies build their messages from them.
    for f in &decision.warnings {
        outln!("  WARN {}: {}", clean(&f.policy), clean(&f.message));
    }
    if !decision.allowed {
        let denies: Vec<String> = decision
            .deny_messages()
            .iter()
            .map(|m| clean(m).into_owned())
            .collect();
        errln!(
            "error: the plugin's capabilities were denied: {}; the agent refuses this plugin the same way (capabilities-denied) before its preflight; grant what it requests (--grants) or change the policy",
            denies.join("; ")
        );
        return false;
    }
    if policies.is_empty() {
        outln!("capabilities: every request granted");
    } else {
        outln!(
            "capabilities: every request granted, allowed by {} policies (policy set {})",
            policies.len(),
            decision.policy_set_digest
        );
    }
    true
}

fn retry_note(retryable: bool) -> &'static str {
    if retryable {
        ", retryable"
    } else {
        ", not retryable"
    }
}

fn read_params(arg: &str) -> Result<String> {
    let text = match arg.strip_prefix('@') {
        Some(path) => {
            std::fs::read_to_string(path).with_context(|| format!("reading params file {path}"))?
        }
        None => arg.to_owned(),
    };
    // Checked here so a typo is reported as the user's input, not as the plugin's problem.
    serde_json::from_str::<serde_json::Value>(&text)
        .with_context(|| format!("--params must be a JSON document (or @FILE); got {text:?}"))?;
    Ok(text)
}

fn print_header(plugin: &LoadedPlugin) {
    let meta = plugin.metadata();
    outln!(
        "plugin {} {} ({})",
        clean(&meta.name),
        clean(&meta.version),
        plugin.digest()
    );
    if let Some(v) = plugin.verified() {
        outln!(
            "verified: signed by {} ({}, trust root {})",
            v.key_id,
            v.algorithm.as_str(),
            clean(&v.origin)
        );
    }
}

fn print_captured(c: &Captured) {
    for line in &c.lines {
        let fields: String = line
            .fields
            .iter()
            .map(|(k, v)| format!(" {}={}", clean(k), clean(v)))
            .collect();
        let cut = if line.truncated { " [truncated]" } else { "" };
        outln!(
            "  [{}] {}{fields}{cut}",
            format!("{:?}", line.level).to_lowercase(),
            clean(&line.message)
        );
    }
    if let Some(p) = &c.progress {
        outln!("  progress {}/{}: {}", p.done, p.total, clean(&p.message));
    }
    for d in &c.denied {
        outln!("  denied {}: {}", clean(&d.capability), clean(&d.message));
    }
    if !c.stderr.trim().is_empty() {
        for line in c.stderr.trim_end().lines() {
            outln!("  stderr: {}", clean(line));
        }
    }
}
