//! inspect, the raw baseline, raise_fence and grouped operations with their own answers.

use super::*;

/// `inspect` reports the holder's owner token, fence and remaining time; `None` when free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reports_the_holder() {
    let server = RedisServer::start().await;
    let locker = Locker::new(backend(&server.url()).await);
    let backend = locker.backend().clone();
    let backend = backend.admin().expect("admin");
    assert_eq!(backend.inspect("inspect/x").await.unwrap(), vec![]);
    let guard = locker
        .acquire("inspect/x", &skip(Duration::from_secs(10)))
        .await
        .unwrap();
    let holder = backend
        .inspect("inspect/x")
        .await
        .unwrap()
        .pop()
        .expect("held");
    assert_eq!(holder.owner, Some(guard.lease().owner()));
    assert_eq!(holder.fence, Some(guard.fence()));
    let left = holder.expires_in.expect("the lock has a TTL");
    assert!(left <= Duration::from_secs(10) && left > Duration::from_secs(9));
    guard.release().await.unwrap();
    assert_eq!(backend.inspect("inspect/x").await.unwrap(), vec![]);
}

/// The raw baseline (`SET NX PX` + `DEL`) never touches a lock: raw cycles on a held
/// lock's name leave the holder, its fence, its expiry and every key of the protocol as
/// they were, and leave no key behind; a cycle cut off after its `SET` leaves only the raw
/// key, expiring at the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raw_baseline_leaves_locks_alone_and_nothing_behind() {
    let server = RedisServer::start().await;
    let backend = Arc::new(backend(&server.url()).await);
    let locker = Locker::with_backend(backend.clone());
    let raw = backend.baseline().expect("redis has a raw baseline");
    assert_eq!(raw.description(), distlock::redis::BASELINE_CYCLE);
    let ttl = valid_ttl(Duration::from_secs(5));
    let guard = locker
        .acquire("raw/held", &skip(Duration::from_secs(10)))
        .await
        .unwrap();
    let mut redis = server.client().await;
    let keys = |mut redis: redis::aio::MultiplexedConnection| async move {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut redis)
            .await
            .unwrap();
        keys.sort();
        keys
    };
    let before = keys(redis.clone()).await;
    let held = backend
        .inspect("raw/held")
        .await
        .unwrap()
        .pop()
        .expect("held");
    for _ in 0..10 {
        raw.raw_cycle("raw/held", ttl).await.unwrap();
        raw.raw_cycle("raw/free", ttl).await.unwrap();
    }
    assert_eq!(keys(redis.clone()).await, before, "raw cycles left keys");
    let after = backend
        .inspect("raw/held")
        .await
        .unwrap()
        .pop()
        .expect("still held");
    assert_eq!(after.owner, held.owner);
    assert_eq!(after.fence, held.fence);
    assert!(after.expires_in <= held.expires_in);
    assert!(!guard.is_lost());

    let node = backend.node();
    let raw_key = node.baseline_key("raw/held");
    assert_eq!(raw_key, "distlock:{raw/held}:baseline");
    node.raw_set("raw/held", ttl).await.unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&raw_key)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(pttl > 0 && pttl <= 5_000, "{pttl}");
    // A second write finds it there and changes nothing; the delete removes it.
    node.raw_set("raw/held", ttl).await.unwrap();
    node.raw_del("raw/held").await.unwrap();
    assert!(!raw_exists(&server, &raw_key).await);
    guard.release().await.unwrap();
}

/// A raw cycle on a server that does not answer fails with the transient `Unavailable`
/// within the backend's timeout, as the lock's operations do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_cycle_on_a_paused_server_fails_within_the_timeout() {
    let server = RedisServer::start().await;
    let timeout = Duration::from_millis(200);
    let backend = RedisBackend::builder(server.addr().to_string())
        .timeout(timeout)
        .build()
        .await
        .unwrap();
    let ttl = valid_ttl(Duration::from_secs(5));
    server.pause();
    let started = Instant::now();
    let result = backend.baseline().unwrap().raw_cycle("raw/k", ttl).await;
    let took = started.elapsed();
    server.resume();
    assert!(
        matches!(result, Err(Error::Unavailable { .. })),
        "{result:?}"
    );
    assert!(took >= timeout && took <= timeout + SLACK, "{took:?}");
}

