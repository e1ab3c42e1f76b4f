//! Invalid Operations are refused by the real kube-apiserver, from the schema and CEL rules
//! of `deploy/crds/operations.bosun.dev.yaml`: one test per case, named after the case.
//! Each asserts the status code (422 Unprocessable Entity), the field the server blames and
//! that the message says what is wrong. Creations use server-side dry run, so nothing is
//! stored; the immutability cases create a real Operation (no controller acts on it: none
//! runs in this binary) and delete it afterwards.
//!
//! Controls: every Operation, Plugin and Policy example in `deploy/examples/` is accepted,
//! rollout controls may change after creation, and an explicit `null` kind is "absent".

use anyhow::{Context as _, Result, bail, ensure};
use bosun_api::operation::Operation;
use bosun_e2e::{apply_crds, unique, workspace_root};
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

static CRDS: OnceCell<()> = OnceCell::const_new();

/// The lab's client, with the CRDs installed (once per test binary).
async fn client() -> Result<Client> {
    let lab = bosun_lab::ensure_lab().await?;
    CRDS.get_or_try_init(|| async { apply_crds(&lab.client).await })
        .await?;
    Ok(lab.client)
}

fn operations(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<Operation>(&()))
}

fn operation(name: &str, spec: Value) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation",
        "metadata": { "name": name }, "spec": spec,
    }))?)
}

