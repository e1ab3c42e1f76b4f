//! `kubectl bosun policy ...`: testing policies and explaining decisions, without a cluster.
//!
//! - `policy test DIR` runs every Rego `test_` rule and every data-driven case under DIR
//!   through `bosun_policy::test_dir` (the same compile and decision path as the
//!   controller and agent); exit 0 only when at least one test ran and none failed.
//! - `policy eval --input FILE` makes the decision the controller or agent would make for
//!   an input document and explains it: the decision, then per policy which rules fired
//!   and with which value. Exit 0 when allowed, 2 when denied.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use bosun_policy::{
    Decision, DecisionPoint, Explanation, Finding, PolicyTrace, RuleTrace, TestReport, TestResult,
    explain, load_policies, test_dir,
};
use clap::{Args, Subcommand, ValueEnum};

use crate::Status;
use crate::terminal::{self, clean, errln, out};

/// The policy commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the Rego `test_` rules and the YAML cases (cases.yaml) under DIR. Exit 1 when any fails.
    Test(TestArgs),
    /// Decide for an input document and explain which policies and rules fired. Exit 2 when denied.
    Eval(EvalArgs),
}

#[derive(Debug, Args)]
pub struct TestArgs {
    /// A policy directory, or a tree of them (like `policies/`).
    pub dir: PathBuf,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Text)]
    pub output: Format,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The input document (JSON or YAML), shaped as the decision point's schema says
    /// (policies/schema/<point>.schema.json).
    #[arg(long)]
    pub input: PathBuf,
    /// Policies: a directory of policy directories, a .rego file, or a YAML file of Policy
    /// manifests. Repeatable.
    #[arg(long = "policy", default_value = DEFAULT_POLICIES)]
    pub policies: Vec<PathBuf>,
    /// The decision point. Default: the one whose input schema the document matches.
    #[arg(long, value_enum)]
    pub point: Option<Point>,
    /// Extra data (JSON) merged over every policy's own data, for a what-if.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Text)]
    pub output: Format,
}

/// Where `policy eval` takes policies from without --policy: `./policies`.
const DEFAULT_POLICIES: &str = "policies";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Point {
    Step,
    Operation,
    Capabilities,
}

impl From<Point> for DecisionPoint {
    fn from(p: Point) -> Self {
        match p {
            Point::Step => DecisionPoint::Step,
            Point::Operation => DecisionPoint::Operation,
            Point::Capabilities => DecisionPoint::Capabilities,
        }
    }
}

/// Runs a policy command.
pub fn execute(cmd: Command) -> Result<Status> {
    match cmd {
        Command::Test(a) => test(&a),
        Command::Eval(a) => eval(&a),
    }
}

fn test(args: &TestArgs) -> Result<Status> {
    let report = test_dir(&args.dir)
        .with_context(|| format!("testing the policies under {}", args.dir.display()))?;
    match args.output {
        // Case names and failures quote inputs and deny messages built from them.
        Format::Text => out!("{}", cleaned_report(report.clone())),
        Format::Json => out!("{}", terminal::json(&report)?),
    }
    if report.results.is_empty() {
        bail!(
            "no test found under {}: add *_test.rego files or a cases.yaml beside the policy",
            args.dir.display()
        );
    }
    if report.failed() > 0 {
        bail!(
            "{} of {} policy tests failed",
            report.failed(),
            report.results.len()
        );
    }
    Ok(Status::Success)
}

fn read_document(path: &PathBuf, what: &str) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the {what} {}", path.display()))?;
    match serde_json::from_str(&text) {
        Ok(v) => Ok(v),
        Err(json_err) => serde_yaml::from_str(&text).with_context(|| {
            format!(
                "the {what} {} is neither JSON ({json_err}) nor YAML",
                path.display()
            )
        }),
    }
}

/// The point whose schema `input` matches; an error listing why each point refused it
/// when none or several do.
fn infer_point(input: &serde_json::Value) -> Result<DecisionPoint> {
    let mut matches = Vec::new();
    let mut reasons = Vec::new();
    for p in DecisionPoint::ALL {
        match bosun_policy::input::validate(p, input) {
            Ok(()) => matches.push(p),
            Err(e) => reasons.push(format!("{p}: {e}")),
        }
    }
    match matches.as_slice() {
        [p] => Ok(*p),
        [] => bail!(
            "the input matches no decision point's schema ({}); fix it or name the point with --point",
            reasons.join("; ")
        ),
        _ => bail!("the input matches several decision points; name one with --point"),
    }
}

