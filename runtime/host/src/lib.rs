//! The sandboxed wasmtime host that runs Bosun plugins.
//!
//! A [`Host`] owns one wasmtime engine (component model, pooling allocator, epoch
//! interruption driven by a ticker thread that stops when the host is dropped). It
//! [loads](Host::load) a plugin by verifying its bytes against a pinned digest and a
//! trusted signature **before** compiling anything, compiles once per digest (with an
//! optional on-disk cache that only ever loads code this host compiled), refuses a
//! component that imports anything outside the Bosun ABI and WASI 0.2's
//! cli/clocks/filesystem/random/io, and calls its `describe`.
//!
//! Each [`preflight`](Host::preflight) and [`run`](Host::run) gets a fresh store with
//! memory and table limits, a wall-clock deadline, caps on log and result bytes, and a
//! WASI context with no ambient authority: no environment, no arguments, empty stdin,
//! stdout discarded, stderr captured (capped) for panic messages, and only the granted
//! directories preopened under the host root. Host calls (`exec`, `service`, `http`)
//! check the [`Grants`] first and fail closed with `not-granted`, naming the capability.
//! See `README.md` next to this crate for what a plugin can and cannot do.
//!
//! Every failure is a typed [`Error`]; after any of them the same `Host` keeps working.
//!
//! `Host::call` (about 120 lines) is kept whole on purpose: it is one guest call's life in the
//! order its guarantees depend on (grants validated, a dry run's preopens made read-only and an
//! http import refused without a grant before any store exists; memory, table and resource
//! limits and the epoch deadline set before instantiation; a wait the host cut at the deadline
//! turned into the deadline's trap), and a reviewer checks that order in one place. `describe`
//! (about 100 lines) converts the guest's metadata record field by field.

mod cache;
mod cgroup;
mod compiler;
mod config;
mod confine;
mod error;
mod exec;
mod facts;
mod fs;
mod guarded_fs;
mod http;
pub mod openrc;
mod params;
pub mod reboot;
mod report;
mod sandbox;
mod self_test;
mod service;

#[allow(unsafe_code)]
mod bindings {
    //! Host bindings generated from the same WIT package the guests use.
    wasmtime::component::bindgen!({
        path: "../../sdk/wit",
        world: "bosun-plugin",
        imports: { default: trappable },
    });
}

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bosun_api::grants::Grants;
use bosun_trust::{Digest, PluginSignature, SignatureBundle, Verified};
use wasmtime::component::{Component, ResourceTable};
use wasmtime::{Engine, Store, Trap};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

pub use compiler::{Compiler, compile_stdin_to_stdout};
pub use config::{ExecIsolation, HostConfig, Limits, PoolConfig};
pub use confine::{
    NO_COMMAND_CGROUP, Support as ConfinementSupport, command_cgroup,
    support as confinement_support,
};
pub use error::Error;
pub use facts::{NodeContext, NodeFacts, OsRelease};
pub use http::HttpConfig;
pub use openrc::{OpenRcBackend, ServiceManager};
pub use params::validate_json;
pub use report::{
    ActionInfo, CallFailure, Capabilities, Captured, Check, CheckStatus, Denial, GrantUse,
    LogLevel, LogLine, Metadata, Outcome, PluginError, PreflightReport, Progress, Report,
    RunReport,
};
pub use self_test::{Probe as SelfTestProbe, SelfTest, confinement_self_test};
pub use service::{RecordingBackend, ServiceBackend, ServiceError, SystemctlBackend, UnitStatus};

use bindings::BosunPluginPre;
use bindings::exports::bosun::plugin::plugin as guest;
use sandbox::{CallEnv, RunLimiter, RunState, Stop};
use wasmtime::component::{ComponentExportIndex, Instance, InstancePre};

/// The ABI version (WIT package version of `bosun:plugin`) this host serves.
pub const ABI_VERSION: &str = "0.2.0";

/// What [`Error::ForbiddenImport`] says a plugin may import.
const ALLOWED_IMPORTS: &str = "WASI 0.2 cli (environment, exit, stdin, stdout, stderr, terminal-*), clocks, \
     filesystem, random and io, and the bosun:plugin@0.2.0 interfaces (log, exec, service, facts, http)";

const WASI_ALLOWED: &[&str] = &[
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
];

const BOSUN_INTERFACES: &[&str] = &["types", "log", "exec", "service", "facts", "http"];

/// What a plugin was pinned and signed as: the `Plugin` resource's `spec.sha256` and
/// `spec.signatures`, or a signature bundle next to the file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PluginPin {
    pub name: String,
    pub version: String,
    pub sha256: Digest,
    pub signatures: Vec<PluginSignature>,
}

impl From<&SignatureBundle> for PluginPin {
    fn from(b: &SignatureBundle) -> Self {
        PluginPin {
            name: b.name.clone(),
            version: b.version.clone(),
            sha256: b.sha256,
            signatures: b.signatures.clone(),
        }
    }
}

/// How the caller wants an action run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// Passed to the plugin (it must not change the node) and enforced by the host: every
    /// filesystem grant is read-only, only commands whose exec grant says `dryRun: true`
    /// run, and no service action but `status` is allowed. A refused call fails with
    /// `not-granted` and a [`Denial`] whose message starts with `dry run:`.
    pub dry_run: bool,
    /// Passed to the plugin as `run-context.resumed`: the previous attempt of this step on
    /// this node started the plugin and ended with no result recorded (the agent was
    /// killed or restarted during it). The host only passes it on; the agent decides it
    /// (see the WIT doc comment for the exact meaning).
    pub resumed: bool,
    /// Wall clock for this run; [`Limits::default_deadline`] when `None`.
    pub deadline: Option<Duration>,
}

