//! Plugins fetched over the network, end to end: the real controller and one real agent per
//! lab node run Operations whose steps use a Plugin with a `url` source (a loopback https
//! server with a test CA, given to the agents with `--plugin-ca-file`) and a Plugin with an
//! `oci` source (a real OCI registry, `crane registry serve`, with the artifact pushed by
//! the real `oras push`; plain http to it is allowed only because the agents get
//! `--insecure-registry HOST:PORT`).
//!
//! crane and oras are built from the Go module proxy by tests/lab/build-registry.sh (cached
//! under ~/.cache/bosun/registry; a no-op once built), which the tests run themselves.
//!
//! The Plugin names (`hello`, `e2e-steps`) are cluster-scoped and shared with other tests,
//! so each test here re-applies them with its own source while holding
//! `bosun_e2e::lock_lab_nodes` (tests of this binary run one at a time), and other test
//! binaries re-publish them before use. Build the binaries first:
//! `cargo build -p bosun-controller -p bosun-agent`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use bosun_api::node_task::{BlockReason, NodeTaskPhase, StepPhase};
use bosun_api::operation::OperationPhase;
use bosun_e2e::cluster::apply_plugin;
use bosun_e2e::operator::phase_of;
use bosun_e2e::{DEADLINE, Operator, Processes, unique};
use bosun_lab::{LabHandle, Role};
use bosun_trust::Digest;
use kube::ResourceExt;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The directory the `e2e-steps` plugin is granted (read-write) in each host root.
const STATE_DIR: &str = "/var/lib/bosun-e2e";

/// The artifact type the tests push plugins with (any value works; the layer's media type
/// is what the agent looks for).
const ARTIFACT_TYPE: &str = "application/vnd.bosun.plugin.v1";

/// The layer media type agents look for: the WASM OCI artifact convention (written out
/// here rather than taken from the agent, since it is the public contract).
const WASM_LAYER: &str = "application/vnd.wasm.content.layer.v1+wasm";

