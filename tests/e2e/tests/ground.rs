//! Proves the lab is a real Kubernetes control plane: CRDs, watches, server-side apply with
//! field ownership, the status subresource, optimistic concurrency on Leases, garbage
//! collection of owned objects, and real kubeadm files on the simulated nodes.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, CustomResource, CustomResourceExt, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A custom resource that exists only for these tests.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "e2e.bosun.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
struct WidgetSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    color: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
struct WidgetStatus {
    phase: String,
}

const NAMESPACE: &str = "default";
/// Upper bound for things the cluster does asynchronously; reaching it fails the test.
const DEADLINE: Duration = Duration::from_secs(120);

/// A name no earlier run of these tests used (the lab's etcd data outlives test runs).
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

async fn install_crd(client: &Client) -> Result<Api<Widget>> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = Widget::crd_name();
    crds.patch(
        name,
        &PatchParams::apply("bosun-e2e").force(),
        &Patch::Apply(Widget::crd()),
    )
    .await
    .context("applying the Widget CRD")?;
    tokio::time::timeout(
        DEADLINE,
        await_condition(crds, name, conditions::is_crd_established()),
    )
    .await
    .context("the Widget CRD was not Established in time")??;
    Ok(Api::namespaced(client.clone(), NAMESPACE))
}

fn api_error(result: kube::Result<impl std::fmt::Debug>) -> Result<kube::core::Status> {
    match result {
        Err(kube::Error::Api(status)) => Ok(*status),
        other => bail!("expected the API server to refuse the request, got {other:?}"),
    }
}

#[tokio::test]
async fn custom_objects_watch_apply_and_status() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let widgets = install_crd(&lab.client).await?;
    let name = unique("widget");
    let by_name = format!("metadata.name={name}");

    // Watch from "now" so the creation arrives as an event.
    let listed = widgets
        .list_metadata(&ListParams::default().fields(&by_name))
        .await?;
    let rv = listed
        .metadata
        .resource_version
        .context("a list has a resourceVersion")?;
    let mut events = widgets
        .watch(&WatchParams::default().fields(&by_name), &rv)
        .await?
        .boxed();

    // alice creates it by server-side apply.
    let alice = PatchParams::apply("alice");
    let applied = widgets
        .patch(
            &name,
            &alice,
            &Patch::Apply(json!({
                "apiVersion": "e2e.bosun.dev/v1", "kind": "Widget", "metadata": { "name": name },
                "spec": { "size": 5, "color": "red" },
            })),
        )
        .await?;
    assert_eq!(applied.spec.size, Some(5));
    match next_event(&mut events).await? {
        WatchEvent::Added(w) => assert_eq!(
            (w.name_any(), w.spec.color.as_deref()),
            (name.clone(), Some("red"))
        ),
        other => bail!("expected Added, got {other:?}"),
    }

    // Another client edits a different field with a merge patch: the watch sees it.
    let editor = PatchParams {
        field_manager: Some("editor".into()),
        ..PatchParams::default()
    };
    widgets
        .patch(
            &name,
            &editor,
            &Patch::Merge(json!({ "spec": { "note": "hello" } })),
        )
        .await?;
    match next_event(&mut events).await? {
        WatchEvent::Modified(w) => {
            assert_eq!(w.spec.note.as_deref(), Some("hello"));
            assert_eq!(w.spec.size, Some(5), "the merge patch kept alice's fields");
        }
        other => bail!("expected Modified, got {other:?}"),
    }

    // bob applies a field alice owns: a conflict naming alice and the field.
    let bob_wants = json!({ "apiVersion": "e2e.bosun.dev/v1", "kind": "Widget", "metadata": { "name": name }, "spec": { "size": 7 } });
    let status = api_error(
        widgets
            .patch(&name, &PatchParams::apply("bob"), &Patch::Apply(&bob_wants))
            .await,
    )?;
    assert_eq!(status.code, 409, "{status:?}");
    assert!(
        status.message.contains("alice") && status.message.contains(".spec.size"),
        "{}",
        status.message
    );
    assert_eq!(
        widgets.get(&name).await?.spec.size,
        Some(5),
        "a refused apply changes nothing"
    );

    // With force, bob takes the field over; alice keeps the field bob did not apply.
    let forced = widgets
        .patch(
            &name,
            &PatchParams::apply("bob").force(),
            &Patch::Apply(&bob_wants),
        )
        .await?;
    assert_eq!(forced.spec.size, Some(7));
    assert_eq!(forced.spec.color.as_deref(), Some("red"));
    let owned = |manager: &str| -> String {
        forced
            .managed_fields()
            .iter()
            .filter(|m| m.manager.as_deref() == Some(manager))
            .map(|m| serde_json::to_string(&m.fields_v1).unwrap())
            .collect()
    };
    assert!(
        owned("bob").contains("f:size"),
        "bob owns size: {}",
        owned("bob")
    );
    assert!(
        !owned("alice").contains("f:size"),
        "alice lost size: {}",
        owned("alice")
    );
    assert!(
        owned("alice").contains("f:color"),
        "alice keeps color: {}",
        owned("alice")
    );
    assert!(
        owned("editor").contains("f:note"),
        "editor owns note: {}",
        owned("editor")
    );

    // Status through the status subresource: set, and the generation does not move.
    let generation = forced.metadata.generation;
    let with_status = widgets
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "phase": "Ready" } })),
        )
        .await?;
    assert_eq!(
        with_status.status.as_ref().map(|s| s.phase.as_str()),
        Some("Ready")
    );
    assert_eq!(with_status.metadata.generation, generation);
    // The main resource ignores status and a spec change bumps the generation.
    let edited = widgets
        .patch(
            &name,
            &editor,
            &Patch::Merge(json!({ "spec": { "note": "again" }, "status": { "phase": "Forged" } })),
        )
        .await?;
    assert_eq!(edited.status.map(|s| s.phase), Some("Ready".to_string()));
    assert_eq!(edited.metadata.generation, generation.map(|g| g + 1));

    widgets.delete(&name, &DeleteParams::default()).await?;
    Ok(())
}

