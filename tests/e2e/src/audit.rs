//! The lab API server's audit log (`bosun_lab::LabPaths::audit_log`), read as a record of
//! every write: who sent it (`User-Agent`, which Bosun's binaries set to their component and
//! identity), what it wrote, and when the API server received it. It is the API server's own
//! record, so a test that reads it does not take a process's word for what it sent.

use std::path::Path;

use anyhow::{Context, Result};
use bosun_lab::LabHandle;
use k8s_openapi::jiff::Timestamp;

/// One write the API server answered.
#[derive(Clone, Debug)]
pub struct Write {
    /// `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// The client's `User-Agent`.
    pub user_agent: String,
    /// When the API server received it.
    pub received: Timestamp,
    /// `resource[/subresource] namespace/name`, for messages.
    pub object: String,
    /// The answer's HTTP code.
    pub code: Option<i64>,
}

impl std::fmt::Display for Write {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} {} by {:?} -> {}",
            self.received,
            self.verb,
            self.object,
            self.user_agent,
            self.code.map_or("?".to_string(), |c| c.to_string())
        )
    }
}

/// Every write in the lab's audit log and its rotated files, oldest first. Fails, saying
/// how to fix it, when the lab's API server runs without the audit log.
pub fn writes(lab: &LabHandle) -> Result<Vec<Write>> {
    let log = bosun_lab::LabPaths::new(&lab.state_dir).audit_log;
    let dir = log.parent().context("the audit log's directory")?;
    anyhow::ensure!(
        log.exists(),
        "the lab's API server keeps no audit log at {}: it was started by an older lab; run `cargo run -p bosun-lab --bin lab -- down` and test again",
        log.display()
    );
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("audit") && name.ends_with(".log") {
            read(&path, &mut out)?;
        }
    }
    out.sort_by_key(|w| w.received);
    Ok(out)
}

fn read(path: &Path, out: &mut Vec<Write>) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    // The API server may be writing the last line: a line that does not parse is skipped.
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if event["stage"] != "ResponseComplete" {
            continue;
        }
        let Some(received) = event["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<Timestamp>().ok())
        else {
            continue;
        };
        let o = &event["objectRef"];
        let s = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
        let mut object = s(&o["resource"]);
        if let Some(sub) = o["subresource"].as_str() {
            object = format!("{object}/{sub}");
        }
        object = format!("{object} {}/{}", s(&o["namespace"]), s(&o["name"]));
        out.push(Write {
            verb: s(&event["verb"]),
            user_agent: s(&event["userAgent"]),
            received,
            object,
            code: event["responseStatus"]["code"].as_i64(),
        });
    }
    Ok(())
}

/// The `User-Agent` suffix Bosun's binaries send for `identity` (see
/// `bosun_cluster::client::user_agent`).
pub fn identity_suffix(identity: &str) -> String {
    format!("({identity})")
}
