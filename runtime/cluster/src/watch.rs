//! How soon a broken watch is opened again.
//!
//! kube-runtime's default (client-go's: 0.8 s doubling to 30 s, reset after 2 minutes without
//! an error) is built for a server that is overloaded. During a kubeadm upgrade the API server
//! is instead simply gone for a while: `kubeadm upgrade apply` and a kubelet restart each stop
//! it for 10–20 s, a few times in a row. With the default, an agent whose watch failed five
//! times waits up to 25 s more after the server is back before it sees its own step's result
//! and starts the next step; on the real-node lab that was 24 s of a 224 s node upgrade.
//!
//! [`WatchBackoff`] doubles from 250 ms to at most 4 s, with ±25 % jitter so that a thousand
//! agents do not reconnect in step, and starts again from 250 ms once a watch has run for
//! 30 s without error. At 1,000 nodes that is at most about 250 reconnection attempts a
//! second while the server is down (each a refused TCP connection until it listens again),
//! and one list-and-watch per agent once it is back.

//!
//! **A watch that is open but silent.** A watch can also stay connected to an API server
//! that no longer delivers its events: on a control plane whose etcd member a renewal or an
//! upgrade just restarted, that API server kept its watches open and sent nothing for 97 s
//! while its watch cache re-initialised (docs/benchmarks.md, "API-server restarts"), and the
//! controller waited for a step result the agent had written long before. [`Liveness`] and
//! [`reopenable`] let such a watch be opened again; [`keep_fresh`] decides when: a watch
//! silent for [`FRESHNESS`]`.silent` while its process waits for an object to change is
//! checked against a quorum read of (a few of) those objects, and opened again when the API
//! server holds a newer version that the watch does not bring within
//! [`FRESHNESS`]`.grace`. Opening again drops the stalled connection and lists with a quorum
//! read (kube-runtime's default `MostRecent`), so the store is current at once.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bosun_telemetry::Watched;
use futures::{Stream, StreamExt};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;

/// A spawned task (one that drives a watch, say) aborted when this is dropped, so that it
/// ends with whatever owns it.
#[derive(Debug)]
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The first wait after a watch fails.
pub const FIRST: Duration = Duration::from_millis(250);
/// The longest wait between two attempts.
pub const MAX: Duration = Duration::from_secs(4);
/// A watch that ran this long without an error starts the next backoff from [`FIRST`].
pub const RESET_AFTER: Duration = Duration::from_secs(30);

/// The reconnection backoff of Bosun's watches (see the module documentation).
#[derive(Debug)]
pub struct WatchBackoff {
    next: Duration,
    last: Option<Instant>,
    seed: u64,
}

impl WatchBackoff {
    /// A backoff whose jitter is seeded by `seed` (for example a hash of the node name), so
    /// that agents started together still spread out.
    pub fn new(seed: u64) -> WatchBackoff {
        WatchBackoff {
            next: FIRST,
            last: None,
            seed: seed | 1,
        }
    }

    /// The wait before the next attempt, without jitter; doubles up to [`MAX`].
    fn step(&mut self) -> Duration {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|l| now.duration_since(l) > RESET_AFTER + MAX)
        {
            self.next = FIRST;
        }
        self.last = Some(now);
        let wait = self.next;
        self.next = (self.next * 2).min(MAX);
        wait
    }

    /// ±25 %: the next xorshift of the seed picks the factor ([`jittered`]).
    fn jitter(&mut self, wait: Duration) -> Duration {
        self.seed = xorshift(self.seed);
        jittered(wait, self.seed)
    }
}

/// One xorshift step: the next pseudo-random value after `x` (never 0 when `x` is not).
pub fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// `wait` times a factor in [0.75, 1.25) that `x` picks (±25 % jitter).
pub fn jittered(wait: Duration, x: u64) -> Duration {
    let permille = 750 + (x % 500);
    wait * u32::try_from(permille).unwrap_or(1000) / 1000
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = self.step();
        Some(self.jitter(wait))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = FIRST;
    }
}

/// For a watcher stream's `inspect`: counts each full list the watch starts in
/// `bosun_watch_lists_total{resource}` (one when it starts; any more are relists, after a
/// 410 Gone or a failed list). kube-runtime's watcher resumes a watch the server ended from
/// its last resourceVersion, kept current by bookmarks, without listing again; this is how
/// that is seen in production and in the fleet bench.
pub fn count_lists<K>(resource: Watched) -> impl FnMut(&Result<watcher::Event<K>, watcher::Error>) {
    move |event| {
        if let Ok(watcher::Event::Init) = event {
            bosun_telemetry::metrics().watch_listed(resource);
        }
    }
}

