//! The outage rules: servers dead, paused, or cut off by the network, and what every call
//! and every holder does meanwhile.

use std::time::{Duration, Instant};

use super::common::{acquires_fail_within_their_deadline, fails_within, faults, not_run};
use super::hooks::Applied;
use crate::target::{opts, Target};
use lock_core::{Error, LockGuard};

/// With the servers dead, the holder is lost within its TTL and every call fails fast.
///
/// `lost()` fires within the TTL (plus slack); acquire, extend, inspect, force-release
/// and release fail as unreachable within the request timeout, a `Wait` acquire within
/// its deadline; once the servers are back the same Locker is granted again.
pub async fn dead_servers_lose_the_holder_and_fail_every_call_fast(t: &Target) -> Applied {
    const RULE: &str = "dead_servers_lose_the_holder_and_fail_every_call_fast";
    let f = match faults(t, RULE) {
        Ok(f) => f,
        Err(no) => return no,
    };
    let Some((kill, revive)) = f.kill.clone() else {
        return not_run(t, RULE, "no `kill` hook");
    };
    let locker = t.locker();
    let ttl = t.ttl(Duration::from_millis(600)).get();
    let long = Duration::from_secs(10);
    let renewing = locker
        .acquire(&t.key("killed-renewing"), &opts(ttl))
        .await
        .unwrap();
    let parked = locker
        .acquire(&t.key("killed-parked"), &opts(long).watchdog(false))
        .await
        .unwrap();
    let lost = renewing.lost();
    kill().await;
    let killed_at = Instant::now();
    tokio::time::timeout(ttl + f.slack, lost)
        .await
        .expect("lost() fires within the TTL after the servers died");
    assert!(killed_at.elapsed() <= ttl + f.slack);
    assert!(renewing.is_lost());

    let bound = f.timeout + f.slack;
    let other = t.key("killed-other");
    fails_within(
        t,
        "acquire",
        bound,
        locker.acquire(&other, &opts(ttl).watchdog(false)),
    )
    .await;
    fails_within(t, "extend", bound, parked.extend(long)).await;
    if let Some(admin) = t.backend.admin() {
        fails_within(t, "inspect", bound, admin.inspect(parked.key())).await;
        fails_within(t, "force_release", bound, admin.force_release(&other)).await;
    }
    let lease = parked.lease();
    fails_within(t, "release", bound, t.backend.release(&lease)).await;
    let wait = Duration::from_millis(500);
    fails_within(
        t,
        "acquire (Wait)",
        wait + f.slack,
        locker.acquire(&other, &opts(ttl).watchdog(false).wait_for(wait)),
    )
    .await;

    revive().await;
    let g = locker
        .acquire(
            &other,
            &opts(ttl).watchdog(false).wait_for(Duration::from_secs(2)),
        )
        .await
        .expect("the Locker reconnects after the servers are back");
    g.release().await.unwrap();
    drop((renewing, parked));
    Applied::Ran
}

