//! `new`: scaffolds a plugin crate that builds on its own for wasm32-wasip2.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::Status;
use crate::terminal::{self, outln};

#[derive(Debug, Args)]
pub struct NewArgs {
    /// Plugin name: a lowercase DNS label (a-z, 0-9, '-'); also the crate name.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Directory to create. Default: ./NAME.
    #[arg(long, value_name = "PATH")]
    pub dir: Option<PathBuf>,
    /// Path to the SDK crate (sdk/rust of a Bosun checkout). Default: found from the
    /// current directory or from where this binary was built. There is no crates.io
    /// release of bosun-plugin-sdk yet.
    #[arg(long, value_name = "PATH")]
    pub sdk_path: Option<PathBuf>,
}

const CARGO_TOML: &str = include_str!("templates/Cargo.toml.tmpl");
const LIB_RS: &str = include_str!("templates/lib.rs.tmpl");
const GRANTS_YAML: &str = include_str!("templates/grants.yaml.tmpl");
const README_MD: &str = include_str!("templates/README.md.tmpl");
const GITIGNORE: &str = include_str!("templates/gitignore.tmpl");

pub fn new(args: &NewArgs) -> Result<Status> {
    bosun_trust::statement::validate_name(&args.name)
        .context("the plugin name is also its signed name")?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&args.name));
    if dir.exists()
        && dir
            .read_dir()
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        bail!(
            "{} already exists and is not empty; choose another --dir",
            dir.display()
        );
    }
    let sdk = match &args.sdk_path {
        Some(p) => check_sdk(p)?,
        None => find_sdk().context(
            "could not find bosun-plugin-sdk (sdk/rust of a Bosun checkout); it has no crates.io \
             release yet, so pass --sdk-path /path/to/bosun/sdk/rust",
        )?,
    };
    let sdk_str = sdk.to_str().context("the SDK path is not UTF-8")?;
    let lib_name = args.name.replace('-', "_");
    let type_name: String = args
        .name
        .split('-')
        .map(|part| {
            let mut c = part.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect();
    // A name starting with a digit is a valid DNS label but not a Rust identifier.
    let type_name = if type_name.starts_with(|c: char| c.is_ascii_digit()) {
        format!("P{type_name}")
    } else {
        type_name
    };
    let fill = |t: &str| {
        t.replace("{{name}}", &args.name)
            .replace("{{lib_name}}", &lib_name)
            .replace("{{type_name}}", &type_name)
            .replace("{{sdk_path}}", &toml_escape(sdk_str))
    };
    std::fs::create_dir_all(dir.join("src"))
        .with_context(|| format!("creating {}", dir.display()))?;
    for (rel, body) in [
        ("Cargo.toml", CARGO_TOML),
        ("src/lib.rs", LIB_RS),
        ("grants.yaml", GRANTS_YAML),
        ("README.md", README_MD),
        (".gitignore", GITIGNORE),
    ] {
        let path = dir.join(rel);
        std::fs::write(&path, fill(body)).with_context(|| format!("writing {}", path.display()))?;
    }
    outln!(
        "created plugin {} in {} (SDK: {})",
        args.name,
        terminal::path(&dir),
        terminal::path(&sdk)
    );
    outln!("next:");
    outln!(
        "  cd {} && cargo build --release --target wasm32-wasip2",
        terminal::path(&dir)
    );
    outln!("  kubectl bosun plugin sign --key KEY target/wasm32-wasip2/release/{lib_name}.wasm");
    Ok(Status::Success)
}

/// Backslashes and quotes would break the TOML basic string the path goes into.
fn toml_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

fn check_sdk(path: &Path) -> Result<PathBuf> {
    let manifest = path.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).with_context(|| {
        format!(
            "{} is not the SDK crate: cannot read {}",
            path.display(),
            manifest.display()
        )
    })?;
    if !text.contains("name = \"bosun-plugin-sdk\"") {
        bail!(
            "{} is not the bosun-plugin-sdk crate (its Cargo.toml names another package)",
            manifest.display()
        );
    }
    path.canonicalize()
        .with_context(|| format!("resolving {}", path.display()))
}

/// Looks for `sdk/rust` above the current directory, then above this binary, then in
/// the checkout this binary was built from.
fn find_sdk() -> Result<PathBuf> {
    let mut starts = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        starts.push(cwd);
    }
    if let Ok(exe) = std::env::current_exe() {
        starts.push(exe);
    }
    starts.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    for start in starts {
        for dir in start.ancestors() {
            let candidate = dir.join("sdk/rust");
            if candidate.join("Cargo.toml").is_file()
                && let Ok(p) = check_sdk(&candidate)
            {
                return Ok(p);
            }
        }
    }
    bail!("no sdk/rust directory above the current directory, the binary or its build checkout")
}
