//! The kernel boundary of a granted command: an allow-list built from the grants and
//! enforced by the kernel when a file is opened, a socket created or connected, or a
//! signal sent, whatever the command's arguments say.
//!
//! Two mechanisms, both needing no privilege (only `no_new_privs`, which every command
//! has), so they work in the shipped DaemonSet (no `CAP_SYS_ADMIN`, `RuntimeDefault`
//! seccomp, which allows the Landlock and seccomp system calls):
//!
//! - **Landlock** ([`Ruleset`]): the command may read, write and execute only beneath
//!   the paths of its [`Sandbox`] (the base every command gets, the plugin's filesystem
//!   grants, the exec grant's own `sandbox.filesystem`); it may connect to the TCP ports
//!   its grant names and bind none; it may signal, and connect to abstract Unix sockets
//!   of, only processes of its own domain (itself and what it started), so neither its
//!   keeper nor the agent nor anything else on the node. A Landlock domain also refuses
//!   ptrace-mode access to processes outside it, which closes `/proc/<pid>/root` (another
//!   process's file system) and `/proc/<pid>/fd` of every process but its own.
//! - **seccomp** ([`Filter`]): what Landlock does not cover on every kernel. Sockets of
//!   any family but those granted are refused at `socket(2)` (no IP or netlink socket
//!   without a TCP grant, no Unix socket without a Unix socket grant); changing modes,
//!   owners and extended attributes (`chmod`, `chown`, `setxattr` families) is refused
//!   unless granted (Landlock does not confine them); `io_uring` is refused (its
//!   operations would bypass the socket filter).
//!
//! What the kernel supports is read once ([`support`]); where a feature is missing the
//! command runs without it and the agent says so at start and in its NodeReport
//! ([`Support::missing`]), so a policy can refuse such nodes. Nothing is silently
//! weaker.
//!
//! Everything is prepared before the fork ([`prepare`]); the forked command only makes
//! system calls on what was prepared ([`Prepared::enter`]).
//!
//! `ruleset` (about 110 lines) is kept whole on purpose: it is the Landlock allow-list of a
//! granted command, rule by rule, which is what a security review reads.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::OnceLock;

use bosun_api::grants::{Access, ExecGrant, FilesystemGrant};
use landlock::{
    ABI, Access as _, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope,
};

/// Directories every command may read and execute from: the node's programs and
/// libraries. Entries that are symlinks (`/bin -> usr/bin` on a merged-/usr node) or
/// missing are skipped; their targets are covered by `/usr`.
const BASE_EXECUTABLE: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// Besides these, every directory may be listed (its entries' names, not the files'
/// contents): commands start in `/` and tools open their working directory.
///
/// Files and directories every command may read: what the loader, name-service lookups,
/// TLS clients and time formatting read, and nothing that holds a secret (`/etc/shadow`,
/// `/etc/ssl/private` and `/etc/kubernetes` are not here). `/proc` is here because most
/// tools read their own entries in it; the Landlock domain keeps other processes'
/// ptrace-guarded entries (`root`, `cwd`, `fd`, `environ`, `mem`) closed.
const BASE_READABLE: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/resolv.conf",
    // Where /etc/resolv.conf links to when a resolver manages it: systemd-resolved (Ubuntu's
    // default), resolvconf and NetworkManager. The files only, not their directories
    // (systemd-resolved's has its varlink socket).
    "/run/systemd/resolve/stub-resolv.conf",
    "/run/systemd/resolve/resolv.conf",
    "/run/resolvconf/resolv.conf",
    "/run/NetworkManager/resolv.conf",
    "/run/NetworkManager/no-stub-resolv.conf",
    "/etc/gai.conf",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/os-release",
    "/etc/lsb-release",
    "/etc/debian_version",
    "/etc/redhat-release",
    "/etc/system-release",
    "/etc/alternatives",
    "/etc/ssl/certs",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/pki/tls/certs",
    "/etc/pki/ca-trust",
    "/etc/services",
    "/etc/protocols",
    "/etc/login.defs",
    "/proc",
    "/dev/urandom",
    "/dev/random",
];

/// Device files every command may read and write.
const BASE_WRITABLE: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];

/// One path of a command's sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SandboxPath {
    /// Absolute, normalized, as seen on the node.
    pub path: String,
    pub write: bool,
    pub execute: bool,
    /// A missing path is skipped instead of failing the command.
    pub optional: bool,
    /// Where the path comes from, for messages (`the plugin's filesystem grant`, ...).
    pub origin: &'static str,
}

/// What one command may reach besides the base ([`BASE_EXECUTABLE`], [`BASE_READABLE`],
/// [`BASE_WRITABLE`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Sandbox {
    pub paths: Vec<SandboxPath>,
    pub tcp_connect: Vec<u16>,
    pub unix_sockets: Vec<String>,
    pub change_metadata: bool,
    /// `None`: the defaults ([`bosun_api::grants::DEFAULT_MAX_PROCESSES`] and friends).
    pub max_processes: Option<u32>,
    pub max_memory_bytes: Option<u64>,
    pub max_file_bytes: Option<u64>,
}

impl Sandbox {
    /// The limits of the command's cgroup.
    pub(crate) fn cgroup_limits(&self) -> crate::cgroup::CgroupLimits {
        crate::cgroup::CgroupLimits {
            max_processes: self
                .max_processes
                .unwrap_or(bosun_api::grants::DEFAULT_MAX_PROCESSES),
            max_memory_bytes: self
                .max_memory_bytes
                .unwrap_or(bosun_api::grants::DEFAULT_MAX_MEMORY_BYTES),
        }
    }
}

