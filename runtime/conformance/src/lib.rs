//! The plugin conformance kit (`kubectl bosun plugin test`).
//!
//! For one signed plugin, its grants and a matrix of node roots, the kit runs every case
//! (an action with params) on a fresh copy of every root, through the same sandbox the
//! agent uses, and checks:
//!
//! - **preflight** accepts a root the plugin supports, and **refuses** one marked
//!   unsupported with a reason (a failing check or a plugin error);
//! - **a dry run changes nothing**: a snapshot of the whole root (every path, its type,
//!   mode, owner and content) before the preflight and after the dry run are equal;
//! - **the run** succeeds;
//! - **outputs match** the schema the case declares for them;
//! - **an action declared idempotent, run twice**: the second run reports no change and
//!   leaves the root as the first run did;
//! - **headroom**: each run's wall time and memory stay under `max_use` of the deadline
//!   and the memory limit (measured and reported);
//! - **every grant is used** somewhere in the matrix (`grants` in the report): a
//!   filesystem grant by a path operation beneath it or a change the run made there, each
//!   argument pattern of an exec grant by a command it admitted, each action of a service
//!   grant by that action, each http grant by a GET. What granted commands themselves read
//!   is the kernel's to enforce (Landlock) and is not seen: a read-only grant used only by
//!   a command is reported unused;
//! - **every action** the plugin declares has a case.
//!
//! Service calls are answered by a recording stand-in kept in memory (one per case), never
//! sent to the machine's systemd, and leave nothing in the root.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use bosun_api::grants::{Access, Grants};
use bosun_host::{
    CallFailure, Captured, CheckStatus, GrantUse, Host, HostConfig, LoadedPlugin, NodeContext,
    PluginPin, RecordingBackend, RunOptions,
};
use serde::Serialize;

mod report;
pub mod tree;

pub use report::{junit_xml, text};
use tree::{Change, Snapshot};

/// One node root of the matrix.
#[derive(Clone, Debug)]
pub struct Root {
    /// A short name for the report, for example `debian-12`.
    pub name: String,
    /// The directory each case gets a fresh copy of (`cp -a`).
    pub template: PathBuf,
    /// The plugin must refuse this root in preflight.
    pub unsupported: bool,
}

/// One action to run, with its params.
#[derive(Clone, Debug)]
pub struct Case {
    /// The name in the report; the action's when empty.
    pub name: String,
    pub action: String,
    pub params: serde_json::Value,
    /// A JSON Schema the outputs (as a JSON object of strings) must match.
    pub outputs_schema: Option<serde_json::Value>,
    /// The action is idempotent in effect but changes something on every run by design
    /// (a restart): the second run may report a change, and must still succeed and leave
    /// the root as the first run left it.
    pub changes_every_run: bool,
    /// The roots (by name) this case runs on; every root when empty. A stateful action
    /// needs a root in the state it starts from (`hold` needs the package installed).
    pub roots: Vec<String>,
}

/// What to test and how.
pub struct Kit {
    /// The host configuration the plugin is verified and run with; its `host_root` is an
    /// empty directory (each case gets its own root) and its service backend is replaced
    /// by a recording one.
    pub host: HostConfig,
    pub plugin: Vec<u8>,
    pub pin: PluginPin,
    pub grants: Grants,
    pub node: NodeContext,
    /// Each run's deadline, as the step's in an Operation.
    pub deadline: Duration,
    /// The share of the deadline and of the memory limit a run may use (0.75).
    pub max_use: f64,
    /// Node paths left out of root snapshots (logs that tools write on every run).
    pub ignore: Vec<String>,
    pub roots: Vec<Root>,
    pub cases: Vec<Case>,
    /// Where the copies of the roots are made; each is removed after its case.
    pub work_dir: PathBuf,
}

/// The result of one check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    Skip,
}

/// One check of one case on one root.
#[derive(Clone, Debug, Serialize)]
pub struct CheckResult {
    pub root: String,
    pub case: String,
    pub check: String,
    pub status: Status,
    pub message: String,
    pub seconds: f64,
}

/// The figures of one run of an action.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunFigures {
    pub root: String,
    pub case: String,
    /// `dry-run`, `run` or `again`.
    pub run: &'static str,
    pub changed: Option<bool>,
    pub seconds: f64,
    pub deadline_seconds: f64,
    pub memory_bytes: u64,
    pub memory_limit_bytes: u64,
}

