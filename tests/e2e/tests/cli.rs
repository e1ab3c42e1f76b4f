//! `kubectl-bosun` against the lab: the real CLI binary, the real controller and agents
//! (scoped to one instance per test by the support library), the real hello plugin.
//!
//! - `plugin publish` writes the ConfigMap and the Plugin from the signature bundle and a
//!   grants file; `status` renders a real Operation (and `--watch` follows it to the end);
//!   `logs` prints the agent's log tail.
//! - `retry` and `skip` set `recovery` on a Blocked task and refuse other states;
//!   `approve`, `pause` and `resume` set their fields and refuse wrong states.
//!
//! The CLI binary is taken from `$CARGO_TARGET_DIR/debug` (build it with
//! `cargo build -p kubectl-bosun -p bosun-controller -p bosun-agent`; `cargo test
//! --workspace` does) and refused when older than its sources.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result, bail, ensure};
use bosun_api::node_task::{NodeTask, NodeTaskPhase, StepPhase};
use bosun_api::operation::OperationPhase;
use bosun_api::{ExecutionMode, Recovery};
use bosun_e2e::operator::phase_of;
use bosun_e2e::{DEADLINE, Operator, lock_lab_nodes, target_dir, unique, workspace_root};
use bosun_lab::{LabHandle, Role};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt as _;
use kube::api::Api;
use serde_json::json;

/// The CLI binary, refused when missing or older than the sources it is built from.
fn cli_binary() -> Result<PathBuf> {
    let path = target_dir().join("debug/kubectl-bosun");
    let built = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .with_context(|| {
            format!(
                "{} not found; run `cargo build -p kubectl-bosun` first",
                path.display()
            )
        })?;
    for src in ["runtime/cli/src", "runtime/api/src", "runtime/trust/src"] {
        let newest = newest_mtime(&workspace_root().join(src));
        ensure!(
            built >= newest,
            "{} is older than {src}; run `cargo build -p kubectl-bosun` first",
            path.display()
        );
    }
    Ok(path)
}

fn newest_mtime(dir: &Path) -> std::time::SystemTime {
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        let t = if p.is_dir() {
            newest_mtime(&p)
        } else {
            entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(newest)
        };
        newest = newest.max(t);
    }
    newest
}

/// What one CLI run printed.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(self) -> Result<String> {
        ensure!(
            self.code == 0,
            "kubectl-bosun failed ({}):\n{}{}",
            self.code,
            self.stdout,
            self.stderr
        );
        Ok(self.stdout)
    }

    /// Asserts a refusal: exit code 1, nothing on stdout, and every piece in the error.
    fn refused(self, pieces: &[&str]) -> Result<()> {
        ensure!(
            self.code == 1,
            "expected a refusal (exit 1), got {}:\n{}{}",
            self.code,
            self.stdout,
            self.stderr
        );
        ensure!(
            self.stdout.is_empty(),
            "a refusal printed on stdout: {}",
            self.stdout
        );
        for p in pieces {
            ensure!(
                self.stderr.contains(p),
                "the refusal does not say {p:?}:\n{}",
                self.stderr
            );
        }
        Ok(())
    }
}

/// Runs `kubectl-bosun ARGS --kubeconfig <lab>` (the flag goes last: every cluster command
/// takes it).
async fn cli(lab: &LabHandle, args: &[&str]) -> Result<Run> {
    let out = tokio::process::Command::new(cli_binary()?)
        .args(args)
        .arg("--kubeconfig")
        .arg(&lab.kubeconfig)
        .env("NO_COLOR", "1")
        .env_remove("KUBECONFIG")
        .output()
        .await
        .context("running kubectl-bosun")?;
    Ok(Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout)?,
        stderr: String::from_utf8(out.stderr)?,
    })
}

fn nodes_of(lab: &LabHandle, role: Role) -> Vec<String> {
    let mut v: Vec<String> = lab
        .nodes
        .iter()
        .filter(|n| n.role == role)
        .map(|n| n.name.clone())
        .collect();
    v.sort();
    v
}

fn cp_selector() -> serde_json::Value {
    json!({ "matchExpressions": [{ "key": "node-role.kubernetes.io/control-plane", "operator": "Exists" }] })
}

fn workers_selector() -> serde_json::Value {
    json!({ "matchExpressions": [{ "key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist" }] })
}

