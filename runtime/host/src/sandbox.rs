//! One plugin call's sandbox: the store state, the linker that defines exactly what a
//! plugin may import, and the Bosun host interfaces, each checking the grants first.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bosun_api::grants::{Grants, ServiceAction};
use wasmtime::component::{HasData, HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, ResourceLimiter};
use wasmtime_wasi::cli::WasiCliView as _;
use wasmtime_wasi::clocks::WasiClocksView as _;
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::random::WasiRandomView as _;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::bindings::bosun::plugin::{exec, facts, http, log, service, types};
use crate::config::{ExecIsolation, Limits};
use crate::exec::{CommandError, CommandSpec, Refusal};
use crate::facts::NodeContext;
use crate::http::HttpRefusal;
use crate::report::{Denial, LogLevel, LogLine, Progress};
use crate::service::{ServiceBackend, ServiceError};

/// Why the host stopped a call from inside a host function or the resource limiter.
/// Raised as a trap and recognised again when the call returns.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Stop {
    #[error("memory limit")]
    Memory { what: &'static str, limit: u64 },
    #[error("log limit")]
    Log { limit: u64 },
}

/// The store's resource limiter: memory and table growth beyond the limits stops the
/// call with a typed [`Stop`] instead of returning -1 to the guest (a Rust guest would
/// only abort on that, which would look like any other trap).
///
/// The limits are budgets for the whole call, not per memory or table: a component may
/// hold several core instances, each with its own linear memory and tables, and a limit
/// per memory let four of them take four times the limit. Every growth is charged to one
/// running total (what the memory or table had is credited back first, so each is
/// counted at its current size); memories count bytes against `max_memory`, tables count
/// elements against `max_table_elements`.
pub(crate) struct RunLimiter {
    pub max_memory: u64,
    pub max_table_elements: u64,
    /// Bytes of every linear memory of the call, as last grown.
    pub memory_used: u64,
    /// Elements of every table of the call, as last grown.
    pub table_used: u64,
}

impl RunLimiter {
    pub(crate) fn new(max_memory: u64, max_table_elements: u64) -> Self {
        RunLimiter {
            max_memory,
            max_table_elements,
            memory_used: 0,
            table_used: 0,
        }
    }
}

impl ResourceLimiter for RunLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self
            .memory_used
            .saturating_sub(current as u64)
            .saturating_add(desired as u64);
        if total > self.max_memory {
            return Err(wasmtime::Error::new(Stop::Memory {
                what: "memory",
                limit: self.max_memory,
            }));
        }
        self.memory_used = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self
            .table_used
            .saturating_sub(current as u64)
            .saturating_add(desired as u64);
        if total > self.max_table_elements {
            return Err(wasmtime::Error::new(Stop::Memory {
                what: "table",
                limit: self.max_table_elements,
            }));
        }
        self.table_used = total;
        Ok(true)
    }

    fn instances(&self) -> usize {
        64
    }
    fn tables(&self) -> usize {
        64
    }
    fn memories(&self) -> usize {
        8
    }
}

/// What the host knows for a call besides the grants.
pub(crate) struct CallEnv {
    pub root: PathBuf,
    pub isolation: ExecIsolation,
    pub service: Arc<dyn ServiceBackend>,
    pub node: NodeContext,
    pub limits: Limits,
    /// Shared by the host's calls: the kubeadm version by the identity of its files.
    pub facts_cache: Arc<crate::facts::FactsCache>,
    /// The `http` import's TLS configuration and fixed addresses.
    pub http: Arc<crate::http::Client>,
    /// The call is `describe`, made on bytes that may not be verified yet: no node facts.
    pub describing: bool,
}

