//! The policy test harness behind `kubectl-bosun policy test DIR`.
//!
//! One harness runs both kinds of test a policy directory can hold:
//! - Rego `test_` rules in any module of the directory (usually `*_test.rego`), each
//!   passing when it evaluates to `true`, like `opa test`;
//! - data-driven cases in `cases.yaml` (or `*.cases.yaml`): an input, optional data and
//!   the exact deny messages expected. Cases go through [`crate::PolicySet`], the same
//!   path the controller and agent take, and their inputs are validated against the
//!   decision point's input schema, so a case cannot test a document Bosun never sends.
//!
//! A directory is a policy when it has `.rego` files; its `data.json`, when present, is
//! the policy's data. Directories are walked recursively in name order.
//!
//! `test_one_dir` (about 110 lines) is kept whole on purpose: one directory's policy and
//! cases, compiled, evaluated and compared, in the order the report prints them.

use std::fmt;
use std::path::{Path, PathBuf};

use regorus::Value;
use serde::{Deserialize, Serialize};

use crate::error::{CompileError, PolicyError};
use crate::explain::test_rules;
use crate::set::{DecisionPoint, Enforcement, Limits, PolicySet, PolicySource, new_engine};

/// The outcome of every test found under a directory.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TestReport {
    pub results: Vec<TestResult>,
}

/// One Rego test rule or one data-driven case.
#[derive(Clone, Debug, Serialize)]
pub struct TestResult {
    /// The file the test is in.
    pub file: PathBuf,
    /// The rule name, or the case's name.
    pub name: String,
    pub kind: TestKind,
    /// `None` when it passed; otherwise why it failed.
    pub failure: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum TestKind {
    /// A Rego `test_` rule.
    Rego,
    /// A case from a cases YAML file.
    Case,
}

impl TestReport {
    pub fn passed(&self) -> usize {
        self.results.iter().filter(|r| r.failure.is_none()).count()
    }
    pub fn failed(&self) -> usize {
        self.results.len() - self.passed()
    }
    /// True when at least one test ran and none failed.
    pub fn is_success(&self) -> bool {
        !self.results.is_empty() && self.failed() == 0
    }
}

impl fmt::Display for TestReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.results {
            let kind = match r.kind {
                TestKind::Rego => "rego",
                TestKind::Case => "case",
            };
            match &r.failure {
                None => writeln!(f, "PASS {kind} {}: {}", r.file.display(), r.name)?,
                Some(why) => writeln!(
                    f,
                    "FAIL {kind} {}: {}\n     {why}",
                    r.file.display(),
                    r.name
                )?,
            }
        }
        writeln!(f, "{} passed, {} failed", self.passed(), self.failed())
    }
}

/// A cases file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CasesFile {
    /// Which decision point to ask; defaults to the one the policy's package names.
    #[serde(default)]
    point: Option<DecisionPoint>,
    /// Merged under every case's input (objects merge key by key, other values are
    /// replaced), so each case states only what it changes. Either a document, or the
    /// path of a JSON file relative to the cases file.
    #[serde(default)]
    base: Option<serde_json::Value>,
    /// The policies under test, when they are not the `.rego` files beside the cases
    /// file: a path relative to the cases file, to anything `load_policies` reads (a YAML
    /// file of Policy manifests, as shipped in deploy/examples, a `.rego` file or a
    /// directory). A case's `data` is merged over each policy's own data.
    #[serde(default)]
    policies: Option<PathBuf>,
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    #[serde(default)]
    input: serde_json::Value,
    /// Merged over the directory's data.json.
    #[serde(default)]
    data: Option<serde_json::Value>,
    /// Exactly the deny messages expected, in any order; empty means allowed.
    #[serde(default)]
    denies: Vec<String>,
    /// Expect the policy to fail closed on this input (an evaluation error): the decision
    /// denies and every message says the policy is broken. Excludes `denies`.
    #[serde(default)]
    fails_closed: bool,
}

/// Runs every Rego test rule and data-driven case under `dir`. Fails when `dir` holds no
/// test at all: a test run that checks nothing must not look green.
/// Evaluates with the agents' own [`Limits`], so a policy too slow for them fails here too.
pub fn test_dir(dir: &Path) -> Result<TestReport, PolicyError> {
    test_dir_with(dir, Limits::default())
}