fn task_phase(t: &NodeTask) -> NodeTaskPhase {
    t.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

/// Builds and signs hello with the CLI (`plugin sign` with the e2e key), then publishes it
/// with `plugin publish` and checks what landed in the cluster.
async fn publish_hello_with_cli(lab: &LabHandle, dir: &Path) -> Result<()> {
    // The support library installs `uname` in the host roots (and publishes hello the
    // library's way); that Plugin is deleted so the CLI's publication is a creation.
    bosun_e2e::cluster::publish_hello(lab).await?;
    let plugins = Api::<bosun_api::Plugin>::all(lab.client.clone());
    plugins
        .delete("hello", &kube::api::DeleteParams::default())
        .await?;
    let gone = Instant::now();
    while plugins.get_opt("hello").await?.is_some() {
        ensure!(
            gone.elapsed() < DEADLINE,
            "Plugin hello not deleted within {DEADLINE:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let wasm = bosun_e2e::build_plugin("bosun-plugin-hello")?;
    let file = dir.join("hello.wasm");
    std::fs::write(&file, &wasm)?;
    let (_, pub_path) = bosun_e2e::cluster::signing_key()?;
    let key = pub_path.with_file_name("e2e.key");
    let file_s = file.to_str().context("utf-8 path")?;
    let out = tokio::process::Command::new(cli_binary()?)
        .args([
            "plugin",
            "sign",
            "--key",
            key.to_str().unwrap(),
            "--name",
            "hello",
            "--version",
            "0.1.0",
            file_s,
        ])
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "plugin sign failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let grants = dir.join("grants.yaml");
    std::fs::write(
        &grants,
        "filesystem:\n  - path: /etc\n    access: ReadOnly\nexec:\n  - command: /usr/bin/uname\n    args: [[\"-r\"]]\n",
    )?;
    let out = cli(
        lab,
        &[
            "plugin",
            "publish",
            file_s,
            "--name",
            "hello",
            "--version",
            "0.1.0",
            "--namespace",
            "bosun-system",
            "--grants",
            grants.to_str().unwrap(),
        ],
    )
    .await?
    .ok()?;
    let digest = bosun_trust::Digest::of(&wasm).to_string();
    ensure!(
        out.starts_with(&format!("published hello 0.1.0 {digest}\n")),
        "{out}"
    );
    ensure!(
        out.contains(
            "Plugin hello created: 1 signature; grants: 1 filesystem, 1 exec, 0 services, 0 http"
        ),
        "{out}"
    );

    // What the cluster now holds is exactly the file, the bundle and the grants.
    let bundle = bosun_trust::SignatureBundle::read(bosun_trust::SignatureBundle::path_for(&file))?;
    let plugin = Api::<bosun_api::Plugin>::all(lab.client.clone())
        .get("hello")
        .await?;
    assert_eq!(
        plugin
            .annotations()
            .get("bosun.dev/plugin-version")
            .map(String::as_str),
        Some("0.1.0")
    );
    assert_eq!(plugin.spec.sha256, digest);
    let sigs: Vec<(Option<String>, String)> = plugin
        .spec
        .signatures
        .iter()
        .map(|s| (s.key_id.clone(), s.signature.clone()))
        .collect();
    let want: Vec<(Option<String>, String)> = bundle
        .signatures
        .iter()
        .map(|s| (s.key_id.clone(), s.signature.clone()))
        .collect();
    assert_eq!(sigs, want);
    assert_eq!(
        serde_json::to_value(&plugin.spec.grants)?,
        json!({ "filesystem": [{ "path": "/etc", "access": "ReadOnly" }], "exec": [{ "command": "/usr/bin/uname", "args": [["-r"]] }] })
    );
    assert!(
        plugin
            .managed_fields()
            .iter()
            .any(|m| m.manager.as_deref() == Some("kubectl-bosun")),
        "{:?}",
        plugin.managed_fields()
    );
    let cm = Api::<ConfigMap>::namespaced(lab.client.clone(), "bosun-system")
        .get("plugin-hello")
        .await?;
    assert_eq!(
        cm.binary_data
            .as_ref()
            .and_then(|b| b.get("hello.wasm"))
            .map(|b| b.0.as_slice()),
        Some(wasm.as_slice())
    );

    // Publishing bytes the bundle was not made for is refused before anything is written.
    std::fs::write(&file, b"\0asm rebuilt")?;
    cli(
        lab,
        &[
            "plugin",
            "publish",
            file_s,
            "--grants",
            grants.to_str().unwrap(),
        ],
    )
    .await?
    .refused(&["rebuilt after signing", "sign it again"])?;
    Ok(())
}

/// Publishes hello with the CLI, runs a custom Operation over every node and follows it
/// with `status --watch`; then checks `status` (text, JSON), `logs`, and the refusals of a
/// finished Operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_status_watch_and_logs_of_a_real_operation() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    bosun_e2e::apply_crds(&lab.client).await?;
    let dir = target_dir().join("e2e-cli").join(unique("publish"));
    std::fs::create_dir_all(&dir)?;
    publish_hello_with_cli(&lab, &dir).await?;
    let (cps, workers) = (
        nodes_of(&lab, Role::ControlPlane),
        nodes_of(&lab, Role::Worker),
    );
    ensure!(
        cps.len() == 1 && workers.len() == 3,
        "expects the default lab (1 control plane, 3 workers)"
    );

    let mut op = Operator::start(&lab, "cli-status")?;
    let name = op
        .create_operation(
            "cli-status",
            json!({ "custom": { "groups": [
                { "name": "control-plane", "nodeSelector": cp_selector(),
                  "steps": [{ "name": "greet", "plugin": "hello", "action": "greet", "params": { "name": "cli" } }] },
                { "name": "workers", "nodeSelector": workers_selector(), "steps": [
                    { "name": "cordon", "runsOn": "controller", "action": "cordon" },
                    { "name": "greet", "plugin": "hello", "action": "greet", "params": { "name": "cli" } },
                    { "name": "uncordon", "runsOn": "controller", "action": "uncordon" } ] } ] },
              "rollout": { "maxUnavailable": 2 } }),
        )
        .await?;

    // `status --watch` ends by itself when the Operation finishes.
    let watch = tokio::process::Command::new(cli_binary()?)
        .args(["status", &name, "--watch", "--kubeconfig"])
        .arg(&lab.kubeconfig)
        .env("NO_COLOR", "1")
        .kill_on_drop(true)
        .output();
    let started = Instant::now();
    let watched = tokio::time::timeout(DEADLINE, watch).await;
    let watched = match watched {
        Ok(out) => out?,
        Err(_) => bail!(
            "status --watch did not end within {DEADLINE:?}; logs in {}",
            op.dir.display()
        ),
    };
    op.procs.check_alive()?;
    let text = String::from_utf8(watched.stdout)?;
    ensure!(
        watched.status.success(),
        "status --watch failed: {}\n{text}",
        String::from_utf8_lossy(&watched.stderr)
    );
    let renders: Vec<&str> = text.split("\n\nOperation ").collect();
    let last = renders.last().unwrap();
    ensure!(
        last.contains("  Succeeded  4/4 nodes finished  mode Auto"),
        "last render:\n{last}"
    );
    eprintln!(
        "status --watch printed {} renders in {:?}",
        renders.len(),
        started.elapsed()
    );

    let final_op = op
        .wait_operation(&name, "Succeeded", |o| {
            phase_of(o) == OperationPhase::Succeeded
        })
        .await?;
    let status = cli(&lab, &["status", &name]).await?.ok()?;
    eprintln!("{status}");
    ensure!(
        status.starts_with(&format!(
            "Operation {name}  Succeeded  4/4 nodes finished  mode Auto  age "
        )),
        "{status}"
    );
    ensure!(
        status.contains("\n  custom: groups control-plane → workers\n"),
        "{status}"
    );
    ensure!(
        status.contains("\ncontrol-plane  1/1 finished  (up to 1 at a time)\n"),
        "{status}"
    );
    ensure!(
        status.contains(&format!("└─ ✓ {}  Succeeded", cps[0])),
        "{status}"
    );
    ensure!(
        status.contains("\nworkers  3/3 finished  (up to 2 at a time)\n"),
        "{status}"
    );
    for (i, w) in workers.iter().enumerate() {
        let branch = if i + 1 == workers.len() {
            "└─"
        } else {
            "├─"
        };
        ensure!(
            status.contains(&format!("{branch} ✓ {w}  Succeeded")),
            "{w}:\n{status}"
        );
    }
    // Every step of every node, with its symbol; controller steps are marked.
    ensure!(
        status.matches("✓ greet     Succeeded").count() == 3,
        "{status}"
    );
    ensure!(
        status.matches("✓ cordon    Succeeded").count() == 3
            && status.matches("[controller]").count() == 6,
        "{status}"
    );
    ensure!(status.contains("└─ ✓ greet  Succeeded"), "{status}");
    // A succeeded step's outputs show under it: hello reports each node's os-release name.
    ensure!(
        status.matches("  os: ").count() == 4 && status.matches("  kernel: ").count() == 4,
        "{status}"
    );
    ensure!(!status.contains('\x1b'), "colour on a pipe");

    // -o json carries the same objects the API server holds.
    let doc: serde_json::Value =
        serde_json::from_str(&cli(&lab, &["status", &name, "-o", "json"]).await?.ok()?)?;
    assert_eq!(doc["operation"]["metadata"]["name"], json!(name));
    assert_eq!(doc["operation"]["status"]["progress"], json!("4/4"));
    assert_eq!(doc["operation"]["status"]["phase"], json!("Succeeded"));
    assert_eq!(doc["nodeTasks"].as_array().map(Vec::len), Some(4));
    let yaml = cli(&lab, &["status", &name, "-o", "yaml"]).await?.ok()?;
    ensure!(
        yaml.contains("nodeTasks:") && yaml.contains("phase: Succeeded"),
        "{yaml}"
    );

    // logs: the agent's log tail of the greet step, as it reported it.
    let logs = cli(&lab, &["logs", &name, &workers[0], "--step", "greet"])
        .await?
        .ok()?;
    ensure!(
        logs.starts_with("=== greet (Succeeded, attempt 1, "),
        "{logs}"
    );
    ensure!(logs.contains("greeting the node as cli"), "{logs}");
    let all = cli(&lab, &["logs", &name, &workers[0]]).await?.ok()?;
    ensure!(
        all.contains("=== cordon (Succeeded") && all.contains("=== uncordon (Succeeded"),
        "{all}"
    );
    cli(&lab, &["logs", &name, &workers[0], "--step", "nope"])
        .await?
        .refused(&["has no step nope; its steps are: cordon, greet, uncordon"])?;
    cli(&lab, &["logs", &name, "no-such-node"])
        .await?
        .refused(&["has no NodeTask for node no-such-node; its nodes are: "])?;

    // A finished Operation refuses every change, saying so.
    for args in [
        vec!["pause", name.as_str()],
        vec!["resume", &name],
        vec!["retry", &name, &workers[0]],
        vec!["approve", &name, "--all"],
    ] {
        cli(&lab, &args).await?.refused(&[&format!(
            "Operation {name} has already finished (Succeeded)"
        )])?;
    }
    cli(&lab, &["status", "no-such-operation"])
        .await?
        .refused(&["Operation no-such-operation not found"])?;
    // What the CLI printed is what the controller recorded: four tasks, all succeeded, the
    // Operation Complete with its start and completion times.
    let s = final_op
        .status
        .context("the finished Operation has no status")?;
    let c = &s.counts;
    assert_eq!(
        (
            c.planned,
            c.succeeded,
            c.blocked,
            c.skipped,
            c.pending,
            c.running
        ),
        (4, 4, 0, 0, 0, 0),
        "{s:?}"
    );
    assert_eq!(s.progress.as_deref(), Some("4/4"));
    let (started, completed) = (
        s.start_time.clone().context("no startTime")?,
        s.completion_time.clone().context("no completionTime")?,
    );
    ensure!(
        started.0 <= completed.0,
        "started {started:?} after completion {completed:?}"
    );
    let complete = s
        .conditions
        .iter()
        .find(|c| c.type_ == "Complete")
        .context("no Complete condition")?;
    assert_eq!(
        (complete.status.as_str(), complete.reason.as_str()),
        ("True", "AllTasksFinished")
    );
    op.finish().await?;
    Ok(())
}

/// A step that fails its preflight blocks its task; `retry` (with the controller stopped,
/// so the field can be seen before it acts) sets `recovery: Retry` and refuses a second
/// time; restarted, the controller runs the step again and it succeeds. On another task,
/// `skip` sets `recovery: Skip` and the Operation finishes without it. Refusals on the way:
/// wrong node, a task that is not blocked, approve in Auto mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_and_skip_a_blocked_task_and_refuse_wrong_states() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    bosun_e2e::apply_crds(&lab.client).await?;
    bosun_e2e::cluster::publish_hello(&lab).await?;
    let workers = nodes_of(&lab, Role::Worker);
    let marker = format!("/etc/{}", unique("bosun-cli-marker"));
    let mut op = Operator::start(&lab, "cli-recover")?;
    let name = op
        .create_operation(
            "cli-recover",
            json!({ "custom": { "groups": [
                { "name": "workers", "nodeSelector": workers_selector(),
                  "steps": [{ "name": "greet", "plugin": "hello", "action": "greet", "params": { "file": marker } }] } ] },
              "rollout": { "maxUnavailable": 1 } }),
        )
        .await?;
    let (w1, w2) = (&workers[0], &workers[1]);
    let op_blocked = op
        .wait_operation(&name, "Blocked", |o| phase_of(o) == OperationPhase::Blocked)
        .await?;
    let t1 = op.task(&name, w1).await?;
    ensure!(task_phase(&t1) == NodeTaskPhase::Blocked, "{:?}", t1.status);

    // status shows the reason and the exact commands.
    let status = cli(&lab, &["status", &name]).await?.ok()?;
    eprintln!("{status}");
    ensure!(
        status.contains(&format!("✗ {w1}  Blocked (PreflightFailed)")),
        "{status}"
    );
    ensure!(
        status.contains(&marker),
        "the blocking message names the missing file:\n{status}"
    );
    ensure!(
        status.contains(&format!(
            "fix the cause, then run the step again: kubectl bosun retry {name} {w1}"
        )),
        "{status}"
    );
    ensure!(
        status.contains(&format!(
            "or leave the node as it is and move on: kubectl bosun skip {name} {w1}"
        )),
        "{status}"
    );
    ensure!(status.contains(&format!("· {w2}  Pending")), "{status}");

    // Refusals, each naming the state found.
    cli(&lab, &["retry", &name, w2]).await?.refused(&[&format!(
        "({w2}) is Pending, not Blocked: retry only acts on a task that a failed step blocked"
    )])?;
    cli(&lab, &["skip", &name, "lab-nowhere"])
        .await?
        .refused(&["has no NodeTask for node lab-nowhere"])?;
    cli(&lab, &["approve", &name, w1])
        .await?
        .refused(&[&format!("Operation {name} runs in Auto mode")])?;
    cli(&lab, &["resume", &name])
        .await?
        .refused(&["is not paused; nothing to resume"])?;

    // retry with the controller stopped: the field is set, a second retry is refused.
    op.kill("controller")?;
    let out = cli(&lab, &["retry", &name, w1]).await?.ok()?;
    ensure!(
        out.contains("recovery: Retry set on NodeTask") && out.contains("runs step greet"),
        "{out}"
    );
    let t1 = op.task(&name, w1).await?;
    assert_eq!(t1.spec.recovery, Some(Recovery::Retry));
    ensure!(
        t1.managed_fields()
            .iter()
            .any(|m| m.manager.as_deref() == Some("kubectl-bosun")),
        "the write is recorded under the CLI's field manager"
    );
    cli(&lab, &["retry", &name, w1])
        .await?
        .refused(&["already has recovery: Retry set and the controller has not acted on it yet"])?;
    let status = cli(&lab, &["status", &name]).await?.ok()?;
    ensure!(
        status.contains("recovery Retry requested; waiting for the controller to act on it"),
        "{status}"
    );

    // Fix the cause on w1 only, restart the controller: w1 succeeds on its second attempt.
    let root = lab
        .nodes
        .iter()
        .find(|n| &n.name == w1)
        .unwrap()
        .host_root
        .clone();
    // hello's `file` parameter names an os-release style file: give it a name to read.
    std::fs::write(
        root.join(marker.trim_start_matches('/')),
        "PRETTY_NAME=\"fixed by the cli test\"\n",
    )?;
    op.start_controller()?;
    let t1 = op
        .wait_task(&name, w1, "Succeeded after retry", |t| {
            task_phase(t) == NodeTaskPhase::Succeeded
        })
        .await?;
    let greet = t1
        .status
        .as_ref()
        .unwrap()
        .steps
        .iter()
        .find(|s| s.name == "greet")
        .unwrap()
        .clone();
    assert_eq!(greet.phase, StepPhase::Succeeded);
    ensure!(greet.attempts >= 2, "the step ran again: {greet:?}");
    assert_eq!(
        t1.spec.recovery, None,
        "the controller clears recovery once it acted"
    );

    // w2 blocks the same way (no marker there): skip it.
    op.wait_task(&name, w2, "Blocked", |t| {
        task_phase(t) == NodeTaskPhase::Blocked
    })
    .await?;
    let out = cli(&lab, &["skip", &name, w2]).await?.ok()?;
    ensure!(out.contains("recovery: Skip set on NodeTask"), "{out}");
    let t2 = op
        .wait_task(&name, w2, "Skipped", |t| {
            task_phase(t) == NodeTaskPhase::Skipped
        })
        .await?;
    assert_eq!(t2.spec.recovery, None);
    // w3 blocks too; skip it and the Operation finishes.
    let w3 = &workers[2];
    op.wait_task(&name, w3, "Blocked", |t| {
        task_phase(t) == NodeTaskPhase::Blocked
    })
    .await?;
    cli(&lab, &["skip", &name, w3]).await?.ok()?;
    let done = op
        .wait_operation(&name, "Succeeded", |o| {
            phase_of(o) == OperationPhase::Succeeded
        })
        .await?;
    assert_eq!(done.status.unwrap().progress.as_deref(), Some("3/3"));
    let status = cli(&lab, &["status", &name]).await?.ok()?;
    ensure!(
        status.contains(&format!("↷ {w2}  Skipped"))
            && status.contains(&format!("✓ {w1}  Succeeded  attempt")),
        "{status}"
    );
    cli(&lab, &["skip", &name, w2])
        .await?
        .refused(&["has already finished"])?;
    // The Blocked Operation the CLI showed: w1's task blocked by its preflight, the
    // Operation's message and Blocked condition naming the node and the missing file.
    let s = op_blocked
        .status
        .context("the Blocked Operation has no status")?;
    assert_eq!(
        (s.counts.planned, s.counts.blocked, s.counts.succeeded),
        (3, 1, 0),
        "{s:?}"
    );
    let message = s.message.clone().unwrap_or_default();
    ensure!(
        message.contains(&format!("{w1}: ")) && message.contains(&marker),
        "Operation message: {message}"
    );
    let blocked = s
        .conditions
        .iter()
        .find(|c| c.type_ == "Blocked")
        .context("no Blocked condition")?;
    assert_eq!(
        (blocked.status.as_str(), blocked.reason.as_str()),
        ("True", "PreflightFailed")
    );
    op.finish().await?;
    Ok(())
}

/// Controlled mode: tasks wait for `approve`; `pause`/`resume` flip `spec.paused` and
/// refuse a second time; `approve` refuses unknown nodes, a second approval and, at the
/// end, a finished Operation; `approve --all` lets the rest run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_pause_and_resume_in_controlled_mode() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    bosun_e2e::apply_crds(&lab.client).await?;
    bosun_e2e::cluster::publish_hello(&lab).await?;
    let workers = nodes_of(&lab, Role::Worker);
    let mut op = Operator::start(&lab, "cli-approve")?;
    let name = op
        .create_operation(
            "cli-approve",
            json!({ "executionMode": "Controlled",
                    "custom": { "groups": [ { "name": "workers", "nodeSelector": workers_selector(),
                      "steps": [{ "name": "greet", "plugin": "hello", "action": "greet" }] } ] },
                    "rollout": { "maxUnavailable": 1 } }),
        )
        .await?;
    let (w1, w2) = (&workers[0], &workers[1]);
    op.wait_task(&name, w1, "AwaitingApproval", |t| {
        task_phase(t) == NodeTaskPhase::AwaitingApproval
    })
    .await?;
    let status = cli(&lab, &["status", &name]).await?.ok()?;
    ensure!(
        status.contains(&format!("? {w1}  AwaitingApproval")),
        "{status}"
    );
    ensure!(
        status.contains(&format!(
            "waiting for approval: kubectl bosun approve {name} {w1}"
        )),
        "{status}"
    );

    cli(&lab, &["retry", &name, w1]).await?.refused(&[
        "is AwaitingApproval, not Blocked",
        &format!("kubectl bosun approve {name} {w1}"),
    ])?;
    cli(&lab, &["approve", &name, w1, "lab-nowhere"])
        .await?
        .refused(&["has no NodeTask for node lab-nowhere"])?;
    // All or nothing: the refusal above wrote nothing.
    assert!(!op.task(&name, w1).await?.spec.approve);
    // Neither nodes nor --all: a usage error from the argument parser (exit 2).
    let run = cli(&lab, &["approve", &name]).await?;
    ensure!(
        run.code == 2 && run.stderr.contains("<NODE|--all>"),
        "{run:?}"
    );

    // pause, then a second pause is refused.
    let out = cli(&lab, &["pause", &name]).await?.ok()?;
    ensure!(out.contains(&format!("paused {name}")), "{out}");
    let ops: Api<bosun_api::Operation> = Api::all(lab.client.clone());
    assert!(ops.get(&name).await?.spec.paused);
    cli(&lab, &["pause", &name]).await?.refused(&[&format!(
        "already paused; resume it with `kubectl bosun resume {name}`"
    )])?;
    let status = cli(&lab, &["status", &name]).await?.ok()?;
    ensure!(
        status.lines().next().unwrap_or("").ends_with("PAUSED"),
        "{status}"
    );

    // approve w1 (allowed while paused), then resume.
    let out = cli(&lab, &["approve", &name, w1]).await?.ok()?;
    ensure!(out.contains(&format!("approved {w1}")), "{out}");
    assert!(op.task(&name, w1).await?.spec.approve);
    cli(&lab, &["approve", &name, w1])
        .await?
        .refused(&["is already approved"])?;
    cli(&lab, &["resume", &name]).await?.ok()?;
    assert!(!ops.get(&name).await?.spec.paused);
    cli(&lab, &["resume", &name])
        .await?
        .refused(&["is not paused"])?;

    op.wait_task(&name, w1, "Succeeded", |t| {
        task_phase(t) == NodeTaskPhase::Succeeded
    })
    .await?;
    // w2 does not start without approval.
    let t2 = op
        .wait_task(&name, w2, "AwaitingApproval", |t| {
            task_phase(t) == NodeTaskPhase::AwaitingApproval
        })
        .await?;
    assert!(!t2.spec.approve);
    cli(&lab, &["approve", &name, w1]).await?.refused(&[
        "is Succeeded: approval lets a task start, and this one has already finished",
    ])?;
    let out = cli(&lab, &["approve", &name, "--all"]).await?.ok()?;
    ensure!(
        out.contains(&format!("approved {w2}"))
            && out.contains(&format!("approved {}", workers[2])),
        "{out}"
    );
    let done = op
        .wait_operation(&name, "Succeeded", |o| {
            phase_of(o) == OperationPhase::Succeeded
        })
        .await?;
    assert_eq!(done.spec.execution_mode, ExecutionMode::Controlled);
    cli(&lab, &["approve", &name, "--all"])
        .await?
        .refused(&["has already finished (Succeeded)"])?;
    op.finish().await?;
    Ok(())
}