/// The data of one store: WASI state, the plugin's grants and everything captured.
pub(crate) struct RunState {
    pub wasi: WasiCtx,
    pub table: ResourceTable,
    pub limiter: RunLimiter,
    pub grants: Arc<Grants>,
    /// The call is part of a dry run: exec only `dryRun` grants, no service changes
    /// (the filesystem preopens are read-only already).
    pub dry_run: bool,
    pub env: Arc<CallEnv>,
    pub deadline: Instant,
    /// A clock subscription of this call was cut at the deadline ([`CappedClock`]).
    pub clock_cut: bool,
    pub log_bytes: u64,
    pub lines: Vec<LogLine>,
    pub progress: Option<Progress>,
    pub denied: Vec<Denial>,
    /// The node's facts, read at the first `facts.node` of the call and answered from
    /// here after that.
    pub facts: Option<crate::facts::NodeFacts>,
    /// Time spent inside granted host commands and service actions ([`Captured::host_time`]).
    pub host_time: Duration,
    /// The grants this call exercised (see [`crate::GrantUse`]).
    pub used: std::collections::BTreeSet<crate::GrantUse>,
    /// The filesystem grant (its guest path) each open descriptor descends from, by the
    /// descriptor's resource index: set when a preopen is handed out or a descriptor is
    /// opened beneath one (guarded_fs.rs), to record which grants path operations used.
    pub descriptors: std::collections::HashMap<u32, Arc<str>>,
}

/// Keeps a refusal for the call's report (at most [`MAX_DENIALS`], then one line saying
/// more were refused) and returns its message, cut to [`MAX_DENIAL_MESSAGE`].
pub(crate) fn record_denial(
    denied: &mut Vec<Denial>,
    capability: &str,
    mut message: String,
) -> String {
    truncate_utf8(&mut message, MAX_DENIAL_MESSAGE);
    match denied.len() {
        n if n < MAX_DENIALS => {
            tracing::info!(capability, %message, "plugin host call refused");
            denied.push(Denial { capability: capability.to_owned(), message: message.clone() });
        }
        n if n == MAX_DENIALS => denied.push(Denial {
            capability: "(more)".to_owned(),
            message: format!("more than {MAX_DENIALS} host calls were refused; only the first {MAX_DENIALS} are listed"),
        }),
        _ => {}
    }
    message
}

impl WasiView for RunState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl RunState {
    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    fn deny(&mut self, capability: &str, message: String) -> types::HostError {
        types::HostError::NotGranted(record_denial(&mut self.denied, capability, message))
    }

    fn check_len(&self, what: &str, value: &str) -> Result<(), types::HostError> {
        let max = self.env.limits.max_string_bytes;
        if value.len() > max {
            return Err(types::HostError::InvalidArgument(format!(
                "{what} is {} bytes, more than the host's limit of {max}",
                value.len()
            )));
        }
        Ok(())
    }
}

struct HasIo;

impl HasData for HasIo {
    type Data<'a> = &'a mut ResourceTable;
}