/// A loopback https server with its own CA, serving a mutable set of files.
struct Https {
    /// `https://127.0.0.1:PORT`
    url: String,
    /// The CA certificate (PEM) the server's certificate chains to.
    ca_file: PathBuf,
    /// Path → bytes served (200); any other path is a 404.
    files: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    /// Requests answered, by path.
    hits: Arc<Mutex<HashMap<String, usize>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Https {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Https {
    async fn start(dir: &Path) -> Result<Https> {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "bosun e2e plugin CA");
        let ca_cert = ca.self_signed(&ca_key)?;
        let key = rcgen::KeyPair::generate()?;
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])?
            .signed_by(&key, &ca_cert, &ca_key)?;
        std::fs::create_dir_all(dir)?;
        let ca_file = dir.join("plugin-ca.pem");
        std::fs::write(&ca_file, ca_cert.pem())?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("https://{}", listener.local_addr()?);
        let files: Arc<Mutex<HashMap<String, Vec<u8>>>> = Arc::default();
        let hits: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let (served, counted) = (files.clone(), hits.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (acceptor, served, counted) =
                    (acceptor.clone(), served.clone(), counted.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match tls.read(&mut byte).await {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    let text = String::from_utf8_lossy(&head).to_string();
                    let path = text.split(' ').nth(1).unwrap_or_default().to_string();
                    *counted.lock().unwrap().entry(path.clone()).or_default() += 1;
                    let body = served.lock().unwrap().get(&path).cloned();
                    let (status, body) = match body {
                        Some(b) => ("200 OK", b),
                        None => ("404 Not Found", b"not found\n".to_vec()),
                    };
                    let head = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = tls.write_all(head.as_bytes()).await;
                    let _ = tls.write_all(&body).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        Ok(Https {
            url,
            ca_file,
            files,
            hits,
            task,
        })
    }

    fn serve(&self, path: &str, bytes: Vec<u8>) {
        self.files.lock().unwrap().insert(path.into(), bytes);
    }

    fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

/// A real OCI registry (`crane registry serve`, in memory, plain http on loopback) and the
/// `oras` client that pushes to it.
struct Registry {
    /// `127.0.0.1:PORT`
    host: String,
    bin: PathBuf,
    dir: PathBuf,
    procs: Processes,
}

impl Registry {
    fn start(dir: &Path) -> Result<Registry> {
        let bin = bosun_e2e::paths::go_tool_dir("build-registry.sh")?;
        let mut procs = Processes::new(dir)?;
        // Port 0: crane picks a free port and logs it, so parallel labs never collide.
        procs.spawn(
            "registry",
            Command::new(bin.join("crane")).args(["registry", "serve", "--address", "127.0.0.1:0"]),
        )?;
        let log = procs.log_of("registry");
        let started = Instant::now();
        let port = loop {
            procs.check_alive()?;
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(port) = text
                .lines()
                .find_map(|l| l.split("serving on port ").nth(1))
                .map(|p| p.trim().to_string())
            {
                break port;
            }
            if started.elapsed() > DEADLINE {
                bail!(
                    "crane registry serve did not report its port within {DEADLINE:?}; log: {}",
                    log.display()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        Ok(Registry {
            host: format!("127.0.0.1:{port}"),
            bin,
            dir: dir.to_path_buf(),
            procs,
        })
    }

    /// `oras push --plain-http HOST/REPO:TAG plugin.wasm:MEDIA_TYPE` (with [`WASM_LAYER`]:
    /// the standard way to publish a component as an OCI artifact).
    fn push(&self, repository_tag: &str, wasm: &[u8], media_type: &str) -> Result<String> {
        let work = self.dir.join(unique("push"));
        std::fs::create_dir_all(&work)?;
        std::fs::write(work.join("plugin.wasm"), wasm)?;
        let reference = format!("{}/{repository_tag}", self.host);
        let out = Command::new(self.bin.join("oras"))
            .current_dir(&work)
            .env("HOME", &work) // oras keeps its credential store under $HOME; none is used
            .args([
                "push",
                "--plain-http",
                "--artifact-type",
                ARTIFACT_TYPE,
                &reference,
            ])
            .arg(format!("plugin.wasm:{media_type}"))
            .output()
            .context("running oras push")?;
        ensure!(
            out.status.success(),
            "oras push {reference} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(reference)
    }

    /// The registry's request log (crane logs one line per request).
    fn log(&self) -> String {
        std::fs::read_to_string(self.procs.log_of("registry")).unwrap_or_default()
    }
}

/// The grants of the `hello` plugin (as `publish_hello` gives them).
fn hello_grants() -> serde_json::Value {
    json!({ "filesystem": [{ "path": "/etc", "access": "ReadOnly" }], "exec": [{ "command": "/usr/bin/uname", "args": [["-r"]] }] })
}

/// The grants of the `e2e-steps` plugin (as the operator_control tests give them).
fn steps_grants() -> serde_json::Value {
    json!({ "filesystem": [{ "path": "/etc", "access": "ReadOnly" }, { "path": STATE_DIR, "access": "ReadWrite" }] })
}

/// CRDs, `uname` in the host roots (for hello), `STATE_DIR` in the host roots (for
/// e2e-steps), and the two plugins' bytes.
async fn setup(lab: &LabHandle) -> Result<(Vec<u8>, Vec<u8>)> {
    bosun_e2e::apply_crds(&lab.client).await?;
    // Publishes hello through a ConfigMap and copies uname into the host roots; the test
    // then re-applies the Plugin with its own source.
    bosun_e2e::cluster::publish_hello(lab).await?;
    for node in &lab.nodes {
        std::fs::create_dir_all(node.host_root.join(STATE_DIR.trim_start_matches('/')))?;
    }
    Ok((
        bosun_e2e::build_plugin("bosun-plugin-hello")?,
        bosun_e2e::build_plugin("bosun-test-steps")?,
    ))
}

fn control_plane(lab: &LabHandle) -> Result<String> {
    lab.nodes
        .iter()
        .find(|n| n.role == Role::ControlPlane)
        .map(|n| n.name.clone())
        .context("the lab has no control-plane node")
}

/// The agent's store holds `digest` (its `<hex>.wasm` file hashes to it).
fn stored(operator: &Operator, node: &str, digest: &Digest) -> bool {
    let path = operator
        .dir
        .join(format!("plugins-{node}"))
        .join(format!("{}.wasm", digest.to_hex()));
    std::fs::read(path).is_ok_and(|b| Digest::of(&b) == *digest)
}

/// Waits until the controller acted on the `recovery: Retry` set on `node`'s task (cleared
/// it, the task left Blocked) and the Operation left Blocked, then until it settles again
/// (without the middle wait, the Operation's old Blocked phase would count as settled).
async fn settle_after_retry(
    operator: &mut Operator,
    op: &str,
    node: &str,
) -> Result<bosun_api::operation::Operation> {
    operator
        .wait_task(op, node, "recovery acted on", |t| {
            t.spec.recovery.is_none()
                && t.status
                    .as_ref()
                    .is_some_and(|s| s.phase != NodeTaskPhase::Blocked)
        })
        .await?;
    operator
        .wait_operation(op, "no longer Blocked", |o| {
            phase_of(o) != OperationPhase::Blocked
        })
        .await?;
    operator.wait_settled(op).await
}

/// `kubectl-bosun plugin sign` with the e2e key, then `kubectl-bosun plugin publish FILE
/// --name NAME --version 0.1.0 --grants <steps grants> EXTRA...`; returns its stdout.
async fn publish_with_cli(
    lab: &LabHandle,
    dir: &Path,
    name: &str,
    wasm: &[u8],
    extra: &[&str],
) -> Result<String> {
    let cli = bosun_e2e::binary("kubectl-bosun")?;
    let file = dir.join(format!("{name}.wasm"));
    std::fs::write(&file, wasm)?;
    let (_, pub_path) = bosun_e2e::cluster::signing_key()?;
    let key = pub_path.with_file_name("e2e.key");
    let sign = Command::new(&cli)
        .args(["plugin", "sign", "--key"])
        .arg(&key)
        .args(["--name", name, "--version", "0.1.0"])
        .arg(&file)
        .output()?;
    ensure!(
        sign.status.success(),
        "plugin sign failed: {}",
        String::from_utf8_lossy(&sign.stderr)
    );
    let grants = dir.join(format!("{name}-grants.yaml"));
    std::fs::write(&grants, serde_yaml::to_string(&steps_grants())?)?;
    let publish = Command::new(&cli)
        .args(["plugin", "publish"])
        .arg(&file)
        .args(["--name", name, "--version", "0.1.0", "--grants"])
        .arg(&grants)
        .args(extra)
        .arg("--kubeconfig")
        .arg(&lab.kubeconfig)
        .env_remove("KUBECONFIG")
        .output()?;
    let stdout = String::from_utf8_lossy(&publish.stdout).to_string();
    ensure!(
        publish.status.success(),
        "plugin publish failed: {stdout}{}",
        String::from_utf8_lossy(&publish.stderr)
    );
    Ok(stdout)
}

/// A custom Operation over every lab node whose steps use `hello` from an https URL and
/// `e2e-steps` from an OCI registry (published with `kubectl-bosun plugin publish --oci`)
/// runs to Succeeded: every agent fetched both plugins (its own store holds both digests),
/// verified and ran them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_and_oci_sources_run_a_custom_operation_to_succeeded() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (hello, steps) = setup(&lab).await?;
    let dir = bosun_e2e::target_dir()
        .join("e2e-plugin-sources")
        .join(unique("ok"));
    let https = Https::start(&dir).await?;
    https.serve("/plugins/hello-0.1.0.wasm", hello.clone());
    let registry = Registry::start(&dir)?;
    let reference = registry.push("bosun/e2e-steps:0.1.0", &steps, WASM_LAYER)?;

    apply_plugin(
        &lab.client,
        "hello",
        "0.1.0",
        &hello,
        json!({ "url": { "url": format!("{}/plugins/hello-0.1.0.wasm", https.url) } }),
        hello_grants(),
    )
    .await?;
    // The OCI Plugin is published the way a user would: signed and published with the CLI.
    let out = publish_with_cli(&lab, &dir, "e2e-steps", &steps, &["--oci", &reference]).await?;
    assert!(
        out.contains(&format!("source: OCI artifact {reference}")),
        "{out}"
    );
    let published = kube::Api::<bosun_api::Plugin>::all(lab.client.clone())
        .get("e2e-steps")
        .await?;
    assert_eq!(
        published
            .spec
            .source
            .oci
            .as_ref()
            .map(|o| o.reference.as_str()),
        Some(reference.as_str())
    );
    assert!(
        published.spec.source.config_map.is_none() && published.spec.source.url.is_none(),
        "{:?}",
        published.spec.source
    );
    assert_eq!(published.spec.sha256, Digest::of(&steps).to_string());
    let args = [
        "--plugin-ca-file".to_string(),
        https.ca_file.display().to_string(),
        "--insecure-registry".to_string(),
        registry.host.clone(),
    ];
    let mut operator = Operator::start_with_agent_args(&lab, "sources", &args)?;

    let op = operator
        .create_operation(
            "sources",
            json!({ "custom": { "groups": [{ "name": "all", "steps": [
                { "name": "greet", "plugin": "hello", "action": "greet", "params": { "name": "sources" } },
                { "name": "nap", "plugin": "e2e-steps", "action": "sleep", "params": { "millis": 1 } },
            ] }] } }),
        )
        .await?;
    operator.wait_succeeded(&op).await?;
    let tasks = operator.tasks(&op).await?;
    assert_eq!(tasks.len(), lab.nodes.len());
    for node in &lab.nodes {
        let ts = tasks[&node.name].status.clone().unwrap_or_default();
        assert_eq!(
            ts.phase,
            NodeTaskPhase::Succeeded,
            "{}: {:?}",
            node.name,
            ts.message
        );
        let greet = ts
            .steps
            .iter()
            .find(|s| s.name == "greet")
            .context("no greet status")?;
        // hello (from the URL) really ran against this node's host root.
        assert_eq!(greet.outputs.get("os"), Some(&node.os), "{}", node.name);
        assert!(
            ts.steps.iter().all(|s| s.phase == StepPhase::Succeeded),
            "{}: {:?}",
            node.name,
            ts.steps
        );
        assert!(
            stored(&operator, &node.name, &Digest::of(&hello)),
            "{}: hello not in the store",
            node.name
        );
        assert!(
            stored(&operator, &node.name, &Digest::of(&steps)),
            "{}: e2e-steps not in the store",
            node.name
        );
    }
    // Each agent fetched each plugin itself: from the https server and from the registry.
    assert!(
        https.hits("/plugins/hello-0.1.0.wasm") >= lab.nodes.len(),
        "https hits: {}",
        https.hits("/plugins/hello-0.1.0.wasm")
    );
    let log = registry.log();
    let layer_gets = log
        .lines()
        .filter(|l| {
            l.contains(&format!(
                "GET /v2/bosun/e2e-steps/blobs/{}",
                Digest::of(&steps)
            ))
        })
        .count();
    assert!(
        layer_gets >= lab.nodes.len(),
        "the wasm blob was pulled {layer_gets} times:\n{log}"
    );
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// An `oci` source naming a tag nobody pushed: the step blocks the task as
/// PluginUnavailable with the registry's 404, the reference and the fix, and nothing is
/// stored. Then the tag is pushed the wrong way (oras's default layer media type, no wasm
/// layer): the retry blocks again, naming the layer found and the right push command. Once
/// the artifact is pushed with the wasm layer, the next retry succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_then_wrongly_pushed_oci_artifact_blocks_with_the_fix_then_retry_after_pushing_succeeds()
-> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (_, steps) = setup(&lab).await?;
    let cp = control_plane(&lab)?;
    let dir = bosun_e2e::target_dir()
        .join("e2e-plugin-sources")
        .join(unique("oci404"));
    let registry = Registry::start(&dir)?;
    let tag = unique("v");
    let reference = format!("{}/bosun/e2e-steps:{tag}", registry.host);
    apply_plugin(
        &lab.client,
        "e2e-steps",
        "0.1.0",
        &steps,
        json!({ "oci": { "reference": reference } }),
        steps_grants(),
    )
    .await?;
    let mut operator = Operator::start_with_agent_args(
        &lab,
        "oci404",
        &["--insecure-registry".to_string(), registry.host.clone()],
    )?;

    let op = operator
        .create_operation(
            "oci404",
            json!({ "custom": { "groups": [{ "name": "control-plane",
                "nodeSelector": { "matchExpressions": [{ "key": "node-role.kubernetes.io/control-plane", "operator": "Exists" }] },
                "steps": [{ "name": "nap", "plugin": "e2e-steps", "action": "sleep", "params": { "millis": 1 } }] }] } }),
        )
        .await?;
    let blocked = operator.wait_settled(&op).await?;
    assert_eq!(
        phase_of(&blocked),
        OperationPhase::Blocked,
        "{:?}",
        blocked.status.and_then(|s| s.message)
    );
    let task = operator.task(&op, &cp).await?;
    let ts = task.status.clone().unwrap_or_default();
    assert_eq!(
        (ts.phase, ts.reason),
        (NodeTaskPhase::Blocked, Some(BlockReason::PluginUnavailable))
    );
    let message = ts.message.clone().unwrap_or_default();
    assert!(
        message.contains("404")
            && message.contains(&format!("bosun/e2e-steps:{tag}"))
            && message.contains("push the artifact"),
        "{message}"
    );
    let nap = ts
        .steps
        .iter()
        .find(|s| s.name == "nap")
        .context("no nap status")?;
    assert_eq!(
        nap.error.as_ref().map(|e| (e.code.as_str(), e.retryable)),
        Some(("plugin-unavailable", true))
    );
    assert!(
        !stored(&operator, &cp, &Digest::of(&steps)),
        "nothing stored"
    );

    // A wrong push: the component as a plain OCI layer (oras's default media type).
    registry.push(
        &format!("bosun/e2e-steps:{tag}"),
        &steps,
        "application/vnd.oci.image.layer.v1.tar",
    )?;
    operator
        .patch_task_spec(&task.name_any(), json!({ "recovery": "Retry" }))
        .await?;
    operator
        .wait_task(&op, &cp, "blocked again, on attempt 2", |t| {
            t.spec.recovery.is_none()
                && t.status
                    .as_ref()
                    .is_some_and(|s| s.phase == NodeTaskPhase::Blocked && s.attempts == 2)
        })
        .await?;
    let message = operator
        .task(&op, &cp)
        .await?
        .status
        .and_then(|s| s.message)
        .unwrap_or_default();
    assert!(
        message.contains(&format!("has no layer of media type {WASM_LAYER}"))
            && message.contains("application/vnd.oci.image.layer.v1.tar")
            && message.contains("oras push"),
        "{message}"
    );
    assert!(
        !stored(&operator, &cp, &Digest::of(&steps)),
        "nothing stored"
    );

    // Fix: push the artifact with the wasm layer, then retry.
    registry.push(&format!("bosun/e2e-steps:{tag}"), &steps, WASM_LAYER)?;
    operator
        .patch_task_spec(&task.name_any(), json!({ "recovery": "Retry" }))
        .await?;
    let done = settle_after_retry(&mut operator, &op, &cp).await?;
    assert_eq!(
        phase_of(&done),
        OperationPhase::Succeeded,
        "{}",
        bosun_e2e::describe_tasks(&operator.client, &op).await
    );
    let ts = operator.task(&op, &cp).await?.status.unwrap_or_default();
    assert_eq!((ts.phase, ts.attempts), (NodeTaskPhase::Succeeded, 3));
    assert!(stored(&operator, &cp, &Digest::of(&steps)));
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// A `url` source serving other bytes than the pinned ones: the task blocks as
/// PluginUnavailable saying which digest was found and which is pinned, and the bytes are
/// not stored (or run). Once the server serves the signed bytes, `recovery: Retry`
/// succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_bytes_at_a_url_block_with_the_digests_then_retry_after_fixing_the_server_succeeds()
-> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (hello, steps) = setup(&lab).await?;
    let cp = control_plane(&lab)?;
    let dir = bosun_e2e::target_dir()
        .join("e2e-plugin-sources")
        .join(unique("baddigest"));
    let https = Https::start(&dir).await?;
    // Another (validly signed, even) component at hello's URL: only the pin can tell.
    https.serve("/hello.wasm", steps.clone());
    apply_plugin(
        &lab.client,
        "hello",
        "0.1.0",
        &hello,
        json!({ "url": { "url": format!("{}/hello.wasm", https.url) } }),
        hello_grants(),
    )
    .await?;
    let mut operator = Operator::start_with_agent_args(
        &lab,
        "baddigest",
        &[
            "--plugin-ca-file".to_string(),
            https.ca_file.display().to_string(),
        ],
    )?;

    let op = operator
        .create_operation(
            "baddigest",
            json!({ "custom": { "groups": [{ "name": "control-plane",
                "nodeSelector": { "matchExpressions": [{ "key": "node-role.kubernetes.io/control-plane", "operator": "Exists" }] },
                "steps": [{ "name": "greet", "plugin": "hello", "action": "greet", "params": { "name": "sources" } }] }] } }),
        )
        .await?;
    let blocked = operator.wait_settled(&op).await?;
    assert_eq!(
        phase_of(&blocked),
        OperationPhase::Blocked,
        "{:?}",
        blocked.status.and_then(|s| s.message)
    );
    let task = operator.task(&op, &cp).await?;
    let ts = task.status.clone().unwrap_or_default();
    assert_eq!(
        (ts.phase, ts.reason),
        (NodeTaskPhase::Blocked, Some(BlockReason::PluginUnavailable))
    );
    let message = ts.message.clone().unwrap_or_default();
    assert!(
        message.contains(&Digest::of(&steps).to_string())
            && message.contains(&Digest::of(&hello).to_string())
            && message.contains("is pinned"),
        "{message}"
    );
    assert!(
        !stored(&operator, &cp, &Digest::of(&hello))
            && !stored(&operator, &cp, &Digest::of(&steps)),
        "nothing stored"
    );

    https.serve("/hello.wasm", hello.clone());
    operator
        .patch_task_spec(&task.name_any(), json!({ "recovery": "Retry" }))
        .await?;
    let done = settle_after_retry(&mut operator, &op, &cp).await?;
    assert_eq!(
        phase_of(&done),
        OperationPhase::Succeeded,
        "{}",
        bosun_e2e::describe_tasks(&operator.client, &op).await
    );
    assert!(stored(&operator, &cp, &Digest::of(&hello)));
    assert_eq!(https.hits("/hello.wasm"), 2, "fetched once per attempt");
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}
