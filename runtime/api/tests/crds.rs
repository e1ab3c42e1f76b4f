//! The checked-in CRDs match the Rust types, are structural, and carry validation rules
//! that accept good objects and refuse bad ones with the intended message.
//!
//! CEL rules are evaluated client-side with kube-cel (defaults applied first, as the API
//! server does). OpenAPI keywords (`pattern`, `enum`, `maxLength`) are checked by looking
//! at the schema; the end-to-end tests prove them against a real API server.

use std::path::PathBuf;

use bosun_api::crd;
use serde_json::{Value, json};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn schema_of(kind_file: &str) -> Value {
    let (_, crd) = crd::all()
        .into_iter()
        .find(|(f, _)| *f == kind_file)
        .unwrap_or_else(|| panic!("no CRD for {kind_file}"));
    let version = &crd.spec.versions[0];
    serde_json::to_value(
        version
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

/// Follows `properties` (and `items` for `[]`) down a dotted path.
fn at<'a>(schema: &'a Value, path: &str) -> &'a Value {
    let mut node = schema;
    for part in path.split('.') {
        node = if part == "[]" {
            &node["items"]
        } else {
            &node["properties"][part]
        };
        assert!(!node.is_null(), "schema has no {path} (stopped at {part})");
    }
    node
}

fn rules(node: &Value) -> Vec<(String, String)> {
    node["x-kubernetes-validations"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| {
                    (
                        r["rule"].as_str().unwrap().to_string(),
                        r["message"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn checked_in_crds_match_the_rust_types() {
    let dir = repo_root().join("deploy/crds");
    let regen = "regenerate with `cargo run -p bosun-api --bin crdgen -- deploy/crds` and commit the result";
    let mut expected_files = Vec::new();
    for (file, crd) in crd::all() {
        expected_files.push(file.to_string());
        let want = crd::render(&crd).unwrap();
        let path = dir.join(file);
        let have = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{} is missing ({e}): {regen}", path.display()));
        assert!(
            have == want,
            "{} differs from the Rust types in runtime/api: {regen}",
            path.display()
        );
    }
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    expected_files.sort();
    assert_eq!(
        found, expected_files,
        "deploy/crds holds files that no CRD generates: remove them, or {regen}"
    );
}

/// Every node of a structural schema has a type (or is explicitly int-or-string or
/// free-form), and nothing makes the structure depend on the value.
fn assert_structural(path: &str, node: &Value) {
    let obj = node
        .as_object()
        .unwrap_or_else(|| panic!("{path}: schema is not an object: {node}"));
    for banned in [
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "$ref",
        "nullable",
        "definitions",
        "$defs",
    ] {
        assert!(
            !obj.contains_key(banned),
            "{path}: `{banned}` is not allowed here: {node}"
        );
    }
    let typed = obj.contains_key("type")
        || obj.get("x-kubernetes-int-or-string") == Some(&json!(true))
        || obj.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
    assert!(typed, "{path}: node has no type: {node}");
    if let Some(Value::Object(props)) = obj.get("properties") {
        for (name, child) in props {
            assert_structural(&format!("{path}.{name}"), child);
        }
        // A list-type map needs its keys to be required in the item.
        if let Some(required) = obj.get("required") {
            for r in required.as_array().unwrap() {
                assert!(
                    props.contains_key(r.as_str().unwrap()),
                    "{path}: required field {r} is not a property"
                );
            }
        }
    }
    if let Some(items) = obj.get("items") {
        assert_structural(&format!("{path}[]"), items);
    }
    if let Some(additional) = obj.get("additionalProperties")
        && additional.is_object()
    {
        assert_structural(&format!("{path}{{}}"), additional);
    }
    if obj.get("x-kubernetes-list-type") == Some(&json!("map")) {
        let keys = obj["x-kubernetes-list-map-keys"].as_array().unwrap();
        let required = obj["items"]["required"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for key in keys {
            assert!(
                required.contains(key),
                "{path}: list-map key {key} must be required in the items"
            );
        }
    }
}

#[test]
fn every_schema_is_structural() {
    for (file, _) in crd::all() {
        assert_structural(file, &schema_of(file));
    }
}

#[test]
fn every_cel_rule_compiles() {
    for (file, _) in crd::all() {
        let compiled = kube_cel::compile_schema(&schema_of(file));
        let errors: Vec<String> = compiled
            .compilation_errors()
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "{file}: CEL rules that do not compile: {errors:#?}"
        );
    }
}

#[test]
fn crds_are_cluster_scoped_with_names_columns_and_status_where_written() {
    let want = [
        (
            "operations.bosun.dev.yaml",
            "Operation",
            "op",
            vec!["Phase", "Progress", "Mode", "Age", "Message"],
        ),
        (
            "nodetasks.bosun.dev.yaml",
            "NodeTask",
            "nt",
            vec!["Node", "Operation", "Phase", "Step", "Age", "Message"],
        ),
        (
            "plugins.bosun.dev.yaml",
            "Plugin",
            "bplugin",
            vec!["Version", "Age"],
        ),
        (
            "policies.bosun.dev.yaml",
            "Policy",
            "bpolicy",
            vec!["Enforcement", "Compiled", "Age"],
        ),
    ];
    let all = crd::all();
    for (file, kind, short, columns) in want {
        let (_, crd) = all.iter().find(|(f, _)| *f == file).unwrap();
        assert_eq!(crd.spec.group, "bosun.dev");
        assert_eq!(crd.spec.scope, "Cluster", "{kind} must be cluster-scoped");
        assert_eq!(crd.spec.names.kind, kind);
        assert!(
            crd.spec
                .names
                .short_names
                .as_ref()
                .unwrap()
                .contains(&short.to_string())
        );
        assert!(
            crd.spec
                .names
                .categories
                .as_ref()
                .unwrap()
                .contains(&"bosun".to_string())
        );
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        // The Plugin has no status (nothing writes one): the_plugin_crd_has_no_status_nobody_writes.
        if kind != "Plugin" {
            assert!(
                version.subresources.as_ref().unwrap().status.is_some(),
                "{kind} needs the status subresource"
            );
        }
        let have: Vec<&str> = version
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .filter(|c| c.priority.unwrap_or(0) == 0)
            .map(|c| c.name.as_str())
            .collect();
        for c in columns {
            assert!(
                have.contains(&c),
                "{kind}: printer column {c} missing from {have:?}"
            );
        }
    }
}

#[test]
fn schema_keywords_carry_the_intended_constraints() {
    let op = schema_of("operations.bosun.dev.yaml");
    assert_eq!(
        at(&op, "spec.upgrade.kubernetesVersion")["pattern"],
        r"^v\d+\.\d+\.\d+$"
    );
    assert_eq!(
        at(&op, "spec.executionMode")["enum"],
        json!(["Auto", "Controlled", "DryRun"])
    );
    assert_eq!(at(&op, "spec.executionMode")["default"], "Auto");
    assert_eq!(
        at(&op, "spec.failurePolicy.mode")["enum"],
        json!(["Block", "Retry"])
    );
    assert_eq!(
        at(&op, "spec.custom.groups.[].steps.[].runsOn")["enum"],
        json!(["agent", "controller"])
    );
    let dns_label = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
    assert_eq!(
        at(&op, "spec.custom.groups.[].steps.[].name")["pattern"],
        dns_label
    );
    assert_eq!(
        at(&op, "spec.custom.groups.[].steps.[].name")["maxLength"],
        63
    );
    assert_eq!(at(&op, "spec.custom.groups.[].name")["pattern"], dns_label);
    assert_eq!(
        at(&op, "spec.custom.groups.[].steps.[].params")["x-kubernetes-preserve-unknown-fields"],
        true
    );
    let ttl = at(&op, "spec.ttlSecondsAfterFinished");
    assert_eq!(ttl["minimum"].as_f64(), Some(0.0));
    assert_eq!(ttl["maximum"].as_f64(), Some(315_360_000.0));
    assert_eq!(bosun_api::operation::MAX_TTL_SECONDS, 315_360_000);
    let mu = at(&op, "spec.rollout.maxUnavailable");
    assert_eq!(mu["x-kubernetes-int-or-string"], true);
    assert_eq!(mu["default"], 1);
    assert_eq!(
        at(&op, "spec.custom.groups")["x-kubernetes-list-type"],
        "map"
    );
    assert_eq!(at(&op, "status.phase")["enum"].as_array().unwrap().len(), 7);
    assert_eq!(
        at(&op, "status.conditions")["x-kubernetes-list-map-keys"],
        json!(["type"])
    );

    let nt = schema_of("nodetasks.bosun.dev.yaml");
    assert_eq!(at(&nt, "spec.recovery")["enum"], json!(["Retry", "Skip"]));
    assert_eq!(at(&nt, "status.steps.[].logTail")["maxItems"], 50);
    assert_eq!(
        at(&nt, "status.phase")["enum"],
        json!([
            "Pending",
            "AwaitingApproval",
            "Running",
            "Blocked",
            "Succeeded",
            "Skipped",
            "Invalid"
        ])
    );

    let plugin = schema_of("plugins.bosun.dev.yaml");
    assert_eq!(
        at(&plugin, "spec.sha256")["pattern"],
        "^sha256:[0-9a-f]{64}$"
    );
    assert_eq!(
        at(&plugin, "spec.signatures.[].algorithm")["enum"],
        json!(["ed25519", "ecdsa-p256-sha256"])
    );
    assert_eq!(
        at(&plugin, "spec.source.url.url")["pattern"],
        r"^https://[^\s]+$"
    );
    assert_eq!(
        at(&plugin, "spec.grants.filesystem.[].access")["enum"],
        json!(["ReadOnly", "ReadWrite"])
    );

    let policy = schema_of("policies.bosun.dev.yaml");
    assert_eq!(
        at(&policy, "spec.enforcement")["enum"],
        json!(["Deny", "Warn", "Audit"])
    );
    assert_eq!(at(&policy, "spec.enforcement")["default"], "Deny");
    assert_eq!(
        at(&policy, "spec.data")["x-kubernetes-preserve-unknown-fields"],
        true
    );

    // Every CEL rule has a message (the API server's default "failed rule: ..." says
    // nothing about what to do).
    for (file, _) in crd::all() {
        let mut missing = Vec::new();
        collect_rules_without_message(&schema_of(file), file, &mut missing);
        assert!(missing.is_empty(), "rules without a message: {missing:?}");
    }
}

fn collect_rules_without_message(node: &Value, path: &str, out: &mut Vec<String>) {
    for (rule, message) in rules(node) {
        if message.is_empty() {
            out.push(format!("{path}: {rule}"));
        }
    }
    if let Some(Value::Object(props)) = node.get("properties") {
        for (name, child) in props {
            collect_rules_without_message(child, &format!("{path}.{name}"), out);
        }
    }
    if let Some(items) = node.get("items") {
        collect_rules_without_message(items, &format!("{path}[]"), out);
    }
}

// ---- CEL behaviour ----

fn validate(file: &str, object: &Value, old: Option<&Value>) -> Result<(), Vec<String>> {
    kube_cel::Validator::new()
        .validate(&schema_of(file), object, old)
        .map_err(|errs| errs.into_vec().into_iter().map(|e| e.to_string()).collect())
}

fn op(spec: Value) -> Value {
    json!({"apiVersion": "bosun.dev/v1alpha1", "kind": "Operation", "metadata": {"name": "x"}, "spec": spec})
}

fn assert_op_ok(spec: Value) {
    if let Err(e) = validate("operations.bosun.dev.yaml", &op(spec.clone()), None) {
        panic!("expected {spec} to be accepted, got {e:?}");
    }
}

fn assert_op_refused(spec: Value, message_part: &str) {
    match validate("operations.bosun.dev.yaml", &op(spec.clone()), None) {
        Ok(()) => panic!("expected {spec} to be refused with {message_part:?}, it was accepted"),
        Err(errors) => assert!(
            errors.iter().any(|e| e.contains(message_part)),
            "expected a message containing {message_part:?} for {spec}, got {errors:?}"
        ),
    }
}

fn upgrade() -> Value {
    json!({"kubernetesVersion": "v1.34.2"})
}

fn custom_step() -> Value {
    json!({"name": "greet", "plugin": "hello", "action": "greet"})
}

#[test]
fn operation_must_name_exactly_one_kind() {
    assert_op_ok(json!({"upgrade": upgrade()}));
    assert_op_ok(json!({"renewCertificates": {}}));
    assert_op_ok(json!({"custom": {"groups": [{"name": "all", "steps": [custom_step()]}]}}));
    assert_op_ok(json!({"reboot": {}}));
    let msg = "set exactly one of spec.upgrade, spec.renewCertificates, spec.reboot or spec.custom";
    assert_op_refused(json!({}), msg);
    assert_op_refused(json!({"reboot": {}, "upgrade": upgrade()}), msg);
    assert_op_refused(json!({"upgrade": upgrade(), "renewCertificates": {}}), msg);
    assert_op_refused(
        json!({"upgrade": upgrade(), "renewCertificates": {}, "custom": {"groups": [{"name": "a", "steps": [custom_step()]}]}}),
        msg,
    );
}

#[test]
fn max_unavailable_takes_positive_integers_and_percentages() {
    for good in [
        json!(1),
        json!(7),
        json!("3"),
        json!("1%"),
        json!("25%"),
        json!("100%"),
        json!(10000),
        json!("10000"),
        json!(9999),
    ] {
        assert_op_ok(json!({"upgrade": upgrade(), "rollout": {"maxUnavailable": good}}));
    }
    for bad in [
        json!(0),
        json!(-1),
        json!("0%"),
        json!("101%"),
        json!("25 %"),
        json!("abc"),
        json!(""),
        json!("05%"),
        // Counts are bounded in both forms: beyond 10000, and far beyond 32 bits.
        json!(10001),
        json!("10001"),
        json!(99_999_999_999_i64),
        json!("99999999999"),
        json!("010"),
    ] {
        assert_op_refused(
            json!({"upgrade": upgrade(), "rollout": {"maxUnavailable": bad}}),
            "rollout.maxUnavailable must be a positive integer",
        );
    }
}

#[test]
fn custom_groups_and_steps_must_not_be_empty() {
    assert_op_refused(
        json!({"custom": {"groups": []}}),
        "spec.custom.groups is empty",
    );
    assert_op_refused(
        json!({"custom": {"groups": [{"name": "a", "steps": []}]}}),
        "a custom group has no steps",
    );
}

#[test]
fn steps_must_match_where_they_run() {
    let group = |step: Value| json!({"custom": {"groups": [{"name": "a", "steps": [step]}]}});
    assert_op_ok(group(
        json!({"name": "drain", "runsOn": "controller", "action": "drain"}),
    ));
    assert_op_refused(
        group(json!({"name": "greet", "action": "greet"})),
        "a step with runsOn: agent needs `plugin`",
    );
    assert_op_refused(
        group(
            json!({"name": "drain", "runsOn": "controller", "plugin": "hello", "action": "drain"}),
        ),
        "a step with runsOn: agent needs `plugin`",
    );
    assert_op_refused(
        group(json!({"name": "reboot", "runsOn": "controller", "action": "reboot"})),
        "a controller step's action must be one of cordon, drain, uncordon, waitNodeReady, waitApiServer",
    );
    assert_op_ok(group(
        json!({"name": "reboot", "plugin": "reboot", "action": "reboot", "awaitNewBoot": true}),
    ));
    assert_op_refused(
        group(
            json!({"name": "wait", "runsOn": "controller", "action": "waitNodeReady", "awaitNewBoot": true}),
        ),
        "awaitNewBoot is for a step that reboots the node, which runs on the agent",
    );
}

#[test]
fn label_selector_operators_need_the_right_values() {
    let sel =
        |expr: Value| json!({"upgrade": upgrade(), "nodeSelector": {"matchExpressions": [expr]}});
    assert_op_ok(sel(
        json!({"key": "zone", "operator": "In", "values": ["a"]}),
    ));
    assert_op_ok(sel(
        json!({"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"}),
    ));
    let msg = "operators In and NotIn need a non-empty `values` list";
    assert_op_refused(sel(json!({"key": "zone", "operator": "In"})), msg);
    assert_op_refused(
        sel(json!({"key": "zone", "operator": "NotIn", "values": []})),
        msg,
    );
    assert_op_refused(
        sel(json!({"key": "zone", "operator": "Exists", "values": ["a"]})),
        msg,
    );
}

#[test]
fn certificates_all_stands_alone() {
    assert_op_ok(json!({"renewCertificates": {"certificates": ["apiserver", "etcd-server"]}}));
    let msg = "`all` cannot be combined with individual names";
    assert_op_refused(
        json!({"renewCertificates": {"certificates": ["all", "apiserver"]}}),
        msg,
    );
    assert_op_refused(json!({"renewCertificates": {"certificates": []}}), msg);
}

#[test]
fn retry_settings_need_retry_mode() {
    assert_op_ok(
        json!({"upgrade": upgrade(), "failurePolicy": {"mode": "Retry", "retryLimit": 2}}),
    );
    assert_op_refused(
        json!({"upgrade": upgrade(), "failurePolicy": {"retryLimit": 2}}),
        "only apply with mode: Retry",
    );
}

#[test]
fn plan_inputs_are_immutable_but_rollout_controls_are_not() {
    let file = "operations.bosun.dev.yaml";
    let old = op(json!({"upgrade": upgrade(), "nodeSelector": {"matchLabels": {"pool": "a"}}}));

    // Pausing, changing the rollout or the mode is fine.
    let new = op(
        json!({"upgrade": upgrade(), "nodeSelector": {"matchLabels": {"pool": "a"}}, "paused": true, "rollout": {"maxUnavailable": 3}, "executionMode": "Controlled"}),
    );
    validate(file, &new, Some(&old)).unwrap();

    let cases = [
        (
            json!({"upgrade": {"kubernetesVersion": "v1.35.0"}, "nodeSelector": {"matchLabels": {"pool": "a"}}}),
            "spec.upgrade cannot change after creation",
        ),
        (
            json!({"upgrade": upgrade(), "nodeSelector": {"matchLabels": {"pool": "b"}}}),
            "spec.nodeSelector cannot change after creation",
        ),
        (
            json!({"upgrade": upgrade()}),
            "spec.nodeSelector cannot be added or removed after creation",
        ),
        (
            json!({"renewCertificates": {}, "nodeSelector": {"matchLabels": {"pool": "a"}}}),
            "the kind of work of an Operation cannot change after creation",
        ),
    ];
    for (spec, message) in cases {
        let errors = validate(file, &op(spec.clone()), Some(&old))
            .expect_err(&format!("{spec} must be refused"));
        assert!(
            errors.iter().any(|e| e.contains(message)),
            "expected {message:?}, got {errors:?}"
        );
    }
}

#[test]
fn node_task_plan_fields_are_immutable_and_approve_recovery_are_not() {
    let file = "nodetasks.bosun.dev.yaml";
    let task = |approve: bool, node: &str| {
        json!({"apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask", "metadata": {"name": "t"},
               "spec": {"operation": "op", "nodeName": node, "group": "workers", "approve": approve,
                        "steps": [{"name": "drain", "runsOn": "controller", "action": "drain"}]}})
    };
    let old = task(false, "n1");
    validate(file, &task(true, "n1"), Some(&old)).unwrap();
    let mut retry = task(false, "n1");
    retry["spec"]["recovery"] = json!("Retry");
    validate(file, &retry, Some(&old)).unwrap();
    let errors = validate(file, &task(false, "n2"), Some(&old)).unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("only approve and recovery are yours to set")),
        "{errors:?}"
    );
}

#[test]
fn plugin_source_is_exactly_one_and_signatures_are_required() {
    let file = "plugins.bosun.dev.yaml";
    let plugin = |source: Value, signatures: Value| {
        json!({"apiVersion": "bosun.dev/v1alpha1", "kind": "Plugin", "metadata": {"name": "p"},
               "spec": {"source": source, "sha256": format!("sha256:{}", "a".repeat(64)), "signatures": signatures}})
    };
    let sig = json!([{"algorithm": "ed25519", "keyId": "k", "signature": "AAAA"}]);
    validate(
        file,
        &plugin(
            json!({"url": {"url": "https://example.test/p.wasm"}}),
            sig.clone(),
        ),
        None,
    )
    .unwrap();
    let both = plugin(
        json!({"url": {"url": "https://x.test/p"}, "oci": {"reference": "r/p:1"}}),
        sig.clone(),
    );
    let errors = validate(file, &both, None).unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("exactly one of oci, url or configMap")),
        "{errors:?}"
    );
    let errors = validate(file, &plugin(json!({}), sig), None).unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("exactly one of oci, url or configMap")),
        "{errors:?}"
    );
    let errors = validate(
        file,
        &plugin(json!({"oci": {"reference": "r/p:1"}}), json!([])),
        None,
    )
    .unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("needs at least one signature")),
        "{errors:?}"
    );
}

