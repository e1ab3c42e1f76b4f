//! OpenRC services: the [`ServiceBackend`] for nodes whose init system is OpenRC (Alpine,
//! Gentoo, Devuan, Debian with `openrc`), and the choice between it and systemd for a node.
//!
//! systemd does a unit's work itself: `systemctl` only asks PID 1 over its private socket,
//! so it runs in a sandbox that reaches nothing else (`Sandbox::systemctl`). OpenRC has no
//! daemon to ask. `rc-service` runs the service's init script itself, as root, and the
//! daemon the script starts must outlive the call. So `rc-service` cannot run like a granted
//! command: the command's kernel boundary (Landlock, seccomp, its cgroup, which is emptied
//! when the command ends) would be inherited by the kubelet it starts, and the kubelet would
//! be killed with the call. It runs as the service manager instead: chrooted into the host
//! root, with an empty environment but for `PATH`, its own process group, and the call's
//! deadline (the group is killed when it passes; a daemon that left the group with
//! `setsid`, as `supervise-daemon` and `start-stop-daemon --background` do, is the started
//! service and stays). OpenRC needs the node's `/proc` and `/dev` in the host root, as a
//! booted node has them.
//!
//! What that costs is written down in docs/security.md ("Services on OpenRC nodes"): the
//! host executes what OpenRC executes. Nothing a plugin could have written may be, so a
//! service action is refused when the calling plugin could write under any path OpenRC
//! executes or reads as configuration ([`EXECUTED`]), through a filesystem grant or a
//! granted command's sandbox ([`writable_by_plugin`]).

use std::io::{Read, Seek};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bosun_api::grants::{Access, Grants, ServiceAction};

use crate::service::{ServiceBackend, ServiceError, UnitStatus, check_unit_name, deadline_in};

/// Paths OpenRC executes or reads as shell when it acts on a service: init scripts and
/// their `conf.d` files (which are sourced), OpenRC's own configuration, libraries and
/// state, and the directories the programs it and the scripts run come from (its `PATH`,
/// the dynamic loader's). A plugin that can write beneath one, or to one of their parents,
/// cannot act on services of an OpenRC node.
pub const EXECUTED: &[&str] = &[
    "/etc/init.d",
    "/etc/conf.d",
    "/etc/rc.conf",
    "/etc/runlevels",
    "/etc/ld.so.preload",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/usr/local/etc/init.d",
    "/usr/local/etc/conf.d",
    "/lib/rc",
    "/usr/lib/rc",
    "/usr/libexec/rc",
    "/run/openrc",
    "/bin",
    "/sbin",
    "/usr/bin",
    "/usr/sbin",
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
];

/// `PATH` of `rc-service`: the node's own system directories (OpenRC sets its own for the
/// scripts from it).
pub const PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// The program, inside the host root.
pub const RC_SERVICE: &str = "/sbin/rc-service";

/// Largest output of one `rc-service` run that is kept (for error messages).
const MAX_OUTPUT: u64 = 64 << 10;

/// Suffixes of systemd unit types other than services, which OpenRC has no equivalent of.
const OTHER_UNIT_TYPES: &[&str] = &[
    "target",
    "socket",
    "timer",
    "mount",
    "automount",
    "path",
    "slice",
    "scope",
    "device",
    "swap",
];

/// The OpenRC service a unit name stands for: `kubelet.service` and `kubelet` are both
/// the service `kubelet` (`/etc/init.d/kubelet`), so one grant serves both init systems.
/// Other unit types (`reboot.target`) have no OpenRC equivalent and are refused.
pub fn service_name(unit: &str) -> Result<&str, String> {
    check_unit_name(unit)?;
    let name = unit.strip_suffix(".service").unwrap_or(unit);
    if let Some((_, suffix)) = unit.rsplit_once('.')
        && OTHER_UNIT_TYPES.contains(&suffix)
    {
        return Err(format!(
            "`{unit}` is a systemd {suffix}; this node's services are run by OpenRC, which has \
             services only (`/etc/init.d/NAME`): grant and ask for `NAME.service` or `NAME`"
        ));
    }
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@' | '+'))
    {
        return Err(format!(
            "`{unit}` does not name an OpenRC service: expected letters, digits and `._-@+` \
             (the name of a script in /etc/init.d)"
        ));
    }
    Ok(name)
}

