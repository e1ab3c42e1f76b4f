//! Running host commands: matching a request against `exec` grants, and starting the
//! command under the host root with an empty environment, a timeout and output caps.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bosun_api::grants::ExecGrant;

use crate::config::ExecIsolation;

/// `PATH` is the only variable a command gets.
pub(crate) const COMMAND_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Default per-command timeout when the grant sets none.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Default cap on stdout and stderr, each, when the grant sets none.
pub(crate) const DEFAULT_MAX_OUTPUT: u64 = 1 << 20;

/// Why a request does not match the grants. `NotGranted` carries the message the
/// plugin sees (it names the command and arguments).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    Invalid(String),
    NotGranted(String),
}

/// Checks that `path` is absolute and has no `.`, `..` or empty components.
pub(crate) fn normalized_absolute(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("`{path}` is not an absolute path"));
    }
    if path.contains('\0') {
        return Err("path contains a NUL byte".into());
    }
    if path.len() > 1 && (path.ends_with('/') || path.contains("//")) {
        return Err(format!("`{path}` has empty components"));
    }
    for c in Path::new(path).components() {
        match c {
            Component::RootDir | Component::Normal(_) => {}
            _ => return Err(format!("`{path}` has `.` or `..` components")),
        }
    }
    if path.split('/').any(|c| c == "." || c == "..") {
        return Err(format!("`{path}` has `.` or `..` components"));
    }
    Ok(())
}

/// How every argument pattern is matched: `*`, `?` and `[...]` never match a `/`, and
/// never match a `.` at the start of the argument or right after a `/`; case matters.
const MATCH: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: true,
};

/// The pattern a final `**` entry matches each remaining argument against.
const REST: &str = "**";

/// Whether `arg` has a `..` component: between `/`s, or as the value of `--opt=..`.
fn has_dotdot(arg: &str) -> bool {
    arg.split(['/', '=']).any(|c| c == "..")
}

/// Whether the compiled `pattern` (written as `raw`) admits one argument (see
/// [`ExecGrant::args`] for the rules).
fn admits(raw: &str, pattern: &glob::Pattern, arg: &str) -> bool {
    // An option is only ever admitted by a pattern that is itself an option: `*` stands
    // for an operand, and `--config=/x` must not slip in through it.
    if arg.starts_with('-') && !raw.starts_with('-') {
        return false;
    }
    // A pattern naming a path never admits a climb out of it, whatever its literals are
    // (`/etc/kubernetes/.*` would otherwise admit `/etc/kubernetes/..`).
    if raw.contains('/') && has_dotdot(arg) {
        return false;
    }
    pattern.matches_with(arg, MATCH)
}

/// Whether one granted argument list matches `args` (see [`ExecGrant::args`]). A final
/// `**` entry matches any number of remaining arguments, each of which must be admitted
/// by the glob `**` under the same rules as every other pattern (so no option, no `..`
/// and no component starting with `.`).
fn patterns_match(patterns: &[String], args: &[String]) -> bool {
    let (fixed, rest_any) = match patterns.split_last() {
        Some((last, init)) if last == REST => (init, true),
        _ => (patterns, false),
    };
    let count_ok = if rest_any {
        args.len() >= fixed.len()
    } else {
        args.len() == fixed.len()
    };
    count_ok
        && fixed
            .iter()
            .zip(args)
            .all(|(p, a)| glob::Pattern::new(p).is_ok_and(|c| admits(p, &c, a)))
        && glob::Pattern::new(REST)
            .is_ok_and(|c| args[fixed.len()..].iter().all(|a| admits(REST, &c, a)))
}

/// Why `args` may have been refused although a pattern looks like it should match: the
/// rules a shell-style reading of the patterns would not show.
fn refusal_hints(args: &[String]) -> String {
    let mut hints = String::new();
    if args.iter().any(|a| a.starts_with('-')) {
        hints.push_str(
            "; an argument starting with `-` matches only a pattern that itself starts with `-`",
        );
    }
    if args.iter().any(|a| has_dotdot(a)) {
        hints
            .push_str("; an argument with a `..` component never matches a pattern containing `/`");
    }
    if args.iter().any(|a| a.starts_with('.') || a.contains("/.")) {
        hints.push_str("; wildcards do not match a leading `.` of a path component");
    }
    hints
}

/// Finds the grant that allows `command args`, or says why none does.
pub(crate) fn authorize<'g>(
    grants: &'g [ExecGrant],
    command: &str,
    args: &[String],
) -> Result<&'g ExecGrant, Refusal> {
    normalized_absolute(command).map_err(|e| Refusal::Invalid(format!("command: {e}")))?;
    let mut for_command = grants.iter().filter(|g| g.command == command).peekable();
    if for_command.peek().is_none() {
        return Err(Refusal::NotGranted(format!(
            "exec: {command} (no exec grant names this command)"
        )));
    }
    for grant in for_command {
        let allowed = if grant.args.is_empty() {
            args.is_empty()
        } else {
            grant.args.iter().any(|p| patterns_match(p, args))
        };
        if allowed {
            return Ok(grant);
        }
    }
    let granted: Vec<String> = grants
        .iter()
        .filter(|g| g.command == command)
        .flat_map(|g| {
            if g.args.is_empty() {
                vec!["(no arguments)".to_owned()]
            } else {
                g.args.iter().map(|p| p.join(" ")).collect()
            }
        })
        .collect();
    Err(Refusal::NotGranted(format!(
        "exec: {command} {} (arguments match none of the granted patterns: {}{})",
        args.join(" "),
        granted.join(" | "),
        refusal_hints(args)
    )))
}

