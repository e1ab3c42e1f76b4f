//! Steps that reboot the node (`awaitNewBoot`): the hand-over across the reboot.
//!
//! The agent on the node is gone while its node reboots, by design, so such a step is
//! finished by the agent that starts after the reboot, not by the one that started it:
//!
//! 1. The attempt's start write records the node's boot identity (`steps[].bootId`, read
//!    from `/proc`, which no plugin can write; see [`bosun_host::reboot::boot_identity`]).
//!    Without one, the step is refused before its plugin runs.
//! 2. The plugin asks for the reboot. If it returns (in the lab it always does; on a real
//!    node the reboot usually ends the agent first), the step stays Running with
//!    `rebootRequestedAt`, and nothing else on the task starts.
//! 3. An agent that finds the step Running compares the recorded identity with the
//!    node's ([`check`]): another one means the node booted again, and the step succeeds
//!    without running its plugin again. The same one with the reboot asked for means
//!    the reboot has not happened yet: it waits (the controller blocks the task when the
//!    node is not back within `stepTimeoutSeconds` of the step's start). The same one
//!    without the reboot asked for is an agent restart during the plugin's call: the
//!    ordinary restart rule applies (the `reboot` action is idempotent, so it asks again).
//!
//! An agent restart alone keeps the boot identity (PID 1, the node's init, keeps its start
//! time), so it never passes for a reboot.

use std::path::{Path, PathBuf};

use bosun_api::node_task::{NodeTask, StepPhase, StepStatus};
use bosun_cluster::status::{StepEnd, StepReport, StepWrite, TaskStatusWrite, step_manager};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::{Agent, Error, facts};

/// The longest boot identity accepted (the status schema's bound).
pub const MAX_BOOT_ID: usize = 128;

/// Where the agent reads the node's boot identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum BootSource {
    /// `/proc`: the kernel's `boot_id` and the start time of PID 1 (the agent runs in the
    /// host's PID namespace). What every real node uses.
    #[default]
    Proc,
    /// A file the lab's tests write, outside every node's host root (`--boot-identity-file`,
    /// refused when the host root is `/`): the lab's simulated nodes share one kernel and
    /// one init, so a reboot there is a new line in this file and a restart of the agent.
    LabFile(PathBuf),
}

impl BootSource {
    /// The node's boot identity now; `None` when it cannot be read or is not plausible
    /// (empty, over [`MAX_BOOT_ID`] bytes, or with characters other than printable ASCII).
    pub fn read(&self) -> Option<String> {
        let id = match self {
            BootSource::Proc => bosun_host::reboot::boot_identity()?,
            BootSource::LabFile(path) => read_lab_file(path)?,
        };
        plausible(&id).then_some(id)
    }
}

fn read_lab_file(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(text.lines().last().unwrap_or("").trim().to_owned())
}

fn plausible(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_BOOT_ID && id.bytes().all(|b| b.is_ascii_graphic())
}

/// What a Running `awaitNewBoot` step's entry and the node's boot identity now say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// The node booted again since the attempt started: the step succeeded.
    Booted { from: String, to: String },
    /// The reboot was asked for in this boot and has not happened yet.
    Waiting,
    /// Neither: the plugin's call did not end with a reboot asked for (an agent restart
    /// during it), or no identity was recorded or can be read now. The ordinary restart
    /// rule decides.
    Interrupted,
}

/// Decides on a Running `awaitNewBoot` step. Pure: the step's entry and the identity now.
pub fn check(entry: &StepStatus, now: Option<&str>) -> Check {
    match (entry.boot_id.as_deref(), now) {
        (Some(from), Some(to)) if from != to => Check::Booted {
            from: from.to_owned(),
            to: to.to_owned(),
        },
        (Some(_), Some(_)) if entry.reboot_requested_at.is_some() => Check::Waiting,
        _ => Check::Interrupted,
    }
}

/// The entry of an attempt whose plugin asked for the reboot: still Running, with the
/// recorded boot identity, when the reboot was asked for, the plugin's message and report.
/// No `finishedAt`: the step ends with the new boot.
pub fn waiting_entry(
    name: &str,
    attempts: u32,
    started: Timestamp,
    boot_id: &str,
    requested: Timestamp,
    message: String,
    report: StepReport,
) -> StepWrite {
    let mut entry = StepWrite::finished(
        name,
        attempts,
        started,
        requested,
        StepEnd {
            phase: StepPhase::Running,
            changed: true,
            message: format!(
                "{message}; the step finishes when the node is back with a new boot (boot {boot_id})"
            ),
            error: None,
        },
        Some(report),
    );
    entry.finished_at = None;
    entry.boot_id = Some(boot_id.to_owned());
    entry.reboot_requested_at = Some(bosun_cluster::time::precise(requested));
    entry
}