/// Builds the linker: the WASI 0.2 interfaces a Rust `wasm32-wasip2` plugin needs
/// (cli environment/exit/stdio/terminal, clocks, filesystem, random, io) and the Bosun
/// interfaces. `wasi:sockets` and `wasi:http` are never linked; `http` only when
/// `with_http`.
pub(crate) fn linker(engine: &Engine, with_http: bool) -> wasmtime::Result<Linker<RunState>> {
    use wasmtime_wasi::cli::WasiCli;
    use wasmtime_wasi::clocks::WasiClocks;
    use wasmtime_wasi::p2::bindings::{cli, clocks, filesystem, random, sync};
    use wasmtime_wasi::random::WasiRandom;

    let mut l = Linker::<RunState>::new(engine);
    clocks::wall_clock::add_to_linker::<RunState, WasiClocks>(&mut l, RunState::clocks)?;
    clocks::monotonic_clock::add_to_linker::<RunState, CappedClock>(&mut l, |s| {
        let remaining = s.remaining();
        CappedClockView {
            inner: wasmtime_wasi::clocks::WasiClocksCtxView {
                ctx: s.wasi.clocks(),
                table: &mut s.table,
            },
            remaining,
            cut: &mut s.clock_cut,
        }
    })?;
    // wasmtime-wasi's filesystem with one check in front of `open-at` and the grants'
    // use recorded (guarded_fs.rs).
    filesystem::preopens::add_to_linker::<RunState, crate::guarded_fs::GuardedFilesystem>(
        &mut l,
        RunState::guarded_fs,
    )?;
    sync::filesystem::types::add_to_linker::<RunState, crate::guarded_fs::GuardedFilesystem>(
        &mut l,
        RunState::guarded_fs,
    )?;
    random::random::add_to_linker::<RunState, WasiRandom>(&mut l, RunState::random)?;
    random::insecure::add_to_linker::<RunState, WasiRandom>(&mut l, RunState::random)?;
    random::insecure_seed::add_to_linker::<RunState, WasiRandom>(&mut l, RunState::random)?;
    cli::exit::add_to_linker::<RunState, WasiCli>(&mut l, RunState::cli)?;
    cli::environment::add_to_linker::<RunState, WasiCli>(&mut l, RunState::cli)?;
    cli::stdin::add_to_linker::<RunState, WasiCli>(&mut l, RunState::cli)?;
    cli::stdout::add_to_linker::<RunState, WasiCli>(&mut l, RunState::cli)?;
    cli::stderr::add_to_linker::<RunState, WasiCli>(&mut l, RunState::cli)?;
    cli::terminal_input::add_to_linker::<RunState, WasiCli>(&mut l, RunState::cli)?;
    cli::terminal_output::add_to_linker::<RunState, WasiCli>(&mut l, RunState::cli)?;
    cli::terminal_stdin::add_to_linker::<RunState, WasiCli>(&mut l, RunState::cli)?;
    cli::terminal_stdout::add_to_linker::<RunState, WasiCli>(&mut l, RunState::cli)?;
    cli::terminal_stderr::add_to_linker::<RunState, WasiCli>(&mut l, RunState::cli)?;
    wasmtime_wasi_io::bindings::wasi::io::error::add_to_linker::<RunState, HasIo>(&mut l, |s| {
        &mut s.table
    })?;
    sync::io::poll::add_to_linker::<RunState, HasIo>(&mut l, |s| &mut s.table)?;
    sync::io::streams::add_to_linker::<RunState, HasIo>(&mut l, |s| &mut s.table)?;

    types::add_to_linker::<RunState, HasSelf<RunState>>(&mut l, |s| s)?;
    log::add_to_linker::<RunState, HasSelf<RunState>>(&mut l, |s| s)?;
    exec::add_to_linker::<RunState, HasSelf<RunState>>(&mut l, |s| s)?;
    service::add_to_linker::<RunState, HasSelf<RunState>>(&mut l, |s| s)?;
    facts::add_to_linker::<RunState, HasSelf<RunState>>(&mut l, |s| s)?;
    if with_http {
        http::add_to_linker::<RunState, HasSelf<RunState>>(&mut l, |s| s)?;
    }
    Ok(l)
}

/// `wasi:clocks/monotonic-clock` with every subscription cut at the call's deadline.
///
/// The epoch deadline stops a call only while its wasm runs; a guest blocked in the host
/// on a pollable (`std::thread::sleep(Duration::MAX)`, or `subscribe-duration(u64::MAX)`
/// and `pollable.block`) would otherwise hold its thread and pool slot for ever. Cut at
/// the deadline, the sleep ends and the guest resumes; the epoch check stops it with
/// [`Error::DeadlineExceeded`](crate::Error), and so does the host when the guest returns
/// past its deadline after a cut (the epoch ticker may lag on a busy machine).
pub(crate) struct CappedClock;

impl HasData for CappedClock {
    type Data<'a> = CappedClockView<'a>;
}

pub(crate) struct CappedClockView<'a> {
    inner: wasmtime_wasi::clocks::WasiClocksCtxView<'a>,
    /// Time left until the call's deadline when the guest made the call.
    remaining: Duration,
    /// Set when a subscription was cut (the guest asked to wait past its deadline).
    cut: &'a mut bool,
}

/// Past the deadline by this much a subscription still ends, so that the guest is back
/// in wasm after the epoch deadline has passed (the next epoch check then stops it).
const CLOCK_GRACE: Duration = Duration::from_millis(50);

