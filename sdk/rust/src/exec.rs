//! Running host commands through the `exec` import.
//!
//! Only commands named in the plugin's exec grants run, and only with argument lists that
//! match a granted pattern; anything else is refused by the host with
//! [`HostError::NotGranted`] naming the command line. Commands run under the node's host
//! root with an empty environment (except `PATH`), their own timeout and an output cap.

use std::fmt;

use crate::bindings::bosun::plugin::exec as wit;
use crate::{HostError, PluginError};

/// A command to run on the node, built like `std::process::Command`.
///
/// ```ignore
/// let out = Command::new("/usr/bin/kubeadm").args(["version", "-o", "short"]).run()?;
/// let version = out.stdout_text().trim().to_owned();
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    program: String,
    args: Vec<String>,
    stdin: Option<Vec<u8>>,
}

impl Command {
    /// A command with no arguments. `program` is an absolute path on the node.
    pub fn new(program: impl Into<String>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            stdin: None,
        }
    }

    /// Appends one argument.
    #[must_use]
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends arguments.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Feeds `input` to the command's standard input (otherwise stdin is empty).
    #[must_use]
    pub fn stdin(mut self, input: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(input.into());
        self
    }

    /// Runs the command and returns what it produced, whatever its exit code.
    ///
    /// # Errors
    /// [`ExecError::Host`] when the host refused or could not run it (not granted,
    /// timeout, ...).
    pub fn output(&self) -> Result<Output, ExecError> {
        let out = wit::run(&self.program, &self.args, self.stdin.as_deref()).map_err(|e| {
            ExecError::Host {
                command: self.to_string(),
                source: HostError::from(e),
            }
        })?;
        Ok(Output {
            exit_code: out.exit_code,
            stdout: out.stdout,
            stderr: out.stderr,
            truncated: out.truncated,
        })
    }

    /// Runs the command and requires exit code 0.
    ///
    /// # Errors
    /// As [`output`](Self::output), plus [`ExecError::Exit`] with the tail of stderr when the
    /// command exits non-zero.
    pub fn run(&self) -> Result<Output, ExecError> {
        let out = self.output()?;
        if out.success() {
            Ok(out)
        } else {
            Err(ExecError::Exit {
                command: self.to_string(),
                exit_code: out.exit_code,
                stderr_tail: tail(&out.stderr_text(), 512),
            })
        }
    }
}

impl fmt::Display for Command {
    /// The command line as the host's grant messages spell it: program and arguments
    /// separated by spaces.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.program)?;
        for a in &self.args {
            write!(f, " {a}")?;
        }
        Ok(())
    }
}

/// What a finished command produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// Exit code; -1 when the process was ended by a signal.
    pub exit_code: i32,
    /// Standard output, cut at the grant's output cap.
    pub stdout: Vec<u8>,
    /// Standard error, cut at the grant's output cap.
    pub stderr: Vec<u8>,
    /// True when stdout or stderr was cut.
    pub truncated: bool,
}

impl Output {
    /// True for exit code 0.
    #[must_use]
    pub fn success(&self) -> bool {
        self.exit_code == 0
    }

    /// Standard output as text (invalid UTF-8 replaced).
    #[must_use]
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Standard error as text (invalid UTF-8 replaced).
    #[must_use]
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// Why a command did not produce a successful result.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// The host refused or failed to run the command.
    #[error("running `{command}`: {source}")]
    Host {
        /// The command line.
        command: String,
        /// What the host said.
        source: HostError,
    },
    /// The command ran and exited non-zero (only from [`Command::run`]).
    #[error("`{command}` exited with code {exit_code}: {stderr_tail}")]
    Exit {
        /// The command line.
        command: String,
        /// Its exit code.
        exit_code: i32,
        /// The end of its standard error.
        stderr_tail: String,
    },
}

impl From<ExecError> for PluginError {
    /// `not-granted` (and the other host codes) for refusals, `command-failed` for a
    /// non-zero exit.
    fn from(e: ExecError) -> Self {
        match &e {
            ExecError::Host { source, .. } => {
                let mut pe = PluginError::from(source.clone());
                pe.message = e.to_string();
                pe
            }
            ExecError::Exit { .. } => PluginError::new("command-failed", e.to_string()),
        }
    }
}

fn tail(s: &str, max: usize) -> String {
    let s = s.trim_end();
    if s.len() <= max {
        return s.to_owned();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &s[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_is_spelled_like_grant_messages() {
        let c = Command::new("/usr/bin/kubeadm")
            .args(["certs", "renew"])
            .arg("all");
        assert_eq!(c.to_string(), "/usr/bin/kubeadm certs renew all");
    }

    #[test]
    fn not_granted_keeps_its_code_and_names_the_command() {
        let e = ExecError::Host {
            command: "/bin/rm -rf /".into(),
            source: HostError::NotGranted("exec: /bin/rm -rf /".into()),
        };
        let pe = PluginError::from(e);
        assert_eq!(pe.code, "not-granted");
        assert!(
            pe.message.contains("running `/bin/rm -rf /`"),
            "{}",
            pe.message
        );
    }

    #[test]
    fn exit_error_keeps_stderr_tail() {
        let long = "é".repeat(600);
        let t = tail(&long, 512);
        assert!(t.starts_with("...") && t.len() <= 515);
        let e = ExecError::Exit {
            command: "/bin/false".into(),
            exit_code: 1,
            stderr_tail: "boom".into(),
        };
        let pe = PluginError::from(e);
        assert_eq!(pe.code, "command-failed");
        assert_eq!(pe.message, "`/bin/false` exited with code 1: boom");
    }
}
