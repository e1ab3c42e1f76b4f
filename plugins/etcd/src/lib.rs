//! The `etcd` plugin: the upgrade's etcd safety net on control-plane nodes.
//!
//! - `health` checks the etcd cluster from this control plane before anything on the node
//!   changes: every member answers and is healthy, one leader that every member agrees on,
//!   no alarm (NOSPACE, CORRUPT), and as many members as the cluster has control-plane
//!   Nodes (the planner passes that count). A fault fails the step with a message naming
//!   the member and the fault, so the node blocks before it is cordoned. The check waits
//!   up to `waitSeconds` for a fault to clear (a member restarted by the previous control
//!   plane's upgrade is back within seconds) and then reports what is still wrong.
//! - `snapshot` saves an etcd snapshot into [`SNAPSHOT_DIR`], verifies it with etcd's own
//!   offline tool (`etcdutl snapshot status`: bbolt's integrity check, then its hash,
//!   revision and key count), records path, size, revision, key count, etcd's hash and the
//!   file's sha256 in the step's outputs, and keeps the newest `keep` snapshots it took
//!   (`etcd-*.db`; nothing else in the directory is touched).
//!
//! How the plugin reaches etcd (docs/operations.md, "The etcd safety net"): kubeadm runs
//! etcd as a static Pod listening on the node's address (`https://ADDRESS:2379`, named in the
//! `kubeadm.kubernetes.io/etcd.advertise-client-urls` annotation of its manifest, which the
//! plugin reads) with client-certificate authentication. The plugin runs etcd's own client, `etcdctl`, and its offline tool,
//! `etcdutl`, installed by the administrator in `/usr/local/bin` on each control-plane node,
//! as granted commands: each with fixed arguments but the local member's address (kubeadm's
//! `healthcheck-client` certificate), and confined by the kernel to reading
//! `/etc/kubernetes/pki/etcd`, connecting to port 2379 and, for `snapshot save` only,
//! writing in [`SNAPSHOT_DIR`]. The plugin itself reads the static Pod manifests and reads and
//! writes [`SNAPSHOT_DIR`] (to hash and prune the snapshots), nothing else. It never runs a command inside the
//! etcd container: that needs containerd's socket, which is root on the node.
//!
//! Both actions are idempotent: `health` only reads, and `snapshot` with a `label` run
//! again finds the snapshot it took (`etcd-<time>-<label>.db`, verified again with
//! `etcdutl`) and reports it unchanged, instead of taking another whose pruning would remove
//! the first: the planner's label names one Operation (its name and the start of its UID),
//! so an upgrade's safety net stays the state before that upgrade however often the step
//! runs. Without a label every run takes a new snapshot. In a dry run `health` runs as
//! usual (its commands only read, and their grants say `dryRun: true`) and `snapshot` says
//! what it would save or reuse.

use std::io::Read;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bosun_plugin_sdk::exec::{Command, Output};
use bosun_plugin_sdk::prelude::*;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

/// etcd's client on the node.
pub const ETCDCTL: &str = "/usr/local/bin/etcdctl";
/// etcd's offline tool on the node (verifies snapshots).
pub const ETCDUTL: &str = "/usr/local/bin/etcdutl";
/// Where snapshots are kept on the node. The administrator creates it (mode 0700): the
/// plugin's grant covers this directory only, not its parent.
pub const SNAPSHOT_DIR: &str = "/var/lib/etcd-snapshots";
/// The file names the plugin writes, and the only ones it removes: `etcd-*.db`.
pub const SNAPSHOT_PREFIX: &str = "etcd-";
/// See [`SNAPSHOT_PREFIX`].
pub const SNAPSHOT_SUFFIX: &str = ".db";

/// kubeadm's etcd static Pod, whose annotation names the local member's client URL.
pub const ETCD_MANIFEST: &str = "/etc/kubernetes/manifests/etcd.yaml";
/// The annotation kubeadm writes on it: `https://<advertise address>:2379`.
pub const ADVERTISE_ANNOTATION: &str = "kubeadm.kubernetes.io/etcd.advertise-client-urls";
/// The `--endpoints` argument as granted: the local member's advertised client URL. Not
/// `127.0.0.1`: the agent runs in the Pod network (no hostNetwork), from where the node's
/// loopback is out of reach and its address is not.
pub const ENDPOINT_PATTERN: &str = "--endpoints=https://*:2379";

