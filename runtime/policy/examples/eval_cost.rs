//! Cost of one policy's `deny` on one input, for profiling: compiles the policy the way
//! Bosun does (its own engine, its `data.json`, strict builtin errors, prepared once),
//! prints the deny set, then evaluates it N more times and prints the mean.
//!
//! Wall-clock figures are noisy on a shared machine; instruction counts are not. The
//! instructions of one evaluation, as docs/benchmarks-policy.md reports them, are the
//! difference between two runs under callgrind divided by the difference in N:
//!
//! ```sh
//! B=$CARGO_TARGET_DIR/release/examples/eval_cost
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null $B policies/version-skew runtime/policy/benches/inputs/step-allowed.json 40
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null $B policies/version-skew runtime/policy/benches/inputs/step-allowed.json 240
//! # ("Collected" of the second run - that of the first) / 200
//! ```
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use regorus::{Engine, Value};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, input, n] = args.as_slice() else {
        anyhow::bail!("usage: eval_cost POLICY_DIR INPUT_JSON EVALUATIONS");
    };
    let dir = PathBuf::from(dir);
    let n: u32 = n.parse().context("EVALUATIONS must be a number")?;
    let mut engine = Engine::new();
    engine.set_strict_builtin_errors(true);
    let package = engine.add_policy_from_file(dir.join("policy.rego"))?;
    if let Ok(data) = std::fs::read_to_string(dir.join("data.json")) {
        engine.add_data(Value::from_json_str(&data)?)?;
    }
    let input = Value::from_json_str(&std::fs::read_to_string(input)?)?;
    let rule = format!("{package}.deny");
    engine.set_input(input.clone());
    println!("{}", engine.eval_rule(rule.clone())?.to_json_str()?);
    let start = Instant::now();
    for _ in 0..n {
        engine.set_input(input.clone());
        std::hint::black_box(engine.eval_rule(rule.clone())?);
    }
    if n > 0 {
        println!(
            "{:.1} µs per evaluation (mean of {n})",
            start.elapsed().as_secs_f64() * 1e6 / f64::from(n)
        );
    }
    Ok(())
}
