//! The lab's life cycle: `up` (idempotent: starts what is missing, reuses what runs), `status`,
//! `down`, all serialised by a lock file in the state directory.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde::{Deserialize, Serialize};

use crate::binaries::BinDir;
use crate::error::{LabError, Result};
use crate::kubeadm::{self, KubeadmConfig, SERVICE_SUBNET};
use crate::nodes::{self, LabNode, RootContext};
use crate::options::{LabOptions, Ports};
use crate::process::{self, Daemon};

/// How long `up` waits for etcd's port and the API server's `/readyz`.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `down` lets a process shut down after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(15);
/// Component names in start order.
const ETCD: &str = "etcd";
const APISERVER: &str = "kube-apiserver";
const CONTROLLER_MANAGER: &str = "kube-controller-manager";

/// The files of one lab's state directory.
#[derive(Clone, Debug)]
pub struct LabPaths {
    /// The state directory itself.
    pub state_dir: PathBuf,
    /// The lab's kubeadm configuration.
    pub kubeadm_config: PathBuf,
    /// The PKI kubeadm made (`certificatesDir`), used by the running control plane.
    pub pki: PathBuf,
    /// The kubeconfigs kubeadm made.
    pub kubeconfig_dir: PathBuf,
    /// etcd's data directory.
    pub etcd_data: PathBuf,
    /// What the last `up` recorded.
    pub state_file: PathBuf,
    /// The API server's audit log: every write (create, update, patch, delete) with who
    /// made it (user, `User-Agent`) and when, at the `Metadata` level.
    pub audit_log: PathBuf,
    /// The audit policy the API server runs with.
    pub audit_policy: PathBuf,
    lock: PathBuf,
}

impl LabPaths {
    /// The paths under `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            state_dir: state_dir.to_path_buf(),
            kubeadm_config: state_dir.join("kubeadm.yaml"),
            pki: state_dir.join("pki"),
            kubeconfig_dir: state_dir.join("kubeconfig"),
            etcd_data: state_dir.join("etcd"),
            state_file: state_dir.join("state.json"),
            audit_log: state_dir.join("logs").join("audit.log"),
            audit_policy: state_dir.join("audit-policy.yaml"),
            lock: state_dir.join("lock"),
        }
    }

    /// The super-admin kubeconfig (group `system:masters`) every lab client uses.
    pub fn super_admin_kubeconfig(&self) -> PathBuf {
        self.kubeconfig_dir.join("super-admin.conf")
    }

    /// The control-plane daemons in start order.
    pub fn daemons(&self) -> [Daemon; 3] {
        [
            Daemon::new(&self.state_dir, ETCD),
            Daemon::new(&self.state_dir, APISERVER),
            Daemon::new(&self.state_dir, CONTROLLER_MANAGER),
        ]
    }
}

/// What `up` recorded about the lab it started.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LabState {
    /// Kubernetes version of the binaries (and of kubeadm's configuration).
    pub kubernetes_version: String,
    /// Where the binaries are.
    pub bin_dir: PathBuf,
    /// First port; see [`Ports`].
    pub port_base: u16,
    /// The ports.
    pub ports: Ports,
    /// The simulated nodes.
    pub nodes: Vec<LabNode>,
}

impl LabState {
    /// Reads the state file; `None` when the lab was never started in this directory.
    pub fn load(paths: &LabPaths) -> Result<Option<Self>> {
        match std::fs::read(&paths.state_file) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|source| LabError::State {
                        path: paths.state_file.clone(),
                        source,
                    })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(LabError::io("reading", &paths.state_file)(e)),
        }
    }

    fn save(&self, paths: &LabPaths) -> Result<()> {
        let tmp = paths.state_file.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(self).expect("the state serialises");
        std::fs::write(&tmp, text).map_err(LabError::io("writing", &tmp))?;
        std::fs::rename(&tmp, &paths.state_file)
            .map_err(LabError::io("renaming", &paths.state_file))
    }
}

