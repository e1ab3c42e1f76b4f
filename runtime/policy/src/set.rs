//! The compiled policy set and its per-worker evaluators.
//!
//! A [`PolicySet`] is built once per generation of the cluster's policies (any Policy
//! created, changed or deleted makes a new set). Each policy gets its own regorus engine,
//! so one policy can neither read another's data nor collide with its rules, and a deny is
//! always attributed to the policy that produced it. Workers call
//! [`PolicySet::evaluator`] once and keep the clone: cloned engines share the parsed
//! modules but not evaluation state, which is what lets throughput scale with workers
//! (one engine shared behind a lock does not).
//!
//! Fail closed: a policy that does not compile, or whose evaluation errors or runs past
//! the time limit, makes every decision it takes part in "not allowed", whatever its
//! enforcement, with a message that names the policy and says it is broken.

use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use regorus::utils::limits::ExecutionTimerConfig;
use regorus::{Engine, Value};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::CompileError;

/// What a policy's deny does. Mirrors `Enforcement` of the `Policy` resource.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Enforcement {
    /// The deny stops the operation or step.
    #[default]
    Deny,
    /// The deny is recorded as a warning (status and a Warning Event); work goes on.
    Warn,
    /// The deny is recorded in status only; work goes on.
    Audit,
}

impl Enforcement {
    fn as_str(self) -> &'static str {
        match self {
            Enforcement::Deny => "Deny",
            Enforcement::Warn => "Warn",
            Enforcement::Audit => "Audit",
        }
    }
}

/// One policy as the cluster (or a test directory) holds it: the shape of the `Policy`
/// resource's spec plus its name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicySource {
    /// Unique within a set; messages and findings name the policy by it.
    pub name: String,
    /// One Rego v1 module. Its package decides where it is evaluated: `bosun.operation`,
    /// `bosun.step` or `bosun.capabilities`, or a package below one of them.
    pub rego: String,
    /// The policy's data, a JSON object merged at the root of `data`. It must not have a
    /// top-level `bosun` key, which is where policy packages live.
    #[serde(default)]
    pub data: Option<serde_json::Value>,
    #[serde(default)]
    pub enforcement: Enforcement,
}

/// The three places Bosun asks policies for a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DecisionPoint {
    /// Controller, before planning and before each group. Input: [`crate::OperationInput`].
    Operation,
    /// Agent, right before a plugin step runs. Input: [`crate::StepInput`].
    Step,
    /// Agent, before a plugin is instantiated, after requested ⊆ granted holds.
    /// Input: [`crate::CapabilitiesInput`].
    Capabilities,
}

impl DecisionPoint {
    pub const ALL: [DecisionPoint; 3] = [
        DecisionPoint::Operation,
        DecisionPoint::Step,
        DecisionPoint::Capabilities,
    ];

    /// The package prefix, for example `bosun.step`.
    pub fn package(self) -> &'static str {
        match self {
            DecisionPoint::Operation => "bosun.operation",
            DecisionPoint::Step => "bosun.step",
            DecisionPoint::Capabilities => "bosun.capabilities",
        }
    }

    /// The point a package is evaluated at: the package itself or any package below it.
    pub fn for_package(package: &str) -> Option<DecisionPoint> {
        let package = package.strip_prefix("data.").unwrap_or(package);
        DecisionPoint::ALL.into_iter().find(|p| {
            package == p.package()
                || package
                    .strip_prefix(p.package())
                    .is_some_and(|rest| rest.starts_with('.'))
        })
    }
}

impl std::fmt::Display for DecisionPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DecisionPoint::Operation => "operation",
            DecisionPoint::Step => "step",
            DecisionPoint::Capabilities => "capabilities",
        })
    }
}

impl std::str::FromStr for DecisionPoint {
    type Err = crate::PolicyError;

    /// Accepts `step` as well as the query `data.bosun.step.deny`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let t = t.strip_suffix(".deny").unwrap_or(t);
        let t = t.strip_prefix("data.").unwrap_or(t);
        let t = t.strip_prefix("bosun.").unwrap_or(t);
        match t {
            "operation" => Ok(DecisionPoint::Operation),
            "step" => Ok(DecisionPoint::Step),
            "capabilities" => Ok(DecisionPoint::Capabilities),
            _ => Err(crate::PolicyError::UnknownPoint {
                found: s.to_owned(),
            }),
        }
    }
}

