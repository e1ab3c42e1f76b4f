//! The docs' console transcripts, run for real: a sample in the docs can no longer go stale
//! unnoticed.
//!
//! A fenced ```` ```console ```` block right after a line `<!-- doc-test -->` in a file
//! under docs/ is a transcript. Each block runs in a fresh empty directory as one `bash`
//! session (so `cd` and variables carry over from one command to the next, as in a
//! terminal), with the `kubectl-bosun` under test first on `PATH`. Lines starting with `$ `
//! are commands (a trailing `\` continues one on the next line); the lines up to the next
//! command are its expected output, stdout and stderr together as a terminal shows them.
//! A final `[exit code N]` line expects exit status N (default 0).
//!
//! Before comparing, both sides are normalised so values that change from run to run do not
//! count (the docs keep realistic values):
//! - `sha256:` followed by 16 or 64 hex digits (digests, key ids) becomes `sha256:<hex>`;
//! - RFC 3339 times become `<time>`;
//! - in the output, the session directory becomes `.`, the checkout `~/src/bosun`, the
//!   plugin build directory `disk-report/target`, and `$HOME` `~`.
//!
//! In expected output, `[..]` matches any text within a line, and a line `...` matches
//! any number of lines (for a compiler's progress).
//!
//! The session's `$HOME` is a fresh directory holding `src/bosun`, a link to this checkout
//! (the docs say "your checkout is ~/src/bosun"). Cargo builds go to a target directory
//! shared with the other CLI tests (`CARGO_TARGET_DIR`, shown as `disk-report/target`),
//! offline, so only the first run compiles the plugin SDK's dependencies.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// One transcript block.
#[derive(Debug)]
struct Block {
    file: PathBuf,
    /// 1-based line of the opening fence.
    line: usize,
    commands: Vec<Step>,
}

#[derive(Debug)]
struct Step {
    command: String,
    expected: Vec<String>,
    exit: i32,
}

/// The transcripts of one markdown file.
fn blocks_of(file: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "<!-- doc-test -->" {
            let fence = i + 1;
            assert!(
                lines.get(fence).is_some_and(|l| l.trim() == "```console"),
                "{}:{}: `<!-- doc-test -->` must be followed by a ```console block",
                file.display(),
                fence + 1
            );
            let mut body = Vec::new();
            let mut j = fence + 1;
            while j < lines.len() && lines[j].trim() != "```" {
                body.push(lines[j]);
                j += 1;
            }
            out.push(Block {
                file: file.to_owned(),
                line: fence + 1,
                commands: parse(&body),
            });
            i = j;
        }
        i += 1;
    }
    out
}

fn parse(body: &[&str]) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut continuing = false;
    for line in body {
        if continuing {
            let step = steps.last_mut().unwrap();
            step.command.push('\n');
            step.command.push_str(line);
            continuing = line.ends_with('\\');
        } else if let Some(command) = line.strip_prefix("$ ") {
            steps.push(Step {
                command: command.to_owned(),
                expected: Vec::new(),
                exit: 0,
            });
            continuing = command.ends_with('\\');
        } else if let Some(step) = steps.last_mut() {
            match line
                .strip_prefix("[exit code ")
                .and_then(|r| r.strip_suffix(']'))
            {
                Some(code) => step.exit = code.parse().expect("[exit code N]"),
                None => step.expected.push((*line).to_owned()),
            }
        } else {
            panic!("a transcript starts with a `$ ` command, not {line:?}");
        }
    }
    steps
}

