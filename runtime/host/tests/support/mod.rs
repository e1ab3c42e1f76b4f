//! Test support: builds the test plugins (once per test binary) and sets up a host root.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use bosun_api::grants::{Access, ExecGrant, FilesystemGrant, Grants};
use bosun_host::{
    CallFailure, Host, HostConfig, LoadedPlugin, NodeContext, PluginPin, RecordingBackend,
    RunOptions, RunReport,
};
use bosun_trust::{Digest, SigningKey, Statement, TrustRoots};

/// The compiled test plugins (see plugins/testing/README.md).
pub struct Plugins {
    pub good: Vec<u8>,
    pub bad: Vec<u8>,
    pub http: Vec<u8>,
    pub wrong_abi: Vec<u8>,
    pub forbidden_import: Vec<u8>,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Runs `cargo build --release --target wasm32-wasip2` for the test plugins once per
/// test binary, in the same target directory as the tests, and reads the components.
pub fn plugins() -> &'static Plugins {
    static PLUGINS: OnceLock<Plugins> = OnceLock::new();
    PLUGINS.get_or_init(|| {
        let root = workspace_root();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let crates = ["bosun-test-good", "bosun-test-bad", "bosun-test-http", "bosun-test-wrong-abi", "bosun-test-forbidden-import"];
        let mut cmd = Command::new(cargo);
        cmd.current_dir(&root).args(["build", "--release", "--target", "wasm32-wasip2"]);
        for c in crates {
            cmd.args(["-p", c]);
        }
        let status = cmd.status().expect("running cargo to build the test plugins");
        assert!(
            status.success(),
            "building the test plugins failed ({status}); is the target installed? `rustup target add wasm32-wasip2`"
        );
        let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
        let read = |name: &str| {
            let path = target.join("wasm32-wasip2/release").join(format!("{name}.wasm"));
            std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        Plugins {
            good: read("bosun_test_good"),
            bad: read("bosun_test_bad"),
            http: read("bosun_test_http"),
            wrong_abi: read("bosun_test_wrong_abi"),
            forbidden_import: read("bosun_test_forbidden_import"),
        }
    })
}

/// A signing key and the trust roots that trust it.
pub struct Signer {
    pub key: SigningKey,
    pub roots: TrustRoots,
}

impl Signer {
    pub fn new() -> Signer {
        let key = SigningKey::generate_ed25519();
        let mut roots = TrustRoots::new();
        roots
            .add_pem(&key.public_key().to_pem(), "test-admin.pub")
            .unwrap();
        Signer { key, roots }
    }

    /// A pin for `bytes` signed by this key as `name` `version`.
    pub fn pin(&self, bytes: &[u8], name: &str, version: &str) -> PluginPin {
        let digest = Digest::of(bytes);
        let statement = Statement::new(name, version, digest).unwrap();
        PluginPin {
            name: name.into(),
            version: version.into(),
            sha256: digest,
            signatures: vec![self.key.sign_statement(&statement)],
        }
    }
}

/// A temporary node: `dir/root` is the host root, `dir/outside` is next to it (what
/// escapes would reach), `dir/cache` the compiled-code cache.
pub struct Node {
    pub dir: tempfile::TempDir,
    pub signer: Signer,
    pub services: Arc<RecordingBackend>,
}

impl Node {
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
    pub fn outside(&self) -> PathBuf {
        self.dir.path().join("outside")
    }
    pub fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    /// A host configuration for this node with small limits so misbehaviour ends fast.
    pub fn config(&self) -> HostConfig {
        let mut c = HostConfig::new(self.root(), self.signer.roots.clone());
        c.cache_dir = Some(self.cache());
        c.limits.max_memory_bytes = 64 << 20;
        c.limits.max_log_bytes = 64 << 10;
        c.limits.describe_deadline = std::time::Duration::from_secs(30);
        c.pool.max_instances = 4;
        c.service_backend = self.services.clone();
        if !is_root() {
            // chroot(2) needs privileges; an unprivileged test run resolves commands
            // under the root instead (see ExecIsolation::ResolveOnly).
            c.exec_isolation = bosun_host::ExecIsolation::ResolveOnly;
        }
        c
    }

    pub fn host(&self) -> Host {
        Host::new(self.config()).unwrap()
    }

