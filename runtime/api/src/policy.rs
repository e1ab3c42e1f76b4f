//! The `Policy` resource: a Rego module (and its data) that gates Operations and steps.
//!
//! The controller and agents evaluate every Policy at the decision points of the design
//! (`data.bosun.operation.deny`, `data.bosun.step.deny`, `data.bosun.capabilities.deny`).
//! `enforcement` decides what a non-empty deny set does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema;

/// A Rego policy. Cluster-scoped.
// Each `printcolumn(...)` repeats keys such as `type_ = "string"`, which clippy takes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "bosun.dev",
    version = "v1alpha1",
    kind = "Policy",
    plural = "policies",
    status = "PolicyStatus",
    shortname = "bpolicy",
    category = "bosun",
    derive = "PartialEq",
    doc = "A Policy is a Rego module (with optional data) that Bosun evaluates before Operations and steps; its enforcement decides whether a deny stops the work (Deny) or is only recorded (Warn, Audit).",
    printcolumn(
        name = "Enforcement",
        type_ = "string",
        json_path = ".spec.enforcement"
    ),
    printcolumn(name = "Compiled", type_ = "boolean", json_path = ".status.compiled"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PolicySpec {
    /// The Rego module's source (Rego v1). Its package must be under `bosun.`.
    #[schemars(length(max = 262144))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.trim().size() > 0",
        "message": "spec.rego is empty: put the Rego module's source here (for example `package bosun.step` with `deny contains msg if { ... }`)",
    }]))]
    pub rego: String,

    /// Data the module reads under `data`, a JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::free_form_object")]
    pub data: Option<serde_json::Value>,

    /// What a deny does: `Deny` stops the work, `Warn` records it in status and Events,
    /// `Audit` records it in status only.
    #[serde(default)]
    pub enforcement: Enforcement,
}

/// What a policy's deny does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Enforcement {
    /// Stop the Operation or step; the task is Blocked with the policy's messages.
    #[default]
    Deny,
    /// Let it go on; record the messages in status and as a Warning Event.
    Warn,
    /// Let it go on; record the messages in status only.
    Audit,
}

/// Whether the policy compiles.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// True when the module parsed and compiled.
    #[serde(default)]
    pub compiled: bool,
    /// Compile errors, with line numbers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// `sha256:<hex>` of this policy's name, enforcement, source and data, so a person can
    /// tell which version of it the status (and the decisions citing it) describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Standard conditions: `Compiled`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
