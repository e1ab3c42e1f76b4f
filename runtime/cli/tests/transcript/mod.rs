//! Console transcripts in the docs, parsed, run and compared: shared by the CLI's own
//! transcript test (`runtime/cli/tests/doc_transcripts.rs`, pages that need no cluster)
//! and the lab's (`tests/e2e/tests/doc_transcripts_lab.rs`, pages that do).
//!
//! A fenced ```` ```console ```` block right after a line `<!-- doc-test -->` in a file
//! under docs/ is a transcript; after `<!-- doc-test: lab -->`, one that needs a cluster
//! (the lab test runs those, the CLI test the others). Lines starting with `$ ` are commands (a trailing `\`
//! continues one on the next line; a here-document `<<'EOF'` takes the lines up to `EOF`);
//! the lines up to the next command are its expected output, stdout and stderr together as
//! a terminal shows them. A final `[exit code N]` line expects exit status N (default 0).
//!
//! Before comparing, both sides are normalised so values that change from run to run do not
//! count (the docs keep realistic values):
//! - `sha256:` followed by 16 or 64 hex digits (digests, key ids) becomes `sha256:<hex>`;
//! - RFC 3339 times become `<time>`;
//! - for [`Session::loose`] sessions (a cluster's output), durations and ages (`50ms`,
//!   `1.6s`, `8s`, `1m32s`, `364d`) become `<dur>`, and every run of spaces and tabs one
//!   space, so table columns may line up differently.
//!
//! The output side first gets the session's [`Session::replacements`] (its directories,
//! ports and the like, as the docs show them).
//!
//! In expected output, `[..]` matches any text within a line, and a line `...` matches
//! any number of lines (for a compiler's progress).

#![allow(dead_code)] // each test binary uses its part

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One transcript block.
#[derive(Debug)]
pub struct Block {
    pub file: PathBuf,
    /// 1-based line of the opening fence.
    pub line: usize,
    /// Marked `<!-- doc-test: lab -->`: it needs a cluster.
    pub lab: bool,
    pub commands: Vec<Step>,
}

#[derive(Debug)]
pub struct Step {
    pub command: String,
    pub expected: Vec<String>,
    pub exit: i32,
}

/// The transcripts of one markdown file.
pub fn blocks_of(file: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let marker = lines[i].trim();
        if marker == "<!-- doc-test -->" || marker == "<!-- doc-test: lab -->" {
            let fence = i + 1;
            assert!(
                lines.get(fence).is_some_and(|l| l.trim() == "```console"),
                "{}:{}: `{marker}` must be followed by a ```console block",
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
                lab: marker.ends_with("lab -->"),
                commands: parse(&body),
            });
            i = j;
        }
        i += 1;
    }
    out
}

/// The word ending a here-document that `command` opens (`<<EOF`, `<<'EOF'`, `<<-"EOF"`).
fn heredoc_end(command: &str) -> Option<String> {
    let at = command.find("<<")?;
    let rest = command[at + 2..].trim_start_matches('-');
    let rest = rest.trim_start_matches(['\'', '"']);
    let word: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!word.is_empty()).then_some(word)
}

