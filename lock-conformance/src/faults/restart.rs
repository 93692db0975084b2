//! The restart rules: locks lost or kept by a restart, waiters woken after it, fences
//! moving forward across it.

use std::time::{Duration, Instant};

use super::common::{faults, not_run};
use super::hooks::{Applied, FaultHook};
use crate::target::{opts, spawn_acquire, Target};
use lock_core::{Error, Locker};

/// After a restart that loses the locks, the holders' extend and release say NotHeld.
///
/// Not a script or connection error; inspect sees the key free, force-release finds
/// nothing, and a new grant of the key gets a higher fence.
pub async fn a_restart_that_loses_the_locks_leaves_holders_not_held(t: &Target) -> Applied {
    const RULE: &str = "a_restart_that_loses_the_locks_leaves_holders_not_held";
    let f = match faults(t, RULE) {
        Ok(f) => f,
        Err(no) => return no,
    };
    let Some(restart) = f.restart_losing_locks.clone() else {
        return not_run(t, RULE, "no `restart_losing_locks` hook");
    };
    let locker = t.locker();
    let (key_a, key_b) = (t.key("restart-a"), t.key("restart-b"));
    let ttl = Duration::from_secs(10);
    let a = locker
        .acquire(&key_a, &opts(ttl).watchdog(false))
        .await
        .unwrap();
    let b = locker
        .acquire(&key_b, &opts(ttl).watchdog(false))
        .await
        .unwrap();
    let old_fence = a.fence();
    restart().await;
    // A server that forgot its locks may have forgotten its scripts too (Redis's cache):
    // the first use of each after the restart meets an empty cache.
    match a.extend(ttl).await {
        Err(Error::NotHeld { key }) => assert_eq!(key, key_a),
        other => panic!("extend after a restart: expected NotHeld, got {other:?}"),
    }
    assert!(a.is_lost());
    match b.release().await {
        Err(Error::NotHeld { key }) => assert_eq!(key, key_b),
        other => panic!("release after a restart: expected NotHeld, got {other:?}"),
    }
    match t.backend.admin() {
        Some(admin) => {
            assert_eq!(admin.inspect(&key_a).await.unwrap(), vec![]);
            assert!(!admin.force_release(&key_a).await.unwrap());
        }
        None => eprintln!(
            "conformance [{}]: {RULE}: no admin(), inspect not checked",
            t.caps().name
        ),
    }
    let again = locker
        .acquire(&key_a, &opts(ttl).watchdog(false))
        .await
        .expect("new acquires work after a restart");
    if t.caps().monotonic_fencing {
        assert!(
            again.fence() > old_fence,
            "{} after {old_fence}",
            again.fence()
        );
    }
    assert!(matches!(a.release().await, Err(Error::NotHeld { .. })));
    again.release().await.unwrap();
    Applied::Ran
}