/// Checks a grant's own shape, once per run, so a typo in a grant is reported as such
/// instead of as a refused command.
pub(crate) fn validate_grant(grant: &ExecGrant) -> Result<(), String> {
    normalized_absolute(&grant.command)?;
    for list in &grant.args {
        for (i, p) in list.iter().enumerate() {
            if p == "**" && i + 1 != list.len() {
                return Err(format!(
                    "`**` may only be the last pattern, found in {list:?}"
                ));
            }
            glob::Pattern::new(p).map_err(|e| format!("pattern `{p}`: {e}"))?;
        }
    }
    Ok(())
}

/// The path an argument names, if it names one: an argument with a `/` in it (absolute,
/// or relative to the command's working directory, which is the host root), or the value
/// of an option written `--name=value` whose value has a `/`.
fn path_in(arg: &str) -> Option<&str> {
    let value = if arg.starts_with('-') {
        arg.split_once('=').map(|(_, v)| v)?
    } else {
        arg
    };
    value.contains('/').then_some(value)
}

/// Checks that the command and every argument that names a path ([`path_in`]) reach
/// their file beneath `root` without going through a symlink in any component, so that
/// what the grant's patterns matched (the text) is what the command acts on (the path).
///
/// A plugin with a read-write grant can make symlinks (WASI refuses only absolute
/// targets), and a granted command resolves them as the agent: with `cat` granted on
/// `/var/lib/foo/*`, a link `/var/lib/foo/x -> ../../../etc/shadow` would print the node's
/// shadow file. Each component is inspected with `lstat` through a cap-std handle of the
/// root, in order, so every component checked lies beneath the root and none is followed;
/// components past one that does not exist are not checked (nothing there to follow; the
/// command creates or fails on it). Returns the message the plugin sees.
pub(crate) fn check_paths(root: &Path, command: &str, args: &[String]) -> Result<(), String> {
    let dir =
        cap_std::fs::Dir::open_ambient_dir(root, cap_std::ambient_authority()).map_err(|e| {
            format!(
                "exec: cannot open the host root {} to check paths: {e}",
                root.display()
            )
        })?;
    let what = |i: Option<usize>| match i {
        None => "the command".to_owned(),
        Some(i) => format!("argument {} (`{}`)", i + 1, args[i]),
    };
    let paths = std::iter::once((None, command)).chain(
        args.iter()
            .enumerate()
            .filter_map(|(i, a)| path_in(a).map(|p| (Some(i), p))),
    );
    for (i, path) in paths {
        let mut prefix = PathBuf::new();
        for c in Path::new(path).components() {
            match c {
                Component::RootDir | Component::CurDir => continue,
                Component::ParentDir | Component::Prefix(_) => {
                    return Err(format!(
                        "exec: {command}: {} has a `..` component; name paths without `..`",
                        what(i)
                    ));
                }
                Component::Normal(n) => prefix.push(n),
            }
            let meta = match dir.symlink_metadata(&prefix) {
                Ok(m) => m,
                // Nothing further exists, so nothing further can be followed.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                    ) =>
                {
                    break;
                }
                Err(e) => {
                    return Err(format!(
                        "exec: {command}: {}: cannot inspect /{} ({e})",
                        what(i),
                        prefix.display()
                    ));
                }
            };
            if meta.file_type().is_symlink() {
                let target = dir
                    .read_link_contents(&prefix)
                    .map_or_else(|_| "?".to_owned(), |t| t.display().to_string());
                return Err(format!(
                    "exec: {command}: {} goes through the symlink /{} -> {target}; paths given to commands \
                     are never resolved through symlinks (a plugin may have made them): name the real path",
                    what(i),
                    prefix.display()
                ));
            }
            if !meta.is_dir() {
                break;
            }
        }
    }
    Ok(())
}

/// What a finished command produced.
#[derive(Debug)]
pub(crate) struct CommandOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub truncated: bool,
}

#[derive(Debug)]
pub(crate) enum CommandError {
    Timeout(Duration),
    Failed(String),
}

/// One command to start.
pub(crate) struct CommandSpec<'a> {
    pub root: &'a Path,
    pub isolation: ExecIsolation,
    /// Absolute path as seen inside the root.
    pub command: &'a str,
    pub args: &'a [String],
    pub stdin: Option<Vec<u8>>,
    pub timeout: Duration,
    pub max_output: u64,
}

