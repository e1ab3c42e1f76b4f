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
//! it *sent* (each attempt is cut at that deadline, so a hanging request cannot stretch it,
//! and at 2 s, so that a failed one is tried again on a new connection within the deadline),
//! or finds another holder, it stops leading before any standby may take over: the term's
//! [`Fence`] closes (no request of the work is sent after that), its runtime is shut down
//! (every task the work spawned is dropped), and the replica stands by again in the same
//! process. It never exits because the Lease was lost or the API server was unreachable:
//! Bosun restarts the API server itself, and a process that exited each time would
//! crash-loop into the kubelet's growing backoff. On a clean shutdown the leader releases
//! the Lease so a standby takes over at once.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// This replica's version, written on every take and renewal as the annotation
    /// [`bosun_api::labels::annotations::CONTROLLER_VERSION`].
    pub version: String,
}

/// Why leading stopped.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
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
                annotations: Some(
                    [(
                        bosun_api::labels::annotations::CONTROLLER_VERSION.to_owned(),
                        self.cfg.version.clone(),
                    )]
                    .into(),
                ),
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

/// How long a term's runtime may take to drop its tasks once stopped (they are cancelled at
/// their next await; only a blocking task could take longer, and the work spawns none).
const TERM_SHUTDOWN: Duration = Duration::from_secs(5);
/// The longest one read-and-write of the Lease may take. A request to an API server that is
/// going down can hang on its connection; cut, it is dropped with that connection, and the
/// next attempt (after [`RETRY_AFTER_FAILURE`]) opens another, which the Service or the load
/// balancer may send to an API server that answers. Without it, one hanging renewal used
/// the whole renew deadline on the real-node cluster while `kubeadm upgrade apply` restarted
/// one of three API servers.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// The wait before trying again after a failed attempt (instead of the renew period).
const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(500);
/// How long a leader waits, after a shutdown signal, for its work to finish its current
/// reconciles before it stops the term and releases the Lease.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// Closes a leader's API client at the moment leadership ends: once closed, every request
/// through the client fails at once with [`LeadershipEnded`], before anything is sent.
///
/// It is the outermost layer of a term's client (see [`run_as_leader`]), so it holds for
/// every request the work and anything it spawned can make, whichever code path makes it.
#[derive(Clone, Debug)]
pub struct Fence(Arc<AtomicBool>);

impl Fence {
    /// An open fence: requests pass.
    pub fn open() -> Fence {
        Fence(Arc::new(AtomicBool::new(true)))
    }