/// A waiter elsewhere is granted soon after a restart that lost its holder's lock.
///
/// Within 5 s of the restart, long before the holder's 30 s TTL: its release notices
/// come back and wake it.
pub async fn waiters_wake_after_a_restart_that_loses_the_locks(t: &Target) -> Applied {
    const RULE: &str = "waiters_wake_after_a_restart_that_loses_the_locks";
    let f = match faults(t, RULE) {
        Ok(f) => f,
        Err(no) => return no,
    };
    let Some(restart) = f.restart_losing_locks.clone() else {
        return not_run(t, RULE, "no `restart_losing_locks` hook");
    };
    if !t.caps().release_notices {
        return not_run(
            t,
            RULE,
            "the backend announces no releases (release_notices)",
        );
    }
    let Some(peer) = f.peer.clone() else {
        return not_run(t, RULE, "no `peer` backend to wait in another process");
    };
    let (a, b) = (t.locker(), Locker::with_backend(peer));
    let key = t.key("resubscribe");
    let ttl = Duration::from_secs(30);
    let _held = a.acquire(&key, &opts(ttl).watchdog(false)).await.unwrap();
    let waiter = spawn_acquire(
        &b,
        &key,
        &opts(ttl).watchdog(false).wait_for(Duration::from_secs(20)),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let restarted = Instant::now();
    restart().await;
    let g = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter is woken after its release notices come back")
        .unwrap()
        .expect("and gets the lock");
    assert!(restarted.elapsed() < Duration::from_secs(5));
    g.release().await.unwrap();
    Applied::Ran
}

/// A renewing holder keeps its lock across a restart that keeps the locks.
///
/// Same fence, still refused to another process; its release then reaches a waiter in
/// that process within 500 ms (with release notices), which gets a higher fence.
pub async fn a_lock_survives_a_restart_that_keeps_the_locks(t: &Target) -> Applied {
    const RULE: &str = "a_lock_survives_a_restart_that_keeps_the_locks";
    let f = match faults(t, RULE) {
        Ok(f) => f,
        Err(no) => return no,
    };
    let Some(restart) = f.restart_keeping_locks.clone() else {
        return not_run(t, RULE, "no `restart_keeping_locks` hook");
    };
    let Some(peer) = f.peer.clone() else {
        return not_run(t, RULE, "no `peer` backend to wait in another process");
    };
    let (a, b) = (t.locker(), Locker::with_backend(peer));
    let key = t.key("survives");
    let ttl = t.ttl(Duration::from_secs(5)).get();
    let guard = a.acquire(&key, &opts(ttl)).await.unwrap();
    let fence = guard.fence();

    restart().await;
    // Two renewal periods after the restart: the watchdog found the lock again.
    tokio::time::sleep(ttl * 2 / 3).await;
    assert!(!guard.is_lost(), "the lock survives the restart");
    assert_eq!(guard.fence(), fence);
    assert!(b.try_acquire(&key).await.unwrap().is_none(), "still held");

    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            let g = b
                .acquire(&key, &opts(ttl).wait_for(Duration::from_secs(10)))
                .await;
            (Instant::now(), g)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    guard.release().await.expect("released after the restart");
    let (granted_at, g) = waiter.await.unwrap();
    let g = g.expect("the waiter gets the lock");
    if t.caps().monotonic_fencing {
        assert!(g.fence() > fence, "{} after {fence}", g.fence());
    }
    if t.caps().release_notices {
        let delay = granted_at - released_at;
        assert!(
            delay < Duration::from_millis(500),
            "hand-off after a restart took {delay:?}: the release notices must be back"
        );
    }
    g.release().await.unwrap();
    Applied::Ran
}

/// Fencing tokens keep strictly increasing across restarts of the servers.
///
/// Three restarts of each kind the target has (losing or keeping the locks), three
/// grants before each.
pub async fn fences_increase_across_restarts(t: &Target) -> Applied {
    const RULE: &str = "fences_increase_across_restarts";
    let f = match faults(t, RULE) {
        Ok(f) => f,
        Err(no) => return no,
    };
    if !t.caps().monotonic_fencing {
        return not_run(t, RULE, "the backend promises no monotonic fencing");
    }
    let restarts: Vec<(&str, FaultHook)> = [
        ("restart_losing_locks", f.restart_losing_locks.clone()),
        ("restart_keeping_locks", f.restart_keeping_locks.clone()),
    ]
    .into_iter()
    .filter_map(|(name, hook)| Some((name, hook?)))
    .collect();
    if restarts.is_empty() {
        return not_run(t, RULE, "no restart hook");
    }
    let locker = t.locker();
    let key = t.key("restart-fence");
    let o = opts(Duration::from_secs(10)).watchdog(false);
    let mut fences = Vec::new();
    for (name, restart) in &restarts {
        for _ in 0..3 {
            for _ in 0..3 {
                let g = locker.acquire(&key, &o).await.unwrap();
                fences.push(g.fence());
                g.release().await.unwrap();
            }
            eprintln!("conformance [{}]: {RULE}: {name}", t.caps().name);
            restart().await;
        }
    }
    let g = locker
        .acquire(&key, &o)
        .await
        .expect("granted after the restarts");
    fences.push(g.fence());
    g.release().await.unwrap();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences must strictly increase across restarts: {fences:?}"
    );
    Applied::Ran
}
