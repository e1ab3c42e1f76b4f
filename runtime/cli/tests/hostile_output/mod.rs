//! Issue 31, item 7: every string a plugin controls is escaped on every output path.
//!
//! One driver, one line per case: each case runs a `kubectl-bosun` command that can run
//! without a cluster on a plugin (built from `plugin/lib.rs`) whose every text carries
//! escape sequences, a carriage return and a newline starting forged lines, NUL and its
//! neighbours, DEL, C1 controls and bidirectional overrides — its metadata, requests,
//! checks, logs, progress, stderr, outcome, outputs, errors and panic — or on a signature
//! bundle, policy, policy input or policy test quoting such text. Each case checks that
//! neither stdout nor stderr receives a raw control character (but newline and tab) or
//! bidirectional control, that no line starts with the forged text, and that the hostile
//! text did reach the output (escaped), so the case went down the path it names. Every
//! case runs before the assertion, which lists every leak found.
//!
//! The commands that need a cluster (`status`, `logs`, ...) render through functions
//! tested the same way with hostile Operation, NodeTask and ClusterLifecycle values in
//! `src/ops/mod.rs` (`every_human_rendering_escapes_every_string_of_the_resources`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use super::{bin, host_root, keygen, plugin_target_dir, run, workspace_root};

/// What every text of the plugin holds (as in plugin/lib.rs).
const H: &str = "<\x1b]0;pwned\x07\x1b[2J\x1b[1;1H\rFORGED\x00\x01\x1f\x7f\u{85}\u{9b}31m\u{202e}\u{2066}\nFORGED verified: signed by admin>";

/// `H` as the CLI shows it: escaped, on one line.
const SHOWN: &str = "<\\u{1b}]0;pwned\\u{7}\\u{1b}[2J\\u{1b}[1;1H\\rFORGED\\u{0}\\u{1}\\u{1f}\\u{7f}\\u{85}\\u{9b}31m\\u{202e}\\u{2066}\\nFORGED verified: signed by admin>";

/// `H` as JSON shows it (`-o json`).
const SHOWN_JSON: &str = "<\\u001b]0;pwned\\u0007\\u001b[2J\\u001b[1;1H\\rFORGED\\u0000\\u0001\\u001f\\u007f\\u0085\\u009b31m\\u202e\\u2066\\nFORGED verified: signed by admin>";

/// The builds of plugin/lib.rs: (default, `hostile-requests`, `hostile-name`).
struct Builds {
    texts: PathBuf,
    requests: PathBuf,
    name: PathBuf,
}

/// Writes `contents` to `path` unless it already holds them (so cargo sees no change).
fn write_if_changed(path: &Path, contents: &str) {
    if std::fs::read_to_string(path).ok().as_deref() != Some(contents) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }
}

/// Builds the three variants of the hostile plugin once per test binary, as a crate of
/// its own (like the one `plugin new` scaffolds) in the test plugins' target directory.
fn builds() -> &'static Builds {
    static BUILDS: OnceLock<Builds> = OnceLock::new();
    BUILDS.get_or_init(|| {
        let target = plugin_target_dir();
        let src = target.join("hostile-src");
        let sdk = workspace_root().join("sdk/rust");
        write_if_changed(
            &src.join("Cargo.toml"),
            &include_str!("plugin/Cargo.toml.tmpl").replace(
                "{{sdk_path}}",
                &sdk.display().to_string().replace('\\', "\\\\"),
            ),
        );
        write_if_changed(&src.join("src/lib.rs"), include_str!("plugin/lib.rs"));
        // Resolve dependencies as the workspace did, so the build reuses what is compiled.
        std::fs::copy(workspace_root().join("Cargo.lock"), src.join("Cargo.lock")).unwrap();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let build = |features: &str, file: &str| {
            let mut cmd = Command::new(&cargo);
            cmd.current_dir(&src)
                .env("CARGO_TARGET_DIR", &target)
                .args(["build", "--release", "--target", "wasm32-wasip2"]);
            if !features.is_empty() {
                cmd.args(["--features", features]);
            }
            let status = cmd.status().expect("running cargo");
            assert!(
                status.success(),
                "building the hostile plugin ({features:?}) failed; is `rustup target add wasm32-wasip2` done?"
            );
            // Each build replaces the last one's file: keep a copy per variant.
            let copy = target.join(file);
            std::fs::copy(
                target.join("wasm32-wasip2/release/bosun_test_hostile.wasm"),
                &copy,
            )
            .unwrap();
            copy
        };
        Builds {
            texts: build("", "hostile-texts.wasm"),
            requests: build("hostile-requests", "hostile-requests.wasm"),
            name: build("hostile-name", "hostile-name.wasm"),
        }
    })
}

