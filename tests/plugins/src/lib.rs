//! Support for the first-party plugin tests: builds the plugins for `wasm32-wasip2` (once
//! per test binary), signs them with a throw-away key, runs them through the real sandbox
//! (`bosun-host`, chroot isolation) against a node root directory, and assembles node roots
//! from real programs of this machine (each binary with the shared libraries `ldd` lists).
//!
//! The tests need root: granted commands run chrooted into the node root, as the agent runs
//! them, and dpkg/apt/kubeadm need to own the files they write.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use bosun_api::grants::Grants;
use bosun_host::{
    Check, CheckStatus, ExecIsolation, Host, HostConfig, LoadedPlugin, NodeContext, Outcome,
    PluginError, PluginPin, RecordingBackend, RunOptions, RunReport,
};
use bosun_trust::{Digest, SigningKey, Statement, TrustRoots};

/// The first-party plugins, compiled.
#[derive(Debug)]
pub struct Plugins {
    pub certs: Vec<u8>,
    pub kubeadm_upgrade: Vec<u8>,
    pub packages: Vec<u8>,
    pub kubelet: Vec<u8>,
    pub etcd: Vec<u8>,
    pub reboot: Vec<u8>,
    /// The `hello` example (plugins/hello), which the demo runs.
    pub hello: Vec<u8>,
    /// The e2e steps test plugin (plugins/testing/steps), whose `append` lies about
    /// idempotence for the conformance kit to catch.
    pub steps: Vec<u8>,
    /// The community zypper plugin (plugins/community/zypper).
    pub zypper: Vec<u8>,
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Runs `cargo build --release --target wasm32-wasip2` for the seven plugins (and the
/// steps test plugin) once per test
/// binary, in the same target directory as the tests, and reads the components.
pub fn plugins() -> &'static Plugins {
    static PLUGINS: OnceLock<Plugins> = OnceLock::new();
    PLUGINS.get_or_init(|| {
        let root = workspace_root();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(&root)
            .args(["build", "--release", "--target", "wasm32-wasip2"])
            .args(["-p", "bosun-plugin-certs", "-p", "bosun-plugin-kubeadm-upgrade"])
            .args(["-p", "bosun-plugin-packages", "-p", "bosun-plugin-kubelet"])
            .args(["-p", "bosun-plugin-hello", "-p", "bosun-plugin-etcd"])
            .args(["-p", "bosun-plugin-reboot", "-p", "bosun-test-steps"])
            .args(["-p", "bosun-community-zypper"])
            .status()
            .expect("running cargo to build the plugins");
        assert!(
            status.success(),
            "building the plugins failed ({status}); is the target installed? `rustup target add wasm32-wasip2`"
        );
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| root.join("target"), PathBuf::from);
        let read = |name: &str| {
            let path = target.join("wasm32-wasip2/release").join(format!("{name}.wasm"));
            std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        Plugins {
            certs: read("bosun_plugin_certs"),
            kubeadm_upgrade: read("bosun_plugin_kubeadm_upgrade"),
            packages: read("bosun_plugin_packages"),
            kubelet: read("bosun_plugin_kubelet"),
            etcd: read("bosun_plugin_etcd"),
            reboot: read("bosun_plugin_reboot"),
            hello: read("bosun_plugin_hello"),
            steps: read("bosun_test_steps"),
            zypper: read("bosun_community_zypper"),
        }
    })
}

/// True when running as root (uid 0).
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

/// A host for one node root, with a fresh signing key trusted by it, chroot isolation (as
/// the agent runs commands) and service calls recorded in `<root>/var/log/bosun-services.log`.
pub struct Node {
    pub root: PathBuf,
    pub host: Host,
    pub key: SigningKey,
    pub ctx: NodeContext,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// What a preflight and a run produced.
#[derive(Debug)]
pub struct Ran {
    pub checks: Vec<Check>,
    /// `None` when a failing check stopped the run (as the agent does).
    pub run: Option<RunReport>,
}

impl Ran {
    /// The outcome; panics with the plugin's error or failed checks otherwise.
    pub fn outcome(&self) -> &Outcome {
        match &self.run {
            Some(r) => match &r.result {
                Ok(o) => o,
                Err(e) => panic!(
                    "plugin error {}: {} (logs: {:?})",
                    e.code, e.message, r.captured.lines
                ),
            },
            None => panic!("preflight failed: {:?}", self.failed_checks()),
        }
    }

    /// The plugin's error; panics when it succeeded.
    pub fn error(&self) -> &PluginError {
        match self.run.as_ref().map(|r| &r.result) {
            Some(Err(e)) => e,
            Some(Ok(o)) => panic!("expected an error, the run succeeded: {}", o.message),
            None => panic!(
                "preflight failed before the run: {:?}",
                self.failed_checks()
            ),
        }
    }

    /// Names and messages of failing checks.
    pub fn failed_checks(&self) -> Vec<(String, String)> {
        self.checks
            .iter()
            .filter(|c| c.status == CheckStatus::Fail)
            .map(|c| (c.name.clone(), c.message.clone()))
            .collect()
    }

    /// The value of output `key`.
    pub fn output(&self, key: &str) -> Option<String> {
        self.outcome()
            .outputs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }
}

impl Node {
    /// A host over `root`. Panics unless running as root (chroot needs it).
    pub fn new(root: &Path, roles: &[&str]) -> Node {
        Node::with_services(
            root,
            roles,
            std::sync::Arc::new(RecordingBackend::logging_to_host_root()),
        )
    }

    /// As [`Node::new`], with `services` answering service calls.
    pub fn with_services(
        root: &Path,
        roles: &[&str],
        services: std::sync::Arc<dyn bosun_host::ServiceBackend>,
    ) -> Node {
        assert!(
            is_root(),
            "the first-party plugin tests run commands chrooted into node roots, as the agent does: run them as root"
        );
        let key = SigningKey::generate_ed25519();
        let mut roots = TrustRoots::new();
        roots
            .add_pem(&key.public_key().to_pem(), "test.pub")
            .unwrap();
        let mut config = HostConfig::new(root, roots);
        config.exec_isolation = ExecIsolation::Chroot;
        config.service_backend = services;
        Node {
            root: root.to_owned(),
            host: Host::new(config).unwrap(),
            key,
            ctx: NodeContext {
                node_name: "test-node".into(),
                roles: roles.iter().map(|r| (*r).to_owned()).collect(),
                kubelet_version: Some("v1.34.4".into()),
            },
        }
    }

