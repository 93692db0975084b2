//! The Locker's watchdog across runtimes: renewals run on the process-wide renewal thread
//! (`distlock-renewal`, with a current-thread runtime of its own), not on a runtime that
//! granted, so when the runtime that granted first ends, its guard and guards granted on
//! another runtime are still renewed.

use std::time::{Duration, Instant};

use lock_core::{LockOptions, Locker};
use lock_memory::MemoryBackend;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn renewals_go_on_after_the_runtime_that_ran_them_ended() {
    let locker = Locker::new(MemoryBackend::new());
    let other = Locker::with_backend(locker.backend().clone());
    let ttl = Duration::from_millis(200);
    let opts = LockOptions::new().ttl(ttl).wait_for(Duration::from_secs(1));

    // Runtime A grants first: the watchdog's task runs there. Its guard outlives it.
    let first = runtime();
    let kept = first.block_on(locker.acquire("watchdog/a", &opts)).unwrap();
    drop(first);

    // Runtime B grants a guard of its own, which must be renewed across five TTLs.
    let second = runtime();
    second.block_on(async {
        let guard = locker.acquire("watchdog/b", &opts).await.unwrap();
        let end = Instant::now() + ttl * 5;
        while Instant::now() < end {
            tokio::time::sleep(ttl / 2).await;
            assert!(
                !guard.is_lost(),
                "renewed by the renewal thread while runtime B waits"
            );
            assert!(
                other.try_acquire("watchdog/b").await.unwrap().is_none(),
                "the renewed lock stays held"
            );
        }
        guard.release().await.expect("still held after five TTLs");
        // The guard of runtime A was renewed too, once B's task ran the schedule.
        assert!(!kept.is_lost());
        kept.release()
            .await
            .expect("A's guard renewed after runtime A ended");
        assert_eq!(locker.stats().renewals_scheduled, 0, "{:?}", locker.stats());
    });
}
