//! Behaviour of the in-process table that the conformance suite does not cover: memory
//! returning to baseline, FIFO hand-off inside a Locker, and expiry sweeping.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::{LockOptions, Locker};
use lock_memory::MemoryBackend;

/// After a million distinct keys are acquired and released, nothing is left in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_keys_leave_the_table_empty() {
    let backend = Arc::new(MemoryBackend::new());
    let locker = Locker::with_backend(backend.clone());
    let opts = LockOptions::new().skip().watchdog(false);
    for i in 0..1_000_000u32 {
        let guard = locker.acquire(&format!("key-{i}"), &opts).await.unwrap();
        guard.release().await.unwrap();
    }
    // Dropped guards (released in the background) leave nothing behind either.
    for i in 0..10_000u32 {
        drop(
            locker
                .acquire(&format!("dropped-{i}"), &opts)
                .await
                .unwrap(),
        );
    }
    locker.settle().await;
    assert_eq!(backend.held_keys(), 0);
    assert_eq!(backend.listened_keys(), 0);
    let stats = locker.stats();
    assert_eq!(
        (stats.held, stats.queued_keys, stats.background_tasks),
        (0, 0, 0)
    );
}

/// Waiters of one Locker are granted the key in the order they arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_arrival_order() {
    let locker = Locker::new(MemoryBackend::new());
    let opts = LockOptions::new().wait_forever().watchdog(false);
    let first = locker.acquire("fifo", &opts).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (locker, order, opts) = (locker.clone(), order.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            let g = locker.acquire("fifo", &opts).await.unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(1)).await;
            g.release().await.unwrap();
        }));
        // Let task i enqueue before task i + 1 starts.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..16).collect::<Vec<_>>());
}

