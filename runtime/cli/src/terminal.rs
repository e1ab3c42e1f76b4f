//! Text a plugin controls, made safe to print on a terminal, and the only writers of
//! standard output and standard error.
//!
//! Logs, outcome and error messages, outputs, checks and `describe`'s metadata are
//! written by the plugin; so is much of what the cluster holds (step results, log tails,
//! messages the agent and controller built from them) and what policies say about it.
//! Printed raw, an escape sequence in them can set the terminal's title, move the cursor
//! and erase lines, and a newline or carriage return can start a line that looks like the
//! CLI's own (`verified: signed by ...`). [`clean`] shows every control character as a
//! Rust escape (`\u{1b}`, `\n`, `\r`) instead, and so are the Unicode bidirectional
//! controls that reorder what is displayed. Tabs stay.
//!
//! Two layers:
//! - each field a plugin (or the cluster) controls goes through [`clean`] (or
//!   [`cleaned`] for whole resources) where it is formatted, so it stays on one line;
//! - every byte the CLI writes goes through the writers here ([`out!`], [`outln!`],
//!   [`errln!`], [`out_styled`], [`out_verbatim`]), which escape whatever control
//!   character is left but the newlines the CLI itself wrote, so a path that forgot the
//!   first layer still cannot reach the terminal with an escape sequence. `print!`,
//!   `println!`, `eprint!`, `eprintln!`, `std::io::stdout` and `std::io::stderr` are
//!   refused by clippy everywhere else in the crate (runtime/cli/clippy.toml), so a new
//!   output path goes through them by construction.
//!
//! Machine output (`-o json`, `-o yaml`) is made by [`json`] and [`yaml`]: the encoders
//! escape the C0 control characters themselves, but serde_json writes DEL, the C1
//! controls and the bidirectional controls raw, and serde_yaml the bidirectional ones;
//! those are written in the format's own escape, so a consumer parses exactly the value
//! the cluster or plugin holds.

use std::borrow::Cow;
use std::fmt;
use std::io::Write as _;

