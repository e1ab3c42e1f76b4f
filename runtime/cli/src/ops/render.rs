//! Text rendering of an Operation and its NodeTasks for `status` and `logs`.
//!
//! Everything here is a pure function of the resources, the current time and a [`Style`]:
//! no I/O, so the output is unit-tested as plain strings. The layout is a header (phase,
//! mode, progress, age, paused), then a tree of the frozen plan's groups, their nodes and
//! each node's steps. A task that waits for a person (blocked, awaiting approval) carries
//! the reason and the exact command that moves it on.
//!
//! `status` and `lifecycle` (about 120 and 110 lines) are kept whole on purpose: each prints
//! one view top to bottom, in the order a person reads it.

use std::fmt::Write as _;

use bosun_api::node_task::{
    NodeFacts, NodeFactsReport, NodeTask, NodeTaskPhase, NodeTaskStatus, StepPhase, StepStatus,
};
use bosun_api::operation::{CertificateName, Operation, OperationPhase, RunsOn};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// How text is decorated. Colours are ANSI escapes, used only when the caller decided the
/// output is a terminal and `NO_COLOR` is not set (see [`Style::detect`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Style {
    pub color: bool,
}

impl Style {
    /// Plain text, for pipes, files and tests.
    #[cfg_attr(not(test), allow(dead_code))]
    pub const PLAIN: Style = Style { color: false };

    /// Colour when `is_terminal` and the `NO_COLOR` convention (<https://no-color.org>: set
    /// and not empty) does not forbid it.
    pub fn detect(is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> Style {
        Style {
            color: is_terminal && no_color.is_none_or(|v| v.is_empty()),
        }
    }

    fn paint(self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }
    fn bold(self, t: &str) -> String {
        self.paint("1", t)
    }
    fn dim(self, t: &str) -> String {
        self.paint("2", t)
    }
    fn green(self, t: &str) -> String {
        self.paint("32", t)
    }
    fn red(self, t: &str) -> String {
        self.paint("31", t)
    }
    fn yellow(self, t: &str) -> String {
        self.paint("33", t)
    }
    fn cyan(self, t: &str) -> String {
        self.paint("36", t)
    }
}

/// The symbol and colour of a task phase.
fn task_mark(phase: NodeTaskPhase, s: Style) -> String {
    match phase {
        NodeTaskPhase::Pending => s.dim("·"),
        NodeTaskPhase::AwaitingApproval => s.yellow("?"),
        NodeTaskPhase::Running => s.cyan("▶"),
        NodeTaskPhase::Blocked => s.red("✗"),
        NodeTaskPhase::Succeeded => s.green("✓"),
        NodeTaskPhase::Skipped => s.yellow("↷"),
        NodeTaskPhase::Invalid => s.red("!"),
    }
}

fn task_phase_text(phase: NodeTaskPhase, s: Style) -> String {
    let text = format!("{phase:?}");
    match phase {
        NodeTaskPhase::Pending => s.dim(&text),
        NodeTaskPhase::AwaitingApproval | NodeTaskPhase::Skipped => s.yellow(&text),
        NodeTaskPhase::Running => s.cyan(&text),
        NodeTaskPhase::Blocked | NodeTaskPhase::Invalid => s.red(&text),
        NodeTaskPhase::Succeeded => s.green(&text),
    }
}

fn step_mark(phase: StepPhase, s: Style) -> String {
    match phase {
        StepPhase::Pending => s.dim("·"),
        StepPhase::Running => s.cyan("▶"),
        StepPhase::Succeeded => s.green("✓"),
        StepPhase::Failed => s.red("✗"),
        StepPhase::Skipped => s.yellow("↷"),
    }
}

fn operation_phase_text(phase: OperationPhase, s: Style) -> String {
    let text = format!("{phase:?}");
    match phase {
        OperationPhase::Pending => s.dim(&text),
        OperationPhase::Running => s.cyan(&text),
        OperationPhase::Paused | OperationPhase::AwaitingApproval => s.yellow(&text),
        OperationPhase::Blocked | OperationPhase::Failed => s.red(&text),
        OperationPhase::Succeeded => s.green(&text),
    }
}

/// A duration for people: `350ms`, `2.4s`, `42s`, `3m05s`, `2h07m`, `3d04h`. Negative
/// durations (clock skew between the writer and this machine) show as `0ms`.
pub fn human_duration(d: SignedDuration) -> String {
    let ms = d.as_millis().max(0);
    let secs = ms / 1000;
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 10_000 {
        format!("{}.{}s", secs, (ms % 1000) / 100)
    } else if secs < 60 {
        format!("{secs}s")
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else if secs < 86_400 {
        format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60)
    } else {
        format!("{}d{:02}h", secs / 86_400, (secs % 86_400) / 3600)
    }
}

/// How long a step ran: finished − started, or now − started while it runs. A Pending step
/// has no duration: times it still carries are an earlier attempt's (a retry sets the failed
/// step back to Pending and leaves its times until the agent starts it again).
fn step_duration(step: &StepStatus, now: Timestamp) -> Option<String> {
    let start = step.started_at.as_ref()?.0;
    match (step.phase, &step.finished_at) {
        (StepPhase::Pending, _) => None,
        (StepPhase::Running, _) => Some(format!(
            "{} so far",
            human_duration(now.duration_since(start))
        )),
        (_, Some(end)) => Some(human_duration(end.0.duration_since(start))),
        (_, None) => None,
    }
}

/// How long a task ran: from its first step's start to its last step's end (or now, while
/// it is not finished). Pending steps do not count (their times are an earlier attempt's),
/// so a task just retried at its first step shows no time until that step starts again.
fn task_duration(task: &NodeTask, now: Timestamp) -> Option<String> {
    let status = task.status.as_ref()?;
    let ran = || {
        status
            .steps
            .iter()
            .filter(|s| s.phase != StepPhase::Pending)
    };
    let start = ran()
        .filter_map(|s| s.started_at.as_ref())
        .map(|t| t.0)
        .min()?;
    if status.phase.is_finished() || status.phase == NodeTaskPhase::Blocked {
        let end = ran()
            .filter_map(|s| s.finished_at.as_ref())
            .map(|t| t.0)
            .max()?;
        Some(human_duration(end.duration_since(start)))
    } else {
        Some(format!(
            "{} so far",
            human_duration(now.duration_since(start))
        ))
    }
}

/// One line saying what kind of work the Operation does.
fn kind_line(op: &Operation) -> String {
    let spec = &op.spec;
    if let Some(u) = &spec.upgrade {
        let packages: Vec<&str> = u.packages.iter().map(|p| p.as_str()).collect();
        let packages = if packages.is_empty() {
            "packages left alone".to_owned()
        } else {
            format!("packages {}", packages.join(", "))
        };
        format!("upgrade to {} ({packages})", u.kubernetes_version)
    } else if let Some(r) = &spec.renew_certificates {
        let names: Vec<String> = r
            .certificates
            .iter()
            .map(|c| match c {
                CertificateName::All => "all".to_owned(),
                other => serde_json::to_value(other)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_else(|| format!("{other:?}")),
            })
            .collect();
        let mut line = format!("renew certificates: {}", names.join(", "));
        if let Some(before) = &r.renew_before {
            let _ = write!(line, " (only those expiring within {before})");
        }
        line
    } else if spec.reboot.is_some() {
        "reboot: cordon, drain, reboot, wait for the new boot and Ready, uncordon".to_owned()
    } else if let Some(c) = &spec.custom {
        let groups: Vec<&str> = c.groups.iter().map(|g| g.name.as_str()).collect();
        format!("custom: groups {}", groups.join(" → "))
    } else {
        "no kind of work set".to_owned()
    }
}

/// The status screen of one Operation: header, then groups → nodes → steps.
///
/// Groups and nodes come from the frozen plan (`status.plan`); tasks are matched to nodes
/// by `spec.nodeName`. Before the plan is frozen, the tasks found are listed by their
/// `spec.group`. `now` is only used for the age and for durations of running steps.
pub fn status(op: &Operation, tasks: &[NodeTask], now: Timestamp, s: Style) -> String {
    let name = op.metadata.name.as_deref().unwrap_or("?");
    let status = op.status.clone().unwrap_or_default();
    let mut out = String::new();

    // --- header
    let progress = status.progress.clone().unwrap_or_else(|| {
        let finished = tasks
            .iter()
            .filter(|t| t.status.as_ref().is_some_and(|s| s.phase.is_finished()))
            .count();
        format!("{finished}/{}", tasks.len())
    });
    let age = op
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| human_duration(now.duration_since(t.0)))
        .unwrap_or_else(|| "?".to_owned());
    let _ = write!(
        out,
        "{} {}  {}  {} nodes finished  mode {:?}  age {}",
        s.bold("Operation"),
        s.bold(name),
        operation_phase_text(status.phase, s),
        progress,
        op.spec.execution_mode,
        age
    );
    if op.spec.paused {
        let _ = write!(out, "  {}", s.yellow("PAUSED"));
    }
    out.push('\n');
    let _ = writeln!(out, "  {}", kind_line(op));
    let pause_line = op.spec.paused && !status.phase.is_finished();
    // The controller's own message for a paused Operation says the same as the line below,
    // which adds the command that resumes it: show that one only.
    let repeats_pause = |m: &str| pause_line && m.starts_with("paused:");
    if let Some(message) = status
        .message
        .as_deref()
        .filter(|m| !m.is_empty() && !repeats_pause(m))
    {
        let _ = writeln!(out, "  {message}");
    }
    if pause_line {
        let _ = writeln!(
            out,
            "  paused: running steps finish, nothing new starts. Resume: {}",
            s.bold(&format!("kubectl bosun resume {name}"))
        );
    }

