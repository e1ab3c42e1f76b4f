//! `keygen`, `sign`, `verify` and `statement`: the trust side of a plugin file. The
//! formats and checks are `bosun-trust`'s, so what passes `verify` here passes in the agent.

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use base64::Engine as _;
use bosun_trust::{Algorithm, PluginSignature, SignatureBundle, SigningKey, Statement, TrustRoots};
use clap::{Args, ValueEnum};

use super::PluginFile;
use crate::Status;
use crate::terminal::{self, clean, errln, outln};

/// Key algorithms `keygen` makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KeyAlgorithm {
    /// Ed25519 (recommended).
    Ed25519,
    /// ECDSA P-256, for teams whose tooling expects P-256 keys.
    P256,
}

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Directory to write the key pair into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// File name stem: writes STEM.key and STEM.pub.
    #[arg(long, default_value = "bosun-signing", value_name = "STEM")]
    pub stem: String,
    /// Key algorithm.
    #[arg(long, value_enum, default_value_t = KeyAlgorithm::Ed25519)]
    pub algorithm: KeyAlgorithm,
}

pub fn keygen(args: &KeygenArgs) -> Result<Status> {
    let key = match args.algorithm {
        KeyAlgorithm::Ed25519 => SigningKey::generate_ed25519(),
        KeyAlgorithm::P256 => SigningKey::generate_p256(),
    };
    let files = bosun_trust::write_key_pair(&args.out, &args.stem, &key)?;
    outln!(
        "private key: {} (keep it secret; mode 0600)",
        terminal::path(&files.private_key)
    );
    outln!(
        "public key:  {} (add it to the trust roots)",
        terminal::path(&files.public_key)
    );
    outln!("key id:      {}", files.key_id);
    Ok(Status::Success)
}

/// Which name and version a signature binds.
#[derive(Debug, Args)]
pub struct Identity {
    /// Plugin name to sign as. Default: the name the plugin declares in `describe`.
    #[arg(long)]
    pub name: Option<String>,
    /// Plugin version to sign as. Default: the version the plugin declares in `describe`.
    #[arg(long)]
    pub version: Option<String>,
}

impl Identity {
    /// The statement for `file`: flags first, the plugin's own `describe` for what is missing.
    fn statement(&self, file: &PluginFile) -> Result<Statement> {
        let (name, version) = match (&self.name, &self.version) {
            (Some(n), Some(v)) => (n.clone(), v.clone()),
            _ => {
                let meta = file.describe()?;
                (
                    self.name.clone().unwrap_or(meta.name),
                    self.version.clone().unwrap_or(meta.version),
                )
            }
        };
        Ok(Statement::new(name, version, file.digest)?)
    }
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("signer").required(true).args(["key", "cosign_signature"]))]
pub struct SignArgs {
    /// The plugin file (`.wasm` component).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Private key (PKCS#8 PEM from `keygen` or openssl; Ed25519 or P-256).
    #[arg(long, value_name = "KEY")]
    pub key: Option<PathBuf>,
    /// Instead of signing here, add a signature made elsewhere with
    /// `cosign sign-blob --key cosign.key STATEMENT` over the output of `plugin statement`:
    /// the base64 signature it printed, or @FILE holding it.
    #[arg(long, value_name = "BASE64|@FILE")]
    pub cosign_signature: Option<String>,
    #[command(flatten)]
    pub identity: Identity,
    /// Where to write the bundle. Default: FILE.sig.json.
    #[arg(long, value_name = "PATH")]
    pub bundle: Option<PathBuf>,
}

