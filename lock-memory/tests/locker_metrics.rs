//! The Locker's metrics (`lock_core::metrics`), recorded on the in-process backend into a
//! `metrics-util` `DebuggingRecorder` installed as the global recorder: the counts and the
//! label sets match what each test did, the key label appears only when set, and a raw key
//! never appears in a label.
//!
//! Global, as in a program exporting its metrics: renewals run on the process's renewal
//! thread, which a thread's local recorder would not see. So the tests take turns, each
//! counting from what the ones before it left.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::metrics::names::*;
use lock_core::{
    Attempt, Backend, Capabilities, Error, HandOver, Lease, LockOptions, Locker, Owner, Result, Ttl,
};
use lock_memory::MemoryBackend;
use metrics::Unit;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;

/// What the recorder holds: per series (`name{label=value,…}`, labels sorted), the counter's
/// value or the number of values in the histogram; and the unit each name was described
/// with.
#[derive(Debug, Default)]
struct Seen {
    series: BTreeMap<String, u64>,
    units: BTreeMap<String, Option<Unit>>,
    labels: Vec<(String, String)>,
}

impl Seen {
    /// What was recorded since the last `take` (a snapshot drains the recorder).
    fn take(snapshotter: &Snapshotter) -> Seen {
        let mut seen = Seen::default();
        for (key, unit, _help, value) in snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let shown: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let name = key.name().to_owned();
            let series = format!("{name}{{{}}}", shown.join(","));
            let n = match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => n,
                (MetricKind::Histogram, DebugValue::Histogram(values)) => {
                    assert!(
                        values.iter().all(|v| v.into_inner() >= 0.0),
                        "{name}: {values:?}"
                    );
                    values.len() as u64
                }
                other => panic!("{name}: unexpected {other:?}"),
            };
            if n == 0 {
                continue;
            }
            seen.series.insert(series, n);
            seen.units.insert(name, unit);
            seen.labels.extend(labels);
        }
        seen
    }

    /// The value of `name` with exactly `labels` (besides `backend="memory"`); 0 when absent.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let mut all: Vec<(&str, &str)> = labels.to_vec();
        all.push(("backend", "memory"));
        all.sort();
        let shown: Vec<String> = all.iter().map(|(k, v)| format!("{k}={v}")).collect();
        self.series
            .get(&format!("{name}{{{}}}", shown.join(",")))
            .copied()
            .unwrap_or(0)
    }

    /// Asserts that no label of any series carries one of `keys`.
    fn no_key_in_labels(&self, keys: &[&str]) {
        for (label, value) in &self.labels {
            for key in keys {
                assert!(
                    !value.contains(key),
                    "label {label}={value:?} carries the key {key:?}: {self:#?}"
                );
            }
        }
    }
}

/// The global recorder, for one test at a time (the turn is kept until the guard drops),
/// drained of what the tests before left.
async fn recorder() -> (tokio::sync::MutexGuard<'static, ()>, &'static Snapshotter) {
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    let turn = ONE_AT_A_TIME.lock().await;
    let snapshotter = SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the test binary's only global recorder");
        snapshotter
    });
    Seen::take(snapshotter);
    (turn, snapshotter)
}

fn skip() -> LockOptions {
    LockOptions::new().skip().ttl(Duration::from_secs(10))
}

