//! `kubectl bosun plugin ...`: the commands a plugin author and an administrator use on
//! plugin files (all but `publish` without a cluster), and [`publish`], which puts a signed
//! plugin into the cluster.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use bosun_host::{Host, HostConfig, Metadata};
use bosun_trust::{Digest, TrustRoots};
use clap::Subcommand;

use crate::Status;

mod conformance;
mod grants;
mod inspect;
pub mod publish;
mod run;
mod scaffold;
mod signing;

/// The plugin commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate an Ed25519 (or P-256) signing key pair: KEY (PKCS#8 PEM, mode 0600) and PUB (SPKI PEM).
    Keygen(signing::KeygenArgs),
    /// Sign a plugin: writes or extends FILE.wasm.sig.json, the signature bundle.
    Sign(signing::SignArgs),
    /// Verify a plugin's bytes and signature bundle against trust roots, as the agent does.
    Verify(signing::VerifyArgs),
    /// Print the exact statement signatures cover (to sign with `cosign sign-blob` or openssl).
    Statement(signing::StatementArgs),
    /// Show what a plugin declares: name, version, ABI, actions, params schemas, capabilities.
    Inspect(inspect::InspectArgs),
    /// Run one action of a signed plugin against a host-root directory with grants from a file.
    Run(run::RunArgs),
    /// Test a signed plugin with the conformance kit over a matrix of node roots (a kit
    /// file): dry runs change nothing, idempotent actions run twice, every grant is used,
    /// outputs match, unsupported roots are refused, headroom. Exit 2 on any failure.
    Test(conformance::TestArgs),
    /// Scaffold a new plugin crate that builds for wasm32-wasip2.
    New(scaffold::NewArgs),
    /// Publish a signed plugin to the cluster: a ConfigMap with its bytes and the Plugin
    /// resource with its digest, signatures (from FILE.sig.json) and grants.
    Publish(publish::PublishArgs),
}

/// Runs a plugin command.
pub fn execute(cmd: Command) -> Result<Status> {
    match cmd {
        Command::Keygen(a) => signing::keygen(&a),
        Command::Sign(a) => signing::sign(&a),
        Command::Verify(a) => signing::verify(&a),
        Command::Statement(a) => signing::statement(&a),
        Command::Inspect(a) => inspect::inspect(&a),
        Command::Run(a) => run::run(&a),
        Command::Test(a) => conformance::test(&a),
        Command::New(a) => scaffold::new(&a),
        Command::Publish(a) => publish::execute(a),
    }
}

/// A plugin file read into memory with its digest.
struct PluginFile {
    path: PathBuf,
    bytes: Vec<u8>,
    digest: Digest,
}

impl PluginFile {
    fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("reading plugin file {}", path.display()))?;
        let digest = Digest::of(&bytes);
        Ok(PluginFile {
            path: path.to_owned(),
            bytes,
            digest,
        })
    }

    /// Calls the plugin's `describe` in the sandbox with no grants and without signature
    /// verification. Used only to read what the plugin says about itself (for `inspect`
    /// and to default `sign`'s name and version); nothing here is trusted or runs actions.
    ///
    /// The bytes are unverified, so the call gets nothing of the machine: the host root is
    /// a fresh empty directory only this process can reach (never a shared one such as
    /// `$TMPDIR`, where another user could plant files), and the host refuses node facts
    /// to every `describe`.
    fn describe(&self) -> Result<Metadata> {
        let empty_root = tempfile::Builder::new()
            .prefix("bosun-describe-")
            .tempdir()
            .context("creating an empty host root for describe")?;
        let mut config = HostConfig::new(empty_root.path(), TrustRoots::new());
        config.allow_unverified = true;
        let host = Host::new(config).context("starting the plugin host")?;
        let loaded = host
            .load_unverified(&self.bytes)
            .with_context(|| format!("loading {} to read its metadata", self.path.display()))?;
        Ok(loaded.metadata().clone())
    }
}