/// The first grant through which the plugin holding `grants` could write beneath (or to a
/// parent of) a path in `executed`, described for the refusal; `None` when there is none.
/// Grant paths are compared as written and, where they exist under `root`, as they resolve
/// there (a granted `/opt/x` that is a link to `/etc/init.d` is `/etc/init.d`).
pub fn writable_by_plugin(grants: &Grants, executed: &[&str], root: &Path) -> Option<String> {
    let writable = grants
        .filesystem
        .iter()
        .filter(|g| g.access == Access::ReadWrite)
        .map(|g| (g.path.as_str(), format!("filesystem grant {}", g.path)))
        .chain(grants.exec.iter().flat_map(|e| {
            e.sandbox
                .filesystem
                .iter()
                .filter(|p| p.access == Access::ReadWrite)
                .map(move |p| {
                    (
                        p.path.as_str(),
                        format!("the sandbox of granted command {} ({})", e.command, p.path),
                    )
                })
        }));
    for (path, what) in writable {
        for form in [Some(normalize(path)), resolved(root, path)]
            .into_iter()
            .flatten()
        {
            if let Some(hit) = executed.iter().find(|e| overlaps(&form, e)) {
                return Some(format!("{what} can write {hit}"));
            }
        }
    }
    None
}

/// `path` without `.` components and repeated or trailing slashes, each `..` taking away
/// the component before it (never above `/`): the path it names when nothing on the way is
/// a symlink, whatever the grant validation of the day refuses. ([`resolved`] covers links.)
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// `path` as it resolves under `root`, when it exists and stays beneath it.
fn resolved(root: &Path, path: &str) -> Option<String> {
    let root = root.canonicalize().ok()?;
    let real = root
        .join(path.trim_start_matches('/'))
        .canonicalize()
        .ok()?;
    let rel = real.strip_prefix(&root).ok()?;
    Some(normalize(&rel.to_string_lossy()))
}

/// Whether `a` is `b`, beneath `b`, or a parent of `b`.
fn overlaps(a: &str, b: &str) -> bool {
    let beneath = |x: &str, y: &str| y == "/" || x == y || x.starts_with(&format!("{y}/"));
    beneath(a, b) || beneath(b, a)
}

/// Drives the node's OpenRC with `rc-service` (see the module documentation for how it
/// runs). Each run gets `timeout` or what is left of the call, whichever is shorter.
#[derive(Clone, Debug)]
pub struct OpenRcBackend {
    /// Longest any one rc-service run may take.
    pub timeout: Duration,
}

impl Default for OpenRcBackend {
    fn default() -> Self {
        OpenRcBackend {
            timeout: Duration::from_secs(120),
        }
    }
}

/// What one rc-service run left.
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

impl OpenRcBackend {
    fn rc_service(
        &self,
        root: &Path,
        args: &[&str],
        deadline: Instant,
    ) -> Result<Ran, ServiceError> {
        let timeout = self
            .timeout
            .min(deadline.saturating_duration_since(Instant::now()));
        if timeout.is_zero() {
            return Err(ServiceError::Timeout(Duration::ZERO));
        }
        let failed = |what: &str, e: std::io::Error| {
            ServiceError::Failed(format!("rc-service {} {what}: {e}", args.join(" ")))
        };
        // Output goes to memory files, not pipes: a daemon the script starts may keep its
        // copy open for as long as it runs.
        let memfile = |name: &str| {
            rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)
                .map(std::fs::File::from)
                .map_err(|e| failed("(its output file)", e.into()))
        };
        let mut out = memfile("rc-service-stdout")?;
        let mut err = memfile("rc-service-stderr")?;
        let mut cmd = Command::new(RC_SERVICE);
        cmd.args(args)
            .env_clear()
            .env("PATH", PATH)
            .stdin(Stdio::null())
            .stdout(
                out.try_clone()
                    .map_err(|e| failed("(its output file)", e))?,
            )
            .stderr(
                err.try_clone()
                    .map_err(|e| failed("(its output file)", e))?,
            );
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let in_root = root
            .canonicalize()
            .map_err(|e| ServiceError::Failed(format!("the host root {}: {e}", root.display())))?;
        if in_root != Path::new("/") {
            let dir = std::ffi::CString::new(in_root.as_os_str().as_encoded_bytes())
                .map_err(|_| ServiceError::Failed("the host root contains a NUL".into()))?;
            // SAFETY: between fork and exec only async-signal-safe calls (chroot, chdir)
            // on memory allocated before the fork.
            #[allow(unsafe_code)]
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    if libc::chroot(dir.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| failed(&format!("could not be started in {}", root.display()), e))?;
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if started.elapsed() >= timeout => {
                    crate::exec::kill_group(child.id());
                    let _ = child.wait();
                    return Err(ServiceError::Timeout(timeout));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(failed("(waiting for it)", e)),
            }
        };
        // Nothing is killed after a run that ended: what it left running is the service it
        // started (a daemonizing supervisor may not have left the group yet).
        let read = |f: &mut std::fs::File| {
            let mut bytes = Vec::new();
            let _ = f.rewind();
            let _ = f.take(MAX_OUTPUT).read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        };
        Ok(Ran {
            code: status.code().unwrap_or(-1),
            stdout: read(&mut out),
            stderr: read(&mut err),
        })
    }

    fn query(
        &self,
        root: &Path,
        name: &str,
        deadline: Instant,
    ) -> Result<UnitStatus, ServiceError> {
        let ran = self.rc_service(root, &[name, "status"], deadline)?;
        parse_status(&ran.stdout).ok_or_else(|| {
            ServiceError::Failed(format!(
                "rc-service {name} status exited with {}: {}",
                ran.code,
                clean(&format!("{}{}", ran.stdout, ran.stderr))
            ))
        })
    }
}