async fn next_event<S>(events: &mut S) -> Result<WatchEvent<Widget>>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<Widget>>> + Unpin,
{
    loop {
        let event = tokio::time::timeout(DEADLINE, events.try_next())
            .await
            .context("no watch event in time")??
            .context("the watch ended")?;
        // Bookmarks carry no object change.
        if !matches!(event, WatchEvent::Bookmark(_)) {
            return Ok(event);
        }
    }
}

/// A leader-election candidate using a Lease the way client-go's resource lock does: read,
/// then create or replace with the read resourceVersion, so that of two racing candidates the
/// API server lets exactly one win.
struct Candidate {
    leases: Api<Lease>,
    lease: String,
    identity: String,
}

impl Candidate {
    /// Tries to become (or stay) the leader. `Ok(false)` when another holder's lease is current
    /// or another candidate won the race.
    async fn try_acquire_or_renew(&self) -> Result<bool> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let Some(current) = self.leases.get_opt(&self.lease).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.lease.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(3600),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.leases.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            };
        };
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(renewed), Some(secs)) => {
                renewed.0.as_second() + i64::from(secs)
                    < k8s_openapi::jiff::Timestamp::now().as_second()
            }
            _ => true,
        };
        if holder.is_some() && holder.as_deref() != Some(&self.identity) && !expired {
            return Ok(false);
        }
        let changed_hands = holder.as_deref() != Some(&self.identity);
        let mut next = current.clone();
        next.spec = Some(LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(3600),
            acquire_time: if changed_hands {
                Some(now.clone())
            } else {
                spec.acquire_time
            },
            renew_time: Some(now),
            lease_transitions: Some(spec.lease_transitions.unwrap_or(0) + i32::from(changed_hands)),
            ..LeaseSpec::default()
        });
        // `next` carries the resourceVersion we read: a concurrent writer makes this a 409.
        match self
            .leases
            .replace(&self.lease, &PostParams::default(), &next)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Gives the lease up, as client-go does on a clean shutdown.
    async fn release(&self) -> Result<()> {
        let mut lease = self.leases.get(&self.lease).await?;
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        ensure!(
            spec.holder_identity.as_deref() == Some(&self.identity),
            "{} does not hold the lease",
            self.identity
        );
        spec.holder_identity = None;
        self.leases
            .replace(&self.lease, &PostParams::default(), &lease)
            .await?;
        Ok(())
    }
}