/// How `etcdctl` reaches the local member, after `--endpoints`: kubeadm's health-check
/// client certificate (kubeadm's etcd has no RBAC, so any client certificate of its CA may do
/// everything; what confines the commands is their argument lists and the kernel sandbox).
pub const CONNECTION: [&str; 4] = [
    "--cacert=/etc/kubernetes/pki/etcd/ca.crt",
    "--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt",
    "--key=/etc/kubernetes/pki/etcd/healthcheck-client.key",
    "--dial-timeout=3s",
];
/// The per-request limit of the health queries. `snapshot save` has none (etcdctl then
/// sets none): its grant's timeout bounds it.
const COMMAND_TIMEOUT: &str = "--command-timeout=10s";

/// The four read-only queries of `health`, after `--endpoints`, [`CONNECTION`] and
/// [`COMMAND_TIMEOUT`].
pub const QUERIES: [[&str; 4]; 4] = [
    ["member", "list", "-w", "json"],
    ["alarm", "list", "-w", "json"],
    ["endpoint", "health", "--cluster", "-w=json"],
    ["endpoint", "status", "--cluster", "-w=json"],
];

/// The argument pattern of `snapshot save`.
pub const SAVE_PATTERN: &str = "/var/lib/etcd-snapshots/etcd-*.db";

/// The actions with their params.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "action", content = "params", rename_all = "kebab-case")]
pub enum Action {
    /// Check the etcd cluster's health from this control plane.
    Health(HealthParams),
    /// Save, verify and keep an etcd snapshot.
    Snapshot(SnapshotParams),
}

/// Params of `health`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthParams {
    /// The number of members etcd must have: the cluster's control-plane Nodes (the planner
    /// passes it). Unset: not checked.
    #[serde(default)]
    pub expected_members: Option<u32>,
    /// Seconds to wait for a fault to clear before failing. Default 30.
    #[serde(default = "default_wait")]
    pub wait_seconds: u64,
}

/// Params of `snapshot`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotParams {
    /// How many snapshots to keep, the newest; older `etcd-*.db` files are removed. 1 to
    /// 100, default 3.
    #[serde(default = "default_keep")]
    pub keep: u32,
    /// Put in the file name after the time (the planner passes the Operation's name and
    /// the start of its UID): lowercase letters, digits, `-` and `.`, at most 63
    /// characters. A verified snapshot with this label already in the directory is
    /// reported unchanged instead of taking another.
    #[serde(default)]
    pub label: Option<String>,
}

fn default_wait() -> u64 {
    30
}

fn default_keep() -> u32 {
    3
}

/// How often `health` looks again while a fault lasts.
const POLL: Duration = Duration::from_secs(3);

/// The plugin.
pub struct Etcd;

impl Plugin for Etcd {
    type Action = Action;

    fn metadata() -> Metadata {
        let mut m = bosun_plugin_sdk::metadata!()
            .name("etcd")
            .action(
                ActionInfo::new(
                    "health",
                    "Check etcd from this control plane: members healthy, one leader, no alarm, one member per control-plane Node",
                )
                .params::<HealthParams>()
                .idempotent(),
            )
            .action(
                ActionInfo::new(
                    "snapshot",
                    "Save an etcd snapshot into /var/lib/etcd-snapshots, verify it with etcdutl, keep the newest N",
                )
                .params::<SnapshotParams>()
                .idempotent(),
            )
            .writes(SNAPSHOT_DIR);
        for query in QUERIES {
            m = m.runs(ETCDCTL, query_args(ENDPOINT_PATTERN, query));
        }
        m.reads("/etc/kubernetes/manifests")
            .runs(ETCDCTL, save_args(ENDPOINT_PATTERN, SAVE_PATTERN))
            .runs(ETCDUTL, status_args(SAVE_PATTERN))
    }

