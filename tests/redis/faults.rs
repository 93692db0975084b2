//! The shared fault rules and the Redis-specific faults.

use super::*;

/// A target whose backend (and peer) reach one server through a fault proxy, with the
/// hooks of a server without persistence (a restart loses the locks) or with it (a restart
/// keeps them), and kill, pause and blackhole.
async fn fault_target(options: RedisOptions) -> Target {
    let server = Proxied::new(vec![RedisServer::start_with(options).await]).await;
    let url = format!("redis://{}", server.addrs()[0]);
    // The default request timeout (1 s) is longer than the rules' 500 ms wait: the wait's
    // deadline, not the backend timeout, bounds that acquire.
    let faults = Faults::new(DEFAULT_TIMEOUT)
        .slack(SLACK)
        .peer(Arc::new(backend(&url).await));
    let faults = server.hooks(faults).await;
    Target::new(Arc::new(backend(&url).await)).with_faults(faults)
}

/// The shared fault rules on one server without persistence: restart (empty, empty script
/// cache), kill, pause (SIGSTOP) and a blackholed network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules() {
    let target = fault_target(RedisOptions::default()).await;
    run_faults(&target)
        .await
        .assert_not_run(&["a_lock_survives_a_restart_that_keeps_the_locks"]);
}

/// The shared fault rules on one server with persistence (append-only file, fsync
/// always): the locks survive a restart, and kill, pause and blackhole as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules_with_persistence() {
    let target = fault_target(RedisOptions {
        persistent: true,
        ..RedisOptions::default()
    })
    .await;
    run_faults(&target).await.assert_not_run(&[
        "a_restart_that_loses_the_locks_leaves_holders_not_held",
        "waiters_wake_after_a_restart_that_loses_the_locks",
    ]);
}

