//! Explaining a decision: which policies spoke, and which of their rules fired.
//!
//! This backs `kubectl-bosun policy eval`. It compiles the given policies into a fresh
//! [`PolicySet`], makes the decision exactly as the controller or agent would, and then
//! evaluates every rule of each policy at that point so a person can see why.

use std::fmt;

use regorus::Value;
use regorus::unstable::{Expr, Rule, RuleHead};
use serde::Serialize;

use crate::set::{
    Decision, DecisionPoint, Entry, Limits, PolicySet, PolicySource, describe_eval_error,
};

/// A decision and the reasons behind it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub decision: Decision,
    /// One entry per policy, in the order given, including those of other decision points
    /// (marked `evaluated: false`) and broken ones.
    pub policies: Vec<PolicyTrace>,
}

/// One policy's part in a decision.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyTrace {
    pub name: String,
    pub package: Option<String>,
    pub enforcement: crate::Enforcement,
    /// False for a policy of another decision point, or a broken one.
    pub evaluated: bool,
    /// Compile errors (a broken policy) or the evaluation error.
    pub errors: Vec<String>,
    /// Every rule of the package (functions and `test_` rules left out), in source order.
    pub rules: Vec<RuleTrace>,
}

/// One rule's value for the input.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleTrace {
    pub name: String,
    /// 1-based line of its first definition.
    pub line: u32,
    /// The rule's value; `None` when it is undefined for this input.
    pub value: Option<serde_json::Value>,
    /// Defined and neither `false` nor empty.
    pub fired: bool,
}

/// Makes the decision of `point` for `input` with `policies` and explains it. `data`,
/// when given, is merged over every policy's own data (its values win), as a test
/// fixture or a what-if would.
pub fn explain(
    policies: &[PolicySource],
    data: Option<&serde_json::Value>,
    input: &serde_json::Value,
    point: DecisionPoint,
) -> Explanation {
    explain_with_limits(policies, data, input, point, Limits::default())
}

pub(crate) fn explain_with_limits(
    policies: &[PolicySource],
    data: Option<&serde_json::Value>,
    input: &serde_json::Value,
    point: DecisionPoint,
    limits: Limits,
) -> Explanation {
    let sources: Vec<PolicySource> = policies
        .iter()
        .map(|p| {
            let mut p = p.clone();
            if let Some(overlay) = data {
                let mut merged = p.data.take().unwrap_or_else(|| serde_json::json!({}));
                crate::merge(&mut merged, overlay);
                p.data = Some(merged);
            }
            p
        })
        .collect();
    let set = PolicySet::compile(&sources, limits);
    let mut evaluator = set.evaluator();
    let decision = evaluator.evaluate(point, input);
    let input = Value::from(input.clone());
    let policies = evaluator
        .entries
        .iter_mut()
        .map(|entry| match entry {
            Entry::Broken {
                name,
                enforcement,
                package,
                errors,
            } => PolicyTrace {
                name: name.clone(),
                package: package.clone(),
                enforcement: *enforcement,
                evaluated: false,
                errors: errors.iter().map(ToString::to_string).collect(),
                rules: vec![],
            },
            Entry::Compiled(c) => {
                let mut trace = PolicyTrace {
                    name: c.name.clone(),
                    package: Some(c.package.clone()),
                    enforcement: c.enforcement,
                    evaluated: c.point == point,
                    errors: vec![],
                    rules: vec![],
                };
                if c.point != point {
                    return trace;
                }
                c.engine.set_input(input.clone());
                for (name, line) in rule_names(&mut c.engine) {
                    let path = format!("data.{}.{name}", c.package);
                    match c.engine.eval_rule(path) {
                        Ok(v) => trace.rules.push(RuleTrace {
                            fired: fired(&v),
                            value: (v != Value::Undefined).then(|| {
                                serde_json::to_value(&v).unwrap_or(serde_json::Value::Null)
                            }),
                            name,
                            line,
                        }),
                        Err(e) => trace
                            .errors
                            .push(format!("{name}: {}", describe_eval_error(&e))),
                    }
                }
                trace
            }
        })
        .collect();
    Explanation { decision, policies }
}

fn fired(v: &Value) -> bool {
    match v {
        Value::Undefined | Value::Bool(false) => false,
        Value::Set(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => true,
    }
}

/// Names and first lines of the rules in the engine's modules, without functions and
/// tests, each name once.
pub(crate) fn rule_names(engine: &mut regorus::Engine) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = Vec::new();
    for module in engine.get_modules().iter() {
        for rule in &module.policy {
            let (refr, line) = match rule.as_ref() {
                Rule::Spec { head, span, .. } => match head {
                    RuleHead::Compr { refr, .. } | RuleHead::Set { refr, .. } => (refr, span.line),
                    RuleHead::Func { .. } => continue,
                },
                Rule::Default {
                    refr, span, args, ..
                } if args.is_empty() => (refr, span.line),
                Rule::Default { .. } => continue,
            };
            let name = match refr.as_ref() {
                Expr::Var { span, .. } => span.text().to_owned(),
                // `local[tz] := ...` or `a.b := ...`: the rule's path is its first part;
                // evaluating that part shows the whole object it builds.
                other => {
                    let text = other.span().text();
                    text.split(['[', '.'])
                        .next()
                        .unwrap_or(text)
                        .trim()
                        .to_owned()
                }
            };
            if !out.iter().any(|(n, _)| *n == name) {
                out.push((name, line));
            }
        }
    }
    out
}

/// Test rule names (`test_*`) per package: (package, rule, line).
pub(crate) fn test_rules(engine: &mut regorus::Engine) -> Vec<(String, String, u32)> {
    let mut out = Vec::new();
    for module in engine.get_modules().iter() {
        let package = module.package.refr.span().text().to_owned();
        for rule in &module.policy {
            if let Rule::Spec {
                head: RuleHead::Compr { refr, .. },
                span,
                ..
            } = rule.as_ref()
            {
                let name = refr.span().text();
                if name.starts_with("test_")
                    && !out.iter().any(|(p, n, _)| p == &package && n == name)
                {
                    out.push((package.clone(), name.to_owned(), span.line));
                }
            }
        }
    }
    out
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.decision;
        writeln!(
            f,
            "decision at {}: {}  (policy set {})",
            d.point,
            if d.allowed { "ALLOWED" } else { "DENIED" },
            d.policy_set_digest
        )?;
        for (label, list) in [
            ("deny", &d.denies),
            ("warn", &d.warnings),
            ("audit", &d.audits),
        ] {
            for x in list {
                writeln!(f, "  {label:5} {}: {}", x.policy, x.message)?;
            }
        }
        for p in &self.policies {
            writeln!(
                f,
                "policy {} ({}, {:?}){}",
                p.name,
                p.package.as_deref().unwrap_or("no package"),
                p.enforcement,
                if p.evaluated {
                    ""
                } else {
                    " — not evaluated at this point"
                }
            )?;
            for e in &p.errors {
                writeln!(f, "  error: {e}")?;
            }
            for r in &p.rules {
                let value = r
                    .value
                    .as_ref()
                    .map_or_else(|| "undefined".to_owned(), ToString::to_string);
                writeln!(
                    f,
                    "  {} {}:{} = {value}",
                    if r.fired { "fired  " } else { "-      " },
                    r.name,
                    r.line
                )?;
            }
        }
        Ok(())
    }
}