/// Bounds on evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock budget for one policy's evaluation of one decision. Past it the
    /// evaluation is stopped and the policy counts as broken for that decision.
    pub eval_timeout: Duration,
    /// Largest Rego source accepted per policy, in bytes (the API allows 256 KiB).
    pub max_source_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            eval_timeout: Duration::from_millis(250),
            max_source_bytes: 256 * 1024,
        }
    }
}

/// A policy's message in a decision.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Finding {
    /// The policy that produced it; `bosun` for the built-in requested ⊆ granted check.
    pub policy: String,
    pub message: String,
}

/// The outcome of one decision. Deny-enforcement denies block; Warn-enforcement denies
/// become warnings; Audit-enforcement denies are only recorded. Broken policies and
/// evaluation failures are denies, whatever the policy's enforcement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub point: DecisionPoint,
    /// True exactly when `denies` is empty.
    pub allowed: bool,
    pub denies: Vec<Finding>,
    pub warnings: Vec<Finding>,
    pub audits: Vec<Finding>,
    /// `sha256:<hex>` of the policy set that made the decision (see [`PolicySet::digest`]).
    pub policy_set_digest: String,
}

impl Decision {
    /// The deny messages as `policy: message` lines, for status and Events.
    pub fn deny_messages(&self) -> Vec<String> {
        self.denies
            .iter()
            .map(|f| format!("{}: {}", f.policy, f.message))
            .collect()
    }
}

/// Compile status of one policy, for the `Policy` resource's status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    pub name: String,
    pub enforcement: Enforcement,
    /// The Rego package, when the module parsed.
    pub package: Option<String>,
    /// The decision point the package puts it at, when it compiled.
    pub point: Option<DecisionPoint>,
    pub compiled: bool,
    pub errors: Vec<CompileError>,
}

#[derive(Clone, Debug)]
pub(crate) struct CompiledPolicy {
    pub(crate) name: String,
    pub(crate) enforcement: Enforcement,
    /// Without the `data.` prefix, for example `bosun.step.maintenance_window`.
    pub(crate) package: String,
    pub(crate) point: DecisionPoint,
    /// `data.<package>.deny`.
    pub(crate) deny_rule: String,
    /// Prepared (analysed) once at compile time; cloned per worker.
    pub(crate) engine: Engine,
}

#[derive(Clone, Debug)]
pub(crate) enum Entry {
    Compiled(Box<CompiledPolicy>),
    Broken {
        name: String,
        enforcement: Enforcement,
        package: Option<String>,
        errors: Vec<CompileError>,
    },
}

/// The cluster's policies, compiled. Cheap to clone (shared); build one per generation.
#[derive(Clone, Debug)]
pub struct PolicySet {
    entries: Arc<[Entry]>,
    digest: Arc<str>,
}

impl PolicySet {
    /// Compiles every policy. Never fails: a policy that does not compile is kept as
    /// broken, reported by [`PolicySet::statuses`], and makes every decision deny.
    pub fn compile(sources: &[PolicySource], limits: Limits) -> PolicySet {
        let mut seen = BTreeSet::new();
        let entries: Vec<Entry> = sources
            .iter()
            .map(|src| {
                if !seen.insert(src.name.as_str()) {
                    return Entry::Broken {
                        name: src.name.clone(),
                        enforcement: src.enforcement,
                        package: None,
                        errors: vec![CompileError::new(
                            &src.name,
                            "another policy in the set has the same name; names must be unique so decisions can say which policy spoke",
                        )],
                    };
                }
                compile_one(src, limits)
            })
            .collect();
        PolicySet {
            entries: entries.into(),
            digest: digest(sources).into(),
        }
    }

    /// `sha256:<hex>` over every policy's name, enforcement, source and data, in name
    /// order and in canonical JSON. Two sets with the same digest decide identically for
    /// the same input and time; every [`Decision`] carries it.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// True when every policy compiled.
    pub fn is_healthy(&self) -> bool {
        self.entries.iter().all(|e| matches!(e, Entry::Compiled(_)))
    }

