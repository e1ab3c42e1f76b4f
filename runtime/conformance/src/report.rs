//! The kit's report as text for people and as JUnit XML for CI systems (JSON is the
//! report's own serialization, [`crate::Report::json`]).

use std::fmt::Write as _;

use crate::{Report, Status};

/// The readable report: every check by root and case, the grants, then a summary line.
pub fn text(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "plugin {} {} (sha256:{})", r.plugin, r.version, r.sha256);
    let mut last: Option<(&str, &str)> = None;
    for c in &r.checks {
        if last.map(|(root, _)| root) != Some(c.root.as_str()) {
            let _ = writeln!(s, "root {}:", c.root);
        }
        if last != Some((c.root.as_str(), c.case.as_str())) {
            let _ = writeln!(s, "  {}", c.case);
        }
        last = Some((&c.root, &c.case));
        let status = match c.status {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        };
        let _ = writeln!(s, "    {status}  {:<24} {}", c.check, c.message);
    }
    let _ = writeln!(s, "grants:");
    for g in &r.grants {
        if g.used {
            let _ = writeln!(s, "    used    {}", g.grant);
        } else {
            let _ = writeln!(
                s,
                "    UNUSED  {}: wider than needed; no case used it on any root (remove it, or add the case that needs it)",
                g.grant
            );
        }
    }
    for n in &r.notes {
        let _ = writeln!(s, "note: {n}");
    }
    let count = |st: Status| r.checks.iter().filter(|c| c.status == st).count();
    let unused = r.grants.iter().filter(|g| !g.used).count();
    let _ = writeln!(
        s,
        "{}: {} passed, {} failed, {} skipped; {} of {} grants used",
        if r.passed() { "PASSED" } else { "FAILED" },
        count(Status::Pass),
        count(Status::Fail),
        count(Status::Skip),
        r.grants.len() - unused,
        r.grants.len()
    );
    s
}

/// JUnit XML: one test suite per root (and one for the grants), one test case per check.
pub fn junit_xml(r: &Report) -> String {
    let mut suites: Vec<(&str, Vec<String>, usize, usize)> = Vec::new();
    for c in &r.checks {
        if suites.last().map(|s| s.0) != Some(c.root.as_str()) {
            suites.push((&c.root, Vec::new(), 0, 0));
        }
        let suite = suites.last_mut().expect("pushed above");
        let body = match c.status {
            Status::Pass => String::new(),
            Status::Fail => {
                suite.2 += 1;
                format!(
                    "<failure message=\"{}\">{}</failure>",
                    escape(&c.message),
                    escape(&c.message)
                )
            }
            Status::Skip => {
                suite.3 += 1;
                format!("<skipped message=\"{}\"/>", escape(&c.message))
            }
        };
        let out = if c.status == Status::Pass {
            format!("<system-out>{}</system-out>", escape(&c.message))
        } else {
            String::new()
        };
        suite.1.push(format!(
            "    <testcase classname=\"{}.{}.{}\" name=\"{}\" time=\"{:.3}\">{body}{out}</testcase>\n",
            escape(&r.plugin),
            escape(&c.root),
            escape(&c.case),
            escape(&c.check),
            c.seconds
        ));
    }
    let mut grants = (Vec::new(), 0);
    for g in &r.grants {
        let body = if g.used {
            String::new()
        } else {
            grants.1 += 1;
            "<failure message=\"wider than needed: no case used this grant on any root\"/>".into()
        };
        grants.0.push(format!(
            "    <testcase classname=\"{}.grants\" name=\"{}\" time=\"0\">{body}</testcase>\n",
            escape(&r.plugin),
            escape(&g.grant)
        ));
    }
    let tests = r.checks.len() + r.grants.len();
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        s,
        "<testsuites name=\"bosun plugin test {}\" tests=\"{tests}\" failures=\"{}\">",
        escape(&r.plugin),
        r.failures()
    );
    for (root, cases, failures, skipped) in &suites {
        let _ = writeln!(
            s,
            "  <testsuite name=\"{}/{}\" tests=\"{}\" failures=\"{failures}\" skipped=\"{skipped}\">",
            escape(&r.plugin),
            escape(root),
            cases.len()
        );
        cases.iter().for_each(|c| s.push_str(c));
        s.push_str("  </testsuite>\n");
    }
    let _ = writeln!(
        s,
        "  <testsuite name=\"{}/grants\" tests=\"{}\" failures=\"{}\" skipped=\"0\">",
        escape(&r.plugin),
        grants.0.len(),
        grants.1
    );
    grants.0.iter().for_each(|c| s.push_str(c));
    s.push_str("  </testsuite>\n</testsuites>\n");
    s
}

/// Escapes text for an XML attribute or element; drops characters XML 1.0 cannot hold.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(ch),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CheckResult, GrantResult};

    fn report() -> Report {
        let check = |root: &str, check: &str, status: Status, message: &str| CheckResult {
            root: root.into(),
            case: "greet".into(),
            check: check.into(),
            status,
            message: message.into(),
            seconds: 0.5,
        };
        Report {
            plugin: "hello".into(),
            version: "0.1.0".into(),
            sha256: "ab".into(),
            checks: vec![
                check("debian", "run", Status::Pass, "ok"),
                check(
                    "debian",
                    "idempotent",
                    Status::Fail,
                    "changed <etc> & \"x\"\u{1b}",
                ),
                check("alpine", "preflight-refuses", Status::Skip, "n/a"),
            ],
            runs: Vec::new(),
            grants: vec![
                GrantResult {
                    grant: "filesystem /etc (ReadOnly)".into(),
                    used: true,
                },
                GrantResult {
                    grant: "exec /usr/bin/uname -a".into(),
                    used: false,
                },
            ],
            notes: Vec::new(),
        }
    }

    #[test]
    fn junit_counts_failures_per_suite_and_escapes_text() {
        let xml = junit_xml(&report());
        assert!(
            xml.contains(
                "<testsuites name=\"bosun plugin test hello\" tests=\"5\" failures=\"2\">"
            ),
            "{xml}"
        );
        assert!(xml.contains(
            "<testsuite name=\"hello/debian\" tests=\"2\" failures=\"1\" skipped=\"0\">"
        ));
        assert!(xml.contains(
            "<testsuite name=\"hello/alpine\" tests=\"1\" failures=\"0\" skipped=\"1\">"
        ));
        assert!(
            xml.contains("changed &lt;etc&gt; &amp; &quot;x&quot;</failure>"),
            "{xml}"
        );
        assert!(!xml.contains('\u{1b}'));
        assert!(xml.contains("<testsuite name=\"hello/grants\" tests=\"2\" failures=\"1\""));
    }

    #[test]
    fn text_says_failed_and_names_the_unused_grant() {
        let t = text(&report());
        assert!(t.contains("FAIL  idempotent"), "{t}");
        assert!(
            t.contains("UNUSED  exec /usr/bin/uname -a: wider than needed"),
            "{t}"
        );
        assert!(
            t.ends_with("FAILED: 1 passed, 1 failed, 1 skipped; 1 of 2 grants used\n"),
            "{t}"
        );
    }
}