impl Sandbox {
    /// The sandbox of a plugin's granted command: the plugin's filesystem grants with
    /// their access, the grant's own `sandbox`, and the command file itself (read and
    /// execute, for a command outside the base directories). In a dry run nothing is
    /// writable but the grant's own paths marked `writableInDryRun` (a tool's logs, locks
    /// and caches).
    pub(crate) fn for_command(
        plugin_fs: &[FilesystemGrant],
        grant: &ExecGrant,
        dry_run: bool,
    ) -> Sandbox {
        let mut paths: Vec<SandboxPath> = plugin_fs
            .iter()
            .map(|g| SandboxPath {
                path: g.path.clone(),
                write: g.access == Access::ReadWrite && !dry_run,
                execute: false,
                optional: g.optional,
                origin: "the plugin's filesystem grant",
            })
            .collect();
        paths.extend(grant.sandbox.filesystem.iter().map(|p| SandboxPath {
            path: p.path.clone(),
            // `writableInDryRun` is accepted on dry-run grants only (exec::validate_grant).
            write: p.access == Access::ReadWrite && (!dry_run || p.writable_in_dry_run),
            execute: p.execute,
            optional: p.optional,
            origin: "the exec grant's sandbox",
        }));
        paths.push(SandboxPath {
            path: grant.command.clone(),
            write: false,
            execute: true,
            optional: grant.optional,
            origin: "the granted command",
        });
        Sandbox {
            paths,
            tcp_connect: grant.sandbox.tcp_connect.clone(),
            unix_sockets: grant.sandbox.unix_sockets.clone(),
            change_metadata: grant.sandbox.change_metadata,
            max_processes: grant.sandbox.max_processes,
            max_memory_bytes: grant.sandbox.max_memory_bytes,
            max_file_bytes: grant.sandbox.max_file_bytes,
        }
    }

    /// The sandbox of `systemctl` as the host runs it for a plugin's service grants: it
    /// talks to systemd on its private socket and reads systemd's runtime directory.
    pub(crate) fn systemctl() -> Sandbox {
        Sandbox {
            paths: vec![
                SandboxPath {
                    path: "/run/systemd".into(),
                    write: false,
                    execute: false,
                    optional: true,
                    origin: "systemctl's sandbox",
                },
                SandboxPath {
                    path: "/usr/bin/systemctl".into(),
                    write: false,
                    execute: true,
                    optional: true,
                    origin: "systemctl's sandbox",
                },
            ],
            unix_sockets: vec!["/run/systemd/private".into()],
            ..Sandbox::default()
        }
    }
}

/// What this kernel lets the host enforce, read once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Support {
    /// The Landlock ABI version (0: no Landlock, disabled at boot or not built).
    pub landlock_abi: u32,
    /// Whether seccomp filters can be installed.
    pub seccomp: bool,
}

/// The Landlock ABI versions that bring each feature the host uses.
const ABI_FILESYSTEM: u32 = 3; // read, write, execute, refer (2), truncate (3)
const ABI_TCP: u32 = 4;
const ABI_SCOPE: u32 = 6;
const ABI_UNIX_PATHS: u32 = 9;

impl Support {
    /// Landlock confines files (read, write, execute, link, rename and truncate).
    pub fn filesystem(&self) -> bool {
        self.landlock_abi >= ABI_FILESYSTEM
    }

    /// Landlock confines TCP connect and bind to granted ports.
    pub fn tcp(&self) -> bool {
        self.landlock_abi >= ABI_TCP
    }

    /// Landlock keeps signals and abstract Unix socket connections inside the command's
    /// own processes.
    pub fn scoped(&self) -> bool {
        self.landlock_abi >= ABI_SCOPE
    }

    /// Landlock bounds connections to named Unix sockets by path (otherwise a Unix socket
    /// grant allows every named Unix socket the command can reach).
    pub fn unix_socket_paths(&self) -> bool {
        self.landlock_abi >= ABI_UNIX_PATHS
    }

    /// What granted commands run without on this kernel, one line each; empty when every
    /// boundary the host relies on is enforced. Connecting to named Unix sockets by path
    /// is not listed: no such grant is needed by a command that uses no Unix socket, and
    /// the docs say what a Unix socket grant means without it.
    pub fn missing(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.filesystem() {
            out.push(format!(
                "Landlock file-system rules (ABI {ABI_FILESYSTEM}, Linux 6.2; this kernel has {}): a granted command \
                 can open any file its capabilities allow",
                self.abi_text()
            ));
        }
        if !self.tcp() {
            out.push(format!(
                "Landlock TCP rules (ABI {ABI_TCP}, Linux 6.7; this kernel has {}): a command with a tcpConnect grant \
                 can connect to any port and bind one",
                self.abi_text()
            ));
        }
        if !self.scoped() {
            out.push(format!(
                "Landlock scoping of signals and abstract Unix sockets (ABI {ABI_SCOPE}, Linux 6.12; this kernel has {}): \
                 a granted command can signal any process of its user (its keeper and the agent included) and reach \
                 abstract Unix sockets",
                self.abi_text()
            ));
        }
        if !self.seccomp {
            out.push(
                "seccomp filters: a granted command can create any socket, change modes and owners of files, and use \
                 io_uring"
                    .into(),
            );
        }
        out
    }

    fn abi_text(&self) -> String {
        if self.landlock_abi == 0 {
            "no Landlock".into()
        } else {
            format!("ABI {}", self.landlock_abi)
        }
    }
}

/// What a granted command's cgroup gives on this node (see [`crate::cgroup`]), in a
/// sentence; `None` where the agent can make none: then a command is ended by its keeper
/// alone and has no process or memory limit. Known once a [`crate::Host`] exists.
pub fn command_cgroup() -> Option<String> {
    crate::cgroup::describe()
}

/// What is missing when [`command_cgroup`] is `None`, in the words of [`Support::missing`].
pub const NO_COMMAND_CGROUP: &str = "a cgroup per command (no writable cgroup v2 hierarchy holds the agent): a granted command \
     is ended by its keeper alone, and has no process or memory limit";

/// What this kernel supports (see [`Support`]), read on first use.
pub fn support() -> &'static Support {
    static SUPPORT: OnceLock<Support> = OnceLock::new();
    SUPPORT.get_or_init(|| Support {
        landlock_abi: landlock_abi(),
        seccomp: seccomp_available(),
    })
}

/// `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`: the ABI version,
/// or 0 where Landlock is missing or disabled.
#[allow(unsafe_code)]
fn landlock_abi() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer and size 0 and this flag the call only
    // returns a number.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(v).unwrap_or(0)
}