/// One grant entry and whether the matrix used it.
#[derive(Clone, Debug, Serialize)]
pub struct GrantResult {
    pub grant: String,
    pub used: bool,
}

/// Everything the kit found.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub plugin: String,
    pub version: String,
    pub sha256: String,
    pub checks: Vec<CheckResult>,
    pub runs: Vec<RunFigures>,
    pub grants: Vec<GrantResult>,
    /// What the kit did not check, said once (for example exec grants' own sandboxes).
    pub notes: Vec<String>,
}

impl Report {
    /// True when no check failed and every grant was used.
    pub fn passed(&self) -> bool {
        self.failures() == 0
    }

    /// Failed checks plus unused grants.
    pub fn failures(&self) -> usize {
        self.checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .count()
            + self.grants.iter().filter(|g| !g.used).count()
    }

    /// JSON for CI systems.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// Runs the kit. `Err` when it cannot start (the plugin does not verify or load, a root
/// cannot be copied); every finding about the plugin is in the [`Report`].
pub fn run(kit: &Kit) -> Result<Report> {
    if kit.roots.is_empty() {
        bail!("the kit has no roots: give at least one node root the plugin supports");
    }
    for case in &kit.cases {
        if let Some(r) = case
            .roots
            .iter()
            .find(|r| !kit.roots.iter().any(|k| &k.name == *r))
        {
            bail!(
                "case `{}` names root `{r}`, which the kit does not have",
                case_name(case)
            );
        }
    }
    if !kit.roots.iter().any(|r| !r.unsupported) {
        bail!("every root is marked unsupported: give at least one root the plugin supports");
    }
    std::fs::create_dir_all(&kit.work_dir)
        .with_context(|| format!("creating {}", kit.work_dir.display()))?;
    let empty = kit.work_dir.join("empty-root");
    std::fs::create_dir_all(&empty).with_context(|| format!("creating {}", empty.display()))?;
    let mut config = kit.host.clone();
    config.host_root = empty;
    let base = Host::new(config).context("starting the plugin host")?;
    let plugin = base
        .load(&kit.plugin, &kit.pin)
        .context("verifying and loading the plugin (as the agent does)")?;
    let meta = plugin.metadata().clone();

    let mut t = Tester {
        kit,
        base: &base,
        plugin: &plugin,
        used: BTreeSet::new(),
        report: Report {
            plugin: meta.name.clone(),
            version: meta.version.clone(),
            sha256: plugin.digest().to_hex(),
            checks: Vec::new(),
            runs: Vec::new(),
            grants: Vec::new(),
            notes: Vec::new(),
        },
    };
    for action in &meta.actions {
        if !kit.cases.iter().any(|c| c.action == action.name) {
            t.push(
                "-",
                &action.name,
                "has-a-case",
                Status::Fail,
                format!(
                    "the plugin declares `{}` but the kit has no case for it: add one",
                    action.name
                ),
                0.0,
            );
        }
    }
    for (i, root) in kit.roots.iter().enumerate() {
        for (j, case) in kit.cases.iter().enumerate() {
            if !case.roots.is_empty() && !case.roots.contains(&root.name) {
                continue;
            }
            let dir = kit.work_dir.join(format!("root-{i}-case-{j}"));
            copy_root(&root.template, &dir)?;
            let result = if root.unsupported {
                t.unsupported(root, case, &dir)
            } else {
                t.supported(root, case, &dir)
            };
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
            result?;
        }
    }
    t.grants();
    if kit
        .grants
        .exec
        .iter()
        .any(|g| !g.sandbox.filesystem.is_empty() || !g.sandbox.tcp_connect.is_empty())
    {
        t.report.notes.push(
            "exec grants' own sandboxes (sandbox.filesystem, tcpConnect) are enforced by the kernel \
             and not checked for use"
                .into(),
        );
    }
    Ok(t.report)
}

/// Copies `template` to `dest` (which must not exist), keeping owners, modes and links.
fn copy_root(template: &Path, dest: &Path) -> Result<()> {
    if !template.is_dir() {
        bail!("root template {} is not a directory", template.display());
    }
    if dest.exists() {
        std::fs::remove_dir_all(dest).with_context(|| format!("removing {}", dest.display()))?;
    }
    let status = Command::new("cp")
        .arg("-a")
        .arg(template)
        .arg(dest)
        .status()
        .context("running cp -a to copy a root")?;
    if !status.success() {
        bail!(
            "cp -a {} {} failed ({status})",
            template.display(),
            dest.display()
        );
    }
    Ok(())
}

struct Tester<'k> {
    kit: &'k Kit,
    base: &'k Host,
    plugin: &'k LoadedPlugin,
    used: BTreeSet<GrantUse>,
    report: Report,
}

