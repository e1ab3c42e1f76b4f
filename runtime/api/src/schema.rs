//! Hand-written schema pieces that the derive cannot express, shared by the resource types.
//!
//! Every function here returns a schema the API server accepts as *structural*: a `type`
//! on every node (or `x-kubernetes-int-or-string` / `x-kubernetes-preserve-unknown-fields`
//! where the value is deliberately free-form), and no `anyOf`/`oneOf` that would make the
//! structure depend on the value.

use schemars::{Schema, SchemaGenerator, json_schema};

/// A free-form JSON object kept as the user wrote it (plugin params, policy data).
///
/// The API server stores it without pruning; the consumer (the plugin's own params schema,
/// the policy) validates it.
pub fn free_form_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// `rollout.maxUnavailable`: an integer from 1 to 10000 or a percentage from `1%` to `100%`.
///
/// An int-or-string node cannot carry `pattern` or `minimum` in a structural schema, so the
/// check is a CEL rule on the value's string form. That form cannot tell `3` from `"3"`, so
/// a string of digits is accepted and means a count, as the planner reads it. The count is
/// bounded (10000 is more nodes than a group sensibly holds; the planner caps it at the
/// group's size anyway) so that neither form can carry a number the planner's integer
/// types cannot hold: an integer beyond 32 bits, or a string such as `"99999999999"`.
pub fn max_unavailable(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "How many worker nodes may be worked on at the same time: an integer from 1 to 10000 (`2`, also accepted as the string `\"2\"`) or a percentage of the group's nodes from 1% to 100% (`\"25%\"`). A percentage is rounded down, with a floor of 1. Control-plane nodes are always done one at a time, whatever this says. Default 1.",
        "default": 1,
        "x-kubernetes-int-or-string": true,
        "x-kubernetes-validations": [{
            "rule": "string(self).matches('^([1-9][0-9]{0,3}|10000|(100|[1-9][0-9]?)%)$')",
            "message": "rollout.maxUnavailable must be a positive integer up to 10000 (for example 2) or a percentage from 1% to 100% (for example \"25%\"); 0 would never let a node start",
            // The API server shows an Invalid refusal of a rule as `Invalid value: <the
            // schema's type>`, and an int-or-string has none: `Invalid value: ""`, which
            // reads as if the field were empty. Forbidden prints the message alone.
            "reason": "FieldValueForbidden",
        }],
    })
}

/// A label selector with `matchLabels` and `matchExpressions`, as in the core API, with
/// the operator written as an enum so a typo is refused by the API server.
///
/// The k8s-openapi `LabelSelector` schema is not used because its `operator` is a free
/// string and its description is long; the wire format is the same.
pub fn label_selector(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Selects nodes by their labels: all of `matchLabels` and all of `matchExpressions` must hold. An empty selector selects every node.",
        "type": "object",
        "properties": {
            "matchLabels": {
                "description": "Label key → value; every pair must be present on the node.",
                "type": "object",
                "additionalProperties": { "type": "string" },
            },
            "matchExpressions": {
                "description": "Requirements on labels; every one must hold.",
                "type": "array",
                "maxItems": 16,
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": { "type": "string", "minLength": 1, "maxLength": 317 },
                        "operator": {
                            "type": "string",
                            "enum": ["In", "NotIn", "Exists", "DoesNotExist"],
                        },
                        "values": {
                            "type": "array",
                            "maxItems": 64,
                            "items": { "type": "string", "maxLength": 63 },
                        },
                    },
                    "x-kubernetes-validations": [{
                        "rule": "self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : !has(self.values) || size(self.values) == 0",
                        "message": "matchExpressions: operators In and NotIn need a non-empty `values` list; Exists and DoesNotExist take no `values`",
                    }],
                },
            },
        },
    })
}