    /// One status per policy, in the order given to [`PolicySet::compile`].
    pub fn statuses(&self) -> Vec<PolicyStatus> {
        self.entries
            .iter()
            .map(|e| match e {
                Entry::Compiled(c) => PolicyStatus {
                    name: c.name.clone(),
                    enforcement: c.enforcement,
                    package: Some(c.package.clone()),
                    point: Some(c.point),
                    compiled: true,
                    errors: vec![],
                },
                Entry::Broken {
                    name,
                    enforcement,
                    package,
                    errors,
                } => PolicyStatus {
                    name: name.clone(),
                    enforcement: *enforcement,
                    package: package.clone(),
                    point: None,
                    compiled: false,
                    errors: errors.clone(),
                },
            })
            .collect()
    }

    /// An evaluator with its own copy of every engine, for one worker thread.
    pub fn evaluator(&self) -> Evaluator {
        Evaluator {
            entries: self.entries.iter().cloned().collect(),
            digest: self.digest.clone(),
        }
    }
}

/// Evaluates decisions for one worker. Not shared: create one per thread with
/// [`PolicySet::evaluator`].
#[derive(Debug)]
pub struct Evaluator {
    pub(crate) entries: Vec<Entry>,
    digest: Arc<str>,
}

impl Evaluator {
    /// Asks every policy of `point` about `input` (any JSON document; the typed inputs of
    /// [`crate::input`] serialize to the documented shape).
    pub fn evaluate(&mut self, point: DecisionPoint, input: &serde_json::Value) -> Decision {
        self.evaluate_value(point, Value::from(input.clone()))
    }

    /// Like [`Evaluator::evaluate`] for any serializable input.
    pub fn evaluate_input<T: Serialize>(&mut self, point: DecisionPoint, input: &T) -> Decision {
        match serde_json::to_value(input) {
            Ok(v) => self.evaluate_value(point, Value::from(v)),
            Err(e) => self.fail_all(
                point,
                &format!("the input document could not be encoded as JSON: {e}"),
            ),
        }
    }

    pub(crate) fn evaluate_value(&mut self, point: DecisionPoint, input: Value) -> Decision {
        let mut decision = Decision {
            point,
            allowed: true,
            denies: vec![],
            warnings: vec![],
            audits: vec![],
            policy_set_digest: self.digest.to_string(),
        };
        for entry in &mut self.entries {
            match entry {
                Entry::Broken { name, errors, .. } => decision.denies.push(Finding {
                    policy: name.clone(),
                    message: broken_message(errors),
                }),
                Entry::Compiled(c) if c.point == point => match eval_deny(c, input.clone()) {
                    Ok(messages) => {
                        let bucket = match c.enforcement {
                            Enforcement::Deny => &mut decision.denies,
                            Enforcement::Warn => &mut decision.warnings,
                            Enforcement::Audit => &mut decision.audits,
                        };
                        bucket.extend(messages.into_iter().map(|message| Finding {
                            policy: c.name.clone(),
                            message,
                        }));
                    }
                    Err(e) => decision.denies.push(Finding {
                        policy: c.name.clone(),
                        message: format!(
                            "policy is broken: evaluating {} failed, so the decision fails closed: {e}. Fix the policy (test it with `kubectl bosun policy eval`) or delete it",
                            c.deny_rule
                        ),
                    }),
                },
                Entry::Compiled(_) => {}
            }
        }
        decision.allowed = decision.denies.is_empty();
        decision
    }

    /// Adds `findings` as denies of a decision made by this evaluator's set.
    pub(crate) fn with_denies(&self, point: DecisionPoint, findings: Vec<Finding>) -> Decision {
        Decision {
            point,
            allowed: findings.is_empty(),
            denies: findings,
            warnings: vec![],
            audits: vec![],
            policy_set_digest: self.digest.to_string(),
        }
    }

    fn fail_all(&self, point: DecisionPoint, why: &str) -> Decision {
        self.with_denies(
            point,
            vec![Finding {
                policy: "bosun".into(),
                message: why.into(),
            }],
        )
    }
}

pub(crate) fn broken_message(errors: &[CompileError]) -> String {
    let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
    format!(
        "policy is broken: it does not compile ({}), and a broken policy blocks every decision until it is fixed or deleted",
        list.join("; ")
    )
}

/// Evaluates `data.<package>.deny` and returns its messages, sorted.
pub(crate) fn eval_deny(c: &mut CompiledPolicy, input: Value) -> Result<Vec<String>, String> {
    c.engine.set_input(input);
    let value = c
        .engine
        .eval_rule(c.deny_rule.clone())
        .map_err(|e| describe_eval_error(&e))?;
    deny_messages(&value).map_err(|found| {
        format!("expected deny to be a set of strings (or objects with a `msg`), found {found}")
    })
}

