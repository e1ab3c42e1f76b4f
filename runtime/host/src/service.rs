//! systemd units: the [`ServiceBackend`] the `service` host interface drives after the
//! grant check, with a systemctl backend for real nodes and a recording one for the lab
//! (OpenRC's is in openrc.rs).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bosun_api::grants::{ServiceAction, ServiceGrant};

use crate::config::ExecIsolation;
use crate::exec::{CommandError, CommandSpec};

/// The program the systemd backend runs, under the host root.
pub const SYSTEMCTL: &str = "/usr/bin/systemctl";

/// Characters systemctl reads as a glob in a unit name (`stop 'kube*'` acts on every
/// loaded unit that matches), plus `\`, its escape.
const GLOB_CHARS: &[char] = &['*', '?', '[', ']', '\\'];

/// Checks that `unit` names exactly one systemd unit: not empty, not an option (no
/// leading `-`), no `/`, no control character, and none of `*?[]\`, which systemctl
/// would expand to every matching unit. Used for the unit a plugin asks for and for
/// every granted unit.
pub(crate) fn check_unit_name(unit: &str) -> Result<(), String> {
    if unit.is_empty()
        || unit.starts_with('-')
        || unit.contains('/')
        || unit.chars().any(char::is_control)
    {
        return Err(format!(
            "`{unit}` is not a systemd unit name: expected a name such as `kubelet.service`, \
             not empty, without a leading `-`, `/` or control characters"
        ));
    }
    if let Some(c) = unit.chars().find(|c| GLOB_CHARS.contains(c)) {
        return Err(format!(
            "`{unit}` contains `{c}`, which systemctl treats as a pattern matching many units; \
             name each unit exactly (e.g. `kubelet.service`)"
        ));
    }
    Ok(())
}

/// Checks every service grant's unit name (see [`check_unit_name`]) before a call, so
/// a grant like `kube*` is reported as a broken grant instead of acting on many units.
pub(crate) fn validate_grants(grants: &[ServiceGrant]) -> Result<(), crate::Error> {
    for g in grants {
        check_unit_name(&g.unit).map_err(|reason| crate::Error::InvalidGrant {
            grant: format!("service {}", g.unit),
            reason,
        })?;
    }
    Ok(())
}

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
    /// systemctl ran out of time (or, with a zero duration, was not started because the
    /// call had no time left).
    #[error("{}", if .0.is_zero() { "systemctl was not started: the call's deadline has passed".to_owned() } else { format!("systemctl did not finish within {:?}", .0) })]
    Timeout(Duration),
}

/// Performs unit actions on a node. Called only after the grant check (which also
/// checked the unit name): a backend does no authorization of its own. `root` is the
/// host root of the node; `time_left` is what remains of the plugin call, and a backend
/// must return within it (with [`ServiceError::Timeout`] when it cannot).
pub trait ServiceBackend: Send + Sync {
    fn control(
        &self,
        root: &Path,
        unit: &str,
        action: ServiceAction,
        time_left: Duration,
    ) -> Result<UnitStatus, ServiceError>;
    fn status(
        &self,
        root: &Path,
        unit: &str,
        time_left: Duration,
    ) -> Result<UnitStatus, ServiceError>;
    /// The service manager this backend drives, as policies see it
    /// (`input.node.serviceManager`): `systemd`, `openrc`, or `simulated` for a stand-in.
    fn manager(&self) -> &'static str;
    /// The program this backend runs under the host root (`None`: it runs none), which
    /// the agent's `agent/host-binaries` preflight check requires for service grants.
    fn program(&self) -> Option<&'static str>;
    /// Paths the service manager itself executes (or sources) on the host's behalf when it
    /// acts on a unit. A service action is refused when the calling plugin could write
    /// under one of them (see [`crate::openrc::writable_by_plugin`]). Empty for a manager
    /// that runs only what it already loaded (systemd: a changed unit file takes effect
    /// only at a `daemon-reload`, which no grant can ask for).
    fn executes(&self) -> &'static [&'static str] {
        &[]
    }
}

/// Drives the node's systemd with `systemctl`, started like a granted command (chrooted
/// into the host root when it is not `/`, empty environment). Each systemctl run gets
/// `timeout` or what is left of the call, whichever is shorter; no run starts once the
/// call's time is up.
#[derive(Clone, Debug)]
pub struct SystemctlBackend {
    pub isolation: ExecIsolation,
    /// Longest any one systemctl run may take.
    pub timeout: Duration,
}

impl Default for SystemctlBackend {
    fn default() -> Self {
        SystemctlBackend {
            isolation: ExecIsolation::Chroot,
            timeout: Duration::from_secs(120),
        }
    }
}