/// `kubectl bosun version` prints the client's version and the running controller's, which
/// the controller wrote on its leader-election Lease; `--client` does not connect. One
/// version everywhere (issue 34): both binaries come from this workspace, so they print the
/// same version and commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_shows_the_client_and_the_running_controller() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    bosun_e2e::apply_crds(&lab.client).await?;
    let client_only = cli(&lab, &["version", "--client"]).await?.ok()?;
    let client_line = client_only.trim_end();
    let client_version = client_line
        .strip_prefix("Client Version: ")
        .with_context(|| format!("`version --client` printed {client_only:?}"))?;
    ensure!(
        client_version.starts_with(&format!("{} (commit ", env!("CARGO_PKG_VERSION")))
            && client_only.lines().count() == 1,
        "`version --client` prints only the workspace's version and commit: {client_only:?}"
    );

    let op = Operator::start(&lab, "version")?;
    let lease_name = format!("bosun-controller-{}", op.instance);
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(lab.client.clone(), "bosun-system");
    let started = Instant::now();
    while leases
        .get_opt(&lease_name)
        .await?
        .is_none_or(|l| l.spec.and_then(|s| s.holder_identity).is_none())
    {
        ensure!(
            started.elapsed() < DEADLINE,
            "the controller took no Lease {lease_name} within {DEADLINE:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let out = cli(&lab, &["version"]).await?.ok()?;
    ensure!(
        out.lines().next() == Some(client_line),
        "the first line is the client's: {out}"
    );
    let controller = out
        .lines()
        .find(|l| l.contains(&format!("(Lease {lease_name}, held by ")))
        .with_context(|| format!("no line for Lease {lease_name}:\n{out}"))?;
    ensure!(
        controller.starts_with(&format!("Controller Version: {client_version} (Lease ")),
        "the controller built from this workspace reports the client's version and commit: {controller}"
    );
    op.finish().await
}