/// Grants, refusals, a timeout, a waiting grant, an invalid key, a release after the TTL
/// and a lock lost behind the holder's back are each counted once under the right
/// outcome or kind, with the `backend` label and no key label; the keys never show.
#[tokio::test]
async fn counts_and_labels_match_what_was_done() {
    let (_turn, snapshotter) = recorder().await;
    let backend = Arc::new(MemoryBackend::new());
    let locker = Locker::with_backend(backend.clone());

    // 3 grants on distinct keys.
    for i in 0..3 {
        let guard = locker
            .acquire(&format!("order/{i}"), &skip())
            .await
            .unwrap();
        guard.release().await.unwrap();
    }
    // 2 refusals of a held key, then a bounded wait that times out.
    let holder = locker.acquire("stock/item-42", &skip()).await.unwrap();
    for _ in 0..2 {
        assert!(locker.try_acquire("stock/item-42").await.unwrap().is_none());
    }
    let waited = locker
        .acquire("stock/item-42", &skip().wait_for(Duration::from_millis(30)))
        .await;
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    // A wait that ends in a grant when the holder releases.
    let patient = skip().wait_for(Duration::from_secs(5));
    let (waiter, ()) = tokio::join!(locker.acquire("stock/item-42", &patient), async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        holder.release().await.unwrap();
    });
    waiter.unwrap().release().await.unwrap();
    // An invalid key: refused before any I/O.
    assert!(matches!(
        locker.acquire("", &skip()).await,
        Err(Error::InvalidKey { .. })
    ));
    // A release after the TTL passed (watchdog off): not held.
    let short = locker
        .acquire(
            "short/1",
            &skip().ttl(Duration::from_millis(20)).watchdog(false),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(40)).await;
    assert!(matches!(short.release().await, Err(Error::NotHeld { .. })));
    // A lock deleted behind the holder's back: the watchdog's renewal is refused.
    let doomed = locker
        .acquire("lost/1", &skip().ttl(Duration::from_millis(300)))
        .await
        .unwrap();
    let admin = backend.admin().unwrap();
    assert!(admin.force_release("lost/1").await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), doomed.lost())
        .await
        .expect("the loss is noticed at the next renewal");
    drop(doomed);
    locker.settle().await;

    let seen = Seen::take(snapshotter);
    // 3 + the holder + the waiter + short + doomed.
    assert_eq!(
        seen.get(ACQUIRE_DURATION, &[("outcome", "granted")]),
        7,
        "{seen:#?}"
    );
    assert_eq!(
        seen.get(ACQUIRE_DURATION, &[("outcome", "refused")]),
        2,
        "{seen:#?}"
    );
    assert_eq!(
        seen.get(ACQUIRE_DURATION, &[("outcome", "timed_out")]),
        1,
        "{seen:#?}"
    );
    assert_eq!(
        seen.get(ACQUIRE_DURATION, &[("outcome", "error")]),
        1,
        "{seen:#?}"
    );
    // Only the two acquisitions that waited.
    assert_eq!(
        seen.get(WAIT_DURATION, &[("outcome", "granted")]),
        1,
        "{seen:#?}"
    );
    assert_eq!(
        seen.get(WAIT_DURATION, &[("outcome", "timed_out")]),
        1,
        "{seen:#?}"
    );
    assert_eq!(
        seen.get(WAIT_DURATION, &[("outcome", "refused")]),
        0,
        "{seen:#?}"
    );
    // Every hold ended once: released, released too late, or lost.
    assert_eq!(seen.get(HOLD_DURATION, &[]), 7, "{seen:#?}");
    assert_eq!(seen.get(LOST, &[]), 1, "{seen:#?}");
    assert_eq!(seen.get(RENEWALS_FAILED, &[]), 1, "{seen:#?}");
    assert_eq!(seen.get(HAND_OVERS, &[]), 0, "{seen:#?}");
    assert_eq!(seen.get(ERRORS, &[("kind", "invalid_key")]), 1, "{seen:#?}");
    // The late release and the refused renewal.
    assert_eq!(seen.get(ERRORS, &[("kind", "not_held")]), 2, "{seen:#?}");
    let errors: u64 = seen
        .series
        .iter()
        .filter(|(k, _)| k.starts_with(ERRORS))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(errors, 3, "no other error: {seen:#?}");
    // Labels: backend always, outcome or kind where they belong, nothing else.
    for series in seen.series.keys() {
        assert!(series.starts_with("distlock_"), "{series}");
        assert!(series.contains("backend=memory"), "{series}");
        assert!(!series.contains("key_label"), "{series}");
    }
    seen.no_key_in_labels(&["order/", "stock/item-42", "short/1", "lost/1"]);
    // Described with their units.
    for name in [ACQUIRE_DURATION, WAIT_DURATION, HOLD_DURATION] {
        assert_eq!(seen.units[name], Some(Unit::Seconds), "{name}");
        assert!(name.ends_with("_seconds"));
    }
    for name in [LOST, RENEWALS_FAILED, ERRORS] {
        assert!(name.ends_with("_total"));
    }
}