/// A running lab, as handed to tests and to the `lab` command.
#[derive(Clone)]
pub struct LabHandle {
    /// A client authenticated as the lab's super admin (`system:masters`).
    pub client: Client,
    /// The kubeconfig `client` was built from.
    pub kubeconfig: PathBuf,
    /// The simulated nodes, control planes first.
    pub nodes: Vec<LabNode>,
    /// The lab's state directory.
    pub state_dir: PathBuf,
    /// The directory of the real binaries (kubeadm, kubectl, ...).
    pub bin_dir: PathBuf,
    /// The Kubernetes version the lab runs.
    pub kubernetes_version: String,
    /// The loopback ports.
    pub ports: Ports,
}

impl std::fmt::Debug for LabHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LabHandle")
            .field("kubeconfig", &self.kubeconfig)
            .field("nodes", &self.nodes)
            .field("kubernetes_version", &self.kubernetes_version)
            .finish_non_exhaustive()
    }
}

impl LabHandle {
    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&LabNode> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The names of the nodes with `role`, in the lab's order.
    pub fn names(&self, role: nodes::Role) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.role == role)
            .map(|n| n.name.clone())
            .collect()
    }

    /// A command running the real kubeadm chrooted into `node`'s host root, so it sees the
    /// node's `/etc/kubernetes`. See [`kubeadm::kubeadm_in_root`].
    pub fn kubeadm_in_root(&self, node: &LabNode, args: &[&str]) -> std::process::Command {
        kubeadm::kubeadm_in_root(&self.bin_dir.join("kubeadm"), &node.host_root, args)
    }
}

