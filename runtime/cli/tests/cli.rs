//! End-to-end tests of the `kubectl-bosun` binary: each test runs the built binary as a
//! user would and checks its output, exit code and the files it writes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Every command and error path, driven with a plugin whose every text is hostile.
#[path = "hostile_output/mod.rs"]
mod hostile_output;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kubectl-bosun"))
}

// The test's own log of what ran (runtime/cli/clippy.toml refuses printing macros to the
// CLI's code, which must print through its escaping writers).
#[allow(clippy::disallowed_macros)]
fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("starting kubectl-bosun");
    eprintln!(
        "$ {cmd:?}\n--- exit {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// Makes a key pair in `dir` with `stem`, returning (private, public) paths.
fn keygen(dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
    let out = run(bin()
        .args(["plugin", "keygen", "--stem", stem, "--out"])
        .arg(dir));
    assert!(out.status.success());
    (
        dir.join(format!("{stem}.key")),
        dir.join(format!("{stem}.pub")),
    )
}

/// `kubectl-bosun plugin verify --trust-root ROOT PLUGIN`.
fn verify_with(root: &Path, plugin: &Path) -> Output {
    run(bin()
        .args(["plugin", "verify", "--trust-root"])
        .arg(root)
        .arg(plugin))
}

/// `kubectl-bosun plugin sign --name NAME --version VERSION --key KEY PLUGIN`.
fn sign_as(key: &Path, plugin: &Path, name: &str, version: &str) -> Output {
    run(bin()
        .args([
            "plugin",
            "sign",
            "--name",
            name,
            "--version",
            version,
            "--key",
        ])
        .arg(key)
        .arg(plugin))
}

/// `kubectl-bosun plugin statement --name NAME --version VERSION PLUGIN`.
fn statement(plugin: &Path, name: &str, version: &str) -> Output {
    run(bin()
        .args(["plugin", "statement", "--name", name, "--version", version])
        .arg(plugin))
}

#[test]
fn keygen_writes_a_private_key_only_the_owner_can_read_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "admin");
    let key_pem = std::fs::read_to_string(&key).unwrap();
    assert!(
        key_pem.starts_with("-----BEGIN PRIVATE KEY-----"),
        "{key_pem}"
    );
    assert!(
        std::fs::read_to_string(&public)
            .unwrap()
            .starts_with("-----BEGIN PUBLIC KEY-----")
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    let again = run(bin()
        .args(["plugin", "keygen", "--stem", "admin", "--out"])
        .arg(dir.path()));
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("admin.key"), "{}", stderr(&again));
    assert_eq!(
        std::fs::read_to_string(&key).unwrap(),
        key_pem,
        "the existing key must be untouched"
    );
}

#[test]
fn sign_then_verify_accepts_the_signed_bytes_and_refuses_tampered_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "admin");
    let plugin = dir.path().join("p.wasm");
    // Signing and verifying look only at the bytes when name and version are given.
    std::fs::write(&plugin, b"\0asm pretend component bytes").unwrap();

    let signed = sign_as(&key, &plugin, "demo", "1.2.3");
    assert!(signed.status.success());
    assert!(
        stdout(&signed).contains("signed demo 1.2.3 sha256:"),
        "{}",
        stdout(&signed)
    );
    let bundle_path = dir.path().join("p.wasm.sig.json");
    let bundle: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&bundle_path).unwrap()).unwrap();
    assert_eq!(bundle["name"], "demo");
    assert_eq!(bundle["signatures"][0]["algorithm"], "ed25519");

    let ok = verify_with(&public, &plugin);
    assert!(ok.status.success());
    assert!(
        stdout(&ok).contains("verified demo 1.2.3 sha256:"),
        "{}",
        stdout(&ok)
    );

    let mut bytes = std::fs::read(&plugin).unwrap();
    bytes[6] ^= 1;
    std::fs::write(&plugin, &bytes).unwrap();
    let tampered = verify_with(&public, &plugin);
    assert_eq!(tampered.status.code(), Some(1));
    let err = stderr(&tampered);
    assert!(err.contains("did not verify"), "{err}");
    assert!(
        err.contains("is pinned"),
        "the digest mismatch must be named: {err}"
    );
}

