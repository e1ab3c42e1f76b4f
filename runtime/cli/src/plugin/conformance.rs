//! `test`: the conformance kit (runtime/conformance) driven by a kit file, for plugin
//! authors and CI. The kit file names the signed plugin, its grants, trust roots, the node
//! roots of the matrix and the cases; paths in it are relative to the kit file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use bosun_conformance::{Case, Kit, Root};
use bosun_host::{ExecIsolation, HostConfig, NodeContext, PluginPin};
use bosun_trust::{SignatureBundle, TrustRoots};
use clap::Args;
use serde::Deserialize;

use super::PluginFile;
use super::run::Isolation;
use crate::Status;
use crate::terminal::{clean, outln};

#[derive(Debug, Args)]
pub struct TestArgs {
    /// The kit file (YAML): plugin, grants, trustRoots, roots, cases (docs/plugins.md,
    /// "Test a plugin with the conformance kit").
    #[arg(value_name = "KIT")]
    pub kit: PathBuf,
    /// The plugin file, instead of the kit file's `plugin`.
    #[arg(long, value_name = "FILE")]
    pub plugin: Option<PathBuf>,
    /// Trusted public keys, instead of the kit file's `trustRoots`; repeatable.
    #[arg(long = "trust-root", value_name = "PEM")]
    pub trust_roots: Vec<PathBuf>,
    /// Write the report as JUnit XML to FILE.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Write the report as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Where the roots' copies are made (default: a new temporary directory).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// How granted commands are started (chroot needs root, as on a node).
    #[arg(long, value_enum, default_value_t = Isolation::Chroot)]
    pub exec_isolation: Isolation,
}

/// The kit file.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct KitFile {
    /// The signed plugin (`.wasm`); its bundle is FILE.sig.json unless `bundle` says.
    plugin: PathBuf,
    bundle: Option<PathBuf>,
    /// A grants file or a Plugin manifest, as `plugin run --grants` takes.
    grants: PathBuf,
    #[serde(default)]
    trust_roots: Vec<PathBuf>,
    #[serde(default = "default_deadline")]
    deadline_seconds: u64,
    #[serde(default = "default_max_use")]
    max_use: f64,
    #[serde(default)]
    ignore: Vec<String>,
    #[serde(default)]
    node: NodeFile,
    #[serde(default)]
    http: HttpFile,
    roots: Vec<RootFile>,
    cases: Vec<CaseFile>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NodeFile {
    #[serde(default = "default_node_name")]
    name: String,
    #[serde(default)]
    roles: Vec<String>,
    kubelet_version: Option<String>,
}

impl Default for NodeFile {
    fn default() -> Self {
        NodeFile {
            name: default_node_name(),
            roles: Vec::new(),
            kubelet_version: None,
        }
    }
}

/// Where the plugin's https GETs go in the kit: a granted host served from a local
/// server (`resolve`), with the CA that server's certificate comes from (`caFiles`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HttpFile {
    /// `host:port` to `ip:port`, as curl's `--resolve`: `dl.k8s.io:443: 127.0.0.1:8443`.
    #[serde(default)]
    resolve: std::collections::BTreeMap<String, String>,
    /// PEM files of CAs trusted besides the compiled-in Mozilla roots.
    #[serde(default)]
    ca_files: Vec<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RootFile {
    name: String,
    path: PathBuf,
    #[serde(default)]
    unsupported: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CaseFile {
    #[serde(default)]
    name: String,
    action: String,
    #[serde(default = "empty_object")]
    params: serde_json::Value,
    outputs_schema: Option<serde_json::Value>,
    #[serde(default)]
    changes_every_run: bool,
    #[serde(default)]
    roots: Vec<String>,
}

fn default_deadline() -> u64 {
    300
}
fn default_max_use() -> f64 {
    0.75
}
fn default_node_name() -> String {
    "kit-node".into()
}
fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}