/// Expired entries whose holders vanished (guards forgotten) are swept as the table grows.
#[tokio::test]
async fn expired_entries_are_swept() {
    let backend = Arc::new(MemoryBackend::new());
    let locker = Locker::with_backend(backend.clone());
    let short = LockOptions::new()
        .skip()
        .watchdog(false)
        .ttl(Duration::from_millis(5));
    for i in 0..1000 {
        std::mem::forget(locker.acquire(&format!("leak-{i}"), &short).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let long = short.clone().ttl(Duration::from_secs(60));
    for i in 0..2000 {
        std::mem::forget(locker.acquire(&format!("live-{i}"), &long).await.unwrap());
    }
    assert!(
        backend.held_keys() <= 2000 + 64,
        "expired entries were not swept: {}",
        backend.held_keys()
    );
}

/// A guard dropped outside any tokio runtime does not panic; its lock expires at its TTL.
#[test]
fn a_guard_dropped_outside_a_runtime_does_not_panic() {
    let backend = Arc::new(MemoryBackend::new());
    let locker = Locker::with_backend(backend.clone());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let guard = rt
        .block_on(locker.acquire(
            "orphan",
            &LockOptions::new().skip().ttl(Duration::from_millis(50)),
        ))
        .unwrap();
    drop(rt);
    drop(guard);
    std::thread::sleep(Duration::from_millis(60));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let again = rt.block_on(locker.try_acquire("orphan")).unwrap();
    assert!(again.is_some(), "the lock expired at its TTL");
}

/// A release reports exactly whether the TTL had passed, whether the lock ends long before,
/// just before or after its expiry (the table answers from a coarse clock when it can).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_reports_expiry_exactly() {
    let locker = Locker::new(MemoryBackend::new());
    let long = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .skip()
        .watchdog(false);
    let guard = locker.acquire("long", &long).await.unwrap();
    guard.release().await.expect("a fresh lock is still ours");

    let short = LockOptions::new()
        .ttl(Duration::from_millis(30))
        .skip()
        .watchdog(false);
    // Released a few ms before the expiry: within the coarse clock's margin. A loaded machine
    // can wake this task late, past the expiry; only a release that returned before the
    // expiry is judged, and a late round is tried again.
    let mut judged = 0;
    for _ in 0..50 {
        let guard = locker.acquire("short", &short).await.unwrap();
        let expiry = guard.valid_until();
        tokio::time::sleep_until((expiry - Duration::from_millis(5)).into()).await;
        let released = guard.release().await;
        if std::time::Instant::now() < expiry {
            released.expect("a release that returns before the expiry finds the lock ours");
            judged += 1;
            if judged == 3 {
                break;
            }
        }
    }
    assert!(
        judged > 0,
        "no round released before the expiry in 50 tries"
    );
    // Released just after and long after the expiry.
    for after in [Duration::from_millis(1), Duration::from_millis(100)] {
        let guard = locker.acquire("short", &short).await.unwrap();
        tokio::time::sleep_until((guard.valid_until() + after).into()).await;
        assert!(
            matches!(guard.release().await, Err(lock_core::Error::NotHeld { .. })),
            "{after:?} after expiry the lock is not ours"
        );
    }
}

/// Counts the attempts that reach the backend.
struct Counting {
    inner: MemoryBackend,
    attempts: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl lock_core::Backend for Counting {
    fn capabilities(&self) -> &lock_core::Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(
        &self,
        key: &str,
        owner: lock_core::Owner,
        permits: lock_core::Permits,
        ttl: lock_core::Ttl,
    ) -> lock_core::Result<lock_core::Attempt> {
        self.attempts
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.try_acquire(key, owner, permits, ttl).await
    }
    async fn extend(
        &self,
        lease: &lock_core::Lease,
        ttl: lock_core::Ttl,
    ) -> lock_core::Result<std::time::Instant> {
        self.inner.extend(lease, ttl).await
    }
    async fn release(&self, lease: &lock_core::Lease) -> lock_core::Result<()> {
        self.inner.release(lease).await
    }
    fn listen(&self, key: &str) -> Option<lock_core::ReleaseListener> {
        self.inner.listen(key)
    }
}

/// While a guard of the Locker holds a key, the head of its queue waits for that guard's
/// release instead of spending refused attempts on the backend: one attempt per grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_waiters_do_not_attempt_while_a_sibling_holds() {
    let backend = Arc::new(Counting {
        inner: MemoryBackend::new(),
        attempts: Default::default(),
    });
    let locker = Locker::with_backend(backend.clone());
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .watchdog(false);
    let (tasks, rounds) = (8, 10);
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (locker, opts) = (locker.clone(), opts.clone());
            tokio::spawn(async move {
                for _ in 0..rounds {
                    let guard = locker.acquire("sibling", &opts).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    let attempts = backend.attempts.load(std::sync::atomic::Ordering::SeqCst);
    let grants = tasks * rounds;
    // The first waiters each try once before the queue forms; after that, one per grant.
    assert!(
        attempts <= grants + tasks,
        "{attempts} attempts for {grants} grants: waiters attempted while a sibling held"
    );
}

/// A sibling holder whose validity passed without renewal (watchdog off, guard not yet
/// dropped) no longer holds the queue back: the waiter behind it is granted once the TTL
/// has passed, not when the stale guard is finally dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_not_held_back_by_an_expired_sibling() {
    let locker = Locker::new(MemoryBackend::new());
    let short = LockOptions::new()
        .ttl(Duration::from_millis(100))
        .wait_for(Duration::from_secs(5))
        .watchdog(false);
    // The stale guard must be one that won the key through the queue, as the waiters
    // behind it then wait for its end rather than ask the backend.
    let first = locker.acquire("stale", &short).await.unwrap();
    let second = {
        let (locker, short) = (locker.clone(), short.clone());
        tokio::spawn(async move { locker.acquire("stale", &short).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    first.release().await.unwrap();
    let stale = second.await.unwrap().unwrap();
    let asked = std::time::Instant::now();
    let third = locker.acquire("stale", &short);
    let third = tokio::time::timeout(Duration::from_secs(2), third)
        .await
        .expect("granted after the stale holder's TTL, long before it is dropped")
        .unwrap();
    assert!(
        asked.elapsed() >= Duration::from_millis(50),
        "not before the TTL"
    );
    assert!(third.fence() > stale.fence());
    drop(stale);
    third.release().await.unwrap();
}