/// [`test_dir`] with other evaluation limits (e.g. a longer time budget, to test a policy's
/// logic on a machine too loaded for the agents' 250 ms).
pub fn test_dir_with(dir: &Path, limits: Limits) -> Result<TestReport, PolicyError> {
    let mut dirs = Vec::new();
    collect_dirs(dir, &mut dirs)?;
    let mut report = TestReport::default();
    for d in dirs {
        test_one_dir(&d, limits, &mut report)?;
    }
    if report.results.is_empty() {
        return Err(PolicyError::Invalid {
            path: dir.display().to_string(),
            message: "no tests found: expected .rego files with `test_` rules or cases.yaml files in this directory or below".into(),
        });
    }
    Ok(report)
}

fn read(path: &Path) -> Result<String, PolicyError> {
    std::fs::read_to_string(path).map_err(|source| PolicyError::Io {
        path: path.display().to_string(),
        source,
    })
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), PolicyError> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| PolicyError::Io {
            path: dir.display().to_string(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    out.push(dir.to_owned());
    for e in entries {
        if e.is_dir() {
            collect_dirs(&e, out)?;
        }
    }
    Ok(())
}

fn files_with(dir: &Path, pred: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.file_name().and_then(|n| n.to_str()).is_some_and(&pred))
        .collect();
    v.sort();
    v
}

fn test_one_dir(dir: &Path, limits: Limits, report: &mut TestReport) -> Result<(), PolicyError> {
    let rego_files = files_with(dir, |n| n.ends_with(".rego"));
    let case_files = files_with(dir, |n| {
        matches!(n, "cases.yaml" | "cases.yml")
            || n.ends_with(".cases.yaml")
            || n.ends_with(".cases.yml")
    });
    let mut beside = Vec::new();
    for cases_path in case_files {
        let file = read_cases(&cases_path)?;
        match &file.policies {
            Some(rel) => {
                let path = cases_path.parent().unwrap_or(dir).join(rel);
                let sources = crate::load_policies(&path)?;
                let base = read_base(&cases_path, dir, file.base.clone())?;
                for case in &file.cases {
                    let policies: Vec<PolicySource> = sources
                        .iter()
                        .map(|p| {
                            let mut data = p.data.clone().unwrap_or_else(|| serde_json::json!({}));
                            if let Some(d) = &case.data {
                                crate::merge(&mut data, d);
                            }
                            PolicySource {
                                data: Some(data),
                                ..p.clone()
                            }
                        })
                        .collect();
                    report.results.push(TestResult {
                        file: cases_path.clone(),
                        name: case.name.clone(),
                        kind: TestKind::Case,
                        failure: run_case(&policies, file.point, base.as_ref(), case, limits),
                    });
                }
            }
            None => beside.push((cases_path, file)),
        }
    }
    if rego_files.is_empty() {
        if let Some((f, _)) = beside.first() {
            return Err(PolicyError::Invalid {
                path: f.display().to_string(),
                message: "a cases file needs the policy's .rego file beside it, or `policies:` naming the policies it tests".into(),
            });
        }
        return Ok(());
    }
    let data_path = dir.join("data.json");
    let data: Option<serde_json::Value> = if data_path.exists() {
        Some(
            serde_json::from_str(&read(&data_path)?).map_err(|e| PolicyError::Invalid {
                path: data_path.display().to_string(),
                message: format!("not JSON: {e}"),
            })?,
        )
    } else {
        None
    };
    let mut sources = Vec::new();
    for f in &rego_files {
        sources.push((f.clone(), read(f)?));
    }
    run_rego_tests(&sources, data.as_ref(), limits, report);

    let dir_name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("policy")
        .to_owned();
    let policy_modules: Vec<&(PathBuf, String)> = sources
        .iter()
        .filter(|(p, _)| !p.to_string_lossy().ends_with("_test.rego"))
        .collect();
    for (cases_path, file) in beside {
        let base = read_base(&cases_path, dir, file.base)?;
        for case in file.cases {
            let mut case_data = data.clone().unwrap_or_else(|| serde_json::json!({}));
            if let Some(d) = &case.data {
                crate::merge(&mut case_data, d);
            }
            let policies: Vec<PolicySource> = policy_modules
                .iter()
                .map(|(p, rego)| PolicySource {
                    name: if policy_modules.len() == 1 {
                        dir_name.clone()
                    } else {
                        p.file_stem()
                            .and_then(|s| s.to_str())
                            .unwrap_or("policy")
                            .to_owned()
                    },
                    rego: rego.clone(),
                    data: Some(case_data.clone()),
                    enforcement: Enforcement::Deny,
                })
                .collect();
            let failure = run_case(&policies, file.point, base.as_ref(), &case, limits);
            report.results.push(TestResult {
                file: cases_path.clone(),
                name: case.name,
                kind: TestKind::Case,
                failure,
            });
        }
    }
    Ok(())
}