impl monotonic_clock::Host for CappedClockView<'_> {
    fn now(&mut self) -> wasmtime::Result<u64> {
        monotonic_clock::Host::now(&mut self.inner)
    }

    fn resolution(&mut self) -> wasmtime::Result<u64> {
        monotonic_clock::Host::resolution(&mut self.inner)
    }

    fn subscribe_instant(
        &mut self,
        when: u64,
    ) -> wasmtime::Result<wasmtime::component::Resource<wasmtime_wasi_io::poll::DynPollable>> {
        let now = monotonic_clock::Host::now(&mut self.inner)?;
        self.subscribe_duration(when.saturating_sub(now))
    }

    fn subscribe_duration(
        &mut self,
        nanos: u64,
    ) -> wasmtime::Result<wasmtime::component::Resource<wasmtime_wasi_io::poll::DynPollable>> {
        let cap = u64::try_from((self.remaining + CLOCK_GRACE).as_nanos()).unwrap_or(u64::MAX);
        if nanos > cap {
            *self.cut = true;
        }
        monotonic_clock::Host::subscribe_duration(&mut self.inner, nanos.min(cap))
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub(crate) fn truncate_utf8(s: &mut String, max: usize) -> bool {
    if s.len() <= max {
        return false;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    true
}

/// What one log line and one field cost against `max_log_bytes` besides their text
/// (about what the host keeps for them).
const LOG_LINE_OVERHEAD: u64 = 64;
const LOG_FIELD_OVERHEAD: u64 = 48;

/// Refusals kept per call (each with its message cut to [`MAX_DENIAL_MESSAGE`] bytes);
/// later ones are counted in the last entry. A plugin retrying a refused call in a loop
/// must not grow the host's memory.
pub(crate) const MAX_DENIALS: usize = 32;
const MAX_DENIAL_MESSAGE: usize = 1024;

impl types::Host for RunState {}

impl log::Host for RunState {
    fn write(
        &mut self,
        level: log::Level,
        mut message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        let limits = &self.env.limits;
        // Every line and field is charged a fixed overhead besides its bytes: a flood of
        // empty lines costs host memory too, and must meet the same limit.
        let size = LOG_LINE_OVERHEAD
            + message.len() as u64
            + fields
                .iter()
                .map(|(k, v)| LOG_FIELD_OVERHEAD + (k.len() + v.len()) as u64)
                .sum::<u64>();
        self.log_bytes = self.log_bytes.saturating_add(size);
        if self.log_bytes > limits.max_log_bytes {
            return Err(wasmtime::Error::new(Stop::Log {
                limit: limits.max_log_bytes,
            }));
        }
        let truncated = truncate_utf8(&mut message, limits.max_log_line_bytes);
        let dropped_fields = fields.len().saturating_sub(limits.max_log_fields);
        let mut fields: Vec<(String, String)> =
            fields.into_iter().take(limits.max_log_fields).collect();
        for (k, v) in &mut fields {
            truncate_utf8(k, limits.max_log_line_bytes);
            truncate_utf8(v, limits.max_log_line_bytes);
        }
        if dropped_fields > 0 {
            fields.push(("bosun.dropped-fields".into(), dropped_fields.to_string()));
        }
        let level = match level {
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        };
        self.lines.push(LogLine {
            level,
            message,
            fields,
            truncated,
        });
        Ok(())
    }

    fn progress(&mut self, done: u64, total: u64, mut message: String) -> wasmtime::Result<()> {
        truncate_utf8(&mut message, self.env.limits.max_log_line_bytes);
        self.progress = Some(Progress {
            done,
            total,
            message,
        });
        Ok(())
    }
}

impl exec::Host for RunState {
    fn run(
        &mut self,
        command: String,
        args: Vec<String>,
        stdin: Option<Vec<u8>>,
    ) -> wasmtime::Result<Result<exec::Output, types::HostError>> {
        Ok(self.exec(command, args, stdin))
    }
}

impl RunState {
    fn guarded_fs(&mut self) -> crate::guarded_fs::GuardedFs<'_> {
        crate::guarded_fs::GuardedFs {
            fs: wasmtime_wasi::filesystem::WasiFilesystemCtxView {
                ctx: self.wasi.filesystem(),
                table: &mut self.table,
            },
            denied: &mut self.denied,
            descriptors: &mut self.descriptors,
            used: &mut self.used,
        }
    }

    fn exec(
        &mut self,
        command: String,
        args: Vec<String>,
        stdin: Option<Vec<u8>>,
    ) -> Result<exec::Output, types::HostError> {
        let limits = self.env.limits.clone();
        self.check_len("command", &command)?;
        if args.len() > limits.max_exec_args {
            return Err(types::HostError::InvalidArgument(format!(
                "{} arguments, more than the host's limit of {}",
                args.len(),
                limits.max_exec_args
            )));
        }
        for a in &args {
            self.check_len("an argument", a)?;
            if a.contains('\0') {
                return Err(types::HostError::InvalidArgument(
                    "an argument contains a NUL byte".into(),
                ));
            }
        }
        if stdin
            .as_ref()
            .is_some_and(|s| s.len() > limits.max_exec_stdin_bytes)
        {
            return Err(types::HostError::InvalidArgument(format!(
                "stdin is larger than the host's limit of {} bytes",
                limits.max_exec_stdin_bytes
            )));
        }
        let grants = Arc::clone(&self.grants);
        let grant = match crate::exec::authorize(&grants.exec, &command, &args) {
            Ok(g) => g,
            Err(Refusal::Invalid(m)) => return Err(types::HostError::InvalidArgument(m)),
            Err(Refusal::NotGranted(m)) => return Err(self.deny("exec", m)),
        };
        // In a dry run the arguments must be admitted by a grant marked `dryRun` (another
        // grant of the same command may mark them so while the first match does not).
        let grant = if self.dry_run && !grant.dry_run {
            match grants
                .exec
                .iter()
                .filter(|g| g.dry_run)
                .find(|g| crate::exec::authorize(std::slice::from_ref(*g), &command, &args).is_ok())
            {
                Some(g) => g,
                None => {
                    return Err(self.deny(
                        "exec",
                        format!(
                            "dry run: {command} {} is granted, but not by a grant marked `dryRun: true`, so it \
                             does not run in a dry run (mark only argument lists that just read the node)",
                            args.join(" ")
                        ),
                    ));
                }
            }
        } else {
            grant
        };
        if let Err(m) = crate::exec::check_paths(&self.env.root, &command, &args) {
            return Err(self.deny("exec", m));
        }
        if let Some(index) = grants.exec.iter().position(|g| std::ptr::eq(g, grant)) {
            self.used.insert(crate::GrantUse::Exec {
                grant: index,
                pattern: crate::exec::matching_pattern(grant, &args),
            });
        }
        let grant_timeout = grant
            .timeout_seconds
            .map_or(crate::exec::DEFAULT_TIMEOUT, |s| {
                Duration::from_secs(s.into())
            });
        // The command may not outlive the call that started it.
        let timeout = grant_timeout.min(self.remaining());
        let sandbox = crate::confine::Sandbox::for_command(&grants.filesystem, grant, self.dry_run);
        let started = Instant::now();
        let out = crate::exec::run(CommandSpec {
            sandbox: &sandbox,
            root: &self.env.root,
            isolation: self.env.isolation,
            command: &command,
            args: &args,
            stdin,
            timeout,
            max_output: grant
                .max_output_bytes
                .unwrap_or(crate::exec::DEFAULT_MAX_OUTPUT),
        });
        self.host_time += started.elapsed();
        match out {
            Ok(o) => Ok(exec::Output {
                exit_code: o.exit_code,
                stdout: o.stdout,
                stderr: o.stderr,
                truncated: o.truncated,
            }),
            Err(CommandError::Timeout(t)) => Err(types::HostError::Timeout(
                crate::exec::timeout_message(&command, t),
            )),
            Err(CommandError::Failed(m)) => Err(types::HostError::Failed(m)),
        }
    }

    fn unit_grant(
        &mut self,
        unit: &str,
        action: Option<ServiceAction>,
    ) -> Result<(), types::HostError> {
        self.check_len("unit", unit)?;
        crate::service::check_unit_name(unit).map_err(types::HostError::InvalidArgument)?;
        let grants = Arc::clone(&self.grants);
        let Some(grant) = grants.services.iter().find(|g| g.unit == unit) else {
            return Err(self.deny(
                "service",
                format!("service: {unit} (no service grant names this unit)"),
            ));
        };
        if let Some(action) = action
            && !grant.actions.contains(&action)
        {
            return Err(self.deny(
                "service",
                format!(
                    "service: {action:?} {unit} (granted actions: {:?})",
                    grant.actions
                )
                .to_lowercase(),
            ));
        }
        self.used.insert(crate::GrantUse::Service {
            unit: unit.to_owned(),
            action: action.map_or("status", ServiceAction::as_str).to_owned(),
        });
        Ok(())
    }
}

fn service_error(e: ServiceError) -> types::HostError {
    match e {
        ServiceError::Failed(m) => types::HostError::Failed(m),
        e @ ServiceError::Timeout(_) => types::HostError::Timeout(e.to_string()),
    }
}

impl service::Host for RunState {
    fn control(
        &mut self,
        unit: String,
        action: service::Action,
    ) -> wasmtime::Result<Result<service::UnitStatus, types::HostError>> {
        let action = match action {
            service::Action::Start => ServiceAction::Start,
            service::Action::Stop => ServiceAction::Stop,
            service::Action::Restart => ServiceAction::Restart,
            service::Action::Reload => ServiceAction::Reload,
        };
        if let Err(e) = self.unit_grant(&unit, Some(action)) {
            return Ok(Err(e));
        }
        if self.dry_run {
            return Ok(Err(self.deny(
                "service",
                format!(
                    "dry run: {} {unit} is granted, but a dry run changes no service (status only)",
                    action.as_str()
                ),
            )));
        }
        let executed = self.env.service.executes();
        if !executed.is_empty()
            && let Some(hit) =
                crate::openrc::writable_by_plugin(&self.grants, executed, &self.env.root)
        {
            let manager = self.env.service.manager();
            return Ok(Err(self.deny(
                "service",
                format!(
                    "service: {} {unit} on a node whose services are run by {manager}, which \
                     executes the service's scripts and programs as root: {hit}, so this plugin \
                     could change what runs; give service grants to a plugin without write \
                     access there (docs/security.md, \"Services on OpenRC nodes\")",
                    action.as_str()
                ),
            )));
        }
        let started = Instant::now();
        let result = self
            .env
            .service
            .control(&self.env.root, &unit, action, self.remaining());
        self.host_time += started.elapsed();
        Ok(result
            .map(|s| service::UnitStatus {
                active_state: s.active_state,
                sub_state: s.sub_state,
            })
            .map_err(service_error))
    }

    fn status(
        &mut self,
        unit: String,
    ) -> wasmtime::Result<Result<service::UnitStatus, types::HostError>> {
        if let Err(e) = self.unit_grant(&unit, None) {
            return Ok(Err(e));
        }
        let started = Instant::now();
        let result = self
            .env
            .service
            .status(&self.env.root, &unit, self.remaining());
        self.host_time += started.elapsed();
        Ok(result
            .map(|s| service::UnitStatus {
                active_state: s.active_state,
                sub_state: s.sub_state,
            })
            .map_err(service_error))
    }
}

impl facts::Host for RunState {
    fn node(&mut self) -> wasmtime::Result<Result<facts::NodeFacts, types::HostError>> {
        if self.env.describing {
            return Ok(Err(types::HostError::NotGranted(
                "facts: node facts are not available to `describe`, which must not depend on the node \
                 (it also runs on unverified bytes, e.g. for `kubectl-bosun plugin inspect`)"
                    .into(),
            )));
        }
        let env = Arc::clone(&self.env);
        let f = self
            .facts
            .get_or_insert_with(|| crate::facts::gather(&env.root, &env.node, &env.facts_cache))
            .clone();
        Ok(Ok(facts::NodeFacts {
            node_name: f.node_name,
            roles: f.roles,
            os: facts::OsRelease {
                id: f.os.id,
                id_like: f.os.id_like,
                version_id: f.os.version_id,
                pretty_name: f.os.pretty_name,
            },
            arch: f.arch,
            kernel: f.kernel,
            kubelet_version: f.kubelet_version,
            kubeadm_version: f.kubeadm_version,
        }))
    }
}

impl http::Host for RunState {
    fn get(
        &mut self,
        url: String,
        max_bytes: u64,
    ) -> wasmtime::Result<Result<http::Response, types::HostError>> {
        if let Err(e) = self.check_len("url", &url) {
            return Ok(Err(e));
        }
        let grants = Arc::clone(&self.grants);
        let cap = max_bytes.min(self.env.limits.max_http_bytes);
        Ok(
            match crate::http::get(&self.env.http, &grants.http, &url, cap, self.remaining()) {
                Ok(r) => {
                    self.used.insert(crate::GrantUse::Http { grant: r.grant });
                    Ok(http::Response {
                        status: r.status,
                        headers: r.headers,
                        body: r.body,
                    })
                }
                Err(HttpRefusal::NotGranted(m)) => Err(self.deny("http", m)),
                Err(HttpRefusal::Invalid(m)) => Err(types::HostError::InvalidArgument(m)),
                Err(HttpRefusal::Failed(m)) => Err(types::HostError::Failed(m)),
                Err(HttpRefusal::TooLarge(m)) => Err(types::HostError::TooLarge(m)),
                Err(HttpRefusal::Timeout(m)) => Err(types::HostError::Timeout(m)),
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component of four core instances of one module, each growing its own linear
    /// memory by `pages` 64 KiB pages when it starts.
    fn four_memories(pages: u32) -> Vec<u8> {
        wat::parse_str(format!(
            r#"(component
                 (core module $m
                   (memory 1)
                   (func $grow (drop (memory.grow (i32.const {pages}))))
                   (start $grow))
                 (core instance (instantiate $m))
                 (core instance (instantiate $m))
                 (core instance (instantiate $m))
                 (core instance (instantiate $m)))"#
        ))
        .unwrap()
    }

    fn instantiate(pages: u32, limit: u64) -> wasmtime::Result<()> {
        let root = tempfile::tempdir().unwrap();
        let mut config = crate::HostConfig::new(root.path(), bosun_trust::TrustRoots::new());
        config.limits.max_memory_bytes = limit;
        let host = crate::Host::new(config).unwrap();
        let component =
            wasmtime::component::Component::new(host.engine(), four_memories(pages)).unwrap();
        let mut store = wasmtime::Store::new(host.engine(), RunLimiter::new(limit, 10_000));
        store.limiter(|l| l);
        store.set_epoch_deadline(u64::MAX / 2);
        Linker::<RunLimiter>::new(host.engine())
            .instantiate(&mut store, &component)
            .map(|_| ())
    }

    #[test]
    fn the_memory_limit_is_one_budget_for_all_memories_of_a_call() {
        // The review's bypass: four core instances, each below the limit, together four
        // times over it. 40 MiB each against 64 MiB: the second one is stopped.
        let e = instantiate(640, 64 << 20).unwrap_err();
        match e.downcast_ref::<Stop>() {
            Some(Stop::Memory {
                what: "memory",
                limit,
            }) => assert_eq!(*limit, 64 << 20),
            other => panic!("expected the memory limit, got {other:?}: {e:#}"),
        }
        // The same component within the budget: four times 10 MiB.
        instantiate(160, 64 << 20).unwrap();
    }

    #[test]
    fn the_table_limit_is_one_budget_for_all_tables_of_a_call() {
        let mut l = RunLimiter::new(1 << 20, 100);
        assert!(l.table_growing(0, 60, None).unwrap());
        assert!(l.table_growing(60, 70, None).unwrap());
        assert!(
            l.table_growing(0, 31, None).is_err(),
            "70 + 31 > 100 across two tables"
        );
        assert!(l.table_growing(0, 30, None).unwrap());
    }
}