/// Whether `root` is the real `/` (then no chroot or path rewriting is needed).
pub(crate) fn is_real_root(root: &Path) -> bool {
    root.canonicalize().is_ok_and(|p| p == Path::new("/"))
}

/// How long the host keeps reading after the command exited while its stdout or stderr
/// is still open. The command's own process group is killed at its exit, so whatever
/// still holds a pipe then left the group (a daemon started with `setsid`); its output
/// is not the command's, and waiting for it could take for ever.
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// Longest timeout honoured as such; longer ones (never from a grant, whose seconds are
/// a `u32`) are cut to this so that the deadline stays representable.
const MAX_TIMEOUT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Starts the command, waits for it up to its timeout (killing its whole process group
/// then) and returns its capped output.
///
/// Guarantees:
/// - a zero timeout (a call with no time left) starts nothing and is a
///   [`CommandError::Timeout`];
/// - in real-root mode the command starts in `/` (chrooted ones `chdir("/")` in the
///   root), never in the agent's working directory;
/// - the call returns by the command's deadline plus the time to reap it: stdout and
///   stderr are read on this thread without blocking, output beyond the cap is read and
///   discarded so the command never blocks on a full pipe, and when a process outside
///   the command's group keeps a pipe open after the command exited, reading stops
///   [`EXIT_GRACE`] later (never after the deadline) and the output is reported
///   `truncated`.
pub(crate) fn run(spec: CommandSpec<'_>) -> Result<CommandOutput, CommandError> {
    if spec.timeout.is_zero() {
        return Err(CommandError::Timeout(Duration::ZERO));
    }
    let rel = spec.command.trim_start_matches('/');
    let real_root = is_real_root(spec.root);
    let mut cmd = if real_root {
        let mut cmd = Command::new(spec.command);
        cmd.current_dir("/");
        cmd
    } else {
        match spec.isolation {
            ExecIsolation::Chroot => Command::new(spec.command),
            ExecIsolation::ResolveOnly => {
                let resolved = resolve_under(spec.root, rel)?;
                let mut cmd = Command::new(resolved);
                cmd.current_dir(spec.root);
                cmd
            }
        }
    };
    cmd.args(spec.args)
        .env_clear()
        .env("PATH", COMMAND_PATH)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let chroot = match spec.isolation {
        ExecIsolation::Chroot if !real_root => Some(root_cstring(spec.root)?),
        _ => None,
    };
    confine_before_exec(&mut cmd, chroot);
    let deadline = Instant::now() + spec.timeout.min(MAX_TIMEOUT);
    let mut child = cmd
        .spawn()
        .map_err(|e| CommandError::Failed(format!("could not start {}: {e}", spec.command)))?;
    let pid = child.id();
    let give_up = |child: &mut std::process::Child, e: CommandError| {
        terminate(child, pid);
        Err(e)
    };
    let mut io = match Pipes::take(&mut child, spec.stdin, spec.max_output) {
        Ok(io) => io,
        Err(e) => {
            return give_up(
                &mut child,
                CommandError::Failed(format!("pipes of {}: {e}", spec.command)),
            );
        }
    };

    let mut pause = Duration::from_micros(100);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => {
                return give_up(
                    &mut child,
                    CommandError::Failed(format!("waiting for {}: {e}", spec.command)),
                );
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return give_up(&mut child, CommandError::Timeout(spec.timeout));
        }
        if let Err(e) = io.pump(pause.min(deadline - now)) {
            return give_up(
                &mut child,
                CommandError::Failed(format!("reading the output of {}: {e}", spec.command)),
            );
        }
        pause = (pause * 2).min(Duration::from_millis(10));
    };
    // Whatever the command left behind in its process group goes with it: otherwise a
    // background child holding the pipes would keep this call reading.
    kill_group(pid);
    io.stdin = None;
    let stop = deadline.min(Instant::now() + EXIT_GRACE);
    while io.reading() {
        let now = Instant::now();
        if now >= stop || io.pump(stop - now).is_err() {
            break;
        }
    }
    let abandoned = io.reading();
    if abandoned {
        tracing::warn!(
            command = spec.command,
            "the command exited but a process outside its group keeps its output open; output cut at what was read"
        );
    }
    let (stdout, stderr) = (io.stdout.take(), io.stderr.take());
    Ok(CommandOutput {
        exit_code: status.code().unwrap_or(-1),
        truncated: stdout.1 || stderr.1 || abandoned,
        stdout: stdout.0,
        stderr: stderr.0,
    })
}

/// Output kept up to a cap; what goes beyond it is counted as truncation and dropped.
struct Capped {
    kept: Vec<u8>,
    cap: u64,
    truncated: bool,
}

impl Capped {
    fn push(&mut self, data: &[u8]) {
        let room =
            usize::try_from(self.cap.saturating_sub(self.kept.len() as u64)).unwrap_or(usize::MAX);
        if data.len() > room {
            self.truncated = true;
        }
        self.kept.extend_from_slice(&data[..data.len().min(room)]);
    }