/// An exclusive lock on a lab's state directory, held while starting or stopping it so that
/// concurrent `lab` commands and test binaries do not start two control planes.
struct StateLock(#[allow(dead_code)] File);

impl StateLock {
    async fn acquire(paths: &LabPaths) -> Result<Self> {
        std::fs::create_dir_all(&paths.state_dir)
            .map_err(LabError::io("creating", &paths.state_dir))?;
        let path = paths.lock.clone();
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(LabError::io("opening", &path))?;
        tokio::task::spawn_blocking(move || {
            file.lock()
                .map(|()| Self(file))
                .map_err(LabError::io("locking", path))
        })
        .await
        .expect("the lock task does not panic")
    }
}

/// Starts the lab described by `opts`, or reuses it when it already runs; starts only what is
/// missing. Idempotent: a second call with the same options changes nothing. Returns when the
/// API server answers `/readyz` and every simulated node exists and is Ready.
pub async fn up(opts: &LabOptions) -> Result<LabHandle> {
    opts.validate()?;
    let paths = LabPaths::new(&opts.state_dir);
    let _lock = StateLock::acquire(&paths).await?;
    up_locked(opts, &paths).await
}

/// Starts or reuses the lab configured by the environment (see [`LabOptions::from_env`]) and
/// returns a handle with a ready client. Safe to call from many tests and test binaries at once:
/// the state directory's lock serialises them and only the first starts anything. A running
/// lab is reused whatever its node count.
pub async fn ensure_lab() -> Result<LabHandle> {
    let opts = LabOptions::from_env()?;
    opts.validate()?;
    let paths = LabPaths::new(&opts.state_dir);
    let _lock = StateLock::acquire(&paths).await?;
    if let Some(state) = LabState::load(&paths)? {
        // An API server started by an older lab, without the audit log the tests read, is
        // restarted with today's command line (the rest of the lab is kept).
        let [_, apiserver, _] = paths.daemons();
        let cmdline =
            std::fs::read_to_string(apiserver.log.with_extension("cmd")).unwrap_or_default();
        if apiserver.running_pid().is_some() && !cmdline.contains("--audit-log-path") {
            eprintln!("lab: restarting kube-apiserver with the audit log");
            apiserver.stop(STOP_GRACE)?;
        }
        if paths.daemons().iter().all(|d| d.running_pid().is_some()) {
            let client = client(&paths).await?;
            if readyz(&client).await.is_ok() {
                return Ok(handle(client, &paths, state));
            }
        }
        // Keep the shape of the lab that was there.
        let opts = LabOptions {
            port_base: state.port_base,
            nodes: u32::try_from(state.nodes.len()).unwrap_or(opts.nodes),
            control_planes: u32::try_from(
                state
                    .nodes
                    .iter()
                    .filter(|n| n.role == nodes::Role::ControlPlane)
                    .count(),
            )
            .unwrap_or(opts.control_planes),
            ..opts
        };
        return up_locked(&opts, &paths).await;
    }
    up_locked(&opts, &paths).await
}

async fn up_locked(opts: &LabOptions, paths: &LabPaths) -> Result<LabHandle> {
    let t0 = Instant::now();
    let at = || format!("[{:>5.1}s]", t0.elapsed().as_secs_f64());
    let bins = BinDir::ensure(opts.bin_dir.as_deref())?;
    let version = bins.kubernetes_version()?;
    let previous = LabState::load(paths)?;
    if let Some(prev) = &previous
        && prev.port_base != opts.port_base
    {
        return Err(LabError::PortsDiffer {
            dir: paths.state_dir.clone(),
            running: prev.port_base,
            requested: opts.port_base,
        });
    }
    let ports = Ports::from_base(opts.port_base);

    let [etcd, apiserver, controller_manager] = paths.daemons();
    // Check every port a process still to be started needs before starting any of them.
    let mut needed = Vec::new();
    if etcd.running_pid().is_none() {
        needed.extend([ports.etcd_client, ports.etcd_peer]);
    }
    if apiserver.running_pid().is_none() {
        needed.push(ports.apiserver);
    }
    if controller_manager.running_pid().is_none() {
        needed.push(ports.controller_manager);
    }
    check_ports(&ports, &needed)?;
    // The PKI and kubeconfigs name the API server's port: a state directory keeps its ports.
    if let Ok(old) = std::fs::read_to_string(&paths.kubeadm_config)
        && let Some(old_port) = old
            .lines()
            .find_map(|l| l.trim().strip_prefix("bindPort: "))
        && old_port.trim() != ports.apiserver.to_string()
    {
        return Err(LabError::PortsDiffer {
            dir: paths.state_dir.clone(),
            running: old_port.trim().parse().unwrap_or_default(),
            requested: opts.port_base,
        });
    }

    // PKI and kubeconfigs, by kubeadm, once.
    let kubeadm_bin = bins.path("kubeadm");
    let config = KubeadmConfig {
        node_name: "bosun-lab-control-plane",
        advertise_address: nodes::LAB_ADVERTISE_ADDRESS,
        kubernetes_version: &version,
        apiserver_port: ports.apiserver,
        certificates_dir: &paths.pki.display().to_string(),
        etcd_data_dir: &paths.etcd_data.display().to_string(),
    }
    .render();
    std::fs::write(&paths.kubeadm_config, config)
        .map_err(LabError::io("writing", &paths.kubeadm_config))?;
    let cfg = paths.kubeadm_config.display().to_string();
    if !paths.pki.join("apiserver.crt").exists() {
        eprintln!("lab: {} kubeadm init phase certs all", at());
        kubeadm::kubeadm(
            &kubeadm_bin,
            &["init", "phase", "certs", "all", "--config", &cfg],
        )?;
    }
    if !paths.super_admin_kubeconfig().exists() {
        eprintln!("lab: {} kubeadm init phase kubeconfig all", at());
        let dir = paths.kubeconfig_dir.display().to_string();
        kubeadm::kubeadm(
            &kubeadm_bin,
            &[
                "init",
                "phase",
                "kubeconfig",
                "all",
                "--config",
                &cfg,
                "--kubeconfig-dir",
                &dir,
            ],
        )?;
        // kubeadm points the component kubeconfigs at the node's own advertise address (where a
        // kubeadm control plane's API server listens); the lab's listens on 127.0.0.1 only.
        for file in ["controller-manager.conf", "scheduler.conf"] {
            let path = paths.kubeconfig_dir.join(file);
            let text = std::fs::read_to_string(&path).map_err(LabError::io("reading", &path))?;
            let local = format!(
                "https://{}:{}",
                nodes::LAB_ADVERTISE_ADDRESS,
                ports.apiserver
            );
            let text = text.replace(&local, &format!("https://127.0.0.1:{}", ports.apiserver));
            std::fs::write(&path, text).map_err(LabError::io("writing", &path))?;
        }
    }

    let pki = |f: &str| paths.pki.join(f).display().to_string();
    let kubeconfig = |f: &str| paths.kubeconfig_dir.join(f).display().to_string();

    if etcd.running_pid().is_none() {
        eprintln!(
            "lab: {} starting etcd on 127.0.0.1:{}",
            at(),
            ports.etcd_client
        );
        let client_url = format!("https://127.0.0.1:{}", ports.etcd_client);
        let peer_url = format!("https://127.0.0.1:{}", ports.etcd_peer);
        let args = vec![
            "--name=bosun-lab-control-plane".to_string(),
            format!("--data-dir={}", paths.etcd_data.display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=bosun-lab-control-plane={peer_url}"),
            // TLS with kubeadm's etcd certificates, as on a kubeadm control plane.
            format!("--cert-file={}", pki("etcd/server.crt")),
            format!("--key-file={}", pki("etcd/server.key")),
            "--client-cert-auth=true".to_string(),
            format!("--trusted-ca-file={}", pki("etcd/ca.crt")),
            format!("--peer-cert-file={}", pki("etcd/peer.crt")),
            format!("--peer-key-file={}", pki("etcd/peer.key")),
            "--peer-client-cert-auth=true".to_string(),
            format!("--peer-trusted-ca-file={}", pki("etcd/ca.crt")),
            "--snapshot-count=10000".to_string(),
        ];
        etcd.spawn(&bins.path(ETCD), &args)?;
        wait_port(&etcd, ports.etcd_client).await?;
    }

    if apiserver.running_pid().is_none() {
        eprintln!(
            "lab: {} starting kube-apiserver on https://127.0.0.1:{}",
            at(),
            ports.apiserver
        );
        let args = apiserver_args(paths, &ports)?;
        apiserver.spawn(&bins.path(APISERVER), &args)?;
    }
    let client = client(paths).await?;
    wait_ready(&client, &apiserver).await?;
    admin_binding(&client).await?;

    if controller_manager.running_pid().is_none() {
        eprintln!(
            "lab: {} kube-apiserver ready; starting kube-controller-manager",
            at()
        );
        let cm = kubeconfig("controller-manager.conf");
        let args = vec![
            format!("--kubeconfig={cm}"),
            format!("--authentication-kubeconfig={cm}"),
            format!("--authorization-kubeconfig={cm}"),
            "--bind-address=127.0.0.1".to_string(),
            format!("--secure-port={}", ports.controller_manager),
            format!("--client-ca-file={}", pki("ca.crt")),
            format!(
                "--requestheader-client-ca-file={}",
                pki("front-proxy-ca.crt")
            ),
            format!("--cluster-signing-cert-file={}", pki("ca.crt")),
            format!("--cluster-signing-key-file={}", pki("ca.key")),
            format!("--root-ca-file={}", pki("ca.crt")),
            format!("--service-account-private-key-file={}", pki("sa.key")),
            format!("--service-cluster-ip-range={SERVICE_SUBNET}"),
            "--use-service-account-credentials=true".to_string(),
            // One instance: no leader election, so a restart does not wait for the old lease.
            "--leader-elect=false".to_string(),
            // No kubelet renews the simulated nodes' heartbeats: without this the node lifecycle
            // controller would mark them NotReady and taint them after the grace period.
            "--controllers=*,-node-lifecycle-controller".to_string(),
        ];
        controller_manager.spawn(&bins.path(CONTROLLER_MANAGER), &args)?;
        wait_controllers(&client, &controller_manager).await?;
    }

    eprintln!(
        "lab: {} control plane ready; preparing {} nodes",
        at(),
        opts.nodes
    );
    // Nodes: roots first (kubeadm, files), then the API objects.
    let planned = nodes::plan(&paths.state_dir, opts.nodes, opts.control_planes);
    let ctx = RootContext {
        kubeadm: &kubeadm_bin,
        lab_pki: &paths.pki,
        kubernetes_version: &version,
        apiserver_port: ports.apiserver,
    };
    for node in &planned {
        nodes::prepare_root(node, &ctx)?;
    }
    let api: Api<Node> = Api::all(client.clone());
    for node in &planned {
        nodes::apply_node(&api, node, &version).await?;
    }
    let removed = nodes::remove_others(&api, &planned, &paths.state_dir).await?;
    if !removed.is_empty() {
        eprintln!("lab: removed nodes {}", removed.join(", "));
    }

    let state = LabState {
        kubernetes_version: version,
        bin_dir: bins.dir().to_path_buf(),
        port_base: opts.port_base,
        ports,
        nodes: planned,
    };
    state.save(paths)?;
    Ok(handle(client, paths, state))
}

/// Stops the lab's processes (controller manager, API server, etcd, in that order). Keeps the
/// state directory (PKI, etcd data, node roots) unless `purge`, so the next `up` is warm.
/// Idempotent. Returns the names of the processes it stopped.
pub async fn down(state_dir: &Path, purge: bool) -> Result<Vec<&'static str>> {
    let paths = LabPaths::new(state_dir);
    if !paths.state_dir.exists() {
        return Ok(Vec::new());
    }
    let _lock = StateLock::acquire(&paths).await?;
    let mut stopped = Vec::new();
    for daemon in paths.daemons().iter().rev() {
        if daemon.stop(STOP_GRACE)? {
            stopped.push(daemon.name);
        }
    }
    if purge {
        for entry in std::fs::read_dir(&paths.state_dir)
            .map_err(LabError::io("listing", &paths.state_dir))?
        {
            let entry = entry.map_err(LabError::io("listing", &paths.state_dir))?;
            // The lock file stays: another process may be waiting on it.
            if entry.path() == paths.lock {
                continue;
            }
            let path = entry.path();
            let removed = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.map_err(LabError::io("removing", &path))?;
        }
    }
    Ok(stopped)
}

/// The state of one control-plane process.
#[derive(Debug)]
pub struct DaemonStatus {
    /// The process.
    pub daemon: Daemon,
    /// Its pid when it runs.
    pub pid: Option<u32>,
}

/// What `lab status` reports.
#[derive(Debug)]
pub struct LabStatus {
    /// The state directory's files.
    pub paths: LabPaths,
    /// The recorded state, if the lab was ever started here.
    pub state: Option<LabState>,
    /// Each process.
    pub daemons: Vec<DaemonStatus>,
    /// Whether `/readyz` answered `ok`.
    pub ready: bool,
    /// Node name and whether its Ready condition is True, as the API server reports them.
    pub node_ready: Vec<(String, bool)>,
}

impl LabStatus {
    /// Whether every process runs and the API server is ready.
    pub fn running(&self) -> bool {
        self.ready && self.daemons.iter().all(|d| d.pid.is_some())
    }
}

/// Reports the lab in `state_dir` without changing it.
pub async fn status(state_dir: &Path) -> Result<LabStatus> {
    let paths = LabPaths::new(state_dir);
    let state = LabState::load(&paths)?;
    let daemons = paths
        .daemons()
        .into_iter()
        .map(|daemon| DaemonStatus {
            pid: daemon.running_pid(),
            daemon,
        })
        .collect::<Vec<_>>();
    let mut ready = false;
    let mut node_ready = Vec::new();
    if daemons[1].pid.is_some() {
        let client = client(&paths).await?;
        ready = readyz(&client).await.is_ok();
        if ready {
            let list = Api::<Node>::all(client)
                .list(&Default::default())
                .await
                .map_err(LabError::kube("listing Nodes"))?;
            for node in list {
                let is_ready = node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                node_ready.push((node.metadata.name.unwrap_or_default(), is_ready));
            }
        }
    }
    Ok(LabStatus {
        paths,
        state,
        daemons,
        ready,
        node_ready,
    })
}

fn handle(client: Client, paths: &LabPaths, state: LabState) -> LabHandle {
    LabHandle {
        client,
        kubeconfig: paths.super_admin_kubeconfig(),
        nodes: state.nodes,
        state_dir: paths.state_dir.clone(),
        bin_dir: state.bin_dir,
        kubernetes_version: state.kubernetes_version,
        ports: state.ports,
    }
}

/// A handle to the lab running in `state_dir`, without starting anything: an error saying
/// how to start it when it is not running.
pub async fn running(state_dir: &Path) -> Result<LabHandle> {
    let paths = LabPaths::new(state_dir);
    let not_running = || LabError::NotRunning {
        dir: state_dir.to_path_buf(),
    };
    let state = LabState::load(&paths)?.ok_or_else(not_running)?;
    if !paths.daemons().iter().all(|d| d.running_pid().is_some()) {
        return Err(not_running());
    }
    let client = client(&paths).await?;
    readyz(&client).await.map_err(|_| not_running())?;
    Ok(handle(client, &paths, state))
}

/// A client from the lab's super-admin kubeconfig.
pub async fn client(paths: &LabPaths) -> Result<Client> {
    let path = paths.super_admin_kubeconfig();
    let kubeconfig = Kubeconfig::read_from(&path).map_err(|source| LabError::Kubeconfig {
        path: path.clone(),
        source,
    })?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| LabError::Kubeconfig {
            path: path.clone(),
            source,
        })?;
    Client::try_from(config).map_err(LabError::kube("building a client"))
}