/// `LockOptions::metrics_label` adds `key_label` to the acquisition's series and to its
/// guard's; acquisitions without it keep series without it, counted apart.
#[tokio::test]
async fn the_key_label_is_the_applications_not_the_key() {
    let (_turn, snapshotter) = recorder().await;
    let locker = Locker::new(MemoryBackend::new());
    let jobs = skip().metrics_label("jobs");

    let a = locker.acquire("jobs/nightly", &jobs).await.unwrap();
    let b = locker.acquire("jobs/hourly", &jobs).await.unwrap();
    assert!(matches!(
        locker.acquire("jobs/nightly", &jobs).await,
        Err(Error::Locked { .. })
    ));
    let plain = locker.acquire("jobs/weekly", &skip()).await.unwrap();
    a.release().await.unwrap();
    b.release().await.unwrap();
    plain.release().await.unwrap();

    let seen = Seen::take(snapshotter);
    let jobs = ("key_label", "jobs");
    assert_eq!(
        seen.get(ACQUIRE_DURATION, &[("outcome", "granted"), jobs]),
        2,
        "{seen:#?}"
    );
    assert_eq!(
        seen.get(ACQUIRE_DURATION, &[("outcome", "refused"), jobs]),
        1,
        "{seen:#?}"
    );
    assert_eq!(seen.get(HOLD_DURATION, &[jobs]), 2, "{seen:#?}");
    assert_eq!(
        seen.get(ACQUIRE_DURATION, &[("outcome", "granted")]),
        1,
        "{seen:#?}"
    );
    assert_eq!(seen.get(HOLD_DURATION, &[]), 1, "{seen:#?}");
    seen.no_key_in_labels(&["jobs/nightly", "jobs/hourly", "jobs/weekly"]);
}

/// The memory backend with a one-step hand-over, as a networked backend has: the release
/// of the holder's lease and the grant to the waiter, in one call. (Memory answers in
/// process and so never hands over; this backend does not say it answers in process.)
struct HandingOver(MemoryBackend);

#[async_trait]
impl Backend for HandingOver {
    fn capabilities(&self) -> &Capabilities {
        self.0.capabilities()
    }
    async fn try_acquire(
        &self,
        key: &str,
        owner: Owner,
        permits: lock_core::Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        self.0.try_acquire(key, owner, permits, ttl).await
    }
    async fn extend(&self, lease: &Lease, ttl: Ttl) -> Result<Instant> {
        self.0.extend(lease, ttl).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.0.release(lease).await
    }
    fn listen(&self, key: &str) -> Option<lock_core::ReleaseListener> {
        self.0.listen(key)
    }
    fn hand_over(&self) -> Option<&dyn HandOver> {
        Some(self)
    }
}

#[async_trait]
impl HandOver for HandingOver {
    async fn hand_over(&self, from: &Lease, to: Owner, ttl: Ttl) -> Result<Attempt> {
        match self.0.release(from).await {
            Ok(()) => {
                self.0
                    .try_acquire(from.key(), to, from.permits(), ttl)
                    .await
            }
            Err(Error::NotHeld { .. }) => Ok(Attempt::Taken { expires_in: None }),
            Err(e) => Err(e),
        }
    }
}

/// A release that hands the key to the Locker's next waiter is counted as a hand-over.
///
/// A holds; B and C wait. A's release is seen by B on the server (A was not granted
/// through the queue); B, granted through it, is C's local holder and hands the key over
/// to C at its release: one hand-over, three grants, two of them after a wait.
#[tokio::test]
async fn a_hand_over_is_counted() {
    let (_turn, snapshotter) = recorder().await;
    let locker = Locker::new(HandingOver(MemoryBackend::new()));
    let a = locker.acquire("queue/head", &skip()).await.unwrap();
    let patient = skip().wait_for(Duration::from_secs(5));
    let pause = || tokio::time::sleep(Duration::from_millis(20));
    let b = async {
        let b = locker.acquire("queue/head", &patient).await.unwrap();
        pause().await;
        b.release().await.unwrap();
    };
    let c = async {
        pause().await;
        locker.acquire("queue/head", &patient).await.unwrap()
    };
    let release_a = async {
        pause().await;
        pause().await;
        a.release().await.unwrap();
    };
    let ((), c, ()) = tokio::join!(b, c, release_a);
    c.release().await.unwrap();
    locker.settle().await;

    let seen = Seen::take(snapshotter);
    assert_eq!(seen.get(HAND_OVERS, &[]), 1, "{seen:#?}");
    assert_eq!(
        seen.get(ACQUIRE_DURATION, &[("outcome", "granted")]),
        3,
        "{seen:#?}"
    );
    assert_eq!(
        seen.get(WAIT_DURATION, &[("outcome", "granted")]),
        2,
        "{seen:#?}"
    );
    assert_eq!(seen.get(HOLD_DURATION, &[]), 3, "{seen:#?}");
    seen.no_key_in_labels(&["queue/head"]);
}
