//! The rules of one lock: grant, refusal, release, extension, fencing, expiry, renewal,
//! loss and input checks.

use std::time::{Duration, Instant};

use super::target::{grant, opts, slack, Target};
use lock_core::{Attempt, Backend, Error, Lease, Owner};

/// A lock is granted, reports its key, and can be released and taken again.
pub async fn grant_and_release(t: &Target) {
    let locker = t.locker();
    let key = t.key("grant");
    let guard = locker
        .acquire(&key, &opts(Duration::from_secs(10)))
        .await
        .expect("free key is granted");
    assert_eq!(guard.key(), key);
    assert!(!guard.is_lost());
    assert!(guard.valid_until() > Instant::now());
    guard.release().await.expect("release of a held lock is Ok");
    let again = locker.try_acquire(&key).await.expect("no error");
    assert!(again.is_some(), "a released key can be taken again");
    again.unwrap().release().await.unwrap();
}

/// A second acquire of a held key is refused, from the same and from another Locker.
pub async fn held_key_is_refused(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let key = t.key("held");
    let guard = a
        .acquire(&key, &opts(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(b.try_acquire(&key).await.unwrap().is_none());
    assert!(a.try_acquire(&key).await.unwrap().is_none());
    match b.acquire(&key, &opts(Duration::from_secs(10))).await {
        Err(Error::Locked { key: k }) => assert_eq!(k, key),
        other => panic!("expected Locked, got {other:?}"),
    }
    guard.release().await.unwrap();
}

/// Locks on different keys do not exclude each other.
pub async fn different_keys_are_independent(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let g1 = a
        .acquire(&t.key("k1"), &opts(Duration::from_secs(10)))
        .await
        .unwrap();
    let g2 = b
        .acquire(&t.key("k2"), &opts(Duration::from_secs(10)))
        .await
        .unwrap();
    g1.release().await.unwrap();
    g2.release().await.unwrap();
}

/// Release by a stale (expired, or for a session-bound backend released) lease never
/// removes the new holder's lock.
pub async fn stale_release_never_removes_new_holder(t: &Target) {
    let key = t.key("stale");
    let ttl = t.short_ttl();
    let stale = grant(t, &key, Owner::random(), ttl).await;
    t.lapse(&stale).await;
    let fresh = grant(t, &key, Owner::random(), Duration::from_secs(10)).await;
    assert!(matches!(
        t.backend.as_ref().release(&stale).await,
        Err(Error::NotHeld { .. })
    ));
    let third = t
        .backend
        .try_acquire(&key, Owner::random(), lock_core::Permits::LOCK, t.ttl(ttl))
        .await
        .unwrap();
    assert!(
        matches!(third, Attempt::Taken { .. }),
        "the new holder's lock survived the stale release"
    );
    t.backend
        .release(&fresh)
        .await
        .expect("new holder releases");
}

/// Extend of an expired (session-bound: released) or a foreign lease fails with NotHeld
/// and changes nothing.
pub async fn extend_of_expired_or_foreign_lease_fails(t: &Target) {
    let key = t.key("extend");
    let ttl = t.short_ttl();
    let expired = grant(t, &key, Owner::random(), ttl).await;
    t.lapse(&expired).await;
    assert!(matches!(
        t.backend.as_ref().extend(&expired, t.ttl(ttl)).await,
        Err(Error::NotHeld { .. })
    ));
    let holder = grant(t, &key, Owner::random(), Duration::from_secs(10)).await;
    let foreign = Lease::new(
        key.as_str(),
        Owner::random(),
        holder.fence(),
        Instant::now(),
    );
    assert!(matches!(
        t.backend
            .as_ref()
            .extend(&foreign, t.ttl(Duration::from_secs(10)))
            .await,
        Err(Error::NotHeld { .. })
    ));
    assert!(matches!(
        t.backend.as_ref().release(&foreign).await,
        Err(Error::NotHeld { .. })
    ));
    let extended = t
        .backend
        .as_ref()
        .extend(&holder, t.ttl(Duration::from_secs(20)))
        .await;
    assert!(
        extended.is_ok(),
        "the real holder can still extend: {extended:?}"
    );
    t.backend.as_ref().release(&holder).await.unwrap();
}

/// Fencing tokens strictly increase across successive holders of a key (when the
/// backend promises monotonic fencing), also across Lockers and after expiry (after a drop,
/// for a session-bound backend).
pub async fn fencing_tokens_strictly_increase(t: &Target) {
    let key = t.key("fence");
    let lockers = [t.locker(), t.locker()];
    let mut fences = Vec::new();
    for i in 0..6 {
        let g = lockers[i % 2]
            .acquire(&key, &opts(Duration::from_secs(10)))
            .await
            .unwrap();
        fences.push(g.fence());
        g.release().await.unwrap();
    }
    let ttl = t.short_ttl();
    let expiring = lockers[0]
        .acquire(&key, &opts(ttl).watchdog(false))
        .await
        .unwrap();
    fences.push(expiring.fence());
    let expiring = if t.session_bound() {
        drop(expiring);
        None
    } else {
        Some(expiring)
    };
    let next = lockers[1]
        .acquire(&key, &opts(ttl).wait_for(ttl * 4))
        .await
        .unwrap();
    fences.push(next.fence());
    next.release().await.unwrap();
    drop(expiring);
    if t.caps().monotonic_fencing {
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "fences must strictly increase: {fences:?}"
        );
    }
}

/// A lock expires after its TTL when not renewed, and the next acquirer gets it; a
/// session-bound one outlives its TTL unrenewed, and is taken at its release.
pub async fn lock_expires_after_ttl(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let key = t.key("expire");
    let ttl = t.short_ttl();
    let started = Instant::now();
    let first = a.acquire(&key, &opts(ttl).watchdog(false)).await.unwrap();
    assert!(b.try_acquire(&key).await.unwrap().is_none());
    if t.session_bound() {
        let waiter = super::target::spawn_acquire(&b, &key, &opts(ttl).wait_for(ttl * 10));
        tokio::time::sleep(ttl * 2).await;
        assert!(!first.is_lost(), "a session-bound lock outlives its TTL");
        assert!(!waiter.is_finished(), "nobody else gets it meanwhile");
        assert_eq!(a.stats().renewals_scheduled, 0, "nothing to renew");
        first
            .release()
            .await
            .expect("still held after twice its TTL");
        let second = tokio::time::timeout(slack(t), waiter)
            .await
            .expect("the waiter gets it at the release")
            .unwrap()
            .expect("granted");
        second.release().await.unwrap();
        return;
    }
    let second = b
        .acquire(&key, &opts(ttl).wait_for(ttl * 4))
        .await
        .expect("the next acquirer gets an expired lock");
    let waited = started.elapsed();
    assert!(
        waited + Duration::from_millis(5) >= ttl,
        "granted after {waited:?}, before the TTL {ttl:?} passed"
    );
    assert!(
        waited <= ttl + slack(t) * 2,
        "the waiter woke {waited:?} after the start, TTL {ttl:?}: expiry must wake it"
    );
    assert!(first.is_lost());
    assert!(matches!(first.release().await, Err(Error::NotHeld { .. })));
    second.release().await.unwrap();
}

/// The watchdog keeps locks across at least five TTLs: several at once, with two TTLs (the
/// shorter granted last, so it falls due before the renewal the watchdog sleeps until),
/// and a released guard leaves the watchdog's schedule at once.
pub async fn watchdog_keeps_lock_across_ttls(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let ttl = t.short_ttl();
    // A session-bound grant has nothing to renew: it stays held, unscheduled.
    let scheduled = |n: usize| if t.session_bound() { 0 } else { n };
    let mut guards = Vec::new();
    for (i, ttl) in [ttl * 2, ttl * 2, ttl].into_iter().enumerate() {
        let key = t.key(&format!("watchdog-{i}"));
        guards.push((a.acquire(&key, &opts(ttl)).await.unwrap(), key));
    }
    assert_eq!(
        a.stats().renewals_scheduled,
        scheduled(3),
        "{:?}",
        a.stats()
    );
    let end = Instant::now() + ttl * 5;
    while Instant::now() < end {
        tokio::time::sleep(ttl / 2).await;
        for (guard, key) in &guards {
            assert!(
                b.try_acquire(key).await.unwrap().is_none(),
                "renewed lock {key} stays held"
            );
            assert!(!guard.is_lost(), "{key}");
        }
    }
    let (last, _) = guards.pop().unwrap();
    assert!(last.valid_until() > Instant::now());
    last.release().await.expect("still ours after 5 TTLs");
    assert_eq!(
        a.stats().renewals_scheduled,
        scheduled(2),
        "{:?}",
        a.stats()
    );
    for (guard, key) in guards {
        guard
            .release()
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
    }
    assert_eq!(a.stats().renewals_scheduled, 0, "{:?}", a.stats());
}

/// `lost()` fires when the lock is taken away behind the holder's back.
pub async fn lost_fires_when_taken_away(t: &Target) {
    if !t.revocable("lost_fires_when_taken_away") {
        return;
    }
    let locker = t.locker();
    let key = t.key("lost");
    let ttl = t.short_ttl();
    let guard = locker.acquire(&key, &opts(ttl)).await.unwrap();
    let lost = guard.lost();
    t.revoke(&key).await;
    let taken_at = Instant::now();
    tokio::time::timeout(ttl + slack(t), lost)
        .await
        .expect("lost() fires within the TTL after the lock was taken away");
    assert!(guard.is_lost());
    assert!(taken_at.elapsed() <= ttl + slack(t));
    assert!(matches!(guard.release().await, Err(Error::NotHeld { .. })));
}

/// Invalid keys and TTLs are refused with typed errors before any I/O.
pub async fn invalid_input_is_refused(t: &Target) {
    let locker = t.locker();
    let ok = opts(Duration::from_secs(10));
    assert!(matches!(
        locker.acquire("", &ok).await,
        Err(Error::InvalidKey { .. })
    ));
    let long = "x".repeat(lock_core::MAX_KEY_LEN + 1);
    assert!(matches!(
        locker.acquire(&long, &ok).await,
        Err(Error::InvalidKey { .. })
    ));
    assert!(matches!(
        locker.acquire_many(&["a", ""], &ok).await,
        Err(Error::InvalidKey { .. })
    ));
    let key = t.key("input");
    assert!(matches!(
        locker.acquire(&key, &opts(Duration::ZERO)).await,
        Err(Error::InvalidTtl { .. })
    ));
    assert!(matches!(
        locker.acquire(&key, &opts(Duration::MAX)).await,
        Err(Error::InvalidTtl { .. })
    ));
    let max = t.caps().max_ttl;
    assert!(matches!(
        locker
            .acquire(&key, &opts(max + Duration::from_secs(1)))
            .await,
        Err(Error::InvalidTtl { .. })
    ));
    // Below the minimum is rounded up, never refused.
    let g = locker
        .acquire(&key, &opts(Duration::from_nanos(1)).watchdog(false))
        .await
        .expect("a tiny TTL is rounded up to the backend minimum");
    assert!(g.ttl() >= t.caps().min_ttl);
    assert!(matches!(
        g.extend(Duration::ZERO).await,
        Err(Error::InvalidTtl { .. })
    ));
    drop(g);
}