pub fn test(args: &TestArgs) -> Result<Status> {
    let text = std::fs::read_to_string(&args.kit)
        .with_context(|| format!("reading kit file {}", args.kit.display()))?;
    let file: KitFile = serde_yaml::from_str(&text).with_context(|| {
        format!(
            "kit file {} is not a kit (plugin, grants, trustRoots, roots, cases; see docs/plugins.md)",
            args.kit.display()
        )
    })?;
    let base = args.kit.parent().unwrap_or(Path::new("."));
    let at = |p: &Path| base.join(p);
    if !(file.max_use > 0.0 && file.max_use <= 1.0) {
        bail!("maxUse must be above 0 and at most 1, got {}", file.max_use);
    }
    if file.deadline_seconds == 0 {
        bail!("deadlineSeconds must be at least 1");
    }
    for i in &file.ignore {
        if !i.starts_with('/') {
            bail!("ignore entries are node paths starting with `/`, got `{i}`");
        }
    }
    let plugin_path = args.plugin.clone().unwrap_or_else(|| at(&file.plugin));
    let plugin = PluginFile::read(&plugin_path)?;
    let bundle_path = file
        .bundle
        .as_deref()
        .map(at)
        .filter(|_| args.plugin.is_none())
        .unwrap_or_else(|| SignatureBundle::path_for(&plugin_path));
    let bundle = SignatureBundle::read(&bundle_path).with_context(|| {
        format!(
            "{} has no usable signature bundle; sign it first: kubectl bosun plugin sign --key KEY {}",
            plugin_path.display(),
            plugin_path.display()
        )
    })?;
    let trust: Vec<PathBuf> = if args.trust_roots.is_empty() {
        file.trust_roots.iter().map(|p| at(p)).collect()
    } else {
        args.trust_roots.clone()
    };
    if trust.is_empty() {
        bail!(
            "no trust roots: list the publisher's public key in the kit's trustRoots or give --trust-root"
        );
    }
    let grants = super::grants::read_grants(Some(&at(&file.grants)))?;

    let scratch;
    let work_dir = match &args.work_dir {
        Some(d) => d.clone(),
        None => {
            scratch = tempfile::Builder::new()
                .prefix("bosun-kit-")
                .tempdir()
                .context("creating a work directory")?;
            scratch.path().to_owned()
        }
    };
    let mut host = HostConfig::new(&work_dir, TrustRoots::load(&trust)?);
    for (name, to) in &file.http.resolve {
        if name
            .rsplit_once(':')
            .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        {
            bail!("http.resolve: `{name}` is not host:port (for example `dl.k8s.io:443`)");
        }
        let addr = to.parse().with_context(|| {
            format!(
                "http.resolve: `{to}` (for {name}) is not an ip:port address such as 127.0.0.1:8443"
            )
        })?;
        host.http.resolve.push((name.clone(), addr));
    }
    for ca in &file.http.ca_files {
        host.http
            .add_ca_file(&at(ca), "http.caFiles entry")
            .map_err(anyhow::Error::msg)?;
    }
    host.exec_isolation = match args.exec_isolation {
        Isolation::Chroot => ExecIsolation::Chroot,
        Isolation::ResolveOnly => ExecIsolation::ResolveOnly,
    };
    let kit = Kit {
        host,
        plugin: plugin.bytes,
        pin: PluginPin::from(&bundle),
        grants,
        node: NodeContext {
            node_name: file.node.name,
            roles: file.node.roles,
            kubelet_version: file.node.kubelet_version,
        },
        deadline: Duration::from_secs(file.deadline_seconds),
        max_use: file.max_use,
        ignore: file.ignore,
        roots: file
            .roots
            .into_iter()
            .map(|r| Root {
                name: r.name,
                template: at(&r.path),
                unsupported: r.unsupported,
            })
            .collect(),
        cases: file
            .cases
            .into_iter()
            .map(|c| Case {
                name: c.name,
                action: c.action,
                params: c.params,
                outputs_schema: c.outputs_schema,
                changes_every_run: c.changes_every_run,
                roots: c.roots,
            })
            .collect(),
        work_dir,
    };
    let report = bosun_conformance::run(&kit)?;
    for line in bosun_conformance::text(&report).lines() {
        outln!("{}", clean(line));
    }
    if let Some(p) = &args.junit {
        std::fs::write(p, bosun_conformance::junit_xml(&report))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &args.json {
        std::fs::write(p, report.json()).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(if report.passed() {
        Status::Success
    } else {
        Status::PluginFailed
    })
}