/// The instant `time_left` from now; a duration too large to represent means no deadline
/// beyond each run's own `timeout`.
pub(crate) fn deadline_in(time_left: Duration, timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(time_left)
        .or_else(|| now.checked_add(timeout))
        .unwrap_or(now)
}

impl SystemctlBackend {
    /// Runs systemctl with `args`, for at most `self.timeout` and never past `deadline`.
    fn systemctl(
        &self,
        root: &Path,
        args: &[String],
        deadline: Instant,
    ) -> Result<Vec<u8>, ServiceError> {
        let sandbox = crate::confine::Sandbox::systemctl();
        let out = crate::exec::run(CommandSpec {
            sandbox: &sandbox,
            root,
            isolation: self.isolation,
            command: SYSTEMCTL,
            args,
            stdin: None,
            timeout: self
                .timeout
                .min(deadline.saturating_duration_since(Instant::now())),
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

    fn show(&self, root: &Path, unit: &str, deadline: Instant) -> Result<UnitStatus, ServiceError> {
        check_unit_name(unit).map_err(ServiceError::Failed)?;
        let out = self.systemctl(
            root,
            &[
                "show".to_owned(),
                "--property=ActiveState,SubState".to_owned(),
                "--".to_owned(),
                unit.to_owned(),
            ],
            deadline,
        )?;
        let text = String::from_utf8_lossy(&out);
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
                .unwrap_or("unknown")
                .to_owned()
        };
        Ok(UnitStatus {
            active_state: get("ActiveState"),
            sub_state: get("SubState"),
        })
    }
}

impl ServiceBackend for SystemctlBackend {
    fn control(
        &self,
        root: &Path,
        unit: &str,
        action: ServiceAction,
        time_left: Duration,
    ) -> Result<UnitStatus, ServiceError> {
        // Defence in depth: the grant check refused such names already.
        check_unit_name(unit).map_err(ServiceError::Failed)?;
        // One deadline for both runs: the status query gets what the action left.
        let deadline = deadline_in(time_left, self.timeout);
        self.systemctl(
            root,
            &[action.as_str().to_owned(), "--".to_owned(), unit.to_owned()],
            deadline,
        )?;
        after_action(self.show(root, unit, deadline))
    }

    fn status(
        &self,
        root: &Path,
        unit: &str,
        time_left: Duration,
    ) -> Result<UnitStatus, ServiceError> {
        self.show(root, unit, deadline_in(time_left, self.timeout))
    }

    fn manager(&self) -> &'static str {
        "systemd"
    }

    fn program(&self) -> Option<&'static str> {
        Some(SYSTEMCTL)
    }
}

/// The status reported after an action systemd carried out. A status query that fails then
/// does not turn the action into a failure: the action happened, and an action that shuts
/// the node down (a start of `reboot.target`) closes systemd's bus before the query can
/// ask (`Failed to connect to bus`, seen on the real-node lab). Such a status reads
/// `unknown`/`unknown`. A query that runs out of the call's time is still a timeout.
fn after_action(status: Result<UnitStatus, ServiceError>) -> Result<UnitStatus, ServiceError> {
    match status {
        Err(ServiceError::Failed(_)) => Ok(UnitStatus {
            active_state: "unknown".into(),
            sub_state: "unknown".into(),
        }),
        other => other,
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
        f.debug_struct("RecordingBackend")
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

impl RecordingBackend {
    /// A backend that keeps its record in memory only.
    pub fn in_memory() -> Self {
        RecordingBackend::default()
    }

    /// A backend that also appends each action to `<host root>/var/log/bosun-services.log`.
    pub fn logging_to_host_root() -> Self {
        RecordingBackend {
            log_to_root: true,
            ..RecordingBackend::default()
        }
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
            append_beneath(root, Path::new(LOG_DIR), LOG_FILE, &line).map_err(|e| {
                ServiceError::Failed(format!(
                    "recording `{line}` in /{LOG_DIR}/{LOG_FILE} under {}: {e}",
                    root.display()
                ))
            })?;
        }
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(line);
        }
        Ok(())
    }
}

const LOG_DIR: &str = "var/log";
const LOG_FILE: &str = "bosun-services.log";

