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

use std::time::{Duration, Instant};

use bosun_telemetry::Watched;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;

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

/// The trigger stream and store of a kube-runtime `Controller` of `api`'s objects, built as
/// `Controller::new` builds them (a reflector over a watcher), with the watch's lists counted
/// as `resource` ([`count_lists`]). For `Controller::for_stream(triggers, store)`.
pub fn counted_controller_source<K>(
    api: kube::Api<K>,
    config: watcher::Config,
    resource: Watched,
) -> (
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    kube::runtime::reflector::Store<K>,
)
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    use futures::StreamExt as _;
    use kube::runtime::WatchStreamExt as _;
    let writer = kube::runtime::reflector::store::Writer::<K>::default();
    let store = writer.as_reader();
    let triggers = kube::runtime::reflector::reflector(
        writer,
        watcher(api, config).inspect(count_lists(resource)),
    )
    .applied_objects();
    (triggers, store)
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

    #[test]
    fn two_nodes_do_not_retry_in_step() {
        let mut a = WatchBackoff::new(seed_of("node-1"));
        let mut b = WatchBackoff::new(seed_of("node-2"));
        let a: Vec<Duration> = (0..6).map(|_| a.next().unwrap()).collect();
        let b: Vec<Duration> = (0..6).map(|_| b.next().unwrap()).collect();
        assert_ne!(a, b);
    }
}