/// An acquire that timed out and was abandoned, whose request reaches the server only AFTER
/// its clean-up (it sat in a socket buffer on the discarded connection; the clean-up went
/// on another one): the late request must not grant. Reproduced deterministically with the
/// acquire's connection behind a proxy that holds its bytes, and the clean-up on a direct
/// connection. A plain release there (the old clean-up) finds nothing, and the late
/// acquire then leaves an orphaned lock for its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_acquire_arriving_after_its_abandon_grants_nothing() {
    let server = RedisServer::start().await;
    let proxy = FaultProxy::start(server.addr()).await;
    let late = RedisBackend::builder(proxy.addr().to_string())
        .timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let direct = backend(&server.url()).await;
    let lock_key = direct.node().lock_key("abandon/late");
    // Load the acquire script, so that the late EVALSHA runs rather than meet NOSCRIPT.
    let warm = Owner::random();
    direct
        .try_acquire(
            "abandon/warm",
            warm,
            distlock::Permits::LOCK,
            valid_ttl(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let owner = Owner::random();
    proxy.set_mode(ProxyMode::Blackhole);
    let e = late
        .try_acquire(
            "abandon/late",
            owner,
            distlock::Permits::LOCK,
            valid_ttl(Duration::from_secs(30)),
        )
        .await
        .expect_err("no answer through the blackhole");
    assert!(e.is_transient(), "{e}");
    direct
        .abandon("abandon/late", owner)
        .await
        .expect("the abandon reaches the server");
    let before = calls(&server, "evalsha").await + calls(&server, "eval").await;
    proxy.set_mode(ProxyMode::Pass);
    // The held acquire is delivered now.
    let deadline = Instant::now() + Duration::from_secs(5);
    while calls(&server, "evalsha").await + calls(&server, "eval").await == before {
        assert!(Instant::now() < deadline, "the held acquire never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !raw_exists(&server, &lock_key).await,
        "the late acquire of an abandoned attempt left an orphaned lock"
    );
    // The key is free for everyone else.
    let other = Owner::random();
    assert!(matches!(
        direct
            .try_acquire(
                "abandon/late",
                other,
                distlock::Permits::LOCK,
                valid_ttl(Duration::from_secs(5))
            )
            .await
            .unwrap(),
        distlock::Attempt::Granted { .. }
    ));
}

/// The scenario of a paused server (SIGSTOP): an acquire times out with its request in the
/// server's socket buffer, the connection is discarded, and `abandon` goes on a new one;
/// after SIGCONT the key is not left held, whichever request the server reads first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_abandoned_on_a_paused_server_leaves_no_lock() {
    let server = RedisServer::start().await;
    let backend = RedisBackend::builder(server.addr().to_string())
        .timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let lock_key = backend.node().lock_key("abandon/paused");
    let patient = RedisBackend::from_node(backend.node().with_timeout(Duration::from_secs(5)));
    let warm = Owner::random();
    backend
        .try_acquire(
            "abandon/warm",
            warm,
            distlock::Permits::LOCK,
            valid_ttl(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let owner = Owner::random();
    server.pause();
    let e = backend
        .try_acquire(
            "abandon/paused",
            owner,
            distlock::Permits::LOCK,
            valid_ttl(Duration::from_secs(30)),
        )
        .await
        .expect_err("a paused server does not answer");
    assert!(e.is_transient(), "{e}");
    let abandon = tokio::spawn(async move { patient.abandon("abandon/paused", owner).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.resume();
    abandon.await.unwrap().expect("abandon after the resume");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !raw_exists(&server, &lock_key).await,
        "an abandoned acquire left its lock behind"
    );
}

/// Fencing tokens keep increasing across a restart that restores an OLDER fence counter
/// (an RDB snapshot taken before the last grants; AOF `everysec` and a promoted async
/// replica do the same): grants a, b, c; snapshot; grants d, e, f; kill -9; restart from
/// the snapshot. The counter is back at c's token, and the next grants must still be above
/// f's, not re-issue d's and e's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_across_a_restart_from_a_stale_snapshot() {
    let mut server = RedisServer::start_with(RedisOptions {
        rdb: true,
        ..RedisOptions::default()
    })
    .await;
    let backend = backend(&server.url()).await;
    let fence_key = backend.node().fence_key("stale/k");
    let locker = Locker::new(backend);
    let mut fences = Vec::new();
    let grant = |fences: &mut Vec<u64>, g: distlock::LockGuard| {
        fences.push(g.fence());
        g
    };
    for round in 0..2 {
        for _ in 0..3 {
            let g = locker
                .acquire("stale/k", &skip(Duration::from_secs(10)))
                .await
                .unwrap();
            grant(&mut fences, g).release().await.unwrap();
        }
        if round == 0 {
            server.save().await;
        }
    }
    server.restart().await;
    assert!(
        raw_exists(&server, &fence_key).await,
        "the snapshot brought the (stale) counter back"
    );
    for _ in 0..3 {
        let g = locker
            .acquire("stale/k", &skip(Duration::from_secs(10)))
            .await
            .unwrap();
        grant(&mut fences, g).release().await.unwrap();
    }
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences must strictly increase across a restart from a stale snapshot: {fences:?}"
    );
}

/// A waiter queued behind a holder of the same Locker is handed the key in one script, by
/// the holder's release: the key is never deleted or announced free in between, the new
/// fence is higher, and `inspect` names the new holder. A stale holder (its key
/// overwritten behind its back) hands nothing over and its release reports `NotHeld`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_waiter_is_handed_the_key_in_one_script() {
    let server = RedisServer::start().await;
    let backend = Arc::new(backend(&server.url()).await);
    let locker = Locker::with_backend(backend.clone());
    let wait = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(Duration::from_secs(10))
        .watchdog(false);
    let settle = Duration::from_millis(200);
    let (holder, waiter) = queued_holder_and_waiter(&locker, "hand", &wait, settle).await;
    let (deletes, notices) = (calls(&server, "del").await, calls(&server, "publish").await);
    let fence = holder.fence();
    holder.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    assert!(next.fence() > fence);
    assert_eq!(calls(&server, "del").await, deletes, "never deleted");
    assert_eq!(
        calls(&server, "publish").await,
        notices,
        "never announced free"
    );
    let seen = backend.inspect("hand").await.unwrap().pop().expect("held");
    assert_eq!(seen.owner, Some(next.lease().owner()));
    next.release().await.unwrap();
    assert_eq!(calls(&server, "del").await, deletes + 1);

    // Overwritten behind the holder's back (another client, for 500 ms) before its waiter
    // queues: the hand-over at the release finds it out, and the waiter gets the key only
    // once it is free.
    let holder = queued_holder(&locker, "stale", &wait, settle).await;
    let mut raw = server.client().await;
    let stolen = backend.node().lock_key("stale");
    let _: () = redis::cmd("SET")
        .arg(&stolen)
        .arg("someone else")
        .arg("PX")
        .arg(500)
        .query_async(&mut raw)
        .await
        .unwrap();
    let waiter = conformance::spawn_acquire(&locker, "stale", &wait);
    tokio::time::sleep(settle).await;
    let fence = holder.fence();
    assert!(matches!(holder.release().await, Err(Error::NotHeld { .. })));
    let next = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("granted once the other owner's key expired")
        .unwrap()
        .unwrap();
    assert!(next.fence() > fence);
    next.release().await.unwrap();
}