/// Whether `prctl(PR_GET_SECCOMP)` answers: the kernel has seccomp (filters need
/// `CONFIG_SECCOMP_FILTER`, which every kernel with seccomp a container runtime supports
/// has).
#[allow(unsafe_code)]
fn seccomp_available() -> bool {
    // SAFETY: PR_GET_SECCOMP only reads the calling thread's mode.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

/// A command's confinement, prepared before the fork.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// The Landlock ruleset to restrict the command with.
    ruleset: Option<OwnedFd>,
    /// The seccomp program to install.
    filter: Option<seccompiler::BpfProgram>,
    /// `RLIMIT_FSIZE` for the command.
    max_file_bytes: u64,
}

/// Builds the command's Landlock ruleset from `sandbox` (paths opened beneath `root`
/// without following any symlink; the base beneath `base_root`, which is `root` unless
/// the command is not chrooted into it) and its seccomp program. Fails, naming the path
/// and what to do, when a path that is not optional is missing or goes through a symlink.
pub(crate) fn prepare(
    base_root: &Path,
    root: &Path,
    sandbox: &Sandbox,
) -> Result<Prepared, String> {
    let support = support();
    let ruleset = if support.landlock_abi > 0 {
        Some(
            ruleset(base_root, root, sandbox, support.landlock_abi)
                .map_err(|e| format!("sandbox: {e}"))?,
        )
    } else {
        None
    };
    let filter = if support.seccomp {
        Some(filter(sandbox).map_err(|e| format!("sandbox: the seccomp filter: {e}"))?)
    } else {
        None
    };
    Ok(Prepared {
        ruleset,
        filter,
        max_file_bytes: sandbox
            .max_file_bytes
            .unwrap_or(bosun_api::grants::DEFAULT_MAX_FILE_BYTES),
    })
}

impl Prepared {
    /// No Landlock ruleset and no seccomp filter: only for the benchmark that measures
    /// what the boundary costs.
    #[cfg(feature = "bench-internals")]
    pub(crate) fn nothing() -> Prepared {
        Prepared {
            ruleset: None,
            filter: None,
            max_file_bytes: u64::MAX,
        }
    }

    /// Restricts the calling process (the forked command, right before exec): Landlock
    /// first, then the seccomp filter (which refuses nothing Landlock needs), then every
    /// descriptor above stderr is marked close-on-exec, so the command inherits only its
    /// stdin, stdout and stderr whatever the agent had open.
    ///
    /// # Safety
    ///
    /// Only between fork and exec, under `no_new_privs`; makes system calls on what
    /// [`prepare`] built and allocates nothing.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn enter(&self) -> std::io::Result<()> {
        // A bound on any one file it writes, and no core dump (it may hold secrets it read).
        for (resource, limit) in [
            (libc::RLIMIT_FSIZE, self.max_file_bytes),
            (libc::RLIMIT_CORE, 0),
        ] {
            let limit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            // SAFETY: setrlimit with a value on the stack.
            if unsafe { libc::setrlimit(resource, &limit) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if let Some(fd) = &self.ruleset {
            // SAFETY: a ruleset descriptor and no flags.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_landlock_restrict_self,
                    fd.as_raw_fd(),
                    0 as libc::c_uint,
                )
            };
            if r != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if let Some(program) = &self.filter {
            seccompiler::apply_filter(program).map_err(|e| match e {
                seccompiler::Error::Prctl(e) | seccompiler::Error::Seccomp(e) => e,
                _ => std::io::Error::from(std::io::ErrorKind::InvalidInput),
            })?;
        }
        // SAFETY: marks descriptors close-on-exec; touches no memory.
        if unsafe { close_range(3, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// close_range(2) by its system call number: glibc has a wrapper, musl (the C library of the
/// release images' static binaries) has none. A direct system call, so safe between fork and
/// exec.
///
/// # Safety
/// Closing (flags 0) descriptors the process still uses is the caller's to rule out.
#[allow(unsafe_code)]
pub(crate) unsafe fn close_range(
    first: libc::c_uint,
    last: libc::c_uint,
    flags: libc::c_uint,
) -> libc::c_long {
    // SAFETY: the call takes no pointers; see the function's contract for what it closes.
    unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) }
}

/// File-system rights for reading (a directory: list it and read beneath it).
fn read_rights(abi: ABI) -> landlock::BitFlags<AccessFs> {
    AccessFs::from_read(abi) & !AccessFs::Execute
}

/// Rights for writing: create, write, truncate, rename, link and remove regular files,
/// directories and symlinks. Never devices, FIFOs or sockets, which nothing a granted
/// command does needs and which could hang or reach what reads them.
fn write_rights(abi: ABI) -> landlock::BitFlags<AccessFs> {
    (AccessFs::WriteFile
        | AccessFs::RemoveDir
        | AccessFs::RemoveFile
        | AccessFs::MakeDir
        | AccessFs::MakeReg
        | AccessFs::MakeSym
        | AccessFs::Refer
        | AccessFs::Truncate)
        & AccessFs::from_all(abi)
}

/// Opens `path` (absolute, normalized) beneath `root` as an `O_PATH` descriptor without
/// following any symlink, magic link or `..` out of it. `Ok(None)`: it does not exist.
/// A path whose last component is itself a symlink is an error too: `O_NOFOLLOW` would
/// open the link, and a Landlock rule on a link grants nothing through it, so the path
/// would be silently inert instead of refused like a symlink earlier in the path.
fn open_beneath(root: &OwnedFd, path: &str) -> Result<Option<OwnedFd>, String> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let rel = path.trim_start_matches('/');
    let rel = if rel.is_empty() { "." } else { rel };
    match rustix::fs::openat2(
        root,
        rel,
        OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    ) {
        Ok(fd) if is_symlink(&fd) => {
            let target = rustix::fs::readlinkat(&fd, "", Vec::new())
                .map_or_else(|_| "?".into(), |t| t.to_string_lossy().into_owned());
            Err(format!(
                "{path} is a symlink (to {target}); name the real path (paths given to a command's sandbox are never \
                 resolved through symlinks)"
            ))
        }
        Ok(fd) => Ok(Some(fd)),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(rustix::io::Errno::LOOP) => Err(format!(
            "{path} goes through a symlink; name the real path (paths given to a command's sandbox are never \
             resolved through symlinks)"
        )),
        Err(e) => Err(format!("{path}: {e}")),
    }
}

fn is_symlink(fd: &OwnedFd) -> bool {
    is_type(fd, rustix::fs::FileType::Symlink)
}

fn is_dir(fd: &OwnedFd) -> bool {
    is_type(fd, rustix::fs::FileType::Directory)
}

fn is_type(fd: &OwnedFd, kind: rustix::fs::FileType) -> bool {
    rustix::fs::fstat(fd).is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == kind)
}