/// Whether `c` must not reach the terminal as itself.
fn unsafe_char(c: char) -> bool {
    (c.is_control() && c != '\t')
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every `unsafe_char` for which `keep` is false escaped as a Rust escape.
fn escape_unsafe(text: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(|c| unsafe_char(c) && !keep(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_char(c) && !keep(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` with every control character (but tab) and bidirectional control escaped; one
/// line whatever it holds.
pub(crate) fn clean(text: &str) -> Cow<'_, str> {
    escape_unsafe(text, |_| false)
}

/// A path for a message, [`clean`]ed (file names can hold control characters too).
pub(crate) fn path(p: &std::path::Path) -> String {
    clean(&p.display().to_string()).into_owned()
}

/// What the writers apply to everything: [`clean`], but the line breaks stay (the CLI's
/// own; a plugin's were escaped by [`clean`] where its text was formatted).
pub(crate) fn printable(text: &str) -> Cow<'_, str> {
    escape_unsafe(text, |c| c == '\n')
}

/// [`printable`], keeping the CLI's own colours: SGR sequences `ESC [ <digits and ;> m`.
/// Nothing else that starts with ESC is kept (no cursor movement, no title, no erase).
fn printable_styled(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| unsafe_char(c) && c != '\n') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if c == '\x1b' {
            let sgr = rest[1..].strip_prefix('[').and_then(|params| {
                let len = params
                    .find(|p: char| !(p.is_ascii_digit() || p == ';'))
                    .filter(|&i| params[i..].starts_with('m'))?;
                Some(2 + len + 1)
            });
            if let Some(n) = sgr {
                out.push_str(&rest[..n]);
                rest = &rest[n..];
                continue;
            }
        }
        if unsafe_char(c) && c != '\n' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    Cow::Owned(out)
}

/// JSON text with every terminal-unsafe character serde_json leaves raw (DEL, C1 and
/// bidirectional controls; it escapes the C0 ones) written as a JSON `\uXXXX` escape:
/// the same JSON value. Outside strings serde_json writes only ASCII and its own line
/// breaks and indentation, so only characters inside strings change.
fn json_escaped(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| unsafe_char(c) && c != '\n') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_char(c) && c != '\n' {
            // Every unsafe character is in the Basic Multilingual Plane.
            let _ = fmt::Write::write_fmt(&mut out, format_args!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `value` as pretty JSON with a final newline, safe for a terminal and unchanged for a
/// parser (see [`json_escaped`]).
pub(crate) fn json<T: serde::Serialize + ?Sized>(value: &T) -> anyhow::Result<String> {
    let text = serde_json::to_string_pretty(value)?;
    Ok(json_escaped(&text).into_owned() + "\n")
}

/// `value` as YAML, safe for a terminal and unchanged for a parser. serde_yaml escapes
/// the C0 and C1 controls and DEL (in double-quoted scalars) but writes the bidirectional
/// controls raw, and a plain or single-quoted scalar has no escape for them: a document
/// holding one is written as JSON instead, which is YAML too and escapes it (see
/// [`json_escaped`]).
pub(crate) fn yaml<T: serde::Serialize + ?Sized>(value: &T) -> anyhow::Result<String> {
    let text = serde_yaml::to_string(value)?;
    if text.chars().any(|c| unsafe_char(c) && c != '\n') {
        return json(value);
    }
    Ok(text)
}

/// Writes `args` to stdout, through [`printable`]. Used by [`out!`] and [`outln!`].
#[allow(clippy::disallowed_macros)]
pub(crate) fn write_out(args: fmt::Arguments<'_>) {
    match args.as_str() {
        Some(s) => print!("{}", printable(s)),
        None => print!("{}", printable(&args.to_string())),
    }
}

/// Writes `args` to stderr, through [`printable`]. Used by [`errln!`].
#[allow(clippy::disallowed_macros)]
pub(crate) fn write_err(args: fmt::Arguments<'_>) {
    match args.as_str() {
        Some(s) => eprint!("{}", printable(s)),
        None => eprint!("{}", printable(&args.to_string())),
    }
}

/// Prints to stdout like `print!`, escaping every control character but newlines.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::terminal::write_out(format_args!($($arg)*))
    };
}

/// Prints a line to stdout like `println!`, escaping every control character but newlines.
macro_rules! outln {
    () => {
        $crate::terminal::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::terminal::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Prints a line to stderr like `eprintln!`, escaping every control character but newlines.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::terminal::write_err(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {errln, out, outln};

/// Writes a rendering with the CLI's own colours to stdout: with `color`, SGR sequences
/// are kept and every other control character but newlines is escaped; without, as
/// [`out!`]. The fields in `text` must have been [`clean`]ed (or [`cleaned`]) already.
#[allow(clippy::disallowed_macros)]
pub(crate) fn out_styled(text: &str, color: bool) {
    if color {
        print!("{}", printable_styled(text));
    } else {
        print!("{}", printable(text));
    }
}

/// Moves the cursor home and clears the screen (`status --watch` on a terminal).
#[allow(clippy::disallowed_macros)]
pub(crate) fn clear_screen() {
    print!("\x1b[H\x1b[2J");
}

/// Writes `bytes` to stdout exactly (what `plugin statement` prints, to be signed
/// elsewhere: escaping would change what is signed). Refused when they hold a control
/// character other than a newline or tab, or are not UTF-8.
#[allow(clippy::disallowed_methods)]
pub(crate) fn out_verbatim(bytes: &[u8]) -> anyhow::Result<()> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("refusing to print bytes that are not UTF-8"))?;
    anyhow::ensure!(
        !text.chars().any(|c| unsafe_char(c) && c != '\n'),
        "refusing to print a control character: {}",
        clean(text)
    );
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .map_err(|e| anyhow::anyhow!("writing to stdout: {e}"))
}

/// Flushes stdout (a `status --watch` rendering without a final newline).
#[allow(clippy::disallowed_methods)]
pub(crate) fn flush() {
    std::io::stdout().flush().ok();
}

/// Whether stdout is a terminal.
#[allow(clippy::disallowed_methods)]
pub(crate) fn stdout_is_terminal() -> bool {
    use std::io::IsTerminal as _;
    std::io::stdout().is_terminal()
}

/// A copy of `value` (an Operation, a NodeTask) with [`clean`] applied to every string
/// in it, for the human renderings: their messages, logs, outputs and check results come
/// from plugins (through the agent). Machine output (`-o json|yaml`) is left as it is; its
/// encoders escape control characters themselves.
pub(crate) fn cleaned<T: serde::Serialize + serde::de::DeserializeOwned>(
    value: &T,
) -> anyhow::Result<T> {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::String(s) => {
                if let Cow::Owned(c) = clean(s) {
                    *s = c;
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            serde_json::Value::Object(map) => {
                // Keys too (output names); rebuilt only when one changes.
                if map.keys().any(|k| matches!(clean(k), Cow::Owned(_))) {
                    let old = std::mem::take(map);
                    for (k, v) in old {
                        map.insert(clean(&k).into_owned(), v);
                    }
                }
                map.values_mut().for_each(walk);
            }
            _ => {}
        }
    }
    let mut v = serde_json::to_value(value)?;
    walk(&mut v);
    Ok(serde_json::from_value(v)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleaned_escapes_every_string_and_key_of_an_object() {
        let mut outputs = std::collections::BTreeMap::new();
        outputs.insert(
            "k\x1b]0;t\x07".to_owned(),
            "line1\nverified: signed by x".to_owned(),
        );
        let clean_copy = cleaned(&outputs).unwrap();
        assert_eq!(
            clean_copy.into_iter().collect::<Vec<_>>(),
            vec![(
                "k\\u{1b}]0;t\\u{7}".to_owned(),
                "line1\\nverified: signed by x".to_owned()
            )]
        );
    }

    #[test]
    fn escapes_controls_newlines_and_bidi_but_keeps_text_and_tabs() {
        assert!(matches!(
            clean("plain text\twith tab, ünïcode ✓"),
            Cow::Borrowed(_)
        ));
        // A forged line, a title change, an erase, a C1 CSI and a right-to-left override.
        assert_eq!(
            clean("ok\nverified: signed by admin\r\x1b]0;pwned\x07\x1b[2K\u{9b}31m\u{202e}x"),
            "ok\\nverified: signed by admin\\r\\u{1b}]0;pwned\\u{7}\\u{1b}[2K\\u{9b}31m\\u{202e}x"
        );
        assert!(!clean("\x1b[31mred\x7f").chars().any(|c| c.is_control()));
    }

    /// Every character [`unsafe_char`] covers, one of each kind, with a forged line.
    const HOSTILE: &str = "a\x1b]0;pwned\x07\x1b[2J\x1b[31m\rFORGED\x00\x01\x1f\x7f\u{85}\u{9b}1A\u{202e}\u{2066}\u{200f}\nverified: FORGED\tb";

    fn no_raw_controls(text: &str) -> bool {
        !text.chars().any(|c| unsafe_char(c) && c != '\n')
    }

    #[test]
    fn writers_escape_everything_but_the_cli_s_own_newlines_and_colours() {
        let shown = printable(HOSTILE);
        assert!(no_raw_controls(&shown), "{shown:?}");
        assert_eq!(shown.matches('\n').count(), 1, "{shown:?}");
        assert!(shown.contains("\\u{1b}]0;pwned\\u{7}") && shown.ends_with("FORGED\tb"));
        assert!(matches!(printable("two\nlines\tok ✓\n"), Cow::Borrowed(_)));

        // Styled: the CLI's SGR colours stay, nothing else that starts with ESC does.
        let coloured = format!("\x1b[1mbold\x1b[0m \x1b[31;1m{HOSTILE}\x1b[0m");
        let styled = printable_styled(&coloured);
        assert!(styled.starts_with("\x1b[1mbold\x1b[0m \x1b[31;1ma\\u{1b}]0;pwned"));
        assert!(styled.ends_with("\x1b[0m"));
        let without_sgr = styled
            .replace("\x1b[1m", "")
            .replace("\x1b[0m", "")
            .replace("\x1b[31;1m", "")
            .replace("\x1b[31m", "");
        assert!(no_raw_controls(&without_sgr), "{styled:?}");
        // Only the SGR sequences the CLI writes itself (bold, reset, colour) were kept:
        // the plugin's own `\x1b[31m` would have been kept too, which is why its text is
        // cleaned where it is formatted.
        for unterminated in ["\x1b[", "\x1b[12", "\x1b[1;2H", "\x1b]0;t\x07", "\x1b"] {
            assert!(
                no_raw_controls(&printable_styled(unterminated)),
                "{unterminated:?}"
            );
        }
    }

    #[test]
    fn machine_output_escapes_in_its_own_syntax_and_parses_back_unchanged() {
        let mut value = std::collections::BTreeMap::new();
        value.insert(format!("key{HOSTILE}"), HOSTILE.to_owned());
        for (what, text) in [
            ("json", json(&value).unwrap()),
            ("yaml", yaml(&value).unwrap()),
        ] {
            assert!(no_raw_controls(&text), "{what}: {text:?}");
            let back: std::collections::BTreeMap<String, String> =
                serde_yaml::from_str(&text).unwrap();
            assert_eq!(back, value, "{what}: {text}");
        }
        let back: std::collections::BTreeMap<String, String> =
            serde_json::from_str(&json(&value).unwrap()).unwrap();
        assert_eq!(back, value);
        // Plain values stay YAML.
        assert_eq!(
            yaml(&value.keys().map(|_| "plain").collect::<Vec<_>>()).unwrap(),
            "- plain\n"
        );
    }

    #[test]
    fn verbatim_output_refuses_control_characters() {
        assert!(out_verbatim(b"name: x\x1b]0;t\x07\n").is_err());
        assert!(out_verbatim(b"\xff").is_err());
    }
}