/// Appends `line` and a newline to `dir/file` beneath `root`, creating both if missing,
/// without following a symlink anywhere: a plugin with a read-write `/var/log` grant can
/// replace the log (or `log` itself) with a symlink, and the backend must neither append
/// to nor create the file it points to. The directories are walked one component at a
/// time through cap-std ([`open_dir_nofollow`](crate::facts::open_dir_nofollow)); the file
/// is opened `O_NOFOLLOW | O_NONBLOCK` and must be a regular file.
fn append_beneath(root: &Path, dir: &Path, file: &str, line: &str) -> std::io::Result<()> {
    use cap_std::fs::{OpenOptions, OpenOptionsExt};
    use std::io::Write;
    let root = cap_std::fs::Dir::open_ambient_dir(root, cap_std::ambient_authority())?;
    let dir = crate::facts::open_dir_nofollow(&root, dir, true)?;
    if dir
        .symlink_metadata(file)
        .is_ok_and(|m| m.file_type().is_symlink())
    {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the log is a symlink, which is never followed",
        ));
    }
    let mut options = OpenOptions::new();
    options
        .create(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY);
    let mut f = dir.open_with(file, &options)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the log is not a regular file",
        ));
    }
    writeln!(f, "{line}")
}

impl ServiceBackend for RecordingBackend {
    fn control(
        &self,
        root: &Path,
        unit: &str,
        action: ServiceAction,
        _time_left: Duration,
    ) -> Result<UnitStatus, ServiceError> {
        self.record(root, format!("{} {unit}", action.as_str()))?;
        let status = match action {
            ServiceAction::Stop => UnitStatus {
                active_state: "inactive".into(),
                sub_state: "dead".into(),
            },
            _ => UnitStatus {
                active_state: "active".into(),
                sub_state: "running".into(),
            },
        };
        if let Ok(mut states) = self.states.lock() {
            states.insert(unit.to_owned(), status.clone());
        }
        Ok(status)
    }

    fn status(
        &self,
        root: &Path,
        unit: &str,
        _time_left: Duration,
    ) -> Result<UnitStatus, ServiceError> {
        self.record(root, format!("status {unit}"))?;
        Ok(self
            .states
            .lock()
            .ok()
            .and_then(|s| s.get(unit).cloned())
            .unwrap_or(UnitStatus {
                active_state: "inactive".into(),
                sub_state: "dead".into(),
            }))
    }