    fn preflight(action: &Action) -> Result<Vec<Check>, PluginError> {
        let mut checks = vec![match endpoint() {
            Ok(e) => Check::pass("local-member", format!("etcd on this node: {e}")),
            Err(m) => Check::fail("local-member", m),
        }];
        match action {
            Action::Health(p) => checks.push(Check::require(
                "params",
                p.expected_members != Some(0) && p.wait_seconds <= 3600,
                format!(
                    "expectedMembers {:?} (at least 1), waitSeconds {} (at most 3600)",
                    p.expected_members, p.wait_seconds
                ),
            )),
            Action::Snapshot(p) => {
                checks.push(match label_ok(p) {
                    Ok(()) => Check::pass("params", format!("keep {}", p.keep)),
                    Err(m) => Check::fail("params", m),
                });
                checks.push(match std::fs::metadata(SNAPSHOT_DIR) {
                    Ok(md) if md.is_dir() => {
                        Check::pass("snapshot-dir", format!("{SNAPSHOT_DIR} exists"))
                    }
                    _ => Check::fail(
                        "snapshot-dir",
                        format!(
                            "{SNAPSHOT_DIR} does not exist on this node: create it on each control-plane node \
                             (`install -d -m 0700 {SNAPSHOT_DIR}`), then retry; or turn the snapshot off with \
                             spec.upgrade.etcd.snapshot: false"
                        ),
                    ),
                });
            }
        }
        Ok(checks)
    }

    fn run(action: Action, ctx: &RunContext) -> Result<Outcome, PluginError> {
        match action {
            Action::Health(p) => health(&p),
            Action::Snapshot(p) => snapshot(&p, ctx),
        }
    }
}

fn query_args(endpoint: &str, query: [&'static str; 4]) -> Vec<String> {
    let mut args = vec![endpoint.to_owned()];
    args.extend(CONNECTION.map(str::to_owned));
    args.push(COMMAND_TIMEOUT.to_owned());
    args.extend(query.map(str::to_owned));
    args
}

fn save_args(endpoint: &str, path: &str) -> Vec<String> {
    let mut args = vec![endpoint.to_owned()];
    args.extend(CONNECTION.map(str::to_owned));
    args.extend(["snapshot", "save", path].map(str::to_owned));
    args
}

/// The `--endpoints` argument for the local member: the first https URL of kubeadm's
/// annotation on the etcd static Pod's manifest, checked to be `https://HOST:2379` with a
/// plain host (an address or a name, no path, no user).
///
/// # Errors
/// What is missing or wrong, for a preflight message.
pub fn local_endpoint(manifest: &str) -> Result<String, String> {
    let value = manifest
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix(ADVERTISE_ANNOTATION)
                .and_then(|r| r.trim_start().strip_prefix(':'))
        })
        .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\''))
        .ok_or_else(|| {
            format!("{ETCD_MANIFEST} has no {ADVERTISE_ANNOTATION} annotation (kubeadm writes one)")
        })?;
    let url = value
        .split(',')
        .map(str::trim)
        .find(|u| u.starts_with("https://"))
        .ok_or_else(|| format!("{ADVERTISE_ANNOTATION} is `{value}`: no https URL"))?;
    let host = url
        .strip_prefix("https://")
        .and_then(|r| r.strip_suffix(":2379"))
        .filter(|h| {
            !h.is_empty()
                && !h.starts_with('.')
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
        })
        .ok_or_else(|| {
            format!("{ADVERTISE_ANNOTATION} is `{url}`: expected https://ADDRESS:2379")
        })?;
    Ok(format!("--endpoints=https://{host}:2379"))
}

/// [`local_endpoint`] of this node's manifest.
fn endpoint() -> Result<String, String> {
    let manifest = match std::fs::read_to_string(ETCD_MANIFEST) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "{ETCD_MANIFEST} does not exist: kubeadm runs no etcd on this node (an external etcd?); \
                 turn the etcd steps off with spec.upgrade.etcd (healthCheck: false, snapshot: false)"
            ));
        }
        Err(e) => return Err(format!("reading {ETCD_MANIFEST}: {e}")),
    };
    local_endpoint(&manifest)
}

fn status_args(path: &str) -> Vec<&str> {
    vec!["snapshot", "status", path, "-w", "json"]
}