/// The API server's part of leader election, which the controller's `leader.rs` relies on:
/// on a Lease, a current holder is kept, a write with a stale resourceVersion is refused with
/// 409 Conflict, and a released Lease is taken over with the transition counted. The
/// candidates are this test's own (a client-go style lock); the controller's leader election
/// itself is tested in controller_actions.rs
/// (`leader_election_only_the_lease_holder_acts_and_the_standby_takes_over_when_it_dies`).
#[tokio::test]
async fn lease_writes_are_serialised_by_resource_version_so_one_candidate_holds_it() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let leases: Api<Lease> = Api::namespaced(lab.client.clone(), NAMESPACE);
    let lease = unique("leader");
    let a = Candidate {
        leases: leases.clone(),
        lease: lease.clone(),
        identity: "candidate-a".into(),
    };
    let b = Candidate {
        leases: leases.clone(),
        lease: lease.clone(),
        identity: "candidate-b".into(),
    };

    assert!(
        a.try_acquire_or_renew().await?,
        "a creates the lease and leads"
    );
    assert!(
        !b.try_acquire_or_renew().await?,
        "b must not take a current lease"
    );
    assert!(a.try_acquire_or_renew().await?, "a renews");

    // b read the lease before a's renewal: its write with the stale resourceVersion is refused.
    let mut stale = leases.get(&lease).await?;
    assert!(a.try_acquire_or_renew().await?, "a renews again");
    stale.spec.as_mut().unwrap().holder_identity = Some("candidate-b".into());
    let status = api_error(leases.replace(&lease, &PostParams::default(), &stale).await)?;
    assert_eq!(
        (status.code, status.reason.as_str()),
        (409, "Conflict"),
        "{status:?}"
    );
    let held = leases.get(&lease).await?.spec.unwrap();
    assert_eq!(held.holder_identity.as_deref(), Some("candidate-a"));

    // a steps down; b takes over and the transition is counted.
    a.release().await?;
    assert!(
        b.try_acquire_or_renew().await?,
        "b acquires a released lease"
    );
    assert!(
        !a.try_acquire_or_renew().await?,
        "a must not take b's current lease"
    );
    let held = leases.get(&lease).await?.spec.unwrap();
    assert_eq!(held.holder_identity.as_deref(), Some("candidate-b"));
    assert_eq!(held.lease_transitions, Some(1));

    leases.delete(&lease, &DeleteParams::default()).await?;
    Ok(())
}