pub fn sign(args: &SignArgs) -> Result<Status> {
    let file = PluginFile::read(&args.file)?;
    let statement = args.identity.statement(&file)?;
    let signature = match (&args.key, &args.cosign_signature) {
        (Some(key), _) => SigningKey::read_pem_file(key)?.sign_statement(&statement),
        (None, Some(sig)) => cosign_entry(sig)?,
        (None, None) => bail!("give --key KEY or --cosign-signature SIG"),
    };
    let path = args
        .bundle
        .clone()
        .unwrap_or_else(|| SignatureBundle::path_for(&args.file));
    // Keep other signers' signatures when they cover the same statement; a bundle for
    // other bytes (an older build) is replaced, since its signatures cannot apply.
    let mut bundle = match SignatureBundle::read(&path) {
        Ok(existing) if existing.statement().ok().as_ref() == Some(&statement) => existing,
        Ok(old) => {
            // The old bundle's name and version are whatever its file says: not validated.
            errln!(
                "note: replacing {} (it was for {} {} {})",
                terminal::path(&path),
                clean(&old.name),
                clean(&old.version),
                old.sha256
            );
            SignatureBundle::new(&statement)
        }
        Err(_) if !path.exists() => SignatureBundle::new(&statement),
        Err(e) => {
            return Err(e).context("the existing bundle is unreadable; remove it or pass --bundle");
        }
    };
    let key_id = signature.key_id.clone();
    let algorithm = signature.algorithm;
    let added = bundle.add(signature);
    bundle.write(&path)?;
    outln!(
        "{} {} {} {}",
        if added { "signed" } else { "already signed" },
        statement.name(),
        statement.version(),
        statement.digest()
    );
    outln!(
        "signature: {} by {} -> {} ({} signature{})",
        algorithm.as_str(),
        key_id.as_deref().unwrap_or("a cosign key (no key id)"),
        terminal::path(&path),
        bundle.signatures.len(),
        if bundle.signatures.len() == 1 {
            ""
        } else {
            "s"
        }
    );
    Ok(Status::Success)
}

/// A bundle entry for a `cosign sign-blob` signature (base64 ASN.1 DER, ECDSA P-256).
fn cosign_entry(arg: &str) -> Result<PluginSignature> {
    let text = match arg.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading signature file {path}"))?,
        None => arg.to_owned(),
    };
    let text = text.trim();
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .context(
            "the cosign signature is not base64; pass exactly what `cosign sign-blob` printed",
        )?;
    Ok(PluginSignature {
        algorithm: Algorithm::EcdsaP256Sha256,
        key_id: None,
        signature: text.to_owned(),
    })
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The plugin file.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Trusted public key (SPKI PEM, Ed25519 or P-256), or a directory of them. Repeatable.
    #[arg(long = "trust-root", value_name = "PEM", required = true)]
    pub trust_roots: Vec<PathBuf>,
    /// Signature bundle. Default: FILE.sig.json.
    #[arg(long, value_name = "PATH")]
    pub bundle: Option<PathBuf>,
}

pub fn verify(args: &VerifyArgs) -> Result<Status> {
    let file = PluginFile::read(&args.file)?;
    let path = args
        .bundle
        .clone()
        .unwrap_or_else(|| SignatureBundle::path_for(&args.file));
    let bundle = SignatureBundle::read(&path).with_context(|| {
        format!(
            "no usable signature bundle for {}; sign it with `kubectl bosun plugin sign`",
            args.file.display()
        )
    })?;
    let roots = TrustRoots::load(&args.trust_roots)?;
    let verified = bundle
        .verify(&file.bytes, &roots)
        .with_context(|| format!("{} did not verify", args.file.display()))?;
    outln!(
        "verified {} {} {}",
        verified.statement.name(),
        verified.statement.version(),
        verified.statement.digest()
    );
    outln!(
        "signed by {} ({}, trust root {})",
        verified.key_id,
        verified.algorithm.as_str(),
        clean(&verified.origin)
    );
    Ok(Status::Success)
}

#[derive(Debug, Args)]
pub struct StatementArgs {
    /// The plugin file.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    #[command(flatten)]
    pub identity: Identity,
}

pub fn statement(args: &StatementArgs) -> Result<Status> {
    let file = PluginFile::read(&args.file)?;
    let statement = args.identity.statement(&file)?;
    // Exactly the signed bytes (a validated name and version: no control character).
    terminal::out_verbatim(&statement.to_bytes())?;
    Ok(Status::Success)
}