    fn manager(&self) -> &'static str {
        "simulated"
    }

    fn program(&self) -> Option<&'static str> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_names_with_glob_characters_are_refused() {
        for unit in [
            "kubelet.service",
            "getty@tty1.service",
            "bosun-agent.service",
        ] {
            assert!(check_unit_name(unit).is_ok(), "{unit}");
        }
        for unit in [
            "kube*.service",
            "kubelet.servic?",
            "kube[a-z]let.service",
            "kubelet]",
            "kube\\x2dlet.service",
        ] {
            let e = check_unit_name(unit).unwrap_err();
            assert!(e.contains("pattern matching many units"), "{unit}: {e}");
        }
        for unit in ["", "-kubelet.service", "a/b.service", "a\nb.service"] {
            assert!(check_unit_name(unit).is_err(), "{unit:?}");
        }
        let grant = |unit: &str| ServiceGrant {
            unit: unit.into(),
            actions: vec![ServiceAction::Restart],
        };
        assert!(validate_grants(&[grant("kubelet.service")]).is_ok());
        match validate_grants(&[grant("kubelet.service"), grant("*.service")]) {
            Err(crate::Error::InvalidGrant { grant, reason }) => {
                assert_eq!(grant, "service *.service");
                assert!(reason.contains("`*`"), "{reason}");
            }
            other => panic!("a glob unit grant must be invalid, got {other:?}"),
        }
    }

    #[test]
    fn the_recording_log_never_follows_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("root"), dir.path().join("outside"));
        std::fs::create_dir_all(root.join("var/log")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let backend = RecordingBackend::logging_to_host_root();
        let restart = |b: &RecordingBackend| {
            b.control(
                &root,
                "kubelet.service",
                ServiceAction::Restart,
                Duration::from_secs(5),
            )
        };
        // A plugin with a read-write /var/log grant points the log at a file outside the
        // root (relative, so that WASI lets it make the link) ...
        std::fs::write(outside.join("target"), "untouched\n").unwrap();
        std::os::unix::fs::symlink(
            "../../../outside/target",
            root.join("var/log/bosun-services.log"),
        )
        .unwrap();
        assert!(matches!(restart(&backend), Err(ServiceError::Failed(m)) if m.contains("symlink")));
        assert_eq!(
            std::fs::read_to_string(outside.join("target")).unwrap(),
            "untouched\n"
        );
        // ... at a file that does not exist yet ...
        std::fs::remove_file(root.join("var/log/bosun-services.log")).unwrap();
        std::os::unix::fs::symlink(
            "../../../outside/created",
            root.join("var/log/bosun-services.log"),
        )
        .unwrap();
        assert!(restart(&backend).is_err());
        assert!(
            !outside.join("created").exists(),
            "the dangling link's target was created"
        );
        // ... or replaces /var/log itself.
        std::fs::remove_dir_all(root.join("var/log")).unwrap();
        std::os::unix::fs::symlink("../../outside", root.join("var/log")).unwrap();
        assert!(matches!(restart(&backend), Err(ServiceError::Failed(m)) if m.contains("symlink")));
        assert!(!outside.join("bosun-services.log").exists());
        // A real directory and file are appended to, and made when missing.
        std::fs::remove_file(root.join("var/log")).unwrap();
        restart(&backend).unwrap();
        backend
            .status(&root, "kubelet.service", Duration::from_secs(5))
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(RecordingBackend::log_path(&root)).unwrap(),
            "restart kubelet.service\nstatus kubelet.service\n"
        );
    }

    /// A host root whose systemctl succeeds at `restart`, hangs at `show` and fails
    /// at anything else.
    fn fake_systemctl() -> (tempfile::TempDir, SystemctlBackend) {
        systemctl_script(
            "case \"$1\" in restart) exit 0 ;; show) exec sleep 600 ;; *) exit 3 ;; esac",
        )
    }

    /// A host root whose `/usr/bin/systemctl` is the shell script `body`, and a backend that
    /// runs it.
    fn systemctl_script(body: &str) -> (tempfile::TempDir, SystemctlBackend) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        let script = bin.join("systemctl");
        std::fs::write(&script, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        (
            dir,
            SystemctlBackend {
                isolation: ExecIsolation::ResolveOnly,
                timeout: Duration::from_secs(30),
            },
        )
    }

    #[test]
    fn systemctl_is_not_started_when_the_call_has_no_time_left() {
        // A root without systemctl: an attempt to run it would fail as `Failed`, so a
        // timeout shows that no attempt was made.
        let dir = tempfile::tempdir().unwrap();
        let backend = SystemctlBackend {
            isolation: ExecIsolation::ResolveOnly,
            timeout: Duration::from_secs(30),
        };
        for result in [
            backend.control(
                dir.path(),
                "kubelet.service",
                ServiceAction::Restart,
                Duration::ZERO,
            ),
            backend.status(dir.path(), "kubelet.service", Duration::ZERO),
        ] {
            match result {
                Err(e @ ServiceError::Timeout(_)) => {
                    assert!(e.to_string().contains("not started"), "{e}")
                }
                other => panic!("expected a timeout before starting systemctl, got {other:?}"),
            }
        }
        assert!(matches!(
            backend.status(dir.path(), "kubelet.service", Duration::from_secs(30)),
            Err(ServiceError::Failed(_))
        ));
    }

    /// A systemctl whose actions succeed and whose status query fails, as systemd's does
    /// once a start of reboot.target has closed its bus: the action is not a failure.
    #[test]
    fn a_status_query_that_fails_after_the_action_reads_unknown() {
        let (dir, backend) = systemctl_script(
            "case \"$1\" in start) exit 0 ;; *) echo 'Failed to connect to bus: Connection refused' >&2; exit 1 ;; esac",
        );
        let left = Duration::from_secs(30);
        let status = backend
            .control(dir.path(), "reboot.target", ServiceAction::Start, left)
            .unwrap();
        assert_eq!(
            (status.active_state.as_str(), status.sub_state.as_str()),
            ("unknown", "unknown")
        );
        // A failed action is still a failure, and a status query alone still fails.
        match backend.control(dir.path(), "reboot.target", ServiceAction::Stop, left) {
            Err(ServiceError::Failed(m)) => assert!(m.contains("Failed to connect to bus"), "{m}"),
            other => panic!("expected the stop to fail, got {other:?}"),
        }
        assert!(matches!(
            backend.status(dir.path(), "reboot.target", left),
            Err(ServiceError::Failed(_))
        ));
    }

    #[test]
    fn both_systemctl_runs_of_control_share_the_calls_time() {
        let (dir, backend) = fake_systemctl();
        let left = Duration::from_secs(1);
        // The restart returns at once; the status query after it never does, and must be
        // stopped within what the call had left, not after systemctl's own 120 s.
        match backend.control(dir.path(), "kubelet.service", ServiceAction::Restart, left) {
            Err(ServiceError::Timeout(t)) => assert!(
                t <= left,
                "systemctl was given {t:?}, the call had {left:?}"
            ),
            other => panic!("expected a timeout, got {other:?}"),
        }
        // The fake systemctl exits 0 only for `restart` and hangs only for `show` (its
        // sandbox lets it write nothing to record its calls): a timeout is what the
        // restart returning and the status query hanging give.
        drop(dir);
    }
}
