//! The crate layering the two binaries rely on: the agent and the controller sit side by
//! side on `bosun-cluster`, and neither is built into the other. Read from `cargo metadata`
//! (the lock file's resolve; nothing is compiled), so it costs well under a second.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The host's target triple, from `rustc -vV`.
fn host_triple() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc)
        .arg("-vV")
        .output()
        .unwrap_or_else(|e| panic!("running `{rustc} -vV`: {e}"));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("`{rustc} -vV` names no host triple"))
}

/// The workspace's resolve graph: package name → names of its normal (not dev, not build)
/// dependencies.
fn normal_graph() -> BTreeMap<String, BTreeSet<String>> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Only this platform's graph: offline, `cargo metadata` can read only the packages the
    // builds downloaded, and on a new machine those are this platform's (without the filter
    // it wants e.g. android_system_properties, which no Linux build fetches).
    let out = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", &host_triple()])
        .arg("--manifest-path")
        .arg(&manifest)
        .output()
        .unwrap_or_else(|e| panic!("running `{cargo} metadata`: {e}"));
    assert!(
        out.status.success(),
        "`cargo metadata` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let names: BTreeMap<&str, &str> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    metadata["resolve"]["nodes"]
        .as_array()
        .expect("a resolve graph")
        .iter()
        .map(|node| {
            let deps = node["deps"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|k| k["kind"].is_null())
                })
                .map(|d| names[d["pkg"].as_str().unwrap()].to_string())
                .collect();
            (names[node["id"].as_str().unwrap()].to_string(), deps)
        })
        .collect()
}

/// Every package `root` is built with (its normal dependencies, transitively).
fn closure(graph: &BTreeMap<String, BTreeSet<String>>, root: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![root.to_string()];
    while let Some(name) = todo.pop() {
        for dep in graph.get(&name).into_iter().flatten() {
            if seen.insert(dep.clone()) {
                todo.push(dep.clone());
            }
        }
    }
    seen
}

#[test]
fn the_agent_and_the_controller_share_bosun_cluster_and_neither_builds_the_other() {
    let graph = normal_graph();
    let agent = closure(&graph, "bosun-agent");
    let controller = closure(&graph, "bosun-controller");
    // The walk sees through the graph: both reach the shared crates.
    for shared in [
        "bosun-cluster",
        "bosun-api",
        "bosun-planner",
        "bosun-policy",
    ] {
        assert!(
            agent.contains(shared),
            "bosun-agent does not reach {shared}"
        );
        assert!(
            controller.contains(shared),
            "bosun-controller does not reach {shared}"
        );
    }
    assert!(
        !agent.contains("bosun-controller"),
        "bosun-agent depends on bosun-controller (see `cargo tree -p bosun-agent -e normal -i bosun-controller`): move what it needs into bosun-cluster instead"
    );
    assert!(
        !controller.contains("bosun-agent"),
        "bosun-controller depends on bosun-agent: move what it needs into bosun-cluster instead"
    );
    assert!(
        agent.contains("bosun-fetch"),
        "bosun-agent does not reach bosun-fetch"
    );
    for shared in ["bosun-cluster", "bosun-fetch"] {
        let below = closure(&graph, shared);
        for binary in ["bosun-agent", "bosun-controller", "kubectl-bosun"] {
            assert!(
                !below.contains(binary),
                "{shared} depends on {binary}; a shared crate must sit below the binaries"
            );
        }
    }
}