/// The objects Bosun's watches keep: what kube-runtime's watcher, reflector and store ask
/// of a resource type, under one name (every Bosun type and every `k8s-openapi` type is
/// one: their `DynamicType` is `()`).
pub trait Watchable:
    kube::Resource<DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Watchable for K where
    K: kube::Resource<DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// A reflector over a watcher of `api` with `config`: its events, each applied to the
/// returned store first, with the watch's lists counted as `liveness`'s resource
/// ([`count_lists`]) and the watch opened again when `liveness` asks ([`reopenable`]).
pub fn reflected<K>(
    api: kube::Api<K>,
    config: watcher::Config,
    liveness: Liveness,
) -> (
    impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    Store<K>,
)
where
    K: Watchable,
{
    let writer = kube::runtime::reflector::store::Writer::<K>::default();
    let store = writer.as_reader();
    let events = kube::runtime::reflector::reflector(writer, reopenable(api, config, liveness));
    (events, store)
}

/// The trigger stream and store of a kube-runtime `Controller` of `api`'s objects, built as
/// `Controller::new` builds them (a reflector over a watcher: [`reflected`]). For
/// `Controller::for_stream(triggers, store)`.
pub fn counted_controller_source<K>(
    api: kube::Api<K>,
    config: watcher::Config,
    liveness: Liveness,
) -> (
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    Store<K>,
)
where
    K: Watchable,
{
    use kube::runtime::WatchStreamExt as _;
    let (events, store) = reflected(api, config, liveness);
    (events.applied_objects(), store)
}

/// Whether a watch still delivers, and the handle that opens it again (see the module
/// documentation). Clones share one watch.
#[derive(Clone, Debug)]
pub struct Liveness(Arc<LivenessState>);

#[derive(Debug)]
struct LivenessState {
    resource: Watched,
    last_event: Mutex<Instant>,
    reopen: tokio::sync::Notify,
}

impl Liveness {
    /// A new watch of `resource`, counted as just heard from.
    pub fn new(resource: Watched) -> Liveness {
        Liveness(Arc::new(LivenessState {
            resource,
            last_event: Mutex::new(Instant::now()),
            reopen: tokio::sync::Notify::new(),
        }))
    }