async fn readyz(client: &Client) -> std::result::Result<(), String> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .expect("a static request is valid");
    match client.request_text(request).await {
        Ok(text) if text.trim() == "ok" => Ok(()),
        Ok(text) => Err(text),
        Err(e) => Err(e.to_string()),
    }
}

/// What the lab's audit log records: every write, at the `Metadata` level (who, what, when,
/// the answer; no bodies), and nothing else.
const AUDIT_POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
";

/// The kube-apiserver's command line; writes the audit policy it names.
fn apiserver_args(paths: &LabPaths, ports: &Ports) -> Result<Vec<String>> {
    std::fs::write(&paths.audit_policy, AUDIT_POLICY)
        .map_err(LabError::io("writing", &paths.audit_policy))?;
    let pki = |f: &str| paths.pki.join(f).display().to_string();
    Ok(vec![
        "--advertise-address=127.0.0.1".to_string(),
        "--bind-address=127.0.0.1".to_string(),
        format!("--secure-port={}", ports.apiserver),
        "--allow-privileged=true".to_string(),
        "--authorization-mode=Node,RBAC".to_string(),
        "--enable-admission-plugins=NodeRestriction".to_string(),
        // No controller makes default service accounts for pods' tokens in this lab.
        "--disable-admission-plugins=ServiceAccount".to_string(),
        "--enable-bootstrap-token-auth=true".to_string(),
        format!("--client-ca-file={}", pki("ca.crt")),
        format!("--tls-cert-file={}", pki("apiserver.crt")),
        format!("--tls-private-key-file={}", pki("apiserver.key")),
        format!("--etcd-servers=https://127.0.0.1:{}", ports.etcd_client),
        format!("--etcd-cafile={}", pki("etcd/ca.crt")),
        format!("--etcd-certfile={}", pki("apiserver-etcd-client.crt")),
        format!("--etcd-keyfile={}", pki("apiserver-etcd-client.key")),
        format!(
            "--kubelet-client-certificate={}",
            pki("apiserver-kubelet-client.crt")
        ),
        format!(
            "--kubelet-client-key={}",
            pki("apiserver-kubelet-client.key")
        ),
        format!("--proxy-client-cert-file={}", pki("front-proxy-client.crt")),
        format!("--proxy-client-key-file={}", pki("front-proxy-client.key")),
        format!(
            "--requestheader-client-ca-file={}",
            pki("front-proxy-ca.crt")
        ),
        "--requestheader-allowed-names=front-proxy-client".to_string(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_string(),
        "--requestheader-group-headers=X-Remote-Group".to_string(),
        "--requestheader-username-headers=X-Remote-User".to_string(),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
        format!("--service-account-key-file={}", pki("sa.pub")),
        format!("--service-account-signing-key-file={}", pki("sa.key")),
        format!("--service-cluster-ip-range={SERVICE_SUBNET}"),
        // The `kubernetes` Service's endpoints cannot be a loopback address.
        "--endpoint-reconciler-type=none".to_string(),
        // Tests read who wrote what (a controller replica that lost its Lease must write
        // nothing more). Bounded: at most 3 files of 50 MB.
        format!("--audit-policy-file={}", paths.audit_policy.display()),
        format!("--audit-log-path={}", paths.audit_log.display()),
        "--audit-log-maxsize=50".to_string(),
        "--audit-log-maxbackup=2".to_string(),
        "--audit-log-format=json".to_string(),
    ])
}

/// Stops the lab's kube-apiserver (SIGTERM, as a kubelet stops a static Pod), keeps it down
/// for `down_for`, then starts it again with the same command line and waits until it is
/// ready: an API-server restart as `kubeadm upgrade apply` or a certificate renewal makes
/// one. etcd and kube-controller-manager keep running. The lab must be running.
pub async fn restart_apiserver(lab: &LabHandle, down_for: Duration) -> Result<()> {
    let paths = LabPaths::new(&lab.state_dir);
    let _lock = StateLock::acquire(&paths).await?;
    let [_, apiserver, _] = paths.daemons();
    apiserver.stop(STOP_GRACE)?;
    tokio::time::sleep(down_for).await;
    let args = apiserver_args(&paths, &lab.ports)?;
    apiserver.spawn(&lab.bin_dir.join(APISERVER), &args)?;
    wait_ready(&lab.client, &apiserver).await
}

async fn wait_ready(client: &Client, apiserver: &Daemon) -> Result<()> {
    let started = Instant::now();
    loop {
        let last = match readyz(client).await {
            Ok(()) => return Ok(()),
            Err(last) => last,
        };
        if apiserver.running_pid().is_none() {
            return Err(apiserver.died());
        }
        if started.elapsed() > START_TIMEOUT {
            return Err(LabError::NotReady {
                seconds: START_TIMEOUT.as_secs(),
                last,
                log: apiserver.log.clone(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until kube-controller-manager's controllers act: its service-account controller
/// creates `default/default`. An open port alone would not show that it reached the API server.
async fn wait_controllers(client: &Client, controller_manager: &Daemon) -> Result<()> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let started = Instant::now();
    loop {
        let found = accounts
            .get_opt("default")
            .await
            .map_err(LabError::kube("reading ServiceAccount default/default"))?;
        if found.is_some() {
            return Ok(());
        }
        if controller_manager.running_pid().is_none() {
            return Err(controller_manager.died());
        }
        if started.elapsed() > START_TIMEOUT {
            return Err(LabError::ProcessDied {
                component: controller_manager.name,
                log: controller_manager.log.clone(),
                tail: format!(
                    "(still running, but its controllers made no default ServiceAccount in {}s)\n{}",
                    START_TIMEOUT.as_secs(),
                    controller_manager.log_tail(10)
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait_port(daemon: &Daemon, port: u16) -> Result<()> {
    let started = Instant::now();
    while !process::port_open(port) {
        if daemon.running_pid().is_none() {
            return Err(daemon.died());
        }
        if started.elapsed() > START_TIMEOUT {
            return Err(LabError::ProcessDied {
                component: daemon.name,
                log: daemon.log.clone(),
                tail: format!(
                    "(still running, but port {port} is not open after {}s)",
                    START_TIMEOUT.as_secs()
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn check_ports(ports: &Ports, which: &[u16]) -> Result<()> {
    for (port, component) in ports.all() {
        if which.contains(&port) {
            process::ensure_port_free(port, component)?;
        }
    }
    Ok(())
}

/// The binding `kubeadm init` creates so that admin.conf (group `kubeadm:cluster-admins`) is a
/// cluster admin; without it the admin.conf files in the control-plane roots would be refused.
async fn admin_binding(client: &Client) -> Result<()> {
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": { "name": "kubeadm:cluster-admins" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "kubeadm:cluster-admins" }],
    }))
    .expect("a valid ClusterRoleBinding");
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(
            "kubeadm:cluster-admins",
            &PatchParams::apply("bosun-lab").force(),
            &Patch::Apply(&binding),
        )
        .await
        .map_err(LabError::kube(
            "binding kubeadm:cluster-admins to cluster-admin",
        ))?;
    Ok(())
}