/// The Landlock ruleset of `sandbox` under `root` (the base under `base_root`), for a
/// kernel of Landlock ABI `abi`.
fn ruleset(base_root: &Path, root: &Path, sandbox: &Sandbox, abi: u32) -> Result<OwnedFd, String> {
    let abi = ABI::from(i32::try_from(abi).unwrap_or(i32::MAX));
    let open_root = |root: &Path| {
        rustix::fs::open(
            root,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| format!("the host root {}: {e}", root.display()))
    };
    let root_fd = open_root(root)?;
    let base_fd = open_root(base_root)?;

    // (descriptor, rights) for every rule, opened first so that a missing or symlinked
    // path is reported before anything is created.
    let mut rules: Vec<(OwnedFd, landlock::BitFlags<AccessFs>)> = Vec::new();
    let mut add = |fd: OwnedFd, rights: landlock::BitFlags<AccessFs>| {
        // Rights that only make sense on a directory are refused on a file by the kernel.
        let rights = if is_dir(&fd) {
            rights
        } else {
            rights & AccessFs::from_file(abi)
        };
        if !rights.is_empty() {
            rules.push((fd, rights));
        }
    };
    // Every directory may be listed (names, not contents): a command starts in `/`, and
    // tools open their working directory (rpm does, and fails without it).
    if let Ok(Some(fd)) = open_beneath(&base_fd, "/") {
        add(fd, AccessFs::ReadDir.into());
    }
    for (list, rights) in [
        (BASE_EXECUTABLE, read_rights(abi) | AccessFs::Execute),
        (BASE_READABLE, read_rights(abi)),
        (BASE_WRITABLE, read_rights(abi) | AccessFs::WriteFile),
    ] {
        for path in list {
            // The base is best effort: what this node lacks, or has as a symlink, gets no
            // rule. A link's target is never followed (a plugin with a write grant may
            // have made the link); where distributions link a base file somewhere else,
            // the usual targets are in the base themselves (`/etc/resolv.conf` into
            // `/run`, `/etc/localtime` into `/usr`).
            if let Ok(Some(fd)) = open_beneath(&base_fd, path) {
                add(fd, rights);
            }
        }
    }
    for p in &sandbox.paths {
        crate::exec::normalized_absolute(&p.path)
            .map_err(|e| format!("{} names {}: {e}", p.origin, p.path))?;
        let Some(fd) =
            open_beneath(&root_fd, &p.path).map_err(|e| format!("{} names {e}", p.origin))?
        else {
            if p.optional {
                continue;
            }
            return Err(format!(
                "{} names {}, which does not exist on this node; create it, or mark it optional",
                p.origin, p.path
            ));
        };
        let mut rights = read_rights(abi);
        if p.write {
            rights |= write_rights(abi);
        }
        if p.execute {
            rights |= AccessFs::Execute;
        }
        add(fd, rights);
    }

    let mut created = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| format!("Landlock: {e}"))?;
    if abi >= ABI::V4 {
        created = created
            .handle_access(AccessNet::from_all(abi))
            .map_err(|e| format!("Landlock: {e}"))?;
    }
    if abi >= ABI::V6 {
        created = created
            .scope(Scope::from_all(abi))
            .map_err(|e| format!("Landlock: {e}"))?;
    }
    let mut created = created.create().map_err(|e| format!("Landlock: {e}"))?;
    for (fd, rights) in &rules {
        created = created
            .add_rule(PathBeneath::new(fd.as_fd(), *rights))
            .map_err(|e| format!("Landlock: {e}"))?;
    }
    if abi >= ABI::V4 {
        for port in &sandbox.tcp_connect {
            created = created
                .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
                .map_err(|e| format!("Landlock: {e}"))?;
        }
    }
    if abi >= ABI::V9 {
        for socket in &sandbox.unix_sockets {
            crate::exec::normalized_absolute(socket)
                .map_err(|e| format!("the Unix socket {socket}: {e}"))?;
            if let Some(fd) = open_beneath(&root_fd, socket)? {
                created = created
                    .add_rule(PathBeneath::new(fd.as_fd(), AccessFs::ResolveUnix))
                    .map_err(|e| format!("Landlock: {e}"))?;
            }
        }
    }
    Option::<OwnedFd>::from(created)
        .ok_or_else(|| "Landlock: the kernel did not create a ruleset".to_owned())
}

/// Syscalls that change modes, owners and extended attributes of files, refused unless
/// the grant says `changeMetadata`.
const METADATA_SYSCALLS: &[libc::c_long] = &[
    libc::SYS_chmod,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchmodat2,
    libc::SYS_chown,
    libc::SYS_fchown,
    libc::SYS_lchown,
    libc::SYS_fchownat,
    libc::SYS_setxattr,
    libc::SYS_lsetxattr,
    libc::SYS_fsetxattr,
    libc::SYS_removexattr,
    libc::SYS_lremovexattr,
    libc::SYS_fremovexattr,
    SYS_SETXATTRAT,
    SYS_REMOVEXATTRAT,
];

/// `setxattrat(2)` and `removexattrat(2)` (Linux 6.13), not yet in every libc crate.
#[cfg(target_arch = "x86_64")]
const SYS_SETXATTRAT: libc::c_long = 463;
#[cfg(target_arch = "x86_64")]
const SYS_REMOVEXATTRAT: libc::c_long = 466;
#[cfg(target_arch = "aarch64")]
const SYS_SETXATTRAT: libc::c_long = 463;
#[cfg(target_arch = "aarch64")]
const SYS_REMOVEXATTRAT: libc::c_long = 466;

/// x32 system calls on x86-64 are the 64-bit numbers with this bit set; the filter
/// refuses those too, so a command cannot reach a refused call through the x32 ABI.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: libc::c_long = 0x4000_0000;