fn label_ok(p: &SnapshotParams) -> Result<(), String> {
    if !(1..=100).contains(&p.keep) {
        return Err(format!("keep is {}, expected 1 to 100", p.keep));
    }
    match &p.label {
        Some(l)
            if l.is_empty()
                || l.len() > 63
                || l.starts_with('.')
                || !l.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'
                }) =>
        {
            Err(format!(
                "label `{l}`: expected 1 to 63 lowercase letters, digits, `-` or `.`, not starting with `.`"
            ))
        }
        _ => Ok(()),
    }
}

// ---- health -------------------------------------------------------------------------

/// `etcdctl member list -w json`.
#[derive(Debug, Deserialize)]
pub struct MemberList {
    #[serde(default)]
    pub members: Vec<Member>,
}

/// One member. Its ID is a 64-bit number, kept exact.
#[derive(Clone, Debug, Deserialize)]
pub struct Member {
    #[serde(rename = "ID")]
    pub id: u64,
    /// Empty for a member added but never started.
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "clientURLs")]
    pub client_urls: Vec<String>,
    #[serde(default, rename = "isLearner")]
    pub is_learner: bool,
}

/// `etcdctl alarm list -w json`.
#[derive(Debug, Deserialize)]
pub struct AlarmList {
    #[serde(default)]
    pub alarms: Vec<Alarm>,
}

/// One raised alarm.
#[derive(Debug, Deserialize)]
pub struct Alarm {
    #[serde(rename = "memberID")]
    pub member_id: u64,
    /// etcd's AlarmType: 1 NOSPACE, 2 CORRUPT.
    pub alarm: i32,
}

/// One entry of `etcdctl endpoint health --cluster -w=json`.
#[derive(Debug, Deserialize)]
pub struct EndpointHealth {
    pub endpoint: String,
    pub health: bool,
    #[serde(default)]
    pub error: Option<String>,
}

/// One entry of `etcdctl endpoint status --cluster -w=json`.
#[derive(Debug, Deserialize)]
pub struct EndpointStatus {
    #[serde(rename = "Endpoint")]
    pub endpoint: String,
    #[serde(rename = "Status")]
    pub status: StatusBody,
}

/// The part of a member's status the check reads.
#[derive(Debug, Deserialize)]
pub struct StatusBody {
    pub header: StatusHeader,
    /// The leader this member follows; 0 when it knows none.
    #[serde(default)]
    pub leader: u64,
    #[serde(default)]
    pub version: String,
}

/// The header of a status: which member answered.
#[derive(Debug, Deserialize)]
pub struct StatusHeader {
    pub member_id: u64,
}

/// What the four queries returned.
#[derive(Debug, Default)]
pub struct Observed {
    pub members: Vec<Member>,
    pub alarms: Vec<Alarm>,
    pub health: Vec<EndpointHealth>,
    pub status: Vec<EndpointStatus>,
    /// Endpoints `endpoint status` could not reach, from its stderr.
    pub status_failures: Vec<String>,
}

/// The health check's verdict: what is wrong (empty when healthy) and a summary.
#[derive(Debug, PartialEq, Eq)]
pub struct Verdict {
    pub faults: Vec<String>,
    pub leader: Option<String>,
}

fn member_label(m: &Member) -> String {
    let name = if m.name.is_empty() {
        format!("{:x} (never started)", m.id)
    } else {
        m.name.clone()
    };
    match m.client_urls.first() {
        Some(url) => format!("{name} ({url})"),
        None => name,
    }
}

fn alarm_name(alarm: i32) -> String {
    match alarm {
        1 => "NOSPACE (the database reached its quota: compact and defragment, then `etcdctl alarm disarm`)".into(),
        2 => "CORRUPT (members disagree on their data: see etcd's logs before anything else)".into(),
        other => format!("alarm type {other}"),
    }
}

/// Judges what the queries returned. Pure: the table tests feed it etcdctl's JSON.
#[must_use]
pub fn judge(seen: &Observed, expected_members: Option<u32>) -> Verdict {
    let mut faults = membership_faults(seen, expected_members);
    faults.extend(member_faults(seen));
    let leader = match leader_of(seen) {
        Ok(leader) => Some(leader),
        Err(fault) => {
            faults.push(fault);
            None
        }
    };
    Verdict { faults, leader }
}

fn by_id(seen: &Observed, id: u64) -> Option<&Member> {
    seen.members.iter().find(|m| m.id == id)
}

