//! Many agents in one process, for benchmarks and tests at fleet scale (see
//! `tests/bench` and docs/benchmarks.md).
//!
//! Each agent of a fleet is the production [`Agent`] driven by the production [`run`]:
//! its own node name, its own NodeTask watch (and Policy watch), its own host root and
//! its own record of step runs, so the API server sees what N agent processes would make
//! it see. What they share is what does not depend on the node: the kube client (its
//! connection pool), one wasmtime engine with its compiled and verified plugins (through
//! [`Host::sibling`]), the local plugin store and the fetcher. A fleet is a harness
//! around the agent, not a second implementation of it.

use std::path::PathBuf;
use std::sync::Arc;

use bosun_host::{Host, RecordingBackend};

use crate::Agent;
use crate::plugins::Store;

/// One node of a fleet: its name and its host root (a directory).
#[derive(Clone, Debug)]
pub struct FleetNode {
    pub name: String,
    pub host_root: PathBuf,
}

/// What every agent of a fleet shares.
pub struct FleetShared {
    pub client: kube::Client,
    /// The engine and compiled plugins every agent's host is a [sibling](Host::sibling)
    /// of; its own host root is not used by any agent.
    pub host: Arc<Host>,
    pub store: Store,
    pub fetcher: bosun_fetch::Fetcher,
    /// `--instance` of every agent.
    pub instance: Option<String>,
    /// Least free disk space for a step to start (the agents' `--min-free-disk-mib`).
    pub min_free_bytes: u64,
}

/// Running agents; dropping the fleet (or [`Fleet::stop`]) stops them.
#[derive(Debug)]
pub struct Fleet {
    agents: Vec<Arc<Agent>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Fleet {
    /// Starts one agent per node on the current tokio runtime. Every agent simulates its
    /// node's services (as `--service-backend=simulated` does: the lab's nodes have no
    /// systemd), each with its own record.
    pub fn start(shared: &FleetShared, nodes: &[FleetNode]) -> Result<Fleet, bosun_host::Error> {
        let mut agents = Vec::with_capacity(nodes.len());
        for node in nodes {
            let host = shared
                .host
                .sibling(&node.host_root, Arc::new(RecordingBackend::in_memory()))?;
            let mut agent = Agent::new(
                shared.client.clone(),
                node.name.clone(),
                Arc::new(host),
                shared.store.clone(),
                shared.fetcher.clone(),
                format!("bosun-agent-{}", node.name),
            );
            agent.instance = shared.instance.clone();
            agent.preflight.min_free_bytes = shared.min_free_bytes;
            agent.preflight.service_program = None;
            agents.push(Arc::new(agent));
        }
        let tasks = agents
            .iter()
            .map(|agent| tokio::spawn(crate::run(agent.clone())))
            .collect();
        Ok(Fleet { agents, tasks })
    }

    /// The number of agents.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// Whether the fleet has no agent.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// The agents (for inspection).
    pub fn agents(&self) -> &[Arc<Agent>] {
        &self.agents
    }

    /// Whether every agent is still running (an agent's watch loop ends only on a
    /// shutdown signal or a panic).
    pub fn all_running(&self) -> bool {
        self.tasks.iter().all(|t| !t.is_finished())
    }

    /// Stops every agent (a step in flight is abandoned, as when a process is killed).
    pub async fn stop(mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