pub(crate) fn describe_eval_error(e: &anyhow::Error) -> String {
    if e.downcast_ref::<regorus::LimitError>().is_some() {
        format!("it ran past the evaluation time limit ({e})")
    } else {
        let text = format!("{e:#}");
        let message = text
            .lines()
            .rev()
            .find_map(|l| l.trim().strip_prefix("error: "))
            .map_or_else(|| text.trim().replace('\n', " "), str::to_owned);
        match text.lines().find_map(|l| l.trim().strip_prefix("--> ")) {
            Some(at) => format!("{message} (at {at})"),
            None => message,
        }
    }
}

fn deny_messages(value: &Value) -> Result<Vec<String>, String> {
    let items: Vec<&Value> = match value {
        Value::Undefined => return Ok(vec![]),
        Value::Set(s) => s.iter().collect(),
        Value::Array(a) => a.iter().collect(),
        other => return Err(value_kind(other).into()),
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Value::String(s) => out.push(s.to_string()),
            Value::Object(o) => {
                let msg = o
                    .get(&Value::from("msg"))
                    .or_else(|| o.get(&Value::from("message")));
                match msg {
                    Some(Value::String(s)) => out.push(s.to_string()),
                    _ => out.push(
                        item.to_json_str()
                            .unwrap_or_else(|_| "<unprintable>".into()),
                    ),
                }
            }
            other => out.push(
                other
                    .to_json_str()
                    .unwrap_or_else(|_| "<unprintable>".into()),
            ),
        }
    }
    out.sort();
    Ok(out)
}

fn value_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Set(_) => "a set",
        Value::Object(_) => "an object",
        Value::Undefined => "undefined",
    }
}

pub(crate) fn new_engine(limits: Limits) -> Engine {
    let mut engine = Engine::new();
    engine.set_execution_timer_config(ExecutionTimerConfig {
        limit: limits.eval_timeout,
        // Check the clock every 64 work units: frequent enough that a runaway loop stops
        // within a small fraction of the budget, rare enough to cost nothing measurable.
        check_interval: NonZeroU32::new(64).expect("non-zero"),
    });
    // Builtin errors (bad time zone, unparsable time ...) must fail the evaluation, not
    // quietly make a deny rule undefined: that would let the step through.
    engine.set_strict_builtin_errors(true);
    engine
}

fn compile_one(src: &PolicySource, limits: Limits) -> Entry {
    match try_compile(src, limits) {
        Ok(policy) => Entry::Compiled(Box::new(policy)),
        Err((package, error)) => Entry::Broken {
            name: src.name.clone(),
            enforcement: src.enforcement,
            package,
            errors: vec![error],
        },
    }
}

/// Why a policy does not compile: its package, when that much was read, and the error.
type Refusal = (Option<String>, CompileError);

fn try_compile(src: &PolicySource, limits: Limits) -> Result<CompiledPolicy, Refusal> {
    if src.rego.len() > limits.max_source_bytes {
        return Err((
            None,
            CompileError::new(
                &src.name,
                format!(
                    "the Rego source is {} bytes; the limit is {} bytes: split the policy",
                    src.rego.len(),
                    limits.max_source_bytes
                ),
            ),
        ));
    }
    let mut engine = new_engine(limits);
    let file = format!("{}.rego", src.name);
    let (package, point) = declared_package(&mut engine, &file, src)?;
    let in_package = |e: CompileError| (Some(package.clone()), e);
    add_data(&mut engine, src).map_err(in_package)?;
    let deny_rule = format!("data.{package}.deny");
    resolve(&mut engine, &deny_rule, src).map_err(in_package)?;
    Ok(CompiledPolicy {
        name: src.name.clone(),
        enforcement: src.enforcement,
        deny_rule,
        package,
        point,
        engine,
    })
}