    /// Closes it for good: no request passes after this returns.
    pub fn close(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    /// Whether requests pass.
    pub fn is_open(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The error of a request made through a closed [`Fence`].
#[derive(Debug, thiserror::Error)]
#[error("this replica no longer holds the leader Lease: the request was not sent")]
pub struct LeadershipEnded;

impl<S> tower::Layer<S> for Fence {
    type Service = Fenced<S>;

    fn layer(&self, inner: S) -> Fenced<S> {
        Fenced {
            inner,
            fence: self.clone(),
        }
    }
}

/// A service behind a [`Fence`].
#[derive(Debug)]
pub struct Fenced<S> {
    inner: S,
    fence: Fence,
}

impl<S, B> tower::Service<http::Request<B>> for Fenced<S>
where
    S: tower::Service<http::Request<B>>,
    S::Error: Into<tower::BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = tower::BoxError;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<S::Response, tower::BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if !self.fence.is_open() {
            return Box::pin(std::future::ready(Err(Box::new(LeadershipEnded).into())));
        }
        let sent = self.inner.call(request);
        Box::pin(async move { sent.await.map_err(Into::into) })
    }
}

/// How a term ended.
#[derive(Debug)]
enum TermEnd {
    /// The work returned (a shutdown signal reached it).
    WorkEnded,
    /// The leader stopped it.
    Stopped,
    /// It could not start.
    Failed(String),
}

/// One term of leadership: the work on a runtime of its own, with a client of its own.
struct Term {
    fence: Fence,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Resolves once the term's runtime has shut down: every task of the term is gone.
    ended: tokio::sync::oneshot::Receiver<TermEnd>,
}

impl Term {
    /// Starts `work` on a new runtime on a thread of its own, with a client built from
    /// `config` behind a new [`Fence`]. Everything the work spawns runs on that runtime and
    /// every connection of that client is held by it, so shutting the runtime down ends them
    /// all: nothing of a term outlives it.
    fn start<F, Fut>(config: &kube::Config, work: Arc<F>, number: u64) -> Term
    where
        F: Fn(Client) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()>,
    {
        let fence = Fence::open();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (end, ended) = tokio::sync::oneshot::channel();
        let (config, layer) = (config.clone(), fence.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("bosun-term-{number}"))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .thread_name("bosun-leader")
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = end.send(TermEnd::Failed(format!("starting its runtime: {e}")));
                        return;
                    }
                };
                let how = runtime.block_on(async move {
                    let client = match kube::client::ClientBuilder::try_from(config) {
                        Ok(builder) => builder
                            .with_layer(&bosun_cluster::client::AnswerDeadline(
                                bosun_cluster::client::ANSWER_DEADLINE,
                            ))
                            .with_layer(&layer)
                            .build(),
                        Err(e) => return TermEnd::Failed(format!("building its API client: {e}")),
                    };
                    tokio::select! {
                        () = work(client) => TermEnd::WorkEnded,
                        _ = stopped => TermEnd::Stopped,
                    }
                });
                // Every task the work spawned is dropped here, at its next await, and with
                // them the client's connections.
                runtime.shutdown_timeout(TERM_SHUTDOWN);
                let _ = end.send(how);
            });
        if let Err(e) = spawned {
            // `end` went with the closure: `ended` resolves at once, as a failed start.
            tracing::error!(error = %e, "could not start a thread for the leader's work");
        }
        Term {
            fence,
            stop: Some(stop),
            ended,
        }
    }

    /// Ends the term: the fence closes first (no request passes from here on), then the
    /// runtime is shut down; returns once every task of the term is gone.
    async fn end(mut self) {
        self.fence.close();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.ended).await;
    }
}

/// Runs this replica for as long as the process lives: stands by until it holds the Lease,
/// then leads one *term* ([`Term`]): `work(client)` on a runtime of its own, with a client
/// built from `config` behind a [`Fence`], while it renews the Lease through `client` (the
/// process's own, used for the Lease alone).
///
/// When leadership is lost (another holder wrote the Lease, or no renewal succeeded within
/// `duration − renew_every` of the last one sent, as when the API server is down), the fence
/// closes first, so the work cannot send one more request, then the term's runtime is shut
/// down, which drops every task the work spawned, and the replica stands by again, in the
/// same process. It never exits for a lost Lease or an unreachable API server.
///
/// Returns `Ok` on a shutdown signal (after the work finished its current reconciles, and
/// the Lease released if held) or when the work ends by itself.
pub async fn run_as_leader<F, Fut>(
    client: Client,
    config: kube::Config,
    cfg: LeaseConfig,
    work: F,
) -> Result<(), LeaderError>
where
    F: Fn(Client) -> Fut + Send + Sync + 'static,
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
    let work = Arc::new(work);
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let metrics = bosun_telemetry::metrics();
    for number in 1.. {
        if !stand_by(&mut elector, &mut shutdown).await {
            return Ok(());
        }
        tracing::info!(lease = %format!("{}/{}", cfg.namespace, cfg.name), identity = %cfg.identity, term = number, "leading");
        metrics.leading(true);
        let term = Term::start(&config, work.clone(), number);
        let outcome = lead(&mut elector, term, &mut shutdown).await;
        metrics.leading(false);
        match outcome {
            Led::Lost(why) => {
                metrics.leader_lost();
                tracing::warn!(
                    lease = %format!("{}/{}", cfg.namespace, cfg.name),
                    identity = %cfg.identity,
                    %why,
                    "lost the leader lease: stopped the work of this term (no request of it is sent any more) and standing by again"
                );
            }
            Led::Ended(TermEnd::Failed(why)) => {
                elector.release().await;
                tracing::error!(%why, "the leader's work could not start; released the Lease and standing by again");
                tokio::select! {
                    () = tokio::time::sleep(cfg.renew_every) => {}
                    () = &mut shutdown => return Ok(()),
                }
            }
            Led::Ended(_) => {
                elector.release().await;
                return Ok(());
            }
        }
    }
    Ok(())
}