/// Finishes step `index` of `task`, Running in an earlier boot, as Succeeded: the node is
/// back with boot `to` (it was `from`). The plugin does not run again. The entry keeps what
/// the step's manager wrote before (its start, recorded identity, report, when the reboot
/// was asked for), and carries the node facts; `after` is read now when this is the task's
/// last agent step.
pub async fn finish_booted(
    task: &NodeTask,
    index: usize,
    agent: &Agent,
    from: &str,
    to: &str,
) -> Result<(), Error> {
    let step = &task.spec.steps[index];
    let previous = bosun_planner::state::step_status(
        &task.status.clone().unwrap_or_default().steps,
        &step.name,
    )
    .cloned()
    .unwrap_or_default();
    let now = Timestamp::now();
    let started = previous.started_at.as_ref().map_or(now, |t| t.0);
    let mut entry = StepWrite::finished(
        &step.name,
        previous.attempts,
        started,
        now,
        StepEnd {
            phase: StepPhase::Succeeded,
            changed: true,
            message: format!("the node is back with a new boot ({from} → {to})"),
            error: None,
        },
        Some(StepReport {
            outputs: previous.outputs.clone(),
            log_tail: previous.log_tail.clone(),
            preflight: previous.preflight.clone(),
            policy: previous.policy.clone(),
            host_milliseconds: previous.host_milliseconds.unwrap_or(0),
        }),
    );
    entry.boot_id = Some(from.to_owned());
    entry.reboot_requested_at = previous
        .reboot_requested_at
        .map(|t| bosun_cluster::time::precise(t.0));
    let manager = step_manager(&agent.manager, &step.name);
    let mut carried = facts::carried(agent, task, &manager);
    if facts::agent_steps(task).is_some_and(|(_, last)| last == index) {
        carried.insert("after".into(), facts::read_after(agent, task).await);
    }
    let body = TaskStatusWrite::step_finished(entry, None)
        .with_facts(Some(serde_json::Value::Object(carried)));
    tracing::info!(task = %task.name_any(), step = %step.name, from, to, "the node is back with a new boot; the step succeeded");
    bosun_cluster::status::apply(&agent.client, &task.name_any(), &manager, &body).await?;
    crate::result_landed(agent, task, &body);
    agent.report_now.wake(None);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn a_running_reboot_step_is_decided_by_the_boot_identity() {
        let requested = Some(Time("2026-12-05T16:00:00Z".parse().unwrap()));
        // (recorded, asked for, now, expected)
        let cases: &[(Option<&str>, bool, Option<&str>, Check)] = &[
            (
                Some("a/1"),
                true,
                Some("a/2"),
                Check::Booted {
                    from: "a/1".into(),
                    to: "a/2".into(),
                },
            ),
            // Killed by the reboot before the plugin returned: the usual real-node case.
            (
                Some("a/1"),
                false,
                Some("b/7"),
                Check::Booted {
                    from: "a/1".into(),
                    to: "b/7".into(),
                },
            ),
            (Some("a/1"), true, Some("a/1"), Check::Waiting),
            // An agent restart during the plugin's call, in the same boot.
            (Some("a/1"), false, Some("a/1"), Check::Interrupted),
            // Nothing to compare: never passes for a new boot.
            (None, true, Some("a/2"), Check::Interrupted),
            (Some("a/1"), true, None, Check::Interrupted),
            (None, false, None, Check::Interrupted),
        ];
        for (recorded, asked, now, expected) in cases {
            let entry = StepStatus {
                name: "reboot".into(),
                phase: StepPhase::Running,
                attempts: 1,
                boot_id: recorded.map(str::to_owned),
                reboot_requested_at: if *asked { requested.clone() } else { None },
                ..StepStatus::default()
            };
            assert_eq!(
                &check(&entry, *now),
                expected,
                "recorded {recorded:?}, asked {asked}, now {now:?}"
            );
        }
    }

    #[test]
    fn a_boot_identity_must_be_plausible() {
        for (id, ok) in [
            ("8d0c4e6a-1b2c-4d5e-8f90-0123456789ab/123", true),
            ("lab-boot-2", true),
            ("", false),
            ("has space", false),
            ("tab\there", false),
            ("é", false),
        ] {
            assert_eq!(plausible(id), ok, "{id:?}");
        }
        assert!(plausible(&"x".repeat(MAX_BOOT_ID)));
        assert!(!plausible(&"x".repeat(MAX_BOOT_ID + 1)));
    }

    #[test]
    fn the_lab_file_gives_its_last_line() {
        let dir = std::env::temp_dir().join(format!("bosun-boot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("boot");
        std::fs::write(&file, "lab-boot-1\nlab-boot-2\n").unwrap();
        assert_eq!(
            BootSource::LabFile(file.clone()).read().as_deref(),
            Some("lab-boot-2")
        );
        std::fs::write(&file, "").unwrap();
        assert_eq!(BootSource::LabFile(file.clone()).read(), None);
        assert_eq!(BootSource::LabFile(dir.join("missing")).read(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_waiting_entry_is_running_with_the_identity_and_no_end() {
        let started: Timestamp = "2026-12-05T16:00:00Z".parse().unwrap();
        let requested: Timestamp = "2026-12-05T16:00:02Z".parse().unwrap();
        let entry = waiting_entry(
            "reboot",
            1,
            started,
            "a/1",
            requested,
            "reboot of w1 asked for".into(),
            StepReport::default(),
        );
        let status = entry.to_status();
        assert_eq!(status.phase, StepPhase::Running);
        assert_eq!(status.finished_at, None);
        assert_eq!(status.boot_id.as_deref(), Some("a/1"));
        assert_eq!(
            status.reboot_requested_at.as_ref().map(|t| t.0),
            Some(requested)
        );
        assert_eq!(check(&status, Some("a/1")), Check::Waiting);
        assert!(
            status
                .message
                .unwrap()
                .starts_with("reboot of w1 asked for; the step finishes when the node is back")
        );
    }
}
