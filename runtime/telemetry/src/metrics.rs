//! Bosun's Prometheus metrics. Every label value comes from a closed enum, so each family has
//! a fixed, small set of series:
//!
//! | family | type | labels |
//! |---|---|---|
//! | `bosun_operations` | gauge | `phase` (the 7 Operation phases) |
//! | `bosun_steps_total` | counter | `side` (agent, controller), `outcome` (succeeded or a block reason) |
//! | `bosun_step_duration_seconds` | histogram | `side`, `outcome` |
//! | `bosun_gate_duration_seconds` | histogram | `gate` (preflight, policy, health) |
//! | `bosun_plugin_cache_total` | counter | `result` (hit, miss) |
//! | `bosun_watch_lists_total` | counter | `resource` (nodetasks, operations, nodes, policies, clusterlifecycles) |
//! | `bosun_watch_reopened_total` | counter | `resource` (watches opened again because they stalled) |
//! | `bosun_leader` | gauge | none (1 while this controller replica leads) |
//! | `bosun_leader_lost_total` | counter | none (leaderships lost, each stood down in-process) |
//!
//! One process-wide [`Metrics`] ([`metrics()`]) is shared by every reconcile: the hooks in
//! the controller and agent are one line each and need no handle threaded through their
//! contexts. Recording never fails and never blocks on I/O.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use bosun_api::node_task::BlockReason;
use bosun_api::operation::OperationPhase;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Every Operation phase, in the order they are exposed.
const PHASES: [OperationPhase; 7] = [
    OperationPhase::Pending,
    OperationPhase::Running,
    OperationPhase::Paused,
    OperationPhase::AwaitingApproval,
    OperationPhase::Blocked,
    OperationPhase::Succeeded,
    OperationPhase::Failed,
];

/// Step durations: a cordon takes milliseconds, a kubeadm upgrade minutes.
const STEP_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0, 300.0, 1800.0,
];
/// Gate durations: a preflight or a policy decision is expected in milliseconds; health
/// gates (settle time, readiness) in seconds to minutes.
const GATE_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5, 30.0, 300.0,
];

/// Which process ran a step.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Side {
    Agent,
    Controller,
}

/// How a step ended: succeeded, or the reason its task blocked.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum StepOutcome {
    Succeeded,
    Failed(BlockReason),
}

impl StepOutcome {
    /// `None` (nothing blocked) is success.
    pub fn from_block(block: Option<BlockReason>) -> StepOutcome {
        block.map_or(StepOutcome::Succeeded, StepOutcome::Failed)
    }
}

/// A check standing between a step (or a node) and the next.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Gate {
    /// The plugin's own preflight checks, right before a step runs.
    Preflight,
    /// A Rego policy decision (operation or step decision point).
    Policy,
    /// A health gate between nodes (node Ready, API server healthy, settle time).
    Health,
}

/// A resource one of Bosun's long-running watches keeps.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Watched {
    NodeTasks,
    Operations,
    Nodes,
    Policies,
    ClusterLifecycles,
}

/// Every [`Watched`], in the order they are exposed.
const WATCHED: [Watched; 5] = [
    Watched::NodeTasks,
    Watched::Operations,
    Watched::Nodes,
    Watched::Policies,
    Watched::ClusterLifecycles,
];

fn watched_str(w: Watched) -> &'static str {
    match w {
        Watched::NodeTasks => "nodetasks",
        Watched::Operations => "operations",
        Watched::Nodes => "nodes",
        Watched::Policies => "policies",
        Watched::ClusterLifecycles => "clusterlifecycles",
    }
}

/// Whether a plugin's verified bytes were already in the agent's local store.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum CacheResult {
    Hit,
    Miss,
}

fn side_str(s: Side) -> &'static str {
    match s {
        Side::Agent => "agent",
        Side::Controller => "controller",
    }
}

