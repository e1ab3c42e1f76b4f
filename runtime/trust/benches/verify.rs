//! Cost of the trust check the host makes before compiling a plugin: hash a 5 MB plugin
//! and verify one signature over its statement, for each algorithm, beside hashing alone
//! (the floor) and beside verifying an already-known digest (the host's cache path).
//!
//! Run: `cargo bench -p bosun-trust --bench verify`

use std::hint::black_box;
use std::time::Duration;

use bosun_trust::{
    Digest, PluginSignature, SigningKey, Statement, TrustRoots, verify, verify_digest,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const SIZE: usize = 5 * 1024 * 1024;

/// Deterministic, incompressible-looking bytes (a xorshift stream), so nothing about
/// the input is special.
fn blob() -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..SIZE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect()
}

fn signed(key: &SigningKey, digest: Digest) -> (PluginSignature, TrustRoots) {
    let statement = Statement::new("bench", "1.0.0", digest).expect("valid statement");
    let mut roots = TrustRoots::new();
    roots.add(key.public_key(), "bench.pub");
    (key.sign_statement(&statement), roots)
}

fn bench(c: &mut Criterion) {
    let bytes = blob();
    let digest = Digest::of(&bytes);
    let ed = signed(&SigningKey::generate_ed25519(), digest);
    let p256 = signed(&SigningKey::generate_p256(), digest);

    let mut group = c.benchmark_group("plugin_5MiB");
    group.throughput(Throughput::Bytes(SIZE as u64));
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("sha256_only", |b| {
        b.iter(|| Digest::of(black_box(&bytes)));
    });
    for (name, (sig, roots)) in [("ed25519", &ed), ("ecdsa_p256", &p256)] {
        let sigs = std::slice::from_ref(sig);
        group.bench_function(format!("hash_and_verify_{name}"), |b| {
            b.iter(|| {
                verify(black_box(&bytes), &digest, "bench", "1.0.0", sigs, roots).expect("verifies")
            });
        });
    }
    group.finish();

    // Signature check alone, for a digest the caller already has (no hashing).
    let mut group = c.benchmark_group("verify_known_digest");
    for (name, (sig, roots)) in [("ed25519", &ed), ("ecdsa_p256", &p256)] {
        let sigs = std::slice::from_ref(sig);
        group.bench_function(name, |b| {
            b.iter(|| {
                verify_digest(black_box(&digest), "bench", "1.0.0", sigs, roots).expect("verifies")
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
