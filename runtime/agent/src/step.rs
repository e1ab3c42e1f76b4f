//! One agent step through the wasm host: load (verify + compile), preflight, run, and the
//! result as a step status.
//!
//! [`execute`] is blocking (wasm runs on the calling thread); the agent calls it on a
//! blocking thread. The conversions from host reports to status are plain functions,
//! unit-tested without a plugin.

use std::time::Duration;

use bosun_api::grants::Grants;
use bosun_api::node_task::{
    BlockReason, CheckStatus as ApiCheck, LOG_TAIL_LINES, PreflightCheck, StepError, StepPhase,
};
use bosun_host::{
    CallFailure, Captured, Check, CheckStatus, Error as HostError, Host, LoadedPlugin, LogLevel,
    NodeContext, RunOptions,
};

use crate::gate::Gate;
use crate::plugins::Resolved;

/// What one step did, ready to be written to its status entry.
#[derive(Clone, Debug, PartialEq)]
pub struct StepResult {
    /// Succeeded or Failed.
    pub phase: StepPhase,
    pub changed: bool,
    pub message: String,
    pub outputs: Vec<(String, String)>,
    /// The last [`LOG_TAIL_LINES`] lines logged (preflight's, then run's).
    pub log_tail: Vec<String>,
    pub preflight: Vec<PreflightCheck>,
    pub error: Option<StepError>,
    /// Why the task blocks, when the step failed.
    pub block: Option<BlockReason>,
    /// Time the plugin spent in granted host commands and service actions (preflight and
    /// run together).
    pub host_time: Duration,
}

impl StepResult {
    /// A failed step.
    pub fn failed(block: BlockReason, code: &str, message: String, retryable: bool) -> StepResult {
        StepResult {
            phase: StepPhase::Failed,
            changed: false,
            message: message.clone(),
            outputs: Vec::new(),
            log_tail: Vec::new(),
            preflight: Vec::new(),
            error: Some(StepError {
                code: code.into(),
                message,
                retryable,
            }),
            block: Some(block),
            host_time: Duration::ZERO,
        }
    }
}

/// What the step asks the plugin to do.
#[derive(Clone, Debug)]
pub struct StepCall<'a> {
    pub action: &'a str,
    pub params_json: String,
    pub grants: &'a Grants,
    pub dry_run: bool,
    /// The previous attempt of this step was interrupted (`run-context.resumed`).
    pub resumed: bool,
    pub timeout: Option<Duration>,
}

/// Loads the plugin (the host verifies digest and signature before compiling), asks
/// `gate` about its capabilities, runs its preflight, asks `gate` again right before the
/// run (the step policies), and runs the action only if no check failed and no gate
/// refused. Never panics on plugin misbehaviour: every failure becomes a Failed result
/// with the reason to block.
pub fn execute(
    host: &Host,
    plugin: &Resolved,
    node: &NodeContext,
    call: &StepCall<'_>,
    gate: &dyn Gate,
) -> StepResult {
    let loaded = match host.load(&plugin.bytes, &plugin.pin) {
        Ok(l) => l,
        Err(e) => {
            return StepResult::failed(
                BlockReason::PluginUnavailable,
                "plugin-refused",
                e.to_string(),
                false,
            );
        }
    };
    if let Err(refused) = gate.loaded(&loaded) {
        return *refused;
    }
    let mut trace = Trace::default();
    let preflight = match preflight(host, &loaded, node, call, &mut trace) {
        Ok(preflight) => preflight,
        Err(refused) => return *refused,
    };
    if let Err(refused) = gate.before_run(&loaded, &preflight) {
        return trace.onto(*refused, preflight);
    }
    let result = run_action(host, &loaded, node, call, &mut trace);
    trace.onto(result, preflight)
}

/// What the host calls of one step left behind: their log lines and the time spent in host
/// commands.
#[derive(Default)]
struct Trace {
    lines: Vec<String>,
    host_time: Duration,
}

impl Trace {
    fn add(&mut self, captured: &Captured) {
        self.lines.extend(tail_of(captured));
        self.host_time += captured.host_time;
    }

    /// `result` with the preflight checks, the log tail and the host time.
    fn onto(self, mut result: StepResult, preflight: Vec<PreflightCheck>) -> StepResult {
        result.preflight = preflight;
        result.log_tail = keep_tail(self.lines);
        result.host_time = self.host_time;
        result
    }
}