#[test]
fn verify_refuses_a_signature_by_a_key_outside_the_trust_roots() {
    let dir = tempfile::tempdir().unwrap();
    let (key, _) = keygen(dir.path(), "someone");
    let (_, trusted) = keygen(dir.path(), "admin");
    let plugin = dir.path().join("p.wasm");
    std::fs::write(&plugin, b"bytes").unwrap();
    assert!(sign_as(&key, &plugin, "demo", "1.0.0").status.success());
    let out = verify_with(&trusted, &plugin);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("not signed by a trusted key"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn statement_prints_the_exact_bytes_signatures_cover() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("p.wasm");
    std::fs::write(&plugin, b"abc").unwrap();
    let out = statement(&plugin, "demo", "0.1.0");
    assert!(out.status.success());
    assert_eq!(
        stdout(&out),
        "bosun.dev/plugin-signature/v1\nname: demo\nversion: 0.1.0\n\
         sha256: ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n"
    );
}

#[test]
fn verify_without_a_bundle_says_how_to_sign() {
    let dir = tempfile::tempdir().unwrap();
    let (_, public) = keygen(dir.path(), "admin");
    let plugin = dir.path().join("p.wasm");
    std::fs::write(&plugin, b"bytes").unwrap();
    let out = verify_with(&public, &plugin);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("kubectl bosun plugin sign"),
        "{}",
        stderr(&out)
    );
}

/// Where these tests build plugins. Not the workspace's target directory itself: the
/// `cargo test` running these tests holds that directory's lock until the tests finish,
/// so a nested `cargo build` there would wait forever.
fn plugin_target_dir() -> PathBuf {
    target_dir().join("cli-test-plugins")
}

/// Builds the hello example plugin once per test binary.
fn hello_wasm() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(workspace_root())
            .env("CARGO_TARGET_DIR", plugin_target_dir())
            .args([
                "build",
                "--release",
                "--target",
                "wasm32-wasip2",
                "-p",
                "bosun-plugin-hello",
            ])
            .status()
            .expect("running cargo");
        assert!(
            status.success(),
            "building the hello plugin failed; is `rustup target add wasm32-wasip2` done?"
        );
        plugin_target_dir().join("wasm32-wasip2/release/bosun_plugin_hello.wasm")
    })
}

/// A host root with an os-release and `/usr/bin/uname` (run without chroot, so the tests
/// need no privileges).
fn host_root(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    std::fs::write(
        root.join("etc/os-release"),
        "NAME=\"Testix\"\nPRETTY_NAME=\"Testix 1.0\"\nID=testix\n",
    )
    .unwrap();
    std::fs::copy("/usr/bin/uname", root.join("usr/bin/uname")).unwrap();
    root
}

/// Copies the hello plugin into `dir` and signs it there; returns (plugin, public key).
fn signed_hello(dir: &Path) -> (PathBuf, PathBuf) {
    let (key, public) = keygen(dir, "admin");
    let plugin = dir.join("hello.wasm");
    std::fs::copy(hello_wasm(), &plugin).unwrap();
    let out = run(bin()
        .args(["plugin", "sign", "--key"])
        .arg(&key)
        .arg(&plugin));
    assert!(out.status.success());
    // Name and version come from the plugin's own describe().
    assert!(
        stdout(&out).contains(&format!(
            "signed hello {} sha256:",
            env!("CARGO_PKG_VERSION")
        )),
        "{}",
        stdout(&out)
    );
    (plugin, public)
}

/// A signed `hello`, the public key that verifies it, a host root and `hello`'s grants, in
/// a directory of their own (removed when this is dropped).
struct Hello {
    _dir: tempfile::TempDir,
    plugin: PathBuf,
    public: PathBuf,
    root: PathBuf,
    grants: PathBuf,
}

impl Hello {
    fn new() -> Hello {
        let dir = tempfile::tempdir().unwrap();
        let (plugin, public) = signed_hello(dir.path());
        let root = host_root(dir.path());
        let grants = dir.path().join("grants.yaml");
        std::fs::write(&grants, HELLO_GRANTS).unwrap();
        Hello {
            _dir: dir,
            plugin,
            public,
            root,
            grants,
        }
    }

    /// `kubectl-bosun plugin run <hello> greet <args> --grants <hello's> --host-root <root>
    /// --trust-root <public>`.
    fn greet(&self, args: &[&str]) -> Output {
        run(bin()
            .args(["plugin", "run"])
            .arg(&self.plugin)
            .arg("greet")
            .args(args)
            .arg("--grants")
            .arg(&self.grants)
            .arg("--host-root")
            .arg(&self.root)
            .arg("--trust-root")
            .arg(&self.public))
    }
}

