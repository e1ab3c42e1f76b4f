//! The `kubelet` plugin through the real sandbox with the grants of
//! deploy/examples/plugins/kubelet.yaml. systemd itself is not available here: the host's
//! recording backend stands in for it (as in the lab), and a scripted backend plays a
//! kubelet that fails right after its restart.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bosun_api::grants::ServiceAction;
use bosun_host::{RecordingBackend, ServiceBackend, ServiceError, UnitStatus};
use bosun_plugins_tests::{Node, example_grants, plugins, write};
use serde_json::json;

fn root() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    write(
        &root,
        "etc/os-release",
        "ID=debian\nVERSION_ID=12\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
    );
    (dir, root)
}

#[test]
fn restart_goes_through_the_service_grant_and_waits_for_running() {
    let (_dir, root) = root();
    let node = Node::new(&root, &["worker"]);
    let kubelet = node.load(&plugins().kubelet, "kubelet");
    let grants = example_grants("kubelet.yaml");

    let dry = node.run(
        &kubelet,
        &grants,
        "restart",
        &json!({"settleSeconds": 1}),
        true,
    );
    assert_eq!(
        dry.outcome().message,
        "would restart kubelet.service (now inactive/dead) and wait up to 120s for it to run"
    );
    let log = std::fs::read_to_string(RecordingBackend::log_path(&root)).unwrap();
    assert!(
        !log.contains("restart"),
        "a dry run restarts nothing: {log}"
    );

    let ran = node.run(
        &kubelet,
        &grants,
        "restart",
        &json!({"settleSeconds": 1}),
        false,
    );
    let o = ran.outcome();
    assert!(o.changed);
    assert!(
        o.message
            .starts_with("restarted kubelet.service; running after"),
        "{}",
        o.message
    );
    assert_eq!(ran.output("subState").unwrap(), "running");
    let log = std::fs::read_to_string(RecordingBackend::log_path(&root)).unwrap();
    assert_eq!(
        log.lines()
            .filter(|l| *l == "restart kubelet.service")
            .count(),
        1,
        "{log}"
    );

    // Without the grant the host refuses the restart and names the unit.
    let refused = node.run(
        &kubelet,
        &bosun_api::grants::Grants::default(),
        "restart",
        &json!({}),
        false,
    );
    assert!(refused.run.is_none());
    assert!(
        refused.failed_checks()[0].1.contains("kubelet.service"),
        "{:?}",
        refused.checks
    );
}

/// A kubelet that starts and then fails: `activating` after the restart, `failed` after.
struct FailingKubelet {
    polls: Mutex<u32>,
}

impl ServiceBackend for FailingKubelet {
    fn control(
        &self,
        _root: &Path,
        _unit: &str,
        _action: ServiceAction,
        _time_left: Duration,
    ) -> Result<UnitStatus, ServiceError> {
        Ok(UnitStatus {
            active_state: "activating".into(),
            sub_state: "start".into(),
        })
    }

    fn status(
        &self,
        _root: &Path,
        _unit: &str,
        _time_left: Duration,
    ) -> Result<UnitStatus, ServiceError> {
        let mut polls = self.polls.lock().unwrap();
        *polls += 1;
        Ok(match *polls {
            // preflight and the run's first look: running before the restart
            1 | 2 => UnitStatus {
                active_state: "active".into(),
                sub_state: "running".into(),
            },
            _ => UnitStatus {
                active_state: "failed".into(),
                sub_state: "failed".into(),
            },
        })
    }

    fn manager(&self) -> &'static str {
        "simulated"
    }

    fn program(&self) -> Option<&'static str> {
        None
    }
}

#[test]
fn a_kubelet_that_fails_after_the_restart_fails_the_step() {
    let (_dir, root) = root();
    let node = Node::with_services(
        &root,
        &["worker"],
        Arc::new(FailingKubelet {
            polls: Mutex::new(0),
        }),
    );
    let kubelet = node.load(&plugins().kubelet, "kubelet");
    let ran = node.run(
        &kubelet,
        &example_grants("kubelet.yaml"),
        "restart",
        &json!({"settleSeconds": 1}),
        false,
    );
    let e = ran.error();
    assert_eq!(e.code, "kubelet-failed");
    assert!(e.message.contains("journalctl -u kubelet"), "{}", e.message);
}