#[tokio::test]
async fn garbage_collector_deletes_owned_objects() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let widgets = install_crd(&lab.client).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(lab.client.clone(), NAMESPACE);
    let name = unique("owner");
    let owner = widgets
        .patch(&name, &PatchParams::apply("bosun-e2e"), &Patch::Apply(json!({
            "apiVersion": "e2e.bosun.dev/v1", "kind": "Widget", "metadata": { "name": name }, "spec": { "size": 1 },
        })))
        .await?;
    let dependent = ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("{name}-dependent")),
            owner_references: Some(vec![OwnerReference {
                api_version: Widget::api_version(&()).into_owned(),
                kind: Widget::kind(&()).into_owned(),
                name: name.clone(),
                uid: owner.uid().context("a created object has a uid")?,
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    let dependent = config_maps
        .create(&PostParams::default(), &dependent)
        .await?;
    let uid = dependent.uid().unwrap();

    widgets.delete(&name, &DeleteParams::background()).await?;
    // kube-controller-manager's garbage collector removes the dependent.
    tokio::time::timeout(
        DEADLINE,
        await_condition(
            config_maps.clone(),
            &dependent.name_any(),
            conditions::is_deleted(&uid),
        ),
    )
    .await
    .context("the garbage collector did not delete the owned ConfigMap in time")??;
    assert!(config_maps.get_opt(&dependent.name_any()).await?.is_none());
    Ok(())
}

#[tokio::test]
async fn simulated_nodes_have_real_kubeadm_roots() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    // The lab cycles the OS by node, so two nodes already mix the families; a smaller lab
    // cannot show it, and this test would check less than it says.
    ensure!(
        lab.nodes.len() >= 2,
        "this test needs a lab of at least 2 nodes to check mixed OS families, found {}: \
         start it with `lab up --nodes 4` (or BOSUN_LAB_NODES=4, the default shape)",
        lab.nodes.len()
    );
    let nodes: Api<Node> = Api::all(lab.client.clone());
    let server_version = lab.client.apiserver_version().await?.git_version;
    assert_eq!(
        server_version, lab.kubernetes_version,
        "the API server reports the pinned version"
    );
    ensure!(
        lab.nodes
            .iter()
            .any(|n| n.role == bosun_lab::Role::ControlPlane),
        "the lab has a control-plane node: {:?}",
        lab.nodes
    );

    let mut families = BTreeSet::new();
    for node in &lab.nodes {
        let object = nodes.get(&node.name).await?;
        let status = object.status.clone().unwrap_or_default();
        let ready = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready");
        assert_eq!(
            ready.map(|c| c.status).as_deref(),
            Some("True"),
            "{} is Ready",
            node.name
        );
        let labels = object.labels();
        let taints = object
            .spec
            .clone()
            .unwrap_or_default()
            .taints
            .unwrap_or_default();
        let cp_taint = taints
            .iter()
            .any(|t| t.key == "node-role.kubernetes.io/control-plane" && t.effect == "NoSchedule");
        let is_cp = node.role == bosun_lab::Role::ControlPlane;
        assert_eq!(
            labels.contains_key("node-role.kubernetes.io/control-plane"),
            is_cp,
            "{}",
            node.name
        );
        assert_eq!(cp_taint, is_cp, "{} taints: {taints:?}", node.name);

        let root = &node.host_root;
        let os_release = std::fs::read_to_string(root.join("etc/os-release"))?;
        let field = |key: &str| {
            os_release
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .map(|v| v.trim_matches('"').to_string())
                .unwrap_or_default()
        };
        let like = format!("{} {}", field("ID"), field("ID_LIKE"));
        families.insert(if like.contains("rhel") {
            "rhel"
        } else if like.contains("debian") {
            "debian"
        } else {
            "other"
        });

        // The node's own copy of the real kubeadm reports the lab's version.
        let out = std::process::Command::new(root.join("usr/bin/kubeadm"))
            .args(["version", "-o", "short"])
            .output()?;
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            lab.kubernetes_version
        );

        if is_cp {
            let manifests = root.join("etc/kubernetes/manifests");
            for m in [
                "etcd",
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
            ] {
                ensure!(
                    manifests.join(format!("{m}.yaml")).is_file(),
                    "{} lacks the {m} manifest",
                    node.name
                );
            }
            let apiserver = std::fs::read_to_string(manifests.join("kube-apiserver.yaml"))?;
            assert!(apiserver.contains(&format!(
                "image: registry.k8s.io/kube-apiserver:{}",
                lab.kubernetes_version
            )));
            assert!(apiserver.contains(&format!("--advertise-address={}", node.internal_ip)));
            // kubeadm, chrooted into the root, reads the node's certificates and kubeconfigs.
            let out = lab
                .kubeadm_in_root(
                    node,
                    &[
                        "certs",
                        "check-expiration",
                        "--config",
                        "/etc/kubernetes/kubeadm-config.yaml",
                    ],
                )
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            ensure!(
                out.status.success(),
                "check-expiration failed: {}{text}",
                String::from_utf8_lossy(&out.stderr)
            );
            for cert in [
                "apiserver ",
                "apiserver-etcd-client",
                "etcd-server",
                "super-admin.conf",
            ] {
                assert!(text.contains(cert), "check-expiration lists {cert}: {text}");
            }
            // The node's admin.conf, signed by the shared cluster CA, works against the lab.
            let kubeconfig =
                kube::config::Kubeconfig::read_from(root.join("etc/kubernetes/admin.conf"))?;
            let config =
                kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
            let node_admin = Client::try_from(config)?;
            let seen = Api::<Node>::all(node_admin)
                .list(&ListParams::default())
                .await?;
            assert!(seen.iter().any(|n| n.name_any() == node.name));
        } else {
            assert!(root.join("etc/kubernetes/kubelet.conf").is_file());
            assert!(root.join("etc/kubernetes/pki/ca.crt").is_file());
            assert!(
                !root.join("etc/kubernetes/pki/ca.key").exists(),
                "a worker holds no CA key"
            );
        }
    }
    assert!(
        families.contains("debian") && families.contains("rhel"),
        "mixed OS families: {families:?}"
    );
    Ok(())
}
