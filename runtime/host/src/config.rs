//! Host configuration: the node's root, the compiled-code cache, the trust roots and
//! every limit a run is held to.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::service::{ServiceBackend, SystemctlBackend};

/// How granted commands (and the kubeadm fact) are started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecIsolation {
    /// The command's `/` is the host root when the root is not `/`: its own mount
    /// namespace with `pivot_root` into the host root where the agent may create one
    /// (`CAP_SYS_ADMIN`), else `chroot(2)`; it sees only the node's file system. Needs
    /// `CAP_SYS_CHROOT` or `CAP_SYS_ADMIN` (the agent runs as root); without either every
    /// command fails with `host-error.failed` saying so. Either way the command keeps only
    /// a reduced capability set (docs/security.md, "Confinement of granted commands").
    Chroot,
    /// Resolve the command under the host root and start it with the host root as its
    /// working directory, but without chroot. For unprivileged development runs only:
    /// the command itself is not confined (it runs with the caller's view of the
    /// file system); the grant checks on command and arguments still apply.
    ResolveOnly,
}

/// Limits for one plugin call (describe, preflight or run). Every one is enforced by
/// the host, not trusted to the plugin.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Bytes of linear memory a call may have in all: every memory of every core instance
    /// of the component counts against this one budget. Also sizes the pooling
    /// allocator's memory slots. Default 256 MiB.
    pub max_memory_bytes: u64,
    /// Table elements a call may have in all tables together. Default 100 000.
    pub max_table_elements: u64,
    /// Wall clock for a run when the caller gives none. Default 5 minutes.
    pub default_deadline: Duration,
    /// Wall clock for `describe` and `preflight`. Default 10 s.
    pub describe_deadline: Duration,
    /// Total bytes of log messages and fields per call, each line charged 64 bytes and
    /// each field 48 bytes besides its text (so a flood of empty lines meets the limit
    /// too). Default 1 MiB.
    pub max_log_bytes: u64,
    /// One log line is truncated to this many bytes. Default 8 KiB.
    pub max_log_line_bytes: usize,
    /// Structured fields per log line. Default 32.
    pub max_log_fields: usize,
    /// Total bytes of the result (outcome message and outputs, error message, checks,
    /// metadata). Default 1 MiB.
    pub max_output_bytes: u64,
    /// Bytes of the params document the caller may pass. Default 1 MiB.
    pub max_params_bytes: usize,
    /// Length of any single string a plugin passes to a host call (command, argument,
    /// unit, URL). Default 4 KiB.
    pub max_string_bytes: usize,
    /// Arguments per command. Default 256.
    pub max_exec_args: usize,
    /// Bytes of stdin a plugin may pass to a command. Default 1 MiB.
    pub max_exec_stdin_bytes: usize,
    /// Largest HTTP body, whatever the grant says. Default 128 MiB: the Kubernetes node
    /// binaries the `packages` plugin's binary backend downloads are 60–85 MB (v1.34's
    /// kubeadm 74 MB, kubelet 84 MB as built here), over the 64 MiB this once was. The body
    /// is held by the host, then copied into the plugin's memory (its own limit).
    pub max_http_bytes: u64,
    /// Bytes of the guest's stderr kept (panic messages). Default 16 KiB.
    pub max_stderr_bytes: usize,
    /// Resources a call may hold open at once (open files and directories of its grants,
    /// streams, pollables). Each may hold a host file descriptor or host memory the
    /// memory limit does not count; past it the host call fails. Default 1024.
    pub max_resources: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_memory_bytes: 256 << 20,
            max_table_elements: 100_000,
            default_deadline: Duration::from_secs(300),
            describe_deadline: Duration::from_secs(10),
            max_log_bytes: 1 << 20,
            max_log_line_bytes: 8 << 10,
            max_log_fields: 32,
            max_output_bytes: 1 << 20,
            max_params_bytes: 1 << 20,
            max_string_bytes: 4 << 10,
            max_exec_args: 256,
            max_exec_stdin_bytes: 1 << 20,
            max_http_bytes: 128 << 20,
            max_stderr_bytes: 16 << 10,
            max_resources: 1024,
        }
    }
}

