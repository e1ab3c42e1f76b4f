//! A well-behaved test plugin: every action stays inside what the tests grant it.

wit_bindgen::generate!({
    world: "bosun-plugin",
    path: "../../../sdk/wit",
});

use bosun::plugin::types::HostError;
use bosun::plugin::{exec, facts, log, service};
use exports::bosun::plugin::plugin::{
    ActionInfo, Capabilities, Check, CheckStatus, CommandRequest, Guest, Metadata, Outcome,
    PathRequest, PluginError, RunContext,
};
use serde_json::Value;

struct Good;

fn err(code: &str, message: impl Into<String>) -> PluginError {
    PluginError {
        code: code.into(),
        message: message.into(),
        retryable: false,
    }
}

fn host_err(e: HostError) -> PluginError {
    let (code, msg) = match e {
        HostError::NotGranted(m) => ("not-granted", m),
        HostError::InvalidArgument(m) => ("invalid-argument", m),
        HostError::Timeout(m) => ("timeout", m),
        HostError::TooLarge(m) => ("too-large", m),
        HostError::Failed(m) => ("failed", m),
    };
    err(code, msg)
}

fn str_param<'a>(p: &'a Value, key: &str) -> Result<&'a str, PluginError> {
    p.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| err("bad-params", format!("missing string param `{key}`")))
}

fn args_param(p: &Value) -> Vec<String> {
    p.get("args")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn action(name: &str, description: &str) -> ActionInfo {
    ActionInfo {
        name: name.into(),
        description: description.into(),
        params_schema: r#"{"type":"object"}"#.into(),
        idempotent: true,
    }
}

impl Guest for Good {
    fn describe() -> Metadata {
        Metadata {
            name: "good".into(),
            version: "1.0.0".into(),
            abi_version: "0.2.0".into(),
            description: "well-behaved host test plugin".into(),
            actions: vec![
                action("noop", "does nothing"),
                action("happy", "reads a granted file and runs a granted command"),
                action("facts", "returns the node facts"),
                action("log", "writes `n` log lines"),
                action("write", "writes `content` to `path`"),
                action("service", "performs `action` on `unit`"),
                action("context", "returns the run context it was given"),
            ],
            capabilities: Capabilities {
                filesystem: vec![PathRequest {
                    path: "/data".into(),
                    writable: false,
                }],
                exec: vec![CommandRequest {
                    command: "/usr/bin/greet".into(),
                    args: vec!["*".into()],
                }],
                services: vec![],
                http: vec![],
            },
        }
    }

    fn preflight(action: String, _params: String) -> Result<Vec<Check>, PluginError> {
        Ok(vec![Check {
            name: format!("{action}-ready"),
            status: CheckStatus::Pass,
            message: "ok".into(),
        }])
    }

    fn run(action: String, params: String, context: RunContext) -> Result<Outcome, PluginError> {
        let p: Value =
            serde_json::from_str(&params).map_err(|e| err("bad-params", e.to_string()))?;
        let mut outputs = Vec::new();
        match action.as_str() {
            "noop" => {}
            "happy" => {
                let file = str_param(&p, "file")?;
                let content =
                    std::fs::read_to_string(file).map_err(|e| err("io", format!("{file}: {e}")))?;
                log::write(
                    log::Level::Info,
                    "read granted file",
                    &[("path".into(), file.into())],
                );
                log::progress(1, 2, "file read");
                let out = exec::run(str_param(&p, "command")?, &args_param(&p), None)
                    .map_err(host_err)?;
                log::progress(2, 2, "command ran");
                outputs.push(("file".into(), content));
                outputs.push((
                    "stdout".into(),
                    String::from_utf8_lossy(&out.stdout).into_owned(),
                ));
                outputs.push(("exit-code".into(), out.exit_code.to_string()));
            }
            "facts" => {
                let f = facts::node().map_err(host_err)?;
                outputs.push(("node-name".into(), f.node_name));
                outputs.push(("roles".into(), f.roles.join(",")));
                outputs.push(("os-id".into(), f.os.id));
                outputs.push(("os-id-like".into(), f.os.id_like.join(",")));
                outputs.push(("os-version-id".into(), f.os.version_id));
                outputs.push(("arch".into(), f.arch));
                outputs.push(("kernel".into(), f.kernel));
                outputs.push(("kubelet".into(), f.kubelet_version.unwrap_or_default()));
                outputs.push(("kubeadm".into(), f.kubeadm_version.unwrap_or_default()));
            }
            "log" => {
                let n = p.get("n").and_then(Value::as_u64).unwrap_or(1);
                for i in 0..n {
                    log::write(log::Level::Debug, "tick", &[]);
                    let _ = i;
                }
            }
            "write" => {
                let path = str_param(&p, "path")?;
                std::fs::write(path, str_param(&p, "content")?)
                    .map_err(|e| err("io", format!("{path}: {e}")))?;
            }
            "service" => {
                let unit = str_param(&p, "unit")?;
                let st = match str_param(&p, "action")? {
                    "status" => service::status(unit),
                    "restart" => service::control(unit, service::Action::Restart),
                    "start" => service::control(unit, service::Action::Start),
                    "stop" => service::control(unit, service::Action::Stop),
                    "reload" => service::control(unit, service::Action::Reload),
                    other => {
                        return Err(err("bad-params", format!("unknown service action {other}")));
                    }
                }
                .map_err(host_err)?;
                outputs.push(("active-state".into(), st.active_state));
                outputs.push(("sub-state".into(), st.sub_state));
            }
            "context" => {
                outputs.push(("dry-run".into(), context.dry_run.to_string()));
                outputs.push(("resumed".into(), context.resumed.to_string()));
            }
            other => return Err(err("unknown-action", format!("no action named {other}"))),
        }
        Ok(Outcome {
            changed: !context.dry_run && action == "write",
            message: format!("{action} done"),
            outputs,
        })
    }
}

export!(Good);