/// The seccomp program of `sandbox`: every matching call fails with `EPERM`, everything
/// else is allowed (Landlock and the capabilities do the rest).
fn filter(sandbox: &Sandbox) -> Result<seccompiler::BpfProgram, seccompiler::BackendError> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    };
    use std::collections::BTreeMap;

    let mut families: Vec<libc::c_int> = Vec::new();
    if !sandbox.unix_sockets.is_empty() {
        families.push(libc::AF_UNIX);
    }
    if !sandbox.tcp_connect.is_empty() {
        families.extend([libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK]);
    }
    // socket(2) with a family not granted: every condition of one rule must hold.
    let not_granted = families
        .iter()
        .map(|f| {
            SeccompCondition::new(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Ne,
                u64::try_from(*f).unwrap_or(0),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let socket_rules = if not_granted.is_empty() {
        Vec::new() // refused whatever the arguments
    } else {
        vec![SeccompRule::new(not_granted)?]
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    rules.insert(libc::SYS_socket, socket_rules);
    rules.insert(libc::SYS_io_uring_setup, Vec::new());
    if !sandbox.change_metadata {
        for nr in METADATA_SYSCALLS {
            rules.insert(*nr, Vec::new());
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        let x32: Vec<(i64, Vec<SeccompRule>)> = rules
            .iter()
            .map(|(nr, r)| (nr | X32_SYSCALL_BIT, r.clone()))
            .collect();
        rules.extend(x32);
    }
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|_| seccompiler::BackendError::InvalidTargetArch(std::env::consts::ARCH.into()))?;
    SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )?
    .try_into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_compiles_for_every_shape_of_sandbox() {
        for (tcp, unix, meta) in [
            (false, false, false),
            (true, false, false),
            (false, true, false),
            (true, true, true),
        ] {
            let sandbox = Sandbox {
                tcp_connect: if tcp { vec![6443] } else { vec![] },
                unix_sockets: if unix {
                    vec!["/run/x.sock".into()]
                } else {
                    vec![]
                },
                change_metadata: meta,
                ..Sandbox::default()
            };
            let program = filter(&sandbox).unwrap();
            assert!(!program.is_empty());
        }
    }

    #[test]
    fn missing_features_are_named() {
        let none = Support {
            landlock_abi: 0,
            seccomp: false,
        };
        let m = none.missing();
        assert_eq!(m.len(), 4, "{m:?}");
        assert!(m[0].contains("no Landlock"), "{m:?}");
        let old = Support {
            landlock_abi: 5,
            seccomp: true,
        };
        let m = old.missing();
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("signals") && m[0].contains("ABI 5"), "{m:?}");
        assert!(
            Support {
                landlock_abi: 7,
                seccomp: true
            }
            .missing()
            .is_empty()
        );
    }
}

/// The kernel boundary tested class by class (issue 31's review): each test runs a real
/// command as root through [`crate::exec::run`] and fails when the enforcement it names
/// is removed (docs/security.md lists how each was checked that way).
#[cfg(test)]
mod boundary {
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use super::*;
    use crate::config::ExecIsolation;
    use crate::exec::tests::{install_shell, require_root};
    use crate::exec::{CommandOutput, CommandSpec, run};

    /// These tests prove what the kernel enforces, so a kernel without it fails them
    /// (naming what is missing) instead of passing vacuously.
    fn require_kernel(what: &str) {
        require_root(what);
        let missing = support().missing();
        assert!(
            missing.is_empty(),
            "{what}: this kernel lacks what the test proves: {missing:?}"
        );
    }

    fn path(p: &Path, write: bool) -> SandboxPath {
        SandboxPath {
            path: p.to_str().unwrap().to_owned(),
            write,
            execute: false,
            optional: false,
            origin: "the test",
        }
    }

    /// Runs `command args` under `root` with `sandbox`, from a thread that first gives up
    /// `CAP_SYS_ADMIN` when `without_sys_admin` (as the shipped DaemonSet's agent: then the
    /// command is chrooted, in the agent's PID namespace, instead of getting namespaces).
    fn run_as(
        root: &Path,
        command: &str,
        args: &[&str],
        sandbox: Sandbox,
        without_sys_admin: bool,
    ) -> CommandOutput {
        let root = root.to_owned();
        let command = command.to_owned();
        let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        std::thread::spawn(move || {
            if without_sys_admin {
                let mut caps = rustix::thread::capabilities(None).unwrap();
                caps.effective -= rustix::thread::CapabilitySet::SYS_ADMIN;
                rustix::thread::set_capabilities(None, caps).unwrap();
            }
            run(CommandSpec {
                root: &root,
                isolation: ExecIsolation::Chroot,
                command: &command,
                args: &args,
                stdin: None,
                timeout: Duration::from_secs(60),
                max_output: 1 << 16,
                sandbox: &sandbox,
            })
            .unwrap()
        })
        .join()
        .unwrap()
    }

    fn text(out: &CommandOutput) -> String {
        format!(
            "exit {}\nstdout: {}\nstderr: {}",
            out.exit_code,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// A process of the test's (outside every command's domain) running as root with no
    /// capabilities at all, as a Pod running as root with `drop: [ALL]` does, so that the
    /// command's capability set is a superset of its own: the case the capability
    /// reduction alone does not protect. Killed on drop.
    struct Victim(std::process::Child);

    impl Victim {
        #[allow(unsafe_code)]
        fn start() -> Victim {
            use std::os::unix::process::CommandExt;
            let mut cmd = std::process::Command::new("/bin/sleep");
            cmd.arg("60");
            // SAFETY: prctl and capset on the forked child only, before exec; no allocation.
            unsafe {
                cmd.pre_exec(|| {
                    // Root regains every capability at exec unless no_new_privs keeps the
                    // set it has (a Pod running as root with `drop: [ALL]` is such a process).
                    rustix::thread::set_no_new_privs(true)?;
                    rustix::thread::set_capabilities(
                        None,
                        rustix::thread::CapabilitySets {
                            effective: rustix::thread::CapabilitySet::empty(),
                            permitted: rustix::thread::CapabilitySet::empty(),
                            inheritable: rustix::thread::CapabilitySet::empty(),
                        },
                    )?;
                    Ok(())
                });
            }
            Victim(cmd.spawn().unwrap())
        }

        fn pid(&self) -> String {
            self.0.id().to_string()
        }

        fn alive(&mut self) -> bool {
            matches!(self.0.try_wait(), Ok(None))
        }
    }

    impl Drop for Victim {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Class 1: a command that kills its keeper (root needs no `CAP_KILL` to signal its
    /// parent) and leaves a daemon in a session of its own does not outlive its step:
    /// Landlock's signal scope keeps the keeper alive, and the keeper, a subreaper,
    /// kills the daemon when the command ends.
    #[test]
    fn class1_a_command_cannot_kill_its_keeper_and_outlive_its_step() {
        require_kernel("class1");
        let dir = tempfile::tempdir().unwrap();
        let script = "kill -KILL $PPID; echo \"kill: $?\"; \
                      setsid /bin/sh -c 'echo started > \"$0/started\"; sleep 1; echo late > \"$0/late\"' \"$0\" & \
                      while [ ! -s \"$0/started\" ]; do sleep 0.01; done";
        let out = run_as(
            Path::new("/"),
            "/bin/sh",
            &["-c", script, dir.path().to_str().unwrap()],
            Sandbox {
                paths: vec![path(dir.path(), true)],
                ..Sandbox::default()
            },
            true,
        );
        assert!(dir.path().join("started").exists(), "{}", text(&out));
        std::thread::sleep(Duration::from_millis(1500));
        assert!(
            !dir.path().join("late").exists(),
            "a process the command started wrote after the step ended: {}",
            text(&out)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("kill: 1"),
            "the command could signal its keeper: {}",
            text(&out)
        );
    }

    /// Class 2: whatever shape a path argument has (`key=value` operands, a symlink or
    /// a hard link the plugin could have planted in a granted directory), the command
    /// opens nothing outside its sandbox; and inside it, it works.
    #[test]
    fn class2_paths_outside_the_sandbox_are_refused_whatever_the_argument_shape() {
        require_kernel("class2");
        let dir = tempfile::tempdir().unwrap();
        let granted = dir.path().join("granted");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&granted).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("existing"), "orig").unwrap();
        std::fs::write(outside.join("secret"), "s3cret").unwrap();
        std::os::unix::fs::symlink(outside.join("victim2"), granted.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.join("existing"), granted.join("link2")).unwrap();
        let g = |name: &str| granted.join(name).to_str().unwrap().to_owned();
        let o = |name: &str| outside.join(name).to_str().unwrap().to_owned();
        let dd = |args: &[&str]| {
            run_as(
                Path::new("/"),
                "/bin/dd",
                args,
                Sandbox {
                    paths: vec![path(&granted, true)],
                    ..Sandbox::default()
                },
                false,
            )
        };
        let out = dd(&["if=/dev/zero", &format!("of={}", g("ok")), "count=1"]);
        assert_eq!(out.exit_code, 0, "inside the sandbox: {}", text(&out));
        for args in [
            vec![
                "if=/dev/zero".to_owned(),
                format!("of={}", o("victim")),
                "count=1".into(),
            ],
            vec![
                "if=/dev/zero".into(),
                format!("of={}", g("link")),
                "count=1".into(),
            ],
            vec![
                "if=/dev/zero".into(),
                format!("of={}", g("link2")),
                "conv=notrunc".into(),
                "count=1".into(),
            ],
        ] {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = dd(&args);
            assert_ne!(out.exit_code, 0, "{args:?}: {}", text(&out));
        }
        assert!(!outside.join("victim").exists());
        assert!(!outside.join("victim2").exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("existing")).unwrap(),
            "orig"
        );
        let out = dd(&[&format!("if={}", o("secret"))]);
        assert!(
            out.exit_code != 0 && !String::from_utf8_lossy(&out.stdout).contains("s3cret"),
            "read outside the sandbox: {}",
            text(&out)
        );
        // More shapes: an option with its path attached (`-oPATH`), a truncation, a rename
        // of a file outside into the sandbox.
        for (command, args) in [
            (
                "/usr/bin/sort",
                vec![format!("-o{}", o("sorted")), "/dev/null".to_owned()],
            ),
            ("/usr/bin/truncate", vec!["-s0".to_owned(), o("existing")]),
            ("/bin/mv", vec![o("secret"), g("moved")]),
        ] {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = run_as(
                Path::new("/"),
                command,
                &args,
                Sandbox {
                    paths: vec![path(&granted, true)],
                    ..Sandbox::default()
                },
                false,
            );
            assert_ne!(out.exit_code, 0, "{command} {args:?}: {}", text(&out));
        }
        assert!(!outside.join("sorted").exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("existing")).unwrap(),
            "orig"
        );
        assert_eq!(
            std::fs::read_to_string(outside.join("secret")).unwrap(),
            "s3cret"
        );
        assert!(!granted.join("moved").exists());
        // A hard link made by the command would carry a file outside into the sandbox.
        let ln = run_as(
            Path::new("/"),
            "/bin/ln",
            &[&o("existing"), &g("hardlink")],
            Sandbox {
                paths: vec![path(&granted, true)],
                ..Sandbox::default()
            },
            false,
        );
        assert_ne!(ln.exit_code, 0, "{}", text(&ln));
        assert!(!granted.join("hardlink").exists());
        // Nor can it make a FIFO or device to hang or fool what reads the directory next.
        let mkfifo = run_as(
            Path::new("/"),
            "/usr/bin/mkfifo",
            &[&g("fifo")],
            Sandbox {
                paths: vec![path(&granted, true)],
                ..Sandbox::default()
            },
            false,
        );
        assert_ne!(mkfifo.exit_code, 0, "{}", text(&mkfifo));
    }

    /// Unmounts a bind mount when the test ends.
    struct Mounted(PathBuf);

    impl Drop for Mounted {
        fn drop(&mut self) {
            let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
        }
    }

    /// Class 4: with the node's `/proc` below the host root (a real node's is, under
    /// the agent's `/host`), a chrooted command cannot walk through another process's
    /// `/proc/<pid>/root` to the file system outside the host root, even that of a
    /// process holding fewer capabilities than itself.
    #[test]
    fn class4_proc_pid_root_does_not_lead_out_of_the_host_root() {
        require_kernel("class4");
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        install_shell(&root);
        std::fs::create_dir_all(root.join("proc")).unwrap();
        rustix::mount::mount_bind("/proc", root.join("proc")).unwrap();
        let _mounted = Mounted(root.join("proc"));
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "s3cret\n").unwrap();
        let mut victim = Victim::start();
        let script = "read line < \"/proc/$0/root$1\" && echo \"read: $line\"";
        for without_sys_admin in [true, false] {
            let out = run_as(
                &root,
                "/bin/sh",
                &["-c", script, &victim.pid(), secret.to_str().unwrap()],
                Sandbox::default(),
                without_sys_admin,
            );
            assert!(
                !String::from_utf8_lossy(&out.stdout).contains("s3cret"),
                "read a file outside the host root through /proc (without SYS_ADMIN: {without_sys_admin}): {}",
                text(&out)
            );
        }
        assert!(victim.alive());
    }

    /// Class 5: in the chroot fallback (the agent's PID namespace), a command cannot
    /// signal a process outside its own, even one with no capabilities at all.
    #[test]
    fn class5_a_command_signals_only_its_own_processes() {
        require_kernel("class5");
        let mut victim = Victim::start();
        let out = run_as(
            Path::new("/"),
            "/bin/sh",
            &["-c", "kill -TERM \"$0\"; echo \"kill: $?\"", &victim.pid()],
            Sandbox::default(),
            true,
        );
        assert!(
            victim.alive(),
            "the command killed a process outside its domain: {}",
            text(&out)
        );
        // Its own children it may signal.
        let out = run_as(
            Path::new("/"),
            "/bin/sh",
            &["-c", "sleep 30 & kill -TERM $! && echo own"],
            Sandbox::default(),
            true,
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "own\n",
            "{}",
            text(&out)
        );
    }

    /// Class 6: a descriptor the agent holds without close-on-exec does not reach the
    /// command.
    #[test]
    #[allow(unsafe_code)]
    fn class6_descriptors_of_the_agent_do_not_reach_commands() {
        require_kernel("class6");
        let file = std::fs::File::open("/proc/self/status").unwrap();
        // SAFETY: dup of a descriptor we own; the copy is closed below.
        let leaked = unsafe { libc::dup(std::os::fd::AsRawFd::as_raw_fd(&file)) };
        assert!(leaked > 2);
        for without_sys_admin in [true, false] {
            let out = run_as(
                Path::new("/"),
                "/bin/sh",
                &[
                    "-c",
                    "if [ -e \"/proc/$$/fd/$0\" ]; then echo leaked; else echo closed; fi",
                    &leaked.to_string(),
                ],
                Sandbox::default(),
                without_sys_admin,
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "closed\n",
                "{}",
                text(&out)
            );
        }
        // SAFETY: the duplicate made above.
        unsafe { libc::close(leaked) };
    }

    fn perl(script: &str, args: &[&str], sandbox: Sandbox) -> CommandOutput {
        let mut all = vec!["-e", script];
        all.extend_from_slice(args);
        run_as(Path::new("/"), "/usr/bin/perl", &all, sandbox, true)
    }

    /// Class 9: no network unless granted: no IP socket at all without a TCP grant, TCP
    /// connect only to granted ports, no bind; abstract Unix sockets outside the
    /// command's own processes unreachable even with a Unix socket grant.
    #[test]
    fn class9_no_network_but_the_granted_ports() {
        require_kernel("class9");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let connect = "use Socket; socket(my $s, PF_INET, SOCK_STREAM, 0) or die \"socket: $!\\n\"; \
                       connect($s, pack_sockaddr_in($ARGV[0], inet_aton('127.0.0.1'))) or die \"connect: $!\\n\"; \
                       print \"connected\\n\"";
        let tcp = |ports: Vec<u16>| Sandbox {
            tcp_connect: ports,
            ..Sandbox::default()
        };
        let p = port.to_string();
        let out = perl(connect, &[&p], Sandbox::default());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("socket: Operation not permitted"),
            "{}",
            text(&out)
        );
        let out = perl(connect, &[&p], tcp(vec![port.wrapping_add(1)]));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("connect: Permission denied"),
            "{}",
            text(&out)
        );
        let out = perl(connect, &[&p], tcp(vec![port]));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "connected\n",
            "{}",
            text(&out)
        );
        let bind = "use Socket; socket(my $s, PF_INET, SOCK_STREAM, 0) or die \"socket: $!\\n\"; \
                    bind($s, pack_sockaddr_in(0, inet_aton('127.0.0.1'))) or die \"bind: $!\\n\"; \
                    listen($s, 1) or die \"listen: $!\\n\"; print \"listening\\n\"";
        let out = perl(bind, &[], tcp(vec![port]));
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("listening"),
            "{}",
            text(&out)
        );

        use std::os::linux::net::SocketAddrExt;
        let name = format!("bosun-class9-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let _abstract = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
        let unix = "use Socket; socket(my $s, PF_UNIX, SOCK_STREAM, 0) or die \"socket: $!\\n\"; \
                    connect($s, pack_sockaddr_un(\"\\0\" . $ARGV[0])) or die \"connect: $!\\n\"; \
                    print \"connected\\n\"";
        let out = perl(unix, &[&name], Sandbox::default());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("socket: Operation not permitted"),
            "{}",
            text(&out)
        );
        let out = perl(
            unix,
            &[&name],
            Sandbox {
                unix_sockets: vec!["/run/some.sock".into()],
                ..Sandbox::default()
            },
        );
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("connected"),
            "reached an abstract socket outside the command: {}",
            text(&out)
        );
    }

    /// Modes, owners and extended attributes, which Landlock does not confine, change
    /// only with `changeMetadata`.
    #[test]
    fn metadata_changes_need_their_grant() {
        require_kernel("metadata");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "").unwrap();
        let chmod = |change_metadata: bool| {
            run_as(
                Path::new("/"),
                "/bin/chmod",
                &["4755", file.to_str().unwrap()],
                Sandbox {
                    paths: vec![path(dir.path(), true)],
                    change_metadata,
                    ..Sandbox::default()
                },
                false,
            )
        };
        let mode = || {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o7777
        };
        let out = chmod(false);
        assert_ne!(out.exit_code, 0, "{}", text(&out));
        assert_eq!(mode(), 0o644);
        let out = chmod(true);
        assert_eq!(out.exit_code, 0, "{}", text(&out));
        assert_eq!(mode(), 0o4755);
    }

    /// A base file that is a symlink gives no access through it, with one exception made in
    /// the base itself: /etc/resolv.conf linked into /run by a resolver (Ubuntu's
    /// systemd-resolved), whose target files are base entries of their own. Before they
    /// were, a granted command on such a node could not read its resolver configuration
    /// (so could not resolve a mirror's name). A base file linked elsewhere (a plugin with
    /// a write grant under /etc could make /etc/hosts point at a secret) stays unreadable.
    #[test]
    fn a_base_file_linked_to_its_resolver_is_read_and_one_linked_elsewhere_is_not() {
        require_kernel("base symlinks");
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        install_shell(root);
        for (file, text) in [
            (
                "run/systemd/resolve/stub-resolv.conf",
                "nameserver 127.0.0.53\n",
            ),
            ("secret/hosts", "secret\n"),
        ] {
            std::fs::create_dir_all(root.join(file).parent().unwrap()).unwrap();
            std::fs::write(root.join(file), text).unwrap();
        }
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::os::unix::fs::symlink(
            "../run/systemd/resolve/stub-resolv.conf",
            root.join("etc/resolv.conf"),
        )
        .unwrap();
        std::os::unix::fs::symlink("../secret/hosts", root.join("etc/hosts")).unwrap();
        // A resolver file that is itself a link (a plugin with a write grant in /run could
        // make one) is no way to the secret either.
        std::os::unix::fs::symlink(
            "../../../secret/hosts",
            root.join("run/systemd/resolve/resolv.conf"),
        )
        .unwrap();
        let out = run_as(
            root,
            "/bin/sh",
            &[
                "-c",
                "read r < /etc/resolv.conf && echo \"resolv: $r\"; read h < /etc/hosts && echo \"hosts: $h\"; \
                 read l < /run/systemd/resolve/resolv.conf && echo \"linked: $l\"; true",
            ],
            Sandbox::default(),
            false,
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("resolv: nameserver 127.0.0.53"),
            "{}",
            text(&out)
        );
        assert!(!stdout.contains("hosts:"), "{}", text(&out));
        assert!(!stdout.contains("linked:"), "{}", text(&out));
        assert!(!stdout.contains("secret"), "{}", text(&out));
    }

    /// A sandbox path that goes through a symlink or is missing fails the command before
    /// it starts, naming the path.
    #[test]
    fn sandbox_paths_are_never_resolved_through_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("link")).unwrap();
        let with = |p: &str, optional: bool| {
            prepare(
                dir.path(),
                dir.path(),
                &Sandbox {
                    paths: vec![SandboxPath {
                        path: p.into(),
                        write: true,
                        execute: false,
                        optional,
                        origin: "the exec grant's sandbox",
                    }],
                    ..Sandbox::default()
                },
            )
        };
        assert!(
            support().landlock_abi > 0,
            "this test needs Landlock (the ruleset is where paths are opened)"
        );
        assert!(with("/real", false).is_ok());
        let e = with("/link/x", false).unwrap_err();
        assert!(e.contains("/link/x goes through a symlink"), "{e}");
        // The link itself, optional or not: refused naming it and its target, not made a
        // rule that grants nothing.
        for optional in [false, true] {
            let e = with("/link", optional).unwrap_err();
            assert!(
                e.contains("the exec grant's sandbox names /link is a symlink (to real); name the real path"),
                "{e}"
            );
        }
        let e = with("/missing", false).unwrap_err();
        assert!(e.contains("does not exist on this node"), "{e}");
        assert!(with("/missing", true).is_ok());
    }
}