fn eval(args: &EvalArgs) -> Result<Status> {
    let input = read_document(&args.input, "input")?;
    let point = match args.point {
        Some(p) => {
            let p = DecisionPoint::from(p);
            if let Err(e) = bosun_policy::input::validate(p, &input) {
                errln!(
                    "warning: the input does not match the {p} input schema ({}); Bosun never sends such a document",
                    clean(&e.to_string())
                );
            }
            p
        }
        None => infer_point(&input)?,
    };
    let data = args
        .data
        .as_ref()
        .map(|d| read_document(d, "data"))
        .transpose()?;
    let mut policies = Vec::new();
    if args.policies == [PathBuf::from(DEFAULT_POLICIES)] && !Path::new(DEFAULT_POLICIES).exists() {
        bail!(
            "no ./{DEFAULT_POLICIES} directory here to take the policies from; pass --policy DIR|FILE (a policy directory tree such as policies/ of a Bosun checkout, a .rego file, or a YAML file of Policy manifests)"
        );
    }
    for p in &args.policies {
        policies.extend(
            load_policies(p).with_context(|| format!("loading policies from {}", p.display()))?,
        );
    }
    let explanation: Explanation = explain(&policies, data.as_ref(), &input, point);
    match args.output {
        // Policy messages are built (sprintf) from the input: a plugin's requests, a
        // node's facts, an Operation's names.
        Format::Text => out!("{}", cleaned_explanation(explanation.clone())),
        Format::Json => out!("{}", terminal::json(&explanation)?),
    }
    Ok(if explanation.decision.allowed {
        Status::Success
    } else {
        Status::Denied
    })
}

/// `report` with every text in it [`clean`]ed, for its text rendering. Every field is
/// named, so a field added to the report does not compile until it is handled here.
fn cleaned_report(report: TestReport) -> TestReport {
    let TestReport { results } = report;
    TestReport {
        results: results
            .into_iter()
            .map(|r| {
                let TestResult {
                    file,
                    name,
                    kind,
                    failure,
                } = r;
                TestResult {
                    file: terminal::path(&file).into(),
                    name: clean(&name).into_owned(),
                    kind,
                    failure: failure.map(|f| clean(&f).into_owned()),
                }
            })
            .collect(),
    }
}

/// `explanation` with every text in it [`clean`]ed, for its text rendering; rule values
/// are shown as JSON, whose encoder escapes control characters (the writer escapes what
/// it leaves). Every field is named, as in [`cleaned_report`].
fn cleaned_explanation(explanation: Explanation) -> Explanation {
    let Explanation { decision, policies } = explanation;
    let Decision {
        point,
        allowed,
        denies,
        warnings,
        audits,
        policy_set_digest,
    } = decision;
    let findings = |list: Vec<Finding>| -> Vec<Finding> {
        list.into_iter()
            .map(|Finding { policy, message }| Finding {
                policy: clean(&policy).into_owned(),
                message: clean(&message).into_owned(),
            })
            .collect()
    };
    Explanation {
        decision: Decision {
            point,
            allowed,
            denies: findings(denies),
            warnings: findings(warnings),
            audits: findings(audits),
            policy_set_digest: clean(&policy_set_digest).into_owned(),
        },
        policies: policies
            .into_iter()
            .map(|p| {
                let PolicyTrace {
                    name,
                    package,
                    enforcement,
                    evaluated,
                    errors,
                    rules,
                } = p;
                PolicyTrace {
                    name: clean(&name).into_owned(),
                    package: package.map(|p| clean(&p).into_owned()),
                    enforcement,
                    evaluated,
                    errors: errors.iter().map(|e| clean(e).into_owned()).collect(),
                    rules: rules
                        .into_iter()
                        .map(|r| {
                            let RuleTrace {
                                name,
                                line,
                                value,
                                fired,
                            } = r;
                            RuleTrace {
                                name: clean(&name).into_owned(),
                                line,
                                value,
                                fired,
                            }
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_point_is_inferred_from_the_input_shape() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        for (file, point) in [
            ("step", DecisionPoint::Step),
            ("operation", DecisionPoint::Operation),
            ("capabilities", DecisionPoint::Capabilities),
        ] {
            let input = read_document(
                &root.join(format!("policies/schema/examples/{file}.json")),
                "input",
            )
            .unwrap();
            assert_eq!(infer_point(&input).unwrap(), point);
        }
        let err = infer_point(&serde_json::json!({"hello": 1}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("matches no decision point"), "{err}");
    }
}
