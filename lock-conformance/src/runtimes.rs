//! The rules of a Locker shared by several tokio runtimes, of the watchdog after an
//! `extend`, and of fences granted in quick succession.

use std::time::{Duration, Instant};

use super::target::{opts, slack, Target};
use lock_core::{LockGuard, Locker};

/// A current-thread runtime of its own, built on a blocking thread.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Asserts, every half TTL for `span`, that `guards` stay held: not lost, and refused to
/// `other`.
async fn stay_held(other: &Locker, guards: &[(&LockGuard, &str)], ttl: Duration, span: Duration) {
    let end = Instant::now() + span;
    while Instant::now() < end {
        tokio::time::sleep(ttl / 2).await;
        for (guard, key) in guards {
            assert!(!guard.is_lost(), "{key} is renewed");
            assert!(
                other.try_acquire(*key).await.unwrap().is_none(),
                "renewed lock {key} stays held"
            );
        }
    }
}

/// A Locker used from several runtimes renews every guard, whichever runtime granted it:
/// guards stay held while another runtime that granted one idles, and after that runtime
/// is dropped; `shutdown` then returns.
pub async fn a_locker_works_across_runtimes(t: &Target) {
    let (locker, other) = (t.locker(), t.locker());
    let ttl = t.short_ttl();
    let (key_a, key_b) = (t.key("runtime-a"), t.key("runtime-b"));
    // Runtime A grants first (the first renewal of the Locker is scheduled there), then
    // nobody drives it.
    let (l, k) = (locker.clone(), key_a.clone());
    let (idle, guard_a) = tokio::task::spawn_blocking(move || {
        let rt = runtime();
        let guard = rt.block_on(l.acquire(&k, &opts(ttl)));
        (rt, guard)
    })
    .await
    .expect("runtime A");
    let guard_a = guard_a.expect("granted on runtime A");
    let guard_b = locker.acquire(&key_b, &opts(ttl)).await.unwrap();
    let both = [(&guard_a, key_a.as_str()), (&guard_b, key_b.as_str())];
    stay_held(&other, &both, ttl, ttl * 4).await;
    tokio::task::spawn_blocking(move || drop(idle))
        .await
        .expect("runtime A dropped");
    stay_held(&other, &both, ttl, ttl * 4).await;
    let guard_c = locker
        .acquire(&t.key("runtime-c"), &opts(ttl))
        .await
        .unwrap();
    guard_a.release().await.expect("A's guard still ours");
    guard_b.release().await.expect("B's guard still ours");
    tokio::time::timeout(Duration::from_secs(10), locker.shutdown())
        .await
        .expect("shutdown returns while a runtime that granted is gone");
    assert!(guard_c.is_lost(), "shutdown released the last guard");
    assert_eq!(locker.stats().renewals_scheduled, 0, "{:?}", locker.stats());
}

/// A guard dropped on a runtime that is then dropped before its background release ran
/// leaves nothing waiting: `settle` and `shutdown` return on another runtime, the key's
/// local queue is empty, and the key is taken again once its TTL passed.
pub async fn a_dropped_runtime_leaves_nothing_waiting(t: &Target) {
    let (locker, other) = (t.locker(), t.locker());
    let ttl = t.short_ttl();
    let key = t.key("dropped-runtime");
    let guard = locker.acquire(&key, &opts(ttl)).await.unwrap();
    tokio::task::spawn_blocking(move || {
        let rt = runtime();
        // The release is spawned on `rt`, which is dropped before it ran to its end.
        rt.block_on(async move { drop(guard) });
        drop(rt);
    })
    .await
    .expect("the short-lived runtime");
    tokio::time::timeout(Duration::from_secs(10), locker.settle())
        .await
        .expect("settle returns after the runtime of a background release is gone");
    let stats = locker.stats();
    assert_eq!(
        (stats.background_tasks, stats.queued_keys, stats.held),
        (0, 0, 0),
        "{stats:?}"
    );
    // Released or left to its TTL: either way taken again in time, also by this Locker.
    for who in [&locker, &other] {
        let again = tokio::time::timeout(
            ttl * 4 + slack(t) * 4,
            who.acquire(&key, &opts(ttl).wait_for(ttl * 4)),
        )
        .await
        .expect("the acquisition returns")
        .expect("the key is free at the latest after its TTL");
        again.release().await.unwrap();
    }
    tokio::time::timeout(Duration::from_secs(10), locker.shutdown())
        .await
        .expect("shutdown returns");
}

/// An `extend` to a TTL shorter than the time to the watchdog's next turn keeps the lock:
/// the watchdog goes on from the extension with the extended TTL.
pub async fn extend_then_watchdog_keeps_the_extended_ttl(t: &Target) {
    let (locker, other) = (t.locker(), t.locker());
    let short = t.short_ttl();
    let key = t.key("extend-watchdog");
    let guard = locker.acquire(&key, &opts(short * 6)).await.unwrap();
    guard.extend(short).await.expect("extended");
    assert_eq!(guard.ttl(), t.ttl(short).get());
    stay_held(&other, &[(&guard, key.as_str())], short, short * 5).await;
    assert_eq!(
        guard.ttl(),
        t.ttl(short).get(),
        "the watchdog kept the TTL set"
    );
    guard.release().await.expect("still ours");
}

/// Grants of one key in quick succession, several within one millisecond on a fast
/// server, get strictly increasing fences (on a backend that claims monotonic fencing).
pub async fn fences_increase_within_a_millisecond(t: &Target) {
    if !t.caps().monotonic_fencing {
        eprintln!(
            "conformance: fences_increase_within_a_millisecond not run (no monotonic fencing)"
        );
        return;
    }
    let locker = t.locker();
    let key = t.key("fence-burst");
    let mut last = 0;
    for i in 0..300 {
        let guard = locker
            .try_acquire(&key)
            .await
            .unwrap()
            .expect("the key is free");
        let fence = guard.fence();
        assert!(fence > last, "grant {i}: fence {fence} after {last}");
        last = fence;
        guard.release().await.unwrap();
    }
}