fn read_cases(cases_path: &Path) -> Result<CasesFile, PolicyError> {
    serde_yaml::from_str(&read(cases_path)?).map_err(|e| PolicyError::Invalid {
        path: cases_path.display().to_string(),
        message: format!(
            "not a cases file (point?, base?, policies?, cases: [{{name, input, data?, denies}}]): {e}"
        ),
    })
}

/// The cases file's `base`: a document, or the path of a JSON file relative to it.
fn read_base(
    cases_path: &Path,
    dir: &Path,
    base: Option<serde_json::Value>,
) -> Result<Option<serde_json::Value>, PolicyError> {
    Ok(match base {
        Some(serde_json::Value::String(rel)) => {
            let path = cases_path.parent().unwrap_or(dir).join(rel);
            Some(
                serde_json::from_str(&read(&path)?).map_err(|e| PolicyError::Invalid {
                    path: path.display().to_string(),
                    message: format!("base input is not JSON: {e}"),
                })?,
            )
        }
        other => other,
    })
}

fn run_case(
    policies: &[PolicySource],
    point: Option<DecisionPoint>,
    base: Option<&serde_json::Value>,
    case: &Case,
    limits: Limits,
) -> Option<String> {
    let set = PolicySet::compile(policies, limits);
    let point = match point.or_else(|| set.statuses().iter().find_map(|s| s.point)) {
        Some(p) => p,
        None => {
            let errors: Vec<String> = set
                .statuses()
                .iter()
                .flat_map(|s| s.errors.iter().map(CompileError::to_string))
                .collect();
            return Some(format!(
                "the policy does not compile: {}",
                errors.join("; ")
            ));
        }
    };
    let mut input = base.cloned().unwrap_or_else(|| serde_json::json!({}));
    crate::merge(&mut input, &case.input);
    if let Err(e) = crate::input::validate(point, &input) {
        return Some(format!(
            "the case's input is not a valid {point} input document: {e}"
        ));
    }
    let decision = set.evaluator().evaluate(point, &input);
    if case.fails_closed {
        let broken = !decision.allowed
            && decision
                .denies
                .iter()
                .all(|f| f.message.starts_with("policy is broken"));
        return (!broken || !case.denies.is_empty()).then(|| {
            format!(
                "expected the policy to fail closed (and no `denies` in the case), got denies {:?}",
                decision
                    .denies
                    .iter()
                    .map(|f| &f.message)
                    .collect::<Vec<_>>()
            )
        });
    }
    let mut got: Vec<String> = decision.denies.iter().map(|f| f.message.clone()).collect();
    let mut want = case.denies.clone();
    got.sort();
    want.sort();
    (got != want).then(|| format!("expected denies {want:?}, got {got:?}"))
}

fn run_rego_tests(
    sources: &[(PathBuf, String)],
    data: Option<&serde_json::Value>,
    limits: Limits,
    report: &mut TestReport,
) {
    let mut engine = new_engine(limits);
    for (path, rego) in sources {
        if let Err(e) = engine.add_policy(path.display().to_string(), rego.clone()) {
            let err = CompileError::from_engine(&path.display().to_string(), &e);
            report.results.push(TestResult {
                file: path.clone(),
                name: "compile".into(),
                kind: TestKind::Rego,
                failure: Some(err.to_string()),
            });
            return;
        }
    }
    if let Some(d) = data
        && let Err(e) = engine.add_data(Value::from(d.clone()))
    {
        report.results.push(TestResult {
            file: sources[0].0.clone(),
            name: "data".into(),
            kind: TestKind::Rego,
            failure: Some(format!("data.json could not be loaded: {e}")),
        });
        return;
    }
    let tests = test_rules(&mut engine);
    // Which file a test is in: the first module of its package that mentions it.
    let file_of = |package: &str, name: &str| -> PathBuf {
        sources
            .iter()
            .find(|(_, src)| src.contains(&format!("package {package}")) && src.contains(name))
            .map_or_else(|| sources[0].0.clone(), |(p, _)| p.clone())
    };
    for (package, name, line) in tests {
        let path = format!("data.{package}.{name}");
        let failure = match engine.eval_rule(path) {
            Ok(Value::Bool(true)) => None,
            Ok(Value::Undefined) => Some(format!(
                "line {line}: the test is undefined: a condition in its body did not hold"
            )),
            Ok(other) => Some(format!(
                "line {line}: expected true, got {}",
                other.to_json_str().unwrap_or_default()
            )),
            Err(e) => Some(format!(
                "line {line}: {}",
                crate::set::describe_eval_error(&e)
            )),
        };
        report.results.push(TestResult {
            file: file_of(&package, &name),
            name,
            kind: TestKind::Rego,
            failure,
        });
    }
}
