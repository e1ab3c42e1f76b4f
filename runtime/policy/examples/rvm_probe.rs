//! Probe: could Bosun decide on regorus' RVM (bytecode VM) instead of its interpreter?
//!
//! For every shipped step policy and bench input: does the RVM compile it, decide the same
//! as the interpreter, and how long does each take (mean of 2,000 evaluations). Then the
//! check that decided against adopting it: an error inside a deny rule's body (a builtin's,
//! such as an unknown time zone, or an instruction's, such as adding a number to a string)
//! must fail the evaluation, as the interpreter does with strict builtin errors, not yield
//! an empty deny set. Run: `cargo run --release -p bosun-policy --example rvm_probe`.
//!
//! `main` (about 130 lines) is kept whole on purpose: a probe read top to bottom, each
//! question asked and answered in the order the docs report them.
use std::path::Path;
use std::time::Instant;

use regorus::languages::rego::compiler::Compiler;
use regorus::rvm::vm::RegoVM;
use regorus::{Engine, Value};

fn main() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut inputs = vec![];
    for f in ["step-allowed", "step-denied", "step-renewal"] {
        let s =
            std::fs::read_to_string(root.join(format!("runtime/policy/benches/inputs/{f}.json")))?;
        inputs.push((f, Value::from_json_str(&s)?));
    }
    let mut total_i = [0f64; 3];
    let mut total_v = [0f64; 3];
    for dir in [
        "change-freeze",
        "control-plane-protection",
        "maintenance-window",
        "trusted-publishers",
        "version-skew",
        "certificate-renewal",
    ] {
        let d = root.join("policies").join(dir);
        let rego = std::fs::read_to_string(d.join("policy.rego"))?;
        let data = std::fs::read_to_string(d.join("data.json"))
            .ok()
            .map(|s| Value::from_json_str(&s))
            .transpose()?;
        let mut engine = Engine::new();
        engine.set_strict_builtin_errors(true);
        let pkg = engine.add_policy(format!("{dir}.rego"), rego)?;
        if let Some(data) = &data {
            engine.add_data(data.clone())?;
        }
        let entry = format!("{pkg}.deny");
        let compiled = match engine.compile_with_entrypoint(&entry.as_str().into()) {
            Ok(c) => c,
            Err(e) => {
                println!("{dir}: compile_with_entrypoint failed: {e}");
                continue;
            }
        };
        let program = match Compiler::compile_from_policy(&compiled, &[entry.as_str()]) {
            Ok(p) => p,
            Err(e) => {
                println!("{dir}: RVM compile failed: {e:#}");
                continue;
            }
        };
        let mut vm = RegoVM::new();
        vm.load_program(program);
        if let Some(data) = &data {
            vm.set_data(data.clone())?;
        }
        for (i, (name, input)) in inputs.iter().enumerate() {
            engine.set_input(input.clone());
            let a = engine.eval_rule(entry.clone())?;
            vm.set_input(input.clone());
            let b = match vm.execute_entry_point_by_name(&entry) {
                Ok(b) => b,
                Err(e) => {
                    println!("{dir} {name}: RVM eval failed: {e:#}");
                    continue;
                }
            };
            let n = 2000;
            let t = Instant::now();
            for _ in 0..n {
                engine.set_input(input.clone());
                std::hint::black_box(engine.eval_rule(entry.clone())?);
            }
            let ti = t.elapsed().as_secs_f64() * 1e6 / n as f64;
            let t = Instant::now();
            for _ in 0..n {
                vm.set_input(input.clone());
                std::hint::black_box(vm.execute_entry_point_by_name(&entry)?);
            }
            let tv = t.elapsed().as_secs_f64() * 1e6 / n as f64;
            total_i[i] += ti;
            total_v[i] += tv;
            println!(
                "{dir:26} {name:13} same={} interp={ti:7.1}us rvm={tv:7.1}us  interp={} rvm={}",
                a == b,
                a.to_json_str()?.chars().take(60).collect::<String>(),
                b.to_json_str()?.chars().take(60).collect::<String>()
            );
        }
    }
    println!("totals (µs, allowed/denied/renewal): interpreter {total_i:.0?} rvm {total_v:.0?}");

    // Fail closed? An error inside a deny body must fail the evaluation, as the interpreter
    // does with strict builtin errors, not yield an empty deny set. One builtin error (an
    // unknown time zone) and one error of the VM's own instructions (adding a number to a
    // string).
    let input = Value::from_json_str(r#"{"now": "2026-11-30T01:00:00Z"}"#)?;
    for (what, body) in [
        (
            "unknown time zone",
            "[h, _, _] := time.clock([time.parse_rfc3339_ns(input.now), \"Mars/Olympus_Mons\"])\n    h > 100",
        ),
        ("number + string", "input.now + 1 > 0"),
    ] {
        let rego = format!(
            "package bosun.step.probe\ndeny contains \"objection\" if {{\n    {body}\n}}\n"
        );
        let mut engine = Engine::new();
        engine.set_strict_builtin_errors(true);
        engine.add_policy("probe.rego".into(), rego)?;
        let entry = "data.bosun.step.probe.deny";
        let compiled = engine.compile_with_entrypoint(&entry.into())?;
        let program = Compiler::compile_from_policy(&compiled, &[entry])?;
        let mut vm = RegoVM::new();
        vm.load_program(program);
        vm.set_strict_builtin_errors(true);
        vm.set_input(input.clone());
        engine.set_input(input.clone());
        let by_vm = vm
            .execute_entry_point_by_name(entry)
            .map(|v| v.to_json_str().unwrap_or_default())
            .map_err(|e| e.to_string());
        let by_interpreter = engine
            .eval_rule(entry.into())
            .map(|v| v.to_json_str().unwrap_or_default())
            .map_err(|e| {
                let text = format!("{e:#}");
                text.lines()
                    .find_map(|l| l.trim().strip_prefix("error: ").map(str::to_owned))
                    .unwrap_or_else(|| text.lines().next().unwrap_or_default().to_owned())
            });
        println!("{what}, strict builtin errors: interpreter {by_interpreter:?}; rvm {by_vm:?}");
    }
    Ok(())
}
