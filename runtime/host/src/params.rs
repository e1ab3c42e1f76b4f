//! Checking an action's params against the JSON Schema the plugin declared for them in
//! `describe`, before the plugin runs: a typo in an Operation is reported by the host as
//! "at `/version`: want string, but got number", not by whatever the guest's parser says.
//!
//! Schemas come from the plugin, so they are treated as untrusted input: every `$ref` must
//! resolve inside the schema itself or to a JSON Schema meta-schema (built into the
//! validator); nothing is ever loaded from a file or the network while compiling one.

use std::collections::HashMap;

use serde_json::Value;

use crate::report::ActionInfo;

/// Upper bound on the problems quoted in one error message.
const MAX_PROBLEMS: usize = 8;

/// Largest params schema of one action, in bytes. A plugin's schemas are bounded by
/// `describe`'s output cap too; this keeps one action's well below it.
pub(crate) const MAX_SCHEMA_BYTES: usize = 64 << 10;
/// Regular expressions (`pattern` values and `patternProperties` names) across all of a
/// plugin's schemas.
pub(crate) const MAX_PATTERNS: usize = 64;
/// Longest regular expression, in bytes (as written in the schema).
pub(crate) const MAX_PATTERN_BYTES: usize = 1024;
/// Most memory one regular expression may compile to (the `regex` crate's size limit),
/// judged on the exact text boon compiles ([`ecma_to_boon`]). With [`MAX_PATTERNS`] this
/// bounds what compiling a plugin's patterns can take at 16 MiB; a schema of 25,000
/// `\p{L}{200}` patterns took 14 GB before these bounds, and 64 `\cA\p{L}{200}` (which the
/// `regex` crate cannot parse, but boon rewrites and compiles) 650 MiB before the bound
/// was judged on boon's text.
pub(crate) const MAX_PATTERN_COMPILED_BYTES: usize = 256 << 10;

/// Checks a schema's size before it is parsed.
fn check_size(text: &str) -> Result<(), String> {
    if text.len() > MAX_SCHEMA_BYTES {
        return Err(format!(
            "the schema is {} bytes, more than the host's limit of {MAX_SCHEMA_BYTES}; declare a smaller schema",
            text.len()
        ));
    }
    Ok(())
}

/// Checks a schema's regular expressions against the bounds above before anything
/// compiles them; `patterns` counts across the plugin's actions. The compiled size is
/// judged on the text boon will compile ([`ecma_to_boon`]), with the `regex` crate boon
/// uses; a pattern that cannot be bounded that way (one the `regex` crate cannot parse
/// once rewritten, or one using the `x` flag) is refused, never left to boon, since boon
/// compiles with the `regex` crate's default limit of 10 MiB.
fn check_patterns(value: &Value, patterns: &mut usize) -> Result<(), String> {
    let mut found: Vec<&str> = Vec::new();
    collect_patterns(value, &mut found);
    for p in found {
        *patterns += 1;
        if *patterns > MAX_PATTERNS {
            return Err(format!(
                "the plugin's schemas hold more than {MAX_PATTERNS} regular expressions (`pattern`, `patternProperties`), \
                 the host's limit"
            ));
        }
        if p.len() > MAX_PATTERN_BYTES {
            return Err(format!(
                "a regular expression is {} bytes, more than the host's limit of {MAX_PATTERN_BYTES}",
                p.len()
            ));
        }
        let shown = || {
            let mut shown = p.to_owned();
            crate::sandbox::truncate_utf8(&mut shown, 64);
            shown
        };
        let compiled = ecma_to_boon(p).ok_or_else(|| {
            format!(
                "the regular expression `{}` uses the `x` flag, which ECMA-262 does not have and under which the host \
                 cannot bound what the validator compiles; write it without `(?x)`",
                shown()
            )
        })?;
        match regex::RegexBuilder::new(&compiled)
            .size_limit(MAX_PATTERN_COMPILED_BYTES)
            .build()
        {
            Ok(_) => {}
            Err(regex::Error::CompiledTooBig(limit)) => {
                return Err(format!(
                    "the regular expression `{}` compiles to more than {limit} bytes, the host's limit; use a simpler pattern",
                    shown()
                ));
            }
            Err(e) => {
                // Only the one-line reason: the rest of the message repeats the pattern.
                let e = e.to_string();
                let reason = e
                    .lines()
                    .find_map(|l| l.strip_prefix("error: "))
                    .unwrap_or("not a regular expression");
                return Err(format!(
                    "the regular expression `{}` cannot be bounded by the host ({reason}); write it in the syntax both \
                     ECMA-262 and the Rust `regex` crate accept (no lookaround or backreferences)",
                    shown()
                ));
            }
        }
    }
    Ok(())
}

