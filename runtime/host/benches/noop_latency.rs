//! Figure (a) as a latency distribution: p50 / p90 / p99 of one no-op plugin run, each
//! configuration beside the others in the same run (see docs/benchmarks.md).
//!
//! Criterion (benches/host.rs) reports a mean with a confidence interval; the target for
//! (a) is a p50, so this harness times every call on its own and reports percentiles.
//! The in-process variants are interleaved in blocks of `BLOCK` calls (block round `i`
//! runs a block of every variant, in an order that rotates with `i`), so background load
//! on a shared machine falls on all of them alike instead of on whichever ran last, while
//! each call still finds the caches as a steady stream of runs leaves them. fork/exec runs
//! after them, in the same process: interleaving it slowed the others (a fork
//! write-protects every page of this process; see docs/benchmarks.md).
//!
//! Variants, all "take the verified plugin for this pin from memory, fresh store,
//! instantiate, call `run("noop")`" unless said otherwise:
//! - `run_noop`: the default host configuration;
//! - `run_noop_decommit_all`: `keep_resident_bytes = 0` (every page returned to the kernel when an
//!   instance ends, wasmtime's default);
//! - `wasmtime_same_plugin_no_host`: the same plugin on the same engine through plain
//!   wasmtime, with every import defined as a trap and none of Bosun's work (no grants,
//!   WASI context, params check or capture): what this component costs wasmtime itself;
//! - `wasmtime_memory_component`: a hand-written component with one 17-page memory (the
//!   plugin's initial size), a bump `realloc` and `f: func(s: string) -> u32`, which
//!   touches one stack-area page: the cost of a fresh memory and a string argument;
//! - `wasmtime_min_component`: a component exporting `f: func() -> u32` and nothing else;
//! - `fork_exec_bin_true`: spawning the native no-op `/bin/true` and waiting for it.
//!
//! `cargo bench -p bosun-host --bench noop_latency`. Environment: `ROUNDS` (default
//! 20000); `ONLY=run_noop,...` measures only the named variants (for a profile);
//! `SMALL_POOL=1` sizes every pool for one instance, which valgrind needs (it cannot map
//! the default pool's address-space reservation).
//!
//! `main` (about 160 lines) is kept whole on purpose: it measures the variants one after
//! another in one run and prints them side by side, and the order of the measurements is the
//! fairness argument (each on the same warm machine, the pools sized once).

#[path = "../tests/support/mod.rs"]
mod support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use bosun_api::grants::Grants;
use bosun_host::{Host, NodeContext, PluginPin, RunOptions};
use wasmtime::Store;
use wasmtime::component::{Component, InstancePre, Linker, Val};

/// `f: func() -> u32` in one core module without memory.
const MIN_COMPONENT: &str = r#"(component
  (core module $m (func (export "f") (result i32) i32.const 7))
  (core instance $i (instantiate $m))
  (func (export "f") (result u32) (canon lift (core func $i "f"))))"#;

/// A memory of the plugin's initial size (17 pages), a bump allocator for the string
/// argument, and a store into the stack area as a guest's prologue would make.
const MEMORY_COMPONENT: &str = r#"(component
  (core module $m
    (memory (export "memory") 17)
    (global $bump (mut i32) (i32.const 1048576))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $r i32)
      global.get $bump
      local.set $r
      global.get $bump
      local.get 3
      i32.add
      i32.const 7
      i32.add
      i32.const -8
      i32.and
      global.set $bump
      local.get $r)
    (func (export "f") (param i32 i32) (result i32)
      i32.const 1040000
      i32.const 1
      i32.store
      local.get 0
      i32.load8_u
      drop
      i32.const 7))
  (core instance $i (instantiate $m))
  (func (export "f") (param "s" string) (result u32)
    (canon lift (core func $i "f") (memory (core memory $i "memory")) (realloc (core func $i "realloc")))))"#;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    // Nearest rank: the smallest value with at least p% of the samples at or below it.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Plain wasmtime: a fresh store on `pre`'s engine, instantiate, call export `f` (a
/// top-level name or an index path), as the host does but without anything of Bosun's.
struct Plain {
    pre: InstancePre<()>,
    export: wasmtime::component::ComponentExportIndex,
    args: Vec<Val>,
}

impl Plain {
    fn new(
        engine: &wasmtime::Engine,
        bytes: &[u8],
        path: &[&str],
        args: Vec<Val>,
        traps: bool,
    ) -> Plain {
        let component = Component::new(engine, bytes).expect("component");
        let mut linker = Linker::new(engine);
        if traps {
            linker
                .define_unknown_imports_as_traps(&component)
                .expect("trap imports");
        }
        let mut export = None;
        for name in path {
            export = Some(
                component
                    .get_export_index(export.as_ref(), name)
                    .expect("export"),
            );
        }
        Plain {
            pre: linker.instantiate_pre(&component).expect("link"),
            export: export.expect("a path"),
            args,
        }
    }

    fn run(&self) {
        let mut store = Store::new(self.pre.engine(), ());
        store.set_epoch_deadline(1_000_000);
        let instance = self.pre.instantiate(&mut store).expect("instantiate");
        let f = instance.get_func(&mut store, self.export).expect("export");
        let mut out = [Val::Bool(false)];
        f.call(&mut store, &self.args, &mut out).expect("call");
        black_box(&out);
    }
}

