//! Leader election through a `coordination.k8s.io/v1` Lease, so that of several controller
//! replicas exactly one acts.
//!
//! A replica stands by until it holds the Lease: it takes the Lease when nobody holds it, or
//! when the holder has not renewed it for `leaseDurationSeconds` **as measured on this
//! replica's own clock** (from when it last saw the Lease change, as client-go does), so
//! clock skew between machines cannot make two replicas leaders. Every write is a
//! `replace` carrying the `resourceVersion` it read: of two replicas racing for the Lease one
//! wins and the other gets a conflict and stays standby. The leader renews every
//! `renew_every`; if it cannot renew within `duration − renew_every` of the last renewal
//! it *sent* (each attempt is cut at that deadline, so a hanging request cannot stretch it),
//! or finds another holder, it stops with [`LeaderError::Lost`] (the binary exits non-zero,
//! to be restarted as a standby) before any standby may take over, rather than risk acting
//! next to a new leader. On a clean shutdown the leader
//! releases the Lease so a standby takes over at once.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};

/// Where the Lease is and who this replica is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica's identity, written as `holderIdentity` (unique per process).
    pub identity: String,
    /// How long a holder's claim lasts without renewal.
    pub duration: Duration,
    /// How often the leader renews (well below `duration`).
    pub renew_every: Duration,
}

/// Why leading stopped.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error(
        "lost the leader lease {namespace}/{name}: {why}; stopping so that only the new leader acts (restart this process to stand by again)"
    )]
    Lost {
        namespace: String,
        name: String,
        why: String,
    },
    #[error(
        "leader election settings are inconsistent: renew every {renew:?} must be shorter than the lease duration {duration:?}; lower --lease-renew-seconds or raise --lease-duration-seconds"
    )]
    Settings { renew: Duration, duration: Duration },
}

/// What a replica does with the Lease it just read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it, or the holder's claim expired: take it.
    Take,
    /// This replica holds it: renew.
    Renew,
    /// Another replica holds a live claim: stand by.
    Wait { holder: String },
}

/// Decides from the Lease's spec (`None`: no Lease yet), this replica's identity, and how
/// long this replica has seen the Lease unchanged. Pure.
pub fn decide(
    spec: Option<&LeaseSpec>,
    me: &str,
    unchanged_for: Duration,
    default_duration: Duration,
) -> Decision {
    let holder = spec
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty());
    let Some(holder) = holder else {
        return Decision::Take;
    };
    if holder == me {
        return Decision::Renew;
    }
    let duration = spec
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|d| u64::try_from(d).ok())
        .map_or(default_duration, Duration::from_secs);
    if unchanged_for >= duration {
        Decision::Take
    } else {
        Decision::Wait { holder }
    }
}

/// The Lease spec `identity` writes to take or renew a Lease whose spec was `previous`.
/// Transitions count only changes of holder; a renewal keeps the acquire time. Pure.
pub fn claim(
    previous: Option<&LeaseSpec>,
    identity: &str,
    duration: Duration,
    now: Timestamp,
) -> LeaseSpec {
    let transitions = previous.and_then(|s| s.lease_transitions).unwrap_or(0);
    let was_mine = previous.and_then(|s| s.holder_identity.as_deref()) == Some(identity);
    LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(i32::try_from(duration.as_secs()).unwrap_or(i32::MAX)),
        acquire_time: if was_mine {
            previous.and_then(|s| s.acquire_time.clone())
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if was_mine || previous.is_none() {
            transitions
        } else {
            transitions + 1
        }),
        ..LeaseSpec::default()
    }
}

/// The part of a Lease whose change shows its holder is alive.
fn fingerprint(spec: Option<&LeaseSpec>) -> String {
    let s = spec.cloned().unwrap_or_default();
    format!(
        "{:?}|{:?}|{:?}",
        s.holder_identity,
        s.renew_time.map(|t| t.0),
        s.lease_transitions
    )
}

/// One replica's view of the Lease.
struct Elector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    /// The Lease as last seen, and since when (local clock).
    seen: Option<(String, Instant)>,
}

enum Attempt {
    Leading,
    Standby(String),
}