/// The text boon 0.6 compiles for the ECMA-262 regular expression `p` (a `pattern` value
/// or `patternProperties` name), or `None` when that cannot be told from the text alone.
///
/// boon (`ecma::convert`) parses `p` with `regex-syntax`, rewrites each `\cX` to the control
/// character and each `\d`, `\D`, `\w`, `\W`, `\s`, `\S` to the ASCII class ECMA-262 gives it,
/// then compiles the result with `regex::Regex::new`. This repeats the rewrite escape by
/// escape (every `\` starts an escape in the `regex` crate's syntax), so the bound is judged
/// on exactly what boon compiles: Rust's Unicode classes differ from boon's ASCII ones in
/// size either way (`[\p{L}--\w]` is empty in Rust, every non-ASCII letter in boon). A
/// rewrite that does not parse is refused by the caller; boon would refuse it too, or
/// compile a partly rewritten pattern, which is never bounded.
///
/// The exception is the `x` flag: under it `#` starts a comment, where `\` escapes nothing,
/// and the whitespace boon writes (`\cJ`, `\s`) is ignored, so the text is not enough.
/// ECMA-262 has no such flag, so any `(?` whose flags name `x` gives `None`.
fn ecma_to_boon(p: &str) -> Option<String> {
    /// ECMA-262's `\s`, as boon writes it.
    const SPACE: &str = " \t\n\r\u{000b}\u{000c}\u{00a0}\u{feff}\u{2003}\u{2029}";
    let mut out = String::with_capacity(p.len());
    let mut chars = p.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('d') => out.push_str("[0-9]"),
                Some('D') => out.push_str("[^0-9]"),
                Some('w') => out.push_str("[A-Za-z0-9_]"),
                Some('W') => out.push_str("[^A-Za-z0-9_]"),
                Some('s') => out.extend(["[", SPACE, "]"]),
                Some('S') => out.extend(["[^", SPACE, "]"]),
                Some('c') => match chars.next_if(char::is_ascii_alphabetic) {
                    Some(letter) => out.push(char::from(letter as u8 % 32)),
                    // Not a control escape: left for the `regex` crate to refuse, as boon does.
                    None => out.push_str("\\c"),
                },
                Some(e) => {
                    out.push('\\');
                    out.push(e);
                }
                None => out.push('\\'),
            },
            '(' if chars.peek() == Some(&'?') => {
                let mut flags = chars
                    .clone()
                    .skip(1)
                    .take_while(|f| f.is_ascii_alphabetic() || *f == '-');
                if flags.any(|f| f == 'x') {
                    return None;
                }
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    Some(out)
}

/// Every `pattern` string and `patternProperties` name in `value`, at any depth.
fn collect_patterns<'v>(value: &'v Value, out: &mut Vec<&'v str>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("pattern", Value::String(p)) => out.push(p),
                    ("patternProperties", Value::Object(props)) => {
                        out.extend(props.keys().map(String::as_str))
                    }
                    _ => {}
                }
                collect_patterns(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_patterns(v, out)),
        _ => {}
    }
}

/// Refuses every external schema reference (the default loader reads `file://` URLs).
struct NoExternalRefs;

impl boon::UrlLoader for NoExternalRefs {
    fn load(&self, url: &str) -> Result<Value, Box<dyn std::error::Error>> {
        Err(format!(
            "external schema references are not allowed in a plugin's params schema (found {url})"
        )
        .into())
    }
}

/// The compiled params schemas of one plugin's actions.
pub(crate) struct ParamSchemas {
    schemas: boon::Schemas,
    by_action: HashMap<String, boon::SchemaIndex>,
}