/// `s` as a JSON (and YAML double-quoted) string with every character outside printable
/// ASCII escaped: YAML refuses raw control characters in a document.
fn quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            _ => out.push_str(&format!("\\u{:04x}", u32::from(c))),
        }
    }
    out.push('"');
    out
}

/// Characters that must never reach a terminal raw (what `src/terminal.rs` escapes), but
/// the newlines and tabs the CLI writes itself.
fn forbidden(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// What is wrong with one stream's bytes: raw control characters, forged lines.
fn leaks(stream: &str, bytes: &[u8]) -> Vec<String> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return vec![format!("{stream} is not UTF-8: {bytes:?}")];
    };
    let mut found = Vec::new();
    for line in text.split('\n') {
        if line.chars().any(forbidden) {
            found.push(format!("{stream} has a raw control character: {line:?}"));
        }
        if line.starts_with("FORGED") {
            found.push(format!("{stream} has a forged line: {line:?}"));
        }
    }
    found
}

/// One command and what it must show.
struct Case {
    name: &'static str,
    args: Vec<OsString>,
    /// The exit code that says the command went down the path the case names.
    exit: i32,
    /// Texts stdout and stderr together must contain (the escaped hostile text, mostly).
    shows: Vec<&'static str>,
}

fn case(name: &'static str, args: Vec<OsString>, exit: i32, shows: &[&'static str]) -> Case {
    Case {
        name,
        args,
        exit,
        shows: shows.to_vec(),
    }
}

/// Command-line arguments from strings and paths.
macro_rules! args {
    ($($a:expr),* $(,)?) => {
        vec![$(OsString::from(AsRef::<std::ffi::OsStr>::as_ref(&$a))),*]
    };
}

/// Copies `wasm` into `dir` as `file` and signs it there (`sign_as`: --name and
/// --version; without, the plugin's own describe()).
fn signed(dir: &Path, wasm: &Path, file: &str, key: &Path, sign_as: &[&str]) -> PathBuf {
    let plugin = dir.join(file);
    std::fs::copy(wasm, &plugin).unwrap();
    let out = run(bin()
        .args(["plugin", "sign"])
        .args(sign_as)
        .arg("--key")
        .arg(key)
        .arg(&plugin));
    assert!(out.status.success(), "signing {file}");
    plugin
}

/// Policies at the capabilities decision point whose messages quote the plugin's name
/// and requested paths (sprintf over plugin input): one warns, one denies.
fn quoting_policies(enforcement: &str, package: &str) -> String {
    format!(
        "apiVersion: bosun.dev/v1alpha1\nkind: Policy\nmetadata: {{name: quote-{package}}}\nspec:\n  enforcement: {enforcement}\n  rego: |\n    package bosun.capabilities.{package}\n    deny contains msg if {{\n      some r in input.requested.filesystem\n      msg := sprintf(\"plugin %s requests %s\", [input.plugin.name, r.path])\n    }}\n"
    )
}