impl Elector {
    fn lease(&self, spec: LeaseSpec, resource_version: Option<String>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.cfg.name.clone()),
                namespace: Some(self.cfg.namespace.clone()),
                resource_version,
                ..Default::default()
            },
            spec: Some(spec),
        }
    }

    /// Reads the Lease and takes or renews it when [`decide`] says so.
    async fn attempt(&mut self) -> Result<Attempt, String> {
        let (ns, name) = (&self.cfg.namespace, &self.cfg.name);
        let now = Timestamp::now();
        let current = self
            .api
            .get_opt(name)
            .await
            .map_err(|e| format!("reading Lease {ns}/{name}: {e}"))?;
        let Some(current) = current else {
            let lease = self.lease(
                claim(None, &self.cfg.identity, self.cfg.duration, now),
                None,
            );
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Leading),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Standby(
                    "another replica (it created the Lease first)".into(),
                )),
                Err(kube::Error::Api(s)) if s.code == 404 => Err(format!(
                    "cannot create Lease {ns}/{name}: namespace {ns} does not exist; create it or pass --lease-namespace"
                )),
                Err(e) => Err(format!("creating Lease {ns}/{name}: {e}")),
            };
        };
        let spec = current.spec.clone();
        let print = fingerprint(spec.as_ref());
        let unchanged_for = match &self.seen {
            Some((p, since)) if *p == print => since.elapsed(),
            _ => {
                self.seen = Some((print, Instant::now()));
                Duration::ZERO
            }
        };
        match decide(
            spec.as_ref(),
            &self.cfg.identity,
            unchanged_for,
            self.cfg.duration,
        ) {
            Decision::Wait { holder } => Ok(Attempt::Standby(holder)),
            Decision::Take | Decision::Renew => {
                let lease = self.lease(
                    claim(spec.as_ref(), &self.cfg.identity, self.cfg.duration, now),
                    current.metadata.resource_version.clone(),
                );
                match self.api.replace(name, &PostParams::default(), &lease).await {
                    Ok(_) => Ok(Attempt::Leading),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Standby(
                        "another replica (it wrote the Lease first)".into(),
                    )),
                    Err(e) => Err(format!("writing Lease {ns}/{name}: {e}")),
                }
            }
        }
    }

    /// Gives the Lease up (holder cleared), so a standby need not wait for it to expire.
    async fn release(&mut self) {
        let name = self.cfg.name.clone();
        let Ok(Some(current)) = self.api.get_opt(&name).await else {
            return;
        };
        if current
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            != Some(self.cfg.identity.as_str())
        {
            return;
        }
        let mut spec = current.spec.clone().unwrap_or_default();
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        let lease = self.lease(spec, current.metadata.resource_version.clone());
        match self
            .api
            .replace(&name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(lease = %name, "leader lease released"),
            Err(error) => {
                tracing::warn!(%error, lease = %name, "could not release the leader lease; a standby takes over when it expires")
            }
        }
    }
}

