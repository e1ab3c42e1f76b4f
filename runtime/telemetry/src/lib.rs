//! Telemetry for Bosun's controller and agent: what they count, how they log, and the small
//! admin server that exposes both to the cluster.
//!
//! - [`metrics`]: the Prometheus metric families, each with a fixed label set built from
//!   enums (never from free text or `Debug` output), so the number of series is bounded
//!   whatever happens in the cluster.
//! - [`admin`]: an HTTP/1.1 server with `/live`, `/ready` and `/metrics` only, started with
//!   `--admin-addr`.
//! - [`init_logging`]: text or JSON logs; the controller's and agent's tracing spans carry
//!   `operation`, `node`, `step` and `plugin`, and both formats print them on every line.
//!
//! [`TelemetryArgs`] is the command-line group both binaries flatten into their own arguments.

pub mod admin;
pub mod metrics;

use std::net::SocketAddr;

pub use admin::{AdminServer, Readiness};
pub use metrics::{CacheResult, Gate, Metrics, Side, StepOutcome, Watched, metrics};

/// The telemetry flags shared by `bosun-controller` and `bosun-agent`.
#[derive(Clone, Debug, clap::Args)]
pub struct TelemetryArgs {
    /// Address of the admin server (`/live`, `/ready`, `/metrics`), e.g. `0.0.0.0:9090`.
    /// Unset: no admin server.
    #[arg(long, env = "BOSUN_ADMIN_ADDR")]
    pub admin_addr: Option<SocketAddr>,
    /// Log format: `text` (human-readable) or `json` (one object per line, span fields
    /// included, for log collectors).
    #[arg(long, env = "BOSUN_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// How log lines are written (to stderr).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Why logging could not start.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error(
        "log filter {filter:?} is not a valid tracing filter (expected e.g. `info` or `bosun_agent=debug,info`): {source}"
    )]
    Filter {
        filter: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("a global log subscriber is already installed: {0}")]
    AlreadySet(String),
}

/// Installs the process-wide log subscriber writing to stderr. `filter` uses
/// tracing-subscriber's `EnvFilter` syntax. In JSON each line carries the current span and
/// its parents (`span`, `spans`), so a step's lines carry its operation, node, step and
/// plugin; text prints the same span fields before the message.
pub fn init_logging(filter: &str, format: LogFormat) -> Result<(), LogError> {
    let env_filter =
        tracing_subscriber::EnvFilter::try_new(filter).map_err(|source| LogError::Filter {
            filter: filter.to_string(),
            source,
        })?;
    // Colours only for a person at a terminal; a log file or collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
    result.map_err(|e| LogError::AlreadySet(e.to_string()))
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    /// A binary's own `Args` (the name both binaries use) flattening the group: clap's
    /// debug assertions catch clashing group or flag names.
    #[derive(Debug, Parser)]
    struct Args {
        #[arg(long, default_value = "info")]
        log: String,
        #[command(flatten)]
        telemetry: TelemetryArgs,
    }

    #[test]
    fn flattens_into_a_binarys_args() {
        Args::command().debug_assert();
        let a = Args::parse_from([
            "bin",
            "--admin-addr",
            "127.0.0.1:9090",
            "--log-format",
            "json",
        ]);
        assert_eq!(
            a.telemetry.admin_addr,
            Some("127.0.0.1:9090".parse().unwrap())
        );
        assert_eq!(a.telemetry.log_format, LogFormat::Json);
        assert_eq!(a.log, "info");
        let err = Args::try_parse_from(["bin", "--admin-addr", "nine-thousand"]).unwrap_err();
        assert!(err.to_string().contains("--admin-addr"), "{err}");
    }
}
