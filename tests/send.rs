//! Compile-time checks that the types and futures applications move between tasks are
//! `Send` (and `Sync` where they are shared): a `Locker` in an `Arc`, a guard held across
//! an `.await` inside `tokio::spawn`, the futures of every acquiring and releasing method.
//! The test fails to build, not at run time, when one stops being so.

use std::time::{Duration, SystemTime};

use distlock::{LockGuard, LockOptions, Locker};

fn send<T: Send>(_: &T) {}
fn send_sync<T: Send + Sync>() {}
fn send_static<T: Send + 'static>(_: &T) {}

/// The futures are built but never polled: only their types are checked.
#[allow(clippy::let_underscore_future)]
fn futures_are_send(locker: &Locker, guard: LockGuard) {
    let opts = LockOptions::new();
    send(&locker.lock("k"));
    send(&locker.try_acquire("k"));
    send(&locker.acquire("k", &opts));
    send(&locker.acquire_many(&["a", "b"], &opts));
    send(&locker.run("k", &opts, async { 1 }));
    send(&locker.run_scheduled("k", SystemTime::now(), "replica", &opts, async { 1 }));
    send(&locker.claim_fire_time("k", SystemTime::now(), "replica"));
    send(&locker.fire_claim("k"));
    send(&locker.settle());
    send(&locker.shutdown());
    send(&guard.extend(Duration::from_secs(1)));
    send_static(&guard.lost());
    send(&guard.release());
}

/// A guard kept across an await in a spawned task: the shape of most applications.
async fn spawned(locker: Locker) {
    if let Ok(guard) = locker.lock("k").await {
        tokio::task::yield_now().await;
        let _ = guard.extend(Duration::from_secs(1)).await;
        let _ = guard.release().await;
    }
}

#[test]
fn lockers_guards_and_their_futures_are_send() {
    send_sync::<Locker>();
    send_sync::<LockGuard>();
    send_sync::<LockOptions>();
    send_sync::<distlock::Error>();
    // Referenced so the checks above are compiled (they are never called).
    let _ = futures_are_send as fn(&Locker, LockGuard);
    let _ = spawned as fn(Locker) -> _;
}