/// The plugin's preflight: its checks, or the finished failed result when the plugin
/// refused, the host stopped the call or a check failed.
fn preflight(
    host: &Host,
    loaded: &LoadedPlugin,
    node: &NodeContext,
    call: &StepCall<'_>,
    trace: &mut Trace,
) -> Result<Vec<PreflightCheck>, Box<StepResult>> {
    let clock = std::time::Instant::now();
    let report = host.preflight_with(
        loaded,
        call.grants,
        node,
        call.action,
        &call.params_json,
        call.dry_run,
    );
    bosun_telemetry::metrics().gate_finished(bosun_telemetry::Gate::Preflight, clock.elapsed());
    let checks = match report {
        Ok(report) => {
            trace.add(&report.captured);
            match report.result {
                Ok(checks) => checks,
                Err(pe) => {
                    let r = StepResult::failed(
                        BlockReason::PreflightFailed,
                        &pe.code,
                        format!("preflight refused: {}", pe.message),
                        pe.retryable,
                    );
                    return Err(Box::new(std::mem::take(trace).onto(r, Vec::new())));
                }
            }
        }
        Err(failure) => {
            let lines = std::mem::take(&mut trace.lines);
            return Err(Box::new(with_tail(
                from_failure(failure, "preflight"),
                lines,
            )));
        }
    };
    let preflight: Vec<PreflightCheck> = checks.iter().map(check_status).collect();
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| c.status == CheckStatus::Fail)
        .map(|c| format!("{}: {}", c.name, c.message))
        .collect();
    if failed.is_empty() {
        return Ok(preflight);
    }
    let r = StepResult::failed(
        BlockReason::PreflightFailed,
        "preflight-failed",
        format!(
            "preflight failed ({}{}); fix the cause on the node, then retry",
            failed.join("; "),
            host_refusals(&trace.lines)
        ),
        true,
    );
    Err(Box::new(std::mem::take(trace).onto(r, preflight)))
}

/// The action itself, once preflight and the gates let it run.
fn run_action(
    host: &Host,
    loaded: &LoadedPlugin,
    node: &NodeContext,
    call: &StepCall<'_>,
    trace: &mut Trace,
) -> StepResult {
    let options = RunOptions {
        dry_run: call.dry_run,
        resumed: call.resumed,
        deadline: call.timeout,
    };
    match host.run(
        loaded,
        call.grants,
        node,
        call.action,
        &call.params_json,
        options,
    ) {
        Ok(report) => {
            trace.add(&report.captured);
            match report.result {
                Ok(outcome) => StepResult {
                    phase: StepPhase::Succeeded,
                    changed: outcome.changed,
                    message: outcome.message,
                    outputs: outcome.outputs,
                    log_tail: Vec::new(),
                    preflight: Vec::new(),
                    error: None,
                    block: None,
                    host_time: Duration::ZERO,
                },
                Err(pe) => StepResult::failed(
                    BlockReason::StepFailed,
                    &pe.code,
                    format!("{}{}", pe.message, host_refusals(&trace.lines)),
                    pe.retryable,
                ),
            }
        }
        Err(failure) => {
            trace.add(&failure.captured);
            from_failure(failure, "run")
        }
    }
}

/// What the host refused the plugin's file opens for, from the call's log lines, to add
/// to the step's message: the plugin only saw "not permitted", the host knows why (a
/// symlink leading out of a grant). Empty when it refused none.
fn host_refusals(lines: &[String]) -> String {
    let why: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("DENIED filesystem: "))
        .collect();
    if why.is_empty() {
        String::new()
    } else {
        format!("; the host refused: {}", why.join("; "))
    }
}

fn with_tail(mut r: StepResult, lines: Vec<String>) -> StepResult {
    r.log_tail = keep_tail(lines);
    r
}

/// A call the host refused or stopped, as a failed step.
fn from_failure(failure: CallFailure, phase: &str) -> StepResult {
    let (block, code, retryable) = match &failure.error {
        HostError::DeadlineExceeded { .. } => {
            (BlockReason::StepTimedOut, "deadline-exceeded", true)
        }
        HostError::NotGranted { .. } => (BlockReason::StepFailed, "not-granted", false),
        _ => (BlockReason::StepFailed, "host-refused", false),
    };
    let mut r = StepResult::failed(
        block,
        code,
        format!("{phase}: {}", failure.error),
        retryable,
    );
    r.log_tail = keep_tail(tail_of(&failure.captured));
    r
}