/// The member list itself: as many members as control-plane Nodes, every one a started,
/// voting member that etcdctl checked.
fn membership_faults(seen: &Observed, expected_members: Option<u32>) -> Vec<String> {
    let mut faults = Vec::new();
    if let Some(n) = expected_members
        && seen.members.len() != n as usize
    {
        let names: Vec<String> = seen.members.iter().map(member_label).collect();
        faults.push(format!(
            "etcd has {} members ({}) and the cluster {n} control-plane Nodes: a control plane without a member, \
             or a member left from a removed node; fix the membership (`etcdctl member list`, `member remove`) before upgrading",
            seen.members.len(),
            names.join(", ")
        ));
    }
    for m in &seen.members {
        let checked = m
            .client_urls
            .iter()
            .any(|u| seen.health.iter().any(|h| &h.endpoint == u));
        if m.is_learner {
            faults.push(format!(
                "member {} is a learner, not yet a voting member: wait for it to be promoted",
                member_label(m)
            ));
        } else if m.name.is_empty() {
            faults.push(format!(
                "member {} was added but never started",
                member_label(m)
            ));
        } else if !checked {
            faults.push(format!(
                "member {} was not checked: etcdctl reported no health for it",
                member_label(m)
            ));
        }
    }
    faults
}

/// Each member's own state: unhealthy, or with an alarm raised.
fn member_faults(seen: &Observed) -> Vec<String> {
    let by_url = |url: &str| {
        seen.members
            .iter()
            .find(|m| m.client_urls.iter().any(|u| u == url))
    };
    let unhealthy = seen.health.iter().filter(|h| !h.health).map(|h| {
        let who = by_url(&h.endpoint).map_or_else(|| h.endpoint.clone(), member_label);
        format!(
            "member {who} is not healthy: {}",
            h.error.as_deref().unwrap_or("no reason given")
        )
    });
    let alarms = seen.alarms.iter().map(|a| {
        let who =
            by_id(seen, a.member_id).map_or_else(|| format!("{:x}", a.member_id), member_label);
        format!("member {who} has alarm {}", alarm_name(a.alarm))
    });
    unhealthy.chain(alarms).collect()
}

/// The one leader every member that answered follows, a voting member.
fn leader_of(seen: &Observed) -> Result<String, String> {
    let leaders: std::collections::BTreeSet<u64> =
        seen.status.iter().map(|s| s.status.leader).collect();
    match leaders.into_iter().collect::<Vec<_>>().as_slice() {
        [] => Err(format!(
            "no member reported its status, so no leader is known{}",
            if seen.status_failures.is_empty() {
                String::new()
            } else {
                format!(" ({})", seen.status_failures.join("; "))
            }
        )),
        [0] => Err("etcd has no leader: the members are electing one, or have lost quorum".into()),
        [id] => by_id(seen, *id)
            .filter(|m| !m.is_learner)
            .map(member_label)
            .ok_or_else(|| format!("the leader {id:x} is not a voting member in the member list")),
        several => {
            let views: Vec<String> = seen
                .status
                .iter()
                .map(|s| {
                    let who = by_id(seen, s.status.header.member_id)
                        .map_or_else(|| s.endpoint.clone(), member_label);
                    format!("{who} follows {:x}", s.status.leader)
                })
                .collect();
            Err(format!(
                "the members disagree on the leader ({} different: {})",
                several.len(),
                views.join(", ")
            ))
        }
    }
}

fn etcdctl(endpoint: &str, query: [&'static str; 4]) -> Result<Output, PluginError> {
    Ok(Command::new(ETCDCTL)
        .args(query_args(endpoint, query))
        .output()?)
}

fn parse<T: DeserializeOwned>(what: &str, out: &Output) -> Result<T, String> {
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "`etcdctl {what}` gave no answer ({e}; exit code {}): {}",
            out.exit_code,
            tail(&out.stderr_text(), 400)
        )
    })
}