/// Paused servers fail every call within its bound and lose only holders past their validity.
///
/// A renewing holder with a short TTL is lost by its validity and nobody else is granted
/// its key meanwhile; `Skip` fails as unreachable within the request timeout, `Wait`
/// within its deadline, inspect within the timeout. After the resume a 30 s lock is still
/// held, and the lost key goes to the next holder with a higher fence.
pub async fn a_paused_server_bounds_every_call_and_loses_only_the_expired_holder(
    t: &Target,
) -> Applied {
    const RULE: &str = "a_paused_server_bounds_every_call_and_loses_only_the_expired_holder";
    let f = match faults(t, RULE) {
        Ok(f) => f,
        Err(no) => return no,
    };
    let Some((pause, resume)) = f.pause.clone() else {
        return not_run(t, RULE, "no `pause` hook");
    };
    let (locker, other) = (t.locker(), t.locker());
    let held = locker
        .acquire(
            &t.key("paused-held"),
            &opts(Duration::from_secs(30)).watchdog(false),
        )
        .await
        .unwrap();
    let ttl = t.ttl(Duration::from_millis(600)).get();
    let short_key = t.key("paused-short");
    let short = locker.acquire(&short_key, &opts(ttl)).await.unwrap();
    let lost = short.lost();
    pause().await;
    let paused_at = Instant::now();
    tokio::time::timeout(ttl + f.slack, lost)
        .await
        .expect("lost() fires within the TTL while the servers are paused");
    assert!(short.valid_until() <= paused_at + ttl);

    acquires_fail_within_their_deadline(t, f, &locker, &t.key("paused-a")).await;
    let taken = other.acquire(&short_key, &opts(ttl).watchdog(false)).await;
    assert!(
        taken.as_ref().is_err_and(Error::is_transient),
        "nobody is granted the lost holder's key while the servers are paused: {taken:?}"
    );
    if let Some(admin) = t.backend.admin() {
        let started = Instant::now();
        assert!(admin.inspect(held.key()).await.is_err());
        assert!(started.elapsed() <= f.timeout + f.slack);
    }
    resume().await;
    let g = locker
        .acquire(
            &t.key("paused-b"),
            &opts(Duration::from_secs(1)).watchdog(false),
        )
        .await
        .expect("works again after the servers resumed");
    g.release().await.unwrap();
    held.release()
        .await
        .expect("the lock held across the pause is still ours");
    let next = other
        .acquire(&short_key, &opts(ttl).wait_for(Duration::from_secs(5)))
        .await
        .expect("the lost holder's key is free after the resume");
    if t.caps().monotonic_fencing {
        assert!(next.fence() > short.fence());
    }
    next.release().await.unwrap();
    assert!(matches!(short.release().await, Err(Error::NotHeld { .. })));
    Applied::Ran
}

/// A blackholed network fails every call within its bound and loses the holder in its TTL.
///
/// `Skip` fails as unreachable within the request timeout, `Wait` within its deadline,
/// inspect and force-release within twice the timeout; `lost()` fires within the TTL of
/// the cut and the guard was never valid past it. Once healed the same Locker is granted
/// again, and the old guard's release says NotHeld.
pub async fn a_blackholed_network_bounds_every_call_and_loses_the_holder(t: &Target) -> Applied {
    const RULE: &str = "a_blackholed_network_bounds_every_call_and_loses_the_holder";
    let f = match faults(t, RULE) {
        Ok(f) => f,
        Err(no) => return no,
    };
    let Some((cut, heal)) = f.blackhole.clone() else {
        return not_run(t, RULE, "no `blackhole` hook");
    };
    let locker = t.locker();
    let ttl = t.ttl(Duration::from_millis(1500)).get();
    let key = t.key("blackhole-held");
    let guard: LockGuard = locker.acquire(&key, &opts(ttl)).await.unwrap();
    let lost = guard.lost();
    cut().await;
    let cut_at = Instant::now();
    acquires_fail_within_their_deadline(t, f, &locker, &t.key("blackhole-a")).await;
    tokio::time::timeout((ttl + f.slack).saturating_sub(cut_at.elapsed()), lost)
        .await
        .expect("lost() fires within the TTL when renewals cannot get through");
    assert!(
        guard.valid_until() <= cut_at + ttl,
        "never valid past the last renewal + TTL"
    );
    if let Some(admin) = t.backend.admin() {
        let started = Instant::now();
        assert!(admin.inspect(&key).await.is_err());
        assert!(admin.force_release(&t.key("blackhole-x")).await.is_err());
        assert!(started.elapsed() <= f.timeout * 2 + f.slack);
    }
    heal().await;
    let g = locker
        .acquire(
            &t.key("blackhole-b"),
            &opts(Duration::from_secs(1))
                .watchdog(false)
                .wait_for(Duration::from_secs(3)),
        )
        .await
        .expect("works again after the network healed");
    g.release().await.unwrap();
    assert!(matches!(guard.release().await, Err(Error::NotHeld { .. })));
    Applied::Ran
}
