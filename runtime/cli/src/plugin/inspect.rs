//! `inspect`: what a plugin declares about itself, and what its file is.

use std::path::PathBuf;

use anyhow::Result;
use bosun_host::Metadata;
use bosun_trust::SignatureBundle;
use clap::{Args, ValueEnum};
use serde_json::json;

use super::PluginFile;
use crate::Status;
use crate::terminal::{self, clean, out, outln};

/// Output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// For people.
    Text,
    /// One JSON document, for scripts.
    Json,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The plugin file.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Format::Text)]
    pub output: Format,
}

pub fn inspect(args: &InspectArgs) -> Result<Status> {
    let file = PluginFile::read(&args.file)?;
    let meta = file.describe()?;
    let bundle_path = SignatureBundle::path_for(&args.file);
    // The bundle is shown as found, not verified: `verify` is the command that checks it.
    let bundle = SignatureBundle::read(&bundle_path).ok();
    match args.output {
        Format::Json => out!(
            "{}",
            terminal::json(&to_json(&file, &meta, bundle.as_ref()))?
        ),
        Format::Text => print_text(&file, &meta, bundle.as_ref(), &bundle_path),
    }
    Ok(Status::Success)
}

fn to_json(
    file: &PluginFile,
    meta: &Metadata,
    bundle: Option<&SignatureBundle>,
) -> serde_json::Value {
    let caps = &meta.capabilities;
    json!({
        "name": meta.name,
        "version": meta.version,
        "abiVersion": meta.abi_version,
        "description": meta.description,
        "sha256": file.digest.to_hex(),
        "sizeBytes": file.bytes.len(),
        "actions": meta.actions.iter().map(|a| json!({
            "name": a.name,
            "description": a.description,
            "idempotent": a.idempotent,
            "paramsSchema": serde_json::from_str::<serde_json::Value>(&a.params_schema)
                .unwrap_or_else(|_| serde_json::Value::String(a.params_schema.clone())),
        })).collect::<Vec<_>>(),
        "capabilities": {
            "filesystem": caps.filesystem.iter().map(|(p, w)| json!({"path": p, "writable": w})).collect::<Vec<_>>(),
            "exec": caps.exec.iter().map(|(c, a)| json!({"command": c, "args": a})).collect::<Vec<_>>(),
            "services": caps.services.iter().map(|(u, a)| json!({"unit": u, "actions": a})).collect::<Vec<_>>(),
            "http": caps.http,
        },
        "signatureBundle": bundle.map(|b| json!({
            "name": b.name,
            "version": b.version,
            "sha256": b.sha256.to_hex(),
            "matchesFile": b.sha256 == file.digest,
            "signatures": b.signatures.len(),
        })),
    })
}

fn print_text(
    file: &PluginFile,
    meta: &Metadata,
    bundle: Option<&SignatureBundle>,
    bundle_path: &std::path::Path,
) {
    outln!("name:        {}", clean(&meta.name));
    outln!("version:     {}", clean(&meta.version));
    outln!("abi:         bosun:plugin@{}", clean(&meta.abi_version));
    outln!("digest:      {} ({} bytes)", file.digest, file.bytes.len());
    if !meta.description.is_empty() {
        outln!("description: {}", clean(&meta.description));
    }
    match bundle {
        Some(b) if b.sha256 == file.digest => outln!(
            "signatures:  {} in {} (not verified here; use `plugin verify`)",
            b.signatures.len(),
            terminal::path(bundle_path)
        ),
        Some(b) => outln!(
            "signatures:  {} is for other bytes ({}): sign this build again",
            terminal::path(bundle_path),
            b.sha256
        ),
        None => outln!(
            "signatures:  none ({} not found)",
            terminal::path(bundle_path)
        ),
    }
    outln!("actions:");
    for a in &meta.actions {
        outln!(
            "  {}{} - {}",
            clean(&a.name),
            if a.idempotent {
                " (idempotent)"
            } else {
                " (not idempotent)"
            },
            clean(&a.description)
        );
        let schema = serde_json::from_str::<serde_json::Value>(&a.params_schema)
            .and_then(|v| serde_json::to_string_pretty(&v))
            .unwrap_or_else(|_| a.params_schema.clone());
        outln!("    params schema:");
        for line in schema.lines() {
            outln!("      {}", clean(line));
        }
    }
    let caps = &meta.capabilities;
    outln!("requested capabilities:");
    if caps.filesystem.is_empty()
        && caps.exec.is_empty()
        && caps.services.is_empty()
        && caps.http.is_empty()
    {
        outln!("  none");
    }
    for (path, writable) in &caps.filesystem {
        outln!(
            "  filesystem {} ({})",
            clean(path),
            if *writable { "ReadWrite" } else { "ReadOnly" }
        );
    }
    for (command, args) in &caps.exec {
        outln!("  exec {} {}", clean(command), clean(&args.join(" ")));
    }
    for (unit, actions) in &caps.services {
        outln!("  service {}: {}", clean(unit), clean(&actions.join(", ")));
    }
    for host in &caps.http {
        outln!("  http {}", clean(host));
    }
}