    fn take(&mut self) -> (Vec<u8>, bool) {
        (std::mem::take(&mut self.kept), self.truncated)
    }
}

/// The parent's ends of a command's pipes, non-blocking, served by [`Pipes::pump`] on
/// the calling thread: no reader or writer thread can outlive the call.
struct Pipes {
    /// Our end of the command's stdin, the input and how much of it was written.
    stdin: Option<(File, Vec<u8>, usize)>,
    out: Option<File>,
    err: Option<File>,
    stdout: Capped,
    stderr: Capped,
}

impl Pipes {
    fn take(
        child: &mut std::process::Child,
        input: Option<Vec<u8>>,
        cap: u64,
    ) -> std::io::Result<Pipes> {
        let stdin = match (child.stdin.take(), input) {
            (Some(p), Some(input)) => Some((nonblocking(OwnedFd::from(p))?, input, 0)),
            _ => None,
        };
        let out = child
            .stdout
            .take()
            .map(|p| nonblocking(OwnedFd::from(p)))
            .transpose()?;
        let err = child
            .stderr
            .take()
            .map(|p| nonblocking(OwnedFd::from(p)))
            .transpose()?;
        let capped = || Capped {
            kept: Vec::new(),
            cap,
            truncated: false,
        };
        Ok(Pipes {
            stdin,
            out,
            err,
            stdout: capped(),
            stderr: capped(),
        })
    }

    /// Whether stdout or stderr is still open (some process still holds its write end).
    fn reading(&self) -> bool {
        self.out.is_some() || self.err.is_some()
    }

    /// Waits up to `wait` for any pipe to be ready, then reads what is there and writes
    /// what fits. Closes a pipe at its end (EOF, or the command closed its stdin).
    #[allow(unsafe_code)]
    fn pump(&mut self, wait: Duration) -> std::io::Result<()> {
        let fd = |f: Option<&File>| f.map_or(-1, AsRawFd::as_raw_fd);
        let mut fds = [
            libc::pollfd {
                fd: fd(self.out.as_ref()),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: fd(self.err.as_ref()),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: fd(self.stdin.as_ref().map(|s| &s.0)),
                events: libc::POLLOUT,
                revents: 0,
            },
        ];
        if fds.iter().all(|p| p.fd < 0) {
            std::thread::sleep(wait);
            return Ok(());
        }
        let timeout = libc::timespec {
            tv_sec: libc::time_t::try_from(wait.as_secs()).unwrap_or(libc::time_t::MAX),
            // Below 10^9: fits every `c_long`.
            tv_nsec: wait.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `fds` is a live array of 3 initialised pollfds (ppoll ignores negative
        // fds), `timeout` a live timespec, and a null signal mask leaves the mask alone;
        // ppoll writes only the `revents` fields.
        let n = unsafe {
            libc::ppoll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                &timeout,
                std::ptr::null(),
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == std::io::ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            };
        }
        if fds[0].revents != 0 {
            drain(&mut self.out, &mut self.stdout);
        }
        if fds[1].revents != 0 {
            drain(&mut self.err, &mut self.stderr);
        }
        if fds[2].revents != 0 {
            self.feed();
        }
        Ok(())
    }

    /// Writes as much of the input as the pipe takes; closes it when all is written (so
    /// the command sees EOF) or the command closed its end (it does not read its stdin).
    fn feed(&mut self) {
        let Some((pipe, input, written)) = &mut self.stdin else {
            return;
        };
        let done = loop {
            if *written == input.len() {
                break true;
            }
            match pipe.write(&input[*written..]) {
                Ok(n) => *written += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                Err(_) => break true,
            }
        };
        if done {
            self.stdin = None;
        }
    }
}

/// Reads everything available from `pipe` into `into`; closes it at EOF or on error.
fn drain(pipe: &mut Option<File>, into: &mut Capped) {
    let Some(f) = pipe else { return };
    let mut buf = [0u8; 8192];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => into.push(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(_) => break,
        }
    }
    *pipe = None;
}

/// Turns our end of a pipe into a non-blocking file.
#[allow(unsafe_code)]
fn nonblocking(fd: OwnedFd) -> std::io::Result<File> {
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl(2) on a descriptor we own; F_GETFL/F_SETFL touch only the status
    // flags of our end (the command's end of the pipe is a separate open file).
    let ok = unsafe {
        let flags = libc::fcntl(raw, libc::F_GETFL);
        flags >= 0 && libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
    };
    if !ok {
        return Err(std::io::Error::last_os_error());
    }
    Ok(File::from(fd))
}

/// What the plugin is told when its command got no time or ran out of it.
pub(crate) fn timeout_message(command: &str, timeout: Duration) -> String {
    if timeout.is_zero() {
        format!("{command} was not started: the call's deadline has passed")
    } else {
        format!("{command} ran longer than {timeout:?} and was killed")
    }
}