/// Stands by until this replica holds the Lease, then runs `work` while renewing the Lease.
/// Returns `Ok` when `work` ends (the Lease released) or a shutdown signal arrives while
/// standing by; [`LeaderError::Lost`] when leadership cannot be kept (then `work` is dropped
/// at once: nothing more is done as leader).
pub async fn run_as_leader<F, Fut>(
    client: Client,
    cfg: LeaseConfig,
    work: F,
) -> Result<(), LeaderError>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    if cfg.renew_every >= cfg.duration {
        return Err(LeaderError::Settings {
            renew: cfg.renew_every,
            duration: cfg.duration,
        });
    }
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut elector = Elector {
        api,
        cfg: cfg.clone(),
        seen: None,
    };
    let lost = |why: String| LeaderError::Lost {
        namespace: cfg.namespace.clone(),
        name: cfg.name.clone(),
        why,
    };

    // Stand by. Retry at the renew period: a released or expired Lease is noticed quickly.
    let mut last_holder = String::new();
    loop {
        let attempt = tokio::select! {
            a = elector.attempt() => a,
            () = shutdown_signal() => return Ok(()),
        };
        match attempt {
            Ok(Attempt::Leading) => break,
            Ok(Attempt::Standby(holder)) => {
                if holder != last_holder {
                    tracing::info!(lease = %cfg.name, %holder, identity = %cfg.identity, "standing by: another replica leads");
                    last_holder = holder;
                }
            }
            Err(error) => tracing::warn!(%error, "leader election: will try again"),
        }
        tokio::select! {
            () = tokio::time::sleep(cfg.renew_every) => {}
            () = shutdown_signal() => return Ok(()),
        }
    }
    tracing::info!(lease = %format!("{}/{}", cfg.namespace, cfg.name), identity = %cfg.identity, "leading");

    let work = work();
    tokio::pin!(work);
    // The lease counts from when a renewal was *sent* (the server stamps it later, and a
    // standby times it from when it saw it), and leading stops once `renew_deadline` has
    // passed without one: strictly before any standby may take over after `duration`.
    // Every attempt is cut at that deadline, so a hanging request cannot keep a leader
    // acting while the lease runs out under it.
    let renew_deadline = cfg.duration - cfg.renew_every;
    let mut renewed = Instant::now();
    loop {
        tokio::select! {
            () = &mut work => {
                elector.release().await;
                return Ok(());
            }
            () = tokio::time::sleep(cfg.renew_every) => {
                let sent = Instant::now();
                let left = (renewed + renew_deadline).saturating_duration_since(sent);
                let attempt = tokio::time::timeout(left, elector.attempt()).await;
                match attempt {
                    Ok(Ok(Attempt::Leading)) => renewed = sent,
                    Ok(Ok(Attempt::Standby(holder))) => return Err(lost(format!("{holder} holds it now"))),
                    Ok(Err(error)) if renewed.elapsed() < renew_deadline => {
                        tracing::warn!(%error, "could not renew the leader lease; trying again");
                    }
                    Ok(Err(error)) => {
                        return Err(lost(format!("not renewed within {}s, last error: {error}", renew_deadline.as_secs())));
                    }
                    Err(_) => {
                        return Err(lost(format!("not renewed within {}s: the renewal did not answer in time", renew_deadline.as_secs())));
                    }
                }
            }
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// A default identity: `$POD_NAME` in a cluster, otherwise the host name and process id.
pub fn default_identity() -> String {
    if let Ok(pod) = std::env::var("POD_NAME")
        && !pod.is_empty()
    {
        return pod;
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "bosun-controller".into());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn held_by(holder: &str, duration: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: duration,
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn an_absent_or_released_lease_is_taken() {
        assert_eq!(decide(None, "a", Duration::ZERO, D), Decision::Take);
        assert_eq!(
            decide(Some(&LeaseSpec::default()), "a", Duration::ZERO, D),
            Decision::Take
        );
        assert_eq!(
            decide(Some(&held_by("", Some(1))), "a", Duration::ZERO, D),
            Decision::Take
        );
    }

    #[test]
    fn the_holder_renews() {
        assert_eq!(
            decide(
                Some(&held_by("a", Some(15))),
                "a",
                Duration::from_secs(100),
                D
            ),
            Decision::Renew
        );
    }

    #[test]
    fn another_holder_is_waited_for_until_its_lease_has_not_changed_for_its_duration() {
        let other = held_by("b", Some(10));
        assert_eq!(
            decide(Some(&other), "a", Duration::from_secs(9), D),
            Decision::Wait { holder: "b".into() }
        );
        assert_eq!(
            decide(Some(&other), "a", Duration::from_secs(10), D),
            Decision::Take
        );
        // Without a duration in the Lease, this replica's default applies.
        assert_eq!(
            decide(Some(&held_by("b", None)), "a", Duration::from_secs(14), D),
            Decision::Wait { holder: "b".into() }
        );
        assert_eq!(decide(Some(&held_by("b", None)), "a", D, D), Decision::Take);
    }

    #[test]
    fn a_renewal_changes_the_fingerprint_and_so_restarts_the_wait() {
        let mut a = held_by("b", Some(10));
        let before = fingerprint(Some(&a));
        a.renew_time = Some(MicroTime(Timestamp::from_second(1_800_000_000).unwrap()));
        assert_ne!(before, fingerprint(Some(&a)));
    }

    #[test]
    fn claims_count_transitions_only_when_the_holder_changes() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let first = claim(None, "a", D, now);
        assert_eq!(
            (
                first.holder_identity.as_deref(),
                first.lease_transitions,
                first.lease_duration_seconds
            ),
            (Some("a"), Some(0), Some(15))
        );
        let mut theirs = held_by("b", Some(15));
        theirs.lease_transitions = Some(3);
        assert_eq!(claim(Some(&theirs), "a", D, now).lease_transitions, Some(4));
        let mut mine = held_by("a", Some(15));
        mine.lease_transitions = Some(4);
        mine.acquire_time = Some(MicroTime(Timestamp::UNIX_EPOCH));
        let renewed = claim(Some(&mine), "a", D, now);
        assert_eq!(renewed.lease_transitions, Some(4));
        assert_eq!(
            renewed.acquire_time,
            Some(MicroTime(Timestamp::UNIX_EPOCH)),
            "a renewal keeps the acquire time"
        );
    }
}