fn outcome_str(o: StepOutcome) -> &'static str {
    match o {
        StepOutcome::Succeeded => "succeeded",
        StepOutcome::Failed(reason) => match reason {
            BlockReason::StepFailed => "step_failed",
            BlockReason::StepTimedOut => "step_timed_out",
            BlockReason::PreflightFailed => "preflight_failed",
            BlockReason::PolicyDenied => "policy_denied",
            BlockReason::Interrupted => "interrupted",
            BlockReason::DrainTimedOut => "drain_timed_out",
            BlockReason::HealthGateFailed => "health_gate_failed",
            BlockReason::PluginUnavailable => "plugin_unavailable",
            BlockReason::NodeGone => "node_gone",
            BlockReason::CordonCleared => "cordon_cleared",
        },
    }
}

fn phase_str(p: OperationPhase) -> &'static str {
    match p {
        OperationPhase::Pending => "Pending",
        OperationPhase::Running => "Running",
        OperationPhase::Paused => "Paused",
        OperationPhase::AwaitingApproval => "AwaitingApproval",
        OperationPhase::Blocked => "Blocked",
        OperationPhase::Succeeded => "Succeeded",
        OperationPhase::Failed => "Failed",
    }
}

fn gate_str(g: Gate) -> &'static str {
    match g {
        Gate::Preflight => "preflight",
        Gate::Policy => "policy",
        Gate::Health => "health",
    }
}

/// A label value that can only be one of a fixed list of static strings.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Fixed(&'static str);