/// How a term of leading ended.
enum Led {
    /// Leadership was lost; the term is over.
    Lost(String),
    /// The term ended (the work returned, after a shutdown signal, or could not start);
    /// the Lease is still held.
    Ended(TermEnd),
}

/// Stands by until this replica holds the Lease (`true`) or a shutdown signal arrives
/// (`false`). Tries again at the renew period, so a released or expired Lease is noticed
/// quickly; an API server that does not answer is waited for.
async fn stand_by<S>(elector: &mut Elector, shutdown: &mut std::pin::Pin<&mut S>) -> bool
where
    S: Future<Output = ()>,
{
    let cfg = elector.cfg.clone();
    let mut last_holder = String::new();
    loop {
        let attempt = tokio::select! {
            a = tokio::time::timeout(ATTEMPT_TIMEOUT, elector.attempt()) => {
                a.unwrap_or_else(|_| Err(format!("reading or writing the Lease did not answer within {}s", ATTEMPT_TIMEOUT.as_secs())))
            }
            () = &mut *shutdown => return false,
        };
        let wait = match attempt {
            Ok(Attempt::Leading) => return true,
            Ok(Attempt::Standby(holder)) => {
                if holder != last_holder {
                    tracing::info!(lease = %cfg.name, %holder, identity = %cfg.identity, "standing by: another replica leads");
                    last_holder = holder;
                }
                cfg.renew_every
            }
            Err(error) => {
                tracing::warn!(%error, "leader election: will try again");
                RETRY_AFTER_FAILURE
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = &mut *shutdown => return false,
        }
    }
}

/// Renews the Lease while `term` runs, and ends the term when leadership is lost.
///
/// The lease counts from when a renewal was *sent* (the server stamps it later, and a
/// standby times it from when it saw it), and leading stops once `renew_deadline` has
/// passed without one: strictly before any standby may take over after `duration`. Every
/// attempt is cut at that deadline, so a hanging request cannot keep a leader acting while
/// the lease runs out under it.
async fn lead<S>(elector: &mut Elector, mut term: Term, shutdown: &mut std::pin::Pin<&mut S>) -> Led
where
    S: Future<Output = ()>,
{
    let cfg = elector.cfg.clone();
    let renew_deadline = cfg.duration - cfg.renew_every;
    let mut renewed = Instant::now();
    // Set by a shutdown signal: the work finishes its current reconciles (it got the signal
    // too) and the term is stopped at this instant if it has not ended by then.
    let mut shutting_down: Option<Instant> = None;
    // After a failed attempt the next comes sooner, on a new connection (ATTEMPT_TIMEOUT).
    let mut failed = false;
    loop {
        let period = if failed {
            RETRY_AFTER_FAILURE
        } else {
            cfg.renew_every
        };
        let wait = match shutting_down {
            Some(by) => period.min(by.saturating_duration_since(Instant::now())),
            None => period,
        };
        tokio::select! {
            how = &mut term.ended => {
                return Led::Ended(how.unwrap_or_else(|_| TermEnd::Failed("its thread did not start".into())));
            }
            () = &mut *shutdown, if shutting_down.is_none() => {
                shutting_down = Some(Instant::now() + SHUTDOWN_GRACE);
            }
            () = tokio::time::sleep(wait) => {
                if shutting_down.is_some_and(|by| Instant::now() >= by) {
                    term.end().await;
                    return Led::Ended(TermEnd::Stopped);
                }
                let sent = Instant::now();
                let left = (renewed + renew_deadline).saturating_duration_since(sent);
                let cut = left.min(ATTEMPT_TIMEOUT);
                let attempt = tokio::time::timeout(cut, elector.attempt())
                    .await
                    .unwrap_or_else(|_| Err(format!("the renewal did not answer within {:.1}s", cut.as_secs_f32())));
                failed = attempt.is_err();
                let lost = match attempt {
                    Ok(Attempt::Leading) => {
                        renewed = sent;
                        None
                    }
                    Ok(Attempt::Standby(holder)) => Some(format!("{holder} holds it now")),
                    Err(error) if renewed.elapsed() < renew_deadline => {
                        tracing::warn!(%error, "could not renew the leader lease; trying again");
                        None
                    }
                    Err(error) => Some(format!("not renewed within {}s, last error: {error}", renew_deadline.as_secs())),
                };
                if let Some(why) = lost {
                    term.end().await;
                    return Led::Lost(why);
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