/// A valid custom spec the cases start from.
fn custom() -> Value {
    json!({ "custom": { "groups": [ { "name": "all", "steps": [
        { "name": "greet", "plugin": "hello", "action": "greet" } ] } ] } })
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

/// Asserts the API server refuses `err` with 422 and a message containing every piece of
/// `expected` (the field path and what is wrong).
fn assert_refused<T: std::fmt::Debug>(
    result: Result<T, kube::Error>,
    expected: &[&str],
) -> Result<()> {
    match result {
        Ok(obj) => bail!("the API server accepted what it should refuse: {obj:?}"),
        Err(kube::Error::Api(e)) => {
            ensure!(
                e.code == 422,
                "expected 422 Unprocessable Entity, got {} {}: {}",
                e.code,
                e.reason,
                e.message
            );
            for piece in expected {
                ensure!(
                    e.message.contains(piece),
                    "the message does not say {piece:?}:\n{}",
                    e.message
                );
            }
            Ok(())
        }
        Err(other) => {
            Err(other).context("expected a 422 from the API server, the request failed otherwise")
        }
    }
}

/// Creates (dry run) an Operation with `spec` and expects a refusal mentioning `expected`.
async fn refused(spec: Value, expected: &[&str]) -> Result<()> {
    let client = client().await?;
    let obj = operation(&unique("invalid"), spec)?;
    assert_refused(operations(&client).create(&dry_run(), &obj).await, expected)
}

/// `custom()` with the first group's steps replaced.
fn with_steps(steps: Value) -> Value {
    json!({ "custom": { "groups": [ { "name": "all", "steps": steps } ] } })
}

/// `custom()` with the first group's nodeSelector set.
fn with_group_selector(selector: Value) -> Value {
    json!({ "custom": { "groups": [ { "name": "all", "nodeSelector": selector, "steps": [
        { "name": "greet", "plugin": "hello", "action": "greet" } ] } ] } })
}

fn merge(mut base: Value, extra: Value) -> Value {
    if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    base
}

const ONE_KIND: &str = "an Operation does exactly one kind of work: set exactly one of spec.upgrade, spec.renewCertificates, spec.reboot or spec.custom";
/// The whole refusal, field first: `Forbidden`, not `Invalid value: ""` (an int-or-string
/// has no type for the API server to show as the value).
const MAX_UNAVAILABLE_REFUSED: &str = "spec.rollout.maxUnavailable: Forbidden: rollout.maxUnavailable must be a positive integer up to 10000 (for example 2) or a percentage from 1% to 100%";

// --- kind of work

#[tokio::test]
async fn no_operation_kind_is_refused() -> Result<()> {
    refused(
        json!({ "paused": true }),
        &["spec: Invalid value", ONE_KIND],
    )
    .await
}

#[tokio::test]
async fn two_operation_kinds_are_refused() -> Result<()> {
    refused(
        merge(
            custom(),
            json!({ "upgrade": { "kubernetesVersion": "v1.34.2" } }),
        ),
        &["spec: Invalid value", ONE_KIND],
    )
    .await
}

#[tokio::test]
async fn three_operation_kinds_are_refused() -> Result<()> {
    let spec = merge(
        custom(),
        json!({ "upgrade": { "kubernetesVersion": "v1.34.2" }, "renewCertificates": {} }),
    );
    refused(spec, &[ONE_KIND]).await
}

#[tokio::test]
async fn a_reboot_with_another_kind_is_refused() -> Result<()> {
    refused(
        json!({ "reboot": {}, "renewCertificates": { "certificates": ["all"] } }),
        &["spec: Invalid value", ONE_KIND],
    )
    .await
}

#[tokio::test]
async fn a_reboot_alert_gate_without_a_url_scheme_is_refused() -> Result<()> {
    refused(
        json!({ "reboot": { "alerts": { "prometheusUrl": "prometheus:9090" } } }),
        &[
            "spec.reboot.alerts.prometheusUrl",
            "spec.reboot.alerts.prometheusUrl must start with http:// or https://, for example http://prometheus-operated.monitoring.svc:9090",
        ],
    )
    .await
}

#[tokio::test]
async fn a_reboot_gate_changed_after_creation_is_refused() -> Result<()> {
    change_refused(
        json!({ "reboot": { "nodes": ["w-1"] } }),
        json!({ "reboot": { "nodes": ["w-1"], "blockingPodSelector": { "matchLabels": { "a": "b" } } } }),
        &["spec.reboot cannot change after creation"],
    )
    .await
}

#[tokio::test]
async fn a_controller_step_that_awaits_a_new_boot_is_refused() -> Result<()> {
    refused(
        with_steps(json!([{ "name": "wait", "runsOn": "controller", "action": "waitNodeReady", "awaitNewBoot": true }])),
        &[
            "spec.custom.groups[0].steps[0]",
            "awaitNewBoot is for a step that reboots the node, which runs on the agent (runsOn: agent)",
        ],
    )
    .await
}

#[tokio::test]
async fn switching_from_reboot_to_another_kind_after_creation_is_refused() -> Result<()> {
    change_refused(
        json!({ "reboot": {} }),
        json!({ "reboot": null, "renewCertificates": { "certificates": ["all"] } }),
        &["the kind of work of an Operation cannot change after creation"],
    )
    .await
}

// --- upgrade

#[tokio::test]
async fn bad_version_format_is_refused() -> Result<()> {
    refused(
        json!({ "upgrade": { "kubernetesVersion": "1.34" } }),
        &[
            "spec.upgrade.kubernetesVersion",
            r"should match '^v\d+\.\d+\.\d+$'",
        ],
    )
    .await
}

#[tokio::test]
async fn version_with_a_suffix_is_refused() -> Result<()> {
    refused(
        json!({ "upgrade": { "kubernetesVersion": "v1.34.2-rc.1" } }),
        &["spec.upgrade.kubernetesVersion", "should match"],
    )
    .await
}

#[tokio::test]
async fn unknown_package_is_refused() -> Result<()> {
    refused(
        json!({ "upgrade": { "kubernetesVersion": "v1.34.2", "packages": ["kube-proxy"] } }),
        &[
            "spec.upgrade.packages[0]",
            "Unsupported value: \"kube-proxy\"",
            "\"kubeadm\"",
        ],
    )
    .await
}

#[tokio::test]
async fn duplicate_package_is_refused() -> Result<()> {
    refused(
        json!({ "upgrade": { "kubernetesVersion": "v1.34.2", "packages": ["kubelet", "kubelet"] } }),
        &["spec.upgrade.packages[1]", "Duplicate value: \"kubelet\""],
    )
    .await
}

// --- rollout

#[tokio::test]
async fn max_unavailable_zero_is_refused() -> Result<()> {
    refused(
        merge(custom(), json!({ "rollout": { "maxUnavailable": 0 } })),
        &[MAX_UNAVAILABLE_REFUSED],
    )
    .await
}

#[tokio::test]
async fn max_unavailable_zero_percent_is_refused() -> Result<()> {
    refused(
        merge(custom(), json!({ "rollout": { "maxUnavailable": "0%" } })),
        &[MAX_UNAVAILABLE_REFUSED],
    )
    .await
}

#[tokio::test]
async fn max_unavailable_over_100_percent_is_refused() -> Result<()> {
    refused(
        merge(custom(), json!({ "rollout": { "maxUnavailable": "101%" } })),
        &[MAX_UNAVAILABLE_REFUSED],
    )
    .await
}

#[tokio::test]
async fn max_unavailable_negative_is_refused() -> Result<()> {
    refused(
        merge(custom(), json!({ "rollout": { "maxUnavailable": -1 } })),
        &[MAX_UNAVAILABLE_REFUSED],
    )
    .await
}

#[tokio::test]
async fn max_unavailable_not_a_number_is_refused() -> Result<()> {
    refused(
        merge(custom(), json!({ "rollout": { "maxUnavailable": "abc" } })),
        &[MAX_UNAVAILABLE_REFUSED],
    )
    .await
}

#[tokio::test]
async fn max_unavailable_over_10000_is_refused() -> Result<()> {
    refused(
        merge(custom(), json!({ "rollout": { "maxUnavailable": 10001 } })),
        &[MAX_UNAVAILABLE_REFUSED],
    )
    .await
}

/// Beyond 32 bits: the API server holds it, the planner's integer types could not.
#[tokio::test]
async fn max_unavailable_integer_beyond_32_bits_is_refused() -> Result<()> {
    refused(
        merge(
            custom(),
            json!({ "rollout": { "maxUnavailable": 99_999_999_999_i64 } }),
        ),
        &[MAX_UNAVAILABLE_REFUSED],
    )
    .await
}

#[tokio::test]
async fn max_unavailable_huge_digit_string_is_refused() -> Result<()> {
    refused(
        merge(
            custom(),
            json!({ "rollout": { "maxUnavailable": "99999999999" } }),
        ),
        &[MAX_UNAVAILABLE_REFUSED],
    )
    .await
}

// --- timing

/// 300000000000 seconds (~9500 years) used to crash-loop the controller once the
/// Operation finished (completion time + TTL overflowed the timestamp type).
#[tokio::test]
async fn ttl_seconds_after_finished_over_ten_years_is_refused() -> Result<()> {
    refused(
        merge(
            custom(),
            json!({ "ttlSecondsAfterFinished": 300_000_000_000_i64 }),
        ),
        &[
            "spec.ttlSecondsAfterFinished",
            "should be less than or equal to 315360000",
        ],
    )
    .await
}

#[tokio::test]
async fn ttl_seconds_after_finished_one_over_ten_years_is_refused() -> Result<()> {
    refused(
        merge(custom(), json!({ "ttlSecondsAfterFinished": 315_360_001 })),
        &[
            "spec.ttlSecondsAfterFinished",
            "should be less than or equal to 315360000",
        ],
    )
    .await
}

#[tokio::test]
async fn settle_seconds_over_an_hour_is_refused() -> Result<()> {
    refused(
        merge(
            custom(),
            json!({ "healthGates": { "settleSeconds": 3601 } }),
        ),
        &[
            "spec.healthGates.settleSeconds",
            "should be less than or equal to 3600",
        ],
    )
    .await
}

#[tokio::test]
async fn step_timeout_of_zero_is_refused() -> Result<()> {
    refused(
        merge(custom(), json!({ "stepTimeoutSeconds": 0 })),
        &[
            "spec.stepTimeoutSeconds",
            "should be greater than or equal to 1",
        ],
    )
    .await
}

// --- custom groups and steps

#[tokio::test]
async fn empty_custom_groups_are_refused() -> Result<()> {
    refused(
        json!({ "custom": { "groups": [] } }),
        &[
            "spec.custom.groups",
            "spec.custom.groups is empty: add at least one group",
        ],
    )
    .await
}

#[tokio::test]
async fn more_than_20_groups_are_refused() -> Result<()> {
    let groups: Vec<Value> = (0..21)
        .map(|i| json!({ "name": format!("g{i}"), "steps": [{ "name": "greet", "plugin": "hello", "action": "greet" }] }))
        .collect();
    refused(
        json!({ "custom": { "groups": groups } }),
        &["spec.custom.groups", "must have at most 20 items"],
    )
    .await
}

#[tokio::test]
async fn group_without_steps_is_refused() -> Result<()> {
    refused(
        with_steps(json!([])),
        &["spec.custom.groups[0].steps", "a custom group has no steps"],
    )
    .await
}

#[tokio::test]
async fn duplicate_group_names_are_refused() -> Result<()> {
    let g = json!({ "name": "same", "steps": [{ "name": "greet", "plugin": "hello", "action": "greet" }] });
    refused(
        json!({ "custom": { "groups": [g.clone(), g] } }),
        &["spec.custom.groups[1]", "Duplicate value"],
    )
    .await
}

#[tokio::test]
async fn group_name_not_a_dns_label_is_refused() -> Result<()> {
    let spec = json!({ "custom": { "groups": [ { "name": "Workers", "steps": [
        { "name": "greet", "plugin": "hello", "action": "greet" } ] } ] } });
    refused(
        spec,
        &[
            "spec.custom.groups[0].name",
            "should match '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'",
        ],
    )
    .await
}

#[tokio::test]
async fn step_name_not_a_dns_label_is_refused() -> Result<()> {
    refused(
        with_steps(json!([{ "name": "Drain_1", "plugin": "hello", "action": "greet" }])),
        &[
            "spec.custom.groups[0].steps[0].name",
            "Invalid value: \"Drain_1\"",
            "should match",
        ],
    )
    .await
}

#[tokio::test]
async fn duplicate_step_names_are_refused() -> Result<()> {
    let s = json!({ "name": "greet", "plugin": "hello", "action": "greet" });
    refused(
        with_steps(json!([s.clone(), s])),
        &["spec.custom.groups[0].steps[1]", "Duplicate value"],
    )
    .await
}

#[tokio::test]
async fn agent_step_without_plugin_is_refused() -> Result<()> {
    refused(
        with_steps(json!([{ "name": "greet", "action": "greet" }])),
        &[
            "spec.custom.groups[0].steps[0]",
            "a step with runsOn: agent needs `plugin`",
        ],
    )
    .await
}

#[tokio::test]
async fn controller_step_with_plugin_is_refused() -> Result<()> {
    refused(
        with_steps(json!([{ "name": "cordon", "runsOn": "controller", "plugin": "hello", "action": "cordon" }])),
        &["spec.custom.groups[0].steps[0]", "a step with runsOn: controller must not name a plugin"],
    )
    .await
}

#[tokio::test]
async fn controller_step_with_unknown_action_is_refused() -> Result<()> {
    refused(
        with_steps(json!([{ "name": "reboot", "runsOn": "controller", "action": "reboot" }])),
        &[
            "spec.custom.groups[0].steps[0]",
            "a controller step's action must be one of cordon, drain, uncordon, waitNodeReady, waitApiServer",
        ],
    )
    .await
}

#[tokio::test]
async fn unknown_runs_on_is_refused() -> Result<()> {
    refused(
        with_steps(
            json!([{ "name": "greet", "runsOn": "node", "plugin": "hello", "action": "greet" }]),
        ),
        &[
            "spec.custom.groups[0].steps[0].runsOn",
            "Unsupported value: \"node\"",
        ],
    )
    .await
}

#[tokio::test]
async fn step_params_that_are_not_an_object_are_refused() -> Result<()> {
    refused(
        with_steps(
            json!([{ "name": "greet", "plugin": "hello", "action": "greet", "params": ["x"] }]),
        ),
        &[
            "spec.custom.groups[0].steps[0].params",
            "must be of type object",
        ],
    )
    .await
}

// --- selectors

#[tokio::test]
async fn match_expression_in_without_values_is_refused() -> Result<()> {
    refused(
        with_group_selector(json!({ "matchExpressions": [{ "key": "zone", "operator": "In" }] })),
        &[
            "spec.custom.groups[0].nodeSelector.matchExpressions[0]",
            "operators In and NotIn need a non-empty `values` list",
        ],
    )
    .await
}

#[tokio::test]
async fn match_expression_exists_with_values_is_refused() -> Result<()> {
    refused(
        merge(custom(), json!({ "nodeSelector": { "matchExpressions": [{ "key": "zone", "operator": "Exists", "values": ["a"] }] } })),
        &["spec.nodeSelector.matchExpressions[0]", "Exists and DoesNotExist take no `values`"],
    )
    .await
}

#[tokio::test]
async fn unknown_selector_operator_is_refused() -> Result<()> {
    refused(
        with_group_selector(
            json!({ "matchExpressions": [{ "key": "zone", "operator": "Near", "values": ["a"] }] }),
        ),
        &[
            "spec.custom.groups[0].nodeSelector.matchExpressions[0].operator",
            "Unsupported value: \"Near\"",
        ],
    )
    .await
}

// --- certificate renewal

#[tokio::test]
async fn all_certificates_combined_with_a_name_is_refused() -> Result<()> {
    refused(
        json!({ "renewCertificates": { "certificates": ["all", "apiserver"] } }),
        &[
            "spec.renewCertificates.certificates",
            "`all` cannot be combined with individual names",
        ],
    )
    .await
}

#[tokio::test]
async fn empty_certificate_list_is_refused() -> Result<()> {
    refused(
        json!({ "renewCertificates": { "certificates": [] } }),
        &[
            "spec.renewCertificates.certificates",
            "must name at least one certificate",
        ],
    )
    .await
}

#[tokio::test]
async fn unknown_certificate_name_is_refused() -> Result<()> {
    refused(
        json!({ "renewCertificates": { "certificates": ["kubelet.conf"] } }),
        &[
            "spec.renewCertificates.certificates[0]",
            "Unsupported value: \"kubelet.conf\"",
        ],
    )
    .await
}

#[tokio::test]
async fn renew_before_in_days_is_refused() -> Result<()> {
    refused(
        json!({ "renewCertificates": { "renewBefore": "30d" } }),
        &[
            "spec.renewCertificates.renewBefore",
            "should match '^([0-9]+h)?([0-9]+m)?([0-9]+s)?$'",
        ],
    )
    .await
}

// --- execution mode and failure policy

#[tokio::test]
async fn unknown_execution_mode_is_refused() -> Result<()> {
    refused(
        merge(custom(), json!({ "executionMode": "Manual" })),
        &[
            "spec.executionMode",
            "Unsupported value: \"Manual\"",
            "\"Controlled\"",
        ],
    )
    .await
}

#[tokio::test]
async fn unknown_failure_mode_is_refused() -> Result<()> {
    refused(
        merge(custom(), json!({ "failurePolicy": { "mode": "Ignore" } })),
        &["spec.failurePolicy.mode", "Unsupported value: \"Ignore\""],
    )
    .await
}

#[tokio::test]
async fn retry_limit_without_retry_mode_is_refused() -> Result<()> {
    refused(
        merge(custom(), json!({ "failurePolicy": { "retryLimit": 2 } })),
        &[
            "spec.failurePolicy",
            "retryLimit and backoffSeconds only apply with mode: Retry",
        ],
    )
    .await
}

#[tokio::test]
async fn retry_limit_over_10_is_refused() -> Result<()> {
    refused(
        merge(
            custom(),
            json!({ "failurePolicy": { "mode": "Retry", "retryLimit": 11 } }),
        ),
        &[
            "spec.failurePolicy.retryLimit",
            "should be less than or equal to 10",
        ],
    )
    .await
}

// --- changes after creation

/// Creates a real Operation with `spec`, applies the merge patch `change` to its spec
/// (dry run) and expects a refusal mentioning `expected`; deletes the Operation.
async fn change_refused(spec: Value, change: Value, expected: &[&str]) -> Result<()> {
    let client = client().await?;
    let api = operations(&client);
    let name = unique("immutable");
    api.create(&PostParams::default(), &operation(&name, spec)?)
        .await
        .context("creating the Operation to change")?;
    let result = api
        .patch(
            &name,
            &PatchParams {
                dry_run: true,
                ..Default::default()
            },
            &Patch::Merge(json!({ "spec": change })),
        )
        .await;
    api.delete(&name, &DeleteParams::default())
        .await
        .context("deleting the test Operation")?;
    assert_refused(result, expected)
}

#[tokio::test]
async fn changing_the_upgrade_version_after_creation_is_refused() -> Result<()> {
    change_refused(
        json!({ "upgrade": { "kubernetesVersion": "v1.34.2" } }),
        json!({ "upgrade": { "kubernetesVersion": "v1.35.0" } }),
        &[
            "spec.upgrade",
            "spec.upgrade cannot change after creation (the plan is derived from it)",
        ],
    )
    .await
}

#[tokio::test]
async fn changing_custom_steps_after_creation_is_refused() -> Result<()> {
    change_refused(
        custom(),
        json!({ "custom": { "groups": [ { "name": "all", "steps": [
            { "name": "greet", "plugin": "hello", "action": "greet", "params": { "name": "x" } } ] } ] } }),
        &["spec.custom", "spec.custom cannot change after creation"],
    )
    .await
}

#[tokio::test]
async fn changing_certificates_after_creation_is_refused() -> Result<()> {
    change_refused(
        json!({ "renewCertificates": {} }),
        json!({ "renewCertificates": { "certificates": ["apiserver"] } }),
        &[
            "spec.renewCertificates",
            "spec.renewCertificates cannot change after creation",
        ],
    )
    .await
}

#[tokio::test]
async fn switching_the_kind_of_work_after_creation_is_refused() -> Result<()> {
    change_refused(
        custom(),
        json!({ "custom": null, "upgrade": { "kubernetesVersion": "v1.34.2" } }),
        &["the kind of work of an Operation cannot change after creation"],
    )
    .await
}

#[tokio::test]
async fn adding_a_node_selector_after_creation_is_refused() -> Result<()> {
    change_refused(
        custom(),
        json!({ "nodeSelector": { "matchLabels": { "zone": "a" } } }),
        &["spec.nodeSelector cannot be added or removed after creation"],
    )
    .await
}

#[tokio::test]
async fn changing_the_node_selector_after_creation_is_refused() -> Result<()> {
    change_refused(
        merge(
            custom(),
            json!({ "nodeSelector": { "matchLabels": { "zone": "a" } } }),
        ),
        json!({ "nodeSelector": { "matchLabels": { "zone": "b" } } }),
        &[
            "spec.nodeSelector",
            "spec.nodeSelector cannot change after creation",
        ],
    )
    .await
}

// --- controls: what must be accepted

#[tokio::test]
async fn rollout_controls_may_change_after_creation() -> Result<()> {
    let client = client().await?;
    let api = operations(&client);
    let name = unique("mutable");
    api.create(&PostParams::default(), &operation(&name, custom())?)
        .await?;
    let change = json!({ "spec": {
        "paused": true, "executionMode": "Controlled", "rollout": { "maxUnavailable": "50%" },
        "healthGates": { "settleSeconds": 30 }, "failurePolicy": { "mode": "Retry", "retryLimit": 3 } } });
    let result = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(change))
        .await;
    api.delete(&name, &DeleteParams::default()).await?;
    let patched = result.context("changing rollout controls was refused")?;
    assert_eq!(patched.data["spec"]["paused"], json!(true));
    assert_eq!(
        patched.data["spec"]["rollout"]["maxUnavailable"],
        json!("50%")
    );
    Ok(())
}

