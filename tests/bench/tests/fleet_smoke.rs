//! The fleet bench, small, in the test suite so it cannot rot: 24 fleet nodes with their
//! agents in this process and the real controller, one Operation (cordon, no-op plugin
//! step, uncordon) at `maxUnavailable: 50%`, then the floor. Correctness only, never
//! timings: every task Succeeded, the agents' NodeTask watches were open, the writes were
//! counted (exactly 5 NodeTask writes and 2 Node patches per node, no Event about a task,
//! at most 3 writes of Bosun's resources per node-step), no write to a NodeTask, Operation
//! or Node changed nothing, and no step ran twice (the bench's ledger: attempts 1, one start
//! time per step, one task per node).

use anyhow::{Result, ensure};

const NODES: u32 = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_agents_runs_an_operation_with_every_write_changing_something() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let opts = bosun_bench::FleetOptions {
        nodes: NODES,
        prefix: "smoke-fleet-".into(),
        resync_seconds: 30,
        fixed_identity: false,
    };
    let mut env = bosun_bench::FleetEnv::start(lab, &opts).await?;
    // Fleet nodes are selected by any Operation without a node selector: always remove them.
    let run = bosun_bench::run_once(&mut env, "50%", true, None).await;
    let report = match &run {
        Ok(r) => bosun_bench::report(&env, r),
        Err(e) => format!("{e:#}"),
    };
    let watches = env.watches_open;
    env.finish().await?;
    let r = run?;
    eprintln!("{report}");

    ensure!(
        watches >= f64::from(NODES),
        "the API server saw {watches} agent NodeTask watches, not {NODES}"
    );
    ensure!(r.all_succeeded, "not every task Succeeded:\n{report}");
    ensure!(
        r.once.passed() && r.once.tasks_seen == NODES as usize,
        "a step ran twice or a task was created twice, or the watch missed tasks:\n{report}"
    );
    ensure!(
        r.parallel == NODES / 2,
        "planned parallelism {}:\n{report}",
        r.parallel
    );
    // Per node (docs/benchmarks.md, "Fleet scale"): the controller creates the task, then
    // writes its start with the cordon step, the agent its step's start with the node facts
    // `before` and its result with the facts `after`, the controller the uncordon step with
    // the health gates' condition and the task's Succeeded. (The facts read again once the
    // task finished are the same here, so they are not written again.)
    let task_writes = r.writes.get("nodetasks").copied().unwrap_or(0.0);
    ensure!(
        task_writes == f64::from(NODES) * 5.0,
        "{task_writes} NodeTask writes for {NODES} tasks, not 5 per task:\n{report}"
    );
    // Cordon and uncordon, once each.
    let node_writes = r.writes.get("nodes").copied().unwrap_or(0.0);
    ensure!(
        node_writes == f64::from(NODES) * 2.0,
        "{node_writes} Node writes for {NODES} nodes, not 2 per node:\n{report}"
    );
    // The Operation's Started and Succeeded; a task's routine start and end are no Events.
    let events = r.writes.get("events").copied().unwrap_or(0.0);
    ensure!(
        events == 2.0,
        "{events} Events written, not the Operation's 2:\n{report}"
    );
    let per_node_step = r.bosun_writes() / r.node_steps as f64;
    ensure!(
        r.node_steps == NODES as usize * 3 && per_node_step <= 3.0,
        "{per_node_step:.2} writes of Bosun's resources per node-step ({} node-steps), over 3:\n{report}",
        r.node_steps
    );
    ensure!(
        !r.relisted,
        "a bench watch relisted; changes not counted exactly:\n{report}"
    );
    for resource in ["nodetasks", "operations", "nodes"] {
        ensure!(
            r.no_op_writes(resource) == 0.0,
            "{} writes to {resource} changed nothing:\n{report}",
            r.no_op_writes(resource)
        );
    }
    // No watch listed twice (issue #16: no full relist after the first): each of the
    // controller's four watches listed once, and each agent's NodeTask and Policy watch.
    for resource in ["nodetasks", "operations", "nodes", "policies"] {
        let n = r.controller_watch_lists.get(resource).copied();
        ensure!(
            n == Some(1),
            "the controller's {resource} watch listed {n:?} times, not once:\n{report}"
        );
    }
    for resource in ["nodetasks", "policies"] {
        let n = r.agent_watch_lists.get(resource).copied();
        ensure!(
            n == Some(u64::from(NODES)),
            "the {NODES} agents' {resource} watches listed {n:?} times, not once each:\n{report}"
        );
    }
    let floor = r.floor.as_ref().expect("the floor ran");
    ensure!(
        floor.writes == f64::from(NODES) * 3.0,
        "the floor made {} writes, not 3 per node:\n{report}",
        floor.writes
    );
    // The design floor makes the run's own writes: 5 to each task, 2 to each Node.
    let design = r.design_floor.as_ref().expect("the design floor ran");
    ensure!(
        design.writes == f64::from(NODES) * 7.0,
        "the design floor made {} writes, not 7 per node:\n{report}",
        design.writes
    );
    Ok(())
}