#[test]
fn a_backend_names_os_families_as_os_release_spells_them_once_each() {
    let file = "plugins.bosun.dev.yaml";
    let plugin = |families: Value| {
        json!({"apiVersion": "bosun.dev/v1alpha1", "kind": "Plugin", "metadata": {"name": "zypper"},
               "spec": {"source": {"url": {"url": "https://example.test/z.wasm"}},
                        "sha256": format!("sha256:{}", "a".repeat(64)),
                        "signatures": [{"algorithm": "ed25519", "signature": "AAAA"}],
                        "backend": {"for": "packages", "osFamilies": families}}})
    };
    validate(
        file,
        &plugin(json!(["opensuse-leap", "sles", "suse"])),
        None,
    )
    .unwrap();
    for (families, message) in [
        (
            json!(["openSUSE Leap"]),
            "spec.backend.osFamilies holds os-release IDs",
        ),
        (
            json!(["suse", "sles", "suse"]),
            "spec.backend.osFamilies names a family twice",
        ),
    ] {
        let errors = validate(file, &plugin(families.clone()), None).unwrap_err();
        assert!(
            errors.iter().any(|e| e.contains(message)),
            "{families}: {errors:?}"
        );
    }
    let schema = schema_of(file);
    let backend = at(&schema, "spec.backend");
    assert_eq!(at(backend, "osFamilies")["minItems"], json!(1));
    assert_eq!(at(backend, "osFamilies")["maxItems"], json!(32));
    assert!(at(backend, "for")["pattern"].is_string());
}

