//! Where plugins are compiled. Never by the host's own engine, which lives as long as the
//! process: cranelift keeps its compile contexts (about 4 MiB for a small plugin) in the
//! engine that compiled, for the next compile. So a compile gets an engine of its own,
//! dropped after it, either in this process or in a child process (the agent runs
//! `bosun-agent compile-plugin`), which also keeps the compiler's code and threads out of
//! the agent's resident memory (docs/benchmarks.md, "The agent after a step").
//!
//! Either way the result is wasmtime's compiled artifact, loaded into the host's engine,
//! which checks that it was compiled for the same wasmtime and the same settings.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use wasmtime::{Config, Engine};

use crate::Error;

/// How a [`Host`](crate::Host) compiles plugins.
#[derive(Clone, Debug, Default)]
pub enum Compiler {
    /// In this process, on an engine made for the compile and dropped after it. What
    /// stays resident afterwards is the compiler's code (the pages of this binary it ran)
    /// and the threads it compiled on.
    #[default]
    InProcess,
    /// In a child process: `program args...` reads a component on its stdin and writes
    /// the compiled artifact on its stdout ([`compile_stdin_to_stdout`]). It must be this
    /// same build (the agent names itself): an artifact of another wasmtime or other
    /// settings is refused when it is loaded.
    Subprocess { program: PathBuf, args: Vec<String> },
}

/// The wasmtime configuration plugins are compiled for. The host's engine adds its
/// instance pool to it; compiled code does not depend on how instances are allocated.
pub(crate) fn engine_config() -> Config {
    let mut c = Config::new();
    c.wasm_component_model(true).epoch_interruption(true);
    c
}

/// Largest component a compile subprocess reads, and largest artifact the host accepts
/// back from one (plugins are limited to 64 MiB by default where they are fetched).
const MAX_INPUT: u64 = 1 << 30;
const MAX_ARTIFACT: u64 = 4 << 30;

/// Compiles the component `bytes` into a wasmtime artifact.
pub(crate) fn compile(compiler: &Compiler, bytes: &[u8]) -> Result<Vec<u8>, Error> {
    match compiler {
        Compiler::InProcess => in_process(bytes).map_err(|message| Error::Compile { message }),
        Compiler::Subprocess { program, args } => subprocess(program, args, bytes),
    }
}

fn in_process(bytes: &[u8]) -> Result<Vec<u8>, String> {
    Engine::new(&engine_config())
        .map_err(|e| format!("wasmtime compile engine: {e:#}"))?
        .precompile_component(bytes)
        .map_err(|e| format!("{e:#}"))
}

fn subprocess(program: &PathBuf, args: &[String], bytes: &[u8]) -> Result<Vec<u8>, Error> {
    let shown = program.display();
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::setup(format!("starting the plugin compiler {shown}: {e}")))?;
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(Error::setup(format!(
            "the plugin compiler {shown} started without its pipes"
        )));
    };
    // Written and read on threads of their own, so that neither side waits for the other
    // with a full pipe; scoped, so the plugin's bytes are written from where they are.
    let (read, artifact, status, errors) = std::thread::scope(|scope| {
        let writer = scope.spawn(move || stdin.write_all(bytes));
        let errors = scope.spawn(move || {
            let mut text = String::new();
            let _ = stderr.take(64 << 10).read_to_string(&mut text);
            text
        });
        let mut artifact = Vec::new();
        let read = stdout.take(MAX_ARTIFACT + 1).read_to_end(&mut artifact);
        if read.is_err() || artifact.len() as u64 > MAX_ARTIFACT {
            let _ = child.kill();
        }
        let status = child.wait();
        let _ = writer.join();
        (read, artifact, status, errors.join().unwrap_or_default())
    });
    let status = status
        .map_err(|e| Error::setup(format!("waiting for the plugin compiler {shown}: {e}")))?;
    if !status.success() {
        let message = errors.trim();
        return Err(Error::Compile {
            message: if message.is_empty() {
                format!("the plugin compiler {shown} failed ({status})")
            } else {
                message.to_string()
            },
        });
    }
    match read {
        Err(e) => Err(Error::setup(format!(
            "reading the plugin compiler's output: {e}"
        ))),
        Ok(_) if artifact.len() as u64 > MAX_ARTIFACT => Err(Error::Compile {
            message: format!("the compiled plugin is larger than {MAX_ARTIFACT} bytes"),
        }),
        Ok(_) => Ok(artifact),
    }
}

/// The compile subprocess's side of [`Compiler::Subprocess`]: reads a component on stdin,
/// compiles it on an engine of [`engine_config`] and writes the artifact on stdout. The
/// error is what the parent reports as the compile error, written on stderr by the caller.
pub fn compile_stdin_to_stdout() -> Result<(), String> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_INPUT + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("reading the plugin on stdin: {e}"))?;
    if bytes.len() as u64 > MAX_INPUT {
        return Err(format!("the plugin is larger than {MAX_INPUT} bytes"));
    }
    let artifact = in_process(&bytes)?;
    let mut out = std::io::stdout().lock();
    out.write_all(&artifact)
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing the compiled plugin on stdout: {e}"))
}