/// Replaces every `sha256:` + 16 or 64 hex digits, and every RFC 3339 time.
fn normalise(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("sha256:") {
            let hex = after
                .bytes()
                .take_while(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
                .count();
            if hex == 16 || hex == 64 {
                out.push_str("sha256:<hex>");
                rest = &after[hex..];
                continue;
            }
        }
        if let Some(len) = rfc3339_at(rest) {
            out.push_str("<time>");
            rest = &rest[len..];
            continue;
        }
        let c = rest.chars().next().unwrap();
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// The length of an RFC 3339 time (`2026-11-30T09:15:00Z`, fractions and offsets
/// allowed) at the start of `s`.
fn rfc3339_at(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| r.clone().all(|i| b.get(i).is_some_and(u8::is_ascii_digit));
    let shape = digits(0..4)
        && b.get(4) == Some(&b'-')
        && digits(5..7)
        && b.get(7) == Some(&b'-')
        && digits(8..10)
        && b.get(10) == Some(&b'T')
        && digits(11..13)
        && b.get(13) == Some(&b':')
        && digits(14..16)
        && b.get(16) == Some(&b':')
        && digits(17..19);
    if !shape {
        return None;
    }
    let mut n = 19;
    if b.get(n) == Some(&b'.') {
        n += 1;
        while b.get(n).is_some_and(u8::is_ascii_digit) {
            n += 1;
        }
    }
    match b.get(n) {
        Some(b'Z') => Some(n + 1),
        Some(b'+' | b'-')
            if digits(n + 1..n + 3) && b.get(n + 3) == Some(&b':') && digits(n + 4..n + 6) =>
        {
            Some(n + 6)
        }
        _ => Some(n),
    }
}

/// Whether `line` matches `pattern`, where `[..]` matches any text.
fn line_matches(pattern: &str, line: &str) -> bool {
    let parts: Vec<&str> = pattern.split("[..]").collect();
    if parts.len() == 1 {
        return pattern == line;
    }
    let Some(mut rest) = line.strip_prefix(parts[0]) else {
        return false;
    };
    for (k, part) in parts.iter().enumerate().skip(1) {
        if k == parts.len() - 1 {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Whether `lines` match `patterns`, where a pattern line `...` matches any number of lines.
fn lines_match(patterns: &[String], lines: &[String]) -> bool {
    match patterns.split_first() {
        None => lines.is_empty(),
        Some((p, rest)) if p == "..." => (0..=lines.len()).any(|k| lines_match(rest, &lines[k..])),
        Some((p, rest)) => lines
            .split_first()
            .is_some_and(|(l, ls)| line_matches(p, l) && lines_match(rest, ls)),
    }
}

/// `$VAR`, or `$HOME/dir` of the user running the tests.
fn tool_home(var: &str, dir: &str) -> PathBuf {
    std::env::var_os(var).map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(dir),
        PathBuf::from,
    )
}

const MARK: &str = "@@bosun-doc-test-exit";

/// Runs a block in a fresh session; returns every mismatch, described.
fn run_block(block: &Block) -> Vec<String> {
    let session = tempfile::tempdir().unwrap();
    let session_dir = session.path().canonicalize().unwrap();
    let work = session_dir.join("work");
    let home = session_dir.join("home");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(home.join("src")).unwrap();
    std::os::unix::fs::symlink(workspace_root(), home.join("src/bosun")).unwrap();
    let plugin_target = target_dir().join("cli-test-plugins");
    std::fs::create_dir_all(&plugin_target).unwrap();
    // The build directory is shared: a signature bundle left by an earlier run would be
    // appended to (`plugin sign` adds to an existing bundle).
    let _ =
        std::fs::remove_file(plugin_target.join("wasm32-wasip2/release/disk_report.wasm.sig.json"));

    let mut script = String::from("exec 2>&1\n");
    for step in &block.commands {
        script.push_str(&step.command);
        script.push_str(&format!("\necho \"{MARK} $?\"\n"));
    }
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_kubectl-bosun"))
        .parent()
        .unwrap()
        .to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["--noprofile", "--norc", "-c", &script])
        .current_dir(&work)
        .env_clear()
        .env("PATH", path)
        .env("HOME", &home)
        .env("LANG", "C.UTF-8")
        .env("CARGO_TARGET_DIR", &plugin_target)
        .env("CARGO_NET_OFFLINE", "true")
        // $HOME is the session's: cargo and rustup are told where they really live.
        .env("CARGO_HOME", tool_home("CARGO_HOME", ".cargo"))
        .env("RUSTUP_HOME", tool_home("RUSTUP_HOME", ".rustup"))
        .envs(std::env::var_os("RUSTUP_TOOLCHAIN").map(|v| ("RUSTUP_TOOLCHAIN", v)))
        .output()
        .expect("running bash");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let replacements = [
        (
            plugin_target.display().to_string(),
            "disk-report/target".to_owned(),
        ),
        (format!("{}/", work.display()), String::new()),
        (work.display().to_string(), ".".to_owned()),
        (
            workspace_root().display().to_string(),
            "~/src/bosun".to_owned(),
        ),
        (home.display().to_string(), "~".to_owned()),
    ];
    let localise = |line: &str| {
        let mut l = line.to_owned();
        for (from, to) in &replacements {
            l = l.replace(from.as_str(), to);
        }
        normalise(&l)
    };

    let mut problems = Vec::new();
    let mut outputs = text.split_inclusive('\n').map(|l| l.trim_end_matches('\n'));
    for step in &block.commands {
        let mut got = Vec::new();
        let mut code = None;
        for line in outputs.by_ref() {
            if let Some(c) = line.strip_prefix(MARK) {
                code = c.trim().parse::<i32>().ok();
                break;
            }
            got.push(localise(line));
        }
        let want: Vec<String> = step.expected.iter().map(|l| normalise(l)).collect();
        let Some(code) = code else {
            problems.push(format!(
                "$ {}\nthe session ended before this command finished; its output:\n{}",
                step.command,
                got.join("\n")
            ));
            break;
        };
        if code != step.exit || !lines_match(&want, &got) {
            problems.push(format!(
                "{}:{}: $ {}\n--- the doc says (exit {}):\n{}\n--- it printed (exit {code}):\n{}\n",
                block.file.display(),
                block.line,
                step.command,
                step.exit,
                step.expected.join("\n"),
                got.join("\n"),
            ));
        }
    }
    problems
}

fn doc_blocks() -> Vec<Block> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(workspace_root().join("docs"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files.iter().flat_map(|f| blocks_of(f)).collect()
}

/// Runs the transcripts of one doc page and fails listing every command whose output
/// differs. `at_least` guards against a marker lost in an edit.
fn check_page(page: &str, at_least: usize) {
    let blocks: Vec<Block> = doc_blocks()
        .into_iter()
        .filter(|b| b.file.file_name().is_some_and(|n| n == page))
        .collect();
    assert!(
        blocks.len() >= at_least,
        "docs/{page} has {} `<!-- doc-test -->` transcripts, expected at least {at_least}",
        blocks.len()
    );
    let problems: Vec<String> = blocks.iter().flat_map(run_block).collect();
    assert!(
        problems.is_empty(),
        "docs/{page}: {} transcript command(s) print something else than the doc shows; fix the doc (or the command):\n\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn plugins_md_transcripts_are_true() {
    check_page("plugins.md", 1);
}

#[test]
fn policy_md_transcripts_are_true() {
    check_page("policy.md", 1);
}

#[test]
fn cli_md_transcripts_are_true() {
    check_page("cli.md", 0);
}

#[test]
fn troubleshooting_md_transcripts_are_true() {
    check_page("troubleshooting.md", 0);
}

/// The matcher itself: placeholders match what they should and nothing more.
#[test]
fn the_matcher_keeps_values_that_matter() {
    assert_eq!(
        normalise(
            "signed x 0.1.0 sha256:7f85ef7ab0d82da0284d7d3b3f838cdee421c87b3fa6cb1156965768726b2ef6 by sha256:bcb50c7132bc3d1b"
        ),
        "signed x 0.1.0 sha256:<hex> by sha256:<hex>"
    );
    assert_eq!(
        normalise("sha256:abc"),
        "sha256:abc",
        "a short value is not a digest"
    );
    assert_eq!(
        normalise("at 2026-11-30T09:15:00Z, 2026-11-30T09:15:00.5+01:00."),
        "at <time>, <time>."
    );
    assert!(line_matches(
        "plugin [..] (sha256:<hex>)",
        "plugin disk-report 0.1.0 (sha256:<hex>)"
    ));
    assert!(!line_matches(
        "plugin [..] 0.2.0",
        "plugin disk-report 0.1.0"
    ));
    assert!(!line_matches("exit 2", "exit 1"));
    let v = |xs: &[&str]| xs.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert!(lines_match(
        &v(&["a", "...", "z"]),
        &v(&["a", "b", "c", "z"])
    ));
    assert!(lines_match(&v(&["a", "...", "z"]), &v(&["a", "z"])));
    assert!(!lines_match(&v(&["a", "...", "z"]), &v(&["a", "b"])));
    assert!(
        !lines_match(&v(&["a"]), &v(&["a", "b"])),
        "extra output is a difference"
    );
    let steps = parse(&[
        "$ echo one \\",
        "  two",
        "one two",
        "$ false",
        "[exit code 1]",
    ]);
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0].command, "echo one \\\n  two");
    assert_eq!(steps[0].expected, v(&["one two"]));
    assert_eq!((steps[1].exit, steps[1].expected.len()), (1, 0));
}
