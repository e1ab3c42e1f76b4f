//! Built against `bosun:plugin@0.3.0` (its own WIT copy): the host must refuse it at load.

wit_bindgen::generate!({
    world: "bosun-plugin",
    path: "wit",
});

use exports::bosun::plugin::plugin::{
    Capabilities, Check, Guest, Metadata, Outcome, PluginError, RunContext,
};

struct WrongAbi;

impl Guest for WrongAbi {
    fn describe() -> Metadata {
        Metadata {
            name: "wrong-abi".into(),
            version: "1.0.0".into(),
            abi_version: "0.3.0".into(),
            description: "built against a future ABI".into(),
            actions: vec![],
            capabilities: Capabilities {
                filesystem: vec![],
                exec: vec![],
                services: vec![],
                http: vec![],
            },
        }
    }
    fn preflight(_action: String, _params: String) -> Result<Vec<Check>, PluginError> {
        Ok(vec![])
    }
    fn run(_action: String, _params: String, _context: RunContext) -> Result<Outcome, PluginError> {
        Ok(Outcome {
            changed: false,
            message: "ran on the wrong ABI".into(),
            outputs: vec![],
        })
    }
}

export!(WrongAbi);