/// Sizing of wasmtime's pooling allocator: how many plugin instances may be alive at
/// once in this host. A run beyond that fails with [`Error::Instantiate`](crate::Error).
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Plugin instances alive at once. Default 16.
    pub max_instances: u32,
    /// Core module instances inside one plugin component (a Rust wasip2 component has
    /// a handful). Default 16.
    pub max_core_instances_per_plugin: u32,
    /// Bytes of each linear memory (and, capped at 64 KiB, each table) that stay mapped
    /// when an instance ends. Memory is always reset to zero before its slot is reused,
    /// so nothing a plugin wrote is visible to the next run; this only chooses how: up to
    /// this many bytes are zeroed in place (found with the PAGEMAP_SCAN ioctl on Linux
    /// 6.7+), the rest is returned to the kernel with `madvise`. Keeping the pages a
    /// typical run touches avoids a page fault per page on the next run (see
    /// docs/benchmarks.md, figure a). Costs up to `max_instances` × this many bytes of
    /// resident memory. Default 4 MiB; 0 decommits everything.
    pub keep_resident_bytes: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_instances: 16,
            max_core_instances_per_plugin: 16,
            keep_resident_bytes: 4 << 20,
        }
    }
}

/// Everything a [`Host`](crate::Host) is created with.
#[derive(Clone)]
pub struct HostConfig {
    /// The node's root file system as the agent sees it (`/` on a node, `/host` in a
    /// container that mounts it, a directory per simulated node in the lab). Every
    /// grant is resolved under it.
    pub host_root: PathBuf,
    /// Where compiled plugins are cached across restarts; `None` compiles in memory only.
    /// Created with mode 0700; holds a host-local MAC key so only code this host
    /// compiled is ever loaded back.
    pub cache_dir: Option<PathBuf>,
    /// Keys that may sign plugins.
    pub trust_roots: bosun_trust::TrustRoots,
    /// Accept [`Host::load_unverified`](crate::Host::load_unverified). Off by default;
    /// meant only for a plugin author's local loop, never for an agent.
    pub allow_unverified: bool,
    pub limits: Limits,
    pub pool: PoolConfig,
    /// How often the epoch ticker advances: the granularity of deadlines. Default 5 ms.
    pub epoch_tick: Duration,
    pub exec_isolation: ExecIsolation,
    /// Drives systemd units for `service` grants.
    pub service_backend: Arc<dyn ServiceBackend>,
    /// Where plugins are compiled (in this process by default).
    pub compiler: crate::Compiler,
    /// What the `http` import trusts for https and where it connects (default: the
    /// compiled-in Mozilla roots, DNS).
    pub http: crate::HttpConfig,
}

impl std::fmt::Debug for HostConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostConfig")
            .field("host_root", &self.host_root)
            .field("cache_dir", &self.cache_dir)
            .field("allow_unverified", &self.allow_unverified)
            .field("limits", &self.limits)
            .field("pool", &self.pool)
            .field("epoch_tick", &self.epoch_tick)
            .field("exec_isolation", &self.exec_isolation)
            .field("compiler", &self.compiler)
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

impl HostConfig {
    /// A configuration with default limits, no on-disk cache, chroot isolation and the
    /// systemctl backend.
    pub fn new(host_root: impl Into<PathBuf>, trust_roots: bosun_trust::TrustRoots) -> Self {
        HostConfig {
            host_root: host_root.into(),
            cache_dir: None,
            trust_roots,
            allow_unverified: false,
            limits: Limits::default(),
            pool: PoolConfig::default(),
            epoch_tick: Duration::from_millis(5),
            exec_isolation: ExecIsolation::Chroot,
            service_backend: Arc::new(SystemctlBackend::default()),
            compiler: crate::Compiler::default(),
            http: crate::HttpConfig::default(),
        }
    }
}
