//! The glue between the generated `Guest` trait and [`Plugin`]: turns the ABI's
//! `(action, params JSON)` into the plugin's typed action and its results back into ABI
//! records. Used only through [`export_plugin!`](crate::export_plugin).

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::bindings::exports::bosun::plugin::plugin as wit;
use crate::{Check, Plugin, PluginError, RunContext};

/// `describe` export.
pub fn describe<P: Plugin>() -> wit::Metadata {
    P::metadata().into_wit()
}

/// `preflight` export.
///
/// # Errors
/// `unknown-action` / `bad-params` when the call does not deserialize, otherwise whatever
/// the plugin returns.
pub fn preflight<P: Plugin>(
    action: &str,
    params: &str,
) -> Result<Vec<wit::Check>, wit::PluginError> {
    let action = parse_action::<P::Action>(action, params).map_err(into_wit_error)?;
    P::preflight(&action)
        .map(|checks| checks.into_iter().map(Check::into_wit).collect())
        .map_err(into_wit_error)
}

/// `run` export.
///
/// # Errors
/// `unknown-action` / `bad-params` when the call does not deserialize, otherwise whatever
/// the plugin returns.
pub fn run<P: Plugin>(
    action: &str,
    params: &str,
    context: wit::RunContext,
) -> Result<wit::Outcome, wit::PluginError> {
    let action = parse_action::<P::Action>(action, params).map_err(into_wit_error)?;
    P::run(action, &RunContext::from(context))
        .map(crate::Outcome::into_wit)
        .map_err(into_wit_error)
}

fn into_wit_error(e: PluginError) -> wit::PluginError {
    wit::PluginError {
        code: e.code,
        message: e.message,
        retryable: e.retryable,
    }
}

/// Deserializes `{"action": action, "params": params}` into `A`.
///
/// Empty (or all-whitespace) params mean `{}`. Errors name the action and, for bad params,
/// the path of the offending field (`spec.items[2].name`).
pub(crate) fn parse_action<A: DeserializeOwned>(
    action: &str,
    params: &str,
) -> Result<A, PluginError> {
    let params: Value = if params.trim().is_empty() {
        Value::Object(serde_json::Map::new())
    } else {
        serde_json::from_str(params).map_err(|e| {
            PluginError::new(
                "bad-params",
                format!("params for action `{action}` are not valid JSON: {e}"),
            )
        })?
    };
    let mut call = serde_json::Map::new();
    // serde's adjacently tagged enums read the content without buffering when the tag
    // comes first, which keeps field paths in errors; `Map` iterates keys in order.
    call.insert("action".to_owned(), Value::String(action.to_owned()));
    call.insert("params".to_owned(), params);
    serde_path_to_error::deserialize(Value::Object(call)).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "action" || path == "." {
            // An unknown variant (serde lists the known ones) or an action enum that is
            // not shaped as the SDK expects.
            PluginError::new("unknown-action", format!("action `{action}`: {inner}"))
        } else {
            let field = path
                .strip_prefix("params.")
                .or_else(|| path.strip_prefix("params"))
                .unwrap_or(&path);
            let field = if field.is_empty() {
                "(the params object)"
            } else {
                field
            };
            PluginError::new(
                "bad-params",
                format!("params for action `{action}`, field `{field}`: {inner}"),
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(tag = "action", content = "params", rename_all = "kebab-case")]
    enum Action {
        Greet(Greet),
        Nothing {},
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Greet {
        name: String,
        #[serde(default)]
        times: u32,
        #[serde(default)]
        tags: Vec<Tag>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Tag {
        key: String,
    }

    #[test]
    fn typed_params_arrive() {
        let a: Action = parse_action("greet", r#"{"name":"node-1","times":2}"#).unwrap();
        assert_eq!(
            a,
            Action::Greet(Greet {
                name: "node-1".into(),
                times: 2,
                tags: vec![]
            })
        );
    }

    #[test]
    fn empty_params_mean_empty_object() {
        let a: Action = parse_action("nothing", "  ").unwrap();
        assert_eq!(a, Action::Nothing {});
    }

    #[test]
    fn unknown_action_is_its_own_code() {
        let e = parse_action::<Action>("greeet", "{}").unwrap_err();
        assert_eq!(e.code, "unknown-action");
        assert!(
            e.message.contains("greeet") && e.message.contains("`greet`"),
            "{}",
            e.message
        );
    }

    #[test]
    fn wrong_type_names_the_field() {
        let e = parse_action::<Action>("greet", r#"{"name":"a","times":"two"}"#).unwrap_err();
        assert_eq!(e.code, "bad-params");
        assert!(e.message.contains("field `times`"), "{}", e.message);
        assert!(!e.retryable);
    }

    #[test]
    fn nested_field_path_is_named() {
        let e = parse_action::<Action>("greet", r#"{"name":"a","tags":[{"key":"k"},{"key":7}]}"#)
            .unwrap_err();
        assert_eq!(e.code, "bad-params");
        assert!(e.message.contains("field `tags[1].key`"), "{}", e.message);
    }

    #[test]
    fn missing_and_unknown_fields_are_named() {
        let e = parse_action::<Action>("greet", "{}").unwrap_err();
        assert_eq!(e.code, "bad-params");
        assert!(e.message.contains("missing field `name`"), "{}", e.message);
        let e = parse_action::<Action>("greet", r#"{"name":"a","nmae":"b"}"#).unwrap_err();
        assert!(e.message.contains("unknown field `nmae`"), "{}", e.message);
    }

    #[test]
    fn invalid_json_is_bad_params() {
        let e = parse_action::<Action>("greet", "{name:").unwrap_err();
        assert_eq!(e.code, "bad-params");
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
    }
}