impl ParamSchemas {
    /// Compiles each action's schema. An action whose schema is empty accepts any params.
    /// Fails with the action's name and the compiler's message when a schema is not valid
    /// JSON or not a valid JSON Schema, and before compiling anything when a schema is
    /// larger than [`MAX_SCHEMA_BYTES`] or its regular expressions exceed the bounds
    /// ([`MAX_PATTERNS`], [`MAX_PATTERN_BYTES`], [`MAX_PATTERN_COMPILED_BYTES`]) or cannot
    /// be bounded (see [`check_patterns`]).
    pub(crate) fn compile(actions: &[ActionInfo]) -> Result<ParamSchemas, (String, String)> {
        let mut schemas = boon::Schemas::new();
        let mut compiler = boon::Compiler::new();
        compiler.use_loader(Box::new(NoExternalRefs));
        let mut by_action = HashMap::new();
        let mut patterns = 0;
        for (i, action) in actions.iter().enumerate() {
            if action.params_schema.trim().is_empty() {
                continue;
            }
            let fail = |message: String| (action.name.clone(), message);
            check_size(&action.params_schema).map_err(fail)?;
            let value: Value = serde_json::from_str(&action.params_schema)
                .map_err(|e| fail(format!("not JSON: {e}")))?;
            check_patterns(&value, &mut patterns).map_err(fail)?;
            // Synthetic, never fetched: the loader above refuses anything not added here.
            let url = format!("urn:bosun-plugin-params:{i}");
            compiler
                .add_resource(&url, value)
                .map_err(|e| fail(e.to_string()))?;
            let index = compiler
                .compile(&url, &mut schemas)
                .map_err(|e| fail(format!("{e:#}")))?;
            by_action.insert(action.name.clone(), index);
        }
        Ok(ParamSchemas { schemas, by_action })
    }

    /// Checks `params` against `action`'s schema; `Err` lists what is wrong, each problem
    /// with the JSON pointer of the offending value.
    pub(crate) fn check(&self, action: &str, params: &Value) -> Result<(), String> {
        let Some(&index) = self.by_action.get(action) else {
            return Ok(());
        };
        let Err(e) = self.schemas.validate(params, index) else {
            return Ok(());
        };
        let mut problems = Vec::new();
        collect(&e, &mut problems);
        if problems.is_empty() {
            problems.push(e.to_string());
        }
        let more = problems.len().saturating_sub(MAX_PROBLEMS);
        problems.truncate(MAX_PROBLEMS);
        let mut message = problems.join("; ");
        if more > 0 {
            message.push_str(&format!("; and {more} more"));
        }
        Err(message)
    }
}

/// Checks `value` against the JSON Schema `schema` with the same compiler and bounds as
/// params schemas (no external references, bounded regular expressions). For tools that
/// check a plugin's results, such as `kubectl bosun plugin test`'s outputs schemas.
pub fn validate_json(schema: &str, value: &Value) -> Result<(), String> {
    let action = ActionInfo {
        name: "schema".into(),
        description: String::new(),
        params_schema: schema.to_owned(),
        idempotent: false,
    };
    let compiled = ParamSchemas::compile(std::slice::from_ref(&action))
        .map_err(|(_, message)| format!("the schema is not usable: {message}"))?;
    compiled.check("schema", value)
}

