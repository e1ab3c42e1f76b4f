//! `kubectl bosun version`: this client's version and, as `kubectl version` shows the
//! server's, the running controllers' versions. A controller writes its version on its
//! leader-election Lease each time it takes or renews it
//! ([`bosun_api::labels::annotations::CONTROLLER_VERSION`]); this reads those Leases.

use anyhow::Result;
use bosun_api::labels::annotations::CONTROLLER_VERSION;
use clap::Args;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};

use super::Connection;
use crate::Status;
use crate::terminal::outln;

#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Only this client's version; do not connect to the cluster.
    #[arg(long)]
    pub client: bool,
    /// The namespace of the controllers' Leases.
    #[arg(long, value_name = "NAMESPACE", default_value = "bosun-system")]
    pub namespace: String,
    #[command(flatten)]
    pub conn: Connection,
}

pub async fn version(args: VersionArgs) -> Result<Status> {
    outln!("Client Version: {}", crate::VERSION);
    if args.client {
        return Ok(Status::Success);
    }
    let ns = &args.namespace;
    // The client's version is the answer asked for; a cluster that cannot be read is
    // reported beside it, not as a failure of the command.
    let client = match args.conn.client().await {
        Ok(c) => c,
        Err(e) => {
            outln!("Controller Version: unknown (cannot connect: {e:#})");
            return Ok(Status::Success);
        }
    };
    let leases: Api<Lease> = Api::namespaced(client, ns);
    let list = match leases.list(&ListParams::default()).await {
        Ok(l) => l,
        Err(e) => {
            outln!("Controller Version: unknown (cannot list the Leases in {ns}: {e})");
            return Ok(Status::Success);
        }
    };
    let controllers: Vec<_> = list
        .items
        .iter()
        .filter(|l| l.name_any().starts_with("bosun-controller"))
        .collect();
    if controllers.is_empty() {
        outln!(
            "Controller Version: none running (no bosun-controller Lease in {ns}; `kubectl -n {ns} get pods` shows whether the controller started)"
        );
    }
    for lease in controllers {
        outln!("{}", describe(lease, Timestamp::now()));
    }
    Ok(Status::Success)
}

/// One line for one controller Lease: the version its last writer recorded, who holds it
/// and how long ago it was renewed.
fn describe(lease: &Lease, now: Timestamp) -> String {
    let name = lease.name_any();
    let version = lease.annotations().get(CONTROLLER_VERSION).map_or(
        "unknown (the Lease carries no version: its controller predates 0.1.0)",
        |v| v.as_str(),
    );
    let spec = lease.spec.as_ref();
    let holder = spec.and_then(|s| s.holder_identity.as_deref());
    let renewed = spec
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| now.duration_since(t.0).as_secs().max(0));
    let state = match (holder, renewed) {
        (Some(h), Some(secs)) => format!("held by {h}, renewed {secs}s ago"),
        (Some(h), None) => format!("held by {h}"),
        (None, _) => "not held: no leader".to_owned(),
    };
    format!("Controller Version: {version} (Lease {name}, {state})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    fn lease(version: Option<&str>, holder: Option<&str>, renewed: Option<Timestamp>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("bosun-controller".into()),
                annotations: version
                    .map(|v| [(CONTROLLER_VERSION.to_owned(), v.to_owned())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(Into::into),
                renew_time: renewed.map(MicroTime),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_lease_reads_as_version_holder_and_age() {
        let now: Timestamp = "2026-12-04T12:00:10Z".parse().unwrap();
        let then: Timestamp = "2026-12-04T12:00:00Z".parse().unwrap();
        let cases = [
            (
                lease(
                    Some("0.1.0 (commit 1a2b3c4d5e6f)"),
                    Some("bosun-controller-7d9-x"),
                    Some(then),
                ),
                "Controller Version: 0.1.0 (commit 1a2b3c4d5e6f) (Lease bosun-controller, held by bosun-controller-7d9-x, renewed 10s ago)",
            ),
            (
                lease(Some("0.1.0 (commit 1a2b3c4d5e6f)"), None, Some(then)),
                "Controller Version: 0.1.0 (commit 1a2b3c4d5e6f) (Lease bosun-controller, not held: no leader)",
            ),
            (
                lease(None, Some("old"), None),
                "Controller Version: unknown (the Lease carries no version: its controller predates 0.1.0) (Lease bosun-controller, held by old)",
            ),
        ];
        for (lease, want) in cases {
            assert_eq!(describe(&lease, now), want);
        }
    }
}
