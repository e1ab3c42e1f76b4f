//! A misbehaving test plugin. Each action tries one thing the sandbox must stop; the
//! filesystem and exec actions take their target from params so each host test aims
//! them at one specific escape. A filesystem or exec action that is refused returns a
//! `plugin-error` whose code names the refusal (`io:<kind>` or `host:<variant>`); one that
//! is NOT refused returns an outcome saying `ESCAPED`, which the tests treat as failure.
//!
//! `run` (about 180 lines) is one match with one short arm per escape the host tests aim
//! at; it is kept whole so that each test finds its attempt by action name in one place.

wit_bindgen::generate!({
    world: "bosun-plugin",
    path: "../../../sdk/wit",
});

use bosun::plugin::types::HostError;
use bosun::plugin::{exec, facts, log};
use exports::bosun::plugin::plugin::{
    ActionInfo, Capabilities, Check, CheckStatus, Guest, Metadata, Outcome, PluginError, RunContext,
};
use serde_json::Value;
use std::fs::OpenOptions;
use std::io::Write as _;

struct Bad;

fn err(code: &str, message: impl Into<String>) -> PluginError {
    PluginError {
        code: code.into(),
        message: message.into(),
        retryable: false,
    }
}

fn io_err(what: &str, e: std::io::Error) -> PluginError {
    err(&format!("io:{:?}", e.kind()), format!("{what}: {e}"))
}

fn host_err(e: HostError) -> PluginError {
    match e {
        HostError::NotGranted(m) => err("host:not-granted", m),
        HostError::InvalidArgument(m) => err("host:invalid-argument", m),
        HostError::Timeout(m) => err("host:timeout", m),
        HostError::TooLarge(m) => err("host:too-large", m),
        HostError::Failed(m) => err("host:failed", m),
    }
}

fn s<'a>(p: &'a Value, key: &str) -> Result<&'a str, PluginError> {
    p.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| err("bad-params", format!("missing string param `{key}`")))
}

fn escaped(what: String) -> Result<Outcome, PluginError> {
    Ok(Outcome {
        changed: true,
        message: format!("ESCAPED: {what}"),
        outputs: vec![],
    })
}

const ACTIONS: &[&str] = &[
    "spin",
    "memory-bomb",
    "log-flood",
    "output-flood",
    "trap",
    "panic",
    "read",
    "read-dir",
    "write",
    "create",
    "truncate",
    "hardlink",
    "rename",
    "exec",
    "exec-flood-args",
    "sleep-forever",
    "empty-log-flood",
    "denial-flood",
    "open-flood",
    "empty-output-flood",
    "environment",
];

impl Guest for Bad {
    fn describe() -> Metadata {
        Metadata {
            name: "bad".into(),
            version: "1.0.0".into(),
            abi_version: "0.2.0".into(),
            // Asks for node facts while describing, which may run on unverified bytes: the
            // host must refuse (and before it did, reading them ran the node's kubeadm).
            description: format!(
                "misbehaving host test plugin; facts in describe: {}",
                match facts::node() {
                    Ok(f) => format!("answered (kubeadm {:?})", f.kubeadm_version),
                    Err(_) => "refused".to_owned(),
                }
            ),
            actions: ACTIONS
                .iter()
                .map(|a| ActionInfo {
                    name: (*a).into(),
                    description: format!("misbehaves: {a}"),
                    params_schema: r#"{"type":"object"}"#.into(),
                    idempotent: false,
                })
                .collect(),
            capabilities: Capabilities {
                filesystem: vec![],
                exec: vec![],
                services: vec![],
                http: vec![],
            },
        }
    }

    fn preflight(action: String, params: String) -> Result<Vec<Check>, PluginError> {
        if action == "spin" {
            spin();
        }
        if action == "write" {
            // A preflight must not change the node; this one tries, and reports what happened.
            let p: Value =
                serde_json::from_str(&params).map_err(|e| err("bad-params", e.to_string()))?;
            let path = s(&p, "path")?;
            let (status, message) = match std::fs::write(path, b"pwned by preflight") {
                Ok(()) => (
                    CheckStatus::Pass,
                    format!("ESCAPED: wrote {path} in preflight"),
                ),
                Err(e) => (CheckStatus::Fail, format!("io:{:?}: {e}", e.kind())),
            };
            return Ok(vec![Check {
                name: "preflight-write".into(),
                status,
                message,
            }]);
        }
        Ok(vec![])
    }