impl EncodeLabelValue for Fixed {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.0)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: Fixed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    side: Fixed,
    outcome: Fixed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GateLabels {
    gate: Fixed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    result: Fixed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabels {
    resource: Fixed,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The registry and every family in it.
pub struct Metrics {
    registry: Registry,
    operations: Family<PhaseLabels, Gauge>,
    steps: Family<StepLabels, Counter>,
    step_duration: HistogramFamily<StepLabels>,
    gate_duration: HistogramFamily<GateLabels>,
    plugin_cache: Family<CacheLabels, Counter>,
    watch_lists: Family<WatchLabels, Counter>,
    watch_reopened: Family<WatchLabels, Counter>,
    leader: Gauge,
    leader_lost: Counter,
    /// Operation name → the phase last recorded for it; `bosun_operations` is its tally.
    phases: Mutex<HashMap<String, OperationPhase>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh registry with every family registered. Series whose labels are known up
    /// front (each phase, each gate, cache hit and miss, each side's success) are created
    /// at zero, so a scrape shows the whole shape before anything happened.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let operations = Family::<PhaseLabels, Gauge>::default();
        registry.register("bosun_operations", "Operations this controller has seen since it started, by the phase it last decided for each", operations.clone());
        let steps = Family::<StepLabels, Counter>::default();
        registry.register(
            "bosun_steps",
            "Steps finished, by the side that ran them and how they ended",
            steps.clone(),
        );
        let step_duration: HistogramFamily<StepLabels> =
            Family::new_with_constructor(|| Histogram::new(STEP_BUCKETS));
        registry.register(
            "bosun_step_duration_seconds",
            "Wall time of a step from start to its recorded outcome",
            step_duration.clone(),
        );
        let gate_duration: HistogramFamily<GateLabels> =
            Family::new_with_constructor(|| Histogram::new(GATE_BUCKETS));
        registry.register(
            "bosun_gate_duration_seconds",
            "Time spent in a gate before a step or node may proceed",
            gate_duration.clone(),
        );
        let plugin_cache = Family::<CacheLabels, Counter>::default();
        registry.register("bosun_plugin_cache", "Plugin byte lookups in the agent's local store: hit (verified bytes on disk) or miss (fetched from the source)", plugin_cache.clone());
        let watch_lists = Family::<WatchLabels, Counter>::default();
        registry.register("bosun_watch_lists", "Full lists made by this process's watches, by resource: one when a watch starts, one more each time it has to list again (its resourceVersion expired: 410 Gone) or its list failed and was retried", watch_lists.clone());
        let watch_reopened = Family::<WatchLabels, Counter>::default();
        registry.register("bosun_watch_reopened", "Watches this process dropped and opened again, by resource, because they stayed silent while the API server held a newer version of an object the process was waiting on (an API server that keeps a watch open but no longer delivers its events)", watch_reopened.clone());

        let leader = Gauge::default();
        registry.register(
            "bosun_leader",
            "1 while this controller replica holds the leader Lease and acts, 0 while it stands by",
            leader.clone(),
        );
        let leader_lost = Counter::default();
        registry.register("bosun_leader_lost", "Times this controller replica lost the leader Lease (another holder, or no renewal within the deadline) and stood by again in the same process", leader_lost.clone());

        for p in PHASES {
            operations
                .get_or_create(&PhaseLabels {
                    phase: Fixed(phase_str(p)),
                })
                .set(0);
        }
        for side in [Side::Agent, Side::Controller] {
            let labels = StepLabels {
                side: Fixed(side_str(side)),
                outcome: Fixed(outcome_str(StepOutcome::Succeeded)),
            };
            drop(steps.get_or_create(&labels));
            drop(step_duration.get_or_create(&labels));
        }
        for g in [Gate::Preflight, Gate::Policy, Gate::Health] {
            drop(gate_duration.get_or_create(&GateLabels {
                gate: Fixed(gate_str(g)),
            }));
        }
        for r in ["hit", "miss"] {
            drop(plugin_cache.get_or_create(&CacheLabels { result: Fixed(r) }));
        }
        for w in WATCHED {
            let labels = WatchLabels {
                resource: Fixed(watched_str(w)),
            };
            drop(watch_lists.get_or_create(&labels));
            drop(watch_reopened.get_or_create(&labels));
        }
        Metrics {
            registry,
            operations,
            steps,
            step_duration,
            gate_duration,
            plugin_cache,
            watch_lists,
            watch_reopened,
            leader,
            leader_lost,
            phases: Mutex::new(HashMap::new()),
        }
    }

    /// Records the phase the controller wrote (or found) for Operation `name`. The gauge for
    /// each phase is the number of Operations whose last recorded phase it is.
    pub fn operation_phase(&self, name: &str, phase: OperationPhase) {
        let Ok(mut phases) = self.phases.lock() else {
            return;
        };
        phases.insert(name.to_string(), phase);
        for p in PHASES {
            let n = phases.values().filter(|&&q| q == p).count();
            self.operations
                .get_or_create(&PhaseLabels {
                    phase: Fixed(phase_str(p)),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Records a finished step: one count and its duration.
    pub fn step_finished(&self, side: Side, outcome: StepOutcome, duration: Duration) {
        let labels = StepLabels {
            side: Fixed(side_str(side)),
            outcome: Fixed(outcome_str(outcome)),
        };
        self.steps.get_or_create(&labels).inc();
        self.step_duration
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
    }

    /// Records the time one gate took.
    pub fn gate_finished(&self, gate: Gate, duration: Duration) {
        self.gate_duration
            .get_or_create(&GateLabels {
                gate: Fixed(gate_str(gate)),
            })
            .observe(duration.as_secs_f64());
    }

    /// Records a plugin store lookup.
    pub fn plugin_cache(&self, result: CacheResult) {
        let r = match result {
            CacheResult::Hit => "hit",
            CacheResult::Miss => "miss",
        };
        self.plugin_cache
            .get_or_create(&CacheLabels { result: Fixed(r) })
            .inc();
    }

    /// Records that a watch of `resource` started a full list.
    pub fn watch_listed(&self, resource: Watched) {
        self.watch_lists
            .get_or_create(&WatchLabels {
                resource: Fixed(watched_str(resource)),
            })
            .inc();
    }

    /// Records that a stalled watch of `resource` was opened again.
    pub fn watch_reopened(&self, resource: Watched) {
        self.watch_reopened
            .get_or_create(&WatchLabels {
                resource: Fixed(watched_str(resource)),
            })
            .inc();
    }

    /// Records whether this replica leads.
    pub fn leading(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Records that this replica lost the leader Lease and stood by again.
    pub fn leader_lost(&self) {
        self.leader_lost.inc();
    }

    /// The OpenMetrics text exposition of every family (what `/metrics` serves).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail; an encoder error would be a bug in a metric
        // type, and an empty scrape is the honest answer then.
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// The process-wide metrics, created on first use.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{text}"))
    }

    #[test]
    fn a_fresh_registry_shows_every_fixed_series_at_zero() {
        let text = Metrics::new().encode();
        for p in PHASES {
            assert_eq!(
                line(
                    &text,
                    &format!("bosun_operations{{phase=\"{}\"}}", phase_str(p))
                )
                .rsplit(' ')
                .next(),
                Some("0")
            );
        }
        assert!(
            text.contains("bosun_steps_total{side=\"agent\",outcome=\"succeeded\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("bosun_plugin_cache_total{result=\"hit\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("bosun_gate_duration_seconds_count{gate=\"preflight\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("bosun_watch_lists_total{resource=\"nodetasks\"} 0"),
            "{text}"
        );
        assert!(
            text.ends_with("# EOF\n"),
            "OpenMetrics text ends with # EOF: {text}"
        );
    }

    #[test]
    fn watch_lists_are_counted_by_resource() {
        let m = Metrics::new();
        m.watch_listed(Watched::NodeTasks);
        m.watch_listed(Watched::NodeTasks);
        m.watch_listed(Watched::Policies);
        let text = m.encode();
        assert!(
            text.contains("bosun_watch_lists_total{resource=\"nodetasks\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("bosun_watch_lists_total{resource=\"nodes\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("bosun_watch_lists_total{resource=\"policies\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn operations_are_tallied_by_their_last_phase() {
        let m = Metrics::new();
        m.operation_phase("a", OperationPhase::Running);
        m.operation_phase("b", OperationPhase::Running);
        m.operation_phase("a", OperationPhase::Blocked);
        let text = m.encode();
        assert!(
            text.contains("bosun_operations{phase=\"Running\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("bosun_operations{phase=\"Blocked\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("bosun_operations{phase=\"Pending\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn steps_are_counted_and_timed_by_side_and_outcome() {
        let m = Metrics::new();
        m.step_finished(
            Side::Agent,
            StepOutcome::from_block(None),
            Duration::from_millis(30),
        );
        m.step_finished(
            Side::Agent,
            StepOutcome::from_block(Some(BlockReason::PreflightFailed)),
            Duration::from_millis(7),
        );
        m.step_finished(
            Side::Controller,
            StepOutcome::Succeeded,
            Duration::from_millis(3),
        );
        let text = m.encode();
        assert!(
            text.contains("bosun_steps_total{side=\"agent\",outcome=\"succeeded\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("bosun_steps_total{side=\"agent\",outcome=\"preflight_failed\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("bosun_steps_total{side=\"controller\",outcome=\"succeeded\"} 1"),
            "{text}"
        );
        // 30 ms falls in the 0.05 bucket, not the 0.025 one.
        assert!(text.contains("bosun_step_duration_seconds_bucket{le=\"0.025\",side=\"agent\",outcome=\"succeeded\"} 0"), "{text}");
        assert!(text.contains("bosun_step_duration_seconds_bucket{le=\"0.05\",side=\"agent\",outcome=\"succeeded\"} 1"), "{text}");
    }

    #[test]
    fn gates_and_cache_lookups_are_recorded() {
        let m = Metrics::new();
        m.gate_finished(Gate::Preflight, Duration::from_micros(800));
        m.plugin_cache(CacheResult::Miss);
        m.plugin_cache(CacheResult::Hit);
        m.plugin_cache(CacheResult::Hit);
        let text = m.encode();
        assert!(
            text.contains("bosun_gate_duration_seconds_count{gate=\"preflight\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("bosun_gate_duration_seconds_bucket{le=\"0.001\",gate=\"preflight\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("bosun_plugin_cache_total{result=\"hit\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("bosun_plugin_cache_total{result=\"miss\"} 1"),
            "{text}"
        );
    }
}