    /// The watch delivered something (an event, or its first list).
    fn heard(&self) {
        *self
            .0
            .last_event
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    /// How long the watch has delivered nothing.
    pub fn silent_for(&self) -> Duration {
        self.0
            .last_event
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
    }

    /// Asks the watch to drop its connection and list and watch again. The silence clock
    /// starts over, so the new list has [`FreshnessCheck::silent`] to arrive before the
    /// watch is judged again.
    pub fn reopen(&self) {
        self.heard();
        bosun_telemetry::metrics().watch_reopened(self.0.resource);
        self.0.reopen.notify_one();
    }
}

/// The items of the stream `open` makes, opened again (`open` called again, the old stream
/// dropped with its connection) each time `liveness` is asked to ([`Liveness::reopen`]).
/// Every `Ok` item counts as hearing from the watch; errors do not (a watch that keeps
/// failing against a stalled API server is as silent as one that says nothing). Never
/// ends while the streams do not.
pub fn reopening<S, F, T, E>(
    mut open: F,
    liveness: Liveness,
) -> impl Stream<Item = Result<T, E>> + Send
where
    F: FnMut() -> S + Send + 'static,
    S: Stream<Item = Result<T, E>> + Send + 'static,
    T: Send,
    E: Send,
{
    let first: Pin<Box<S>> = Box::pin(open());
    futures::stream::unfold(
        (first, open, liveness),
        |(mut inner, mut open, liveness)| async move {
            loop {
                tokio::select! {
                    biased;
                    () = liveness.0.reopen.notified() => {
                        inner = Box::pin(open());
                    }
                    item = inner.next() => {
                        let item = item?;
                        if item.is_ok() {
                            liveness.heard();
                        }
                        return Some((item, (inner, open, liveness)));
                    }
                }
            }
        },
    )
}

/// A watcher of `api` with `config` that [`Liveness::reopen`] opens again, its lists
/// counted ([`count_lists`]).
pub fn reopenable<K>(
    api: kube::Api<K>,
    config: watcher::Config,
    liveness: Liveness,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Watchable,
{
    let resource = liveness.0.resource;
    reopening(
        move || watcher(api.clone(), config.clone()).inspect(count_lists(resource)),
        liveness,
    )
}

/// When and how [`keep_fresh`] checks a watch.
#[derive(Clone, Copy, Debug)]
pub struct FreshnessCheck {
    /// How often it looks.
    pub every: Duration,
    /// A watch silent at least this long, while its process waits on an object, is checked.
    pub silent: Duration,
    /// At most this many of the awaited objects are read per check (each a quorum GET), in
    /// turn, so a thousand awaited objects cost no more than a few.
    pub sample: usize,
    /// Each read is cut after this long (an API server that hangs tells nothing) ...
    pub timeout: Duration,
    /// ... and tried again at once, up to this many tries in all.
    pub tries: u32,
    /// How long a newer version found by a read may take to arrive through the watch
    /// before the watch is opened again.
    pub grace: Duration,
}

impl FreshnessCheck {
    /// The answer of `request` (made anew for each try), or `None` when the API server
    /// answered with an error (nothing learned this time) or did not answer within
    /// `timeout`, `tries` times. A request cut at its timeout drops its connection (perhaps
    /// to the same stalled API server as the watch), so the next try goes out on another.
    async fn read<T, E, F, Fut>(&self, mut request: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        for _ in 0..self.tries {
            // An answer, error or not, ends the tries; no answer in time: try again.
            if let Ok(answer) = tokio::time::timeout(self.timeout, request()).await {
                return answer.ok();
            }
        }
        None
    }
}

/// The check Bosun's controller and agents run: a silent watch is looked at within about
/// 10 s and opened again about 2 s later.
pub const FRESHNESS: FreshnessCheck = FreshnessCheck {
    every: Duration::from_secs(4),
    silent: Duration::from_secs(6),
    sample: 4,
    timeout: Duration::from_secs(2),
    tries: 3,
    grace: Duration::from_secs(2),
};

/// The objects one check reads: `awaited` ordered by name, `sample` of them starting at
/// turn `turn` (so successive checks go round all of them).
pub fn sample_of<K: kube::Resource>(
    mut awaited: Vec<Arc<K>>,
    turn: usize,
    sample: usize,
) -> Vec<Arc<K>> {
    if awaited.is_empty() {
        return awaited;
    }
    awaited.sort_by_key(|o| o.name_any());
    let start = turn % awaited.len();
    awaited.rotate_left(start);
    awaited.truncate(sample);
    awaited
}

/// Keeps a watch honest (see the module documentation): every `check.every`, if the watch
/// behind `store` has been silent for `check.silent` and `awaited` accepts some of its
/// objects (those the process is waiting to see change), reads up to `check.sample` of them
/// from the API server. An object whose `resourceVersion` there differs from the store's
/// (or that is gone there), and still does after `check.grace`, means the watch is not
/// delivering: it is opened again through `liveness`, with a warning. Never ends.
pub async fn keep_fresh<K, A>(
    api: kube::Api<K>,
    store: Store<K>,
    liveness: Liveness,
    check: FreshnessCheck,
    awaited: A,
) where
    K: Watchable,
    A: Fn(&K) -> bool,
{
    let mut turn = 0usize;
    loop {
        tokio::time::sleep(check.every).await;
        if liveness.silent_for() < check.silent {
            continue;
        }
        let candidates = sample_of(store.state_filter(|o| awaited(o)), turn, check.sample);
        turn = turn.wrapping_add(check.sample.max(1));
        let mut behind = Vec::new();
        for seen in candidates {
            let name = seen.name_any();
            let Some(now) = check.read(|| api.get_opt(&name)).await else {
                continue;
            };
            if now.as_ref().map(ResourceExt::resource_version) != Some(seen.resource_version()) {
                behind.push((seen, now.and_then(|n| n.resource_version())));
            }
        }
        if behind.is_empty() {
            continue;
        }
        tokio::time::sleep(check.grace).await;
        let still: Vec<_> = behind
            .into_iter()
            .filter(|(seen, _)| {
                store
                    .get(&ObjectRef::from_obj(seen.as_ref()))
                    .is_some_and(|cur| cur.resource_version() == seen.resource_version())
            })
            .collect();
        if let Some((seen, newer)) = still.first() {
            tracing::warn!(
                watched = ?liveness.0.resource,
                object = %seen.name_any(),
                watched_version = seen.resource_version().unwrap_or_default(),
                api_server_version = newer.as_deref().unwrap_or("deleted"),
                silent_for = ?liveness.silent_for(),
                "the watch has brought nothing while the API server holds a newer version of an object this process waits on; watching again on a new connection"
            );
            liveness.reopen();
        }
    }
}

/// How long the API server keeps one of the controller's watches open before it ends it
/// (`timeoutSeconds`; kube-runtime's default is 290 s). The watcher then watches again from
/// its last `resourceVersion`, with no new list, and on a new connection (a watch's
/// connection is closed when it ends: `client::AnswerDeadline`). So a watch that reached an
/// API server that is up but no longer delivers (its etcd member stopped: the API server
/// keeps its watches open and sends nothing) leaves it within this long, for every watch
/// and every change, including objects created meanwhile, which no freshness check by
/// object can notice. The cost is one watch request per watch per minute, a handful for the
/// controller; the agents, a thousand of them, keep the default.
pub const CONTROLLER_WATCH_SECONDS: u32 = 60;

/// The watcher configuration of every controller watch ([`CONTROLLER_WATCH_SECONDS`]).
pub fn controller_config() -> watcher::Config {
    watcher::Config::default().timeout(CONTROLLER_WATCH_SECONDS)
}

/// The check [`keep_listed_fresh`] runs: a watch silent for 10 s is compared with a list
/// every 10 s (`sample` is not used: the list is whole).
pub const LISTED_FRESHNESS: FreshnessCheck = FreshnessCheck {
    every: Duration::from_secs(10),
    silent: Duration::from_secs(10),
    sample: 0,
    timeout: Duration::from_secs(2),
    tries: 3,
    grace: Duration::from_secs(2),
};

/// An object's place in a list or a store: `namespace/name` (`name` for a cluster-scoped
/// one), and its `resourceVersion`.
pub type Versions = std::collections::BTreeMap<String, String>;

fn key_of(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

/// The objects the store is behind the API server on: those a list taken at
/// `list_version` shows at another version than `stored` has (unless the store's is
/// newer), those the list shows and the store lacks (created), and those the store has and
/// the list does not, unless the store's version is newer than the list (created after
/// it). Versions are compared as integers (the etcd revision, see `cache.rs` in the
/// controller); one that is not an integer counts as different.
pub fn behind(listed: &Versions, list_version: &str, stored: &Versions) -> Vec<String> {
    let newer = |a: &str, b: &str| match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => a > b,
        _ => false,
    };
    let mut keys: Vec<&String> = listed.keys().chain(stored.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| match (listed.get(*k), stored.get(*k)) {
            (Some(l), Some(s)) => l != s && !newer(s, l),
            (Some(_), None) => true,
            (None, Some(s)) => !newer(s, list_version),
            (None, None) => false,
        })
        .cloned()
        .collect()
}

/// Of the objects `behind` named while the store held `before`, those the watch has still
/// brought nothing for (the store holds them as it did): the watch is not delivering.
pub fn still_behind(behind: &[String], before: &Versions, after: &Versions) -> Vec<String> {
    behind
        .iter()
        .filter(|k| before.get(*k) == after.get(*k))
        .cloned()
        .collect()
}

/// The objects of a metadata list by [`key_of`] and version, and the list's own version.
pub(crate) fn listed_versions<K>(
    list: &kube::core::ObjectList<kube::core::PartialObjectMeta<K>>,
) -> (Versions, String)
where
    K: Watchable,
{
    let versions = list
        .items
        .iter()
        .map(|o| {
            (
                key_of(o.metadata.namespace.as_deref(), &o.name_any()),
                o.resource_version().unwrap_or_default(),
            )
        })
        .collect();
    let version = list.metadata.resource_version.clone().unwrap_or_default();
    (versions, version)
}

/// The objects `store` holds by [`key_of`] and version.
pub(crate) fn stored_versions<K>(store: &Store<K>) -> Versions
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store
        .state()
        .iter()
        .map(|o| {
            (
                key_of(o.namespace().as_deref(), &o.name_any()),
                o.resource_version().unwrap_or_default(),
            )
        })
        .collect()
}

/// Keeps a watch of objects that people and other processes create and edit honest (the
/// Operations, the ClusterLifecycle): every `check.every`, if the watch behind `store` has
/// been silent for `check.silent`, lists the same objects (the selectors of `config`, the
/// watch's) by their metadata, with a quorum read, and compares. An object created,
/// changed or deleted on the API server that the store does not show ([`behind`]), and
/// still does not after `check.grace`, means the watch is not delivering: it is opened
/// again through `liveness`, with a warning. Unlike [`keep_fresh`], this notices objects
/// created while the watch stalled; the list is small (metadata only, a few objects).
/// Never ends.
pub async fn keep_listed_fresh<K>(
    api: kube::Api<K>,
    config: watcher::Config,
    store: Store<K>,
    liveness: Liveness,
    check: FreshnessCheck,
) where
    K: Watchable,
{
    let params = kube::api::ListParams {
        label_selector: config.label_selector,
        field_selector: config.field_selector,
        ..Default::default()
    };
    loop {
        tokio::time::sleep(check.every).await;
        if liveness.silent_for() < check.silent {
            continue;
        }
        let Some(list) = check.read(|| api.list_metadata(&params)).await else {
            continue;
        };
        let (listed, list_version) = listed_versions(&list);
        let before = stored_versions(&store);
        let differ = behind(&listed, &list_version, &before);
        if differ.is_empty() {
            continue;
        }
        tokio::time::sleep(check.grace).await;
        let still = still_behind(&differ, &before, &stored_versions(&store));
        if let Some(first) = still.first() {
            tracing::warn!(
                watched = ?liveness.0.resource,
                object = %first,
                behind = still.len(),
                watched_version = before.get(first).map_or("absent", String::as_str),
                api_server_version = listed.get(first).map_or("deleted", String::as_str),
                silent_for = ?liveness.silent_for(),
                "the watch has brought nothing while the API server lists objects it does not show; watching again on a new connection"
            );
            liveness.reopen();
        }
    }
}

/// A seed for [`WatchBackoff::new`] from a name (FNV-1a).
pub fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_from_a_quarter_second_to_four_seconds_within_the_jitter() {
        let mut b = WatchBackoff::new(seed_of("node-1"));
        let waits: Vec<Duration> = (0..8).map(|_| b.next().unwrap()).collect();
        let bases = [250, 500, 1000, 2000, 4000, 4000, 4000, 4000];
        for (wait, base) in waits.iter().zip(bases) {
            let base = Duration::from_millis(base);
            assert!(
                *wait >= base * 3 / 4 && *wait < base * 5 / 4,
                "{wait:?} is outside ±25 % of {base:?} (all: {waits:?})"
            );
        }
        b.reset();
        let again = b.next().unwrap();
        assert!(again < FIRST * 5 / 4, "after reset: {again:?}");
    }