fn tail(s: &str, max: usize) -> &str {
    let s = s.trim();
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Runs the four queries. An `Err` is a fault that stops the check (the local member does
/// not answer); `Ok` holds whatever they returned, faults included.
fn observe(endpoint: &str) -> Result<Result<Observed, String>, PluginError> {
    let etcdctl = |query| etcdctl(endpoint, query);
    let members = etcdctl(QUERIES[0])?;
    let members: MemberList = match parse("member list", &members) {
        Ok(m) => m,
        Err(e) => {
            return Ok(Err(format!(
                "the etcd member on this node ({}) does not answer: {e}",
                endpoint.trim_start_matches("--endpoints=")
            )));
        }
    };
    let alarms: AlarmList = match parse("alarm list", &etcdctl(QUERIES[1])?) {
        Ok(a) => a,
        Err(e) => return Ok(Err(e)),
    };
    // Both exit non-zero when a member is unhealthy or unreachable, and still print JSON
    // for the members that answered.
    let health_out = etcdctl(QUERIES[2])?;
    let health: Vec<EndpointHealth> = match parse("endpoint health --cluster", &health_out) {
        Ok(h) => h,
        Err(e) => return Ok(Err(e)),
    };
    let status_out = etcdctl(QUERIES[3])?;
    let status: Vec<EndpointStatus> =
        parse("endpoint status --cluster", &status_out).unwrap_or_default();
    let status_failures = status_out
        .stderr_text()
        .lines()
        .filter(|l| l.starts_with("Failed to get the status of endpoint"))
        .map(str::to_owned)
        .collect();
    Ok(Ok(Observed {
        members: members.members,
        alarms: alarms.alarms,
        health,
        status,
        status_failures,
    }))
}

fn health(p: &HealthParams) -> Result<Outcome, PluginError> {
    let endpoint = endpoint().map_err(|m| PluginError::new("no-local-member", m))?;
    let start = Instant::now();
    let wait = Duration::from_secs(p.wait_seconds);
    let mut reported = String::new();
    loop {
        let (faults, seen, leader) = match observe(&endpoint)? {
            Err(fault) => (vec![fault], None, None),
            Ok(seen) => {
                let v = judge(&seen, p.expected_members);
                (v.faults, Some(seen), v.leader)
            }
        };
        if faults.is_empty()
            && let (Some(seen), Some(leader)) = (seen, leader)
        {
            let names: Vec<String> = seen.members.iter().map(member_label).collect();
            let versions: std::collections::BTreeSet<&str> = seen
                .status
                .iter()
                .map(|s| s.status.version.as_str())
                .collect();
            let versions: Vec<&str> = versions.into_iter().collect();
            return Ok(Outcome::unchanged(format!(
                "etcd is healthy: {} member{} ({}), leader {leader}, no alarm",
                seen.members.len(),
                if seen.members.len() == 1 { "" } else { "s" },
                names.join(", ")
            ))
            .output("members", seen.members.len())
            .output("leader", &leader)
            .output("versions", versions.join(",")));
        }
        let now = faults.join("; ");
        if start.elapsed() >= wait {
            return Err(PluginError::retryable(
                "etcd-unhealthy",
                format!(
                    "etcd is not healthy, so this control plane is not touched: {now} (still so after {}s); \
                     fix etcd, then retry the task (or skip this step to upgrade anyway)",
                    p.wait_seconds
                ),
            ));
        }
        if now != reported {
            warn!("{now}; looking again for up to {}s", p.wait_seconds);
            reported = now;
        }
        std::thread::sleep(POLL);
    }
}

// ---- snapshot -----------------------------------------------------------------------

/// `etcdutl snapshot status -w json`.
#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    pub hash: u32,
    pub revision: i64,
    pub total_key: u64,
    pub total_size: u64,
}

/// Whether a snapshot's status shows a usable snapshot of a kubeadm cluster's etcd.
///
/// # Errors
/// What is wrong with it.
pub fn verified(status: &SnapshotStatus) -> Result<(), String> {
    if status.revision <= 0 || status.total_key == 0 {
        return Err(format!(
            "etcdutl reads revision {} and {} keys: an empty database, not a snapshot of a cluster's etcd",
            status.revision, status.total_key
        ));
    }
    Ok(())
}

/// `YYYYMMDDTHHMMSSZ` for a Unix time (UTC), for file names that sort by time.
#[must_use]
pub fn timestamp(unix: u64) -> String {
    let days = unix / 86_400;
    let secs = unix % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// The snapshot file name for a time and label.
#[must_use]
pub fn file_name(unix: u64, label: Option<&str>) -> String {
    match label {
        Some(l) => format!("{SNAPSHOT_PREFIX}{}-{l}{SNAPSHOT_SUFFIX}", timestamp(unix)),
        None => format!("{SNAPSHOT_PREFIX}{}{SNAPSHOT_SUFFIX}", timestamp(unix)),
    }
}

/// The newest of `names` taken with `label` (`etcd-<YYYYMMDDTHHMMSSZ>-<label>.db`, the
/// label matched whole, so `a` does not match a snapshot labelled `b-a`).
#[must_use]
pub fn labelled<'a>(names: &'a [String], label: &str) -> Option<&'a String> {
    names
        .iter()
        .filter(|n| {
            n.strip_prefix(SNAPSHOT_PREFIX)
                .and_then(|rest| rest.strip_suffix(SNAPSHOT_SUFFIX))
                .and_then(|rest| rest.split_at_checked(TIMESTAMP_LEN))
                .is_some_and(|(time, rest)| {
                    time.bytes().enumerate().all(|(i, b)| match i {
                        8 => b == b'T',
                        15 => b == b'Z',
                        _ => b.is_ascii_digit(),
                    }) && rest.strip_prefix('-') == Some(label)
                })
        })
        .max()
}

