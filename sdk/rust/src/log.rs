//! Log lines and progress: the plugin's only output channel besides its return values.
//!
//! The host caps the bytes a run may log; past the cap, lines are dropped and the run ends
//! with a `log-limit` error, so log what a person needs to follow the step, not a trace.
//! Use the [`info!`](crate::info), [`warn!`](crate::warn), [`error!`](crate::error) and
//! [`debug!`](crate::debug) macros for formatted lines, [`write`] for lines with
//! structured fields, and [`progress`] for "done of total" updates.
//!
//! On native targets (unit tests of plugin code) lines go to stderr instead of the host.

/// Severity of a log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Detail for whoever debugs the plugin.
    Debug,
    /// Normal progress of the step.
    Info,
    /// Something unusual that did not stop the step.
    Warn,
    /// Something failed.
    Error,
}

/// Emits one log line with structured `fields` shown next to the message.
pub fn write(level: Level, message: &str, fields: &[(&str, &str)]) {
    imp::write(level, message, fields);
}

/// Reports progress of the current action: `done` of `total` units, with a short message
/// such as "renewed 3 of 10 certificates".
pub fn progress(done: u64, total: u64, message: &str) {
    imp::progress(done, total, message);
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::Level;
    use crate::bindings::bosun::plugin::log as wit;

    pub(super) fn write(level: Level, message: &str, fields: &[(&str, &str)]) {
        let level = match level {
            Level::Debug => wit::Level::Debug,
            Level::Info => wit::Level::Info,
            Level::Warn => wit::Level::Warn,
            Level::Error => wit::Level::Error,
        };
        let fields: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        wit::write(level, message, &fields);
    }

    pub(super) fn progress(done: u64, total: u64, message: &str) {
        wit::progress(done, total, message);
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use super::Level;

    pub(super) fn write(level: Level, message: &str, fields: &[(&str, &str)]) {
        let fields: String = fields.iter().map(|(k, v)| format!(" {k}={v}")).collect();
        eprintln!("[{level:?}] {message}{fields}");
    }

    pub(super) fn progress(done: u64, total: u64, message: &str) {
        eprintln!("[progress {done}/{total}] {message}");
    }
}

/// Logs a formatted line at [`Level::Info`](crate::log::Level::Info): `info!("renewed {}", n)`.
#[macro_export]
macro_rules! info {
    ($($arg:tt)+) => {
        $crate::log::write($crate::log::Level::Info, &::std::format!($($arg)+), &[])
    };
}

/// Logs a formatted line at [`Level::Warn`](crate::log::Level::Warn).
#[macro_export]
macro_rules! warn {
    ($($arg:tt)+) => {
        $crate::log::write($crate::log::Level::Warn, &::std::format!($($arg)+), &[])
    };
}

/// Logs a formatted line at [`Level::Error`](crate::log::Level::Error).
#[macro_export]
macro_rules! error {
    ($($arg:tt)+) => {
        $crate::log::write($crate::log::Level::Error, &::std::format!($($arg)+), &[])
    };
}

/// Logs a formatted line at [`Level::Debug`](crate::log::Level::Debug).
#[macro_export]
macro_rules! debug {
    ($($arg:tt)+) => {
        $crate::log::write($crate::log::Level::Debug, &::std::format!($($arg)+), &[])
    };
}