#[test]
fn every_command_and_error_path_escapes_what_plugins_control() {
    let b = builds();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (key, public) = keygen(dir, "admin");
    let root = host_root(dir);
    let texts = signed(dir, &b.texts, "texts.wasm", &key, &[]);
    let requests = signed(dir, &b.requests, "requests.wasm", &key, &[]);
    // The hostile name cannot be signed: sign the bytes as `hostile`, which they deny.
    let name = signed(
        dir,
        &b.name,
        "name.wasm",
        &key,
        &["--name", "hostile", "--version", "0.1.0"],
    );

    let grants = dir.join("grants.yaml");
    std::fs::write(&grants, "filesystem:\n  - path: /etc\n").unwrap();
    let policies = dir.join("quoting.yaml");
    std::fs::write(
        &policies,
        format!(
            "{}---\n{}",
            quoting_policies("Warn", "quote_warn"),
            quoting_policies("Deny", "quote_deny")
        ),
    )
    .unwrap();

    // A signature bundle whose name and version are hostile (a hand-edited or hostile
    // bundle shipped beside the plugin), for texts.wasm's bytes.
    let mut bundle: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("texts.wasm.sig.json")).unwrap())
            .unwrap();
    bundle["name"] = H.into();
    bundle["version"] = format!("0.1.0{H}").into();
    let hostile_bundle = dir.join("hostile.sig.json");
    std::fs::write(&hostile_bundle, bundle.to_string()).unwrap();
    let replaced_bundle = dir.join("replaced.sig.json");
    std::fs::write(&replaced_bundle, bundle.to_string()).unwrap();

    // A capabilities input quoting the plugin (what the agent records), for policy eval.
    let input = dir.join("input.json");
    let input_doc = serde_json::json!({
        "plugin": {"name": H, "version": "0.1.0", "digest": format!("sha256:{}", "0".repeat(64)), "signer": H},
        "requested": {"filesystem": [{"path": format!("/etc/{H}"), "writable": false}], "exec": [{"command": H, "args": [H]}], "services": [], "http": [H]},
        "grants": {"filesystem": [{"path": "/etc", "access": "ReadOnly"}]},
        "node": H,
    });
    std::fs::write(&input, input_doc.to_string()).unwrap();
    // A policy test whose case name and failure quote the plugin.
    let ptest = dir.join("ptest");
    std::fs::create_dir_all(ptest.join("quote")).unwrap();
    std::fs::write(
        ptest.join("quote/policy.rego"),
        "package bosun.capabilities.quote\n\ndeny contains msg if {\n\tsome r in input.requested.filesystem\n\tmsg := sprintf(\"plugin %s requests %s\", [input.plugin.name, r.path])\n}\n",
    )
    .unwrap();
    std::fs::write(ptest.join("quote/input.json"), input_doc.to_string()).unwrap();
    std::fs::write(
        ptest.join("quote/cases.yaml"),
        format!(
            "base: input.json\ncases:\n  - name: {}\n    input: {{}}\n    denies: []\n",
            quoted(H)
        ),
    )
    .unwrap();

    let run_args = |plugin: &Path, action: &str| -> Vec<OsString> {
        args![
            "plugin",
            "run",
            plugin,
            action,
            "--exec-isolation",
            "resolve-only",
            "--host-root",
            root,
            "--trust-root",
            public,
        ]
    };
    let run_texts = |action: &str, more: Vec<OsString>| [run_args(&texts, action), more].concat();
    let g = &grants;
    let esc = "<\\u{1b}]0;pwned";

    #[rustfmt::skip]
    let cases = vec![
        // --- describe() metadata, unverified (inspect) and while signing.
        case("inspect", args!["plugin", "inspect", texts], 0, &["description: <\\u{1b}]0;pwned", "all (idempotent) - <\\u{1b}]0;pwned", SHOWN]),
        case("inspect -o json", args!["plugin", "inspect", "-o", "json", texts], 0, &[SHOWN_JSON]),
        case("inspect hostile requests", args!["plugin", "inspect", requests], 0, &["exec /usr/bin/<\\u{1b}]0;pwned", "service <\\u{1b}]0;pwned", "http <\\u{1b}]0;pwned"]),
        case("inspect hostile name", args!["plugin", "inspect", name], 0, &["name:        hostile\\u{1b}]0;pwned\\u{7}\\u{202e}", "version:     0.1.0\\u{1b}[2J\\rFORGED"]),
        case("sign with the declared hostile name", args!["plugin", "sign", "--key", key, name], 1, &["hostile\\u{1b}]0;pwned"]),
        case("statement with the declared hostile name", args!["plugin", "statement", name], 1, &["hostile\\u{1b}]0;pwned"]),
        // --- a hostile signature bundle.
        case("sign over a hostile bundle", args!["plugin", "sign", "--key", key, "--bundle", replaced_bundle, texts], 0, &["note: replacing", SHOWN]),
        case("verify a hostile bundle", args!["plugin", "verify", "--trust-root", public, "--bundle", hostile_bundle, texts], 1, &["did not verify", "pwned"]),
        case("publish a hostile bundle", args!["plugin", "publish", "--bundle", hostile_bundle, "--name", "other", texts], 1, &["differs from the signed name", SHOWN]),
        // --- plugin run: each place a plugin's text is printed.
        case("run: checks, logs, fields, progress, stderr, refused command, outcome, outputs", run_texts("all", args!["--grants", g]), 0, &["pass <\\u{1b}]0;pwned", "WARN <\\u{1b}]0;pwned", "[warn] <\\u{1b}]0;pwned", "progress 1/2: <\\u{1b}]0;pwned", "stderr: <\\u{1b}]0;pwned", "denied exec", "outcome: changed: <\\u{1b}]0;pwned"]),
        case("run: a failing check", run_texts("fail-check", args!["--grants", g]), 2, &["FAIL <\\u{1b}]0;pwned", "preflight check(s) failed: <\\u{1b}]0;pwned"]),
        case("run: preflight's typed error", run_texts("preflight-error", args!["--grants", g]), 2, &["error: preflight failed: <\\u{1b}]0;pwned"]),
        case("run: run's typed error", run_texts("error", args!["--grants", g]), 2, &["error: the plugin failed: <\\u{1b}]0;pwned"]),
        case("run: a panic (trap with stderr)", run_texts("trap", args!["--grants", g]), 1, &["trapped", esc]),
        case("run: params outside the hostile schema", run_texts("params", args!["--grants", g, "--params", r#"{"mode":"x"}"#]), 1, &["invalid params", esc]),
        case("run: an undeclared action (lists the declared ones)", run_texts("nope", args!["--grants", g]), 1, &["has no action", esc]),
        case("run: capabilities policies warn and deny quoting the requests", run_texts("all", args!["--grants", g, "--policy", policies]), 2, &["WARN quote-quote_warn: plugin hostile requests /etc/<\\u{1b}]0;pwned", "capabilities were denied: quote-quote_deny: plugin hostile requests /etc/<\\u{1b}]0;pwned"]),
        // The review's finding: the denial quotes the plugin's requests.
        case("run: capabilities denied (requests not granted)", run_args(&requests, "all"), 2, &["capabilities were denied", "/usr/bin/<\\u{1b}]0;pwned", "http: <\\u{1b}]0;pwned"]),
        case("run: describe() disagrees with the signed name", run_args(&name, "all"), 1, &["declares name", "hostile\\u{1b}]0;pwned"]),
        // --- policies over plugin input.
        case("policy eval", args!["policy", "eval", "--point", "capabilities", "--input", input, "--policy", policies], 2, &["DENIED", "plugin <\\u{1b}]0;pwned"]),
        case("policy eval -o json", args!["policy", "eval", "--point", "capabilities", "--input", input, "--policy", policies, "-o", "json"], 2, &["plugin <\\u001b]0;pwned"]),
        case("policy eval at a point whose schema the input does not match", args!["policy", "eval", "--point", "step", "--input", input, "--policy", policies], 0, &["warning: the input does not match"]),
        case("policy test", args!["policy", "test", ptest], 1, &["FAIL case", esc]),
        case("policy test -o json", args!["policy", "test", "-o", "json", ptest], 1, &["pwned"]),
        // --- what the user typed, echoed back (file names, names).
        case("new with a hostile name", args!["plugin", "new", "x\x1b]0;pwned\x07", "--dir", dir.join("new")], 1, &["x\\u{1b}]0;pwned"]),
        case("keygen with a hostile file name", args!["plugin", "keygen", "--out", dir.join("keys"), "--stem", "k\x1b]0;pwned\x07"], 0, &["k\\u{1b}]0;pwned"]),
    ];

    let mut failures = Vec::new();
    for c in &cases {
        let out: Output = run(bin()
            .args(&c.args)
            // Nothing here may reach a cluster.
            .env("KUBECONFIG", dir.join("no-kubeconfig"))
            .env_remove("KUBERNETES_SERVICE_HOST"));
        let mut problems = leaks("stdout", &out.stdout);
        problems.extend(leaks("stderr", &out.stderr));
        if out.status.code() != Some(c.exit) {
            problems.push(format!(
                "exit code {:?}, expected {}",
                out.status.code(),
                c.exit
            ));
        }
        let both = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for s in &c.shows {
            if !both.contains(s) {
                problems.push(format!("output lacks {s:?}"));
            }
        }
        if !problems.is_empty() {
            failures.push(format!("{}:\n    {}", c.name, problems.join("\n    ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases leak or did not take their path:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