/// A compiled plugin: the component and what it needs to be instantiated.
struct Compiled {
    pre: InstancePre<RunState>,
    /// Set when the component imports `bosun:plugin/http` (then it is linked only for
    /// runs that have http grants).
    pre_http: Option<InstancePre<RunState>>,
    /// Where `describe`, `preflight` and `run` are among the component's exports.
    exports: Exports,
    /// `describe`'s answer, asked once per digest (the ABI requires it to be cheap and
    /// side-effect free, so the same bytes give the same answer).
    metadata: std::sync::OnceLock<Arc<Metadata>>,
    /// The actions' params schemas, compiled with the metadata.
    params: std::sync::OnceLock<Arc<params::ParamSchemas>>,
}

/// The plugin interface's functions, located once per compiled plugin. A call looks up
/// and type-checks only the one function it calls in the fresh instance; the bindings'
/// `BosunPlugin::new` would do that for all three on every instantiation.
struct Exports {
    describe: ComponentExportIndex,
    preflight: ComponentExportIndex,
    run: ComponentExportIndex,
}

impl Exports {
    fn locate(component: &Component) -> Result<Exports, Error> {
        let iface = format!("bosun:plugin/plugin@{ABI_VERSION}");
        let find = |name: &str| {
            component
                .get_export_index(None, &iface)
                .and_then(|i| component.get_export_index(Some(&i), name))
                .ok_or_else(|| Error::AbiMismatch {
                    expected: ABI_VERSION,
                    found: format!("a component without {iface}#{name}"),
                })
        };
        Ok(Exports {
            describe: find("describe")?,
            preflight: find("preflight")?,
            run: find("run")?,
        })
    }
}

/// Calls the export at `index` of the fresh `instance` with `params`.
fn call_export<P, R>(
    store: &mut Store<RunState>,
    instance: &Instance,
    index: &ComponentExportIndex,
    params: P,
) -> wasmtime::Result<R>
where
    P: wasmtime::component::ComponentNamedList + wasmtime::component::Lower,
    R: wasmtime::component::ComponentNamedList + wasmtime::component::Lift,
{
    let f = instance.get_typed_func::<P, R>(&mut *store, index)?;
    f.call(&mut *store, params)
}

/// A verified, compiled and described plugin, ready to run. Cheap to clone.
#[derive(Clone)]
pub struct LoadedPlugin {
    compiled: Arc<Compiled>,
    digest: Digest,
    // Shared, so that handing out another `LoadedPlugin` (e.g. `Host::loaded` before every
    // run) copies two pointers, not every action's description and schema.
    metadata: Arc<Metadata>,
    verified: Option<Arc<Verified>>,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("digest", &self.digest)
            .field("metadata", &self.metadata)
            .field("verified", &self.verified)
            .finish_non_exhaustive()
    }
}

impl LoadedPlugin {
    /// What the plugin declared in `describe`.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }
    /// The sha256 of the bytes that were loaded.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }
    /// Which trust root vouched for it; `None` for [`Host::load_unverified`].
    pub fn verified(&self) -> Option<&Verified> {
        self.verified.as_deref()
    }
    /// Whether the component imports the optional `http` interface.
    pub fn imports_http(&self) -> bool {
        self.compiled.pre_http.is_some()
    }
}

/// Advances the engine's epoch every tick while at least one call runs, and sleeps
/// otherwise: an idle host (an agent waiting for work) costs no wake-ups. Deadlines are
/// counted in ticks from a call's start, and the ticker runs for the whole call.
struct Ticker {
    state: Arc<TickState>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct TickState {
    /// (calls running, stop requested).
    active: Mutex<(usize, bool)>,
    wake: std::sync::Condvar,
}

/// Keeps the ticker running while alive (one per call).
struct Ticking<'a>(&'a TickState);

impl Drop for Ticking<'_> {
    fn drop(&mut self) {
        let mut a = self
            .0
            .active
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        a.0 = a.0.saturating_sub(1);
    }
}

impl Ticker {
    fn start(engine: Engine, tick: Duration) -> Result<Ticker, Error> {
        let state = Arc::new(TickState::default());
        let shared = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name("bosun-host-epoch".into())
            .spawn(move || {
                loop {
                    {
                        let mut a = shared
                            .active
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        while a.0 == 0 && !a.1 {
                            a = shared
                                .wake
                                .wait(a)
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                        }
                        if a.1 {
                            return;
                        }
                    }
                    std::thread::sleep(tick);
                    engine.increment_epoch();
                }
            })
            .map_err(|e| Error::setup(format!("starting the epoch ticker: {e}")))?;
        Ok(Ticker {
            state,
            thread: Some(thread),
        })
    }

