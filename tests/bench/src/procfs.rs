//! Memory and CPU of a process, from `/proc`.

use anyhow::{Context, Result};

/// One reading of a process.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcSample {
    /// Resident set now (`VmRSS`), KiB.
    pub rss_kib: u64,
    /// Peak resident set (`VmHWM`), KiB.
    pub hwm_kib: u64,
    /// Of the resident set: anonymous pages (`RssAnon`) and file-backed ones (`RssFile`),
    /// KiB.
    pub rss_anon_kib: u64,
    pub rss_file_kib: u64,
    /// User + system CPU time, seconds.
    pub cpu_secs: f64,
}

/// Reads `/proc/<pid>/status` and `/proc/<pid>/stat`.
pub fn sample(pid: u32) -> Result<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status (has the process exited?)"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14,
    // stime 15.
    let after = stat.rsplit_once(") ").map_or("", |(_, a)| a);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok(ProcSample {
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
        rss_anon_kib: field("RssAnon:"),
        rss_file_kib: field("RssFile:"),
        cpu_secs: (ticks(11) + ticks(12)) as f64 / clock_ticks() as f64,
    })
}

/// This process.
pub fn own() -> Result<ProcSample> {
    sample(std::process::id())
}

/// `CLK_TCK` (from `getconf`; 100, Linux's value, if that fails).
pub fn clock_ticks() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_and_a_peak_at_least_as_high() {
        let s = own().unwrap();
        assert!(s.rss_kib > 0);
        assert!(s.hwm_kib >= s.rss_kib);
    }
}
