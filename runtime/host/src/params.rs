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
/// Longest regular expression, in bytes.
pub(crate) const MAX_PATTERN_BYTES: usize = 1024;
/// Most memory one regular expression may compile to (the `regex` crate's size limit).
/// With [`MAX_PATTERNS`] this bounds what compiling a plugin's patterns can take at
/// 16 MiB; a schema of 25,000 `\p{L}{200}` patterns took 14 GB before these bounds.
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
/// compiles them; `patterns` counts across the plugin's actions.
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
        // Only the compiled size is judged here; a pattern that is not valid Rust regex
        // syntax is left to boon, which converts ECMA-262 syntax first and reports it.
        if let Err(regex::Error::CompiledTooBig(limit)) = regex::RegexBuilder::new(p)
            .size_limit(MAX_PATTERN_COMPILED_BYTES)
            .build()
        {
            let mut shown = p.to_owned();
            crate::sandbox::truncate_utf8(&mut shown, 64);
            return Err(format!(
                "the regular expression `{shown}` compiles to more than {limit} bytes, the host's limit; use a simpler pattern"
            ));
        }
    }
    Ok(())
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
    /// ([`MAX_PATTERNS`], [`MAX_PATTERN_BYTES`], [`MAX_PATTERN_COMPILED_BYTES`]).
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