fn check_status(c: &Check) -> PreflightCheck {
    PreflightCheck {
        name: c.name.clone(),
        status: match c.status {
            CheckStatus::Pass => ApiCheck::Pass,
            CheckStatus::Warn => ApiCheck::Warn,
            CheckStatus::Fail => ApiCheck::Fail,
        },
        message: c.message.clone(),
    }
}

/// Captured output as log lines: `LEVEL message k=v ...`, refused host calls as
/// `DENIED capability: message`.
pub fn tail_of(captured: &Captured) -> Vec<String> {
    let mut out: Vec<String> = captured
        .lines
        .iter()
        .map(|l| {
            let level = match l.level {
                LogLevel::Debug => "DEBUG",
                LogLevel::Info => "INFO",
                LogLevel::Warn => "WARN",
                LogLevel::Error => "ERROR",
            };
            let mut s = format!("{level} {}", l.message);
            for (k, v) in &l.fields {
                s.push_str(&format!(" {k}={v}"));
            }
            s
        })
        .collect();
    out.extend(
        captured
            .denied
            .iter()
            .map(|d| format!("DENIED {}: {}", d.capability, d.message)),
    );
    out
}

/// The last [`LOG_TAIL_LINES`] lines.
pub fn keep_tail(mut lines: Vec<String>) -> Vec<String> {
    if lines.len() > LOG_TAIL_LINES {
        lines.drain(..lines.len() - LOG_TAIL_LINES);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use bosun_host::{Denial, LogLine};

    #[test]
    fn the_hosts_filesystem_refusals_are_added_to_the_message() {
        let lines = vec![
            "INFO reading".to_owned(),
            "DENIED exec: /usr/bin/x (no exec grant names this command)".to_owned(),
            "DENIED filesystem: `os-release` (in a granted directory) is a symlink to `../usr/lib/os-release`, which leads out of that grant".to_owned(),
        ];
        assert_eq!(
            host_refusals(&lines),
            "; the host refused: `os-release` (in a granted directory) is a symlink to `../usr/lib/os-release`, which leads out of that grant"
        );
        assert_eq!(host_refusals(&lines[..2]), "");
    }

    #[test]
    fn the_log_tail_is_bounded_and_keeps_the_last_lines() {
        let lines: Vec<String> = (0..120).map(|i| format!("line {i}")).collect();
        let tail = keep_tail(lines);
        assert_eq!(tail.len(), LOG_TAIL_LINES);
        assert_eq!(tail.first().unwrap(), "line 70");
        assert_eq!(tail.last().unwrap(), "line 119");
        assert_eq!(keep_tail(vec!["a".into()]), vec!["a".to_string()]);
    }

    #[test]
    fn captured_lines_and_denials_become_readable_lines() {
        let captured = Captured {
            lines: vec![LogLine {
                level: LogLevel::Warn,
                message: "disk almost full".into(),
                fields: vec![("path".into(), "/var".into())],
                truncated: false,
            }],
            denied: vec![Denial {
                capability: "exec /usr/bin/rm".into(),
                message: "not granted".into(),
            }],
            ..Default::default()
        };
        assert_eq!(
            tail_of(&captured),
            vec![
                "WARN disk almost full path=/var",
                "DENIED exec /usr/bin/rm: not granted"
            ]
        );
    }

    #[test]
    fn a_deadline_blocks_as_timed_out_and_a_missing_grant_as_failed() {
        let r = from_failure(
            HostError::DeadlineExceeded {
                deadline: Duration::from_secs(3),
            }
            .into(),
            "run",
        );
        assert_eq!(r.block, Some(BlockReason::StepTimedOut));
        assert_eq!(r.phase, StepPhase::Failed);
        assert!(r.error.as_ref().unwrap().retryable);
        let r = from_failure(
            HostError::NotGranted {
                capability: "exec /bin/sh".into(),
            }
            .into(),
            "run",
        );
        assert_eq!(r.block, Some(BlockReason::StepFailed));
        assert_eq!(r.error.as_ref().unwrap().code, "not-granted");
        assert!(r.message.contains("/bin/sh"), "{}", r.message);
    }
}
