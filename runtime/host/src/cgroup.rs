//! A cgroup (v2) per granted command, where the agent can make one: everything the command
//! starts is in it, so `cgroup.kill` ends all of it at once when the command's call ends,
//! whatever it did to leave its process group or session; and where the agent's own cgroup
//! hands the `pids` and `memory` controllers down, the command's processes and memory are
//! bounded too.
//!
//! Where the agent can make one: the cgroup v2 hierarchy it sees (`/sys/fs/cgroup`, the
//! unified hierarchy of a hybrid machine at `/sys/fs/cgroup/unified`, or the node's
//! `<host root>/sys/fs/cgroup` when its own container's cgroup file system is read-only, as
//! in the shipped DaemonSet), the cgroup holding the agent found in it, and a child of that
//! cgroup made and removed per command. The agent is never moved, and no controller is
//! enabled by the host: in a container's cgroup, which holds the agent itself, the kernel
//! allows child cgroups but no controllers for them (the "no internal processes" rule), so
//! there a command's cgroup gives `cgroup.kill` and no limits; the limits apply where the
//! parent already delegates them (a root cgroup, or an agent given a delegated cgroup).
//!
//! Nothing here is reachable by the command: the cgroup file system is outside every
//! sandbox, and the command joins its cgroup through a descriptor opened by the host.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `statfs(2)` magic of cgroup v2.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Most directories looked at when finding the agent's cgroup.
const SEARCH_LIMIT: usize = 20_000;

/// Where commands' cgroups are made.
#[derive(Debug)]
pub(crate) struct Cgroups {
    /// The agent's own cgroup; commands' cgroups are its children.
    parent: PathBuf,
    /// The controllers of `pids` and `memory` the parent hands to its children.
    pids: bool,
    memory: bool,
    next: AtomicU64,
}

/// What a command's cgroup is held to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CgroupLimits {
    pub max_processes: u32,
    pub max_memory_bytes: u64,
}

static FOUND: OnceLock<Option<Cgroups>> = OnceLock::new();

/// The cgroups commands get, found on first use from `host_root`; `None` where the agent
/// can make none (said in [`crate::confine::Support::missing`]).
pub(crate) fn cgroups(host_root: &Path) -> Option<&'static Cgroups> {
    FOUND
        .get_or_init(|| {
            let found = find(host_root);
            match &found {
                Some(c) => tracing::debug!(parent = %c.parent.display(), pids = c.pids, memory = c.memory, "commands get a cgroup each"),
                None => tracing::debug!("no cgroup v2 the agent can make children in: commands get no cgroup"),
            }
            found
        })
        .as_ref()
}

/// What a command's cgroup gives on this node, for the confinement report: `None` without
/// one, or before the first [`crate::Host`] looked for it.
pub(crate) fn describe() -> Option<String> {
    FOUND.get().and_then(Option::as_ref).map(|c| {
        let limits = match (c.pids, c.memory) {
            (true, true) => "with process and memory limits",
            (true, false) => "with a process limit (no memory controller delegated)",
            (false, true) => "with a memory limit (no pids controller delegated)",
            (false, false) => "killed as one (its parent cgroup delegates no controllers: no process or memory limits)",
        };
        format!("a cgroup per command under {}, {limits}", c.parent.display())
    })
}

fn is_cgroup2(path: &Path) -> bool {
    rustix::fs::statfs(path).is_ok_and(|s| {
        #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
        let t = s.f_type as i64;
        t == CGROUP2_SUPER_MAGIC
    })
}

/// Whether `dir/cgroup.procs` lists `pid`.
fn holds(dir: &Path, pid: u32) -> bool {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .is_ok_and(|s| s.lines().any(|l| l.trim().parse::<u32>() == Ok(pid)))
}

