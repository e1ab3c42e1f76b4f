//! Step-gate latency: the whole shipped library (`policies/`) deciding one step.
//!
//! Two measurements of the same thing:
//! 1. Per-iteration samples (p50, p99, mean) for each input in `benches/inputs/`: the
//!    figure the target is stated in (p99 ≤ 100 µs). Printed as JSON lines, one per input,
//!    in the same shape as the OPA harness prints.
//! 2. Criterion's mean with a confidence interval, for regressions.
//!
//! Then, in the same run, the OPA harness (`benches/opa`, built from OPA's Go module) is
//! run on the same policies and inputs if its binary is found: `$BOSUN_OPA_GATE_BENCH`,
//! or `~/.cache/bosun/opa/v1.22.3/opa-gate-bench`. See docs/benchmarks-policy.md.
//!
//! Each gate evaluation goes through the agent's path: a typed `StepInput`, encoded to
//! JSON and converted to a Rego value, then every step policy's `deny` in its own engine.
//!
//! `main` (about 130 lines) is kept whole on purpose: the engines are measured one after
//! another on the same policies and inputs, and the report prints them side by side in that
//! order.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bosun_policy::{DecisionPoint, Enforcement, Limits, PolicySet, PolicySource, StepInput};
use criterion::Criterion;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every shipped policy, with its data, as an administrator would apply them.
fn shipped_policies() -> Vec<PolicySource> {
    let dir = root().join("policies");
    let mut out = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("policies/ exists")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for d in entries {
        let Ok(rego) = std::fs::read_to_string(d.join("policy.rego")) else {
            continue;
        };
        let data = std::fs::read_to_string(d.join("data.json"))
            .ok()
            .map(|s| serde_json::from_str(&s).expect("data.json is JSON"));
        out.push(PolicySource {
            name: d.file_name().unwrap().to_string_lossy().into_owned(),
            rego,
            data,
            enforcement: Enforcement::Deny,
        });
    }
    out
}

fn inputs() -> Vec<(String, StepInput)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/inputs");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("benches/inputs exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let doc: StepInput = serde_json::from_str(&std::fs::read_to_string(&f).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            (f.file_name().unwrap().to_string_lossy().into_owned(), doc)
        })
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    // Same rule as the Go harness: nearest rank on (n - 1).
    let idx = (p * (sorted.len() - 1) as f64 + 0.5) as usize;
    sorted[idx]
}

fn us(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1000.0
}

fn main() {
    let iterations: usize = std::env::var("BOSUN_BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let warmup = iterations / 10;
    let policies = shipped_policies();
    let set = PolicySet::compile(&policies, Limits::default());
    assert!(
        set.is_healthy(),
        "shipped policies must compile: {:?}",
        set.statuses()
    );
    let step_policies = set
        .statuses()
        .iter()
        .filter(|s| s.point == Some(DecisionPoint::Step))
        .count();
    let inputs = inputs();
    let mut ev = set.evaluator();

    // 1. Per-iteration samples.
    for (name, input) in &inputs {
        let decision = ev.step(input);
        for _ in 0..warmup {
            black_box(ev.step(black_box(input)));
        }
        let mut samples = Vec::with_capacity(iterations);
        for _ in 0..iterations {
            let start = Instant::now();
            black_box(ev.step(black_box(input)));
            samples.push(start.elapsed());
        }
        let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
        samples.sort();
        println!(
            "{}",
            serde_json::json!({
                "engine": "regorus",
                "input": name,
                "policies": step_policies,
                "denies": decision.denies.len(),
                "iterations": iterations,
                "p50_us": us(percentile(&samples, 0.50)),
                "p99_us": us(percentile(&samples, 0.99)),
                "mean_us": us(mean),
            })
        );
    }

    // Where the time goes, on the first input: each step policy alone, and the input
    // encoding alone.
    if let Some((name, input)) = inputs.first() {
        let p50 = |f: &mut dyn FnMut()| {
            let n = (iterations / 4).max(100);
            let mut s: Vec<Duration> = (0..n)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed()
                })
                .collect();
            s.sort();
            us(percentile(&s, 0.5))
        };
        let encode = p50(&mut || {
            black_box(regorus::Value::from(
                serde_json::to_value(black_box(input)).unwrap(),
            ));
        });
        let mut parts = serde_json::Map::new();
        parts.insert("input encoding".into(), encode.into());
        for p in &policies {
            let one = PolicySet::compile(std::slice::from_ref(p), Limits::default());
            if one.statuses()[0].point != Some(DecisionPoint::Step) {
                continue;
            }
            let mut e = one.evaluator();
            parts.insert(
                p.name.clone(),
                p50(&mut || drop(black_box(e.step(input)))).into(),
            );
        }
        println!(
            "{}",
            serde_json::json!({"engine": "regorus", "input": name, "breakdown_p50_us": parts})
        );
    }

    // 2. Criterion (mean and confidence interval).
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let mut group = c.benchmark_group("step_gate");
    for (name, input) in &inputs {
        group.bench_function(name.trim_end_matches(".json"), |b| {
            b.iter(|| black_box(ev.step(black_box(input))));
        });
    }
    group.finish();
    c.final_summary();

    // 3. OPA on the same policies and inputs, in the same run.
    let opa = std::env::var_os("BOSUN_OPA_GATE_BENCH")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".cache/bosun/opa/v1.22.3/opa-gate-bench"))
        })
        .filter(|p| p.exists());
    match opa {
        Some(bin) => {
            let status = std::process::Command::new(&bin)
                .arg("-policies")
                .arg(root().join("policies"))
                .arg("-inputs")
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/inputs"))
                .arg("-iterations")
                .arg(iterations.to_string())
                .arg("-warmup")
                .arg(warmup.to_string())
                .status()
                .expect("run the OPA harness");
            assert!(status.success(), "{} failed: {status}", bin.display());
        }
        None => eprintln!(
            "OPA harness not found: build it as docs/benchmarks-policy.md says (or set BOSUN_OPA_GATE_BENCH) to compare"
        ),
    }
}