/// The kubelet on an OpenRC node: the host's OpenRC backend runs the real `rc-service`
/// (Debian's OpenRC 0.45) in a node root OpenRC "booted" (`openrc_root`), and the service's
/// supervised daemon outlives the call that restarted it.
#[test]
fn restart_on_an_openrc_node_goes_through_rc_service() {
    use bosun_plugins_tests::{OpenRcNode, processes_in, rc_service};
    let dir = tempfile::tempdir().unwrap();
    let openrc = OpenRcNode::new(&dir.path().join("root"));
    let root = openrc.root.clone();
    assert_eq!(
        bosun_host::openrc::detect(&root),
        bosun_host::ServiceManager::OpenRc
    );
    let node = Node::with_services(
        &root,
        &["worker"],
        Arc::new(bosun_host::OpenRcBackend::default()),
    );
    let kubelet = node.load(&plugins().kubelet, "kubelet");
    let grants = example_grants("kubelet.yaml");
    let starts = || {
        std::fs::read_to_string(root.join("var/log/kubelet-starts"))
            .unwrap_or_default()
            .lines()
            .count()
    };

    // Stopped: preflight reads it, a dry run says so and starts nothing.
    let dry = node.run(&kubelet, &grants, "restart", &json!({}), true);
    assert_eq!(
        dry.outcome().message,
        "would restart kubelet.service (now inactive/dead) and wait up to 120s for it to run"
    );
    assert_eq!(starts(), 0);

    // A restart of the stopped service starts it, and one of the running service stops
    // and starts it again; each time the plugin sees it running.
    for expected in [1, 2] {
        let ran = node.run(
            &kubelet,
            &grants,
            "restart",
            &json!({"settleSeconds": 1}),
            false,
        );
        let o = ran.outcome();
        assert!(
            o.changed
                && o.message
                    .starts_with("restarted kubelet.service; running after"),
            "{}",
            o.message
        );
        assert_eq!(ran.output("activeState").unwrap(), "active");
        assert_eq!(starts(), expected);
    }
    // The daemon outlived the calls: OpenRC still reports it started, and its supervisor
    // holds a live process.
    let status = rc_service(&root, &["kubelet", "status"]);
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("status: started"),
        "{status:?}"
    );
    let status = node.run(&kubelet, &grants, "status", &json!({}), false);
    assert_eq!(
        status.outcome().message,
        "kubelet.service is active/running"
    );

    // A plugin that could write what OpenRC executes as root gets no service action.
    let mut wider = grants.clone();
    wider.filesystem.push(
        serde_json::from_value(json!({"path": "/etc/conf.d", "access": "ReadWrite"})).unwrap(),
    );
    let refused = node.run(
        &kubelet,
        &wider,
        "restart",
        &json!({"settleSeconds": 1}),
        false,
    );
    let report = refused
        .run
        .as_ref()
        .expect("preflight passes; the run is refused");
    let error = report.result.as_ref().expect_err("the restart is refused");
    assert!(
        error.message.contains("run by openrc")
            && error
                .message
                .contains("filesystem grant /etc/conf.d can write /etc/conf.d"),
        "{}",
        error.message
    );
    assert_eq!(starts(), 2, "the refused restart started nothing");

    // Unit types OpenRC has no equivalent of are refused with the reason.
    let e = bosun_host::OpenRcBackend::default()
        .status(&root, "reboot.target", Duration::from_secs(10))
        .unwrap_err();
    assert!(
        e.to_string().contains("OpenRC, which has services only"),
        "{e}"
    );

    // The supervisor and its daemon run in the root until the node is dropped, which stops
    // them.
    let running = processes_in(&root);
    assert_eq!(running.len(), 2, "{running:?}");
    drop(openrc);
    assert_eq!(processes_in(&root), Vec::<u32>::new());
}