#[test]
fn policy_needs_rego_source() {
    let file = "policies.bosun.dev.yaml";
    let policy = |rego: &str| json!({"apiVersion": "bosun.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "p"}, "spec": {"rego": rego}});
    validate(file, &policy("package bosun.step\n"), None).unwrap();
    let errors = validate(file, &policy("  \n"), None).unwrap_err();
    assert!(
        errors.iter().any(|e| e.contains("spec.rego is empty")),
        "{errors:?}"
    );
}

#[test]
fn examples_parse_into_the_types_and_pass_the_rules() {
    let dir = repo_root().join("deploy/examples");
    let mut seen = 0;
    // Every YAML file under deploy/examples, subdirectories (plugins/) included.
    let mut files = Vec::new();
    let mut dirs = vec![dir.clone()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                files.push(path);
            }
        }
    }
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let value: Value =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let file = match value["kind"].as_str() {
            Some("Operation") => {
                serde_json::from_value::<bosun_api::Operation>(value.clone()).unwrap();
                "operations.bosun.dev.yaml"
            }
            Some("Plugin") => {
                serde_json::from_value::<bosun_api::Plugin>(value.clone()).unwrap();
                "plugins.bosun.dev.yaml"
            }
            Some("Policy") => {
                serde_json::from_value::<bosun_api::Policy>(value.clone()).unwrap();
                "policies.bosun.dev.yaml"
            }
            Some("ClusterLifecycle") => {
                serde_json::from_value::<bosun_api::ClusterLifecycle>(value.clone()).unwrap();
                "clusterlifecycles.bosun.dev.yaml"
            }
            other => panic!("{}: unexpected kind {other:?}", path.display()),
        };
        validate(file, &value, None).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
        seen += 1;
    }
    assert!(
        seen >= 9,
        "expected the six examples in {} and the four first-party Plugins in its plugins/, found {seen}",
        dir.display()
    );
}