/// The length of [`timestamp`]'s `YYYYMMDDTHHMMSSZ`.
const TIMESTAMP_LEN: usize = 16;

/// Which of `names` (the directory's entries) to remove to keep the newest `keep`
/// snapshots: only `etcd-*.db` names count and are removed, oldest first by name (the
/// name starts with the time), plus the `.part` files an interrupted save left.
#[must_use]
pub fn to_remove(names: &[String], keep: usize) -> Vec<String> {
    let snapshots = snapshots_of(names);
    let excess = snapshots.len().saturating_sub(keep);
    let mut out = snapshots[..excess].to_vec();
    out.extend(
        names
            .iter()
            .filter(|n| ours(n) && n.ends_with(".db.part"))
            .cloned(),
    );
    out
}

/// A name the plugin wrote: `etcd-…`, a plain file name.
fn ours(name: &str) -> bool {
    name.starts_with(SNAPSHOT_PREFIX) && !name.contains('/')
}

/// The snapshots among `names` (`etcd-*.db`), oldest first.
fn snapshots_of(names: &[String]) -> Vec<String> {
    let mut out: Vec<String> = names
        .iter()
        .filter(|n| ours(n) && n.ends_with(SNAPSHOT_SUFFIX))
        .cloned()
        .collect();
    out.sort();
    out
}

fn snapshots_in_dir() -> Result<Vec<String>, PluginError> {
    let entries = std::fs::read_dir(SNAPSHOT_DIR)
        .map_err(|e| PluginError::new("snapshot-dir", format!("listing {SNAPSHOT_DIR}: {e}")))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| {
            PluginError::new("snapshot-dir", format!("listing {SNAPSHOT_DIR}: {e}"))
        })?;
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

fn sha256_of(path: &str) -> Result<(String, u64), PluginError> {
    let mut file = std::fs::File::open(path)
        .map_err(|e| PluginError::new("snapshot-unreadable", format!("opening {path}: {e}")))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| PluginError::new("snapshot-unreadable", format!("reading {path}: {e}")))?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buf[..n]);
    }
    let digest = hasher.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Ok((hex, size))
}

