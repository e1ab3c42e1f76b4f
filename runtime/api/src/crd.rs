//! The generated CustomResourceDefinitions, and the checked-in YAML under `deploy/crds/`.
//!
//! `deploy/crds/` holds one file per CRD, written by `crdgen`
//! (`cargo run -p bosun-api --bin crdgen -- deploy/crds`). A test regenerates them in
//! memory and fails when the checked-in files drift from the Rust types.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{ClusterLifecycle, NodeReport, NodeTask, Operation, Plugin, Policy};

/// Why a CRD could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("could not render CRD {name} as YAML: {source}")]
    Yaml {
        name: String,
        #[source]
        source: serde_yaml::Error,
    },
}

/// Every Bosun CRD with the file name it is checked in under, in a stable order.
///
/// These are the CRDs to install (they are what `deploy/crds/` holds): use them rather than
/// `Operation::crd()` and friends, which still carry `nullable` markers (see
/// [`drop_nullable`]).
pub fn all() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        ("operations.bosun.dev.yaml", finish(Operation::crd())),
        ("nodetasks.bosun.dev.yaml", finish(NodeTask::crd())),
        ("plugins.bosun.dev.yaml", finish(Plugin::crd())),
        ("policies.bosun.dev.yaml", finish(Policy::crd())),
        ("clusterlifecycles.bosun.dev.yaml", {
            let (lowering, message) = crate::lifecycle::lowering_rule();
            with_root_rule(
                with_root_rule(
                    finish(ClusterLifecycle::crd()),
                    "self.metadata.name == 'cluster'",
                    "a ClusterLifecycle must be named `cluster`: there is one per cluster",
                ),
                &lowering,
                message,
            )
        }),
        (
            "nodereports.bosun.dev.yaml",
            with_root_rule(
                finish(NodeReport::crd()),
                "self.metadata.name == self.spec.nodeName",
                "a NodeReport is named after its node: metadata.name must equal spec.nodeName",
            ),
        ),
    ]
}

/// Adds a CEL rule on the whole object (the derive can only put rules on the spec and
/// below, and rules about `metadata.name` belong at the root).
fn with_root_rule(
    mut crd: CustomResourceDefinition,
    rule: &str,
    message: &str,
) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            let mut value = serde_json::to_value(&*schema).expect("a JSONSchemaProps serializes");
            let rules = value
                .as_object_mut()
                .expect("a schema is an object")
                .entry("x-kubernetes-validations")
                .or_insert_with(|| serde_json::json!([]));
            if let Some(list) = rules.as_array_mut() {
                list.push(serde_json::json!({ "rule": rule, "message": message }));
            }
            *schema = serde_json::from_value(value).expect("adding a rule keeps the schema valid");
        }
    }
    crd
}

fn finish(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            // Round-trip through JSON: the typed JSONSchemaProps has a field per keyword,
            // and a generic walk is simpler on a Value.
            let mut value = serde_json::to_value(&*schema).expect("a JSONSchemaProps serializes");
            drop_nullable(&mut value);
            *schema =
                serde_json::from_value(value).expect("removing a keyword keeps the schema valid");
        }
    }
    crd
}

/// Removes every `nullable: true` from a schema.
///
/// The derive marks each `Option` field `nullable`. For an optional field that is wrong in
/// two ways: the API server would store an explicit `null`, and CEL's `has()` is true for
/// a stored null, so `upgrade: null` plus `custom: {...}` would break the "exactly one
/// kind" rule with a confusing message. Without `nullable` the API server drops a null
/// before validation and defaulting, so a null means "absent", which is what the Rust
/// side (`Option`, skipped when `None`) means too.
pub fn drop_nullable(schema: &mut serde_json::Value) {
    let Some(map) = schema.as_object_mut() else {
        return;
    };
    if map.get("nullable") == Some(&serde_json::Value::Bool(true)) {
        map.remove("nullable");
    }
    // Walk only the keywords that hold schemas: `default` and `example` hold data, and the
    // keys under `properties` are field names, not keywords.
    for key in ["properties", "patternProperties"] {
        if let Some(serde_json::Value::Object(fields)) = map.get_mut(key) {
            fields.values_mut().for_each(drop_nullable);
        }
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(child) = map.get_mut(key) {
            drop_nullable(child);
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(serde_json::Value::Array(children)) = map.get_mut(key) {
            children.iter_mut().for_each(drop_nullable);
        }
    }
}

/// The text of a checked-in CRD file: a header saying it is generated, then the YAML.
pub fn render(crd: &CustomResourceDefinition) -> Result<String, RenderError> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let yaml = serde_yaml::to_string(crd).map_err(|source| RenderError::Yaml { name, source })?;
    Ok(format!(
        "# Generated from runtime/api by `cargo run -p bosun-api --bin crdgen -- deploy/crds`.\n\
         # Do not edit: change the Rust types and regenerate.\n---\n{yaml}"
    ))
}