/// Nothing writes a Plugin's status (verification happens per node, per step, and is
/// reported in the NodeTask): the CRD has no status and no column reads one, so
/// `kubectl get bplugin` shows nothing that is always empty.
#[test]
fn the_plugin_crd_has_no_status_nobody_writes() {
    let (_, crd) = crd::all()
        .into_iter()
        .find(|(f, _)| f.contains("plugins"))
        .expect("the Plugin CRD");
    let version = &crd.spec.versions[0];
    let subresources = serde_json::to_value(&version.subresources).unwrap();
    assert!(
        subresources.get("status").is_none(),
        "no status subresource: {subresources}"
    );
    assert!(at(&schema_of_crd(&crd), "spec").is_object());
    assert!(
        schema_of_crd(&crd)["properties"].get("status").is_none(),
        "no status in the schema"
    );
    for column in version.additional_printer_columns.iter().flatten() {
        assert!(
            !column.json_path.starts_with(".status"),
            "column {} reads {}, which nothing writes",
            column.name,
            column.json_path
        );
    }
}

fn schema_of_crd(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Value {
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

fn lifecycle(name: &str, version: &str, rotation: i64) -> Value {
    json!({"apiVersion": "bosun.dev/v1alpha1", "kind": "ClusterLifecycle", "metadata": {"name": name},
           "spec": {"kubernetesVersion": version, "certificates": {"rotation": rotation}}})
}

fn lifecycle_errors(new: &Value, old: Option<&Value>) -> Vec<String> {
    validate("clusterlifecycles.bosun.dev.yaml", new, old)
        .err()
        .unwrap_or_default()
}

#[test]
fn cluster_lifecycle_refuses_downgrades_skips_rotation_decreases_and_bad_versions() {
    let old = lifecycle("cluster", "v1.34.4", 2);
    assert!(lifecycle_errors(&old, None).is_empty());
    // Allowed: a patch, the next minor, a rotation bump, the same object.
    for ok in [
        lifecycle("cluster", "v1.34.5", 2),
        lifecycle("cluster", "v1.35.0", 2),
        lifecycle("cluster", "v1.34.4", 3),
        old.clone(),
    ] {
        let errors = lifecycle_errors(&ok, Some(&old));
        assert!(errors.is_empty(), "{ok} must be accepted: {errors:?}");
    }
    let cases = [
        (lifecycle("cluster", "v1.34.3", 2), "cannot be lowered"),
        (lifecycle("cluster", "v1.33.9", 2), "cannot be lowered"),
        (
            lifecycle("cluster", "v1.36.0", 2),
            "cannot skip a minor version",
        ),
        (
            lifecycle("cluster", "v2.0.0", 2),
            "cannot change its major version",
        ),
        (
            lifecycle("cluster", "v1.34.4", 1),
            "rotation can only increase",
        ),
        (
            lifecycle("cluster", "1.34.4", 2),
            "must be a version like v1.34.4",
        ),
        (
            lifecycle("cluster", "v1.34", 2),
            "must be a version like v1.34.4",
        ),
    ];
    for (new, message) in cases {
        let errors = lifecycle_errors(&new, Some(&old));
        assert!(
            errors.iter().any(|e| e.contains(message)),
            "{new}: expected {message:?}, got {errors:?}"
        );
    }
    // Lowering is allowed down to the highest version a node runs, to withdraw a requested
    // upgrade before it has moved a node; never below it, nor without an observation.
    let observed = |version: &str, highest: &str| {
        let mut c = lifecycle("cluster", version, 2);
        c["status"] = json!({"versions": {"nodes": 3, "nodesAtDesired": 0, "highest": highest}});
        c
    };
    let requested = observed("v1.35.0", "v1.34.4");
    for (new, accepted) in [
        (observed("v1.34.4", "v1.34.4"), true),
        (observed("v1.34.9", "v1.34.4"), true),
        (observed("v1.34.3", "v1.34.4"), false),
        (observed("v1.33.9", "v1.34.4"), false),
        (observed("v1.34.4", "v1.35.0"), false),
        (observed("v1.34.4", "v1.35.1"), false),
        // An observation that does not read as a version allows nothing.
        (observed("v1.34.4", "unknown"), false),
        (lifecycle("cluster", "v1.34.4", 2), false),
    ] {
        let errors = lifecycle_errors(&new, Some(&requested));
        let lowered = errors
            .iter()
            .any(|e| e.contains("cannot be lowered below a version a node runs"));
        assert_eq!(!lowered, accepted, "{new} after {requested}: {errors:?}");
        if accepted {
            assert!(errors.is_empty(), "{new}: {errors:?}");
        }
    }
    let errors = lifecycle_errors(&lifecycle("other", "v1.34.4", 0), None);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("a ClusterLifecycle must be named `cluster`")),
        "{errors:?}"
    );
}

#[test]
fn a_node_report_is_named_after_its_node() {
    let report = |name: &str, node: &str| {
        json!({"apiVersion": "bosun.dev/v1alpha1", "kind": "NodeReport", "metadata": {"name": name},
               "spec": {"nodeName": node, "facts": {"collectedAt": "2026-12-01T00:00:00Z"}}})
    };
    validate("nodereports.bosun.dev.yaml", &report("n1", "n1"), None).unwrap();
    let errors = validate("nodereports.bosun.dev.yaml", &report("n1", "n2"), None).unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("a NodeReport is named after its node")),
        "{errors:?}"
    );
}