    pub fn load(&self, host: &Host, bytes: &[u8], name: &str) -> LoadedPlugin {
        host.load(bytes, &self.signer.pin(bytes, name, "1.0.0"))
            .unwrap()
    }
}

/// Fails, rather than passes without checking, when a test that needs root (chroot, a
/// mount namespace, the agent's capabilities) does not run as root. CI and
/// `tests/run.sh` run as root.
pub fn require_root(test: &str) {
    assert!(
        is_root(),
        "{test} needs root (the agent runs as root, and this test checks what only root can do): run the host's tests as root"
    );
}

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

/// Copies `/bin/sh` and the shared libraries it needs (as `ldd` lists them) into `root`,
/// so a shell script can run chrooted there.
fn install_shell(root: &Path) {
    let mut files = vec![PathBuf::from("/bin/sh")];
    let ldd = Command::new("ldd").arg("/bin/sh").output().expect("ldd");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let path = line
            .split("=>")
            .last()
            .unwrap_or(line)
            .split_whitespace()
            .next()
            .unwrap_or("");
        if path.starts_with('/') {
            files.push(PathBuf::from(path));
        }
    }
    for f in files {
        let real = f.canonicalize().unwrap();
        let dest = root.join(f.strip_prefix("/").unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&real, &dest).unwrap();
    }
}

/// A node with:
/// - `/data/input.txt` (granted read-only in most tests) and `/data/link-out`, a
///   symlink to the secret outside the root;
/// - `/ro/secret.txt` and `/rw/` for cross-domain tests; `/rw/escape` → `../../outside`
///   and `/rw/abs-escape` → the absolute path of `outside`;
/// - `/etc/os-release`, `/usr/share/bosun/marker` and `/usr/bin/greet`, a shell script that prints
///   its argument and the marker (which only exists inside the root), and
///   `/usr/bin/spin`, a shell script that never ends;
/// - `outside/secret.txt` next to the root.
pub fn node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let outside = dir.path().join("outside");
    write(&outside.join("secret.txt"), "outside secret");
    write(&root.join("data/input.txt"), "hello from the node");
    write(&root.join("ro/secret.txt"), "read-only content");
    std::fs::create_dir_all(root.join("rw")).unwrap();
    std::os::unix::fs::symlink("../../outside", root.join("rw/escape")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("rw/abs-escape")).unwrap();
    std::os::unix::fs::symlink("../../outside/secret.txt", root.join("data/link-out")).unwrap();
    write(
        &root.join("etc/os-release"),
        "NAME=\"Rocky Linux\"\nID=\"rocky\"\nID_LIKE=\"rhel centos fedora\"\nVERSION_ID=\"9.4\"\nPRETTY_NAME=\"Rocky Linux 9.4 (Blue Onyx)\"\n",
    );
    // In /usr, which every granted command may read (its sandbox's base), so the script
    // tells the node's root from the machine's whatever the grants.
    write(&root.join("usr/share/bosun/marker"), "inside-the-root\n");
    write(
        &root.join("usr/bin/greet"),
        "#!/bin/sh\nread marker < /usr/share/bosun/marker || marker=unconfined\necho \"hello $1 from $marker\"\n",
    );
    write(
        &root.join("usr/bin/spin"),
        "#!/bin/sh\nwhile :; do :; done\n",
    );
    use std::os::unix::fs::PermissionsExt;
    for script in ["usr/bin/greet", "usr/bin/spin"] {
        std::fs::set_permissions(root.join(script), std::fs::Permissions::from_mode(0o755))
            .unwrap();
    }
    install_shell(&root);
    Node {
        dir,
        signer: Signer::new(),
        services: Arc::new(RecordingBackend::logging_to_host_root()),
    }
}

/// A filesystem grant of `path`.
pub fn fs(path: &str, access: Access) -> FilesystemGrant {
    FilesystemGrant {
        path: path.into(),
        access,
        optional: false,
    }
}

/// An exec grant of `command` with argument-pattern lists `args` (60 s, 4 KiB of output).
pub fn exec_grant(command: &str, args: &[&[&str]]) -> ExecGrant {
    ExecGrant {
        command: command.into(),
        args: args
            .iter()
            .map(|l| l.iter().map(|s| (*s).to_owned()).collect())
            .collect(),
        timeout_seconds: Some(60),
        max_output_bytes: Some(4096),
        dry_run: false,
        optional: false,
        sandbox: Default::default(),
    }
}

/// Runs `action` of `p` for real (not a dry run) with a 60 s deadline on node `ctx`.
pub fn run_on(
    host: &Host,
    p: &LoadedPlugin,
    grants: &Grants,
    ctx: &NodeContext,
    action: &str,
    params: &str,
) -> Result<RunReport, CallFailure> {
    host.run(
        p,
        grants,
        ctx,
        action,
        params,
        RunOptions {
            dry_run: false,
            resumed: false,
            deadline: Some(std::time::Duration::from_secs(60)),
        },
    )
}