const HELLO_GRANTS: &str = "filesystem:\n  - path: /etc\nexec:\n  - command: /usr/bin/uname\n    args: [[\"-r\"]]\n    dryRun: true\n";

#[test]
fn inspect_shows_what_hello_declares() {
    let dir = tempfile::tempdir().unwrap();
    let (plugin, _) = signed_hello(dir.path());
    let out = run(bin().args(["plugin", "inspect"]).arg(&plugin));
    assert!(out.status.success());
    let text = stdout(&out);
    for expected in [
        "name:        hello",
        "abi:         bosun:plugin@0.2.0",
        "greet (idempotent)",
        "\"file\"",
        "filesystem /etc (ReadOnly)",
        "exec /usr/bin/uname -r",
        "signatures:  1 in",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    let json = run(bin().args(["plugin", "inspect", "-o", "json"]).arg(&plugin));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["actions"][0]["idempotent"], true);
    assert_eq!(
        v["actions"][0]["paramsSchema"]["properties"]["file"]["type"],
        "string"
    );
}

#[test]
fn run_hello_with_its_grants_prints_checks_logs_progress_and_outcome() {
    let hello = Hello::new();
    let kernel = String::from_utf8(
        Command::new("/usr/bin/uname")
            .arg("-r")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();

    let out = hello.greet(&[
        "--params",
        r#"{"name":"tester"}"#,
        "--exec-isolation",
        "resolve-only",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    for expected in [
        "verified: signed by sha256:",
        "pass file-readable: /etc/os-release is readable",
        "[info] greeting the node as tester",
        "progress 2/2: done",
        &format!(
            "outcome: unchanged: hello from tester to Testix 1.0 (kernel {})",
            kernel.trim()
        ),
        "os = Testix 1.0",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

/// The agent's capabilities gate, locally: a plugin requesting more than its grants is
/// refused before its preflight, naming the request, as a node refuses it
/// (capabilities-denied), not halfway through the action.
#[test]
fn run_without_the_exec_grant_is_refused_before_preflight_naming_the_capability() {
    let dir = tempfile::tempdir().unwrap();
    let (plugin, public) = signed_hello(dir.path());
    let root = host_root(dir.path());
    let grants = dir.path().join("grants.yaml");
    std::fs::write(&grants, "filesystem:\n  - path: /etc\n").unwrap();
    let out = run(bin()
        .args(["plugin", "run"])
        .arg(&plugin)
        .args(["greet", "--exec-isolation", "resolve-only", "--grants"])
        .arg(&grants)
        .arg("--host-root")
        .arg(&root)
        .arg("--trust-root")
        .arg(&public));
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("the plugin's capabilities were denied"),
        "{err}"
    );
    assert!(
        err.contains("/usr/bin/uname") && err.contains("-r"),
        "the missing capability must be named: {err}"
    );
    let text = stdout(&out);
    assert!(
        !text.contains("preflight") && !text.contains("run greet"),
        "nothing of the plugin may run after a capabilities deny:\n{text}"
    );
}

/// With --policy, the capabilities policies judge the plugin after requested ⊆ granted,
/// as on a node: capability-limits refuses a read-write grant outside /etc/kubernetes.
#[test]
fn run_applies_the_capabilities_policies_given() {
    let dir = tempfile::tempdir().unwrap();
    let (plugin, public) = signed_hello(dir.path());
    let root = host_root(dir.path());
    let grants = dir.path().join("grants.yaml");
    std::fs::write(
        &grants,
        "filesystem:\n  - path: /etc\n    access: ReadWrite\nexec:\n  - command: /usr/bin/uname\n    args: [[\"-r\"]]\n",
    )
    .unwrap();
    let policy = workspace_root().join("policies/capability-limits");
    let args = |with_policy: bool| {
        let mut cmd = bin();
        cmd.args(["plugin", "run"])
            .arg(&plugin)
            .args(["greet", "--exec-isolation", "resolve-only", "--grants"])
            .arg(&grants)
            .arg("--host-root")
            .arg(&root)
            .arg("--trust-root")
            .arg(&public);
        if with_policy {
            cmd.arg("--policy").arg(&policy);
        }
        cmd
    };
    let denied = run(&mut args(true));
    assert_eq!(denied.status.code(), Some(2));
    let err = stderr(&denied);
    assert!(
        err.contains("capability-limits: filesystem: /etc is granted read-write to plugin hello"),
        "{err}"
    );
    assert!(
        !stdout(&denied).contains("preflight"),
        "{}",
        stdout(&denied)
    );
    // The same grants without the policy: requested ⊆ granted holds, the plugin runs.
    let allowed = run(&mut args(false));
    assert_eq!(allowed.status.code(), Some(0), "{}", stderr(&allowed));
    assert!(
        stdout(&allowed).contains("capabilities: every request granted"),
        "{}",
        stdout(&allowed)
    );
}

/// A Plugin manifest works as --grants: its spec.grants are used.
#[test]
fn run_takes_the_grants_of_a_plugin_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let (plugin, public) = signed_hello(dir.path());
    let root = host_root(dir.path());
    let out = run(bin()
        .args(["plugin", "run"])
        .arg(&plugin)
        .args(["greet", "--exec-isolation", "resolve-only", "--grants"])
        .arg(workspace_root().join("deploy/examples/plugin-hello.yaml"))
        .arg("--host-root")
        .arg(&root)
        .arg("--trust-root")
        .arg(&public));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("outcome: unchanged: hello from"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn run_with_a_file_outside_the_grants_stops_at_preflight_naming_the_grant() {
    let hello = Hello::new();
    let out = hello.greet(&[
        "--params",
        r#"{"file":"/var/lib/motd"}"#,
        "--exec-isolation",
        "resolve-only",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stdout(&out).contains("FAIL file-readable"),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains("filesystem grant"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("the action did not run"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn run_refuses_a_plugin_changed_after_signing() {
    let dir = tempfile::tempdir().unwrap();
    let (plugin, public) = signed_hello(dir.path());
    let root = host_root(dir.path());
    let mut bytes = std::fs::read(&plugin).unwrap();
    bytes.push(0);
    std::fs::write(&plugin, bytes).unwrap();
    let out = run(bin()
        .args(["plugin", "run"])
        .arg(&plugin)
        .args(["greet", "--host-root"])
        .arg(&root)
        .arg("--trust-root")
        .arg(&public));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("refused before compiling"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn run_refuses_params_outside_the_declared_schema_naming_the_field() {
    let hello = Hello::new();
    let out = hello.greet(&["--params", r#"{"name": 7}"#]);
    // The host checks params against the schema `greet` declares before the plugin runs:
    // a host refusal (exit 1), naming the action and the offending field.
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("invalid params") && err.contains("`greet`") && err.contains("at `/name`"),
        "{err}"
    );
}

/// `new` → build → keygen → sign → run, the plugin author's whole first loop. Slow: it
/// builds a fresh crate for wasm32-wasip2.
#[test]
fn new_scaffolds_a_crate_that_builds_signs_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let crate_dir = dir.path().join("disk-report");
    let out = run(bin()
        .args(["plugin", "new", "disk-report", "--dir"])
        .arg(&crate_dir)
        .arg("--sdk-path")
        .arg(workspace_root().join("sdk/rust")));
    assert!(out.status.success());
    // Resolve dependencies as the workspace did, so the build reuses what is compiled.
    std::fs::copy(
        workspace_root().join("Cargo.lock"),
        crate_dir.join("Cargo.lock"),
    )
    .unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let build_target = plugin_target_dir();
    let status = Command::new(cargo)
        .current_dir(&crate_dir)
        .env("CARGO_TARGET_DIR", &build_target)
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .status()
        .unwrap();
    assert!(status.success(), "the scaffolded crate must build");
    let wasm = build_target.join("wasm32-wasip2/release/disk_report.wasm");

    let (key, public) = keygen(dir.path(), "admin");
    assert!(
        run(bin().args(["plugin", "sign", "--key"]).arg(&key).arg(&wasm))
            .status
            .success()
    );
    let root = host_root(dir.path());
    let out = run(bin()
        .args(["plugin", "run"])
        .arg(&wasm)
        .arg("check")
        .arg("--grants")
        .arg(crate_dir.join("grants.yaml"))
        .arg("--host-root")
        .arg(&root)
        .arg("--trust-root")
        .arg(&public));
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(text.contains("plugin disk-report 0.1.0"), "{text}");
    assert!(
        text.contains("outcome: unchanged: read /etc/os-release"),
        "{text}"
    );
    assert!(text.contains("firstLine = NAME=\"Testix\""), "{text}");
}

#[test]
fn new_refuses_a_name_that_cannot_be_signed() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(bin()
        .args(["plugin", "new", "Bad_Name", "--dir"])
        .arg(dir.path().join("x")));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("lowercase DNS label"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn p256_keys_from_keygen_sign_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(bin()
        .args(["plugin", "keygen", "--algorithm", "p256", "--out"])
        .arg(dir.path()));
    assert!(out.status.success());
    let plugin = dir.path().join("p.wasm");
    std::fs::write(&plugin, b"bytes").unwrap();
    let signed = sign_as(
        &dir.path().join("bosun-signing.key"),
        &plugin,
        "demo",
        "1.0.0",
    );
    assert!(
        stdout(&signed).contains("signature: ecdsa-p256-sha256 by sha256:"),
        "{}",
        stdout(&signed)
    );
    let ok = verify_with(&dir.path().join("bosun-signing.pub"), &plugin);
    assert!(ok.status.success());
    assert!(
        stdout(&ok).contains("(ecdsa-p256-sha256, trust root"),
        "{}",
        stdout(&ok)
    );
}

/// The cosign path: sign the bytes `plugin statement` prints with a P-256 key outside
/// kubectl-bosun (as `cosign sign-blob` does), attach the base64 signature, verify.
#[test]
fn an_external_p256_signature_over_the_statement_is_attached_and_verifies() {
    use base64::Engine as _;
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("p.wasm");
    std::fs::write(&plugin, b"bytes").unwrap();
    let statement = statement(&plugin, "demo", "2.0.0");
    assert!(statement.status.success());

    let team_key = bosun_trust::SigningKey::generate_p256();
    let signature =
        base64::engine::general_purpose::STANDARD.encode(team_key.sign_bytes(&statement.stdout));
    let sig_file = dir.path().join("statement.sig");
    std::fs::write(&sig_file, format!("{signature}\n")).unwrap();
    let public = dir.path().join("team.pub");
    std::fs::write(&public, team_key.public_key().to_pem()).unwrap();

    let attach = run(bin()
        .args([
            "plugin",
            "sign",
            "--name",
            "demo",
            "--version",
            "2.0.0",
            "--cosign-signature",
        ])
        .arg(format!("@{}", sig_file.display()))
        .arg(&plugin));
    assert!(attach.status.success());
    let ok = verify_with(&public, &plugin);
    assert!(ok.status.success());
    assert!(
        stdout(&ok).contains("verified demo 2.0.0"),
        "{}",
        stdout(&ok)
    );

    // A signature over a different statement (another version) must not verify.
    let other = dir.path().join("q.wasm");
    std::fs::write(&other, b"bytes").unwrap();
    let attach = run(bin()
        .args([
            "plugin",
            "sign",
            "--name",
            "demo",
            "--version",
            "2.0.1",
            "--cosign-signature",
        ])
        .arg(format!("@{}", sig_file.display()))
        .arg(&other));
    assert!(attach.status.success());
    let refused = verify_with(&public, &other);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("not signed by a trusted key"),
        "{}",
        stderr(&refused)
    );
}

#[test]
fn dry_run_is_passed_to_the_plugin_and_reported() {
    let hello = Hello::new();
    let out = hello.greet(&["--dry-run", "--exec-isolation", "resolve-only"]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(text.contains("run greet (dry run):"), "{text}");
    assert!(
        text.contains("outcome: unchanged: would greet Testix 1.0"),
        "{text}"
    );
}

/// `--version` prints the workspace's version and the commit the binary was built from
/// (runtime/build/version.rs): the `HEAD` of this checkout when it is a git checkout, so a
/// build script that stopped noticing commits fails here.
#[test]
fn version_names_the_workspace_version_and_the_commit() {
    let out = run(bin().arg("--version"));
    let printed = stdout(&out);
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(workspace_root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let commit = std::env::var("BOSUN_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or(head)
        .unwrap_or_else(|| "unknown".to_owned());
    assert_eq!(
        printed.trim_end(),
        format!(
            "kubectl-bosun {} (commit {commit})",
            env!("CARGO_PKG_VERSION")
        )
    );
}

/// `plugin test`: the conformance kit from a kit file whose paths are relative to it.
/// hello passes on a root with its grants (exit 0, JUnit and JSON written); a grant it does
/// not use makes the kit fail (exit 2) and name the grant.
#[test]
fn plugin_test_runs_the_kit_file_and_fails_on_an_unused_grant() {
    let hello = Hello::new();
    let dir = hello.plugin.parent().unwrap().to_owned();
    std::fs::write(
        dir.join("kit.yaml"),
        "plugin: hello.wasm\ngrants: grants.yaml\ntrustRoots: [admin.pub]\ndeadlineSeconds: 30\n\
         roots:\n  - name: testix\n    path: root\n\
         cases:\n  - action: greet\n    params: {name: kit}\n    outputsSchema: {required: [os, kernel]}\n",
    )
    .unwrap();
    let junit = dir.join("kit.xml");
    let json = dir.join("kit.json");
    let out = run(bin()
        .args(["plugin", "test"])
        .arg(dir.join("kit.yaml"))
        .args(["--exec-isolation", "resolve-only", "--junit"])
        .arg(&junit)
        .arg("--json")
        .arg(&json));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    for expected in [
        "root testix:",
        "pass  dry-run-changes-nothing  root unchanged",
        "pass  outputs-match-schema     2 output(s) match",
        "pass  idempotent               the second run changed nothing: hello from kit to Testix 1.0",
        "used    exec /usr/bin/uname -r (dryRun)",
        "PASSED: 6 passed, 0 failed, 0 skipped; 2 of 2 grants used",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("tests=\"8\" failures=\"0\""), "{xml}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["plugin"], "hello");
    assert_eq!(report["runs"].as_array().unwrap().len(), 3);

    let wider = format!("{HELLO_GRANTS}  - command: /usr/bin/uname\n    args: [[\"-a\"]]\n");
    std::fs::write(&hello.grants, wider).unwrap();
    let out = run(bin()
        .args(["plugin", "test"])
        .arg(dir.join("kit.yaml"))
        .args(["--exec-isolation", "resolve-only"]));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{text}{}", stderr(&out));
    assert!(
        text.contains("UNUSED  exec /usr/bin/uname -a: wider than needed"),
        "{text}"
    );
    assert!(
        text.contains("FAILED: 6 passed, 0 failed, 0 skipped; 2 of 3 grants used"),
        "{text}"
    );

    // A kit naming a root it does not have is refused before anything runs.
    std::fs::write(
        dir.join("bad.yaml"),
        "plugin: hello.wasm\ngrants: grants.yaml\ntrustRoots: [admin.pub]\n\
         roots: [{name: testix, path: root}]\ncases: [{action: greet, roots: [suse]}]\n",
    )
    .unwrap();
    let out = run(bin().args(["plugin", "test"]).arg(dir.join("bad.yaml")));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("case `greet` names root `suse`, which the kit does not have"),
        "{}",
        stderr(&out)
    );

    // The kit's `http` section: an address that is not ip:port, and a CA file that is not
    // PEM, are refused naming the entry.
    let base = "plugin: hello.wasm\ngrants: grants.yaml\ntrustRoots: [admin.pub]\n\
         roots: [{name: testix, path: root}]\ncases: [{action: greet}]\n";
    std::fs::write(dir.join("not-pem.crt"), "not a certificate").unwrap();
    for (http, expected) in [
        (
            "http: {resolve: {dl.k8s.io:443: localhost}}\n",
            "http.resolve: `localhost` (for dl.k8s.io:443) is not an ip:port address",
        ),
        (
            "http: {resolve: {dl.k8s.io: 127.0.0.1:8443}}\n",
            "http.resolve: `dl.k8s.io` is not host:port",
        ),
        (
            "http: {caFiles: [not-pem.crt]}\n",
            "not-pem.crt: no CERTIFICATE block in it",
        ),
    ] {
        std::fs::write(dir.join("http.yaml"), format!("{base}{http}")).unwrap();
        let out = run(bin().args(["plugin", "test"]).arg(dir.join("http.yaml")));
        assert_eq!(out.status.code(), Some(1), "{http}");
        assert!(stderr(&out).contains(expected), "{http}: {}", stderr(&out));
    }
}