/// The bounds themselves are allowed: the largest count in both forms, 100%, and a TTL of
/// exactly ten years.
#[tokio::test]
async fn the_largest_allowed_values_are_accepted() -> Result<()> {
    let client = client().await?;
    for extra in [
        json!({ "rollout": { "maxUnavailable": 10000 } }),
        json!({ "rollout": { "maxUnavailable": "10000" } }),
        json!({ "rollout": { "maxUnavailable": "100%" } }),
        json!({ "ttlSecondsAfterFinished": 315_360_000 }),
    ] {
        operations(&client)
            .create(
                &dry_run(),
                &operation(&unique("bounds"), merge(custom(), extra.clone()))?,
            )
            .await
            .with_context(|| format!("{extra} was refused"))?;
    }
    Ok(())
}

#[tokio::test]
async fn explicit_null_for_the_other_kinds_is_accepted() -> Result<()> {
    let client = client().await?;
    let spec = merge(
        custom(),
        json!({ "upgrade": null, "renewCertificates": null }),
    );
    operations(&client)
        .create(&dry_run(), &operation(&unique("nulls"), spec)?)
        .await
        .context("an explicit null kind should mean absent")?;
    Ok(())
}

/// Every YAML file under `dir`, recursively, sorted.
fn yaml_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            yaml_files(&path, out)?;
        } else if path.extension().and_then(|e| e.to_str()) == Some("yaml") {
            out.push(path);
        }
    }
    out.sort();
    Ok(())
}