/// Adds the source, and reads its package: one Bosun evaluates, with a `deny` rule.
fn declared_package(
    engine: &mut Engine,
    file: &str,
    src: &PolicySource,
) -> Result<(String, DecisionPoint), Refusal> {
    let package = match engine.add_policy(file.to_owned(), src.rego.clone()) {
        Ok(p) => p.strip_prefix("data.").unwrap_or(&p).to_owned(),
        Err(e) => return Err((None, CompileError::from_engine(&src.name, &e))),
    };
    let Some(point) = DecisionPoint::for_package(&package) else {
        return Err((
            Some(package.clone()),
            CompileError {
                line: Some(1),
                ..CompileError::new(
                    &src.name,
                    format!(
                        "package {package} is not evaluated anywhere: use bosun.operation, bosun.step or bosun.capabilities, or a package below one of them (for example bosun.step.my_rule)"
                    ),
                )
            },
        ));
    };
    match engine.has_declared_rule_rooted_at(file, "deny") {
        Ok(true) => Ok((package, point)),
        Ok(false) => Err((
            Some(package.clone()),
            CompileError::new(
                &src.name,
                format!(
                    "package {package} declares no `deny` rule; Bosun evaluates data.{package}.deny (for example `deny contains msg if {{ ... }}`)"
                ),
            ),
        )),
        Err(e) => Err((Some(package), CompileError::from_engine(&src.name, &e))),
    }
}

/// The policy's `data`: a JSON object without the `bosun` key (reserved for packages).
fn add_data(engine: &mut Engine, src: &PolicySource) -> Result<(), CompileError> {
    match &src.data {
        None => Ok(()),
        Some(serde_json::Value::Object(o)) if o.contains_key("bosun") => Err(CompileError::new(
            &src.name,
            "data has a top-level `bosun` key, which is reserved for policy packages: move the values under another key",
        )),
        Some(data @ serde_json::Value::Object(_)) => engine
            .add_data(Value::from(data.clone()))
            .map_err(|e| CompileError::new(&src.name, format!("data: {e}"))),
        Some(other) => Err(CompileError::new(
            &src.name,
            format!("data must be a JSON object, found {}", json_kind(other)),
        )),
    }
}

/// Resolves what regorus resolves late, so that a policy that would fail there is reported
/// as not compiling.
fn resolve(engine: &mut Engine, deny_rule: &str, src: &PolicySource) -> Result<(), CompileError> {
    // regorus resolves rules, imports and functions on the first evaluation; do it here
    // so a policy that would fail there is reported as not compiling, and so every
    // worker's clone starts prepared.
    if let Err(e) = engine.eval_query("true".into(), false) {
        return Err(CompileError::from_engine(&src.name, &e));
    }
    // regorus resolves function names only when a call is reached. One evaluation with an
    // empty input reaches most calls; an unknown function found there is a compile error.
    // Other errors of that run are ignored: a real input may well avoid them, and any that
    // happen on a real input fail that decision closed anyway.
    engine.set_input(Value::new_object());
    if let Err(e) = engine.eval_rule(deny_rule.to_owned())
        && format!("{e:#}").contains("could not find function")
    {
        return Err(CompileError::from_engine(&src.name, &e));
    }
    Ok(())
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Canonical JSON: object keys sorted, no whitespace. Independent of serde_json's
/// `preserve_order` feature, which another crate in the build may switch on.
pub(crate) fn canonical_json(v: &serde_json::Value, out: &mut String) {
    match v {
        serde_json::Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(k.clone()).to_string());
                out.push(':');
                canonical_json(&o[k], out);
            }
            out.push('}');
        }
        serde_json::Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// `sha256:<hex>` of one policy (its name, enforcement, source and data), as the
/// `Policy` resource's status shows it. Equal to the digest of a set holding only it.
pub fn source_digest(source: &PolicySource) -> String {
    digest(std::slice::from_ref(source))
}

/// The digest [`PolicySet::compile`] would give `sources`, without compiling them: how a
/// caller tells cheaply whether the policies it holds are the set it compiled last.
pub fn set_digest(sources: &[PolicySource]) -> String {
    digest(sources)
}

fn digest(sources: &[PolicySource]) -> String {
    let mut sorted: Vec<&PolicySource> = sources.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut h = Sha256::new();
    // Every field is length-prefixed so no two different sets hash the same bytes.
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    for s in sorted {
        let mut data = String::new();
        match &s.data {
            Some(d) => canonical_json(d, &mut data),
            None => data.push_str("null"),
        }
        field(s.name.as_bytes());
        field(s.enforcement.as_str().as_bytes());
        field(s.rego.as_bytes());
        field(data.as_bytes());
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}