/// `rc-service NAME status` prints ` * status: started` (exit 0), `stopped` (3),
/// `crashed` (32) and so on; in systemd's words, which the service capability speaks on
/// every node.
fn parse_status(stdout: &str) -> Option<UnitStatus> {
    let lines: Vec<String> = stdout.lines().map(strip_escapes).collect();
    let state = lines
        .iter()
        .find_map(|l| {
            l.trim()
                .trim_start_matches('*')
                .trim()
                .strip_prefix("status:")
        })?
        .trim();
    let (active, sub) = match state {
        "started" => ("active", "running"),
        "starting" => ("activating", "start"),
        "stopping" => ("deactivating", "stop"),
        "stopped" | "inactive" => ("inactive", "dead"),
        "crashed" => ("failed", "crashed"),
        _ => ("unknown", "unknown"),
    };
    Some(UnitStatus {
        active_state: active.into(),
        sub_state: sub.into(),
    })
}

/// rc-service's output on one line, without the colour codes it may print.
fn clean(text: &str) -> String {
    strip_escapes(text)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` without terminal escape sequences and control characters but newlines.
fn strip_escapes(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else if !c.is_control() || c == '\n' {
            out.push(c);
        }
    }
    out
}

impl ServiceBackend for OpenRcBackend {
    fn control(
        &self,
        root: &Path,
        unit: &str,
        action: ServiceAction,
        time_left: Duration,
    ) -> Result<UnitStatus, ServiceError> {
        let name = service_name(unit).map_err(ServiceError::Failed)?;
        let deadline = deadline_in(time_left, self.timeout);
        let ran = self.rc_service(root, &[name, action.as_str()], deadline)?;
        if ran.code != 0 {
            return Err(ServiceError::Failed(format!(
                "rc-service {name} {} exited with {}: {}",
                action.as_str(),
                ran.code,
                clean(&format!("{}{}", ran.stdout, ran.stderr))
            )));
        }
        self.query(root, name, deadline)
    }

    fn status(
        &self,
        root: &Path,
        unit: &str,
        time_left: Duration,
    ) -> Result<UnitStatus, ServiceError> {
        let name = service_name(unit).map_err(ServiceError::Failed)?;
        self.query(root, name, deadline_in(time_left, self.timeout))
    }

    fn manager(&self) -> &'static str {
        "openrc"
    }

    fn program(&self) -> Option<&'static str> {
        Some(RC_SERVICE)
    }

    fn executes(&self) -> &'static [&'static str] {
        EXECUTED
    }
}

/// Which init system runs a node's services, as found in its host root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceManager {
    Systemd,
    OpenRc,
}

/// The init system that booted the node under `root`: OpenRC when it left its state
/// directory (`/run/openrc/softlevel`, written by `openrc` at boot) and systemd did not
/// (`/run/systemd/system`, sd_booted(3)'s test); systemd otherwise, as before there was a
/// choice. Read from `/run`, which no plugin is granted (`EXECUTED` holds `/run/openrc`).
pub fn detect(root: &Path) -> ServiceManager {
    let has = |p: &str| std::fs::symlink_metadata(root.join(p)).is_ok();
    if has("run/openrc/softlevel") && !has("run/systemd/system") {
        ServiceManager::OpenRc
    } else {
        ServiceManager::Systemd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_names_map_to_openrc_services() {
        assert_eq!(service_name("kubelet.service"), Ok("kubelet"));
        assert_eq!(service_name("kubelet"), Ok("kubelet"));
        assert_eq!(service_name("getty@tty1.service"), Ok("getty@tty1"));
        let e = service_name("reboot.target").unwrap_err();
        assert!(e.contains("systemd target") && e.contains("OpenRC"), "{e}");
        for bad in ["kube*", "-x", "a/b", ".service", "a b.service", "a;b"] {
            assert!(service_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn status_lines_read_in_systemds_words() {
        let s = |t: &str| parse_status(t).map(|s| (s.active_state, s.sub_state));
        assert_eq!(
            s(" * status: started\n"),
            Some(("active".into(), "running".into()))
        );
        assert_eq!(
            s(" * status: stopped\n"),
            Some(("inactive".into(), "dead".into()))
        );
        assert_eq!(
            s("\u{1b}[32m*\u{1b}[0m status: crashed"),
            Some(("failed".into(), "crashed".into())),
            "colour codes are left out"
        );
        assert_eq!(
            s(" * status: what"),
            Some(("unknown".into(), "unknown".into()))
        );
        assert_eq!(s("rc-service: service `x' does not exist"), None);
    }

    #[test]
    fn a_write_grant_over_what_openrc_executes_is_found() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc/init.d")).unwrap();
        std::fs::create_dir_all(dir.path().join("opt")).unwrap();
        std::os::unix::fs::symlink("../etc/init.d", dir.path().join("opt/scripts")).unwrap();
        let found = |json: &str| {
            let grants: Grants = serde_json::from_str(json).unwrap();
            writable_by_plugin(&grants, EXECUTED, dir.path())
        };
        for (json, hit) in [
            (
                r#"{"filesystem": [{"path": "/etc", "access": "ReadWrite"}]}"#,
                "/etc/init.d",
            ),
            (
                r#"{"filesystem": [{"path": "/etc/conf.d/", "access": "ReadWrite"}]}"#,
                "/etc/conf.d",
            ),
            (
                r#"{"filesystem": [{"path": "/", "access": "ReadWrite"}]}"#,
                "/etc/init.d",
            ),
            (
                r#"{"filesystem": [{"path": "/usr/bin/kubelet", "access": "ReadWrite"}]}"#,
                "/usr/bin",
            ),
            (
                r#"{"filesystem": [{"path": "/opt/scripts", "access": "ReadWrite"}]}"#,
                "/etc/init.d",
            ),
            (
                r#"{"exec": [{"command": "/usr/bin/tee", "args": [["x"]], "sandbox": {"filesystem": [{"path": "/etc/conf.d/kubelet", "access": "ReadWrite"}]}}]}"#,
                "/etc/conf.d",
            ),
            // Shapes a grant could take to name the same places another way.
            (
                r#"{"filesystem": [{"path": "/etc/kubernetes/../conf.d", "access": "ReadWrite"}]}"#,
                "/etc/conf.d",
            ),
            (
                r#"{"filesystem": [{"path": "/../../etc/init.d", "access": "ReadWrite"}]}"#,
                "/etc/init.d",
            ),
            (
                r#"{"filesystem": [{"path": "//etc//./conf.d//", "access": "ReadWrite"}]}"#,
                "/etc/conf.d",
            ),
            (
                r#"{"filesystem": [{"path": "/run", "access": "ReadWrite"}]}"#,
                "/run/openrc",
            ),
            (
                r#"{"exec": [{"command": "/usr/bin/tee", "args": [["x"]], "sandbox": {"filesystem": [{"path": "/", "access": "ReadWrite"}]}}]}"#,
                "/etc/init.d",
            ),
            (
                r#"{"filesystem": [{"path": "/var/lib/kubelet", "access": "ReadOnly"}, {"path": "/usr/local/etc/init.d/kubelet", "access": "ReadWrite"}]}"#,
                "/usr/local/etc/init.d",
            ),
        ] {
            let m = found(json).unwrap_or_else(|| panic!("{json}: not found"));
            assert!(m.ends_with(&format!("can write {hit}")), "{json}: {m}");
        }
        for json in [
            r#"{"filesystem": [{"path": "/etc", "access": "ReadOnly"}]}"#,
            r#"{"filesystem": [{"path": "/var/lib/kubelet", "access": "ReadWrite"}]}"#,
            r#"{"filesystem": [{"path": "/etc/init.dx", "access": "ReadWrite"}]}"#,
            r#"{"filesystem": [{"path": "/etc/init.d/../../var/lib/x", "access": "ReadWrite"}]}"#,
            r#"{"exec": [{"command": "/usr/bin/tee", "args": [["x"]], "sandbox": {"filesystem": [{"path": "/etc", "access": "ReadOnly"}]}}]}"#,
            r#"{"services": [{"unit": "kubelet.service", "actions": ["restart"]}]}"#,
        ] {
            assert_eq!(found(json), None, "{json}");
        }
    }

    /// A host root whose `/sbin/rc-service` is the shell script `body`, with this machine's
    /// `/bin/sh` and `/bin/sleep` and the libraries they load (the backend always chroots into the root).
    fn rc_service_script(body: &str) -> tempfile::TempDir {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let copy = |from: &Path| {
            let to = dir.path().join(from.strip_prefix("/").unwrap());
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(from.canonicalize().unwrap(), &to).unwrap();
        };
        for program in ["/bin/sh", "/bin/sleep"] {
            copy(Path::new(program));
            let ldd = Command::new("ldd").arg(program).output().unwrap();
            for lib in String::from_utf8_lossy(&ldd.stdout).split_whitespace() {
                if lib.starts_with('/') && !dir.path().join(&lib[1..]).exists() {
                    copy(Path::new(lib));
                }
            }
        }
        let script = dir.path().join("sbin/rc-service");
        std::fs::create_dir_all(script.parent().unwrap()).unwrap();
        std::fs::write(&script, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    #[test]
    fn rc_service_gets_the_calls_time_and_its_failures_are_reported() {
        crate::exec::tests::require_root("rc_service_gets_the_calls_time");
        // Restart succeeds, status hangs: stopped within what the call had left.
        let root = rc_service_script(
            "case \"$2\" in restart) exit 0 ;; status) exec /bin/sleep 600 ;; *) exit 1 ;; esac",
        );
        let backend = OpenRcBackend::default();
        let left = Duration::from_secs(1);
        let started = Instant::now();
        match backend.control(root.path(), "kubelet.service", ServiceAction::Restart, left) {
            Err(ServiceError::Timeout(t)) => assert!(t <= left, "given {t:?} of {left:?}"),
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(30));
        // No time left: not started at all.
        assert!(matches!(
            backend.status(root.path(), "kubelet", Duration::ZERO),
            Err(ServiceError::Timeout(t)) if t.is_zero()
        ));
        // A failed action names the service, the exit code and what it printed; the
        // environment is empty but PATH, and the name is the service's, not the unit's.
        let root = rc_service_script(
            "echo \" * ERROR: $1 failed to $2 (HOME=$HOME PATH=$PATH)\" >&2; exit 1",
        );
        match backend.control(
            root.path(),
            "kubelet.service",
            ServiceAction::Stop,
            left * 10,
        ) {
            Err(ServiceError::Failed(m)) => assert_eq!(
                m,
                "rc-service kubelet stop exited with 1: * ERROR: kubelet failed to stop (HOME= PATH=/usr/sbin:/usr/bin:/sbin:/bin)"
            ),
            other => panic!("expected a failure, got {other:?}"),
        }
        // A status it cannot read is a failure, not a guess.
        match backend.status(root.path(), "kubelet", left * 10) {
            Err(ServiceError::Failed(m)) => assert!(m.contains("status exited with 1"), "{m}"),
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn openrc_is_chosen_only_when_it_booted_the_node_and_systemd_did_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(detect(root), ServiceManager::Systemd);
        std::fs::create_dir_all(root.join("run/openrc")).unwrap();
        assert_eq!(detect(root), ServiceManager::Systemd);
        std::fs::write(root.join("run/openrc/softlevel"), "").unwrap();
        assert_eq!(detect(root), ServiceManager::OpenRc);
        std::fs::create_dir_all(root.join("run/systemd/system")).unwrap();
        assert_eq!(detect(root), ServiceManager::Systemd);
    }
}
