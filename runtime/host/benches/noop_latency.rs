//! Figure (a) as a latency distribution: p50 / p90 / p99 of one no-op plugin run, each
//! configuration beside the others in the same run (see docs/benchmarks.md).
//!
//! Criterion (benches/host.rs) reports a mean with a confidence interval; the target for
//! (a) is a p50, so this harness times every call on its own and reports percentiles.
//! The variants are interleaved in blocks of `BLOCK` calls (block round `i` runs a block
//! of every variant, in an order that rotates with `i`), so background load on a shared
//! machine falls on all of them alike instead of on whichever ran last, while each call
//! still finds the caches as a steady stream of runs leaves them (alternating call by
//! call would instead measure every wasm run right after a fork of the whole process).
//!
//! Variants, all "take the verified plugin for this pin from memory, fresh store,
//! instantiate, call `run("noop")`" unless said otherwise:
//! - `run_noop`: the default host configuration;
//! - `run_noop_decommit_all`: `keep_resident_bytes = 0` (every page returned to the kernel when an
//!   instance ends, wasmtime's default);
//! - `fork_exec_bin_true`: spawning the native no-op `/bin/true` and waiting for it.
//!
//! `cargo bench -p bosun-host --bench noop_latency` (env `ROUNDS`, default 20000).

#[path = "../tests/support/mod.rs"]
mod support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use bosun_api::grants::Grants;
use bosun_host::{Host, NodeContext, PluginPin, RunOptions};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    // Nearest rank: the smallest value with at least p% of the samples at or below it.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).unwrap_or_default()
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported here.
    const BLOCK: usize = 200;
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000_usize).div_ceil(BLOCK) * BLOCK;
    let node = support::node();
    let bytes = &support::plugins().good;
    let pin = node.signer.pin(bytes, "good", "1.0.0");
    let grants = Grants::default();
    let ctx = NodeContext::default();
    let opts = RunOptions::default();

    let host_with = |edit: &dyn Fn(&mut bosun_host::HostConfig)| {
        let mut config = node.config();
        edit(&mut config);
        let host = Host::new(config).expect("host");
        host.load(bytes, &pin).expect("load");
        host
    };
    let hosts: Vec<(&str, Host)> = vec![
        ("run_noop", host_with(&|_| {})),
        ("run_noop_decommit_all", host_with(&|c| c.pool.keep_resident_bytes = 0)),
    ];
    let run = |host: &Host, pin: &PluginPin| {
        let plugin = host.loaded(pin).expect("verified by the load above");
        black_box(host.run(&plugin, &grants, &ctx, "noop", "{}", opts).expect("noop runs"));
    };
    let variants = hosts.len() + 1;
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds); variants];

    let warmup = (rounds / 10).max(100);
    for _ in 0..warmup {
        for (_, host) in &hosts {
            run(host, &pin);
        }
    }
    let load_before = loadavg();
    for i in 0..rounds / BLOCK {
        for k in 0..variants {
            let v = (i + k) % variants;
            for _ in 0..BLOCK {
                let started = Instant::now();
                if v < hosts.len() {
                    run(&hosts[v].1, &pin);
                } else {
                    black_box(std::process::Command::new("/bin/true").status().expect("/bin/true"));
                }
                samples[v].push(started.elapsed());
            }
        }
    }
    let load_after = loadavg();

    println!("noop latency, {rounds} calls per variant in interleaved blocks of {BLOCK}, after {warmup} warm-up rounds; load average {load_before} before, {load_after} after");
    println!("| variant | p50 | p90 | p99 | mean |");
    println!("|---|---|---|---|---|");
    let names: Vec<&str> = hosts.iter().map(|(n, _)| *n).chain(["fork_exec_bin_true"]).collect();
    for (name, mut s) in names.into_iter().zip(samples) {
        s.sort_unstable();
        let mean = s.iter().sum::<Duration>() / s.len() as u32;
        let us = |d: Duration| format!("{:.1} µs", d.as_secs_f64() * 1e6);
        println!("| {name} | {} | {} | {} | {} |", us(percentile(&s, 50.0)), us(percentile(&s, 90.0)), us(percentile(&s, 99.0)), us(mean));
    }
}
