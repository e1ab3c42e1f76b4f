//! Downloads through the optional `http` interface: runs only with http grants.

wit_bindgen::generate!({
    world: "bosun-plugin",
    path: "../../../sdk/wit",
});

use bosun::plugin::http;
use bosun::plugin::types::HostError;
use exports::bosun::plugin::plugin::{
    ActionInfo, Capabilities, Check, Guest, Metadata, Outcome, PluginError, RunContext,
};
use serde_json::Value;

struct Http;

fn err(code: &str, message: String) -> PluginError {
    PluginError {
        code: code.into(),
        message,
        retryable: false,
    }
}

impl Guest for Http {
    fn describe() -> Metadata {
        Metadata {
            name: "http".into(),
            version: "1.0.0".into(),
            abi_version: "0.2.0".into(),
            description: "downloads a URL".into(),
            actions: vec![ActionInfo {
                name: "get".into(),
                description: "GET `url`, at most `max` bytes".into(),
                params_schema: r#"{"type":"object"}"#.into(),
                idempotent: true,
            }],
            capabilities: Capabilities {
                filesystem: vec![],
                exec: vec![],
                services: vec![],
                http: vec!["127.0.0.1".into()],
            },
        }
    }
    fn preflight(_action: String, _params: String) -> Result<Vec<Check>, PluginError> {
        Ok(vec![])
    }
    fn run(_action: String, params: String, _context: RunContext) -> Result<Outcome, PluginError> {
        let p: Value =
            serde_json::from_str(&params).map_err(|e| err("bad-params", e.to_string()))?;
        let url = p.get("url").and_then(Value::as_str).unwrap_or_default();
        let max = p.get("max").and_then(Value::as_u64).unwrap_or(1 << 20);
        match http::get(url, max) {
            Ok(r) => Ok(Outcome {
                changed: false,
                message: format!("status {}", r.status),
                outputs: vec![("body".into(), String::from_utf8_lossy(&r.body).into_owned())],
            }),
            Err(HostError::NotGranted(m)) => Err(err("host:not-granted", m)),
            Err(HostError::TooLarge(m)) => Err(err("host:too-large", m)),
            Err(HostError::InvalidArgument(m)) => Err(err("host:invalid-argument", m)),
            Err(HostError::Timeout(m)) => Err(err("host:timeout", m)),
            Err(HostError::Failed(m)) => Err(err("host:failed", m)),
        }
    }
}

export!(Http);
