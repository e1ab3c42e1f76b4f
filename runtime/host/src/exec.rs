//! Running host commands: matching a request against `exec` grants, and starting the
//! command under the host root with an empty environment, a timeout and output caps.
//!
//! `run_confined` (about 130 lines) is kept whole on purpose: it is the fork and exec of a
//! granted command, and what runs between them must only make system calls on what was
//! prepared before the fork; a reviewer checks that in one piece.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bosun_api::grants::{Access, ExecGrant};

use crate::config::ExecIsolation;
use crate::confine::Sandbox;

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

/// Which of `grant`'s argument patterns admits `args` (`None` for a grant with no patterns).
pub(crate) fn matching_pattern(grant: &ExecGrant, args: &[String]) -> Option<usize> {
    grant.args.iter().position(|p| patterns_match(p, args))
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
    for p in &grant.sandbox.filesystem {
        normalized_absolute(&p.path).map_err(|e| format!("sandbox filesystem: {e}"))?;
        if p.writable_in_dry_run && (p.access != Access::ReadWrite || !grant.dry_run) {
            return Err(format!(
                "sandbox filesystem {}: writableInDryRun needs `access: ReadWrite` on a grant with `dryRun: true`",
                p.path
            ));
        }
    }
    for socket in &grant.sandbox.unix_sockets {
        normalized_absolute(socket).map_err(|e| format!("sandbox unixSockets: {e}"))?;
    }
    if grant.sandbox.tcp_connect.contains(&0) {
        return Err("sandbox tcpConnect: port 0 is not a port one connects to".into());
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
    /// What the kernel lets the command reach (see [`crate::confine`]).
    pub sandbox: &'a Sandbox,
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
    run_confined(spec, None)
}

/// [`run`], with the kernel boundary already prepared (`Some`) instead of prepared from
/// `spec.sandbox`; only the benchmark passes one (an empty one, to measure the boundary's
/// cost against the same runner without it).
pub(crate) fn run_confined(
    spec: CommandSpec<'_>,
    prepared: Option<crate::confine::Prepared>,
) -> Result<CommandOutput, CommandError> {
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
    let root = match spec.isolation {
        ExecIsolation::Chroot if !real_root => Some(root_cstring(spec.root)?),
        _ => None,
    };
    // A command that is not chrooted loads its programs and libraries from the real `/`.
    let base_root = if root.is_some() {
        spec.root
    } else {
        Path::new("/")
    };
    let sandbox = match prepared {
        Some(p) => p,
        None => crate::confine::prepare(base_root, spec.root, spec.sandbox)
            .map_err(|e| CommandError::Failed(format!("{}: {e}", spec.command)))?,
    };
    // Everything the command starts goes into a cgroup of its own where the agent can make
    // one; dropping it (however this call ends) kills all that is left and removes it.
    let cgroup = match crate::cgroup::cgroups(spec.root) {
        Some(c) => Some(
            c.create(spec.sandbox.cgroup_limits())
                .map_err(|e| CommandError::Failed(format!("{}: {e}", spec.command)))?,
        ),
        None => None,
    };
    let mut confinement = Confinement::new(root, sandbox)?;
    confinement.cgroup_procs = cgroup.as_ref().map(crate::cgroup::CommandCgroup::procs_fd);
    confine_before_exec(&mut cmd, confinement);
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
    fn pump(&mut self, wait: Duration) -> std::io::Result<()> {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let (readable, writable) = (PollFlags::IN, PollFlags::OUT);
        let pipes = [
            (self.out.as_ref(), readable),
            (self.err.as_ref(), readable),
            (self.stdin.as_ref().map(|s| &s.0), writable),
        ];
        let mut fds = Vec::with_capacity(pipes.len());
        let mut slots = Vec::with_capacity(pipes.len());
        for (slot, (pipe, events)) in pipes.into_iter().enumerate() {
            if let Some(pipe) = pipe {
                fds.push(PollFd::new(pipe, events));
                slots.push(slot);
            }
        }
        if fds.is_empty() {
            std::thread::sleep(wait);
            return Ok(());
        }
        let timeout = Timespec {
            tv_sec: i64::try_from(wait.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: wait.subsec_nanos().into(),
        };
        match poll(&mut fds, Some(&timeout)) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let mut ready = [false; 3];
        for (fd, slot) in fds.iter().zip(slots) {
            ready[slot] = !fd.revents().is_empty();
        }
        drop(fds);
        if ready[0] {
            drain(&mut self.out, &mut self.stdout);
        }
        if ready[1] {
            drain(&mut self.err, &mut self.stderr);
        }
        if ready[2] {
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
fn nonblocking(fd: OwnedFd) -> std::io::Result<File> {
    // Only the status flags of our end change: the command's end is a separate open file.
    let flags = rustix::fs::fcntl_getfl(&fd)?;
    rustix::fs::fcntl_setfl(&fd, flags | rustix::fs::OFlags::NONBLOCK)?;
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

/// The host root as a C string for the system calls that enter it.
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

/// The capabilities a granted command keeps (of those the agent has): what maintaining
/// root-owned files needs (read and write them whatever their mode, set their owners and
/// modes) and switching users (package maintainer scripts). Everything else the agent
/// may hold is dropped: `CAP_SYS_CHROOT` (so a command cannot chroot(2) its way out of the
/// host root), `CAP_SYS_ADMIN` (no mounts, no namespaces), `CAP_KILL`, `CAP_SETPCAP`,
/// `CAP_SYS_PTRACE` and the rest. Because the command's set is then a strict subset of
/// the agent's, the kernel also refuses it ptrace-mode access to the agent and the
/// command's keeper (`/proc/<pid>/root`, `/proc/<pid>/fd`, `/proc/<pid>/mem`).
pub(crate) const COMMAND_CAPABILITIES: rustix::thread::CapabilitySet =
    rustix::thread::CapabilitySet::CHOWN
        .union(rustix::thread::CapabilitySet::DAC_OVERRIDE)
        .union(rustix::thread::CapabilitySet::DAC_READ_SEARCH)
        .union(rustix::thread::CapabilitySet::FOWNER)
        .union(rustix::thread::CapabilitySet::FSETID)
        .union(rustix::thread::CapabilitySet::SETGID)
        .union(rustix::thread::CapabilitySet::SETUID);

/// How one command is confined, prepared before the fork (nothing is allocated after it).
struct Confinement {
    /// The host root to enter, when it is not `/` and isolation is
    /// [`ExecIsolation::Chroot`].
    root: Option<std::ffi::CString>,
    /// The command's permitted and effective capabilities: [`COMMAND_CAPABILITIES`] that
    /// the calling thread has.
    capabilities: rustix::thread::CapabilitySet,
    /// Whether the calling thread may also drop capabilities from the bounding set
    /// (`CAP_SETPCAP`). Without it the bounding set stays, which `no_new_privs` makes
    /// harmless: an exec under `no_new_privs` never gains a capability the process did
    /// not already have.
    drop_bounding: bool,
    /// The kernel's allow-list for the command (Landlock, seccomp).
    sandbox: crate::confine::Prepared,
    /// `cgroup.procs` of the command's own cgroup, which the command writes itself into.
    cgroup_procs: Option<libc::c_int>,
}

impl Confinement {
    fn new(
        root: Option<std::ffi::CString>,
        sandbox: crate::confine::Prepared,
    ) -> Result<Confinement, CommandError> {
        let current = rustix::thread::capabilities(None).map_err(|e| {
            CommandError::Failed(format!("reading the agent's own capabilities: {e}"))
        })?;
        Ok(Confinement {
            root,
            capabilities: current.permitted & COMMAND_CAPABILITIES,
            drop_bounding: current
                .effective
                .contains(rustix::thread::CapabilitySet::SETPCAP),
            sandbox,
            cgroup_procs: None,
        })
    }
}

/// Puts the calling process (the forked command, before exec) under `root`.
///
/// Where the process may create a mount namespace (`CAP_SYS_ADMIN`), it gets its own: all
/// mounts become slaves (nothing the command mounts reaches the node), the root is bind
/// mounted onto itself with everything below it, `pivot_root` makes it `/`, and the old
/// root is detached, so nothing outside the host root is left in the command's mount
/// namespace at all, whatever capabilities it had. Without `CAP_SYS_ADMIN` (the shipped
/// DaemonSet) `unshare` is refused and the command is `chroot`ed instead; it then loses
/// `CAP_SYS_CHROOT` with the rest (see [`COMMAND_CAPABILITIES`]), which closes the
/// chroot(2) way back out. Either way it starts in `/`.
///
/// # Safety
///
/// Only between fork and exec; makes system calls on `root` and static C strings and
/// allocates nothing.
#[allow(unsafe_code)]
unsafe fn enter_root(root: &std::ffi::CStr) -> std::io::Result<()> {
    use rustix::mount::{MountPropagationFlags, UnmountFlags};
    // SAFETY: unsharing the mount namespace in a single-threaded forked child affects
    // only this process, which then execs.
    match unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) } {
        Ok(()) => {
            rustix::mount::mount_change(
                c"/",
                MountPropagationFlags::DOWNSTREAM | MountPropagationFlags::REC,
            )?;
            rustix::mount::mount_bind_recursive(root, root)?;
            rustix::process::chdir(root)?;
            rustix::process::pivot_root(c".", c".")?;
            rustix::mount::unmount(c".", UnmountFlags::DETACH)?;
        }
        Err(rustix::io::Errno::PERM) => rustix::process::chroot(root)?,
        Err(e) => return Err(e.into()),
    }
    rustix::process::chdir(c"/")?;
    Ok(())
}

/// Leaves the calling process (the forked command, before exec) with `keep` as its
/// permitted and effective capabilities, none inheritable or ambient, and, with
/// `drop_bounding`, none outside `keep` in its bounding set. Under `no_new_privs` the
/// exec that follows cannot add any back, root or not.
fn reduce_capabilities(
    keep: rustix::thread::CapabilitySet,
    drop_bounding: bool,
) -> std::io::Result<()> {
    use rustix::thread::CapabilitySet;
    if drop_bounding {
        for bit in 0..64 {
            let cap = CapabilitySet::from_bits_retain(1 << bit);
            if keep.contains(cap) {
                continue;
            }
            match rustix::thread::remove_capability_from_bounding_set(cap) {
                // Past the last capability this kernel knows.
                Ok(()) | Err(rustix::io::Errno::INVAL) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    rustix::thread::clear_ambient_capability_set()?;
    rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets {
            effective: keep,
            permitted: keep,
            inheritable: CapabilitySet::empty(),
        },
    )?;
    Ok(())
}

/// Confines the command between fork and exec. The forked child becomes the command's
/// *keeper*; it forks the command and stays behind:
///
/// - `no_new_privs` for both: exec never grants privileges (setuid/setgid bits and file
///   capabilities are ignored, and root gains no capability it did not have), so a
///   plugin-written setuid binary gains nothing;
/// - a PID namespace whose init is the command, where the agent may create one
///   (`CAP_SYS_ADMIN`): when the command ends, the kernel kills everything left in it;
/// - the keeper is a child subreaper: whatever the command leaves running (a daemon
///   started with `setsid` leaves the process group, so the group kill alone misses
///   it) is re-parented to the keeper when its parent exits, and when the command has
///   ended the keeper kills and reaps all of its remaining children, round after round,
///   until none is left (listed in `/proc/thread-self/children`; without that file, as
///   before, only the process group is killed). This needs no privilege;
/// - with a root to enter, the command (only) gets its own mount namespace with the host
///   root as `/`, or is chrooted there (see [`enter_root`]), and starts in `/`;
/// - the command (only) keeps just [`COMMAND_CAPABILITIES`] (see
///   [`reduce_capabilities`]); the keeper keeps the agent's, so it can still kill
///   whatever the command leaves and the command cannot reach into it.
///
/// The keeper closes every descriptor (so the command alone holds the output pipes and
/// the spawn's exec-error pipe), waits for the command and exits with its status (by the
/// same signal when it was killed). On SIGTERM (a timeout, see [`terminate`]) it kills the
/// command, sweeps, and exits. The keeper and the command share the process group the
/// host kills last.
#[allow(unsafe_code)]
fn confine_before_exec(cmd: &mut Command, confinement: Confinement) {
    use std::os::unix::process::CommandExt;
    // SAFETY: runs in the forked child before exec, single-threaded. It makes only
    // async-signal-safe system calls (prctl, unshare, sigaction, fork, mount, pivot_root,
    // umount2, chroot, chdir, capget, capset, close_range, close, open, read, kill,
    // waitpid, signal, getpid, _exit) on C strings prepared before the fork, plain
    // integers and stack buffers; it allocates nothing and takes no lock. The keeper never
    // returns into the standard library: it leaves with `_exit`. The handler only stores
    // to an atomic.
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
                    if let Some(fd) = confinement.cgroup_procs
                        && libc::write(fd, c"0".as_ptr().cast(), 1) != 1
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    if let Some(root) = &confinement.root {
                        enter_root(root)?;
                    }
                    reduce_capabilities(confinement.capabilities, confinement.drop_bounding)?;
                    confinement.sandbox.enter()
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
        if crate::confine::close_range(0, libc::c_uint::MAX, 0) != 0 {
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
fn terminate(child: &mut std::process::Child, pid: u32) {
    if let Some(p) = as_pid(pid) {
        // Our own child, not yet reaped: the pid is still ours.
        let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
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
/// The group was created for this command by `process_group(0)`, so it holds only the
/// command, its keeper and their descendants.
pub(crate) fn kill_group(pid: u32) {
    if let Some(p) = as_pid(pid) {
        let _ = rustix::process::kill_process_group(p, rustix::process::Signal::KILL);
    }
}

/// A child's id as a pid for kill(2).
fn as_pid(pid: u32) -> Option<rustix::process::Pid> {
    rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)
}

#[cfg(test)]
pub(crate) mod tests {
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
            sandbox: Default::default(),
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
    fn the_etcd_endpoint_pattern_admits_an_address_and_nothing_that_leaves_it() {
        // The etcd plugin's grant: the local member's address is read from kubeadm's manifest,
        // so the host is a wildcard; what the argument may not become is checked here, and the
        // port the command reaches is the kernel's (tcpConnect: [2379]).
        let g = [grant(
            "/usr/local/bin/etcdctl",
            &[&["--endpoints=https://*:2379", "member", "list"]],
        )];
        let run = |endpoint: &str| {
            authorize(
                &g,
                "/usr/local/bin/etcdctl",
                &v(&[endpoint, "member", "list"]),
            )
        };
        for good in [
            "--endpoints=https://10.231.0.11:2379",
            "--endpoints=https://[fd00::11]:2379",
            "--endpoints=https://cp1.example:2379",
            // A list: etcdctl would try both, and the kernel lets it reach port 2379 only.
            "--endpoints=https://a:80,b:2379",
        ] {
            assert!(run(good).is_ok(), "{good}");
        }
        for bad in [
            "--endpoints=https://evil/path:2379",
            "--endpoints=https://a:2379/../x:2379",
            "--endpoints=https://.hidden:2379",
            "--endpoints=http://10.0.0.1:2379",
            "--endpoints=https://10.0.0.1:2380",
            "--endpoints=https://10.0.0.1:2379 --insecure-skip-tls-verify",
            "--insecure-transport=https://x:2379",
        ] {
            assert!(
                matches!(run(bad), Err(Refusal::NotGranted(_))),
                "{bad} should be refused"
            );
        }
        // No extra argument slips in beside it.
        assert!(matches!(
            authorize(
                &g,
                "/usr/local/bin/etcdctl",
                &v(&[
                    "--endpoints=https://a:2379",
                    "member",
                    "list",
                    "--write-out=json"
                ])
            ),
            Err(Refusal::NotGranted(_))
        ));
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
        let mut g = grant("/bin/x", &[]);
        g.sandbox.filesystem.push(bosun_api::grants::CommandPath {
            path: "var/lib/x".into(),
            access: bosun_api::grants::Access::ReadWrite,
            execute: false,
            optional: false,
            writable_in_dry_run: false,
        });
        let e = validate_grant(&g).unwrap_err();
        assert!(
            e.contains("sandbox filesystem") && e.contains("absolute"),
            "{e}"
        );
        // writableInDryRun: only a ReadWrite path of a dry-run grant.
        for (access, dry_run, ok) in [
            (bosun_api::grants::Access::ReadWrite, true, true),
            (bosun_api::grants::Access::ReadOnly, true, false),
            (bosun_api::grants::Access::ReadWrite, false, false),
        ] {
            let mut g = grant("/bin/x", &[]);
            g.dry_run = dry_run;
            g.sandbox.filesystem.push(bosun_api::grants::CommandPath {
                path: "/var/log".into(),
                access,
                execute: false,
                optional: false,
                writable_in_dry_run: true,
            });
            match validate_grant(&g) {
                Ok(()) => assert!(ok, "{access:?} dryRun={dry_run} accepted"),
                Err(e) => assert!(
                    !ok && e
                        == "sandbox filesystem /var/log: writableInDryRun needs `access: ReadWrite` on a grant with `dryRun: true`",
                    "{e}"
                ),
            }
        }
        let mut g = grant("/bin/x", &[]);
        g.sandbox.unix_sockets.push("/run/../x.sock".into());
        assert!(
            validate_grant(&g)
                .unwrap_err()
                .contains("sandbox unixSockets")
        );
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

    /// A sandbox that lives as long as the test (commands borrow theirs).
    pub(crate) fn sandbox(paths: &[(&Path, bool)]) -> &'static Sandbox {
        Box::leak(Box::new(Sandbox {
            paths: paths
                .iter()
                .map(|(p, write)| crate::confine::SandboxPath {
                    path: p.to_str().unwrap().to_owned(),
                    write: *write,
                    execute: false,
                    optional: false,
                    origin: "the test",
                })
                .collect(),
            ..Sandbox::default()
        }))
    }

    fn spec<'a>(
        root: &'a Path,
        command: &'a str,
        args: &'a [String],
        timeout: Duration,
    ) -> CommandSpec<'a> {
        CommandSpec {
            sandbox: sandbox(&[]),
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
    pub(crate) fn may_unshare() -> bool {
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
        let mut s = spec(Path::new("/"), "/bin/sh", &args, Duration::from_secs(300));
        s.sandbox = sandbox(&[(dir.path(), true)]);
        let out = run(s);
        let left = processes_with(&marker);
        for pid in &left {
            // The daemon this test started, by its outer pid.
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(*pid).unwrap(),
                rustix::process::Signal::KILL,
            );
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

    /// Fails, rather than passes vacuously, when the test is not run as root: what it
    /// checks (the capabilities and mount namespace of commands an agent running as root
    /// starts) exists only then. CI and `tests/run.sh` run as root.
    pub(crate) fn require_root(what: &str) {
        assert!(
            rustix::process::geteuid().is_root(),
            "{what}: this test needs root (the agent runs as root); run the host's tests as root"
        );
    }

    /// The `Cap*` lines of `/proc/self/status` as the command saw them, by name.
    fn capability_lines(out: &CommandOutput) -> std::collections::BTreeMap<String, u64> {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_owned(), u64::from_str_radix(v.trim(), 16).ok()?))
            })
            .collect()
    }

    #[test]
    fn commands_keep_only_the_command_capabilities() {
        use rustix::thread::CapabilitySet;
        require_root("commands_keep_only_the_command_capabilities");
        let ours = rustix::thread::capabilities(None).unwrap();
        let more = CapabilitySet::SYS_CHROOT | CapabilitySet::SYS_ADMIN | CapabilitySet::KILL;
        assert!(
            ours.permitted.contains(more),
            "the test must hold more than the command set to show it is reduced: {:?}",
            ours.permitted
        );
        let expected = (ours.permitted & COMMAND_CAPABILITIES).bits();
        let script = "while read -r k v; do case $k in Cap*) echo \"$k $v\";; esac; done < /proc/self/status";
        let out = run(spec(
            Path::new("/"),
            "/bin/sh",
            &v(&["-c", script]),
            Duration::from_secs(60),
        ))
        .unwrap();
        let caps = capability_lines(&out);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(caps.get("CapPrm:"), Some(&expected), "{stdout}");
        assert_eq!(caps.get("CapEff:"), Some(&expected), "{stdout}");
        assert_eq!(caps.get("CapInh:"), Some(&0), "{stdout}");
        assert_eq!(caps.get("CapAmb:"), Some(&0), "{stdout}");
        if ours.effective.contains(CapabilitySet::SETPCAP) {
            assert_eq!(caps.get("CapBnd:"), Some(&expected), "{stdout}");
        }
        // What the reduction is for: as root, chroot(2) is the way out of a chroot.
        let out = run(spec(
            Path::new("/"),
            "/usr/sbin/chroot",
            &v(&["/", "/bin/true"]),
            Duration::from_secs(60),
        ))
        .expect("/usr/sbin/chroot (coreutils) is needed by this test");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.exit_code, 0, "a command could chroot(2): {stderr}");
        assert!(stderr.contains("Operation not permitted"), "{stderr}");
    }

    /// Copies `/bin/sh` and the libraries `ldd` lists for it into `root`.
    pub(crate) fn install_shell(root: &Path) {
        let mut files = vec![PathBuf::from("/bin/sh")];
        let ldd = Command::new("ldd").arg("/bin/sh").output().expect("ldd");
        for line in String::from_utf8_lossy(&ldd.stdout).lines() {
            let path = line.split("=>").last().unwrap_or(line);
            let path = path.split_whitespace().next().unwrap_or("");
            if path.starts_with('/') {
                files.push(PathBuf::from(path));
            }
        }
        for f in files {
            let dest = root.join(f.strip_prefix("/").unwrap());
            std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
            std::fs::copy(f.canonicalize().unwrap(), &dest).unwrap();
        }
    }

    /// What a command under a host root saw of its confinement, read from outside while
    /// it waits on a FIFO.
    struct Probe {
        own_mount_namespace: bool,
        root_link: PathBuf,
        mount_points: Vec<String>,
        stdout: String,
    }

    /// Runs a shell chrooted (isolation `Chroot`) into a fresh root and inspects it while
    /// it runs; with `without_sys_admin` the spawning thread first gives up
    /// `CAP_SYS_ADMIN`, as an agent deployed without it.
    fn probe_confinement(without_sys_admin: bool) -> Probe {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        install_shell(&root);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let marker = format!(
            "bosun-confinement-probe-{}-{without_sys_admin}",
            std::process::id()
        );
        let command_root = root.clone();
        let args = v(&[
            "-c",
            "echo ready > /ready; read x < /fifo; echo done",
            &marker,
        ]);
        let command = std::thread::spawn(move || {
            if without_sys_admin {
                let mut caps = rustix::thread::capabilities(None).unwrap();
                caps.effective -= rustix::thread::CapabilitySet::SYS_ADMIN;
                rustix::thread::set_capabilities(None, caps).unwrap();
            }
            let mut s = spec(&command_root, "/bin/sh", &args, Duration::from_secs(300));
            s.isolation = ExecIsolation::Chroot;
            s.sandbox = sandbox(&[(Path::new("/"), true)]);
            run(s)
        });
        while !root.join("ready").exists() {
            if command.is_finished() {
                panic!("the command ended early: {:?}", command.join().unwrap());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let pids = processes_with(&marker);
        assert_eq!(pids.len(), 1, "{pids:?}");
        let proc = PathBuf::from(format!("/proc/{}", pids[0]));
        let ns = |p: &Path| std::fs::read_link(p.join("ns/mnt")).unwrap();
        let own_mount_namespace = ns(&proc) != ns(Path::new("/proc/self"));
        let root_link = std::fs::read_link(proc.join("root")).unwrap();
        let mount_points = std::fs::read_to_string(proc.join("mountinfo"))
            .unwrap()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
            .collect();
        std::fs::write(root.join("fifo"), "go\n").unwrap();
        let out = command.join().unwrap().unwrap();
        Probe {
            own_mount_namespace,
            root_link,
            mount_points,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        }
    }

    #[test]
    fn a_command_under_a_host_root_gets_a_mount_namespace_where_it_is_slash() {
        require_root("a_command_under_a_host_root_gets_a_mount_namespace_where_it_is_slash");
        assert!(
            may_unshare(),
            "this test needs CAP_SYS_ADMIN, which root has outside a container"
        );
        let p = probe_confinement(false);
        assert_eq!(p.stdout, "done\n");
        assert!(
            p.own_mount_namespace,
            "the command shares the agent's mount namespace"
        );
        // pivot_root made the host root `/`, and the old root was detached: the command's
        // namespace holds the host root's mount and nothing else.
        assert_eq!(p.root_link, Path::new("/"));
        assert_eq!(p.mount_points, ["/"]);
    }

    #[test]
    fn without_sys_admin_a_command_is_chrooted_instead() {
        require_root("without_sys_admin_a_command_is_chrooted_instead");
        let p = probe_confinement(true);
        assert_eq!(p.stdout, "done\n");
        assert!(!p.own_mount_namespace);
        assert!(
            p.root_link.ends_with("root") && p.root_link != Path::new("/"),
            "{}",
            p.root_link.display()
        );
    }
}