/// Resolves `rel` under `root` for [`ExecIsolation::ResolveOnly`], refusing a path
/// whose symlinks lead outside the root.
fn resolve_under(root: &Path, rel: &str) -> Result<PathBuf, CommandError> {
    let root = root
        .canonicalize()
        .map_err(|e| CommandError::Failed(format!("host root {}: {e}", root.display())))?;
    let path = root.join(rel).canonicalize().map_err(|e| {
        CommandError::Failed(format!(
            "command /{rel} under host root {}: {e}",
            root.display()
        ))
    })?;
    if !path.starts_with(&root) {
        return Err(CommandError::Failed(format!(
            "command /{rel} resolves to {} outside the host root {}",
            path.display(),
            root.display()
        )));
    }
    Ok(path)
}

/// The host root as a C string for chroot(2).
fn root_cstring(root: &Path) -> Result<std::ffi::CString, CommandError> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(root.as_os_str().as_bytes())
        .map_err(|_| CommandError::Failed("host root path contains a NUL byte".into()))
}

/// Set by the SIGTERM handler of a command's keeper (see [`confine_before_exec`]).
static TERMINATE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_terminate(_signal: libc::c_int) {
    TERMINATE.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// How long the host lets a command's keeper clean up after asking it to (at a timeout)
/// before killing the whole process group.
const TERM_GRACE: Duration = Duration::from_secs(1);

/// Confines the command between fork and exec. The forked child becomes the command's
/// *keeper*; it forks the command and stays behind:
///
/// - `no_new_privs` for both: exec never grants privileges (setuid/setgid bits and file
///   capabilities are ignored), so a plugin-written setuid binary gains nothing;
/// - a PID namespace whose init is the command, where the agent may create one
///   (`CAP_SYS_ADMIN`): when the command ends, the kernel kills everything left in it;
/// - the keeper is a child subreaper: whatever the command leaves running (a daemon
///   started with `setsid` leaves the process group, so the group kill alone misses
///   it) is re-parented to the keeper when its parent exits, and when the command has
///   ended the keeper kills and reaps all of its remaining children, round after round,
///   until none is left (listed in `/proc/thread-self/children`; without that file, as
///   before, only the process group is killed). This needs no privilege;
/// - with `chroot`, the command (only) is chrooted into the host root and starts in `/`.
///
/// The keeper closes every descriptor (so the command alone holds the output pipes and
/// the spawn's exec-error pipe), waits for the command and exits with its status (by the
/// same signal when it was killed). On SIGTERM (a timeout, see [`terminate`]) it kills the
/// command, sweeps, and exits. The keeper and the command share the process group the
/// host kills last.
#[allow(unsafe_code)]
fn confine_before_exec(cmd: &mut Command, chroot: Option<std::ffi::CString>) {
    use std::os::unix::process::CommandExt;
    // SAFETY: runs in the forked child before exec, single-threaded. It makes only
    // async-signal-safe system calls (prctl, unshare, sigaction, fork, chroot, chdir,
    // close_range, close, open, read, kill, waitpid, signal, getpid, _exit) on C strings
    // prepared before the fork, plain integers and stack buffers; it allocates nothing and
    // takes no lock. The keeper never returns into the standard library: it leaves with
    // `_exit`. The handler only stores to an atomic.
    unsafe {
        cmd.pre_exec(move || {
            let (zero, one): (libc::c_ulong, libc::c_ulong) = (0, 1);
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, one, zero, zero, zero) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Not permitted without CAP_SYS_ADMIN: then the subreaper alone cleans up.
            let _ = libc::unshare(libc::CLONE_NEWPID);
            if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, one, zero, zero, zero) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_terminate as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGTERM, &action, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            match libc::fork() {
                -1 => Err(std::io::Error::last_os_error()),
                0 => {
                    libc::signal(libc::SIGTERM, libc::SIG_DFL);
                    if let Some(root) = &chroot {
                        if libc::chroot(root.as_ptr()) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        if libc::chdir(c"/".as_ptr()) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                }
                command => keep(command),
            }
        });
    }
}

