//! systemd units: the [`ServiceBackend`] the `service` host interface drives after the
//! grant check, with a systemctl backend for real nodes and a recording one for the lab.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use bosun_api::grants::ServiceAction;

use crate::config::ExecIsolation;
use crate::exec::{CommandError, CommandSpec};

/// What systemd reports for a unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitStatus {
    pub active_state: String,
    pub sub_state: String,
}

/// Why a backend could not act on a unit.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{0}")]
    Failed(String),
    #[error("systemctl did not finish within {0:?}")]
    Timeout(Duration),
}

/// Performs unit actions on a node. Called only after the grant check: a backend does
/// no authorization of its own. `root` is the host root of the node.
pub trait ServiceBackend: Send + Sync {
    fn control(&self, root: &Path, unit: &str, action: ServiceAction) -> Result<UnitStatus, ServiceError>;
    fn status(&self, root: &Path, unit: &str) -> Result<UnitStatus, ServiceError>;
}

/// Drives the node's systemd with `systemctl`, started like a granted command (chrooted
/// into the host root when it is not `/`, empty environment, its own timeout).
#[derive(Clone, Debug)]
pub struct SystemctlBackend {
    pub isolation: ExecIsolation,
    pub timeout: Duration,
}

impl Default for SystemctlBackend {
    fn default() -> Self {
        SystemctlBackend { isolation: ExecIsolation::Chroot, timeout: Duration::from_secs(120) }
    }
}

fn verb(action: ServiceAction) -> &'static str {
    match action {
        ServiceAction::Start => "start",
        ServiceAction::Stop => "stop",
        ServiceAction::Restart => "restart",
        ServiceAction::Reload => "reload",
    }
}

impl SystemctlBackend {
    fn systemctl(&self, root: &Path, args: &[String]) -> Result<Vec<u8>, ServiceError> {
        let out = crate::exec::run(CommandSpec {
            root,
            isolation: self.isolation,
            command: "/usr/bin/systemctl",
            args,
            stdin: None,
            timeout: self.timeout,
            max_output: 64 << 10,
        })
        .map_err(|e| match e {
            CommandError::Timeout(t) => ServiceError::Timeout(t),
            CommandError::Failed(m) => ServiceError::Failed(m),
        })?;
        if out.exit_code != 0 {
            return Err(ServiceError::Failed(format!(
                "systemctl {} exited with {}: {}",
                args.join(" "),
                out.exit_code,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(out.stdout)
    }
}

impl ServiceBackend for SystemctlBackend {
    fn control(&self, root: &Path, unit: &str, action: ServiceAction) -> Result<UnitStatus, ServiceError> {
        self.systemctl(root, &[verb(action).to_owned(), "--".to_owned(), unit.to_owned()])?;
        self.status(root, unit)
    }

    fn status(&self, root: &Path, unit: &str) -> Result<UnitStatus, ServiceError> {
        let out = self.systemctl(
            root,
            &["show".to_owned(), "--property=ActiveState,SubState".to_owned(), "--".to_owned(), unit.to_owned()],
        )?;
        let text = String::from_utf8_lossy(&out);
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
                .unwrap_or("unknown")
                .to_owned()
        };
        Ok(UnitStatus { active_state: get("ActiveState"), sub_state: get("SubState") })
    }
}

/// Records what was asked instead of touching systemd, for the lab and tests. Every
/// action is appended to `<host root>/var/log/bosun-services.log` as `<action> <unit>`
/// (when `log_to_root` is set) and kept in memory; a unit that was started, restarted
/// or reloaded reports `active/running`, a stopped or never-touched one
/// `inactive/dead`.
#[derive(Default)]
pub struct RecordingBackend {
    log_to_root: bool,
    calls: Mutex<Vec<String>>,
    states: Mutex<HashMap<String, UnitStatus>>,
}

impl fmt::Debug for RecordingBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordingBackend").field("calls", &self.calls()).finish_non_exhaustive()
    }
}

impl RecordingBackend {
    /// A backend that keeps its record in memory only.
    pub fn in_memory() -> Self {
        RecordingBackend::default()
    }

    /// A backend that also appends each action to `<host root>/var/log/bosun-services.log`.
    pub fn logging_to_host_root() -> Self {
        RecordingBackend { log_to_root: true, ..RecordingBackend::default() }
    }

    /// Every call so far, oldest first, as `<action> <unit>`.
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// The log file this backend appends to under `root`.
    pub fn log_path(root: &Path) -> PathBuf {
        root.join("var/log/bosun-services.log")
    }

    fn record(&self, root: &Path, line: String) -> Result<(), ServiceError> {
        if self.log_to_root {
            use std::io::Write;
            let path = Self::log_path(root);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| ServiceError::Failed(format!("{}: {e}", dir.display())))?;
            }
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| ServiceError::Failed(format!("{}: {e}", path.display())))?;
            writeln!(f, "{line}").map_err(|e| ServiceError::Failed(format!("{}: {e}", path.display())))?;
        }
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(line);
        }
        Ok(())
    }
}

impl ServiceBackend for RecordingBackend {
    fn control(&self, root: &Path, unit: &str, action: ServiceAction) -> Result<UnitStatus, ServiceError> {
        self.record(root, format!("{} {unit}", verb(action)))?;
        let status = match action {
            ServiceAction::Stop => UnitStatus { active_state: "inactive".into(), sub_state: "dead".into() },
            _ => UnitStatus { active_state: "active".into(), sub_state: "running".into() },
        };
        if let Ok(mut states) = self.states.lock() {
            states.insert(unit.to_owned(), status.clone());
        }
        Ok(status)
    }

    fn status(&self, root: &Path, unit: &str) -> Result<UnitStatus, ServiceError> {
        self.record(root, format!("status {unit}"))?;
        Ok(self
            .states
            .lock()
            .ok()
            .and_then(|s| s.get(unit).cloned())
            .unwrap_or(UnitStatus { active_state: "inactive".into(), sub_state: "dead".into() }))
    }
}