    fn run(action: String, params: String, _context: RunContext) -> Result<Outcome, PluginError> {
        let p: Value =
            serde_json::from_str(&params).map_err(|e| err("bad-params", e.to_string()))?;
        match action.as_str() {
            "spin" => spin(),
            "memory-bomb" => {
                // Touch every page so the memory is really used, 8 MiB at a time.
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    let mut chunk = vec![0u8; 8 << 20];
                    chunk[4096] = hoard.len() as u8;
                    hoard.push(std::hint::black_box(chunk));
                }
            }
            "log-flood" => loop {
                log::write(
                    log::Level::Info,
                    &"flood ".repeat(100),
                    &[("k".into(), "v".into())],
                );
            },
            "output-flood" => {
                let big = "x".repeat(4 << 20);
                Ok(Outcome {
                    changed: false,
                    message: "flood".into(),
                    outputs: vec![("big".into(), big)],
                })
            }
            "trap" => {
                #[cfg(target_arch = "wasm32")]
                core::arch::wasm32::unreachable();
                #[cfg(not(target_arch = "wasm32"))]
                unreachable!()
            }
            "panic" => panic!("plugin panicked on purpose"),
            "read" => {
                let path = s(&p, "path")?;
                let data = std::fs::read(path).map_err(|e| io_err(path, e))?;
                escaped(format!(
                    "read {} bytes from {path}: {}",
                    data.len(),
                    String::from_utf8_lossy(&data)
                ))
            }
            "read-dir" => {
                let path = s(&p, "path")?;
                let n = std::fs::read_dir(path)
                    .map_err(|e| io_err(path, e))?
                    .count();
                escaped(format!("listed {n} entries of {path}"))
            }
            "write" => {
                let path = s(&p, "path")?;
                std::fs::write(path, b"pwned").map_err(|e| io_err(path, e))?;
                escaped(format!("wrote {path}"))
            }
            "create" => {
                let path = s(&p, "path")?;
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(path)
                    .map_err(|e| io_err(path, e))?;
                let _ = f.write_all(b"pwned");
                escaped(format!("created {path}"))
            }
            "truncate" => {
                // Open an existing file with O_TRUNC only (no write of content needed).
                let path = s(&p, "path")?;
                OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(path)
                    .map_err(|e| io_err(path, e))?;
                escaped(format!("truncated {path}"))
            }
            "hardlink" => {
                let (from, to) = (s(&p, "from")?, s(&p, "to")?);
                std::fs::hard_link(from, to)
                    .map_err(|e| io_err(&format!("link {from} -> {to}"), e))?;
                escaped(format!("linked {from} to {to}"))
            }
            "rename" => {
                let (from, to) = (s(&p, "from")?, s(&p, "to")?);
                std::fs::rename(from, to)
                    .map_err(|e| io_err(&format!("rename {from} -> {to}"), e))?;
                escaped(format!("renamed {from} to {to}"))
            }
            "exec" => {
                let args: Vec<String> = p
                    .get("args")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let out = exec::run(s(&p, "command")?, &args, None).map_err(host_err)?;
                escaped(format!(
                    "ran command, exit {}: {}",
                    out.exit_code,
                    String::from_utf8_lossy(&out.stdout)
                ))
            }
            "exec-flood-args" => {
                let args: Vec<String> = (0..100_000).map(|i| format!("arg{i}")).collect();
                let out = exec::run(s(&p, "command")?, &args, None).map_err(host_err)?;
                escaped(format!(
                    "ran command with 100000 args, exit {}",
                    out.exit_code
                ))
            }
            "sleep-forever" => {
                // Blocks in the host on a clock pollable, where no epoch check can run.
                std::thread::sleep(std::time::Duration::from_secs(u64::MAX / 4));
                escaped("woke up".into())
            }
            "empty-log-flood" => loop {
                // Zero bytes of text per line: only a per-line cost stops this.
                log::write(log::Level::Info, "", &[]);
            },
            "denial-flood" => {
                for _ in 0..100_000 {
                    let _ = exec::run("/usr/bin/not-granted", &["x".repeat(1000)], None);
                }
                escaped("asked 100000 times".into())
            }
            "open-flood" => {
                // Holds every file open: each is a host descriptor while the call runs.
                let path = s(&p, "path")?;
                let mut open = Vec::new();
                for i in 0..100_000 {
                    match std::fs::File::open(path) {
                        Ok(f) => {
                            open.push(f);
                            // The count survives in the captured log when the host stops
                            // the call at its resource limit.
                            if i < 4096 {
                                log::write(
                                    log::Level::Info,
                                    "held",
                                    &[("n".into(), (i + 1).to_string())],
                                );
                            }
                        }
                        Err(e) => {
                            return Err(err("open-failed", format!("open #{i} of {path}: {e}")));
                        }
                    }
                }
                escaped(format!("held {} files open", open.len()))
            }
            "empty-output-flood" => {
                // Zero bytes of text per output: only a per-entry charge bounds this.
                let n = p.get("n").and_then(Value::as_u64).unwrap_or(100_000);
                Ok(Outcome {
                    changed: false,
                    message: String::new(),
                    outputs: (0..n).map(|_| (String::new(), String::new())).collect(),
                })
            }
            "environment" => {
                // Looks for secrets in the environment the host gave the plugin.
                Ok(Outcome {
                    changed: false,
                    message: format!("{} variables", std::env::vars_os().count()),
                    outputs: std::env::vars_os()
                        .map(|(k, v)| {
                            (
                                k.to_string_lossy().into_owned(),
                                v.to_string_lossy().into_owned(),
                            )
                        })
                        .collect(),
                })
            }
            other => Err(err("unknown-action", format!("no action named {other}"))),
        }
    }
}

fn spin() -> ! {
    let mut x: u64 = 0;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

export!(Bad);
