//! Host benchmarks (see docs/benchmarks.md for figures and how to reproduce them).
//!
//! (a) take the plugin verified for this pin from memory + run a no-op action (fresh
//!     store + instantiate + call); the same run with every memory decommitted after each
//!     instance; re-hash + verify the bytes + run; all beside fork/exec of `/bin/true`;
//! (b) one host-call round trip: a run making 1000 `log` calls beside one making none;
//! (c) load one plugin from the compiled on-disk cache (evicted from memory first);
//! (d) hash + verify a 5 MB plugin, beside hashing alone;
//! (e) a granted `/bin/true` with and without the kernel boundary of granted commands, and
//!     the boundary's preparation alone.
//!
//! `benches` (about 130 lines) is kept whole on purpose: each measurement sits beside the
//! alternative it is compared with, in the order the table in docs/benchmarks.md lists them.

#[path = "../tests/support/mod.rs"]
mod support;

use std::hint::black_box;

use bosun_api::grants::Grants;
use bosun_host::{NodeContext, RunOptions};
use bosun_trust::{Digest, Statement};
use criterion::{Criterion, criterion_group, criterion_main};

fn benches(c: &mut Criterion) {
    let node = support::node();
    let host = node.host();
    let bytes = &support::plugins().good;
    let pin = node.signer.pin(bytes, "good", "1.0.0");
    let plugin = host.load(bytes, &pin).unwrap();
    let grants = Grants::default();
    let ctx = NodeContext::default();
    let opts = RunOptions::default();

    // The same host configuration except that every linear memory is decommitted with
    // madvise when an instance ends (wasmtime's default), for the side-by-side figure.
    let mut decommit_config = node.config();
    decommit_config.pool.keep_resident_bytes = 0;
    let decommit_host = bosun_host::Host::new(decommit_config).unwrap();
    let decommit_plugin = decommit_host.load(bytes, &pin).unwrap();

    let mut g = c.benchmark_group("a_noop");
    g.bench_function("run_noop", |b| {
        b.iter(|| {
            black_box(
                host.run(&plugin, &grants, &ctx, "noop", "{}", opts)
                    .unwrap(),
            )
        });
    });
    g.bench_function("run_noop_decommit_all", |b| {
        b.iter(|| {
            black_box(
                decommit_host
                    .run(&decommit_plugin, &grants, &ctx, "noop", "{}", opts)
                    .unwrap(),
            )
        });
    });
    g.bench_function("cached_verified_pin_and_run_noop", |b| {
        b.iter(|| {
            let p = host.loaded(&pin).expect("verified by the load above");
            black_box(host.run(&p, &grants, &ctx, "noop", "{}", opts).unwrap())
        });
    });
    g.bench_function("rehash_verify_bytes_and_run_noop", |b| {
        b.iter(|| {
            let p = host.load(bytes, &pin).unwrap();
            black_box(host.run(&p, &grants, &ctx, "noop", "{}", opts).unwrap())
        });
    });
    g.bench_function("fork_exec_bin_true", |b| {
        b.iter(|| black_box(std::process::Command::new("/bin/true").status().unwrap()));
    });
    g.finish();

    let mut g = c.benchmark_group("b_host_call");
    g.bench_function("run_log_0_calls", |b| {
        b.iter(|| {
            black_box(
                host.run(&plugin, &grants, &ctx, "log", r#"{"n":0}"#, opts)
                    .unwrap(),
            )
        });
    });
    g.bench_function("run_log_1000_calls", |b| {
        b.iter(|| {
            black_box(
                host.run(&plugin, &grants, &ctx, "log", r#"{"n":1000}"#, opts)
                    .unwrap(),
            )
        });
    });
    g.finish();

    let mut g = c.benchmark_group("c_load_from_disk_cache");
    g.bench_function("load_evicted_plugin", |b| {
        b.iter(|| {
            host.evict(&pin.sha256);
            black_box(host.load(bytes, &pin).unwrap())
        });
    });
    g.finish();

    // (e) the kernel boundary of a granted command: a granted /usr/bin/true through the host's
    // runner with and without the boundary (Landlock ruleset, seccomp filter, descriptors
    // closed), and the boundary's preparation alone (in the agent, before the fork). The
    // grants are the hello example's: /etc read-only and one command.
    let filesystem = vec![bosun_api::grants::FilesystemGrant {
        path: "/etc".into(),
        access: bosun_api::grants::Access::ReadOnly,
        optional: false,
    }];
    let grant = bosun_api::grants::ExecGrant {
        command: "/usr/bin/true".into(),
        args: vec![],
        timeout_seconds: None,
        max_output_bytes: None,
        dry_run: false,
        optional: false,
        sandbox: Default::default(),
    };
    let mut g = c.benchmark_group("e_granted_command");
    g.bench_function("granted_true_without_the_boundary", |b| {
        b.iter(|| bosun_host::bench_internals::run_granted(&filesystem, &grant, false));
    });
    g.bench_function("granted_true_with_the_boundary", |b| {
        b.iter(|| bosun_host::bench_internals::run_granted(&filesystem, &grant, true));
    });
    g.bench_function("prepare_the_boundary_only", |b| {
        b.iter(|| bosun_host::bench_internals::prepare(&filesystem, &grant));
    });
    g.finish();

    let big: Vec<u8> = (0..5_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let digest = Digest::of(&big);
    let statement = Statement::new("big", "1.0.0", digest).unwrap();
    let sigs = vec![node.signer.key.sign_statement(&statement)];
    let mut g = c.benchmark_group("d_verify_5mb");
    g.sample_size(30);
    g.bench_function("hash_only", |b| b.iter(|| black_box(Digest::of(&big))));
    g.bench_function("hash_and_verify", |b| {
        b.iter(|| {
            black_box(
                bosun_trust::verify(&big, &digest, "big", "1.0.0", &sigs, &node.signer.roots)
                    .unwrap(),
            )
        });
    });
    g.finish();
}

criterion_group!(host_benches, benches);
criterion_main!(host_benches);