    #[tokio::test]
    async fn a_reopened_stream_is_dropped_and_made_again_and_only_ok_items_count_as_heard() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let opened = Arc::new(AtomicUsize::new(0));
        let live = Liveness::new(Watched::NodeTasks);
        let counter = opened.clone();
        // Each opening yields its number, an error, then nothing more (a stalled watch).
        let stream = reopening(
            move || {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                futures::stream::iter([Ok::<usize, String>(n), Err("no".to_owned())])
                    .chain(futures::stream::pending())
            },
            live.clone(),
        );
        let mut stream = Box::pin(stream);
        assert_eq!(stream.next().await, Some(Ok(0)));
        let heard = live.silent_for();
        assert_eq!(stream.next().await, Some(Err("no".to_owned())));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            live.silent_for() >= heard + Duration::from_millis(20),
            "an error is not hearing from the watch"
        );
        // Stalled: nothing comes until the watch is opened again.
        let stalled = tokio::time::timeout(Duration::from_millis(50), stream.next()).await;
        assert!(stalled.is_err(), "the stalled stream yielded {stalled:?}");
        live.reopen();
        assert_eq!(stream.next().await, Some(Ok(1)));
        assert_eq!(opened.load(Ordering::SeqCst), 2);
        // A reopen asked for while nobody polls is not lost, and comes before what the old
        // stream still had to say.
        live.reopen();
        assert_eq!(stream.next().await, Some(Ok(2)));
        assert_eq!(opened.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn successive_checks_read_every_awaited_object_in_turn() {
        use bosun_api::node_task::{NodeTask, NodeTaskSpec};
        let task = |name: &str| {
            Arc::new(NodeTask::new(
                name,
                NodeTaskSpec {
                    operation: "op".into(),
                    node_name: name.into(),
                    group: "g".into(),
                    steps: vec![],
                    dry_run: false,
                    step_timeout_seconds: None,
                    approve: false,
                    recovery: None,
                },
            ))
        };
        let all: Vec<_> = ["c", "a", "e", "b", "d"].into_iter().map(task).collect();
        let names = |turn| {
            sample_of(all.clone(), turn, 2)
                .iter()
                .map(|t| t.name_any())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(0), ["a", "b"]);
        assert_eq!(names(2), ["c", "d"]);
        assert_eq!(names(4), ["e", "a"]);
        assert_eq!(sample_of(all.clone(), 0, 9).len(), 5);
        assert!(sample_of(Vec::<Arc<NodeTask>>::new(), 3, 2).is_empty());
    }

    #[tokio::test]
    async fn a_read_is_tried_again_only_when_it_gets_no_answer() {
        use futures::FutureExt as _;
        use std::sync::atomic::{AtomicU32, Ordering};
        let check = FreshnessCheck {
            timeout: Duration::from_millis(20),
            tries: 3,
            ..FRESHNESS
        };
        // (what each try does, the read's result, how many tries were made)
        let hang = || futures::future::pending::<Result<u32, String>>().boxed();
        let cases: [(&str, Option<u32>, u32); 3] = [
            ("answer", Some(7), 1),
            ("error", None, 1),
            ("hang", None, 3),
        ];
        for (how, want, tries) in cases {
            let made = AtomicU32::new(0);
            let got = check
                .read(|| {
                    made.fetch_add(1, Ordering::SeqCst);
                    match how {
                        "answer" => futures::future::ready(Ok(7)).boxed(),
                        "error" => futures::future::ready(Err("refused".to_owned())).boxed(),
                        _ => hang(),
                    }
                })
                .await;
            assert_eq!(got, want, "{how}");
            assert_eq!(made.load(Ordering::SeqCst), tries, "{how}");
        }
    }

    #[test]
    fn a_store_is_behind_a_list_on_what_it_lacks_or_holds_older_and_not_on_what_is_newer() {
        let v = |pairs: &[(&str, &str)]| -> Versions {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        type Pairs<'a> = &'a [(&'a str, &'a str)];
        // (listed, list version, stored, behind)
        let cases: [(Pairs, &str, Pairs, &[&str]); 8] = [
            (&[("a", "5")], "9", &[("a", "5")], &[]),
            (&[], "9", &[], &[]),
            // Changed on the API server, the store still at the old version.
            (&[("a", "7")], "9", &[("a", "5")], &["a"]),
            // The store already newer than the list (an event after the list's snapshot).
            (&[("a", "7")], "9", &[("a", "11")], &[]),
            // Created while the watch stalled.
            (&[("a", "5"), ("b", "8")], "9", &[("a", "5")], &["b"]),
            // Deleted on the API server.
            (&[], "9", &[("a", "5")], &["a"]),
            // Created after the list was taken: not behind.
            (&[], "9", &[("a", "12")], &[]),
            // A version that is not an integer counts as different.
            (&[("a", "x")], "9", &[("a", "y")], &["a"]),
        ];
        for (listed, at, stored, want) in cases {
            assert_eq!(
                behind(&v(listed), at, &v(stored)),
                want.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
                "listed {listed:?} at {at}, stored {stored:?}"
            );
        }
        // After the grace: only what the watch still brought nothing for.
        let before = v(&[("a", "5"), ("c", "3")]);
        let after = v(&[("a", "7"), ("c", "3")]);
        let behind_then = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
        assert_eq!(still_behind(&behind_then, &before, &after), ["b", "c"]);
        assert_eq!(key_of(Some("ns"), "n"), "ns/n");
        assert_eq!(key_of(None, "n"), "n");
    }

    #[test]
    fn two_nodes_do_not_retry_in_step() {
        let mut a = WatchBackoff::new(seed_of("node-1"));
        let mut b = WatchBackoff::new(seed_of("node-2"));
        let a: Vec<Duration> = (0..6).map(|_| a.next().unwrap()).collect();
        let b: Vec<Duration> = (0..6).map(|_| b.next().unwrap()).collect();
        assert_ne!(a, b);
    }
}