/// The keeper's life after forking `command` (see [`confine_before_exec`]).
#[allow(unsafe_code)]
unsafe fn keep(command: libc::pid_t) -> ! {
    // SAFETY: see confine_before_exec; called only in the forked keeper.
    unsafe {
        if libc::close_range(0, libc::c_uint::MAX, 0) != 0 {
            for fd in 0..1024 {
                libc::close(fd);
            }
        }
        let mut status: libc::c_int = 0;
        let mut terminated = false;
        loop {
            if TERMINATE.load(std::sync::atomic::Ordering::SeqCst) && !terminated {
                libc::kill(command, libc::SIGKILL);
                terminated = true;
            }
            let r = libc::waitpid(command, &mut status, 0);
            if r == command {
                break;
            }
            if r == -1 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
        sweep();
        if terminated {
            libc::_exit(128 + libc::SIGTERM);
        }
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            libc::signal(sig, libc::SIG_DFL);
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(libc::WEXITSTATUS(status))
    }
}

/// Kills and reaps every child of the calling process, including the orphans re-parented
/// to it as a subreaper, until it has none. Does nothing without
/// `/proc/thread-self/children`.
#[allow(unsafe_code)]
unsafe fn sweep() {
    // SAFETY: see confine_before_exec; called only in the forked keeper.
    unsafe {
        let mut status: libc::c_int = 0;
        for _round in 0..100_000 {
            let fd = libc::open(
                c"/proc/thread-self/children".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            );
            if fd < 0 {
                return;
            }
            let mut buf = [0u8; 4096];
            let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            libc::close(fd);
            let Ok(n) = usize::try_from(n) else { return };
            let mut killed = 0;
            let mut pid: libc::pid_t = 0;
            for &b in buf[..n].iter().chain(std::iter::once(&b' ')) {
                if b.is_ascii_digit() {
                    pid = pid
                        .saturating_mul(10)
                        .saturating_add(libc::pid_t::from(b - b'0'));
                } else if pid > 0 {
                    libc::kill(pid, libc::SIGKILL);
                    killed += 1;
                    pid = 0;
                }
            }
            if killed == 0 {
                while libc::waitpid(-1, &mut status, libc::WNOHANG) > 0 {}
                return;
            }
            // Wait for one of them, then reap whatever else has ended.
            while libc::waitpid(-1, &mut status, 0) == -1
                && *libc::__errno_location() == libc::EINTR
            {}
            while libc::waitpid(-1, &mut status, libc::WNOHANG) > 0 {}
        }
    }
}

/// Stops a command at its timeout: asks its keeper to kill it and everything it left
/// (SIGTERM), gives it [`TERM_GRACE`], then kills the process group and reaps the keeper.
#[allow(unsafe_code)]
fn terminate(child: &mut std::process::Child, pid: u32) {
    if let Ok(p) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) on our own child, not yet reaped, so the pid is still ours.
        unsafe {
            libc::kill(p, libc::SIGTERM);
        }
        let until = Instant::now() + TERM_GRACE;
        while Instant::now() < until {
            if !matches!(child.try_wait(), Ok(None)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    kill_group(pid);
    let _ = child.wait();
}

/// Sends SIGKILL to the process group led by `pid` (the command and anything it forked).
#[allow(unsafe_code)]
fn kill_group(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is touched.
    // The group was created for this command by `process_group(0)`, so it holds only
    // the command and its descendants.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(command: &str, args: &[&[&str]]) -> ExecGrant {
        ExecGrant {
            command: command.into(),
            args: args
                .iter()
                .map(|l| l.iter().map(|s| (*s).to_owned()).collect())
                .collect(),
            timeout_seconds: None,
            max_output_bytes: None,
            dry_run: false,
            optional: false,
        }
    }

    fn v(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn patterns_match_position_by_position() {
        let g = [grant(
            "/usr/bin/kubeadm",
            &[&["upgrade", "apply", "v1.*"], &["certs", "renew", "**"]],
        )];
        assert!(authorize(&g, "/usr/bin/kubeadm", &v(&["upgrade", "apply", "v1.34.1"])).is_ok());
        assert!(authorize(&g, "/usr/bin/kubeadm", &v(&["certs", "renew"])).is_ok());
        assert!(authorize(&g, "/usr/bin/kubeadm", &v(&["certs", "renew", "all", "x"])).is_ok());
        for bad in [
            &["upgrade", "apply"][..],
            &["upgrade", "apply", "v2.0", "x"],
            &["reset", "-f"],
            &["certs"],
        ] {
            match authorize(&g, "/usr/bin/kubeadm", &v(bad)) {
                Err(Refusal::NotGranted(m)) => assert!(m.contains("/usr/bin/kubeadm"), "{m}"),
                other => panic!("{bad:?} should be refused, got {other:?}"),
            }
        }
    }

    #[test]
    fn empty_arg_list_allows_only_no_arguments() {
        let g = [grant("/bin/true", &[])];
        assert!(authorize(&g, "/bin/true", &[]).is_ok());
        assert!(matches!(
            authorize(&g, "/bin/true", &v(&["x"])),
            Err(Refusal::NotGranted(_))
        ));
    }

    #[test]
    fn commands_must_match_exactly_and_be_normal() {
        let g = [grant("/usr/bin/kubeadm", &[&["**"]])];
        assert!(matches!(
            authorize(&g, "/usr/bin/kubectl", &[]),
            Err(Refusal::NotGranted(_))
        ));
        for bad in [
            "usr/bin/kubeadm",
            "/usr/bin/../bin/kubeadm",
            "/usr//bin/kubeadm",
            "/usr/./bin/kubeadm",
        ] {
            assert!(
                matches!(authorize(&g, bad, &[]), Err(Refusal::Invalid(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn grants_with_misplaced_double_star_are_invalid() {
        assert!(validate_grant(&grant("/bin/x", &[&["**", "a"]])).is_err());
        assert!(validate_grant(&grant("/bin/x", &[&["[a"]])).is_err());
        assert!(validate_grant(&grant("bin/x", &[])).is_err());
        assert!(validate_grant(&grant("/bin/x", &[&["a", "**"]])).is_ok());
    }

    fn refused(g: &[ExecGrant], command: &str, args: &[&str]) -> String {
        match authorize(g, command, &v(args)) {
            Err(Refusal::NotGranted(m)) => m,
            other => panic!("{command} {args:?} should be refused, got {other:?}"),
        }
    }

    #[test]
    fn path_patterns_admit_neither_separators_nor_dotdot_nor_leading_dots() {
        let g = [grant("/bin/rm", &[&["-f", "/etc/kubernetes/tmp/*"]])];
        assert!(authorize(&g, "/bin/rm", &v(&["-f", "/etc/kubernetes/tmp/old.conf"])).is_ok());
        for arg in [
            "/etc/kubernetes/tmp/../../shadow",
            "/etc/kubernetes/tmp/a/b",
            "/etc/kubernetes/tmp/.hidden",
            "/etc/kubernetes/tmp/..",
        ] {
            refused(&g, "/bin/rm", &["-f", arg]);
        }
        // A literal dot in the pattern may match a leading dot, but never a `..`.
        let g = [grant("/bin/chmod", &[&["0755", "/usr/bin/.*"]])];
        assert!(authorize(&g, "/bin/chmod", &v(&["0755", "/usr/bin/.kubelet.new"])).is_ok());
        let m = refused(&g, "/bin/chmod", &["0755", "/usr/bin/.."]);
        assert!(m.contains("`..` component"), "{m}");
        // Case matters.
        refused(&[grant("/bin/x", &[&["V1.*"]])], "/bin/x", &["v1.2"]);
    }

    #[test]
    fn options_match_only_patterns_that_are_options() {
        let g = [grant(
            "/usr/bin/kubeadm",
            &[
                &["certs", "renew", "*"],
                &["certs", "renew", "*", "--config=/etc/kubeadm/*.yaml"],
            ],
        )];
        assert!(authorize(&g, "/usr/bin/kubeadm", &v(&["certs", "renew", "all"])).is_ok());
        assert!(
            authorize(
                &g,
                "/usr/bin/kubeadm",
                &v(&["certs", "renew", "all", "--config=/etc/kubeadm/a.yaml"])
            )
            .is_ok()
        );
        for bad in [
            &["certs", "renew", "--config=/x"][..],
            &["certs", "renew", "-h"],
            &[
                "certs",
                "renew",
                "all",
                "--config=/etc/kubeadm/../../x.yaml",
            ],
            &["certs", "renew", "all", "--config=/etc/kubeadm/a/b.yaml"],
        ] {
            refused(&g, "/usr/bin/kubeadm", bad);
        }
        let m = refused(&g, "/usr/bin/kubeadm", &["certs", "renew", "--config=/x"]);
        assert!(
            m.contains("matches only a pattern that itself starts with `-`"),
            "{m}"
        );
    }

    #[test]
    fn a_final_double_star_admits_no_option_dotdot_or_hidden_component() {
        let g = [grant("/bin/x", &[&["run", "**"]])];
        assert!(authorize(&g, "/bin/x", &v(&["run"])).is_ok());
        assert!(authorize(&g, "/bin/x", &v(&["run", "a", "b/c", "/etc/x"])).is_ok());
        for bad in ["--x", "-f", "..", "a/../b", "/etc/..", ".hidden", "a/.b"] {
            refused(&g, "/bin/x", &["run", "ok", bad]);
        }
    }

    fn spec<'a>(
        root: &'a Path,
        command: &'a str,
        args: &'a [String],
        timeout: Duration,
    ) -> CommandSpec<'a> {
        CommandSpec {
            root,
            isolation: ExecIsolation::Chroot,
            command,
            args,
            stdin: None,
            timeout,
            max_output: 4096,
        }
    }

    #[test]
    fn real_root_commands_start_in_the_root_directory() {
        let out = run(spec(
            Path::new("/"),
            "/bin/pwd",
            &[],
            Duration::from_secs(60),
        ))
        .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "/\n");
    }

    #[test]
    fn no_time_left_starts_nothing() {
        // A command that cannot be started tells an attempt (`could not start`) from no
        // attempt at all: killing a started command at once could not show that.
        let missing = "/nonexistent/bosun-test-command";
        match run(spec(Path::new("/"), missing, &[], Duration::ZERO)) {
            Err(CommandError::Timeout(t)) => assert!(t.is_zero()),
            other => panic!(
                "a zero timeout must be refused as a timeout before starting anything, got {other:?}"
            ),
        }
        assert!(timeout_message(missing, Duration::ZERO).contains("was not started"));
        match run(spec(Path::new("/"), missing, &[], Duration::from_secs(60))) {
            Err(CommandError::Failed(m)) => assert!(m.contains("could not start"), "{m}"),
            other => panic!("with time left the start is attempted, got {other:?}"),
        }
    }

    /// Whether this process may create namespaces (CAP_SYS_ADMIN in its effective set).
    fn may_unshare() -> bool {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("CapEff:").map(|v| v.trim().to_owned()))
            })
            .and_then(|v| u64::from_str_radix(&v, 16).ok())
            .is_some_and(|caps| caps & (1 << 21) != 0)
    }

    /// Outer pids of the processes whose command line contains `marker`.
    fn processes_with(marker: &str) -> Vec<libc::pid_t> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
            })
            .collect()
    }

    #[test]
    fn a_daemon_keeping_the_output_open_does_not_hold_the_call() {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("daemon.ready");
        let marker = format!("3600.{}1", std::process::id());
        // The daemon leaves the command's process group (setsid) with stdout and stderr
        // still open; the command exits as soon as the daemon has left the group (exiting
        // earlier would let the group kill take it). The daemon is found by its unique
        // sleep duration: inside a PID namespace its own `$$` is not an outer pid.
        let script = "setsid /bin/sh -c 'echo ready > \"$0\"; exec sleep \"$1\"' \"$0\" \"$1\" & while [ ! -s \"$0\" ]; do sleep 0.01; done; echo started";
        let args = v(&["-c", script, ready.to_str().unwrap(), &marker]);
        let out = run(spec(
            Path::new("/"),
            "/bin/sh",
            &args,
            Duration::from_secs(300),
        ));
        let left = processes_with(&marker);
        for pid in &left {
            // SAFETY: signals the daemon this test started, by its outer pid.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(*pid, libc::SIGKILL);
            }
        }
        let out = out.unwrap();
        assert_eq!(out.exit_code, 0);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "started\n");
        if may_unshare() {
            // The command was PID 1 of its own namespace: the daemon died with it, and
            // its copies of the pipes closed then.
            assert!(left.is_empty(), "the daemon outlived the command: {left:?}");
            assert!(!out.truncated);
        } else {
            assert!(
                out.truncated,
                "output still open after the exit must be reported as cut"
            );
        }
    }

    #[test]
    fn exit_codes_and_timeouts_pass_through_the_namespace_init() {
        let out = run(spec(
            Path::new("/"),
            "/bin/sh",
            &v(&["-c", "exit 7"]),
            Duration::from_secs(60),
        ))
        .unwrap();
        assert_eq!(out.exit_code, 7);
        match run(spec(
            Path::new("/"),
            "/bin/sh",
            &v(&["-c", "sleep 30"]),
            Duration::from_millis(300),
        )) {
            Err(CommandError::Timeout(_)) => {}
            other => panic!("expected a timeout, got {other:?}"),
        }
    }

    #[test]
    fn arguments_naming_paths_through_symlinks_are_refused() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("usr/bin")).unwrap();
        std::fs::create_dir_all(root.path().join("var/lib/foo")).unwrap();
        std::fs::write(root.path().join("usr/bin/cmd"), "").unwrap();
        std::fs::write(root.path().join("var/lib/foo/plain"), "").unwrap();
        std::os::unix::fs::symlink("../../../etc/shadow", root.path().join("var/lib/foo/x"))
            .unwrap();
        std::os::unix::fs::symlink("foo", root.path().join("var/lib/bar")).unwrap();
        let check = |args: &[&str]| check_paths(root.path(), "/usr/bin/cmd", &v(args));
        for ok in [
            &["/var/lib/foo/plain"][..],
            &["/var/lib/foo/new/deeper"],
            &["all", "v1.34.4"],
            &["--opt=value"],
            &["https://x/y"],
        ] {
            assert_eq!(check(ok), Ok(()), "{ok:?}");
        }
        for bad in [
            &["/var/lib/foo/x"][..],
            &["var/lib/foo/x"],
            &["--config=/var/lib/foo/x"],
            &["/var/lib/bar/plain"],
        ] {
            let e = check(bad).unwrap_err();
            assert!(e.contains("goes through the symlink"), "{bad:?}: {e}");
        }
        assert!(check(&["/var/lib/foo/../x"]).unwrap_err().contains("`..`"));
        std::os::unix::fs::symlink("cmd", root.path().join("usr/bin/link")).unwrap();
        let e = check_paths(root.path(), "/usr/bin/link", &[]).unwrap_err();
        assert!(
            e.contains("the command goes through the symlink /usr/bin/link -> cmd"),
            "{e}"
        );
    }

    #[test]
    fn stdin_is_fed_and_output_capped_without_threads() {
        let args = v(&["-c", "cat; head -c 100000 /dev/zero"]);
        let input = vec![b'x'; 300_000];
        let mut s = spec(Path::new("/"), "/bin/sh", &args, Duration::from_secs(60));
        s.stdin = Some(input);
        s.max_output = 1 << 20;
        let out = run(s).unwrap();
        assert_eq!(out.exit_code, 0);
        assert_eq!(out.stdout.len(), 400_000);
        assert!(!out.truncated);
        let mut s = spec(Path::new("/"), "/bin/sh", &args, Duration::from_secs(60));
        s.max_output = 10;
        let out = run(s).unwrap();
        assert_eq!(out.stdout.len(), 10);
        assert!(out.truncated);
    }
}