    // --- groups → nodes
    let groups: Vec<(String, Vec<String>, Option<u32>)> = match &status.plan {
        Some(plan) => plan
            .groups
            .iter()
            .map(|g| (g.name.clone(), g.nodes.clone(), Some(g.max_parallel)))
            .collect(),
        None => {
            let _ = writeln!(
                out,
                "  {}",
                s.dim("not planned yet (the controller freezes the plan when it picks the Operation up; is bosun-controller running?)")
            );
            let mut groups: Vec<(String, Vec<String>, Option<u32>)> = Vec::new();
            for t in tasks {
                match groups.iter_mut().find(|g| g.0 == t.spec.group) {
                    Some(g) => g.1.push(t.spec.node_name.clone()),
                    None => {
                        groups.push((t.spec.group.clone(), vec![t.spec.node_name.clone()], None))
                    }
                }
            }
            groups
        }
    };
    for (group, nodes, max_parallel) in &groups {
        out.push('\n');
        let finished = nodes
            .iter()
            .filter(|n| {
                task_for(tasks, n)
                    .and_then(|t| t.status.as_ref())
                    .is_some_and(|st| st.phase.is_finished())
            })
            .count();
        let _ = write!(
            out,
            "{}  {finished}/{} finished",
            s.bold(group),
            nodes.len()
        );
        if let Some(m) = max_parallel {
            let _ = write!(out, "  {}", s.dim(&format!("(up to {m} at a time)")));
        }
        out.push('\n');
        if nodes.is_empty() {
            let _ = writeln!(out, "└─ {}", s.dim("no node matched this group"));
        }
        for (i, node) in nodes.iter().enumerate() {
            let last = i + 1 == nodes.len();
            let (branch, cont) = if last {
                ("└─ ", "   ")
            } else {
                ("├─ ", "│  ")
            };
            match task_for(tasks, node) {
                None => {
                    let _ = writeln!(
                        out,
                        "{branch}{} {node}  {}",
                        s.dim("·"),
                        s.dim("no NodeTask yet")
                    );
                }
                Some(task) => render_task(&mut out, name, op, task, branch, cont, now, s),
            }
        }
    }
    out
}

fn task_for<'a>(tasks: &'a [NodeTask], node: &str) -> Option<&'a NodeTask> {
    tasks.iter().find(|t| t.spec.node_name == node)
}

/// Most output lines shown under one step; `kubectl bosun logs` and `-o yaml` show all.
const MAX_OUTPUT_LINES: usize = 16;

/// A succeeded step's outputs, one per line. A `NAME.before` / `NAME.after` pair (what the
/// certs plugin reports per certificate, for example) reads as `NAME: before → after`.
fn output_lines(outputs: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    let mut lines = Vec::new();
    for (key, value) in outputs {
        if let Some(name) = key.strip_suffix(".before")
            && let Some(after) = outputs.get(&format!("{name}.after"))
        {
            lines.push(format!("{name}: {value} → {after}"));
        } else if let Some(name) = key.strip_suffix(".after")
            && outputs.contains_key(&format!("{name}.before"))
        {
            // Shown with its `.before`.
        } else {
            lines.push(format!("{key}: {value}"));
        }
    }
    if lines.len() > MAX_OUTPUT_LINES {
        let more = lines.len() - (MAX_OUTPUT_LINES - 1);
        lines.truncate(MAX_OUTPUT_LINES - 1);
        lines.push(format!("… {more} more outputs (-o yaml shows all)"));
    }
    lines
}