/// `raise_fence` lifts a key's counter (what Redlock writes back to a majority): the next
/// grant's fence is above it; raising to a lower value changes nothing; fences above 2^53
/// are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raise_fence_lifts_the_next_fence() {
    let server = RedisServer::start().await;
    let node = node(&server, "raise:").await;
    let ttl = valid_ttl(Duration::from_secs(5));
    let owner = Owner::random();
    let first = match node.try_acquire("k", owner, ttl).await.unwrap() {
        distlock::Attempt::Granted { fence, .. } => fence,
        taken => panic!("free key refused: {taken:?}"),
    };
    assert!(node.release("k", owner).await.unwrap());
    assert!(node.raise_fence("k", first + 1_000_000, ttl).await.unwrap());
    assert!(!node.raise_fence("k", first, ttl).await.unwrap());
    let owner = Owner::random();
    match node.try_acquire("k", owner, ttl).await.unwrap() {
        distlock::Attempt::Granted { fence, .. } => assert!(fence > first + 1_000_000),
        taken => panic!("free key refused: {taken:?}"),
    }
    // Asking again with the same owner is idempotent (a re-sent request after a lost reply).
    let again = node.try_acquire("k", owner, ttl).await.unwrap();
    assert!(
        matches!(again, distlock::Attempt::Granted { .. }),
        "{again:?}"
    );
    assert!(node.release("k", owner).await.unwrap());
    assert!(!node.release("k", owner).await.unwrap());
    assert!(matches!(
        node.raise_fence("k", MAX_FENCE + 1, ttl).await,
        Err(Error::Backend { .. })
    ));
    assert!(raw_exists(&server, &node.fence_key("k")).await);
    assert_eq!(node.fence_key("k"), "raise:{k}:fence");
    assert_eq!(node.lock_key("k"), "raise:{k}");
}

/// Concurrent acquires and releases on one node go to the server in groups (one script
/// call for several locks), and each caller still gets its own answer: grants with their
/// own fences, refusals for the keys already held, releases only of its own locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_operations_are_grouped_with_their_own_answers() {
    let server = RedisServer::start().await;
    let node: RedisNode = RedisBackend::builder(server.addr().to_string())
        .build_node()
        .await
        .unwrap();
    let ttl = valid_ttl(Duration::from_secs(10));
    let holder = Owner::random();
    assert!(matches!(
        node.try_acquire("group/taken", holder, ttl).await.unwrap(),
        distlock::Attempt::Granted { .. }
    ));
    let before = calls(&server, "evalsha").await;
    let names: Vec<String> = (0..48)
        .map(|i| format!("group/{i}"))
        .chain(["group/taken".to_owned()])
        .collect();
    let owners: Vec<Owner> = names.iter().map(|_| Owner::random()).collect();
    let attempts = futures::future::join_all(
        names
            .iter()
            .zip(&owners)
            .map(|(n, o)| node.try_acquire(n, *o, ttl)),
    )
    .await;
    let acquiring = calls(&server, "evalsha").await - before;
    let mut granted = 0;
    for ((name, owner), attempt) in names.iter().zip(&owners).zip(attempts) {
        match attempt.unwrap() {
            distlock::Attempt::Granted { fence, .. } => {
                assert_ne!(name, "group/taken", "a held key was granted in a group");
                // Its own answer: the server holds this key for this caller, at this fence
                // (fences of different keys may be equal: one clock reading per group).
                let seen = node.inspect(name).await.unwrap().expect("held");
                assert_eq!(seen.owner, Some(*owner), "{name}");
                assert_eq!(seen.fence, Some(fence), "{name}");
                granted += 1;
            }
            distlock::Attempt::Taken { expires_in } => {
                assert_eq!(name, "group/taken", "{name} refused");
                assert!(expires_in.is_some_and(|e| e > Duration::from_secs(9)));
            }
        }
    }
    assert_eq!(granted, 48, "every free key granted");
    // Each caller releases its own lock, and "taken" with the wrong owner is refused.
    let before = calls(&server, "evalsha").await;
    let releases =
        futures::future::join_all(names.iter().zip(&owners).map(|(n, o)| node.release(n, *o)))
            .await;
    for (name, released) in names.iter().zip(releases) {
        assert_eq!(released.unwrap(), name != "group/taken", "{name}");
    }
    assert!(raw_exists(&server, &node.lock_key("group/taken")).await);
    assert!(!raw_exists(&server, &node.lock_key("group/0")).await);
    let used = acquiring + calls(&server, "evalsha").await - before;
    assert!(
        used < 2 * 49 / 2,
        "98 concurrent operations took {used} script calls: not grouped"
    );
}
