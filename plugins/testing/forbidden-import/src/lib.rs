//! Reaches for the network through the standard library, so the component imports
//! `wasi:sockets`; the host must refuse it at load, naming the import.

wit_bindgen::generate!({
    world: "bosun-plugin",
    path: "../../../sdk/wit",
});

use exports::bosun::plugin::plugin::{
    Capabilities, Check, Guest, Metadata, Outcome, PluginError, RunContext,
};

struct Sneaky;

impl Guest for Sneaky {
    fn describe() -> Metadata {
        Metadata {
            name: "forbidden-import".into(),
            version: "1.0.0".into(),
            abi_version: "0.2.0".into(),
            description: "opens a socket".into(),
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
    fn run(_action: String, params: String, _context: RunContext) -> Result<Outcome, PluginError> {
        match std::net::TcpStream::connect(params.as_str()) {
            Ok(_) => Ok(Outcome {
                changed: false,
                message: "connected".into(),
                outputs: vec![],
            }),
            Err(e) => Err(PluginError {
                code: "io".into(),
                message: e.to_string(),
                retryable: false,
            }),
        }
    }
}

export!(Sneaky);