#[allow(clippy::too_many_arguments)]
fn render_task(
    out: &mut String,
    op_name: &str,
    op: &Operation,
    task: &NodeTask,
    branch: &str,
    cont: &str,
    now: Timestamp,
    s: Style,
) {
    let status = task.status.clone().unwrap_or_default();
    task_line(out, task, &status, branch, now, s);
    if let Some(line) = status
        .node_facts
        .as_ref()
        .and_then(|f| facts_line(f, now, s))
    {
        let _ = writeln!(out, "{cont}{line}");
    }
    // Steps: shown once the task has started; a task still waiting its turn gets one line.
    let started = status.steps.iter().any(|st| st.phase != StepPhase::Pending)
        || !matches!(
            status.phase,
            NodeTaskPhase::Pending | NodeTaskPhase::AwaitingApproval
        );
    if started {
        step_lines(out, task, &status, cont, now, s);
    } else {
        let n = task.spec.steps.len();
        let _ = writeln!(
            out,
            "{cont}{}",
            s.dim(&format!(
                "{n} step{} waiting: {}",
                if n == 1 { "" } else { "s" },
                task.spec
                    .steps
                    .iter()
                    .map(|x| x.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        );
    }
    task_hints(out, op_name, op, task, &status, cont, s);
}

/// The task's first line: its mark, node, phase, block reason, attempt, time and dry run.
fn task_line(
    out: &mut String,
    task: &NodeTask,
    status: &NodeTaskStatus,
    branch: &str,
    now: Timestamp,
    s: Style,
) {
    let _ = write!(
        out,
        "{branch}{} {}  {}",
        task_mark(status.phase, s),
        s.bold(&task.spec.node_name),
        task_phase_text(status.phase, s)
    );
    if let Some(reason) = status.reason {
        let _ = write!(out, " ({reason:?})");
    }
    if status.attempts > 1 {
        let _ = write!(out, "  attempt {}", status.attempts);
    }
    if let Some(d) = task_duration(task, now) {
        let _ = write!(out, "  {}", s.dim(&d));
    }
    if task.spec.dry_run {
        let _ = write!(out, "  {}", s.dim("dry run"));
    }
    out.push('\n');
}

/// One line per step of a started task (phase, time, attempt, changed, where it runs),
/// with a succeeded step's outputs and a failed step's error under it.
fn step_lines(
    out: &mut String,
    task: &NodeTask,
    status: &NodeTaskStatus,
    cont: &str,
    now: Timestamp,
    s: Style,
) {
    let width = task
        .spec
        .steps
        .iter()
        .map(|st| st.name.len())
        .max()
        .unwrap_or(0);
    for (i, step) in task.spec.steps.iter().enumerate() {
        let last = i + 1 == task.spec.steps.len();
        let sb = if last { "└─ " } else { "├─ " };
        let sc = if last { "   " } else { "│  " };
        let st = status.steps.iter().find(|x| x.name == step.name);
        let phase = st.map(|x| x.phase).unwrap_or_default();
        let _ = write!(
            out,
            "{cont}{sb}{} {:<width$}  {phase:?}",
            step_mark(phase, s),
            step.name
        );
        if let Some(st) = st {
            if let Some(d) = step_duration(st, now) {
                let _ = write!(out, "  {d}");
            }
            if st.attempts > 1 {
                let _ = write!(out, "  attempt {}", st.attempts);
            }
            if st.changed == Some(true) {
                let _ = write!(out, "  {}", s.dim("changed"));
            }
        }
        if step.runs_on == RunsOn::Controller {
            let _ = write!(out, "  {}", s.dim("[controller]"));
        }
        out.push('\n');
        if let Some(st) = st.filter(|x| x.phase == StepPhase::Succeeded) {
            for line in output_lines(&st.outputs) {
                let _ = writeln!(out, "{cont}{sc}  {}", s.dim(&line));
            }
        }
        if let Some(err) = st.and_then(|x| x.error.as_ref())
            && phase == StepPhase::Failed
        {
            let _ = writeln!(
                out,
                "{cont}{sc}  {} {}",
                s.red(&format!("{}:", err.code)),
                err.message
            );
        }
    }
}

/// What a person can do about the task: retry or skip a blocked one, approve one waiting,
/// and the message of one held by another Operation, invalid or skipped.
fn task_hints(
    out: &mut String,
    op_name: &str,
    op: &Operation,
    task: &NodeTask,
    status: &NodeTaskStatus,
    cont: &str,
    s: Style,
) {
    let node = &task.spec.node_name;
    let hint = |out: &mut String, text: &str| {
        let _ = writeln!(out, "{cont}{text}");
    };
    match status.phase {
        NodeTaskPhase::Blocked => {
            // The failed step's error is already shown under the step: repeat the task's
            // message only when it says more than that.
            let step_errors: Vec<&str> = status
                .steps
                .iter()
                .filter(|x| x.phase == StepPhase::Failed)
                .filter_map(|x| x.error.as_ref().map(|e| e.message.as_str()))
                .collect();
            if let Some(message) = status
                .message
                .as_deref()
                .filter(|m| !m.is_empty() && !step_errors.iter().any(|e| m.contains(e)))
            {
                hint(out, &s.red(&format!("blocked: {message}")));
            }
            match task.spec.recovery {
                Some(r) => hint(
                    out,
                    &format!("recovery {r:?} requested; waiting for the controller to act on it"),
                ),
                None => {
                    hint(
                        out,
                        &format!(
                            "fix the cause, then run the step again: {}",
                            s.bold(&format!("kubectl bosun retry {op_name} {node}"))
                        ),
                    );
                    hint(
                        out,
                        &format!(
                            "or leave the node as it is and move on: {}",
                            s.bold(&format!("kubectl bosun skip {op_name} {node}"))
                        ),
                    );
                }
            }
        }
        NodeTaskPhase::AwaitingApproval => {
            if task.spec.approve {
                hint(out, "approved; starting");
            } else {
                hint(
                    out,
                    &format!(
                        "waiting for approval: {}",
                        s.bold(&format!("kubectl bosun approve {op_name} {node}"))
                    ),
                );
            }
        }
        NodeTaskPhase::Pending
            if task.spec.approve
                && op.spec.execution_mode == bosun_api::ExecutionMode::Controlled =>
        {
            hint(
                out,
                &s.dim("approved in advance; starts when its turn comes"),
            );
        }
        // Another Operation holds the node (the controller's NodeHeld condition).
        NodeTaskPhase::Pending
            if status
                .conditions
                .iter()
                .any(|c| c.type_ == "NodeHeld" && c.status == "True") =>
        {
            if let Some(message) = status.message.as_deref().filter(|m| !m.is_empty()) {
                hint(out, &s.yellow(message));
            }
        }
        NodeTaskPhase::Invalid | NodeTaskPhase::Skipped => {
            if let Some(message) = status.message.as_deref().filter(|m| !m.is_empty()) {
                hint(out, &s.dim(message));
            }
        }
        _ => {}
    }
}

/// One compact line of what the node's agent reported (`status.nodeFacts`): the kubelet's,
/// kubeadm's and (when installed) kubectl's versions and how soon the first certificate expires, from the latest
/// report (`after` once the task finished, else `before`); a value that changed during the
/// task reads `before → after`. `None` when there is nothing to show. `-o yaml` has every
/// fact and certificate.
fn facts_line(report: &NodeFactsReport, now: Timestamp, s: Style) -> Option<String> {
    let latest = report.after.as_ref().or(report.before.as_ref())?;
    let mut parts = Vec::new();
    let version = |name: &str, get: fn(&NodeFacts) -> Option<&String>| -> Option<String> {
        let after = get(latest)?;
        match report.before.as_ref().and_then(get) {
            Some(before) if report.after.is_some() && before != after => {
                Some(format!("{name} {before} → {after}"))
            }
            _ => Some(format!("{name} {after}")),
        }
    };
    parts.extend(version("kubelet", |f| f.kubelet_version.as_ref()));
    parts.extend(version("kubeadm", |f| f.kubeadm_version.as_ref()));
    parts.extend(version("kubectl", |f| f.kubectl_version.as_ref()));
    let earliest = |f: &NodeFacts| f.certificates.iter().min_by_key(|c| c.not_after.0).cloned();
    if let Some(first) = earliest(latest) {
        let left = first.not_after.0.duration_since(now);
        let when = if left.is_negative() {
            s.red(&format!("a certificate EXPIRED {} ago", days(-left)))
        } else {
            let previous = report
                .before
                .as_ref()
                .filter(|_| report.after.is_some())
                .and_then(earliest)
                .filter(|b| b.not_after != first.not_after)
                .map(|b| format!("{} → ", days(b.not_after.0.duration_since(now))));
            format!(
                "certs expire in {}{}",
                previous.unwrap_or_default(),
                days(left)
            )
        };
        parts.push(format!("{when} (earliest: {})", first.name));
    }
    (!parts.is_empty()).then(|| s.dim(&parts.join(" · ")))
}

/// Whole days for certificate lifetimes (`364d`); under a day, [`human_duration`].
fn days(d: SignedDuration) -> String {
    let secs = d.as_secs();
    if secs >= 86_400 {
        format!("{}d", secs / 86_400)
    } else {
        human_duration(d)
    }
}

/// When the Operation is Blocked and no blocked task has a recovery requested yet (so it
/// stays Blocked until someone acts): the lines a watch ends with, naming why and the
/// commands that resolve it. `None` otherwise (not blocked, or the controller is about to
/// act on a requested recovery, so watching on makes sense).
pub fn blocked_summary(op: &Operation, tasks: &[NodeTask]) -> Option<String> {
    let status = op.status.as_ref()?;
    if status.phase != OperationPhase::Blocked {
        return None;
    }
    let name = op.metadata.name.as_deref().unwrap_or("?");
    let blocked: Vec<&NodeTask> = tasks
        .iter()
        .filter(|t| {
            t.status
                .as_ref()
                .is_some_and(|s| s.phase == NodeTaskPhase::Blocked)
        })
        .collect();
    if blocked.iter().any(|t| t.spec.recovery.is_some()) {
        return None;
    }
    let reason = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Blocked" && c.status == "True")
        .map(|c| c.reason.clone());
    let mut out = format!(
        "Operation {name} is Blocked{}: {}\n",
        reason.map(|r| format!(" ({r})")).unwrap_or_default(),
        status
            .message
            .as_deref()
            .unwrap_or("a node task is blocked")
    );
    for t in &blocked {
        let node = &t.spec.node_name;
        let _ = writeln!(
            out,
            "  {node}: fix the cause, then `kubectl bosun retry {name} {node}`, or move on with `kubectl bosun skip {name} {node}`"
        );
    }
    if blocked.is_empty() {
        let _ = writeln!(
            out,
            "  see `kubectl bosun status {name}` and the Operation's conditions"
        );
    }
    out.push_str("The watch ends here: nothing changes until someone resolves it.\n");
    Some(out)
}

/// The log tails of a task's steps, in spec order, each under a header with its phase,
/// attempts and duration. `only` restricts it to one step. Steps that have not run say so.
pub fn logs(task: &NodeTask, only: Option<&str>, now: Timestamp) -> String {
    let status = task.status.clone().unwrap_or_default();
    let mut out = String::new();
    for step in &task.spec.steps {
        if only.is_some_and(|o| o != step.name) {
            continue;
        }
        let st = status.steps.iter().find(|x| x.name == step.name);
        let phase = st.map(|x| x.phase).unwrap_or_default();
        let _ = write!(out, "=== {} ({phase:?}", step.name);
        if let Some(st) = st {
            if st.attempts > 0 {
                let _ = write!(out, ", attempt {}", st.attempts);
            }
            if let Some(d) = step_duration(st, now) {
                let _ = write!(out, ", {d}");
            }
        }
        out.push_str(")\n");
        match st {
            None => out.push_str("(not started)\n"),
            Some(st) => {
                if step.runs_on == RunsOn::Controller && st.log_tail.is_empty() {
                    // Controller steps log into the controller's own log, not the task.
                    if let Some(m) = &st.message {
                        let _ = writeln!(out, "{m}");
                    } else {
                        out.push_str("(a controller step: see bosun-controller's log)\n");
                    }
                } else {
                    if st.log_tail.is_empty() {
                        out.push_str("(no log lines)\n");
                    }
                    for line in &st.log_tail {
                        let _ = writeln!(out, "{line}");
                    }
                    // What the plugin answered (its outcome message): often the only
                    // account of a step that logged nothing. An error says it below.
                    if let Some(m) = st.message.as_deref().filter(|m| {
                        !m.is_empty() && st.error.as_ref().is_none_or(|e| e.message != *m)
                    }) {
                        let _ = writeln!(out, "result: {m}");
                    }
                }
                for check in &st.preflight {
                    let _ = writeln!(
                        out,
                        "preflight {}: {:?} {}",
                        check.name, check.status, check.message
                    );
                }
                if let Some(err) = &st.error {
                    let _ = writeln!(
                        out,
                        "error {}: {}{}",
                        err.code,
                        err.message,
                        if err.retryable { " (retryable)" } else { "" }
                    );
                }
            }
        }
    }
    out
}

/// The ClusterLifecycle at a glance, as the same kind of tree as an Operation: desired and
/// observed, what it waits for, then the Operations it generated (newest first) with their
/// phase and progress.
pub fn lifecycle(
    cl: &bosun_api::ClusterLifecycle,
    generated: &[Operation],
    reports: &[bosun_api::NodeReport],
    now: Timestamp,
    s: Style,
) -> String {
    let status = cl.status.clone().unwrap_or_default();
    let condition = |t: &str| status.conditions.iter().find(|c| c.type_ == t);
    let mut out = String::new();
    let sync = match condition("InSync") {
        Some(c) if c.status == "True" => s.green("InSync"),
        Some(c) => s.yellow(&format!("not in sync ({})", c.reason)),
        None => s.dim("not reconciled yet (is bosun-controller running with --lifecycle?)"),
    };
    let _ = write!(
        out,
        "{} {}  {}  desired {}",
        s.bold("ClusterLifecycle"),
        s.bold(cl.metadata.name.as_deref().unwrap_or("?")),
        sync,
        cl.spec.kubernetes_version
    );
    if cl.spec.paused {
        let _ = write!(out, "  {}", s.yellow("PAUSED"));
    }
    out.push('\n');
    if let Some(summary) = status.summary.as_deref() {
        let _ = writeln!(out, "  {summary}");
    }
    if let Some(w) = status.waiting.as_deref() {
        let why = condition("Progressing")
            .map(|c| c.message.clone())
            .filter(|m| !m.is_empty())
            .unwrap_or_default();
        let _ = writeln!(out, "  {} {why}", s.yellow(&format!("waiting: {w}")));
    }
    let v = &status.versions;
    let _ = writeln!(
        out,
        "  versions: {}/{} nodes at {}; lowest {}, highest {}",
        v.nodes_at_desired,
        v.nodes,
        cl.spec.kubernetes_version,
        v.lowest.as_deref().unwrap_or("?"),
        v.highest.as_deref().unwrap_or("?")
    );
    let c = &status.certificates;
    let expiry = match (&c.earliest_expiry, &c.earliest) {
        (Some(at), Some(which)) => {
            let left = at.0.duration_since(now);
            if left.is_negative() {
                s.red(&format!(
                    "earliest {which} EXPIRED at {} ({} ago)",
                    at.0,
                    human_duration(-left)
                ))
            } else {
                format!(
                    "earliest {which} expires {} (in {})",
                    at.0,
                    human_duration(left)
                )
            }
        }
        _ => "no control-plane node has reported its certificates".to_owned(),
    };
    let renewal = match (&c.next_renewal, cl.spec.certificates.auto_renew) {
        (Some(at), true) => format!("next renewal {}", at.0),
        _ => "autoRenew off".to_owned(),
    };
    let _ = writeln!(
        out,
        "  certificates: {expiry}; {renewal}; rotation {} (handled {})",
        cl.spec.certificates.rotation, c.handled_rotation
    );
    reboots(&mut out, &status.reboots, reports, s);
    out.push('\n');
    if status.history.is_empty() {
        let _ = writeln!(out, "  {}", s.dim("no Operation generated"));
    }
    for (i, h) in status.history.iter().enumerate() {
        let branch = if i + 1 == status.history.len() {
            "└─"
        } else {
            "├─"
        };
        let op = generated
            .iter()
            .find(|o| o.metadata.name.as_deref() == Some(&h.name));
        let state = match op {
            Some(o) => {
                let st = o.status.clone().unwrap_or_default();
                format!(
                    "{} {}",
                    operation_phase_text(st.phase, s),
                    st.progress.unwrap_or_default()
                )
            }
            None => s.dim("deleted"),
        };
        let _ = writeln!(
            out,
            "  {branch} {}  {}  {state}  {}",
            s.bold(&h.name),
            h.kind,
            s.dim(&format!(
                "{} ago: {}",
                human_duration(now.duration_since(h.created_at.0)),
                h.reason
            ))
        );
    }
    out
}

/// The ClusterLifecycle's reboot count, then each node that needs one with its NodeReport's
/// reasons (when the reports could be read).
fn reboots(
    out: &mut String,
    r: &bosun_api::lifecycle::ObservedReboots,
    reports: &[bosun_api::NodeReport],
    s: Style,
) {
    if r.nodes_reported == 0 {
        let _ = writeln!(
            out,
            "  reboots: {}",
            s.dim("no node reports whether it needs one (agents older than the check, or no report yet)")
        );
        return;
    }
    if r.required == 0 {
        let _ = writeln!(
            out,
            "  reboots: none needed ({} of the nodes reporting)",
            r.nodes_reported
        );
        return;
    }
    let _ = writeln!(
        out,
        "  reboots: {} of {} reporting node{} need{} one",
        s.yellow(&r.required.to_string()),
        r.nodes_reported,
        if r.nodes_reported == 1 { "" } else { "s" },
        if r.required == 1 { "s" } else { "" },
    );
    for node in &r.nodes {
        let why = reports
            .iter()
            .find(|n| &n.spec.node_name == node)
            .and_then(|n| n.spec.facts.reboot.as_ref())
            .map(|n| n.reasons.join("; "))
            .filter(|w| !w.is_empty())
            .unwrap_or_else(|| s.dim("(its NodeReport was not read)"));
        let _ = writeln!(out, "    {}: {why}", s.bold(node));
    }
    let more = (r.required as usize).saturating_sub(r.nodes.len());
    if more > 0 {
        let _ = writeln!(out, "    {}", s.dim(&format!("and {more} more")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bosun_api::node_task::{
        BlockReason, CheckStatus, NodeTaskSpec, NodeTaskStatus, PreflightCheck, Recovery, StepError,
    };
    use bosun_api::operation::{OperationSpec, OperationStatus, Plan, PlannedGroup, Step};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn ts(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    fn step(name: &str, controller: bool) -> Step {
        Step {
            name: name.into(),
            runs_on: if controller {
                RunsOn::Controller
            } else {
                RunsOn::Agent
            },
            plugin: (!controller).then(|| "hello".into()),
            action: if controller {
                name.into()
            } else {
                "greet".into()
            },
            params: None,
            await_new_boot: false,
        }
    }

    fn done(name: &str, start: &str, end: &str) -> StepStatus {
        StepStatus {
            name: name.into(),
            phase: StepPhase::Succeeded,
            attempts: 1,
            started_at: Some(ts(start)),
            finished_at: Some(ts(end)),
            ..Default::default()
        }
    }

    fn operation() -> Operation {
        let spec: OperationSpec = serde_json::from_value(serde_json::json!({
            "custom": {"groups": [
                {"name": "control-plane", "steps": [{"name": "greet", "plugin": "hello", "action": "greet"}]},
                {"name": "workers", "steps": [
                    {"name": "cordon", "runsOn": "controller", "action": "cordon"},
                    {"name": "greet", "plugin": "hello", "action": "greet"},
                    {"name": "uncordon", "runsOn": "controller", "action": "uncordon"}]}]},
            "rollout": {"maxUnavailable": 2}
        }))
        .unwrap();
        let mut op = Operation::new("hello-everyone", spec);
        op.metadata.creation_timestamp = Some(ts("2026-11-30T03:00:00Z"));
        op.status = Some(OperationStatus {
            phase: OperationPhase::Blocked,
            progress: Some("2/4".into()),
            message: Some("lab-worker-2: preflight failed: /etc/missing not found".into()),
            plan: Some(Plan {
                groups: vec![
                    PlannedGroup {
                        name: "control-plane".into(),
                        nodes: vec!["lab-cp-1".into()],
                        max_parallel: 1,
                        control_plane_nodes: vec!["lab-cp-1".into()],
                    },
                    PlannedGroup {
                        name: "workers".into(),
                        nodes: vec![
                            "lab-worker-1".into(),
                            "lab-worker-2".into(),
                            "lab-worker-3".into(),
                        ],
                        max_parallel: 2,
                        control_plane_nodes: vec![],
                    },
                ],
            }),
            ..Default::default()
        });
        op
    }

    fn task(node: &str, group: &str, steps: Vec<Step>, status: NodeTaskStatus) -> NodeTask {
        let mut t = NodeTask::new(
            &format!("hello-everyone-{node}"),
            NodeTaskSpec {
                operation: "hello-everyone".into(),
                node_name: node.into(),
                group: group.into(),
                steps,
                dry_run: false,
                step_timeout_seconds: None,
                approve: false,
                recovery: None,
            },
        );
        t.status = Some(status);
        t
    }

    fn worker_steps() -> Vec<Step> {
        vec![
            step("cordon", true),
            step("greet", false),
            step("uncordon", true),
        ]
    }

    fn tasks() -> Vec<NodeTask> {
        vec![
            task(
                "lab-cp-1",
                "control-plane",
                vec![step("greet", false)],
                NodeTaskStatus {
                    phase: NodeTaskPhase::Succeeded,
                    attempts: 1,
                    steps: vec![done(
                        "greet",
                        "2026-11-30T03:00:01Z",
                        "2026-11-30T03:00:01.35Z",
                    )],
                    ..Default::default()
                },
            ),
            task(
                "lab-worker-1",
                "workers",
                worker_steps(),
                NodeTaskStatus {
                    phase: NodeTaskPhase::Succeeded,
                    attempts: 1,
                    steps: vec![
                        done("cordon", "2026-11-30T03:00:02Z", "2026-11-30T03:00:02.012Z"),
                        StepStatus {
                            changed: Some(true),
                            ..done("greet", "2026-11-30T03:00:02.1Z", "2026-11-30T03:00:04.5Z")
                        },
                        done(
                            "uncordon",
                            "2026-11-30T03:00:04.6Z",
                            "2026-11-30T03:00:04.609Z",
                        ),
                    ],
                    ..Default::default()
                },
            ),
            task(
                "lab-worker-2",
                "workers",
                worker_steps(),
                NodeTaskStatus {
                    phase: NodeTaskPhase::Blocked,
                    attempts: 2,
                    reason: Some(BlockReason::PreflightFailed),
                    message: Some("step greet: preflight failed: /etc/missing not found".into()),
                    current_step: Some("greet".into()),
                    steps: vec![
                        done("cordon", "2026-11-30T03:00:02Z", "2026-11-30T03:00:02.010Z"),
                        StepStatus {
                            name: "greet".into(),
                            phase: StepPhase::Failed,
                            attempts: 2,
                            started_at: Some(ts("2026-11-30T03:00:02.1Z")),
                            finished_at: Some(ts("2026-11-30T03:00:02.3Z")),
                            log_tail: vec!["checking /etc/missing".into()],
                            preflight: vec![PreflightCheck {
                                name: "file-readable".into(),
                                status: CheckStatus::Fail,
                                message: "/etc/missing not found".into(),
                            }],
                            error: Some(StepError {
                                code: "preflight-failed".into(),
                                message: "/etc/missing not found".into(),
                                retryable: false,
                            }),
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                },
            ),
            task(
                "lab-worker-3",
                "workers",
                worker_steps(),
                NodeTaskStatus::default(),
            ),
        ]
    }

    const NOW: &str = "2026-11-30T03:01:12Z";

    #[test]
    fn blocked_operation_renders_as_a_tree_with_the_fix() {
        let got = status(&operation(), &tasks(), NOW.parse().unwrap(), Style::PLAIN);
        let want = "\
Operation hello-everyone  Blocked  2/4 nodes finished  mode Auto  age 1m12s
  custom: groups control-plane → workers
  lab-worker-2: preflight failed: /etc/missing not found

control-plane  1/1 finished  (up to 1 at a time)
└─ ✓ lab-cp-1  Succeeded  350ms
   └─ ✓ greet  Succeeded  350ms

workers  1/3 finished  (up to 2 at a time)
├─ ✓ lab-worker-1  Succeeded  2.6s
│  ├─ ✓ cordon    Succeeded  12ms  [controller]
│  ├─ ✓ greet     Succeeded  2.4s  changed
│  └─ ✓ uncordon  Succeeded  9ms  [controller]
├─ ✗ lab-worker-2  Blocked (PreflightFailed)  attempt 2  300ms
│  ├─ ✓ cordon    Succeeded  10ms  [controller]
│  ├─ ✗ greet     Failed  200ms  attempt 2
│  │    preflight-failed: /etc/missing not found
│  └─ · uncordon  Pending  [controller]
│  fix the cause, then run the step again: kubectl bosun retry hello-everyone lab-worker-2
│  or leave the node as it is and move on: kubectl bosun skip hello-everyone lab-worker-2
└─ · lab-worker-3  Pending
   3 steps waiting: cordon, greet, uncordon
";
        assert_eq!(got, want, "\n--- got ---\n{got}");
    }

    #[test]
    fn running_step_shows_elapsed_time_and_paused_operation_says_how_to_resume() {
        let mut op = operation();
        op.spec.paused = true;
        let st = op.status.as_mut().unwrap();
        st.phase = OperationPhase::Paused;
        st.message = None;
        let mut ts_ = tasks();
        ts_.truncate(2);
        let w1 = ts_[1].status.as_mut().unwrap();
        w1.phase = NodeTaskPhase::Running;
        w1.steps[1] = StepStatus {
            name: "greet".into(),
            phase: StepPhase::Running,
            attempts: 1,
            started_at: Some(ts("2026-11-30T03:01:00Z")),
            ..Default::default()
        };
        w1.steps.truncate(2);
        let got = status(&op, &ts_, NOW.parse().unwrap(), Style::PLAIN);
        assert!(got.starts_with("Operation hello-everyone  Paused  2/4 nodes finished  mode Auto  age 1m12s  PAUSED\n"), "{got}");
        assert!(got.contains("  paused: running steps finish, nothing new starts. Resume: kubectl bosun resume hello-everyone\n"), "{got}");
        assert!(
            got.contains("├─ ▶ lab-worker-1  Running  1m10s so far\n"),
            "{got}"
        );
        assert!(
            got.contains("│  ├─ ▶ greet     Running  12s so far\n"),
            "{got}"
        );
        // A planned node whose task does not exist yet is shown, not dropped.
        assert!(
            got.contains("└─ · lab-worker-3  no NodeTask yet\n"),
            "{got}"
        );
    }

    /// The controller's message for a paused Operation (runtime/planner's schedule) and the
    /// CLI's own paused line say the same: one `paused:` line is shown, the one with the
    /// command that resumes. A paused Operation that is blocked keeps both lines.
    #[test]
    fn paused_operation_says_paused_once() {
        let mut op = operation();
        op.spec.paused = true;
        let st = op.status.as_mut().unwrap();
        st.phase = OperationPhase::Paused;
        st.message = Some(
            "paused: running steps finish, nothing new starts; set spec.paused: false to resume"
                .into(),
        );
        let got = status(&op, &tasks(), NOW.parse().unwrap(), Style::PLAIN);
        let paused: Vec<&str> = got
            .lines()
            .filter(|l| l.trim_start().starts_with("paused:"))
            .collect();
        assert_eq!(
            paused,
            [
                "  paused: running steps finish, nothing new starts. Resume: kubectl bosun resume hello-everyone"
            ],
            "{got}"
        );

        op.status.as_mut().unwrap().message =
            Some("blocked on [\"lab-worker-2\"]: see `kubectl bosun status`".into());
        let got = status(&op, &tasks(), NOW.parse().unwrap(), Style::PLAIN);
        assert!(got.contains("\n  blocked on [\"lab-worker-2\"]: see `kubectl bosun status`\n  paused: running steps finish"), "{got}");
    }

    /// Just after `kubectl bosun retry`, the controller has set the task Running and the
    /// failed step back to Pending, and the step still carries the failed attempt's start and
    /// end until the agent starts it again: no time from that attempt is shown as this one's.
    #[test]
    fn a_retried_step_shows_no_time_of_the_previous_attempt() {
        let op = operation();
        let mut ts_ = tasks();
        let w2 = ts_[2].status.as_mut().unwrap();
        assert_eq!(w2.phase, NodeTaskPhase::Blocked);
        w2.phase = NodeTaskPhase::Running;
        w2.reason = None;
        w2.attempts = 3;
        let greet = w2.steps.iter_mut().find(|s| s.name == "greet").unwrap();
        greet.phase = StepPhase::Pending;
        greet.error = None;
        // The failed attempt's times (200ms, started 1m09s ago) are still there.
        assert!(greet.started_at.is_some() && greet.finished_at.is_some());
        let got = status(&op, &ts_, NOW.parse().unwrap(), Style::PLAIN);
        let lines: Vec<&str> = got.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with("├─ ▶ lab-worker-2"))
            .unwrap();
        // cordon ran in an earlier attempt and counts for the task's time; greet, Pending
        // again, has none.
        let cordon_start = ts_[2].status.as_ref().unwrap().steps[0]
            .started_at
            .clone()
            .unwrap();
        let since = human_duration(
            NOW.parse::<Timestamp>()
                .unwrap()
                .duration_since(cordon_start.0),
        );
        assert_eq!(
            lines[at],
            format!("├─ ▶ lab-worker-2  Running  attempt 3  {since} so far"),
            "{got}"
        );
        assert_eq!(
            lines[at + 2],
            "│  ├─ · greet     Pending  attempt 2",
            "{got}"
        );

        // Retried at its only step: nothing of this attempt has started, so no time at all.
        let w2 = ts_[2].status.as_mut().unwrap();
        w2.steps.retain(|s| s.name == "greet");
        let got = status(&op, &ts_, NOW.parse().unwrap(), Style::PLAIN);
        assert!(
            got.contains("├─ ▶ lab-worker-2  Running  attempt 3\n"),
            "{got}"
        );
    }

    #[test]
    fn awaiting_approval_and_requested_recovery_say_what_happens_next() {
        let mut op = operation();
        op.spec.execution_mode = bosun_api::ExecutionMode::Controlled;
        let mut ts_ = tasks();
        ts_[2].spec.recovery = Some(Recovery::Retry);
        ts_[3].status.as_mut().unwrap().phase = NodeTaskPhase::AwaitingApproval;
        let got = status(&op, &ts_, NOW.parse().unwrap(), Style::PLAIN);
        assert!(
            got.contains("│  recovery Retry requested; waiting for the controller to act on it\n"),
            "{got}"
        );
        assert!(!got.contains("kubectl bosun retry"), "{got}");
        assert!(
            got.contains("└─ ? lab-worker-3  AwaitingApproval\n"),
            "{got}"
        );
        assert!(
            got.contains(
                "   waiting for approval: kubectl bosun approve hello-everyone lab-worker-3\n"
            ),
            "{got}"
        );
        ts_[3].spec.approve = true;
        ts_[3].status.as_mut().unwrap().phase = NodeTaskPhase::Pending;
        let got = status(&op, &ts_, NOW.parse().unwrap(), Style::PLAIN);
        assert!(
            got.contains("   approved in advance; starts when its turn comes\n"),
            "{got}"
        );
    }

    #[test]
    fn a_blocking_message_that_says_more_than_the_step_error_is_shown() {
        let mut ts_ = tasks();
        let w2 = ts_[2].status.as_mut().unwrap();
        w2.reason = Some(BlockReason::Interrupted);
        w2.message = Some("the agent restarted during step greet, which is not idempotent".into());
        let got = status(&operation(), &ts_, NOW.parse().unwrap(), Style::PLAIN);
        assert!(
            got.contains("├─ ✗ lab-worker-2  Blocked (Interrupted)  attempt 2  300ms\n"),
            "{got}"
        );
        assert!(
            got.contains(
                "│  blocked: the agent restarted during step greet, which is not idempotent\n"
            ),
            "{got}"
        );
    }

    /// A step refused because someone uncordoned the node: the reason and the step's
    /// message (what to do) are shown as they are written.
    #[test]
    fn a_cleared_cordon_shows_its_reason_and_what_to_do() {
        let mut ts_ = tasks();
        let message = "node lab-worker-2 is schedulable again: step `cordon` cordoned it, and someone else uncordoned it since (spec.unschedulable is false); Bosun does not start `greet` on a schedulable node. Cordon it again (kubectl cordon lab-worker-2; drain it if pods came back), then retry the step (kubectl bosun retry hello-everyone lab-worker-2); or skip the node (kubectl bosun skip hello-everyone lab-worker-2: Bosun leaves it as it is)";
        let w2 = ts_[2].status.as_mut().unwrap();
        w2.reason = Some(BlockReason::CordonCleared);
        w2.message = Some(format!("step greet failed: {message}"));
        let greet = w2.steps.iter_mut().find(|s| s.name == "greet").unwrap();
        greet.log_tail.clear();
        greet.preflight.clear();
        greet.finished_at = greet.started_at.clone();
        greet.error = Some(StepError {
            code: "cordon-cleared".into(),
            message: message.into(),
            retryable: false,
        });
        let got = status(&operation(), &ts_, NOW.parse().unwrap(), Style::PLAIN);
        assert!(
            got.contains("├─ ✗ lab-worker-2  Blocked (CordonCleared)  attempt 2"),
            "{got}"
        );
        assert!(
            got.contains(&format!("│  │    cordon-cleared: {message}\n")),
            "{got}"
        );
        assert!(
            got.contains(
                "│  fix the cause, then run the step again: kubectl bosun retry hello-everyone lab-worker-2\n"
            ),
            "{got}"
        );
    }

    #[test]
    fn unplanned_operation_lists_tasks_by_their_group() {
        let mut op = operation();
        op.status = None;
        let got = status(&op, &tasks()[..1], NOW.parse().unwrap(), Style::PLAIN);
        assert!(
            got.starts_with("Operation hello-everyone  Pending  1/1 nodes finished"),
            "{got}"
        );
        assert!(got.contains("not planned yet"), "{got}");
        assert!(
            got.contains("\ncontrol-plane  1/1 finished\n└─ ✓ lab-cp-1  Succeeded"),
            "{got}"
        );
    }

    #[test]
    fn colour_only_when_asked() {
        let plain = status(&operation(), &tasks(), NOW.parse().unwrap(), Style::PLAIN);
        assert!(!plain.contains('\x1b'));
        let colour = status(
            &operation(),
            &tasks(),
            NOW.parse().unwrap(),
            Style { color: true },
        );
        assert!(colour.contains("\x1b[31m✗\x1b[0m"), "{colour}");
        assert!(colour.contains("\x1b[32m✓\x1b[0m"), "{colour}");
    }

    #[test]
    fn no_color_and_terminal_detection() {
        use std::ffi::OsStr;
        assert!(Style::detect(true, None).color);
        assert!(!Style::detect(false, None).color);
        assert!(!Style::detect(true, Some(OsStr::new("1"))).color);
        // An empty NO_COLOR does not count, per the convention.
        assert!(Style::detect(true, Some(OsStr::new(""))).color);
    }

    #[test]
    fn step_outputs_show_under_the_step_with_before_after_pairs_joined() {
        let mut outputs = std::collections::BTreeMap::new();
        outputs.insert(
            "apiserver.before".to_owned(),
            "2027-11-30T02:35:55Z".to_owned(),
        );
        outputs.insert(
            "apiserver.after".to_owned(),
            "2027-11-30T03:23:03Z".to_owned(),
        );
        outputs.insert("kernel".to_owned(), "6.18.44".to_owned());
        outputs.insert("orphan.after".to_owned(), "x".to_owned());
        assert_eq!(
            output_lines(&outputs),
            vec![
                "apiserver: 2027-11-30T02:35:55Z → 2027-11-30T03:23:03Z".to_owned(),
                "kernel: 6.18.44".to_owned(),
                "orphan.after: x".to_owned(),
            ]
        );
        let many: std::collections::BTreeMap<String, String> = (0..40)
            .map(|i| (format!("k{i:02}"), i.to_string()))
            .collect();
        let lines = output_lines(&many);
        assert_eq!(lines.len(), MAX_OUTPUT_LINES);
        assert_eq!(
            lines.last().unwrap(),
            "… 25 more outputs (-o yaml shows all)"
        );

        let mut t = tasks();
        let step = t[0]
            .status
            .as_mut()
            .unwrap()
            .steps
            .iter_mut()
            .find(|x| x.phase == StepPhase::Succeeded)
            .unwrap();
        step.outputs = outputs;
        let text = status(&operation(), &t, NOW.parse().unwrap(), Style::PLAIN);
        assert!(
            text.contains("apiserver: 2027-11-30T02:35:55Z → 2027-11-30T03:23:03Z"),
            "{text}"
        );
    }

    fn facts(at: &str, kubelet: &str, kubeadm: Option<&str>, certs: &[(&str, &str)]) -> NodeFacts {
        NodeFacts {
            collected_at: ts(at),
            kubelet_version: Some(kubelet.into()),
            kubeadm_version: kubeadm.map(Into::into),
            kubectl_version: None,
            packages: Vec::new(),
            os: Some("Debian GNU/Linux 13 (trixie)".into()),
            arch: Some("amd64".into()),
            kernel: Some("6.12.0".into()),
            certificates: certs
                .iter()
                .map(|(n, t)| bosun_api::node_task::CertificateExpiry {
                    name: (*n).into(),
                    not_after: ts(t),
                })
                .collect(),
            certificates_omitted: 0,
            command_confinement: None,
            reboot: None,
            boot_id: None,
        }
    }

    #[test]
    fn node_facts_show_as_one_line_under_the_node_with_before_and_after() {
        let now: Timestamp = NOW.parse().unwrap();
        let before = facts(
            "2026-11-30T03:00:01Z",
            "v1.33.5",
            Some("v1.33.5"),
            &[
                ("apiserver", "2026-12-30T03:00:00Z"),
                ("ca", "2035-11-28T03:00:00Z"),
                ("apiserver-kubelet-client", "2026-12-29T03:00:00Z"),
            ],
        );
        // Only `before` yet: the values as they are.
        let report = NodeFactsReport {
            before: Some(before.clone()),
            after: None,
        };
        assert_eq!(
            facts_line(&report, now, Style::PLAIN).unwrap(),
            "kubelet v1.33.5 · kubeadm v1.33.5 · certs expire in 28d (earliest: apiserver-kubelet-client)"
        );
        // After an upgrade and a renewal: what changed reads before → after.
        let after = facts(
            "2026-11-30T03:05:00Z",
            "v1.34.4",
            Some("v1.34.4"),
            &[
                ("apiserver", "2027-11-29T03:04:00Z"),
                ("apiserver-kubelet-client", "2027-11-29T03:04:30Z"),
            ],
        );
        let report = NodeFactsReport {
            before: Some(before.clone()),
            after: Some(after.clone()),
        };
        assert_eq!(
            facts_line(&report, now, Style::PLAIN).unwrap(),
            "kubelet v1.33.5 → v1.34.4 · kubeadm v1.33.5 → v1.34.4 · certs expire in 28d → 364d (earliest: apiserver)"
        );
        // kubectl shows where it is installed, before → after like the others.
        let report = NodeFactsReport {
            before: Some(NodeFacts {
                kubectl_version: Some("v1.33.5".into()),
                ..before.clone()
            }),
            after: Some(NodeFacts {
                kubectl_version: Some("v1.34.4".into()),
                ..after
            }),
        };
        assert!(
            facts_line(&report, now, Style::PLAIN)
                .unwrap()
                .contains("kubeadm v1.33.5 → v1.34.4 · kubectl v1.33.5 → v1.34.4 · certs"),
            "{:?}",
            facts_line(&report, now, Style::PLAIN)
        );
        // A worker: no kubeadm PKI, no kubeadm.
        let worker = NodeFactsReport {
            before: Some(facts("2026-11-30T03:00:01Z", "v1.34.4", None, &[])),
            after: None,
        };
        assert_eq!(
            facts_line(&worker, now, Style::PLAIN).unwrap(),
            "kubelet v1.34.4"
        );
        // An expired certificate says so.
        let expired = NodeFactsReport {
            before: Some(facts(
                "2026-11-30T03:00:01Z",
                "v1.34.4",
                None,
                &[("front-proxy-client", "2026-11-27T03:00:00Z")],
            )),
            after: None,
        };
        assert_eq!(
            facts_line(&expired, now, Style::PLAIN).unwrap(),
            "kubelet v1.34.4 · a certificate EXPIRED 3d ago (earliest: front-proxy-client)"
        );
        assert_eq!(
            facts_line(&NodeFactsReport::default(), now, Style::PLAIN),
            None
        );

        // In the tree: right under the node's line.
        let mut t = tasks();
        t[0].status.as_mut().unwrap().node_facts = Some(report);
        let text = status(&operation(), &t, now, Style::PLAIN);
        assert!(
            text.contains(
                "└─ ✓ lab-cp-1  Succeeded  350ms\n   kubelet v1.33.5 → v1.34.4 · kubeadm"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_task_waiting_for_a_node_held_by_another_operation_says_by_whom() {
        let mut t = tasks();
        let waiting = t
            .iter_mut()
            .find(|x| x.spec.node_name == "lab-worker-3")
            .unwrap();
        let st = waiting.status.as_mut().unwrap();
        st.message = Some("waiting: node lab-worker-3 is held by Operation upgrade-x (task upgrade-x-lab-worker-3, Blocked)".into());
        st.conditions.push(Condition {
            type_: "NodeHeld".into(),
            status: "True".into(),
            reason: "HeldByOtherOperation".into(),
            message: st.message.clone().unwrap(),
            last_transition_time: ts(NOW),
            observed_generation: None,
        });
        let text = status(&operation(), &t, NOW.parse().unwrap(), Style::PLAIN);
        assert!(
            text.ends_with(
                "└─ · lab-worker-3  Pending\n   3 steps waiting: cordon, greet, uncordon\n   waiting: node lab-worker-3 is held by Operation upgrade-x (task upgrade-x-lab-worker-3, Blocked)\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn durations_read_naturally() {
        let d = |ms: i64| human_duration(SignedDuration::from_millis(ms));
        assert_eq!(d(0), "0ms");
        assert_eq!(d(999), "999ms");
        assert_eq!(d(2_449), "2.4s");
        assert_eq!(d(42_000), "42s");
        assert_eq!(d(185_000), "3m05s");
        assert_eq!(d(7_620_000), "2h07m");
        assert_eq!(d(273_600_000), "3d04h");
        assert_eq!(d(-5), "0ms");
    }

    #[test]
    fn a_past_earliest_expiry_reads_as_expired_not_as_due_in_no_time() {
        let cl = |at: &str| -> bosun_api::ClusterLifecycle {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "bosun.dev/v1alpha1", "kind": "ClusterLifecycle",
                "metadata": { "name": "cluster" },
                "spec": { "kubernetesVersion": "v1.34.4" },
                "status": { "certificates": { "earliest": "cp-1/apiserver", "earliestExpiry": at } },
            }))
            .expect("a ClusterLifecycle")
        };
        let now: Timestamp = "2026-12-03T12:00:00Z".parse().unwrap();
        let past = lifecycle(&cl("2026-11-30T12:00:00Z"), &[], &[], now, Style::PLAIN);
        assert!(
            past.contains("earliest cp-1/apiserver EXPIRED at 2026-11-30T12:00:00Z (3d00h ago)"),
            "{past}"
        );
        let future = lifecycle(&cl("2027-12-03T12:00:00Z"), &[], &[], now, Style::PLAIN);
        assert!(
            future.contains("earliest cp-1/apiserver expires 2027-12-03T12:00:00Z (in 365d00h)"),
            "{future}"
        );
    }

    #[test]
    fn the_nodes_that_need_a_reboot_are_shown_with_their_reasons() {
        let cl = |reboots: serde_json::Value| -> bosun_api::ClusterLifecycle {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "bosun.dev/v1alpha1", "kind": "ClusterLifecycle",
                "metadata": { "name": "cluster" },
                "spec": { "kubernetesVersion": "v1.34.4" },
                "status": { "reboots": reboots },
            }))
            .expect("a ClusterLifecycle")
        };
        let report: bosun_api::NodeReport = serde_json::from_value(serde_json::json!({
            "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeReport",
            "metadata": { "name": "w-1" },
            "spec": { "nodeName": "w-1", "facts": {
                "collectedAt": "2026-12-03T11:00:00Z",
                "reboot": { "required": true, "packages": ["libc6"],
                            "reasons": ["/run/reboot-required is present (asked for by libc6)"] },
            }},
        }))
        .expect("a NodeReport");
        let now: Timestamp = "2026-12-03T12:00:00Z".parse().unwrap();
        // (the status's reboots, the reports read, the lines shown)
        let cases = [
            (
                serde_json::json!({}),
                vec![],
                "  reboots: no node reports whether it needs one (agents older than the check, or no report yet)\n",
            ),
            (
                serde_json::json!({"nodesReported": 3}),
                vec![],
                "  reboots: none needed (3 of the nodes reporting)\n",
            ),
            (
                serde_json::json!({"required": 2, "nodes": ["w-1", "w-2"], "nodesReported": 3}),
                vec![report.clone()],
                "  reboots: 2 of 3 reporting nodes need one\n    w-1: /run/reboot-required is present (asked for by libc6)\n    w-2: (its NodeReport was not read)\n",
            ),
            (
                serde_json::json!({"required": 1, "nodes": ["w-1"], "nodesReported": 1}),
                vec![report],
                "  reboots: 1 of 1 reporting node needs one\n    w-1: /run/reboot-required is present (asked for by libc6)\n",
            ),
        ];
        for (reboots, reports, want) in cases {
            let text = lifecycle(&cl(reboots), &[], &reports, now, Style::PLAIN);
            let from = text.find("  reboots:").expect("a reboots line");
            let end = text[from..]
                .find("\n\n")
                .map_or(text.len(), |e| from + e + 1);
            assert_eq!(&text[from..end], want, "{text}");
        }
    }

    #[test]
    fn upgrade_and_renewal_kinds_are_described() {
        let mut op = operation();
        op.spec.custom = None;
        op.spec.upgrade =
            serde_json::from_value(serde_json::json!({"kubernetesVersion": "v1.34.2"})).unwrap();
        assert!(
            status(&op, &[], NOW.parse().unwrap(), Style::PLAIN)
                .contains("  upgrade to v1.34.2 (packages kubeadm, kubelet, kubectl)\n")
        );
        op.spec.upgrade = None;
        op.spec.renew_certificates = serde_json::from_value(
            serde_json::json!({"certificates": ["apiserver", "admin.conf"], "renewBefore": "720h"}),
        )
        .unwrap();
        assert!(
            status(&op, &[], NOW.parse().unwrap(), Style::PLAIN).contains(
                "  renew certificates: apiserver, admin.conf (only those expiring within 720h)\n"
            )
        );
    }

    #[test]
    fn logs_show_each_step_with_its_tail_checks_and_error() {
        let t = &tasks()[2];
        let got = logs(t, None, NOW.parse().unwrap());
        let want = "\
=== cordon (Succeeded, attempt 1, 10ms)
(a controller step: see bosun-controller's log)
=== greet (Failed, attempt 2, 200ms)
checking /etc/missing
preflight file-readable: Fail /etc/missing not found
error preflight-failed: /etc/missing not found
=== uncordon (Pending)
(not started)
";
        assert_eq!(got, want, "\n--- got ---\n{got}");
        let only = logs(t, Some("greet"), NOW.parse().unwrap());
        assert!(only.starts_with("=== greet (Failed"), "{only}");
        assert!(!only.contains("cordon"), "{only}");
    }

    #[test]
    fn a_blocked_operation_ends_a_watch_with_the_reason_and_the_commands() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let mut op = operation();
        let status = op.status.as_mut().unwrap();
        status.phase = OperationPhase::Blocked;
        status.message = Some("lab-worker-2: preflight failed: /etc/missing not found".into());
        status.conditions = vec![Condition {
            type_: "Blocked".into(),
            status: "True".into(),
            reason: "PreflightFailed".into(),
            message: String::new(),
            last_transition_time: ts("2026-11-30T03:00:02Z"),
            observed_generation: None,
        }];
        let mut ts = tasks();
        let got = blocked_summary(&op, &ts).expect("a blocked Operation ends the watch");
        assert_eq!(
            got,
            "Operation hello-everyone is Blocked (PreflightFailed): lab-worker-2: preflight failed: /etc/missing not found\n  \
             lab-worker-2: fix the cause, then `kubectl bosun retry hello-everyone lab-worker-2`, or move on with \
             `kubectl bosun skip hello-everyone lab-worker-2`\nThe watch ends here: nothing changes until someone resolves it.\n"
        );
        // A recovery requested: the controller will act, so the watch goes on.
        ts[2].spec.recovery = Some(bosun_api::Recovery::Retry);
        assert_eq!(blocked_summary(&op, &ts), None);
        // Not blocked: nothing to say.
        op.status.as_mut().unwrap().phase = OperationPhase::Running;
        assert_eq!(blocked_summary(&op, &tasks()), None);
    }

    #[test]
    fn logs_show_the_outcome_message_of_a_step_that_logged_nothing() {
        let mut t = tasks()[1].clone();
        let st = t.status.as_mut().unwrap();
        st.steps[1].message = Some("would run `kubeadm upgrade node` (kubeadm v1.34.5)".into());
        let got = logs(&t, Some("greet"), NOW.parse().unwrap());
        assert_eq!(
            got,
            "=== greet (Succeeded, attempt 1, 2.4s)\n(no log lines)\nresult: would run `kubeadm upgrade node` (kubeadm v1.34.5)\n",
            "\n--- got ---\n{got}"
        );
        // With log lines, the message comes after them.
        t.status.as_mut().unwrap().steps[1].log_tail = vec!["planning".into()];
        let got = logs(&t, Some("greet"), NOW.parse().unwrap());
        assert!(
            got.ends_with("planning\nresult: would run `kubeadm upgrade node` (kubeadm v1.34.5)\n"),
            "{got}"
        );
    }
}