    /// Verifies (signed by this node's key as `name` 0.1.0), compiles and describes `bytes`.
    pub fn load(&self, bytes: &[u8], name: &str) -> LoadedPlugin {
        let digest = Digest::of(bytes);
        let statement = Statement::new(name, env!("CARGO_PKG_VERSION"), digest).unwrap();
        let pin = PluginPin {
            name: name.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            sha256: digest,
            signatures: vec![self.key.sign_statement(&statement)],
        };
        self.host
            .load(bytes, &pin)
            .unwrap_or_else(|e| panic!("loading {name}: {e}"))
    }

    /// Preflight, then (if no check failed) run, as the agent does.
    pub fn run(
        &self,
        plugin: &LoadedPlugin,
        grants: &Grants,
        action: &str,
        params: &serde_json::Value,
        dry_run: bool,
    ) -> Ran {
        self.run_with(plugin, grants, action, params, dry_run, false)
    }

    /// As [`Node::run`], telling the plugin whether the previous attempt of the step was
    /// interrupted (`run-context.resumed`), as the agent does when it re-runs one.
    pub fn run_with(
        &self,
        plugin: &LoadedPlugin,
        grants: &Grants,
        action: &str,
        params: &serde_json::Value,
        dry_run: bool,
        resumed: bool,
    ) -> Ran {
        let params = params.to_string();
        let checks = self
            .host
            .preflight(plugin, grants, &self.ctx, action, &params)
            .unwrap_or_else(|f| panic!("preflight {action}: host failure {f} ({:?})", f.captured))
            .result
            .unwrap_or_else(|e| {
                panic!("preflight {action}: plugin error {}: {}", e.code, e.message)
            });
        if checks.iter().any(|c| c.status == CheckStatus::Fail) {
            return Ran { checks, run: None };
        }
        let options = RunOptions {
            dry_run,
            resumed,
            deadline: Some(Duration::from_secs(600)),
        };
        let run = self
            .host
            .run(plugin, grants, &self.ctx, action, &params, options)
            .unwrap_or_else(|f| panic!("run {action}: host failure {f} ({:?})", f.captured));
        Ran {
            checks,
            run: Some(run),
        }
    }
}

/// Parses a Plugin-resource style grants YAML (the `grants:` of the examples in
/// deploy/examples/plugins), so the tests run with exactly the grants the examples ship.
pub fn example_grants(file: &str) -> Grants {
    grants_of(&workspace_root().join("deploy/examples/plugins").join(file))
}

/// The `spec.grants` of the Plugin resource in `path`.
pub fn grants_of(path: &Path) -> Grants {
    let path = path.to_owned();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: serde_json::Value = serde_yaml_ng(&text, &path);
    let grants = doc
        .pointer("/spec/grants")
        .cloned()
        .unwrap_or_else(|| panic!("{}: no spec.grants", path.display()));
    serde_json::from_value(grants)
        .unwrap_or_else(|e| panic!("{}: spec.grants: {e}", path.display()))
}

/// The example grants of `file` with the lab's own loopback ports added beside the
/// standard ones they stand for (the lab's API server listens on its port base, 16443 by
/// default, not 6443; its etcd on the next port, not 2379), so kubeadm reaches the lab's
/// control plane as it reaches a node's. Nothing else is added.
pub fn example_grants_for_lab(file: &str, ports: bosun_lab::Ports) -> Grants {
    let mut grants = example_grants(file);
    for g in &mut grants.exec {
        let ports_now = g.sandbox.tcp_connect.clone();
        for (standard, lab) in [(6443, ports.apiserver), (2379, ports.etcd_client)] {
            if ports_now.contains(&standard) && !ports_now.contains(&lab) {
                g.sandbox.tcp_connect.push(lab);
            }
        }
    }
    grants
}

/// The example grants of `packages.yaml` with this suite's local package repository
/// (`/srv/repo`, reached by apt's `file:` and dnf's `file://` sources) readable by the
/// package managers' commands: on a node the repository is a mirror over HTTP, which the
/// example's `tcpConnect` already allows. Nothing else is added.
pub fn packages_grants_with_local_repository() -> Grants {
    let mut grants = example_grants("packages.yaml");
    for g in &mut grants.exec {
        if ["apt-get", "apt-cache", "dnf-3"]
            .iter()
            .any(|c| g.command == format!("/usr/bin/{c}"))
        {
            g.sandbox.filesystem.push(bosun_api::grants::CommandPath {
                path: "/srv/repo".into(),
                access: bosun_api::grants::Access::ReadOnly,
                execute: false,
                optional: false,
                writable_in_dry_run: false,
            });
        }
    }
    grants
}

fn serde_yaml_ng(text: &str, path: &Path) -> serde_json::Value {
    let v: serde_yaml::Value =
        serde_yaml::from_str(text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::to_value(v).unwrap()
}

/// The shared libraries (and the loader) `ldd` lists for `program`, looked up in
/// `lib_path` first when given.
fn libraries_of(program: &Path, lib_path: Option<&Path>) -> Vec<PathBuf> {
    let mut ldd = Command::new("ldd");
    ldd.arg(program);
    if let Some(dir) = lib_path {
        ldd.env("LD_LIBRARY_PATH", dir);
    }
    let out = ldd.output().expect("ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let path = line
                .split("=>")
                .last()
                .unwrap_or(line)
                .split_whitespace()
                .next()
                .unwrap_or("");
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Copies each program in `programs` (absolute paths on this machine) and every shared
/// library `ldd` lists for it into `root` at the same paths, so it runs chrooted there.
pub fn install_programs(root: &Path, programs: &[&str]) {
    for program in programs {
        let mut files = vec![PathBuf::from(program)];
        files.extend(libraries_of(Path::new(program), None));
        for f in files {
            copy_into(root, &f);
        }
    }
}

/// Copies `path` (a file on this machine) to the same path under `root`, following
/// symlinks for the content and keeping the mode.
pub fn copy_into(root: &Path, path: &Path) {
    let dest = root.join(path.strip_prefix("/").unwrap());
    if dest.exists() {
        return;
    }
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    let real = path
        .canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::fs::copy(&real, &dest)
        .unwrap_or_else(|e| panic!("copying {} to {}: {e}", real.display(), dest.display()));
}

/// Copies a directory tree (`cp -a`).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

/// Programs a Debian node root needs for dpkg and apt to work chrooted: the package tools,
/// what dpkg requires on `PATH` (sh, rm, tar, diff, ldconfig, start-stop-daemon), the
/// decompressors, and chmod (the binary backend's).
pub const DEBIAN_PROGRAMS: &[&str] = &[
    "/bin/sh",
    "/usr/bin/dpkg",
    "/usr/bin/dpkg-deb",
    "/usr/bin/dpkg-query",
    "/usr/bin/dpkg-split",
    "/usr/bin/dpkg-divert",
    "/usr/bin/dpkg-trigger",
    "/usr/bin/apt-get",
    "/usr/bin/apt-cache",
    "/usr/bin/apt-mark",
    "/usr/bin/apt-config",
    "/usr/bin/rm",
    "/usr/bin/tar",
    "/usr/bin/diff",
    "/sbin/ldconfig",
    "/sbin/start-stop-daemon",
    "/usr/bin/gzip",
    "/usr/bin/xz",
    "/usr/bin/chmod",
];

/// Writes `content` to `root/rel`, creating parents.
pub fn write(root: &Path, rel: &str, content: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

/// A Debian 12 node root in `root` with this machine's real dpkg and apt (and their
/// libraries), an empty dpkg database, and apt pointed at `file:/srv/repo` (trusted, no
/// signature: a test repository).
pub fn debian_root(root: &Path) {
    install_programs(root, DEBIAN_PROGRAMS);
    for m in std::fs::read_dir("/usr/lib/apt/methods").unwrap() {
        let path = m.unwrap().path();
        install_programs(root, &[path.to_str().unwrap()]);
    }
    // apt reads dpkg's CPU and tuple tables to know the architecture.
    for f in std::fs::read_dir("/usr/share/dpkg").unwrap() {
        let path = f.unwrap().path();
        if path.is_file() {
            copy_into(root, &path);
        }
    }
    for dir in [
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/dpkg/triggers",
        "var/lib/apt/lists/partial",
        "var/cache/apt/archives/partial",
        "var/log/apt",
        "etc/apt/apt.conf.d",
        "etc/apt/preferences.d",
        "etc/apt/sources.list.d",
        "etc/dpkg/dpkg.cfg.d",
        "tmp",
        "srv/repo",
    ] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    write(root, "var/lib/dpkg/status", "");
    write(root, "var/lib/dpkg/available", "");
    // apt drops privileges to `_apt` for fetching: the accounts must exist in the root.
    copy_into(root, Path::new("/etc/passwd"));
    copy_into(root, Path::new("/etc/group"));
    write(
        root,
        "etc/os-release",
        "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\nVERSION_ID=\"12\"\nID=debian\n",
    );
    write(
        root,
        "etc/apt/sources.list",
        "deb [trusted=yes] file:/srv/repo ./\n",
    );
}

/// Builds `package` at `version` with the real `dpkg-deb` into `root/srv/repo`: an
/// architecture-independent package holding `/usr/share/NAME/version` (its version).
pub fn build_deb(root: &Path, package: &str, version: &str) {
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree");
    write(
        &tree,
        "DEBIAN/control",
        &format!(
            "Package: {package}\nVersion: {version}\nArchitecture: all\nMaintainer: Bosun tests <tests@bosun.invalid>\nDescription: Bosun test package {version}\n"
        ),
    );
    write(
        &tree,
        &format!("usr/share/{package}/version"),
        &format!("{version}\n"),
    );
    let deb = root
        .join("srv/repo")
        .join(format!("{package}_{version}_all.deb"));
    let out = Command::new("dpkg-deb")
        .arg("--root-owner-group")
        .arg("-b")
        .arg(&tree)
        .arg(&deb)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "dpkg-deb -b: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes `root/srv/repo/Packages` for every .deb there (what dpkg-scanpackages would, from
/// `dpkg-deb -f` plus file name, size and SHA-256).
pub fn index_repo(root: &Path) {
    use sha2::Digest as _;
    let repo = root.join("srv/repo");
    let mut debs: Vec<PathBuf> = std::fs::read_dir(&repo)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    debs.sort();
    let mut index = String::new();
    for deb in debs {
        let control = Command::new("dpkg-deb")
            .arg("-f")
            .arg(&deb)
            .output()
            .unwrap();
        assert!(control.status.success());
        let bytes = std::fs::read(&deb).unwrap();
        index.push_str(String::from_utf8(control.stdout).unwrap().trim_end());
        index.push_str(&format!(
            "\nFilename: ./{}\nSize: {}\nSHA256: {}\n\n",
            deb.file_name().unwrap().to_string_lossy(),
            bytes.len(),
            hex::encode(sha2::Sha256::digest(&bytes))
        ));
    }
    std::fs::write(repo.join("Packages"), index).unwrap();
}

/// What dpkg says about `package` in the node root, asked from outside the sandbox with the
/// machine's own dpkg-query (`--admindir`): `(status, version)`, e.g. `("hold ok installed", "1.0-1")`.
pub fn dpkg_state(root: &Path, package: &str) -> Option<(String, String)> {
    let out = Command::new("dpkg-query")
        .arg(format!(
            "--admindir={}",
            root.join("var/lib/dpkg").display()
        ))
        .args(["-W", "-f=${Status}|${Version}", package])
        .output()
        .unwrap();
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).unwrap();
    let (s, v) = text.split_once('|')?;
    Some((s.to_owned(), v.to_owned()))
}

/// Whether the RPM tool chain the dnf test needs is on this machine (Debian packages
/// `dnf`, `dnf-plugins-core`, `rpm`, `createrepo-c`).
pub fn have_rpm_tools() -> bool {
    [
        "/usr/bin/dnf-3",
        "/usr/bin/rpm",
        "/usr/bin/rpmdb",
        "/usr/bin/rpmbuild",
        "/usr/bin/createrepo_c",
        "/usr/lib/python3/dist-packages/dnf-plugins/versionlock.py",
    ]
    .iter()
    .all(|p| Path::new(p).exists())
}

/// A Rocky Linux 9 node root in `root` with this machine's real dnf (Python, libdnf, the
/// versionlock plugin), rpm and their libraries, an empty RPM database at /var/lib/rpm, and
/// dnf pointed at `file:///srv/repo` (no signature check: a test repository).
pub fn rhel_root(root: &Path) {
    let py = "/usr/bin/python3.11";
    install_programs(
        root,
        &[
            "/bin/sh",
            py,
            "/usr/bin/rpm",
            "/usr/bin/rpmdb",
            "/usr/bin/rpmkeys",
            "/usr/bin/chmod",
        ],
    );
    // Rocky's layout: dnf 4 is /usr/bin/dnf-3, and dnf and yum are symlinks to it.
    copy_into(root, Path::new("/usr/bin/dnf-3"));
    for link in ["dnf", "yum"] {
        std::os::unix::fs::symlink("dnf-3", root.join("usr/bin").join(link)).unwrap();
    }
    std::os::unix::fs::symlink("python3.11", root.join("usr/bin/python3")).unwrap();
    copy_tree(
        Path::new("/usr/lib/python3.11"),
        &root.join("usr/lib/python3.11"),
    );
    copy_tree(Path::new("/usr/lib/rpm"), &root.join("usr/lib/rpm"));
    copy_tree(Path::new("/etc/dnf"), &root.join("etc/dnf"));
    let site = Path::new("/usr/lib/python3/dist-packages");
    for module in [
        "dnf",
        "hawkey",
        "libdnf",
        "rpm",
        "gpg",
        "libcomps",
        "dnfpluginscore",
    ] {
        copy_tree(
            &site.join(module),
            &root.join("usr/lib/python3/dist-packages").join(module),
        );
    }
    // Only the plugin the backend uses (the others need modules not copied here).
    copy_into(root, &site.join("dnf-plugins/versionlock.py"));
    // The native modules' libraries.
    let out = Command::new("find")
        .arg(root.join("usr/lib/python3"))
        .arg(root.join("usr/lib/python3.11/lib-dynload"))
        .args(["-name", "*.so*"])
        .output()
        .unwrap();
    for so in String::from_utf8(out.stdout).unwrap().lines() {
        for lib in libraries_of(Path::new(so), None) {
            copy_into(root, &lib);
        }
    }
    for dir in [
        "etc/yum.repos.d",
        "var/lib/rpm",
        "var/lib/dnf",
        "var/cache/dnf",
        "var/log",
        "tmp",
        "srv/repo",
    ] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    // Debian's rpm keeps its database in ~/.rpmdb; a RHEL node keeps it in /var/lib/rpm.
    write(root, "etc/rpm/macros", "%_dbpath /var/lib/rpm\n");
    write(
        root,
        "etc/os-release",
        "NAME=\"Rocky Linux\"\nID=\"rocky\"\nID_LIKE=\"rhel centos fedora\"\nVERSION_ID=\"9.4\"\nPRETTY_NAME=\"Rocky Linux 9.4 (Blue Onyx)\"\n",
    );
    write(
        root,
        "etc/yum.repos.d/test.repo",
        "[bosun-test]\nname=Bosun test repository\nbaseurl=file:///srv/repo\nenabled=1\ngpgcheck=0\n",
    );
    let out = in_root(root, &["/usr/bin/rpm", "--initdb"]);
    assert!(out.status.success(), "rpm --initdb in the node root");
}

/// Builds `package` at `version`-`release` (noarch, one file `/usr/share/NAME/version`)
/// with the real rpmbuild into `root/srv/repo`.
pub fn build_rpm(root: &Path, package: &str, version: &str, release: &str) {
    let work = tempfile::tempdir().unwrap();
    let spec = work.path().join("t.spec");
    std::fs::write(
        &spec,
        format!(
            "Name: {package}\nVersion: {version}\nRelease: {release}\nSummary: Bosun test package\nLicense: Apache-2.0\nBuildArch: noarch\n%description\nBosun test package\n%install\nmkdir -p %{{buildroot}}/usr/share/{package}\necho {version}-{release} > %{{buildroot}}/usr/share/{package}/version\n%files\n/usr/share/{package}/version\n"
        ),
    )
    .unwrap();
    let out = Command::new("rpmbuild")
        .arg("--quiet")
        .arg("--define")
        .arg(format!("_topdir {}", work.path().join("top").display()))
        .arg("--define")
        .arg(format!("_rpmdir {}", root.join("srv/repo").display()))
        .arg("-bb")
        .arg(&spec)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rpmbuild: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs the real createrepo_c over `root/srv/repo`.
pub fn index_rpm_repo(root: &Path) {
    let out = Command::new("createrepo_c")
        .arg("-q")
        .arg(root.join("srv/repo"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "createrepo_c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `args` chrooted into `root`, with an empty environment but `PATH`.
pub fn in_root(root: &Path, args: &[&str]) -> std::process::Output {
    in_root_with_path(root, args, "/usr/bin:/bin")
}

/// [`in_root`] with `path` for `PATH`.
fn in_root_with_path(root: &Path, args: &[&str], path: &str) -> std::process::Output {
    Command::new("/usr/sbin/chroot")
        .arg(root)
        .args(args)
        .env_clear()
        .env("PATH", path)
        .output()
        .unwrap_or_else(|e| panic!("chroot {} {args:?}: {e}", root.display()))
}

/// What rpm says about `package` in the node root (chrooted, as the node would answer).
pub fn rpm_version(root: &Path, package: &str) -> Option<String> {
    let out = in_root(
        root,
        &[
            "/usr/bin/rpm",
            "-q",
            "--qf",
            "%{VERSION}-%{RELEASE}",
            package,
        ],
    );
    out.status
        .success()
        .then(|| String::from_utf8(out.stdout).unwrap())
}

/// The lab (started, or reused when running) and its first control-plane node, for tests
/// that work on a copy of that node's real kubeadm-made root. The lab's client is not for
/// use: the runtime that connected it is gone when this returns.
pub fn lab_control_plane() -> (bosun_lab::LabHandle, bosun_lab::LabNode) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let lab = rt
        .block_on(bosun_lab::ensure_lab())
        .expect("the lab starts");
    let cp = lab
        .nodes
        .iter()
        .find(|n| n.role == bosun_lab::Role::ControlPlane)
        .cloned()
        .expect("a control-plane node");
    (lab, cp)
}

/// Where [`simulated_package_manager`] keeps its package database in a node root: one line
/// per package, `NAME|INSTALLED-VERSION|held (yes/no)|AVAILABLE VERSIONS, space-separated`.
/// Where the simulated tools keep their packages, in the real tools' own database
/// directory, which the example grants' sandboxes let those commands read:
/// `/var/lib/dpkg` (apt-cache, dpkg-query) or `/var/lib/rpm` (dnf, rpm).
pub fn simulated_packages_db(family: &str) -> &'static str {
    if family == "apt" {
        "var/lib/dpkg/bosun-simulated-packages"
    } else {
        "var/lib/rpm/bosun-simulated-packages"
    }
}

/// The package family a node root's os-release belongs to, as the `packages` plugin
/// chooses it: `apt` for Debian-like roots, `dnf` for the RHEL family.
pub fn package_family(root: &Path) -> &'static str {
    let os = std::fs::read_to_string(root.join("etc/os-release")).unwrap_or_default();
    if os.lines().any(|l| {
        (l.starts_with("ID=") || l.starts_with("ID_LIKE="))
            && (l.contains("debian") || l.contains("ubuntu"))
    }) {
        "apt"
    } else {
        "dnf"
    }
}

/// Gives a lab node root a simulated package manager of its family that answers the
/// queries the `packages` plugin makes (`apt-cache madison`, `dpkg-query -W` for apt;
/// `dnf list --showduplicates`, `dnf versionlock list`, `rpm -q` for dnf) from
/// [`simulated_packages_db`], and refuses every change with exit code 100. The tools are
/// `/bin/sh` scripts using shell builtins only (this machine's `/bin/sh` and its libraries
/// are copied in), so they run chrooted in the root as the agent runs granted commands.
/// `packages` is `(name, installed, held, available)`; versions are the upstream
/// Kubernetes version, packaged as pkgs.k8s.io packages it (`-1.1` for deb, `-150500.1.1`
/// for rpm). The lab's roots have no package database of their own (docs/lab.md).
pub fn simulated_package_manager(root: &Path, packages: &[(&str, &str, bool, &[&str])]) {
    install_programs(root, &["/bin/sh"]);
    let family = package_family(root);
    let release = if family == "apt" {
        "-1.1"
    } else {
        "-150500.1.1"
    };
    let db: String = packages
        .iter()
        .map(|(name, installed, held, available)| {
            let avail: Vec<String> = available.iter().map(|v| format!("{v}{release}")).collect();
            format!(
                "{name}|{installed}{release}|{}|{}\n",
                if *held { "yes" } else { "no" },
                avail.join(" ")
            )
        })
        .collect();
    write(root, simulated_packages_db(family), &db);
    let db = format!("/{}", simulated_packages_db(family));
    let refuse = |tool: &str| {
        format!(
            "#!/bin/sh\necho \"{tool} (simulated by the Bosun tests) answers queries only: $*\" >&2\nexit 100\n"
        )
    };
    let scripts: Vec<(&str, String)> = if family == "apt" {
        vec![
            (
                "usr/bin/apt-cache",
                format!(
                    r#"#!/bin/sh
[ "$1" = madison ] && [ $# -eq 2 ] || {{ echo "apt-cache (simulated): only madison NAME" >&2; exit 100; }}
while IFS='|' read -r name installed held available; do
  if [ "$name" = "$2" ]; then
    for v in $available; do echo " $name | $v | https://pkgs.k8s.io/core:/stable:/v1.34/deb  Packages"; done
  fi
done < {db}
"#
                ),
            ),
            (
                "usr/bin/dpkg-query",
                format!(
                    r#"#!/bin/sh
[ "$1" = -W ] && [ $# -eq 3 ] || {{ echo "dpkg-query (simulated): only -W -f=FORMAT NAME" >&2; exit 2; }}
while IFS='|' read -r name installed held available; do
  if [ "$name" = "$3" ] && [ -n "$installed" ]; then
    if [ "$held" = yes ]; then printf 'hold ok installed|%s' "$installed"; else printf 'install ok installed|%s' "$installed"; fi
    exit 0
  fi
done < {db}
echo "dpkg-query: no packages found matching $3" >&2
exit 1
"#
                ),
            ),
            ("usr/bin/apt-get", refuse("apt-get")),
            ("usr/bin/apt-mark", refuse("apt-mark")),
        ]
    } else {
        vec![
            (
                "usr/bin/dnf-3",
                format!(
                    r#"#!/bin/sh
if [ "$1 $2 $3 $4" = "-q list --showduplicates --disableexcludes=all" ] && [ $# -eq 5 ]; then
  while IFS='|' read -r name installed held available; do
    if [ "$name" = "$5" ]; then
      for v in $available; do echo "$name.x86_64  $v  kubernetes"; done
    fi
  done < {db}
  exit 0
fi
if [ "$*" = "-q versionlock list" ]; then
  while IFS='|' read -r name installed held available; do
    if [ "$held" = yes ]; then echo "$name-0:$installed.*"; fi
  done < {db}
  exit 0
fi
echo "dnf (simulated by the Bosun tests) answers queries only: $*" >&2
exit 100
"#
                ),
            ),
            (
                "usr/bin/rpm",
                format!(
                    r#"#!/bin/sh
[ "$1 $2" = "-q --qf" ] && [ $# -eq 4 ] || {{ echo "rpm (simulated): only -q --qf FORMAT NAME" >&2; exit 100; }}
while IFS='|' read -r name installed held available; do
  if [ "$name" = "$4" ] && [ -n "$installed" ]; then printf '%s' "$installed"; exit 0; fi
done < {db}
echo "package $4 is not installed"
exit 1
"#
                ),
            ),
        ]
    };
    for (path, text) in scripts {
        write(root, path, &text);
        let full = root.join(path);
        let mut perms = std::fs::metadata(&full).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&full, perms).unwrap();
    }
    // The RHEL family's layout: dnf 4 is /usr/bin/dnf-3; dnf and yum are symlinks to it.
    if family != "apt" {
        for link in ["usr/bin/dnf", "usr/bin/yum"] {
            let _ = std::fs::remove_file(root.join(link));
            std::os::unix::fs::symlink("dnf-3", root.join(link)).unwrap();
        }
    }
}

/// A simulated etcd cluster as `etcdctl` and `etcdutl` see it, in `root/usr/local/bin`:
/// `members` named `name@ip`, each answering healthy unless its ip is in `down` (then
/// etcdctl prints what 3.6.5 prints for an unreachable member and exits 1); the first
/// member is the leader. `snapshot save PATH` writes a small file at PATH.part and renames it to
/// PATH (through the command's kernel sandbox, as the real one does) and `etcdutl snapshot
/// status PATH` reports revision 42 and 7 keys for a file that exists. The JSON is etcd
/// 3.6.5's (checked against the real tools; docs/operations.md shows their output).
///
/// What the root has already is kept: a lab node's real etcd certificates and kubeadm's etcd
/// manifest are not overwritten (the plugin reads the manifest's annotation; the simulated
/// etcdctl reads no certificate). What it adds, and the snapshot directory, is removed again
/// when the returned guard is dropped, so a shared lab root is left as it was.
#[must_use = "dropping the guard removes the simulated etcd again"]
pub fn simulated_etcd(root: &Path, members: &[&str], down: &[&str]) -> SimulatedEtcd {
    let mut added = SimulatedEtcd {
        root: root.to_owned(),
        created: Vec::new(),
    };
    let programs = ["/bin/sh", "/usr/bin/printf", "/usr/bin/cat", "/usr/bin/mv"];
    for p in programs {
        added.note_if_missing(&p[1..]);
    }
    install_programs(root, &programs);
    let mut list = Vec::new();
    let mut health = Vec::new();
    let mut status = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let (name, ip) = m.split_once('@').expect("name@ip");
        let id = 1000 + i;
        let url = format!("https://{ip}:2379");
        list.push(format!(
            r#"{{"ID":{id},"name":"{name}","peerURLs":["https://{ip}:2380"],"clientURLs":["{url}"]}}"#
        ));
        if down.contains(&ip) {
            health.push(format!(
                r#"{{"endpoint":"{url}","health":false,"took":"3.0s","error":"context deadline exceeded"}}"#
            ));
        } else {
            health.push(format!(
                r#"{{"endpoint":"{url}","health":true,"took":"2.1ms"}}"#
            ));
            status.push(format!(
                r#"{{"Endpoint":"{url}","Status":{{"header":{{"cluster_id":7,"member_id":{id},"revision":42,"raft_term":2}},"version":"3.6.5","dbSize":20480,"leader":1000,"raftIndex":6,"raftTerm":2}}}}"#
            ));
        }
    }
    let failed_status: String = members
        .iter()
        .filter_map(|m| m.split_once('@'))
        .filter(|(_, ip)| down.contains(ip))
        .map(|(_, ip)| {
            format!("echo 'Failed to get the status of endpoint https://{ip}:2379 (context deadline exceeded)' >&2\n")
        })
        .collect();
    let rc = if down.is_empty() { 0 } else { 1 };
    let etcdctl = format!(
        r#"#!/bin/sh
# etcdctl (simulated by the Bosun tests): the queries of the etcd plugin, in etcd 3.6.5's JSON.
while [ $# -gt 0 ]; do case "$1" in --*) shift ;; *) break ;; esac; done
case "$1 $2" in
"member list") cat <<'J'
{{"header":{{"cluster_id":7,"member_id":1000,"raft_term":2}},"members":[{list}]}}
J
;;
"alarm list") echo '{{"header":{{"cluster_id":7,"member_id":1000,"revision":42,"raft_term":2}}}}' ;;
"endpoint health") cat <<'J'
[{health}]
J
[ {rc} = 0 ] || {{ echo 'Error: unhealthy cluster' >&2; exit 1; }} ;;
"endpoint status") cat <<'J'
[{status}]
J
{failed_status}exit {rc} ;;
"snapshot save") printf 'simulated etcd snapshot\n' >"$3.part" && mv "$3.part" "$3" && echo "Snapshot saved at $3" ;;
*) echo "etcdctl (simulated): unexpected $*" >&2; exit 2 ;;
esac
"#,
        list = list.join(","),
        health = health.join(","),
        status = status.join(","),
    );
    let etcdutl = r#"#!/bin/sh
# etcdutl (simulated by the Bosun tests): `snapshot status PATH -w json` of a file that exists.
[ "$1 $2" = "snapshot status" ] && [ -s "$3" ] || { echo "etcdutl (simulated): no snapshot at $3" >&2; exit 1; }
echo '{"hash":3986875425,"revision":42,"totalKey":7,"totalSize":20480,"version":"3.6.0"}'
"#;
    for (name, script) in [("etcdctl", etcdctl.as_str()), ("etcdutl", etcdutl)] {
        let rel = format!("usr/local/bin/{name}");
        added.note_if_missing(&rel);
        write(root, &rel, script);
        std::fs::set_permissions(
            root.join(&rel),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
    }
    for f in ["ca.crt", "healthcheck-client.crt", "healthcheck-client.key"] {
        let rel = format!("etc/kubernetes/pki/etcd/{f}");
        if added.note_if_missing(&rel) {
            write(root, &rel, "simulated\n");
        }
    }
    // kubeadm's etcd static Pod, as far as the plugin reads it: this node is the first member.
    let own_ip = members[0].split_once('@').map_or("", |(_, ip)| ip);
    if added.note_if_missing("etc/kubernetes/manifests/etcd.yaml") {
        write(
            root,
            "etc/kubernetes/manifests/etcd.yaml",
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  annotations:\n    kubeadm.kubernetes.io/etcd.advertise-client-urls: https://{own_ip}:2379\n  name: etcd\n  namespace: kube-system\n"
            ),
        );
    }
    added
}

/// What [`simulated_etcd`] added to a root; removed again when dropped.
#[derive(Debug)]
pub struct SimulatedEtcd {
    root: PathBuf,
    /// Paths relative to the root, in the order they were created.
    created: Vec<String>,
}

impl SimulatedEtcd {
    /// Records `rel` to remove later if it does not exist yet; true when it did not.
    fn note_if_missing(&mut self, rel: &str) -> bool {
        let missing = !self.root.join(rel).exists();
        if missing {
            self.created.push(rel.to_owned());
        }
        missing
    }

    /// Creates the snapshot directory the etcd plugin writes in (removed with the rest).
    pub fn snapshot_dir(&mut self) -> PathBuf {
        let rel = "var/lib/etcd-snapshots";
        self.note_if_missing(rel);
        let dir = self.root.join(rel);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}

impl Drop for SimulatedEtcd {
    fn drop(&mut self) {
        for rel in self.created.iter().rev() {
            let path = self.root.join(rel);
            let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir_all(&path));
        }
    }
}

/// The Debian packages of zypper and what it needs beyond this machine's libraries.
/// Downloaded once (`apt-get download`, into `~/.cache/bosun/zypper-debs`) and unpacked,
/// never installed: installing Debian's zypper would remove dnf-plugins-core, which the dnf
/// tests need.
const ZYPPER_DEBS: &[&str] = &[
    "zypper",
    "zypper-common",
    "libzypp1722",
    "libzypp-common",
    "libzypp-config",
    "libaugeas0",
    "augeas-lenses",
    "libboost-thread1.74.0",
    "libproxy1v5",
    "libsigc++-2.0-0v5",
    "libsolv-tools",
    "libyaml-cpp0.7",
];

/// zypper and its libraries unpacked (the directory holds `usr/bin/zypper`).
fn zypper_stage() -> PathBuf {
    static STAGE: OnceLock<PathBuf> = OnceLock::new();
    STAGE
        .get_or_init(|| unpacked_debs("BOSUN_ZYPPER_DEBS", "zypper-debs", ZYPPER_DEBS))
        .clone()
}

/// The Debian packages `debs`, downloaded once with `apt-get download` into
/// `$<env>` or `~/.cache/bosun/<cache>`, and unpacked (never installed) into its `stage`
/// directory, which is returned.
fn unpacked_debs(env: &str, cache: &str, debs: &[&str]) -> PathBuf {
    let cache = std::env::var_os(env).map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/bosun")
                .join(cache)
        },
        PathBuf::from,
    );
    let stage = cache.join("stage");
    if stage.is_dir() {
        return stage;
    }
    std::fs::create_dir_all(&cache).unwrap();
    let out = Command::new("apt-get")
        .current_dir(&cache)
        .arg("download")
        .args(debs)
        .output()
        .expect("apt-get download");
    assert!(
        out.status.success(),
        "apt-get download {}: {}",
        debs.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    let partial = cache.join("stage.partial");
    let _ = std::fs::remove_dir_all(&partial);
    for deb in std::fs::read_dir(&cache).unwrap() {
        let deb = deb.unwrap().path();
        if deb.extension().is_some_and(|e| e == "deb") {
            let status = Command::new("dpkg-deb")
                .arg("-x")
                .arg(&deb)
                .arg(&partial)
                .status()
                .unwrap();
            assert!(status.success(), "dpkg-deb -x {}", deb.display());
        }
    }
    std::fs::rename(&partial, &stage).unwrap();
    stage
}

/// Copies an unpacked `stage` into `root`, then each of its `staged` programs and this
/// machine's `programs` with the libraries they load (found in the stage's `libs` first;
/// those are in the copy already) at the same paths.
fn lay_out_stage(root: &Path, stage: &Path, libs: &str, staged: &[&str], programs: &[&str]) {
    std::fs::create_dir_all(root).unwrap();
    let status = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", stage.display()))
        .arg(root)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "cp -a {}/. {}",
        stage.display(),
        root.display()
    );
    let libs = stage.join(libs);
    let programs = staged
        .iter()
        .map(|p| stage.join(p))
        .chain(programs.iter().map(PathBuf::from));
    for program in programs {
        if !program.starts_with(stage) {
            copy_into(root, &program);
        }
        for lib in libraries_of(&program, Some(&libs)) {
            if !lib.starts_with(stage) {
                copy_into(root, &lib);
            }
        }
    }
}

/// Debian's OpenRC: `openrc` and the two libraries it adds to this machine's.
const OPENRC_DEBS: &[&str] = &["openrc", "librc1", "libeinfo1"];

/// The programs OpenRC's scripts run (`openrc-run.sh`, `supervise-daemon.sh`), and `sleep`,
/// the stand-in kubelet's daemon.
const OPENRC_PROGRAMS: &[&str] = &[
    "/bin/sh",
    "/bin/grep",
    "/bin/sed",
    "/bin/cat",
    "/bin/mkdir",
    "/bin/rm",
    "/bin/ln",
    "/usr/bin/tr",
    "/usr/bin/cut",
    "/bin/sleep",
];

/// A node root whose init system is OpenRC: the real OpenRC 0.45 (Debian's build, as
/// Debian installs it with `apt install openrc`), `/run/openrc` as `openrc` leaves it at
/// boot (`softlevel` and its state directories; the agent chooses OpenRC by it), and a
/// `kubelet` service, `/etc/init.d/kubelet`, supervised by OpenRC's `supervise-daemon`.
/// Its daemon is a stand-in (`sleep`: the root has no container runtime for a real
/// kubelet); each start of the service appends a line to `/var/log/kubelet-starts`. Use
/// it through [`OpenRcNode`], which gives it the `/proc` OpenRC needs. Needs root.
pub fn openrc_root(root: &Path) {
    let stage = unpacked_debs("BOSUN_OPENRC_DEBS", "openrc-debs", OPENRC_DEBS);
    lay_out_stage(
        root,
        &stage,
        "lib/x86_64-linux-gnu",
        &[
            "sbin/rc-service",
            "sbin/openrc-run",
            "sbin/supervise-daemon",
        ],
        OPENRC_PROGRAMS,
    );
    for dir in [
        "etc/conf.d",
        "usr/local/etc/init.d",
        "usr/local/etc/conf.d",
        "var/log",
        "tmp",
    ] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::os::unix::fs::symlink("../run", root.join("var/run")).unwrap();
    std::fs::create_dir_all(root.join("proc")).unwrap();
    std::fs::create_dir_all(root.join("dev")).unwrap();
    let null = Command::new("mknod")
        .args(["-m", "666"])
        .arg(root.join("dev/null"))
        .args(["c", "1", "3"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(null, "mknod {}/dev/null", root.display());
    for dir in [
        "daemons",
        "exclusive",
        "failed",
        "hotplugged",
        "inactive",
        "options",
        "scheduled",
        "started",
        "starting",
        "stopping",
        "tmp",
        "wasinactive",
    ] {
        std::fs::create_dir_all(root.join("run/openrc").join(dir)).unwrap();
    }
    write(root, "run/openrc/softlevel", "default");
    // Debian's openrc reads insserv's configuration (its `insserv` package ships it).
    write(root, "etc/insserv.conf", "");
    write(
        root,
        "etc/os-release",
        "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\nVERSION_ID=\"12\"\nID=debian\n",
    );
    write(
        root,
        "etc/init.d/kubelet",
        "#!/sbin/openrc-run\n\
         description=\"the kubelet (a stand-in daemon in this test root)\"\n\
         command=/bin/sleep\n\
         command_args=infinity\n\
         supervisor=supervise-daemon\n\
         start_pre() {\n\
         \techo started >> /var/log/kubelet-starts\n\
         }\n",
    );
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(
        root.join("etc/init.d/kubelet"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
}

/// Runs `rc-service args...` in an OpenRC node root (chrooted, with the environment the
/// agent gives it).
pub fn rc_service(root: &Path, args: &[&str]) -> std::process::Output {
    let args: Vec<&str> = std::iter::once("/sbin/rc-service")
        .chain(args.iter().copied())
        .collect();
    in_root_with_path(root, &args, bosun_host::openrc::PATH)
}

/// An [`openrc_root`] in use: `/proc` is mounted in it (OpenRC's supervisors find their
/// daemons there, as on a booted node). When dropped, every service OpenRC started there
/// is stopped and `/proc` unmounted; drop it before the directory holding the root.
pub struct OpenRcNode {
    pub root: PathBuf,
}

impl OpenRcNode {
    /// Builds an [`openrc_root`] at `root` and mounts `/proc` in it.
    pub fn new(root: &Path) -> OpenRcNode {
        openrc_root(root);
        let node = OpenRcNode {
            root: root.to_owned(),
        };
        let status = Command::new("mount")
            .args(["-t", "proc", "proc"])
            .arg(root.join("proc"))
            .status()
            .unwrap();
        assert!(status.success(), "mounting /proc in {}", root.display());
        node
    }
}

/// The processes whose `/` is `root` (in an [`OpenRcNode`]: the services' supervisors and
/// daemons).
pub fn processes_in(root: &Path) -> Vec<u32> {
    let root = root.canonicalize().unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/root")).is_ok_and(|r| r == root))
        .collect()
}

impl Drop for OpenRcNode {
    fn drop(&mut self) {
        stop_openrc(&self.root);
    }
}

/// Stops every service OpenRC started in an [`openrc_root`] and unmounts its `/proc`: what
/// dropping an [`OpenRcNode`] does, for a root an earlier run left behind.
pub fn stop_openrc(root: &Path) {
    if let Ok(started) = std::fs::read_dir(root.join("run/openrc/started")) {
        for s in started.flatten() {
            let name = s.file_name().to_string_lossy().into_owned();
            let _ = rc_service(root, &[&name, "stop"]);
        }
    }
    let _ = Command::new("umount")
        .arg("-l")
        .arg(root.join("proc"))
        .stderr(std::process::Stdio::null())
        .status();
}

/// An openSUSE Leap 15.6 node root: the real zypper (Debian's build of it, with libzypp),
/// this machine's rpm, an rpm database in `/var/lib/rpm` holding `glibc` (zypper's system
/// check requires it, as on a real node), and one repository, `file:///srv/repo`
/// (`build_rpm` and `index_rpm_repo` fill it). Needs root.
pub fn suse_root(root: &Path) {
    let stage = zypper_stage();
    lay_out_stage(
        root,
        &stage,
        "usr/lib/x86_64-linux-gnu",
        &["usr/bin/zypper"],
        &[
            "/usr/bin/rpm",
            "/usr/bin/rpmdb",
            "/usr/bin/rpmkeys",
            "/usr/bin/gpg",
            "/bin/sh",
            // libzypp copies repository files with cp where it cannot hardlink them
            // (across the kernel sandbox's rules, it cannot).
            "/usr/bin/cp",
            "/bin/cp",
        ],
    );
    copy_tree(Path::new("/usr/lib/rpm"), &root.join("usr/lib/rpm"));
    for dir in [
        "etc/zypp/repos.d",
        "var/lib/rpm",
        "var/lib/zypp",
        "var/cache/zypp",
        "var/log",
        "run",
        "tmp",
        "srv/repo",
    ] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    write(root, "etc/rpm/macros", "%_dbpath /var/lib/rpm\n");
    write(
        root,
        "etc/os-release",
        "NAME=\"openSUSE Leap\"\nVERSION=\"15.6\"\nID=\"opensuse-leap\"\nID_LIKE=\"suse opensuse\"\nVERSION_ID=\"15.6\"\nPRETTY_NAME=\"openSUSE Leap 15.6\"\n",
    );
    write(
        root,
        "etc/zypp/repos.d/test.repo",
        "[bosun-test]\nname=Bosun test repository\nbaseurl=file:///srv/repo\nenabled=1\ngpgcheck=0\nautorefresh=1\n",
    );
    let chroot = |args: &[&str]| {
        let out = in_root(root, args);
        assert!(
            out.status.success(),
            "{args:?} in the SUSE root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    chroot(&["/usr/bin/rpm", "--initdb"]);
    let glibc = tempfile::tempdir().unwrap();
    build_rpm(glibc.path(), "glibc", "2.38", "150600.1");
    std::fs::copy(
        glibc
            .path()
            .join("srv/repo/noarch/glibc-2.38-150600.1.noarch.rpm"),
        root.join("tmp/glibc.rpm"),
    )
    .unwrap();
    chroot(&["/usr/bin/rpm", "-i", "--nodeps", "/tmp/glibc.rpm"]);
    std::fs::remove_file(root.join("tmp/glibc.rpm")).unwrap();
}

/// Now as RFC 3339 UTC to the second (`2026-12-06T15:04:05Z`): a `renew` step's
/// `issuedBefore` when everything issued until now is to be renewed.
#[must_use]
pub fn utc_now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
