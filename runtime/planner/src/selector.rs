//! Label selector matching, with the semantics of the core API's `LabelSelector`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A selector the planner cannot evaluate. The CRD schema refuses these, so this only
/// happens for objects written around the schema (or by an older schema).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error(
        "label selector operator {operator:?} on key {key:?} is not one of In, NotIn, Exists, DoesNotExist: fix the selector"
    )]
    UnknownOperator { key: String, operator: String },
    #[error(
        "label selector operator {operator} on key {key:?} needs a non-empty `values` list, found none: add the values"
    )]
    MissingValues { key: String, operator: String },
    #[error(
        "label selector operator {operator} on key {key:?} takes no `values`, found {count}: remove them"
    )]
    UnexpectedValues {
        key: String,
        operator: String,
        count: usize,
    },
}

/// True when `labels` satisfy every `matchLabels` pair and every `matchExpressions`
/// requirement. An empty selector matches everything.
pub fn matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let mut all = true;
    if let Some(want) = &selector.match_labels {
        all &= want.iter().all(|(k, v)| labels.get(k) == Some(v));
    }
    for req in selector.match_expressions.iter().flatten() {
        let values = req.values.as_deref().unwrap_or_default();
        let ok = match req.operator.as_str() {
            "In" | "NotIn" => {
                if values.is_empty() {
                    return Err(SelectorError::MissingValues {
                        key: req.key.clone(),
                        operator: req.operator.clone(),
                    });
                }
                let present = labels.get(&req.key).is_some_and(|v| values.contains(v));
                if req.operator == "In" {
                    present
                } else {
                    !present
                }
            }
            "Exists" | "DoesNotExist" => {
                if !values.is_empty() {
                    return Err(SelectorError::UnexpectedValues {
                        key: req.key.clone(),
                        operator: req.operator.clone(),
                        count: values.len(),
                    });
                }
                let present = labels.contains_key(&req.key);
                if req.operator == "Exists" {
                    present
                } else {
                    !present
                }
            }
            other => {
                return Err(SelectorError::UnknownOperator {
                    key: req.key.clone(),
                    operator: other.to_string(),
                });
            }
        };
        // Keep checking the remaining requirements so a malformed one is reported even
        // when an earlier one already failed to match.
        all &= ok;
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: if values.is_empty() {
                    None
                } else {
                    Some(values.iter().map(|v| v.to_string()).collect())
                },
            }]),
        }
    }

    #[test]
    fn empty_selector_matches_everything() {
        assert!(matches(&LabelSelector::default(), &labels(&[])).unwrap());
        assert!(matches(&LabelSelector::default(), &labels(&[("a", "b")])).unwrap());
    }

    #[test]
    fn match_labels_needs_every_pair() {
        let sel = bosun_api::operation::match_labels([("zone", "a"), ("pool", "x")]);
        assert!(
            matches(
                &sel,
                &labels(&[("zone", "a"), ("pool", "x"), ("other", "1")])
            )
            .unwrap()
        );
        assert!(!matches(&sel, &labels(&[("zone", "a")])).unwrap());
        assert!(!matches(&sel, &labels(&[("zone", "b"), ("pool", "x")])).unwrap());
    }

    #[test]
    fn operators() {
        let l = labels(&[("zone", "a"), ("role", "")]);
        assert!(matches(&expr("zone", "In", &["a", "b"]), &l).unwrap());
        assert!(!matches(&expr("zone", "In", &["b"]), &l).unwrap());
        assert!(!matches(&expr("zone", "NotIn", &["a"]), &l).unwrap());
        assert!(matches(&expr("zone", "NotIn", &["b"]), &l).unwrap());
        // NotIn matches nodes without the key, as in Kubernetes.
        assert!(matches(&expr("missing", "NotIn", &["b"]), &l).unwrap());
        assert!(matches(&expr("role", "Exists", &[]), &l).unwrap());
        assert!(!matches(&expr("missing", "Exists", &[]), &l).unwrap());
        assert!(matches(&expr("missing", "DoesNotExist", &[]), &l).unwrap());
        assert!(!matches(&expr("role", "DoesNotExist", &[]), &l).unwrap());
    }

    #[test]
    fn malformed_requirements_are_errors_not_mismatches() {
        let l = labels(&[]);
        assert!(matches!(
            matches(&expr("k", "In", &[]), &l),
            Err(SelectorError::MissingValues { .. })
        ));
        assert!(matches!(
            matches(&expr("k", "Exists", &["v"]), &l),
            Err(SelectorError::UnexpectedValues { .. })
        ));
        assert!(matches!(
            matches(&expr("k", "Equals", &["v"]), &l),
            Err(SelectorError::UnknownOperator { .. })
        ));
    }
}