#[tokio::test]
async fn every_example_in_deploy_examples_is_accepted() -> Result<()> {
    let client = client().await?;
    let mut files = Vec::new();
    yaml_files(&workspace_root().join("deploy/examples"), &mut files)?;
    let mut checked = Vec::new();
    for path in files {
        let mut obj: DynamicObject = serde_yaml::from_str(&std::fs::read_to_string(&path)?)
            .with_context(|| format!("parsing {}", path.display()))?;
        let kind = obj
            .types
            .as_ref()
            .map(|t| t.kind.clone())
            .context("an example without apiVersion/kind")?;
        let ar = match kind.as_str() {
            "Operation" => ApiResource::erase::<Operation>(&()),
            "Plugin" => ApiResource::erase::<bosun_api::Plugin>(&()),
            "Policy" => ApiResource::erase::<bosun_api::Policy>(&()),
            "ClusterLifecycle" => {
                // A singleton: the API server admits only the name `cluster`, so the
                // example keeps its name and goes in as a server-side-apply dry run
                // (which also works when the lab holds one).
                let ar = ApiResource::erase::<bosun_api::lifecycle::ClusterLifecycle>(&());
                ensure!(
                    obj.metadata.name.as_deref() == Some("cluster"),
                    "{}: a ClusterLifecycle example must be named `cluster`",
                    path.display()
                );
                Api::<DynamicObject>::all_with(client.clone(), &ar)
                    .patch(
                        "cluster",
                        &PatchParams::apply("bosun-e2e-examples").force().dry_run(),
                        &Patch::Apply(&obj),
                    )
                    .await
                    .with_context(|| format!("{} was refused by the API server", path.display()))?;
                checked.push(format!(
                    "{} ({kind})",
                    path.file_name().unwrap().to_string_lossy()
                ));
                continue;
            }
            other => bail!(
                "{}: unexpected kind {other} among the examples",
                path.display()
            ),
        };
        // A fresh name, so an object of that name left in the lab does not turn the dry
        // run into a conflict.
        obj.metadata.name = Some(unique("example"));
        Api::<DynamicObject>::all_with(client.clone(), &ar)
            .create(&dry_run(), &obj)
            .await
            .with_context(|| format!("{} was refused by the API server", path.display()))?;
        checked.push(format!(
            "{} ({kind})",
            path.file_name().unwrap().to_string_lossy()
        ));
    }
    ensure!(
        checked.iter().filter(|c| c.contains("(Operation)")).count() >= 3,
        "expected the three Operation examples, checked {checked:?}"
    );
    ensure!(
        checked.iter().any(|c| c.contains("(Plugin)"))
            && checked.iter().any(|c| c.contains("(Policy)"))
            && checked.iter().any(|c| c.contains("(ClusterLifecycle)")),
        "{checked:?}"
    );
    Ok(())
}