fn find(host_root: &Path) -> Option<Cgroups> {
    let pid = std::process::id();
    let mut mounts = vec![
        PathBuf::from("/sys/fs/cgroup"),
        PathBuf::from("/sys/fs/cgroup/unified"),
    ];
    if !crate::exec::is_real_root(host_root) {
        mounts.push(host_root.join("sys/fs/cgroup"));
        mounts.push(host_root.join("sys/fs/cgroup/unified"));
    }
    for mount in mounts.into_iter().filter(|m| is_cgroup2(m)) {
        let Some(dir) = own_cgroup(&mount, pid) else {
            continue;
        };
        // A probe child tells a writable hierarchy from a read-only one (a container's own).
        let probe = dir.join(format!("bosun-probe-{pid}"));
        if std::fs::create_dir(&probe).is_err() {
            continue;
        }
        let _ = std::fs::remove_dir(&probe);
        let delegated =
            std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
        let has = |c: &str| delegated.split_whitespace().any(|d| d == c);
        return Some(Cgroups {
            pids: has("pids"),
            memory: has("memory"),
            parent: dir,
            next: AtomicU64::new(0),
        });
    }
    None
}

/// The cgroup of `mount` holding `pid`: the one `/proc/self/cgroup` names when it is there,
/// else found by looking (the agent's cgroup namespace hides its path from itself).
fn own_cgroup(mount: &Path, pid: u32) -> Option<PathBuf> {
    if let Ok(text) = std::fs::read_to_string("/proc/self/cgroup")
        && let Some(rel) = text.lines().find_map(|l| l.strip_prefix("0::"))
    {
        let dir = mount.join(rel.trim_start_matches('/'));
        if holds(&dir, pid) {
            return Some(dir);
        }
    }
    let mut queue = std::collections::VecDeque::from([mount.to_owned()]);
    let mut seen = 0;
    while let Some(dir) = queue.pop_front() {
        seen += 1;
        if seen > SEARCH_LIMIT {
            return None;
        }
        if holds(&dir, pid) {
            return Some(dir);
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    queue.push_back(e.path());
                }
            }
        }
    }
    None
}

/// One command's cgroup: made before the command starts, killed and removed when it is
/// dropped (whatever way the call ends).
#[derive(Debug)]
pub(crate) struct CommandCgroup {
    dir: PathBuf,
    /// `cgroup.procs`, open for the command to write itself into before exec.
    procs: OwnedFd,
}

impl Cgroups {
    /// Makes a cgroup for one command, with `limits` where the parent delegates them.
    pub(crate) fn create(&self, limits: CgroupLimits) -> Result<CommandCgroup, String> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let dir = self
            .parent
            .join(format!("bosun-command-{}-{n}", std::process::id()));
        std::fs::create_dir(&dir)
            .map_err(|e| format!("making the cgroup {}: {e}", dir.display()))?;
        let set = |file: &str, value: String| {
            std::fs::write(dir.join(file), value)
                .map_err(|e| format!("{file} of {}: {e}", dir.display()))
        };
        let limited = (|| {
            if self.pids {
                set("pids.max", limits.max_processes.to_string())?;
            }
            if self.memory {
                set("memory.max", limits.max_memory_bytes.to_string())?;
                // Past the limit the command is killed, not the agent's memory swapped out.
                let _ = set("memory.swap.max", "0".into());
            }
            Ok::<(), String>(())
        })();
        let procs = limited.and_then(|()| {
            rustix::fs::open(
                dir.join("cgroup.procs"),
                rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| format!("cgroup.procs of {}: {e}", dir.display()))
        });
        match procs {
            Ok(procs) => Ok(CommandCgroup { dir, procs }),
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                Err(e)
            }
        }
    }
}

impl CommandCgroup {
    /// The descriptor the command writes `0` to (itself) before exec.
    pub(crate) fn procs_fd(&self) -> libc::c_int {
        self.procs.as_raw_fd()
    }

    /// Kills everything in the cgroup and waits (up to a second) until it is empty.
    pub(crate) fn kill(&self) {
        let killed = std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.kill"))
            .and_then(|mut f| f.write_all(b"1"));
        if killed.is_err() {
            // Before Linux 5.14: kill what is listed, until nothing is.
            for _ in 0..100 {
                let pids =
                    std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
                if pids.trim().is_empty() {
                    break;
                }
                for p in pids.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    if let Some(p) = rustix::process::Pid::from_raw(p) {
                        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            let events =
                std::fs::read_to_string(self.dir.join("cgroup.events")).unwrap_or_default();
            if events.lines().any(|l| l.trim() == "populated 0") {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for CommandCgroup {
    fn drop(&mut self) {
        self.kill();
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            tracing::warn!(cgroup = %self.dir.display(), error = %e, "a command's cgroup could not be removed");
        }
    }
}
