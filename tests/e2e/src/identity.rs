//! The deployed identities: `deploy/`'s ServiceAccounts with `deploy/`'s RBAC, as clients
//! (for a test's own calls) and as kubeconfigs (for a controller or agent process), from
//! TokenRequests made with the lab's admin client.

use std::path::Path;
use std::process::{Command, Output};

use anyhow::{Context, Result, ensure};
use bosun_lab::LabHandle;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::{MANAGER, workspace_root};

/// The namespace `deploy/` installs into.
pub const NAMESPACE: &str = "bosun-system";
/// The controller's ServiceAccount (deploy/controller/rbac.yaml).
pub const CONTROLLER_SA: &str = "bosun-controller";
/// The agent's ServiceAccount (deploy/agent/rbac.yaml).
pub const AGENT_SA: &str = "bosun-agent";

/// `kubectl` from the lab's binaries, against the lab, from the workspace root.
pub fn kubectl(lab: &LabHandle, args: &[&str]) -> Result<Output> {
    Command::new(lab.bin_dir.join("kubectl"))
        .env("KUBECONFIG", &lab.kubeconfig)
        .current_dir(workspace_root())
        .args(args)
        .output()
        .with_context(|| format!("running kubectl {}", args.join(" ")))
}

/// Creates the `bosun-system` namespace (server-side apply; harmless when it exists).
pub async fn ensure_namespace(client: &Client) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": NAMESPACE } });
    namespaces
        .patch(NAMESPACE, &PatchParams::apply(MANAGER), &Patch::Apply(ns))
        .await
        .context("creating the bosun-system namespace")?;
    Ok(())
}

/// Applies one of `deploy/`'s files for real (`kubectl apply --server-side`, as an
/// administrator would), into the `bosun-system` namespace it needs.
pub async fn apply_deploy_file(lab: &LabHandle, file: &str) -> Result<()> {
    ensure_namespace(&lab.client).await?;
    let args = [
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager",
        MANAGER,
        "-f",
        file,
    ];
    let out = kubectl(lab, &args)?;
    ensure!(
        out.status.success(),
        "kubectl apply -f {file} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A token of `service_account` in bosun-system, bound to `pod` when given (as the
/// kubelet's projected token of a Pod is, carrying the Pod's node), else bound to nothing.
pub async fn token_of(client: &Client, service_account: &str, pod: Option<&Pod>) -> Result<String> {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    let bound = pod.map(|p| BoundObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(p.name_any()),
        uid: p.uid(),
    });
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            bound_object_ref: bound,
            expiration_seconds: Some(3600),
        },
        ..Default::default()
    };
    let answer = sas
        .create_token_request(service_account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a {service_account} token"))?;
    Ok(answer
        .status
        .context("a TokenRequest without status")?
        .token)
}

/// A client of the lab's API server that authenticates with `token` only (the lab's CA, no
/// client certificate).
pub async fn client_with_token(lab: &LabHandle, token: &str) -> Result<Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(&lab.kubeconfig)?;
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_string().into()),
        ..Default::default()
    };
    Ok(Client::try_from(config)?)
}

/// Writes a kubeconfig for the lab's API server that authenticates with `token` only, for
/// a process to run as that token's identity.
pub fn token_kubeconfig(lab: &LabHandle, token: &str, path: &Path) -> Result<()> {
    let kubeconfig = kube::config::Kubeconfig::read_from(&lab.kubeconfig)?;
    let cluster = kubeconfig
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .context("the lab's kubeconfig has no cluster")?;
    let config = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{ "name": "lab", "cluster": {
            "server": cluster.server, "certificate-authority-data": cluster.certificate_authority_data } }],
        "users": [{ "name": "token", "user": { "token": token } }],
        "contexts": [{ "name": "token", "context": { "cluster": "lab", "user": "token" } }],
        "current-context": "token",
    });
    std::fs::write(path, serde_yaml::to_string(&config)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// A kubeconfig at `path` for the controller's ServiceAccount, with
/// deploy/controller/rbac.yaml applied: a controller process started with it has exactly
/// the deployed controller's rights.
pub async fn controller_kubeconfig(lab: &LabHandle, path: &Path) -> Result<()> {
    apply_deploy_file(lab, "deploy/controller/rbac.yaml").await?;
    let token = token_of(&lab.client, CONTROLLER_SA, None).await?;
    token_kubeconfig(lab, &token, path)
}

/// A stand-in for the agent DaemonSet's Pod on `node` (spec.nodeName set, as the scheduler
/// would): the lab runs no kubelet, so it never starts; only the identity its tokens carry
/// matters.
pub async fn agent_pod(client: &Client, name: &str, node: &str) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name },
        "spec": { "serviceAccountName": AGENT_SA, "nodeName": node, "automountServiceAccountToken": false,
                  "containers": [{ "name": "agent", "image": "bosun-agent:never-pulled" }] },
    }))?;
    pods.create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating the agent Pod on {node}"))
}

/// The API server's message when `result` is a 403 Forbidden; `None` otherwise.
pub fn forbidden<T>(result: &std::result::Result<T, kube::Error>) -> Option<String> {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => Some(s.message.clone()),
        _ => None,
    }
}

/// Every line of the logs in `dir` (`*.log`) that reports a refused API call (403
/// Forbidden), with the file it is in.
pub fn refusals_in_logs(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        for line in text
            .lines()
            .filter(|l| l.contains("forbidden") || l.contains("Forbidden"))
        {
            out.push(format!("{}: {line}", path.display()));
        }
    }
    Ok(out)
}