/// The cgroup per command, where this machine gives one (as root: its cgroup v2 hierarchy).
#[cfg(test)]
mod cgroup_tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::config::ExecIsolation;
    use crate::exec::tests::require_root;
    use crate::exec::{CommandSpec, run};

    #[test]
    fn a_command_and_what_it_starts_run_in_a_cgroup_of_their_own_removed_after() {
        require_root("cgroup");
        let parent = crate::cgroup::cgroups(Path::new("/"))
            .map(|_| ())
            .and(command_cgroup());
        assert!(
            parent.is_some(),
            "this test needs a writable cgroup v2 hierarchy holding the test (root has one)"
        );
        let dir = tempfile::tempdir().unwrap();
        let args: Vec<String> = [
            "-c",
            "cat /proc/self/cgroup; setsid /bin/sh -c 'cat /proc/self/cgroup > \"$0/daemon\"' \"$0\" & wait",
            dir.path().to_str().unwrap(),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let sandbox = Sandbox {
            paths: vec![SandboxPath {
                path: dir.path().to_str().unwrap().to_owned(),
                write: true,
                execute: false,
                optional: false,
                origin: "the test",
            }],
            ..Sandbox::default()
        };
        let out = run(CommandSpec {
            root: Path::new("/"),
            isolation: ExecIsolation::Chroot,
            command: "/bin/sh",
            args: &args,
            stdin: None,
            timeout: Duration::from_secs(30),
            max_output: 4096,
            sandbox: &sandbox,
        })
        .unwrap();
        let own = String::from_utf8_lossy(&out.stdout).into_owned();
        let daemon = std::fs::read_to_string(dir.path().join("daemon")).unwrap();
        let cgroup_of = |text: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix("0::"))
                .unwrap_or_default()
                .to_owned()
        };
        let cg = cgroup_of(&own);
        assert!(cg.contains("/bosun-command-"), "{own}");
        assert_eq!(cgroup_of(&daemon), cg, "{daemon}");
        // Gone once the call returned.
        let mount = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .iter()
            .map(Path::new)
            .find(|m| {
                m.join(cg.trim_start_matches('/'))
                    .parent()
                    .is_some_and(Path::exists)
            })
            .unwrap();
        assert!(
            !mount.join(cg.trim_start_matches('/')).exists(),
            "{cg} left behind"
        );
    }
}