pub fn parse(body: &[&str]) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut continuing = false;
    let mut heredoc: Option<String> = None;
    for line in body {
        if let Some(end) = &heredoc {
            let step = steps.last_mut().unwrap();
            step.command.push('\n');
            step.command.push_str(line);
            if line.trim() == end {
                heredoc = None;
            }
        } else if continuing {
            let step = steps.last_mut().unwrap();
            step.command.push('\n');
            step.command.push_str(line);
            continuing = line.ends_with('\\');
            heredoc = heredoc_end(line);
        } else if let Some(command) = line.strip_prefix("$ ") {
            steps.push(Step {
                command: command.to_owned(),
                expected: Vec::new(),
                exit: 0,
            });
            continuing = command.ends_with('\\');
            heredoc = heredoc_end(command);
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
    assert!(heredoc.is_none(), "a here-document is not closed");
    steps
}

/// Replaces every `sha256:` + 16 or 64 hex digits, and every RFC 3339 time; when `loose`,
/// also every duration, and runs of spaces and tabs.
pub fn normalise(line: &str, loose: bool) -> String {
    let mut out = String::new();
    let mut rest = line;
    let mut previous: Option<char> = None;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("sha256:") {
            let hex = after
                .bytes()
                .take_while(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
                .count();
            if hex == 16 || hex == 64 {
                out.push_str("sha256:<hex>");
                rest = &after[hex..];
                previous = Some('>');
                continue;
            }
        }
        if let Some(len) = rfc3339_at(rest) {
            out.push_str("<time>");
            rest = &rest[len..];
            previous = Some('>');
            continue;
        }
        let at_word_start = previous.is_none_or(|p| !is_word(p));
        if loose
            && at_word_start
            && let Some(len) = duration_at(rest)
        {
            out.push_str("<dur>");
            rest = &rest[len..];
            previous = Some('>');
            continue;
        }
        let c = rest.chars().next().unwrap();
        if loose && (c == ' ' || c == '\t') {
            let blank = rest.len() - rest.trim_start_matches([' ', '\t']).len();
            out.push(' ');
            rest = &rest[blank..];
            previous = Some(' ');
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
        previous = Some(c);
    }
    if loose {
        out.trim_end().to_owned()
    } else {
        out
    }
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The length of a duration or age at the start of `s` (`0ms`, `2.4s`, `71s`, `1m09s`,
/// `3d04h`, `364d`): one or more number+unit pairs, not followed by a word character.
fn duration_at(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut n = 0;
    let mut pairs = 0;
    loop {
        let digits = b[n..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            break;
        }
        let mut m = n + digits;
        if pairs == 0 && b.get(m) == Some(&b'.') {
            let fraction = b[m + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
            if fraction == 0 {
                break;
            }
            m += 1 + fraction;
        }
        let unit = if b[m..].starts_with(b"ms") {
            2
        } else if matches!(b.get(m), Some(b's' | b'm' | b'h' | b'd')) {
            1
        } else {
            break;
        };
        n = m + unit;
        pairs += 1;
    }
    let followed_by_word = s[n..].chars().next().is_some_and(is_word);
    (pairs > 0 && !followed_by_word).then_some(n)
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
pub fn line_matches(pattern: &str, line: &str) -> bool {
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
pub fn lines_match(patterns: &[String], lines: &[String]) -> bool {
    match patterns.split_first() {
        None => lines.is_empty(),
        Some((p, rest)) if p == "..." => (0..=lines.len()).any(|k| lines_match(rest, &lines[k..])),
        Some((p, rest)) => lines
            .split_first()
            .is_some_and(|(l, ls)| line_matches(p, l) && lines_match(rest, ls)),
    }
}

/// Where and how a run of transcripts happens.
#[derive(Debug, Default)]
pub struct Session {
    /// The working directory of the shell.
    pub cwd: PathBuf,
    /// The shell's whole environment (nothing else is inherited).
    pub env: Vec<(OsString, OsString)>,
    /// Applied to each output line, in order, before normalising: (what, shown as).
    pub replacements: Vec<(String, String)>,
    /// Normalise durations and blanks too (see the module documentation).
    pub loose: bool,
    /// Send SIGTERM to everything the session left running in the background (`cmd &`)
    /// once the last command finished. The shell runs in its own process group.
    pub stop_background: bool,
}

const MARK: &str = "@@bosun-doc-test-exit";

/// Runs `blocks` one after the other in one `bash` session (so `cd`, variables and
/// background processes carry over from one command and block to the next, as for a
/// reader following a page in one terminal); returns every mismatch, described.
pub fn run(blocks: &[&Block], session: &Session) -> Vec<String> {
    let mut script = String::from("exec 2>&1\n");
    for block in blocks {
        for step in &block.commands {
            script.push_str(&step.command);
            script.push_str(&format!("\necho \"{MARK} $?\"\n"));
        }
    }
    if session.stop_background {
        // Everything in this process group but the shell itself.
        script.push_str("trap '' TERM\nkill -TERM 0\nwait\n");
    }
    let mut cmd = Command::new("bash");
    cmd.args(["--noprofile", "--norc", "-c", &script])
        .current_dir(&session.cwd)
        .env_clear()
        .envs(session.env.iter().map(|(k, v)| (k, v)));
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let out = cmd.output().expect("running bash");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let localise = |line: &str| {
        let mut l = line.to_owned();
        for (from, to) in &session.replacements {
            l = l.replace(from.as_str(), to);
        }
        normalise(&l, session.loose)
    };

    let mut problems = Vec::new();
    let mut outputs = text.split_inclusive('\n').map(|l| l.trim_end_matches('\n'));
    for block in blocks {
        for step in &block.commands {
            let mut printed = Vec::new();
            let mut code = None;
            for line in outputs.by_ref() {
                if let Some(c) = line.strip_prefix(MARK) {
                    code = c.trim().parse::<i32>().ok();
                    break;
                }
                printed.push(line.to_owned());
            }
            // YAML folds long values at a width, so where a line breaks depends on how long
            // the values before it are (a path, a disk-free figure): compare unfolded.
            let yaml = session.loose && step.command.contains("-o yaml");
            let unfold = |lines: &[String]| {
                if yaml {
                    unfold_yaml(lines)
                } else {
                    lines.to_vec()
                }
            };
            let want: Vec<String> = unfold(&step.expected)
                .iter()
                .map(|l| normalise(l, session.loose))
                .collect();
            let got: Vec<String> = unfold(&printed).iter().map(|l| localise(l)).collect();
            // As printed (folded), for the messages.
            let shown = || {
                printed
                    .iter()
                    .map(|l| localise(l))
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            let Some(code) = code else {
                problems.push(format!(
                    "{}:{}: $ {}\nthe session ended before this command finished; its output:\n{}",
                    block.file.display(),
                    block.line,
                    step.command,
                    shown()
                ));
                return problems;
            };
            if code != step.exit || !lines_match(&want, &got) {
                problems.push(format!(
                    "{}:{}: $ {}\n--- the doc says (exit {}):\n{}\n--- it printed (exit {code}):\n{}\n",
                    block.file.display(),
                    block.line,
                    step.command,
                    step.exit,
                    step.expected.join("\n"),
                    shown(),
                ));
            }
        }
    }
    problems
}

/// `lines` of YAML (as kubectl prints it) with every folded scalar value on one line: a
/// line indented deeper than the key of a `key: value` line above it continues that value
/// (a key with a value on its line has no children), and is joined to it with one space.
/// A `...` line (any lines, in expected output) is left alone.
pub fn unfold_yaml(lines: &[String]) -> Vec<String> {
    let indent = |l: &str| l.len() - l.trim_start_matches(' ').len();
    // The column of the key, if `line` is `key: value` or `- key: value`.
    let key_with_value = |line: &str| -> Option<usize> {
        let mut col = indent(line);
        let mut rest = &line[col..];
        while let Some(r) = rest.strip_prefix("- ") {
            rest = r;
            col += 2;
        }
        let (key, value) = rest.split_once(": ")?;
        let plain_key = !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-/".contains(c));
        (plain_key && !value.trim().is_empty()).then_some(col)
    };
    let mut out: Vec<String> = Vec::new();
    let mut open_key: Option<usize> = None;
    for line in lines {
        if line.trim() == "..." {
            open_key = None;
            out.push(line.clone());
            continue;
        }
        if let (Some(col), Some(last)) = (open_key, out.last_mut())
            && !line.trim().is_empty()
            && indent(line) > col
        {
            last.push(' ');
            last.push_str(line.trim_start());
            continue;
        }
        open_key = key_with_value(line);
        out.push(line.clone());
    }
    out
}

/// The transcripts of `docs/<page>` under `root` that need a cluster (`lab`) or not; fails
/// when there are fewer than `at_least` (a marker lost in an edit).
pub fn page_blocks(root: &Path, page: &str, lab: bool, at_least: usize) -> Vec<Block> {
    let blocks: Vec<Block> = blocks_of(&root.join("docs").join(page))
        .into_iter()
        .filter(|b| b.lab == lab)
        .collect();
    let marker = if lab {
        "<!-- doc-test: lab -->"
    } else {
        "<!-- doc-test -->"
    };
    assert!(
        blocks.len() >= at_least,
        "docs/{page} has {} `{marker}` transcripts, expected at least {at_least}",
        blocks.len()
    );
    blocks
}

/// The fenced blocks of a docs page that show commands (```` ```console ````, ```` ```sh ````,
/// ```` ```bash ````) but are not doc-test transcripts, as `page:line` of their opening
/// fence: for a page whose every command a test must run.
pub fn unmarked_command_blocks(root: &Path, page: &str) -> Vec<String> {
    let text = std::fs::read_to_string(root.join("docs").join(page)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut in_fence = false;
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim();
        if !trimmed.starts_with("```") {
            continue;
        }
        if in_fence {
            in_fence = false;
            continue;
        }
        in_fence = true;
        let shows_commands = matches!(trimmed, "```console" | "```sh" | "```bash" | "```shell");
        let marked = i > 0 && lines[i - 1].trim().starts_with("<!-- doc-test");
        if shows_commands && !marked {
            out.push(format!("docs/{page}:{}", i + 1));
        }
    }
    out
}

/// Fails listing every problem, if any.
pub fn assert_no_problems(what: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{what}: {} transcript command(s) print something else than the doc shows; fix the doc (or the command):\n\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The matcher itself: placeholders match what they should and nothing more.
pub fn check_the_matcher() {
    assert_eq!(
        normalise(
            "signed x 0.1.0 sha256:7f85ef7ab0d82da0284d7d3b3f838cdee421c87b3fa6cb1156965768726b2ef6 by sha256:bcb50c7132bc3d1b",
            false
        ),
        "signed x 0.1.0 sha256:<hex> by sha256:<hex>"
    );
    assert_eq!(
        normalise("sha256:abc", false),
        "sha256:abc",
        "a short value is not a digest"
    );
    assert_eq!(
        normalise(
            "at 2026-11-30T09:15:00Z, 2026-11-30T09:15:00.5+01:00.",
            false
        ),
        "at <time>, <time>."
    );
    // Durations only when loose, and only whole words.
    assert_eq!(normalise("age 8s", false), "age 8s");
    assert_eq!(
        normalise("age 1m09s  50ms 2.4s, 3d04h (364d) 0s", true),
        "age <dur> <dur> <dur>, <dur> (<dur>) <dur>"
    );
    assert_eq!(
        normalise("v1.34.4 0/4 ed25519 x86_64 10.200.1.1 2s2 4 nodes", true),
        "v1.34.4 0/4 ed25519 x86_64 10.200.1.1 2s2 4 nodes"
    );
    assert_eq!(
        normalise("NAME   PHASE\tAGE  ", true),
        "NAME PHASE AGE",
        "blanks collapse when loose"
    );
    // The same YAML folded at two places unfolds to the same lines; children of a key
    // without a value, sequence items and `...` stay lines of their own.
    let lines = |text: &str| text.lines().map(String::from).collect::<Vec<_>>();
    let short = lines(
        "preflight:\n- message: /n/w1 has 9.5 GiB free (at least\n    1.0 GiB needed)\n  name: disk\n...\nphase: Failed",
    );
    let long = lines(
        "preflight:\n- message: /n/w1 has 22.8 GiB free (at\n    least 1.0 GiB needed)\n  name: disk\n...\nphase: Failed",
    );
    assert_eq!(
        unfold_yaml(&short),
        lines(
            "preflight:\n- message: /n/w1 has 9.5 GiB free (at least 1.0 GiB needed)\n  name: disk\n...\nphase: Failed"
        )
    );
    assert_eq!(
        unfold_yaml(&long)[1],
        "- message: /n/w1 has 22.8 GiB free (at least 1.0 GiB needed)"
    );
    assert_eq!(
        unfold_yaml(&lines(
            "steps:\n- name: a\n  phase: Failed\nmeta:\n  uid: x"
        )),
        lines("steps:\n- name: a\n  phase: Failed\nmeta:\n  uid: x"),
        "nothing to unfold"
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
        "$ sed s/^.// <<'EOF'",
        "$ inside",
        "EOF",
        " inside",
    ]);
    assert_eq!(steps.len(), 3);
    assert_eq!(steps[0].command, "echo one \\\n  two");
    assert_eq!(steps[0].expected, v(&["one two"]));
    assert_eq!((steps[1].exit, steps[1].expected.len()), (1, 0));
    assert_eq!(steps[2].command, "sed s/^.// <<'EOF'\n$ inside\nEOF");
    assert_eq!(steps[2].expected, v(&[" inside"]));
}