enum Variant {
    Bosun(Box<Host>, PluginPin),
    Plain(Plain),
    ForkExec,
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported here.
    const BLOCK: usize = 200;
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000_usize)
        .div_ceil(BLOCK)
        * BLOCK;
    let small_pool = std::env::var_os("SMALL_POOL").is_some();
    let node = support::node();
    let good = &support::plugins().good;
    let pin = node.signer.pin(good, "good", "1.0.0");
    let grants = Grants::default();
    let ctx = NodeContext::default();
    let opts = RunOptions::default();

    let host_with = |edit: &dyn Fn(&mut bosun_host::HostConfig)| {
        let mut config = node.config();
        edit(&mut config);
        if small_pool {
            config.pool.max_instances = 1;
        }
        let host = Host::new(config).expect("host");
        host.load(good, &pin).expect("load");
        host
    };
    let default_host = host_with(&|_| {});
    let engine = default_host.engine().clone();
    let wat = |text: &str| wat::parse_str(text).expect("valid WAT");
    let noop_args = vec![
        Val::String("noop".into()),
        Val::String("{}".into()),
        Val::Record(vec![
            ("dry-run".into(), Val::Bool(false)),
            ("resumed".into(), Val::Bool(false)),
        ]),
    ];
    let mut variants: Vec<(&str, Variant)> = vec![
        (
            "run_noop",
            Variant::Bosun(Box::new(default_host), pin.clone()),
        ),
        (
            "run_noop_decommit_all",
            Variant::Bosun(
                Box::new(host_with(&|c| c.pool.keep_resident_bytes = 0)),
                pin.clone(),
            ),
        ),
        (
            "wasmtime_same_plugin_no_host",
            Variant::Plain(Plain::new(
                &engine,
                good,
                &["bosun:plugin/plugin@0.2.0", "run"],
                noop_args,
                true,
            )),
        ),
        (
            "wasmtime_memory_component",
            Variant::Plain(Plain::new(
                &engine,
                &wat(MEMORY_COMPONENT),
                &["f"],
                vec![Val::String("noop".into())],
                false,
            )),
        ),
        (
            "wasmtime_min_component",
            Variant::Plain(Plain::new(
                &engine,
                &wat(MIN_COMPONENT),
                &["f"],
                vec![],
                false,
            )),
        ),
        ("fork_exec_bin_true", Variant::ForkExec),
    ];
    let only = std::env::var("ONLY").ok();
    variants.retain(|(name, _)| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|w| w.trim() == *name))
    });
    assert!(!variants.is_empty(), "ONLY names no variant");

    let run = |v: &Variant| match v {
        Variant::Bosun(host, pin) => {
            let plugin = host.loaded(pin).expect("verified by the load above");
            black_box(
                host.run(&plugin, &grants, &ctx, "noop", "{}", opts)
                    .expect("noop runs"),
            );
        }
        Variant::Plain(p) => p.run(),
        Variant::ForkExec => {
            black_box(
                std::process::Command::new("/bin/true")
                    .status()
                    .expect("/bin/true"),
            );
        }
    };
    let n = variants.len();
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds); n];

    let warmup = (rounds / 10).max(100);
    for _ in 0..warmup {
        for (_, v) in variants
            .iter()
            .filter(|(_, v)| !matches!(v, Variant::ForkExec))
        {
            run(v);
        }
    }
    let load_before = loadavg();
    let interleaved: Vec<usize> = (0..n)
        .filter(|&v| !matches!(variants[v].1, Variant::ForkExec))
        .collect();
    for i in 0..rounds / BLOCK {
        for k in 0..interleaved.len() {
            let v = interleaved[(i + k) % interleaved.len()];
            for _ in 0..BLOCK {
                let started = Instant::now();
                run(&variants[v].1);
                samples[v].push(started.elapsed());
            }
        }
    }
    // fork/exec last, in its own phase: forking this (large) process write-protects all of
    // its pages, and interleaved fork blocks measurably slowed the in-process variants
    // (docs/benchmarks.md, session 4).
    for v in (0..n).filter(|&v| matches!(variants[v].1, Variant::ForkExec)) {
        for _ in 0..rounds {
            let started = Instant::now();
            run(&variants[v].1);
            samples[v].push(started.elapsed());
        }
    }
    let load_after = loadavg();

    println!(
        "noop latency, {rounds} calls per variant in interleaved blocks of {BLOCK}, after {warmup} warm-up rounds; load average {load_before} before, {load_after} after"
    );
    println!("| variant | p50 | p90 | p99 | mean |");
    println!("|---|---|---|---|---|");
    for ((name, _), mut s) in variants.iter().zip(samples) {
        s.sort_unstable();
        let mean = s.iter().sum::<Duration>() / s.len() as u32;
        let us = |d: Duration| format!("{:.1} µs", d.as_secs_f64() * 1e6);
        println!(
            "| {name} | {} | {} | {} | {} |",
            us(percentile(&s, 50.0)),
            us(percentile(&s, 90.0)),
            us(percentile(&s, 99.0)),
            us(mean)
        );
    }
}