/// What a call ended with, reduced to what the checks need.
enum Called<T> {
    Ok(T),
    PluginError(String),
    HostStopped(String),
}

impl Tester<'_> {
    fn push(
        &mut self,
        root: &str,
        case: &str,
        check: &str,
        status: Status,
        message: String,
        seconds: f64,
    ) {
        self.report.checks.push(CheckResult {
            root: root.to_owned(),
            case: case.to_owned(),
            check: check.to_owned(),
            status,
            message,
            seconds,
        });
    }

    fn note_use(&mut self, captured: &Captured) {
        self.used.extend(captured.used.iter().cloned());
    }

    fn host_for(&self, dir: &Path) -> Result<Host> {
        self.base
            .sibling(dir, Arc::new(RecordingBackend::in_memory()))
            .context("a host for the root's copy")
    }

    fn preflight(
        &mut self,
        host: &Host,
        case: &Case,
        dry_run: bool,
    ) -> Called<Vec<bosun_host::Check>> {
        let params = case.params.to_string();
        match host.preflight_with(
            self.plugin,
            &self.kit.grants,
            &self.kit.node,
            &case.action,
            &params,
            dry_run,
        ) {
            Ok(r) => {
                self.note_use(&r.captured);
                match r.result {
                    Ok(checks) => Called::Ok(checks),
                    Err(e) => Called::PluginError(format!("{}: {}", e.code, e.message)),
                }
            }
            Err(f) => self.stopped(f),
        }
    }

    fn stopped<T>(&mut self, f: CallFailure) -> Called<T> {
        self.note_use(&f.captured);
        Called::HostStopped(f.error.to_string())
    }

    /// Runs the case once and records its figures.
    fn run_once(
        &mut self,
        host: &Host,
        root: &Root,
        case: &Case,
        which: &'static str,
        dry_run: bool,
    ) -> Called<bosun_host::Outcome> {
        let params = case.params.to_string();
        let options = RunOptions {
            dry_run,
            resumed: false,
            deadline: Some(self.kit.deadline),
        };
        let started = Instant::now();
        let result = host.run(
            self.plugin,
            &self.kit.grants,
            &self.kit.node,
            &case.action,
            &params,
            options,
        );
        let seconds = started.elapsed().as_secs_f64();
        let (captured, called) = match result {
            Ok(r) => {
                let called = match r.result {
                    Ok(o) => Called::Ok(o),
                    Err(e) => Called::PluginError(format!("{}: {}", e.code, e.message)),
                };
                (r.captured, called)
            }
            Err(f) => {
                let message = f.error.to_string();
                (*f.captured, Called::HostStopped(message))
            }
        };
        self.note_use(&captured);
        self.report.runs.push(RunFigures {
            root: root.name.clone(),
            case: case_name(case).to_owned(),
            run: which,
            changed: match &called {
                Called::Ok(o) => Some(o.changed),
                _ => None,
            },
            seconds,
            deadline_seconds: self.kit.deadline.as_secs_f64(),
            memory_bytes: captured.memory_bytes,
            memory_limit_bytes: self.kit.host.limits.max_memory_bytes,
        });
        called
    }

    /// Preflight, then (when no check failed) the real run, as the agent does a step;
    /// `refused` is the failure when a check fails.
    fn preflight_then_run(
        &mut self,
        host: &Host,
        root: &Root,
        case: &Case,
        which: &'static str,
        refused: &str,
    ) -> Called<bosun_host::Outcome> {
        match self.preflight(host, case, false) {
            Called::Ok(checks) if checks.iter().all(|c| c.status != CheckStatus::Fail) => {
                self.run_once(host, root, case, which, false)
            }
            Called::Ok(_) => Called::PluginError(refused.to_owned()),
            Called::PluginError(e) => Called::PluginError(e),
            Called::HostStopped(e) => Called::HostStopped(e),
        }
    }

    fn unsupported(&mut self, root: &Root, case: &Case, dir: &Path) -> Result<()> {
        let name = case_name(case);
        let host = self.host_for(dir)?;
        let before = Snapshot::of(dir, &self.kit.ignore)?;
        let started = Instant::now();
        let called = self.preflight(&host, case, false);
        let seconds = started.elapsed().as_secs_f64();
        let changes = before.changes(&Snapshot::of(dir, &self.kit.ignore)?);
        let (status, message) = match called {
            _ if !changes.is_empty() => (
                Status::Fail,
                format!("preflight changed the root: {}", list(&changes)),
            ),
            Called::PluginError(e) => (Status::Pass, format!("refused: {e}")),
            Called::Ok(checks) => {
                let failed: Vec<_> = checks
                    .iter()
                    .filter(|c| c.status == CheckStatus::Fail)
                    .collect();
                if failed.is_empty() {
                    (
                        Status::Fail,
                        "preflight accepted a root marked unsupported: a plugin must refuse a family it \
                         does not serve with a failing check that says why"
                            .into(),
                    )
                } else if failed.iter().any(|c| c.message.trim().is_empty()) {
                    (
                        Status::Fail,
                        "preflight refused the root with a check that gives no reason".into(),
                    )
                } else {
                    let reasons: Vec<String> = failed
                        .iter()
                        .map(|c| format!("{}: {}", c.name, c.message))
                        .collect();
                    (Status::Pass, format!("refused: {}", reasons.join("; ")))
                }
            }
            Called::HostStopped(e) => (
                Status::Fail,
                format!("the host stopped preflight instead of the plugin refusing: {e}"),
            ),
        };
        self.push(
            &root.name,
            name,
            "preflight-refuses",
            status,
            message,
            seconds,
        );
        Ok(())
    }

    fn supported(&mut self, root: &Root, case: &Case, dir: &Path) -> Result<()> {
        let name = case_name(case).to_owned();
        let ignore = &self.kit.ignore;
        let host = self.host_for(dir)?;
        let skip_rest = |t: &mut Self, from: &[&str], why: &str| {
            for check in from {
                t.push(&root.name, &name, check, Status::Skip, why.to_owned(), 0.0);
            }
        };
        const AFTER_PREFLIGHT: [&str; 5] = [
            "dry-run-changes-nothing",
            "run",
            "outputs-match-schema",
            "idempotent",
            "headroom",
        ];

        // Preflight (as before a dry run), then the dry run, on one snapshot.
        let first_run = self.report.runs.len();
        let before = Snapshot::of(dir, ignore)?;
        let started = Instant::now();
        let pre = self.preflight(&host, case, true);
        let seconds = started.elapsed().as_secs_f64();
        match pre {
            Called::Ok(checks) => {
                let failed: Vec<String> = checks
                    .iter()
                    .filter(|c| c.status == CheckStatus::Fail)
                    .map(|c| format!("{}: {}", c.name, c.message))
                    .collect();
                if !failed.is_empty() {
                    self.push(
                        &root.name,
                        &name,
                        "preflight",
                        Status::Fail,
                        format!("refused a supported root: {}", failed.join("; ")),
                        seconds,
                    );
                    skip_rest(self, &AFTER_PREFLIGHT, "preflight refused the root");
                    return Ok(());
                }
                let shown: Vec<String> = checks
                    .iter()
                    .map(|c| {
                        let s = if c.status == CheckStatus::Warn {
                            "warn"
                        } else {
                            "pass"
                        };
                        format!("{s} {}: {}", c.name, c.message)
                    })
                    .collect();
                let message = if shown.is_empty() {
                    "no checks".to_owned()
                } else {
                    shown.join("; ")
                };
                self.push(
                    &root.name,
                    &name,
                    "preflight",
                    Status::Pass,
                    message,
                    seconds,
                );
            }
            Called::PluginError(e) | Called::HostStopped(e) => {
                self.push(&root.name, &name, "preflight", Status::Fail, e, seconds);
                skip_rest(self, &AFTER_PREFLIGHT, "preflight failed");
                return Ok(());
            }
        }

        let started = Instant::now();
        let dry = self.run_once(&host, root, case, "dry-run", true);
        let seconds = started.elapsed().as_secs_f64();
        let changes = before.changes(&Snapshot::of(dir, ignore)?);
        let (status, message) = match dry {
            Called::Ok(o) if changes.is_empty() && !o.changed => (
                Status::Pass,
                format!("root unchanged ({} entries): {}", before.len(), o.message),
            ),
            Called::Ok(_) if !changes.is_empty() => (
                Status::Fail,
                format!("the dry run changed the root: {}", list(&changes)),
            ),
            Called::Ok(_) => (Status::Fail, "the dry run reported a change".into()),
            Called::PluginError(e) | Called::HostStopped(e) => {
                (Status::Fail, format!("the dry run failed: {e}"))
            }
        };
        self.push(
            &root.name,
            &name,
            "dry-run-changes-nothing",
            status,
            message,
            seconds,
        );

        // The run, after its own preflight as the agent does it.
        let started = Instant::now();
        let first = self.preflight_then_run(
            &host,
            root,
            case,
            "run",
            "preflight refused the run after accepting the dry run",
        );
        let seconds = started.elapsed().as_secs_f64();
        let after = Snapshot::of(dir, ignore)?;
        let changes = before.changes(&after);
        self.used_by_changes(&changes);
        let outcome = match first {
            Called::Ok(o) => {
                self.push(
                    &root.name,
                    &name,
                    "run",
                    Status::Pass,
                    format!(
                        "{}; {} path(s) changed: {}",
                        if o.changed { "changed" } else { "unchanged" },
                        changes.len(),
                        o.message
                    ),
                    seconds,
                );
                o
            }
            Called::PluginError(e) | Called::HostStopped(e) => {
                self.push(&root.name, &name, "run", Status::Fail, e, seconds);
                skip_rest(
                    self,
                    &["outputs-match-schema", "idempotent", "headroom"],
                    "the run failed",
                );
                return Ok(());
            }
        };

        match &case.outputs_schema {
            Some(schema) => {
                let outputs: serde_json::Map<String, serde_json::Value> = outcome
                    .outputs
                    .iter()
                    .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                    .collect();
                let (status, message) = match bosun_host::validate_json(
                    &schema.to_string(),
                    &serde_json::Value::Object(outputs),
                ) {
                    Ok(()) => (
                        Status::Pass,
                        format!("{} output(s) match", outcome.outputs.len()),
                    ),
                    Err(e) => (Status::Fail, e),
                };
                self.push(
                    &root.name,
                    &name,
                    "outputs-match-schema",
                    status,
                    message,
                    0.0,
                );
            }
            None => self.push(
                &root.name,
                &name,
                "outputs-match-schema",
                Status::Skip,
                "the case declares no outputs schema".into(),
                0.0,
            ),
        }

        let idempotent = self
            .plugin
            .metadata()
            .actions
            .iter()
            .any(|a| a.name == case.action && a.idempotent);
        if idempotent {
            let started = Instant::now();
            let again = self.preflight_then_run(
                &host,
                root,
                case,
                "again",
                "preflight refused the second run on the root the first left",
            );
            let seconds = started.elapsed().as_secs_f64();
            let changes = after.changes(&Snapshot::of(dir, ignore)?);
            self.used_by_changes(&changes);
            let (status, message) = match again {
                Called::Ok(o) if !o.changed && changes.is_empty() => (
                    Status::Pass,
                    format!("the second run changed nothing: {}", o.message),
                ),
                Called::Ok(o) if case.changes_every_run && changes.is_empty() => (
                    Status::Pass,
                    format!(
                        "the second run left the root as the first did (it reports a change on every run, \
                         as the case declares): {}",
                        o.message
                    ),
                ),
                Called::Ok(o) if o.changed => (
                    Status::Fail,
                    format!(
                        "declared idempotent, but the second run reported a change: {}",
                        o.message
                    ),
                ),
                Called::Ok(_) => (
                    Status::Fail,
                    format!(
                        "declared idempotent, but the second run changed the root: {}",
                        list(&changes)
                    ),
                ),
                Called::PluginError(e) | Called::HostStopped(e) => {
                    (Status::Fail, format!("the second run failed: {e}"))
                }
            };
            self.push(&root.name, &name, "idempotent", status, message, seconds);
        } else {
            self.push(
                &root.name,
                &name,
                "idempotent",
                Status::Skip,
                format!("`{}` is not declared idempotent", case.action),
                0.0,
            );
        }

        self.headroom(root, &name, first_run);
        Ok(())
    }

    /// A filesystem grant the plugin may write is used when a run changed a path beneath
    /// it (granted commands write there under the kernel's rules, unseen by the host).
    fn used_by_changes(&mut self, changes: &[Change]) {
        for g in &self.kit.grants.filesystem {
            if g.access == Access::ReadWrite
                && changes.iter().any(|c| tree::beneath(c.path(), &g.path))
            {
                self.used.insert(GrantUse::Filesystem(g.path.clone()));
            }
        }
    }

    /// Judges the runs of one case on one root: `self.report.runs[first..]`.
    fn headroom(&mut self, root: &Root, case: &str, first: usize) {
        let runs = &self.report.runs[first..];
        let time = runs.iter().map(|r| r.seconds).fold(0.0_f64, f64::max);
        let memory = runs.iter().map(|r| r.memory_bytes).max().unwrap_or(0);
        let deadline = self.kit.deadline.as_secs_f64();
        let limit = self.kit.host.limits.max_memory_bytes;
        let time_share = time / deadline;
        let memory_share = memory as f64 / limit as f64;
        let message = format!(
            "longest run {time:.2} s of the {deadline:.0} s deadline ({:.1}%); memory {:.1} MiB of {:.0} MiB ({:.1}%)",
            time_share * 100.0,
            memory as f64 / 1048576.0,
            limit as f64 / 1048576.0,
            memory_share * 100.0
        );
        let status = if time_share <= self.kit.max_use && memory_share <= self.kit.max_use {
            Status::Pass
        } else {
            Status::Fail
        };
        let message = if status == Status::Fail {
            format!(
                "{message}: more than {:.0}% of a limit; make the action cheaper or ask for a longer deadline",
                self.kit.max_use * 100.0
            )
        } else {
            message
        };
        self.push(&root.name, case, "headroom", status, message, 0.0);
    }

    fn grants(&mut self) {
        let g = &self.kit.grants;
        let mut out = Vec::new();
        for f in &g.filesystem {
            out.push(GrantResult {
                grant: format!("filesystem {} ({:?})", f.path, f.access),
                used: self.used.contains(&GrantUse::Filesystem(f.path.clone())),
            });
        }
        for (i, e) in g.exec.iter().enumerate() {
            if e.args.is_empty() {
                out.push(GrantResult {
                    grant: format!("exec {} (no arguments)", e.command),
                    used: self.used.contains(&GrantUse::Exec {
                        grant: i,
                        pattern: None,
                    }),
                });
            }
            for (j, pattern) in e.args.iter().enumerate() {
                out.push(GrantResult {
                    grant: format!(
                        "exec {} {}{}",
                        e.command,
                        pattern.join(" "),
                        if e.dry_run { " (dryRun)" } else { "" }
                    ),
                    used: self.used.contains(&GrantUse::Exec {
                        grant: i,
                        pattern: Some(j),
                    }),
                });
            }
        }
        for s in &g.services {
            for a in &s.actions {
                out.push(GrantResult {
                    grant: format!("service {} {}", a.as_str(), s.unit),
                    used: self.used.contains(&GrantUse::Service {
                        unit: s.unit.clone(),
                        action: a.as_str().to_owned(),
                    }),
                });
            }
        }
        for (i, h) in g.http.iter().enumerate() {
            out.push(GrantResult {
                grant: format!("http {}", h.host),
                used: self.used.contains(&GrantUse::Http { grant: i }),
            });
        }
        self.report.grants = out;
    }
}

fn case_name(case: &Case) -> &str {
    if case.name.is_empty() {
        &case.action
    } else {
        &case.name
    }
}

/// The first changes, then how many more.
fn list(changes: &[Change]) -> String {
    const SHOWN: usize = 8;
    let mut s: Vec<String> = changes
        .iter()
        .take(SHOWN)
        .map(ToString::to_string)
        .collect();
    if changes.len() > SHOWN {
        s.push(format!("and {} more", changes.len() - SHOWN));
    }
    s.join(", ")
}
