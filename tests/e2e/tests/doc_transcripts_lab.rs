//! The console transcripts of docs/first-operation.md, docs/troubleshooting.md,
//! docs/cli.md (its failing-step walk-through) and docs/lifecycle.md (every command it
//! shows: the ClusterLifecycle made by hand, an upgrade requested and withdrawn), run for real on a lab of their own: what a newcomer types after the page's build step, in one
//! terminal, from `lab up` to a retried Operation. A sample in these pages can no longer
//! go stale unnoticed. The format and the matching are in `runtime/cli/tests/transcript/`.
//!
//! The pages' blocks run in order in one `bash` session (the controller and agents that
//! first-operation.md starts in the background serve troubleshooting.md too, as for a
//! reader who reads on), with:
//! - `PATH`: the workspace's binaries (`lab`, `kubectl-bosun`, `bosun-controller`,
//!   `bosun-agent`, refused when older than their sources), then the system's; the pages
//!   add the lab's `kubectl` themselves;
//! - a lab of its own: state in `$CARGO_TARGET_DIR/doc-lab` (purged first, so nothing of
//!   an earlier run is listed), ports `BOSUN_LAB_PORT_BASE` + 100, so the shared lab of the
//!   other tests is not touched and theirs do not show up in `kubectl get operations`;
//!   stopped again at the end, whatever the outcome;
//! - a working directory holding `deploy` (a link to the checkout's) and `hello.wasm` (what
//!   the page's build step leaves there).
//!
//! Output is compared loosely (durations, ages and column widths do not count) after the
//! session's own values are replaced by the ones the pages show: the lab's state directory
//! by `~/.cache/bosun/lab-state` (the default), its port by 16443, this machine's kernel
//! release by the one in the pages.

#[path = "../../../runtime/cli/tests/transcript/mod.rs"]
mod transcript;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};
use bosun_e2e::{binary, build_plugin, target_dir, workspace_root};
use transcript::Session;

/// The kernel release the pages show in the hello plugin's greetings.
const DOC_KERNEL: &str = "6.8.0-49-generic";

/// Stops the doc lab when the test ends, passed or not.
struct LabDown {
    lab: PathBuf,
    env: Vec<(OsString, OsString)>,
}

impl Drop for LabDown {
    fn drop(&mut self) {
        let _ = Command::new(&self.lab)
            .arg("down")
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .status();
    }
}

fn lab_command(lab: &Path, env: &[(OsString, OsString)], args: &[&str]) -> Result<()> {
    let out = Command::new(lab)
        .args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .with_context(|| format!("running lab {args:?}"))?;
    ensure!(
        out.status.success(),
        "lab {args:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn the_pages_transcripts_are_true_on_a_lab() -> Result<()> {
    let root = workspace_root();
    let first = transcript::page_blocks(&root, "first-operation.md", true, 3);
    let trouble = transcript::page_blocks(&root, "troubleshooting.md", true, 3);
    let cli = transcript::page_blocks(&root, "cli.md", true, 1);
    let lifecycle = transcript::page_blocks(&root, "lifecycle.md", true, 4);
    // Every command docs/lifecycle.md shows is run here: none sits in a block of its own.
    let unmarked = transcript::unmarked_command_blocks(&root, "lifecycle.md");
    assert!(
        unmarked.is_empty(),
        "these blocks show commands no test runs; mark them `<!-- doc-test: lab -->` with the output the lab gives: {unmarked:?}"
    );

    let lab = binary("lab")?;
    for name in ["kubectl-bosun", "bosun-controller", "bosun-agent"] {
        binary(name)?;
    }
    let bin_dir = lab.parent().context("the lab binary has no directory")?;
    let hello = build_plugin("bosun-plugin-hello")?;

    let base: u16 = match std::env::var("BOSUN_LAB_PORT_BASE") {
        Ok(v) => v
            .parse()
            .with_context(|| format!("BOSUN_LAB_PORT_BASE={v:?} is not a port"))?,
        Err(_) => bosun_lab::DEFAULT_PORT_BASE,
    };
    let port_base = base + 100;
    let lab_dir = target_dir().join("doc-lab");

    // Kept after the test, for a look at what the session left (keys, logs of the
    // controller and agents); emptied at the start of the next run.
    let session_dir = target_dir().join("doc-session");
    if session_dir.exists() {
        std::fs::remove_dir_all(&session_dir)
            .with_context(|| format!("emptying {}", session_dir.display()))?;
    }
    let work = session_dir.join("work");
    let home = session_dir.join("home");
    std::fs::create_dir_all(&work)?;
    std::fs::create_dir_all(&home)?;
    std::os::unix::fs::symlink(root.join("deploy"), work.join("deploy"))?;
    std::fs::write(work.join("hello.wasm"), hello)?;

    let mut env: Vec<(OsString, OsString)> = vec![
        (
            "PATH".into(),
            format!(
                "{}:{}",
                bin_dir.display(),
                std::env::var("PATH").unwrap_or_default()
            )
            .into(),
        ),
        ("HOME".into(), home.clone().into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("BOSUN_LAB_DIR".into(), lab_dir.clone().into()),
        ("BOSUN_LAB_PORT_BASE".into(), port_base.to_string().into()),
    ];
    // The Kubernetes binaries, where the other tests' lab finds them (`$BOSUN_LAB_BIN`, or
    // the cache of `build-binaries.sh` under the real `$HOME`): under the session's `$HOME`,
    // `lab up` would build them again.
    let lab_bin = bosun_lab::binaries::BinDir::ensure(
        std::env::var_os("BOSUN_LAB_BIN").as_deref().map(Path::new),
    )?;
    env.push(("BOSUN_LAB_BIN".into(), lab_bin.dir().into()));

    // A lab of this test's own, from nothing: no Operation, Event or plugin of an earlier
    // run can show up in the pages' listings.
    lab_command(&lab, &env, &["down", "--purge"])?;
    let _down = LabDown {
        lab: lab.clone(),
        env: env.clone(),
    };

    let kernel = Command::new("uname").arg("-r").output()?;
    let kernel = String::from_utf8(kernel.stdout)?.trim().to_owned();
    let session = Session {
        cwd: work.clone(),
        env,
        replacements: vec![
            (
                lab_dir.display().to_string(),
                "~/.cache/bosun/lab-state".into(),
            ),
            (format!("127.0.0.1:{port_base}"), "127.0.0.1:16443".into()),
            (
                format!("(kernel {kernel})"),
                format!("(kernel {DOC_KERNEL})"),
            ),
            (format!("kernel: {kernel}"), format!("kernel: {DOC_KERNEL}")),
            (format!("{}/", work.display()), String::new()),
            (work.display().to_string(), ".".into()),
            (home.display().to_string(), "~".into()),
        ],
        loose: true,
        stop_background: true,
    };
    let blocks: Vec<&transcript::Block> = first
        .iter()
        .chain(&trouble)
        .chain(&cli)
        .chain(&lifecycle)
        .collect();
    let problems = transcript::run(&blocks, &session);
    transcript::assert_no_problems(
        &format!(
            "docs/first-operation.md, troubleshooting.md, cli.md and lifecycle.md on a lab (its logs: {}/logs; the session's files: {})",
            lab_dir.display(),
            work.display()
        ),
        &problems,
    );
    Ok(())
}