    /// Runs the ticker until the returned guard drops.
    fn busy(&self) -> Ticking<'_> {
        let mut a = self
            .state
            .active
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        a.0 += 1;
        self.state.wake.notify_one();
        Ticking(&self.state)
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        if let Ok(mut a) = self.state.active.lock() {
            a.1 = true;
        }
        self.state.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The plugin host. `Send + Sync`: share it (in an `Arc`) between the threads that run
/// plugins; at most [`PoolConfig::max_instances`] runs are alive at once.
pub struct Host {
    engine: Engine,
    config: HostConfig,
    linker: wasmtime::component::Linker<RunState>,
    linker_http: wasmtime::component::Linker<RunState>,
    cache: Option<Arc<cache::DiskCache>>,
    /// Shared with this host's [siblings](Host::sibling): compiled code does not depend on
    /// the host root.
    compiled: Arc<Mutex<HashMap<Digest, Arc<Compiled>>>>,
    /// Held while compiling: loads of one plugin at the same moment (many tasks, or many
    /// siblings) compile it once; the compile itself uses every core.
    compiling: Arc<Mutex<()>>,
    /// Plugins [`Host::load`] verified, by the exact pin they were verified against.
    verified: Arc<Mutex<HashMap<PluginPin, LoadedPlugin>>>,
    /// The kubeadm version fact, by the identity of the files it was read from.
    facts_cache: Arc<facts::FactsCache>,
    /// The `http` import's TLS configuration, built once from [`HostConfig::http`].
    http: Arc<http::Client>,
    _ticker: Arc<Ticker>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Host {
    /// Creates the engine, the linkers, the cache directory and the epoch ticker.
    pub fn new(config: HostConfig) -> Result<Host, Error> {
        if !config.host_root.is_dir() {
            return Err(Error::setup(format!(
                "host root {} is not a directory; point host_root at the node's root file system",
                config.host_root.display()
            )));
        }
        // Where granted commands get a cgroup each, found once per process (the report of
        // the node's confinement says what it found).
        let _ = cgroup::cgroups(&config.host_root);
        let http = Arc::new(http::Client::new(&config.http).map_err(Error::setup)?);
        let mut pool = wasmtime::PoolingAllocationConfig::default();
        let n = config.pool.max_instances.max(1);
        let per = config.pool.max_core_instances_per_plugin.max(1);
        pool.total_component_instances(n)
            .total_core_instances(n * per)
            .total_memories(n * 4)
            .total_tables(n * per)
            .max_core_instances_per_component(per)
            .max_memories_per_component(4)
            .max_tables_per_component(per)
            .max_memory_size(usize::try_from(config.limits.max_memory_bytes).unwrap_or(usize::MAX))
            .table_elements(usize::try_from(config.limits.max_table_elements).unwrap_or(usize::MAX))
            .linear_memory_keep_resident(config.pool.keep_resident_bytes)
            .table_keep_resident(config.pool.keep_resident_bytes.min(64 << 10))
            .pagemap_scan(wasmtime::Enabled::Auto);
        // What plugins are compiled for, plus the instance pool (compiled code does not
        // depend on how instances are allocated).
        let mut wcfg = compiler::engine_config();
        wcfg.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
        let engine =
            Engine::new(&wcfg).map_err(|e| Error::setup(format!("wasmtime engine: {e}")))?;
        let linker =
            sandbox::linker(&engine, false).map_err(|e| Error::setup(format!("linker: {e}")))?;
        let linker_http =
            sandbox::linker(&engine, true).map_err(|e| Error::setup(format!("linker: {e}")))?;
        let cache = match &config.cache_dir {
            Some(dir) => Some(Arc::new(
                cache::DiskCache::open(dir, cache::engine_fingerprint(&engine)).map_err(|e| {
                    Error::setup(format!("compiled-plugin cache {}: {e}", dir.display()))
                })?,
            )),
            None => None,
        };
        let ticker = Ticker::start(
            engine.clone(),
            config.epoch_tick.max(Duration::from_micros(100)),
        )?;
        Ok(Host {
            engine,
            config,
            linker,
            linker_http,
            cache,
            compiled: Arc::default(),
            compiling: Arc::default(),
            verified: Arc::default(),
            facts_cache: Arc::new(facts::FactsCache::default()),
            http,
            _ticker: Arc::new(ticker),
        })
    }

    /// A host for another node's root that shares this one's engine (its pooling
    /// allocator and epoch ticker), linkers, compiled and verified plugins and compiled
    /// cache: for one process that hosts many agents (the fleet harness of benchmarks and
    /// tests). Only the host root and the service backend are its own; the limits, pool
    /// and trust roots are this host's. The pool is shared too: at most
    /// [`PoolConfig::max_instances`] runs are alive at once across all siblings.
    pub fn sibling(
        &self,
        host_root: &Path,
        service_backend: Arc<dyn ServiceBackend>,
    ) -> Result<Host, Error> {
        if !host_root.is_dir() {
            return Err(Error::setup(format!(
                "host root {} is not a directory; point host_root at the node's root file system",
                host_root.display()
            )));
        }
        let mut config = self.config.clone();
        config.host_root = host_root.to_path_buf();
        config.service_backend = service_backend;
        Ok(Host {
            engine: self.engine.clone(),
            config,
            linker: self.linker.clone(),
            linker_http: self.linker_http.clone(),
            cache: self.cache.clone(),
            compiled: Arc::clone(&self.compiled),
            compiling: Arc::clone(&self.compiling),
            verified: Arc::clone(&self.verified),
            // Facts are read from the host root: each root has its own.
            facts_cache: Arc::new(facts::FactsCache::default()),
            http: Arc::clone(&self.http),
            _ticker: Arc::clone(&self._ticker),
        })
    }

    /// The configuration this host was created with.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// The wasmtime engine plugins run on (its pooling allocator, epoch interruption and
    /// component-model settings). For embedders and benchmarks that compare against
    /// plain wasmtime on the same configuration; runs always go through [`Host::run`].
    #[must_use]
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Verifies, compiles (or takes from the cache), checks and describes a plugin.
    ///
    /// Order: the bytes are hashed and must equal `pin.sha256`, and a signature over
    /// (name, version, digest) must verify against the trust roots — before any
    /// compilation. Then the component's imports and exports are checked against the
    /// ABI, and `describe` must report this ABI version and the signed name and version.
    /// The bytes are re-hashed on every call, even when the compiled code is cached.
    pub fn load(&self, bytes: &[u8], pin: &PluginPin) -> Result<LoadedPlugin, Error> {
        let verified = bosun_trust::verify(
            bytes,
            &pin.sha256,
            &pin.name,
            &pin.version,
            &pin.signatures,
            &self.config.trust_roots,
        )
        .map_err(|source| Error::Untrusted {
            name: pin.name.clone(),
            version: pin.version.clone(),
            source: Box::new(source),
        })?;
        let compiled = self.compile(&pin.sha256, bytes)?;
        let metadata = self.metadata(&compiled)?;
        for (field, signed, declared) in [
            ("name", &pin.name, &metadata.name),
            ("version", &pin.version, &metadata.version),
        ] {
            if signed != declared {
                return Err(Error::MetadataMismatch {
                    field,
                    signed: signed.clone(),
                    declared: declared.clone(),
                });
            }
        }
        let loaded = LoadedPlugin {
            compiled,
            digest: pin.sha256,
            metadata,
            verified: Some(Arc::new(verified)),
        };
        if let Ok(mut m) = self.verified.lock() {
            m.insert(pin.clone(), loaded.clone());
        }
        Ok(loaded)
    }

    /// The plugin an earlier [`load`](Host::load) verified against exactly this pin (same
    /// name, version, digest and signatures), while it is still in memory; `None`
    /// otherwise, and then the caller must `load` the bytes.
    ///
    /// No bytes are read, so nothing is hashed: the code in memory is the code that was
    /// compiled from the bytes `load` hashed and whose signature it checked against this
    /// host's trust roots (which never change for the life of a `Host`). Bytes read again
    /// from a store must go through `load`, which re-hashes them. A pin that differs in
    /// any field (a new signature, another version) is a miss.
    pub fn loaded(&self, pin: &PluginPin) -> Option<LoadedPlugin> {
        self.verified.lock().ok().and_then(|m| m.get(pin).cloned())
    }

    /// Loads a plugin WITHOUT verifying any signature. Refused with
    /// [`Error::UnverifiedRefused`] unless the host was created with
    /// [`HostConfig::allow_unverified`]; meant for a plugin author's local loop only.
    /// Everything else (ABI checks, sandbox, grants) is the same.
    pub fn load_unverified(&self, bytes: &[u8]) -> Result<LoadedPlugin, Error> {
        if !self.config.allow_unverified {
            return Err(Error::UnverifiedRefused);
        }
        let digest = Digest::of(bytes);
        tracing::warn!(%digest, "loading a plugin WITHOUT signature verification (allow_unverified is set)");
        let compiled = self.compile(&digest, bytes)?;
        let metadata = self.metadata(&compiled)?;
        Ok(LoadedPlugin {
            compiled,
            digest,
            metadata,
            verified: None,
        })
    }

    /// Drops the compiled plugin with `digest` from memory (the on-disk cache keeps it).
    /// Plugins already loaded keep working; the next [`load`](Host::load) of these
    /// bytes verifies again and takes the code from the disk cache or recompiles.
    pub fn evict(&self, digest: &Digest) {
        if let Ok(mut m) = self.compiled.lock() {
            m.remove(digest);
        }
        if let Ok(mut m) = self.verified.lock() {
            m.retain(|pin, _| pin.sha256 != *digest);
        }
    }

    /// Gives back the memory a step leaves behind, for a process that runs plugins rarely
    /// (an agent runs a step a few times a year): drops every compiled and verified plugin
    /// from memory, then asks the C allocator to return its free pages to the kernel
    /// (glibc keeps freed heap, cranelift's among it, otherwise).
    ///
    /// Only with a [disk cache](HostConfig::cache_dir): the next [`load`](Host::load)
    /// verifies the bytes again (as it always does), maps the code from the cache and asks
    /// `describe` again, a few milliseconds (docs/benchmarks.md, "The agent after a step").
    /// Without one, reloading would mean compiling again, so nothing is dropped. Plugins
    /// already handed out keep working. Returns how many compiled plugins were dropped.
    pub fn release_memory(&self) -> usize {
        if self.cache.is_none() {
            return 0;
        }
        let dropped = match self.compiled.lock() {
            Ok(mut m) => std::mem::take(&mut *m).len(),
            Err(_) => 0,
        };
        if let Ok(mut m) = self.verified.lock() {
            m.clear();
        }
        trim_allocator();
        dropped
    }

    fn metadata(&self, compiled: &Arc<Compiled>) -> Result<Arc<Metadata>, Error> {
        if let Some(m) = compiled.metadata.get() {
            return Ok(Arc::clone(m));
        }
        let m = self.describe(compiled)?;
        let schemas = params::ParamSchemas::compile(&m.actions)
            .map_err(|(action, message)| Error::InvalidParamsSchema { action, message })?;
        let _ = compiled.params.set(Arc::new(schemas));
        Ok(Arc::clone(compiled.metadata.get_or_init(|| Arc::new(m))))
    }

    fn compile(&self, digest: &Digest, bytes: &[u8]) -> Result<Arc<Compiled>, Error> {
        let known = || {
            self.compiled
                .lock()
                .ok()
                .and_then(|m| m.get(digest).cloned())
        };
        if let Some(c) = known() {
            return Ok(c);
        }
        let _compiling = self
            .compiling
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Another load may have compiled it while this one waited.
        if let Some(c) = known() {
            return Ok(c);
        }
        let hex = digest.to_hex();
        let from_cache = self.cache.as_ref().and_then(|c| {
            let code = c.get(&hex)?;
            match deserialize_own(&self.engine, &code) {
                Ok(component) => Some(component),
                Err(e) => {
                    tracing::warn!(error = %e, "cached compiled plugin did not load; recompiling");
                    c.remove(&hex);
                    None
                }
            }
        });
        let component = match from_cache {
            Some(c) => c,
            None => {
                // Never by this host's engine (see `compiler`).
                let code = compiler::compile(&self.config.compiler, bytes)?;
                if let Some(cache) = &self.cache
                    && let Err(e) = cache.put(&hex, &code)
                {
                    tracing::warn!(error = %e, "could not write the compiled-plugin cache");
                }
                deserialize_compiled(&self.engine, &code).map_err(|e| Error::Compile {
                    message: format!("loading the plugin's compiled code: {e:#}"),
                })?
            }
        };
        let imports_http = check_interfaces(&self.engine, &component)?;
        // `BosunPluginPre::new` type-checks the plugin's exports against the WIT once.
        let link = |linker: &wasmtime::component::Linker<RunState>| {
            linker
                .instantiate_pre(&component)
                .and_then(BosunPluginPre::new)
                .map(|p| p.instance_pre().clone())
                .map_err(|e| Error::Compile {
                    message: format!("cannot link the plugin's imports: {e:#}"),
                })
        };
        let compiled = Arc::new(Compiled {
            pre: if imports_http {
                link(&self.linker_http)?
            } else {
                link(&self.linker)?
            },
            pre_http: if imports_http {
                Some(link(&self.linker_http)?)
            } else {
                None
            },
            exports: Exports::locate(&component)?,
            metadata: std::sync::OnceLock::new(),
            params: std::sync::OnceLock::new(),
        });
        if let Ok(mut m) = self.compiled.lock() {
            m.insert(*digest, Arc::clone(&compiled));
        }
        Ok(compiled)
    }

    fn describe(&self, compiled: &Arc<Compiled>) -> Result<Metadata, Error> {
        let node = NodeContext::default();
        let limits = &self.config.limits;
        let (meta, _) = self
            .call(
                compiled,
                &Grants::default(),
                &node,
                limits.describe_deadline,
                true,
                false,
                |store, instance| {
                    call_export::<(), (guest::Metadata,)>(
                        store,
                        instance,
                        &compiled.exports.describe,
                        (),
                    )
                    .map(|(m,)| m)
                },
            )
            .map_err(|f| f.error)?;
        let size = meta.name.len()
            + meta.version.len()
            + meta.abi_version.len()
            + meta.description.len()
            + meta
                .actions
                .iter()
                .map(|a| {
                    ENTRY_OVERHEAD + a.name.len() + a.description.len() + a.params_schema.len()
                })
                .sum::<usize>()
            + meta
                .capabilities
                .filesystem
                .iter()
                .map(|p| ENTRY_OVERHEAD + p.path.len())
                .sum::<usize>()
            + meta
                .capabilities
                .exec
                .iter()
                .map(|c| {
                    ENTRY_OVERHEAD
                        + c.command.len()
                        + c.args
                            .iter()
                            .map(|a| ENTRY_OVERHEAD + a.len())
                            .sum::<usize>()
                })
                .sum::<usize>()
            + meta
                .capabilities
                .services
                .iter()
                .map(|u| ENTRY_OVERHEAD + u.unit.len() + ENTRY_OVERHEAD * u.actions.len())
                .sum::<usize>()
            + meta
                .capabilities
                .http
                .iter()
                .map(|h| ENTRY_OVERHEAD + h.len())
                .sum::<usize>();
        check_output_size(size, limits.max_output_bytes)?;
        if meta.abi_version != ABI_VERSION {
            return Err(Error::AbiMismatch {
                expected: ABI_VERSION,
                found: format!("bosun:plugin@{}", meta.abi_version),
            });
        }
        let caps = meta.capabilities;
        Ok(Metadata {
            name: meta.name,
            version: meta.version,
            abi_version: meta.abi_version,
            description: meta.description,
            actions: meta
                .actions
                .into_iter()
                .map(|a| ActionInfo {
                    name: a.name,
                    description: a.description,
                    params_schema: a.params_schema,
                    idempotent: a.idempotent,
                })
                .collect(),
            capabilities: Capabilities {
                filesystem: caps
                    .filesystem
                    .into_iter()
                    .map(|p| (p.path, p.writable))
                    .collect(),
                exec: caps.exec.into_iter().map(|c| (c.command, c.args)).collect(),
                services: caps
                    .services
                    .into_iter()
                    .map(|u| (u.unit, u.actions))
                    .collect(),
                http: caps.http,
            },
        })
    }

    /// Runs the plugin's `preflight` for `action` with `params_json`. Must not change
    /// the node (the plugin's contract); the same grants apply as for `run`.
    pub fn preflight(
        &self,
        plugin: &LoadedPlugin,
        grants: &Grants,
        node: &NodeContext,
        action: &str,
        params_json: &str,
    ) -> Result<PreflightReport, CallFailure> {
        self.preflight_with(plugin, grants, node, action, params_json, false)
    }

    /// [`preflight`](Host::preflight) before a run with [`RunOptions::dry_run`]: with
    /// `dry_run` the host enforces the same dry-run restrictions as for that run.
    pub fn preflight_with(
        &self,
        plugin: &LoadedPlugin,
        grants: &Grants,
        node: &NodeContext,
        action: &str,
        params_json: &str,
        dry_run: bool,
    ) -> Result<PreflightReport, CallFailure> {
        self.check_call(plugin, action, params_json)?;
        let deadline = self.config.limits.describe_deadline;
        let exports = &plugin.compiled.exports;
        let (result, captured) = self.call(
            &plugin.compiled,
            grants,
            node,
            deadline,
            false,
            dry_run,
            |store, instance| {
                call_export::<(&str, &str), (Result<Vec<guest::Check>, guest::PluginError>,)>(
                    store,
                    instance,
                    &exports.preflight,
                    (action, params_json),
                )
                .map(|(r,)| r)
            },
        )?;
        let result = match result {
            Ok(checks) => {
                let size: usize = checks
                    .iter()
                    .map(|c| ENTRY_OVERHEAD + c.name.len() + c.message.len())
                    .sum();
                check_output_size(size, self.config.limits.max_output_bytes).map_err(|error| {
                    CallFailure {
                        error,
                        captured: Box::new(captured.clone()),
                    }
                })?;
                Ok(checks
                    .into_iter()
                    .map(|c| Check {
                        name: c.name,
                        status: match c.status {
                            guest::CheckStatus::Pass => CheckStatus::Pass,
                            guest::CheckStatus::Warn => CheckStatus::Warn,
                            guest::CheckStatus::Fail => CheckStatus::Fail,
                        },
                        message: c.message,
                    })
                    .collect())
            }
            Err(e) => Err(self.plugin_error(e, &captured)?),
        };
        Ok(Report { result, captured })
    }

    /// Runs `action` with `params_json` under `grants`. Returns the plugin's outcome or
    /// its own error with everything captured, or a [`CallFailure`] when the host
    /// refused or stopped the call.
    pub fn run(
        &self,
        plugin: &LoadedPlugin,
        grants: &Grants,
        node: &NodeContext,
        action: &str,
        params_json: &str,
        options: RunOptions,
    ) -> Result<RunReport, CallFailure> {
        self.check_call(plugin, action, params_json)?;
        let deadline = options
            .deadline
            .unwrap_or(self.config.limits.default_deadline);
        let ctx = guest::RunContext {
            dry_run: options.dry_run,
            resumed: options.resumed,
        };
        let exports = &plugin.compiled.exports;
        let (result, captured) = self.call(
            &plugin.compiled,
            grants,
            node,
            deadline,
            false,
            options.dry_run,
            |store, instance| {
                call_export::<
                    (&str, &str, guest::RunContext),
                    (Result<guest::Outcome, guest::PluginError>,),
                >(store, instance, &exports.run, (action, params_json, ctx))
                .map(|(r,)| r)
            },
        )?;
        let result = match result {
            Ok(o) => {
                let size = o.message.len()
                    + o.outputs
                        .iter()
                        .map(|(k, v)| ENTRY_OVERHEAD + k.len() + v.len())
                        .sum::<usize>();
                check_output_size(size, self.config.limits.max_output_bytes).map_err(|error| {
                    CallFailure {
                        error,
                        captured: Box::new(captured.clone()),
                    }
                })?;
                Ok(Outcome {
                    changed: o.changed && !options.dry_run,
                    message: o.message,
                    outputs: o.outputs,
                })
            }
            Err(e) => Err(self.plugin_error(e, &captured)?),
        };
        Ok(Report { result, captured })
    }

    fn plugin_error(
        &self,
        e: guest::PluginError,
        captured: &Captured,
    ) -> Result<PluginError, CallFailure> {
        check_output_size(
            e.code.len() + e.message.len(),
            self.config.limits.max_output_bytes,
        )
        .map_err(|error| CallFailure {
            error,
            captured: Box::new(captured.clone()),
        })?;
        Ok(PluginError {
            code: e.code,
            message: e.message,
            retryable: e.retryable,
        })
    }

    fn check_call(
        &self,
        plugin: &LoadedPlugin,
        action: &str,
        params_json: &str,
    ) -> Result<(), CallFailure> {
        if !plugin.metadata.actions.iter().any(|a| a.name == action) {
            let available: Vec<&str> = plugin
                .metadata
                .actions
                .iter()
                .map(|a| a.name.as_str())
                .collect();
            return Err(Error::UnknownAction {
                action: action.to_owned(),
                available: available.join(", "),
            }
            .into());
        }
        let max = self.config.limits.max_params_bytes;
        if params_json.len() > max {
            return Err(Error::InvalidParams {
                message: format!("{} bytes, more than the limit of {max}", params_json.len()),
            }
            .into());
        }
        let params: serde_json::Value =
            serde_json::from_str(params_json).map_err(|e| Error::InvalidParams {
                message: format!("not a JSON document: {e}"),
            })?;
        if let Some(schemas) = plugin.compiled.params.get() {
            schemas.check(action, &params).map_err(|problems| Error::InvalidParams {
                message: format!(
                    "params of `{action}` do not match the schema the plugin declares for them: {problems} \
                     (`kubectl-bosun plugin inspect` prints the schema)"
                ),
            })?;
        }
        Ok(())
    }

    /// One call in a fresh store: resolve grants, build the WASI context, instantiate,
    /// run `f`, and turn traps into typed errors.
    // One flag more than clippy's limit: describe/preflight/run differ in exactly these.
    #[allow(clippy::too_many_arguments)]
    fn call<R>(
        &self,
        compiled: &Compiled,
        grants: &Grants,
        node: &NodeContext,
        deadline: Duration,
        describing: bool,
        dry_run: bool,
        f: impl FnOnce(&mut Store<RunState>, &Instance) -> wasmtime::Result<R>,
    ) -> Result<(R, Captured), CallFailure> {
        let _ticking = self._ticker.busy();
        let limits = &self.config.limits;
        let mut preopens = fs::resolve(&self.config.host_root, &grants.filesystem)?;
        if dry_run {
            // Enforced here, not trusted to the plugin: a dry run cannot write a byte.
            for p in &mut preopens {
                p.perms = wasmtime_wasi::FsPerms::ReadOnly;
            }
        }
        for g in &grants.exec {
            exec::validate_grant(g).map_err(|reason| Error::InvalidGrant {
                grant: format!("exec {}", g.command),
                reason,
            })?;
        }
        service::validate_grants(&grants.services)?;
        let pre = match (&compiled.pre_http, grants.http.is_empty()) {
            (Some(_), true) if !describing => {
                return Err(Error::NotGranted {
                    capability: "http (the plugin imports bosun:plugin/http but has no http grant)"
                        .into(),
                }
                .into());
            }
            (Some(p), false) => p,
            _ => &compiled.pre,
        };

        let stderr = MemoryOutputPipe::new(limits.max_stderr_bytes);
        let mut wasi = WasiCtxBuilder::new();
        wasi.allow_blocking_current_thread(true)
            .stderr(stderr.clone());
        for p in &preopens {
            wasi.preopened_dir(&p.host, &p.guest, p.perms)
                .map_err(|e| Error::InvalidGrant {
                    grant: format!("filesystem {}", p.guest),
                    reason: format!("{e:#}"),
                })?;
        }
        let env = Arc::new(CallEnv {
            root: self.config.host_root.clone(),
            isolation: self.config.exec_isolation,
            service: Arc::clone(&self.config.service_backend),
            node: node.clone(),
            limits: limits.clone(),
            facts_cache: Arc::clone(&self.facts_cache),
            http: Arc::clone(&self.http),
            describing,
        });
        let started = Instant::now();
        let state = RunState {
            wasi: wasi.build(),
            table: {
                // Each entry may hold a host file descriptor (an opened file of a grant) or
                // host memory the store's limiter does not see; wasmtime's default allows a
                // million.
                let mut table = ResourceTable::new();
                table.set_max_capacity(limits.max_resources);
                table
            },
            limiter: RunLimiter::new(limits.max_memory_bytes, limits.max_table_elements),
            grants: Arc::new(grants.clone()),
            dry_run,
            env,
            deadline: started + deadline,
            clock_cut: false,
            log_bytes: 0,
            lines: Vec::new(),
            progress: None,
            denied: Vec::new(),
            facts: None,
            host_time: Duration::ZERO,
            used: std::collections::BTreeSet::new(),
            descriptors: std::collections::HashMap::new(),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        let tick = self.config.epoch_tick.max(Duration::from_micros(100));
        let ticks = u64::try_from(deadline.as_nanos() / tick.as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        store.set_epoch_deadline(ticks);
        store.epoch_deadline_trap();

        let result = pre
            .instantiate(&mut store)
            .map_err(|e| (true, e))
            .and_then(|instance| f(&mut store, &instance).map_err(|e| (false, e)));
        let state = store.into_data();
        // Woken from a wait the host cut at the deadline and back past it: the deadline
        // decided the end, whatever the guest did in the moment before the epoch caught up.
        let result = match result {
            Ok(_) if state.clock_cut && Instant::now() >= state.deadline => {
                Err((false, wasmtime::Error::new(Trap::Interrupt)))
            }
            other => other,
        };
        let captured = Captured {
            lines: state.lines,
            progress: state.progress,
            denied: state.denied,
            stderr: String::from_utf8_lossy(&stderr.contents()).into_owned(),
            host_time: state.host_time,
            used: state.used,
            memory_bytes: state.limiter.memory_used,
        };
        match result {
            Ok(r) => Ok((r, captured)),
            Err((instantiating, e)) => {
                let error = classify(e, instantiating, deadline, &captured.stderr);
                Err(CallFailure {
                    error,
                    captured: Box::new(captured),
                })
            }
        }
    }
}

/// Turns a wasmtime error from a call into the host's typed error.
fn classify(e: wasmtime::Error, instantiating: bool, deadline: Duration, stderr: &str) -> Error {
    if let Some(stop) = e.downcast_ref::<Stop>() {
        return match *stop {
            Stop::Memory { what, limit } => Error::MemoryLimit { what, limit },
            Stop::Log { limit } => Error::LogLimit { limit },
        };
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => Error::DeadlineExceeded { deadline },
        Some(trap) => Error::GuestTrap {
            message: trap.to_string(),
            stderr: stderr.to_owned(),
        },
        None if instantiating => Error::Instantiate {
            message: format!("{e:#}"),
        },
        None => {
            let mut message = format!("{e:#}");
            sandbox::truncate_utf8(&mut message, 4096);
            Error::GuestTrap {
                message,
                stderr: stderr.to_owned(),
            }
        }
    }
}

/// What each entry of a result (an output, a check, an action, a capability) counts
/// against `max_output_bytes` besides its text, so that a million empty entries are
/// refused like a million bytes.
const ENTRY_OVERHEAD: usize = 32;

fn check_output_size(size: usize, limit: u64) -> Result<(), Error> {
    if size as u64 > limit {
        return Err(Error::OutputLimit {
            limit,
            found: size as u64,
        });
    }
    Ok(())
}

/// Checks the component's exports and imports against the ABI. Returns whether it
/// imports the optional `http` interface.
fn check_interfaces(engine: &Engine, component: &Component) -> Result<bool, Error> {
    let ty = component.component_type();
    let export = ty.exports(engine).find_map(|(name, _)| {
        name.strip_prefix("bosun:plugin/plugin")
            .map(|v| v.trim_start_matches('@').to_owned())
    });
    match export {
        Some(v) if v == ABI_VERSION => {}
        Some(v) => {
            return Err(Error::AbiMismatch {
                expected: ABI_VERSION,
                found: format!("bosun:plugin@{v}"),
            });
        }
        None => {
            return Err(Error::AbiMismatch {
                expected: ABI_VERSION,
                found: "a component that does not export bosun:plugin/plugin".into(),
            });
        }
    }
    let mut imports_http = false;
    for (name, _) in ty.imports(engine) {
        let (iface, version) = name.split_once('@').unwrap_or((name, ""));
        if let Some(bosun) = iface.strip_prefix("bosun:plugin/") {
            if version != ABI_VERSION {
                return Err(Error::AbiMismatch {
                    expected: ABI_VERSION,
                    found: format!("bosun:plugin@{version} (import {name})"),
                });
            }
            if !BOSUN_INTERFACES.contains(&bosun) {
                return Err(Error::ForbiddenImport {
                    import: name.to_owned(),
                    allowed: ALLOWED_IMPORTS,
                });
            }
            imports_http |= bosun == "http";
        } else if !(WASI_ALLOWED.contains(&iface) && version.starts_with("0.2.")) {
            return Err(Error::ForbiddenImport {
                import: name.to_owned(),
                allowed: ALLOWED_IMPORTS,
            });
        }
    }
    Ok(imports_http)
}

/// Returns the C allocator's free pages to the kernel: glibc keeps what a compile or a
/// run freed in its arenas (one per thread that allocated) until asked. Other C libraries
/// (musl's allocator unmaps freed memory by itself) need nothing.
#[allow(unsafe_code)]
fn trim_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers and only walks the allocator's own state under
    // its locks; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Loads the code this host's compile engine produced a moment ago.
#[allow(unsafe_code)]
fn deserialize_compiled(engine: &Engine, code: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: `code` is what `Engine::precompile_component` on an engine of
    // `compiler::engine_config` returned just now, in this process or in the compile
    // subprocess the host's configuration names (the agent names its own binary), read
    // from a pipe only that child held. wasmtime checks its header against `engine`
    // (version, compiler settings, tunables) and refuses a mismatch.
    unsafe { Component::deserialize(engine, code) }
}

/// Loads compiled code from this host's own cache.
#[allow(unsafe_code)]
fn deserialize_own(engine: &Engine, code: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: `code` comes from `DiskCache::get`, which returns only bytes whose
    // HMAC-SHA256 verifies under the key this host generated and keeps in the cache
    // directory (mode 0600), i.e. bytes `Component::serialize` of an engine with the same
    // compatibility fingerprint wrote. wasmtime additionally checks the version and
    // configuration recorded in the artifact header.
    unsafe { Component::deserialize(engine, code) }
}

/// Entry points for the host benchmark only (feature `bench-internals`, off in every build
/// that ships): not part of the API.
#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod bench_internals {
    use std::path::Path;
    use std::time::Duration;

    use bosun_api::grants::{ExecGrant, FilesystemGrant};

    /// Runs a granted command (without arguments) under `/` through the host's runner,
    /// with the kernel boundary of `grant` (and the plugin's `filesystem` grants) when
    /// `confined`, and with the same runner (keeper, capabilities, pipes) but no Landlock
    /// ruleset, seccomp filter or descriptor closing when not.
    pub fn run_granted(filesystem: &[FilesystemGrant], grant: &ExecGrant, confined: bool) {
        let sandbox = crate::confine::Sandbox::for_command(filesystem, grant, false);
        let spec = crate::exec::CommandSpec {
            root: Path::new("/"),
            isolation: crate::ExecIsolation::Chroot,
            command: &grant.command,
            args: &[],
            stdin: None,
            timeout: Duration::from_secs(10),
            max_output: 4096,
            sandbox: &sandbox,
        };
        let prepared = (!confined).then(crate::confine::Prepared::nothing);
        let out = crate::exec::run_confined(spec, prepared).expect("the command runs");
        assert_eq!(out.exit_code, 0);
    }

    /// Builds the Landlock ruleset and the seccomp program of `grant` without running
    /// anything: the part of the boundary's cost paid in the agent, before the fork.
    pub fn prepare(filesystem: &[FilesystemGrant], grant: &ExecGrant) {
        let sandbox = crate::confine::Sandbox::for_command(filesystem, grant, false);
        crate::confine::prepare(Path::new("/"), Path::new("/"), &sandbox).expect("prepared");
    }
}