/// The leaf errors of a validation error tree, as "at `/pointer`: what".
fn collect(e: &boon::ValidationError<'_, '_>, out: &mut Vec<String>) {
    if e.causes.is_empty() {
        let at = e.instance_location.to_string();
        let at = if at.is_empty() { "/".to_owned() } else { at };
        out.push(format!("at `{at}`: {}", e.kind));
    } else {
        for cause in &e.causes {
            collect(cause, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn action(name: &str, schema: &str) -> ActionInfo {
        ActionInfo {
            name: name.into(),
            description: String::new(),
            params_schema: schema.into(),
            idempotent: true,
        }
    }

    fn schemas() -> ParamSchemas {
        ParamSchemas::compile(&[
            action(
                "upgrade",
                r#"{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object",
                    "properties":{"version":{"type":"string","pattern":"^v1\\.[0-9]+\\.[0-9]+$"},
                                  "force":{"type":"boolean"}},
                    "required":["version"],"additionalProperties":false}"#,
            ),
            action("anything", ""),
        ])
        .unwrap()
    }

    #[test]
    fn params_that_match_the_schema_pass_and_actions_without_one_accept_anything() {
        let s = schemas();
        assert_eq!(
            s.check("upgrade", &json!({"version": "v1.34.4", "force": false})),
            Ok(())
        );
        assert_eq!(s.check("anything", &json!([1, "two"])), Ok(()));
    }

    #[test]
    fn each_problem_is_reported_with_where_it_is() {
        let s = schemas();
        let e = s
            .check("upgrade", &json!({"version": 134, "forse": true}))
            .unwrap_err();
        assert!(e.contains("at `/version`"), "{e}");
        assert!(e.contains("forse"), "the unknown property is named: {e}");
        let e = s.check("upgrade", &json!({})).unwrap_err();
        assert!(e.contains("version"), "the missing property is named: {e}");
        let e = s.check("upgrade", &json!({"version": "1.34"})).unwrap_err();
        assert!(e.contains("at `/version`") && e.contains("pattern"), "{e}");
    }

    #[test]
    fn a_schema_that_is_not_a_schema_names_the_action() {
        let (name, message) = ParamSchemas::compile(&[action("broken", r#"{"type": 12}"#)])
            .err()
            .unwrap();
        assert_eq!(name, "broken");
        assert!(!message.is_empty());
        let (name, message) = ParamSchemas::compile(&[action("nojson", "{")])
            .err()
            .unwrap();
        assert_eq!(name, "nojson");
        assert!(message.contains("not JSON"), "{message}");
    }

    #[test]
    fn schema_bombs_are_refused_before_compiling() {
        // The review's bomb, smaller: many patterns that each compile to a large automaton.
        let many: serde_json::Map<String, Value> = (0..25_000)
            .map(|i| {
                (
                    format!("p{i}"),
                    json!({"type": "string", "pattern": "\\p{L}{200}"}),
                )
            })
            .collect();
        let bomb = json!({"type": "object", "properties": many}).to_string();
        let (name, message) = ParamSchemas::compile(&[action("bomb", &bomb)])
            .err()
            .unwrap();
        assert_eq!(name, "bomb");
        assert!(message.contains("limit of 65536"), "{message}");
        // Under the byte cap: one expensive pattern is refused by its compiled size ...
        let one = json!({"type": "string", "pattern": "\\p{L}{200}"}).to_string();
        let (_, message) = ParamSchemas::compile(&[action("one", &one)]).err().unwrap();
        assert!(
            message.contains("compiles to more than") && message.contains("p{L}{200}"),
            "{message}"
        );
        // ... too many cheap ones (across actions) by their count ...
        let cheap: serde_json::Map<String, Value> = (0..40)
            .map(|i| {
                (
                    format!("p{i}"),
                    json!({"type": "string", "pattern": "^a+$"}),
                )
            })
            .collect();
        let cheap = json!({"type": "object", "properties": cheap}).to_string();
        let (name, message) = ParamSchemas::compile(&[action("a", &cheap), action("b", &cheap)])
            .err()
            .unwrap();
        assert_eq!(name, "b");
        assert!(
            message.contains("more than 64 regular expressions"),
            "{message}"
        );
        // ... and a long one by its length, also as a patternProperties name.
        let long =
            json!({"type": "object", "patternProperties": {"a".repeat(2000): {}}}).to_string();
        let (_, message) = ParamSchemas::compile(&[action("long", &long)])
            .err()
            .unwrap();
        assert!(message.contains("2000 bytes"), "{message}");
        // What a real plugin declares still compiles.
        let cheap_one = json!({"type": "object", "properties": {"v": {"type": "string", "pattern": "^v1\\.[0-9]+\\.[0-9]+$"}}}).to_string();
        ParamSchemas::compile(&[action("a", &cheap), action("b", &cheap_one)]).unwrap();
    }

    #[test]
    fn patterns_are_bounded_as_boon_compiles_them_or_refused() {
        // Issue 31 item 3: the `regex` crate cannot parse `\cA`, so the bound was skipped,
        // but boon rewrites it to U+0001 and compiled the rest with a 10 MiB limit (64 of
        // these: 650 MiB, 9 s). Now the bound is judged on boon's text.
        let cases = [
            (
                json!({"type": "string", "pattern": "\\cA\\p{L}{200}"}),
                "\\cA\\p{L}{200}",
            ),
            // Valid Rust, and empty there (Unicode `\w` holds every letter), but boon's
            // ASCII `\w` leaves every non-ASCII letter: as large as `\p{L}{200}`.
            (
                json!({"type": "object", "patternProperties": {"[\\p{L}--\\w]{200}": {}}}),
                "[\\p{L}--\\w]{200}",
            ),
        ];
        for (schema, pattern) in cases {
            let started = std::time::Instant::now();
            let (name, message) = ParamSchemas::compile(&[action("bomb", &schema.to_string())])
                .err()
                .unwrap_or_else(|| panic!("{pattern} was not refused"));
            assert_eq!(name, "bomb");
            assert!(
                message.contains("compiles to more than 262144 bytes") && message.contains(pattern),
                "{message}"
            );
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "{pattern} took {:?}",
                started.elapsed()
            );
        }
        // What cannot be bounded is refused with the pattern and what to do, not left to
        // boon: syntax the `regex` crate lacks, and the `x` flag (its comments hide escapes).
        for (pattern, why) in [
            (
                "^(?=a)\\p{L}{200}$",
                "write it in the syntax both ECMA-262 and the Rust `regex` crate accept",
            ),
            ("(?x)\\p{L}\\cJ{200}", "uses the `x` flag"),
            ("\\c1", "write it in the syntax both"),
        ] {
            let schema = json!({"type": "string", "pattern": pattern}).to_string();
            let (_, message) = ParamSchemas::compile(&[action("odd", &schema)])
                .err()
                .unwrap_or_else(|| panic!("{pattern} was not refused"));
            assert!(
                message.contains(why) && message.contains(pattern),
                "{message}"
            );
        }
        // Ordinary ECMA-262 patterns still load, and keep ECMA-262's meaning (`\d` is ASCII).
        let ordinary = [
            "^v[0-9]+\\.[0-9]+\\.[0-9]+$",
            "^[a-z0-9-]+$",
            "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
            "^\\d{1,5}$",
            "^\\w[\\w.-]*\\S$",
            "^\\s*\\cI?$",
        ];
        let properties: serde_json::Map<String, Value> = ordinary
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("p{i}"), json!({"type": "string", "pattern": p})))
            .collect();
        let schema = json!({"type": "object", "properties": properties,
                            "patternProperties": {"^x-[a-z]+$": {"type": "string"}}});
        let s = ParamSchemas::compile(&[action("ok", &schema.to_string())]).unwrap();
        assert_eq!(
            s.check(
                "ok",
                &json!({"p0": "v1.2.3", "p1": "my-app", "p3": "8080", "x-y": "z"})
            ),
            Ok(())
        );
        let e = s.check("ok", &json!({"p3": "\u{661}\u{662}"})).unwrap_err();
        assert!(e.contains("at `/p3`"), "{e}");
    }

    #[test]
    fn the_rewrite_is_boons() {
        // boon 0.6's own `ecma::convert` cases, and the `x` flag it cannot follow.
        for (ecma, boon) in [
            ("ab\\cAcde\\cBfg", "ab\u{1}cde\u{2}fg"),
            ("\\\\comment", "\\\\comment"),
            ("ab\\def", "ab[0-9]ef"),
            ("ab[a-z\\d]ef", "ab[a-z[0-9]]ef"),
            ("ab\\Def", "ab[^0-9]ef"),
            ("ab[a-z\\D]ef", "ab[a-z[^0-9]]ef"),
            ("\\w\\W", "[A-Za-z0-9_][^A-Za-z0-9_]"),
            ("\\(?x\\)", "\\(?x\\)"),
            ("(?i)(?P<x>a)", "(?i)(?P<x>a)"),
        ] {
            assert_eq!(ecma_to_boon(ecma).as_deref(), Some(boon), "{ecma}");
        }
        assert!(ecma_to_boon("\\s").unwrap().contains('\u{feff}'));
        for x in ["(?x)a", "(?ix:a)", "(?-x)a"] {
            assert_eq!(ecma_to_boon(x), None, "{x}");
        }
    }

    #[test]
    fn a_schema_may_not_reference_files_or_urls() {
        for reference in [
            "file:///etc/passwd",
            "https://example.com/s.json",
            "/etc/hostname",
        ] {
            let schema = json!({"$ref": reference}).to_string();
            let (name, message) = ParamSchemas::compile(&[action("sneaky", &schema)])
                .err()
                .unwrap();
            assert_eq!(name, "sneaky");
            assert!(
                !message.contains("root:"),
                "no file content may leak: {message}"
            );
        }
    }
}