fn snapshot(p: &SnapshotParams, ctx: &RunContext) -> Result<Outcome, PluginError> {
    label_ok(p).map_err(|m| PluginError::new("bad-params", m))?;
    let endpoint = endpoint().map_err(|m| PluginError::new("no-local-member", m))?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let name = file_name(now, p.label.as_deref());
    let path = format!("{SNAPSHOT_DIR}/{name}");
    // The directory as it is before this run: one listing for the reuse and the dry run.
    let before = snapshots_in_dir()?;
    if let Some((label, taken)) = p
        .label
        .as_deref()
        .and_then(|l| labelled(&before, l).map(|t| (l, t)))
    {
        let path = format!("{SNAPSHOT_DIR}/{taken}");
        if ctx.dry_run {
            // etcdutl's grant is not a dry-run one: the real run verifies it again.
            return Ok(Outcome::unchanged(format!(
                "would keep the etcd snapshot {path} this label already has once etcdutl verifies it again, and save none"
            )));
        }
        match verify(&path) {
            Ok(status) => {
                let (sha256, size) = sha256_of(&path)?;
                let kept = snapshots_of(&before);
                return Ok(described(
                    Outcome::unchanged(format!(
                        "etcd snapshot {path} was already taken with label `{label}`: {size} bytes, revision {}, {} keys, verified again by etcdutl (hash {:08x}); sha256 {sha256}; nothing saved or removed",
                        status.revision, status.total_key, status.hash,
                    )),
                    &path,
                    size,
                    &status,
                    &sha256,
                    &kept,
                ));
            }
            Err(e) => warn!(
                "the snapshot {path} with this label does not verify ({}); saving a new one",
                e.message
            ),
        }
    }
    if ctx.dry_run {
        let mut after = before;
        after.push(name.clone());
        let removed = to_remove(&after, p.keep as usize);
        return Ok(Outcome::unchanged(format!(
            "would save an etcd snapshot to {path}, verify it with `etcdutl snapshot status` and keep the newest {} \
             (would remove {})",
            p.keep,
            if removed.is_empty() {
                "none".into()
            } else {
                removed.join(", ")
            }
        )));
    }
    bosun_plugin_sdk::log::progress(0, 3, "saving the snapshot");
    Command::new(ETCDCTL)
        .args(save_args(&endpoint, &path))
        .run()
        .map_err(|e| PluginError::new("snapshot-failed", format!("{e}")))?;
    bosun_plugin_sdk::log::progress(1, 3, "verifying it with etcdutl");
    let status = verify(&path)?;
    let (sha256, size) = sha256_of(&path)?;
    bosun_plugin_sdk::log::progress(2, 3, "keeping the newest");
    let after = snapshots_in_dir()?;
    let mut removed = Vec::new();
    for old in to_remove(&after, p.keep as usize) {
        if old == name {
            continue;
        }
        let old_path = format!("{SNAPSHOT_DIR}/{old}");
        match std::fs::remove_file(&old_path) {
            Ok(()) => removed.push(old),
            Err(e) => warn!("could not remove the old snapshot {old_path}: {e}"),
        }
    }
    bosun_plugin_sdk::log::progress(3, 3, "snapshot kept");
    let mut kept = snapshots_of(&after);
    kept.retain(|n| !removed.contains(n));
    Ok(described(
        Outcome::changed(format!(
            "etcd snapshot {path}: {size} bytes, revision {}, {} keys, verified by etcdutl (hash {:08x}); sha256 {sha256}; {} kept{}",
            status.revision,
            status.total_key,
            status.hash,
            kept.len(),
            if removed.is_empty() {
                String::new()
            } else {
                format!(", removed {}", removed.join(", "))
            }
        )),
        &path,
        size,
        &status,
        &sha256,
        &kept,
    ))
}

/// `etcdutl snapshot status` of `path`, checked.
fn verify(path: &str) -> Result<SnapshotStatus, PluginError> {
    let out = Command::new(ETCDUTL)
        .args(status_args(path))
        .run()
        .map_err(|e| PluginError::new("snapshot-unverified", format!("{path}: {e}")))?;
    let status: SnapshotStatus = serde_json::from_slice(&out.stdout).map_err(|e| {
        PluginError::new(
            "snapshot-unverified",
            format!(
                "`etcdutl snapshot status {path}` printed no status ({e}): {}",
                tail(&out.stdout_text(), 400)
            ),
        )
    })?;
    verified(&status)
        .map_err(|m| PluginError::new("snapshot-unverified", format!("{path}: {m}")))?;
    Ok(status)
}

/// A snapshot's outputs on `outcome`.
fn described(
    outcome: Outcome,
    path: &str,
    size: u64,
    status: &SnapshotStatus,
    sha256: &str,
    kept: &[String],
) -> Outcome {
    outcome
        .output("path", path)
        .output("sizeBytes", size)
        .output("revision", status.revision)
        .output("totalKeys", status.total_key)
        .output("etcdHash", format!("{:08x}", status.hash))
        .output("sha256", sha256)
        .output("kept", kept.join(","))
}

bosun_plugin_sdk::export_plugin!(Etcd);

#[cfg(test)]
mod tests;
