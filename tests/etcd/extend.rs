//! Extensions cut off

use super::*;

/// How an `extend` to a new TTL is cut off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CutOff {
    /// By the backend's operation timeout (4 s); the watchdog then renews the guard.
    Timeout,
    /// By the caller, who drops the `extend` future after 4 s (the operation timeout being
    /// 10 s); the guard (watchdog off) is then dropped, and its release finishes the move.
    Dropped,
}

/// An `extend` to a new TTL that is cut off never strands the key for the new TTL (nothing
/// a caller cancels leaves a lock behind). Every answer from etcd reaches the holder 2.5 s
/// late and the holder gives up after 4 s: the new lease's grant is answered in time, and
/// the transaction moving the key onto it is applied, but its answer comes too late. The
/// guard must still be its key's holder with its fence: the watchdog goes on renewing it
/// and its release frees the key at once; a dropped guard frees it too. Another process
/// gets the key within 5 s, far below the new 30 s TTL.
async fn a_cut_off_extension_strands_nothing(cut: CutOff) {
    let server = EtcdServer::start().await;
    let proxy = FaultProxy::start(server.addr()).await;
    let timeout = match cut {
        CutOff::Timeout => "timeout=4s",
        CutOff::Dropped => "timeout=10s",
    };
    let backend = Arc::new(backend(&[proxy.addr().to_string()], timeout).await);
    let holder = Locker::with_backend(backend.clone());
    let other = Locker::new(common::etcd_backend(&[server.endpoint()], "").await);
    let k = key("cut-extend");
    let ttl = Duration::from_secs(10);
    let guard = holder
        .acquire(
            &k,
            &LockOptions::new()
                .ttl(ttl)
                .skip()
                .watchdog(cut == CutOff::Timeout),
        )
        .await
        .unwrap();
    let fence = guard.fence();
    let owner = guard.lease().owner();
    let granted_until = guard.valid_until();

    proxy.set_mode(ProxyMode::Delay {
        to_server: Duration::ZERO,
        to_client: Duration::from_millis(2500),
    });
    match cut {
        CutOff::Timeout => {
            let extended = guard.extend(Duration::from_secs(30)).await;
            assert!(
                matches!(extended, Err(Error::Unavailable { .. })),
                "the extension was cut off by the operation timeout: {extended:?}"
            );
        }
        CutOff::Dropped => {
            let extended = tokio::time::timeout(
                Duration::from_secs(4),
                guard.extend(Duration::from_secs(30)),
            )
            .await;
            assert!(extended.is_err(), "the extension was dropped: {extended:?}");
        }
    }
    proxy.set_mode(ProxyMode::Pass);

    // The move landed although its answer never arrived: the key's value now carries the
    // fence (the scenario was exercised).
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let full = format!("{}{k}", distlock::etcd::DEFAULT_PREFIX);
    let value = client.get(full.as_str(), None).await.unwrap().kvs()[0]
        .value_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        value,
        format!("{owner}:{fence}"),
        "the cut-off transaction moved the key to the new lease"
    );

    match cut {
        CutOff::Timeout => {
            let taken = other.acquire(&k, &LockOptions::new().ttl(ttl).skip()).await;
            assert!(
                matches!(taken, Err(Error::Locked { .. })),
                "nobody else gets the key while the guard holds it: {taken:?}"
            );
            // The watchdog's next turn (due 3.3 s after the grant) renews the guard.
            let deadline = Instant::now() + Duration::from_secs(20);
            while !guard.is_lost()
                && guard.valid_until() <= granted_until + Duration::from_secs(1)
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(
                !guard.is_lost(),
                "the watchdog lost a guard whose key is still its own"
            );
            assert!(
                guard.valid_until() > granted_until + Duration::from_secs(1),
                "the watchdog renewed the guard"
            );
            assert_eq!(guard.fence(), fence, "the grant's fence never changes");
            let seen = backend
                .inspect(&k)
                .await
                .unwrap()
                .pop()
                .expect("still held");
            assert_eq!(seen.owner, Some(owner));
            assert_eq!(seen.fence, Some(fence), "the key's fence is the grant's");
            guard
                .release()
                .await
                .expect("the guard still held its key to the end");
        }
        CutOff::Dropped => drop(guard),
    }
    let started = Instant::now();
    let next = other
        .acquire(
            &k,
            &LockOptions::new().ttl(ttl).wait_for(Duration::from_secs(5)),
        )
        .await;
    assert!(
        next.is_ok(),
        "the key is freed promptly, not at the new TTL (waited {:?}): {next:?}",
        started.elapsed()
    );
    let next = next.unwrap();
    assert!(next.fence() > fence);
    next.release().await.unwrap();
    holder.shutdown().await;
    assert_eq!(backend.held_leases(), 0);
}

/// See [`a_cut_off_extension_strands_nothing`]: cut off by the operation timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_cut_off_by_the_timeout_strands_nothing() {
    a_cut_off_extension_strands_nothing(CutOff::Timeout).await;
}

/// See [`a_cut_off_extension_strands_nothing`]: its future dropped by the caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_dropped_by_its_caller_strands_nothing() {
    a_cut_off_extension_strands_nothing(CutOff::Dropped).await;
}
