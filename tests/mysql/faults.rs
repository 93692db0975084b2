//! Faults

use super::*;

/// The shared fault rules on one server reached through a fault proxy (the peer too):
/// restarted (InnoDB keeps its data: the locks survive), killed, paused (SIGSTOP), or cut
/// off by a blackholed network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules() {
    let server = Proxied::new(vec![MariaDbServer::start().await]).await;
    let url = mysql_url(server.addrs()[0], "table=faults&timeout=500ms");
    let faults = Faults::new(Duration::from_millis(500))
        .slack(Duration::from_millis(300))
        .peer(Arc::new(backend(&url).await));
    let faults = server.hooks(faults).await;
    let target = Target::new(Arc::new(backend(&url).await)).with_faults(faults);
    // The data survives a restart: there is no restart that loses the locks.
    run_faults(&target).await.assert_not_run(&[
        "a_restart_that_loses_the_locks_leaves_holders_not_held",
        "waiters_wake_after_a_restart_that_loses_the_locks",
    ]);
}

/// Fences strictly increase from holder to holder across a clean restart and a `kill -9`
/// (crash recovery keeps the persistent `AUTO_INCREMENT`), the lock connections
/// reconnecting by themselves each time; a lock held over a crash is still held after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_strictly_increase_across_a_restart_and_a_kill() {
    let mut server = MariaDbServer::start().await;
    let locker = Locker::new(backend(&mysql_url(server.addr(), "table=fences&timeout=1s")).await);
    let k = key("fences");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(Duration::from_secs(20))
        .watchdog(false);
    let mut last = 0;
    let mut take = |fence: u64, when: &str| {
        assert!(fence > last, "{when}: fence {fence} after {last}");
        last = fence;
    };
    for round in 0..3 {
        for _ in 0..5 {
            let guard = locker.acquire(&k, &opts).await.unwrap();
            take(guard.fence(), &format!("round {round}"));
            guard.release().await.unwrap();
        }
        match round {
            0 => server.restart().await,
            1 => {
                server.kill();
                server.restart().await;
            }
            _ => {}
        }
    }
    let held = locker.acquire(&k, &opts).await.unwrap();
    take(held.fence(), "before the crash");
    server.kill();
    server.restart().await;
    let other = Locker::new(backend(&mysql_url(server.addr(), "table=fences")).await);
    assert!(
        matches!(
            other.acquire(&k, &LockOptions::new().skip()).await,
            Err(Error::Locked { .. })
        ),
        "the lock survives the crash"
    );
    held.release().await.unwrap();
    let next = other.acquire(&k, &LockOptions::new().skip()).await.unwrap();
    take(next.fence(), "after the crash");
}
