//! Faults, on an ensemble of their own (its members are killed and paused): a member
//! killed, the leader paused (SIGSTOP) until a new one is elected, and a client cut off by
//! a blackholed network past its session timeout.

use super::*;
use lock_testkit::{FaultProxy, ProxyMode};

const SESSION: &str = "session_timeout=2s&timeout=500ms";

fn opts(ttl: Duration, wait: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).wait_for(wait)
}

/// Whether `guard` no longer believes it holds: lost, or its validity passed.
fn stopped_believing(guard: &distlock::LockGuard) -> bool {
    guard.is_lost() || Instant::now() >= guard.valid_until()
}

/// The three fault scenarios in sequence on one ensemble (three JVMs are the costly part).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults() {
    let ensemble = ZooKeeperEnsemble::start().await;
    let all = format!("zookeeper://{}/faults?{SESSION}", ensemble.hosts());
    a_killed_member_leaves_locks_working(&ensemble, &all).await;
    a_paused_leader_is_replaced_and_no_two_hold(&ensemble, &all).await;
    a_client_cut_off_past_its_session_timeout_loses_its_lock(&ensemble, &all).await;
}

/// Member 0 killed: locks keep working on the two others (the client moves to another
/// member within the session), fences still increase; the member comes back.
async fn a_killed_member_leaves_locks_working(ensemble: &ZooKeeperEnsemble, url: &str) {
    let locker = Locker::new(backend(url).await);
    let k = key("killed");
    let ttl = Duration::from_secs(2);
    let mut last = 0;
    for _ in 0..3 {
        let g = locker
            .acquire(&k, &opts(ttl, Duration::from_secs(5)))
            .await
            .unwrap();
        assert!(g.fence() > last);
        last = g.fence();
        g.release().await.unwrap();
    }
    ensemble.kill(0);
    for round in 0..5 {
        let g = locker
            .acquire(&k, &opts(ttl, Duration::from_secs(15)))
            .await
            .unwrap_or_else(|e| panic!("round {round} with a member down: {e}"));
        assert!(g.fence() > last, "round {round}: fence went back");
        last = g.fence();
        let _ = g.release().await;
    }
    ensemble.restart(0).await;
    locker.shutdown().await;
}

/// The leader frozen with SIGSTOP: the two others elect a new leader; a holder whose
/// grant was made before stops believing before another process is granted the key (a
/// disconnection ends its grant, its node goes at its TTL or with its session), and the
/// new holder's fence is greater. The old leader rejoins when continued.
async fn a_paused_leader_is_replaced_and_no_two_hold(ensemble: &ZooKeeperEnsemble, url: &str) {
    let leader = ensemble.leader().await.expect("a leader");
    let (a, b) = (
        Locker::new(backend(url).await),
        Locker::new(backend(url).await),
    );
    let k = key("paused-leader");
    let ttl = Duration::from_secs(2);
    let held = a
        .acquire(&k, &opts(ttl, Duration::from_secs(5)))
        .await
        .unwrap();
    ensemble.pause(leader);
    let next = lock_conformance::spawn_acquire(&b, &k, &opts(ttl, Duration::from_secs(30)));
    let successor = ensemble.wait_for_leader(Some(leader)).await;
    assert_ne!(successor, leader);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !next.is_finished() {
        assert!(
            Instant::now() < deadline,
            "nobody got the key after the failover"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Checked at once: the earlier holder must not believe it holds any more.
    assert!(stopped_believing(&held), "two holders across the failover");
    let got = next.await.unwrap().unwrap();
    assert!(got.fence() > held.fence());
    ensemble.resume(leader);
    got.release().await.unwrap();
    drop(held);
    a.shutdown().await;
    b.shutdown().await;
}

/// A client whose network is blackholed past its session timeout: its guard's `lost()`
/// fires (its renewals fail until its validity, at most 0.9 of the session timeout, has
/// passed), and another client is granted the key only after that, once the ensemble
/// expired the session; after the network heals, the old grant stays lost.
async fn a_client_cut_off_past_its_session_timeout_loses_its_lock(
    ensemble: &ZooKeeperEnsemble,
    url: &str,
) {
    let proxy = FaultProxy::start(ensemble.addr(1)).await;
    let cut_url = format!("zookeeper://{}/faults?{SESSION}", proxy.addr());
    let a = Locker::new(backend(&cut_url).await);
    let b = Locker::new(backend(url).await);
    let k = key("cut-off");
    let ttl = Duration::from_secs(2);
    let held = a
        .acquire(&k, &opts(ttl, Duration::from_secs(5)))
        .await
        .unwrap();
    let lost = held.lost();
    let cut = Instant::now();
    proxy.set_mode(ProxyMode::Blackhole);
    let next = lock_conformance::spawn_acquire(&b, &k, &opts(ttl, Duration::from_secs(20)));
    tokio::time::timeout(Duration::from_secs(5), lost)
        .await
        .expect("lost() fires within the session timeout and a renewal");
    let lost_after = cut.elapsed();
    assert!(held.is_lost());
    let got = next.await.unwrap().unwrap();
    let got_after = cut.elapsed();
    assert!(
        got_after >= lost_after,
        "granted elsewhere after {got_after:?}, before the holder's lost() at {lost_after:?}"
    );
    assert!(got.fence() > held.fence());
    proxy.set_mode(ProxyMode::Pass);
    let again = held.extend(ttl).await;
    assert!(matches!(again, Err(Error::NotHeld { .. })), "{again:?}");
    got.release().await.unwrap();
    drop(held);
    a.shutdown().await;
    b.shutdown().await;
}
