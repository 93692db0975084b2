//! Fencing

use super::*;

/// Fences strictly increase over a sequence of holders in three processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_strictly_increase_across_holders_and_processes() {
    let server = EtcdServer::start().await;
    let endpoints = [server.endpoint()];
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(Locker::new(backend(&endpoints, "").await));
    }
    let k = key("fences");
    let mut fences = Vec::new();
    for i in 0..9 {
        let g = lockers[i % 3]
            .acquire(&k, &opts(Duration::from_secs(10)))
            .await
            .unwrap();
        let holder = lockers[0]
            .backend()
            .admin()
            .expect("admin")
            .inspect(&k)
            .await
            .unwrap()
            .pop()
            .unwrap();
        assert_eq!(holder.fence, Some(g.fence()));
        fences.push(g.fence());
        g.release().await.unwrap();
    }
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
}

/// A holder paused past its lease (watchdog off, never renewed) in one process: another
/// process gets the lock only after the holder's validity, once etcd expired the lease, and
/// its fence is higher; the paused holder can neither extend nor release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_lease_has_a_lower_fence_than_the_next() {
    let server = EtcdServer::start().await;
    let endpoints = [server.endpoint()];
    let (a, b) = (
        Locker::new(backend(&endpoints, "").await),
        Locker::new(backend(&endpoints, "").await),
    );
    let ttl = a.capabilities().min_ttl;
    let k = key("paused");
    let paused = a.acquire(&k, &opts(ttl).watchdog(false)).await.unwrap();
    let next = b
        .acquire(&k, &opts(ttl).wait_for(Duration::from_secs(5)))
        .await
        .expect("the next holder gets the lock once the lease expired");
    let granted_at = Instant::now();
    assert!(
        granted_at >= paused.valid_until(),
        "granted before the paused holder's validity ended"
    );
    // The lease outlives the lock by 1 s, etcd removes expired leases within ~500 ms, and
    // the watch hands the lock over at once.
    assert!(
        granted_at <= paused.valid_until() + Duration::from_millis(2000),
        "granted {:?} after the paused holder's validity",
        granted_at - paused.valid_until()
    );
    assert!(next.fence() > paused.fence());
    assert!(paused.is_lost());
    assert!(matches!(
        paused.extend(ttl).await,
        Err(Error::NotHeld { .. })
    ));
    assert!(matches!(paused.release().await, Err(Error::NotHeld { .. })));
    next.release().await.unwrap();
}

/// A waiter in another process is woken by the release watch, not by a timer: a lock's,
/// and a semaphore's where the backend keeps permits (the shared rule).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_another_process_is_handed_the_lock_promptly() {
    let server = EtcdServer::start().await;
    let endpoints = [server.endpoint()];
    let a = Target::new(Arc::new(backend(&endpoints, "").await));
    let b = Target::new(Arc::new(backend(&endpoints, "").await));
    lock_conformance::release_wakes_a_waiter_on_another_instance(&a, &b).await;
}
