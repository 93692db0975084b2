//! Semaphores and reader-writer keys beside locks.

use super::*;

/// `permits` of `key` for `ttl`, straight on the backend: the lease of the grant.
async fn grant(backend: &RedisBackend, key: &str, permits: Permits, ttl: Duration) -> Lease {
    let owner = Owner::random();
    match backend
        .try_acquire(key, owner, permits, valid_ttl(ttl))
        .await
        .unwrap()
    {
        Attempt::Granted { fence, valid_until } => {
            Lease::new(key, owner, fence, valid_until).with_permits(permits)
        }
        taken => panic!("{permits} of {key}: {taken:?}"),
    }
}

/// `from`'s permits handed over to a new owner for `ttl` through [`HandOver`]: the new
/// lease (anything but a grant fails the test).
async fn handed_over(backend: &RedisBackend, from: &Lease, ttl: Duration) -> Lease {
    let to = Owner::random();
    match HandOver::hand_over(backend, from, to, valid_ttl(ttl))
        .await
        .unwrap()
    {
        Attempt::Granted { fence, valid_until } => {
            Lease::new(from.key(), to, fence, valid_until).with_permits(from.permits())
        }
        taken => panic!("hand-over of {}: {taken:?}", from.permits()),
    }
}

/// The unexpired holders of `key` as `(owner, fence, permits)`, by fence.
async fn holders(backend: &RedisBackend, key: &str) -> Vec<(Owner, u64, Permits)> {
    let mut seen: Vec<_> = backend
        .inspect(key)
        .await
        .unwrap()
        .into_iter()
        .map(|h| (h.owner.unwrap(), h.fence.unwrap(), h.permits))
        .collect();
    seen.sort_by_key(|h| h.1);
    seen
}

/// The reason of an `InvalidPermits` refusal (anything else fails the test).
fn invalid_permits(attempt: distlock::Result<Attempt>, what: &str) -> String {
    match attempt {
        Err(Error::InvalidPermits { reason }) => reason,
        other => panic!("{what}: {other:?}"),
    }
}

/// Whether any key of `name`'s permits (its holders, its permits hash) is on the server.
async fn permits_keys_left(server: &RedisServer, node: &RedisNode, name: &str) -> Vec<String> {
    let mut left = Vec::new();
    for key in [node.holders_key(name), node.permits_key(name)] {
        if raw_exists(server, &key).await {
            left.push(key);
        }
    }
    left
}

/// A key is held as a lock or with permits, never both: the permits script refuses a key
/// held as a lock, and the lock script a key held with permits, with `InvalidPermits`
/// naming what holds it, as is another number of permits; a full semaphore answers taken
/// with its earliest holder's time left; inspect lists each holder with its permits and
/// fence; a hand-over of permits passes them with a higher fence; fences keep climbing
/// across both kinds;
/// and the last release leaves no key of the permits behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_held_as_a_lock_or_with_permits_never_both() {
    let server = RedisServer::start().await;
    let backend = backend(&server.url()).await;
    let node = backend.node().clone();
    let ttl = Duration::from_secs(10);
    let attempt = |key: &'static str, permits: Permits| {
        backend.try_acquire(key, Owner::random(), permits, valid_ttl(ttl))
    };
    let one = Permits::new(1, 3).unwrap();
    let two = Permits::new(2, 3).unwrap();
    let a = grant(&backend, "mix/sem", one, ttl).await;
    let b = grant(&backend, "mix/sem", two, ttl).await;
    assert!(b.fence() > a.fence());
    let reason = invalid_permits(attempt("mix/sem", Permits::LOCK).await, "a lock");
    assert!(reason.contains("not as a lock"), "{reason}");
    let other_of = Permits::new(1, 4).unwrap();
    let reason = invalid_permits(attempt("mix/sem", other_of).await, "1 of 4");
    assert!(reason.contains("held with 3 permits, not 4"), "{reason}");
    match attempt("mix/sem", one).await.unwrap() {
        Attempt::Taken {
            expires_in: Some(left),
        } => assert!(
            left <= ttl && left > ttl - Duration::from_secs(3),
            "{left:?}"
        ),
        other => panic!("a full semaphore: {other:?}"),
    }
    let mut seen = backend.inspect("mix/sem").await.unwrap();
    seen.sort_by_key(|h| h.fence);
    let seen: Vec<_> = seen.iter().map(|h| (h.owner, h.fence, h.permits)).collect();
    assert_eq!(
        seen,
        [
            (Some(a.owner()), Some(a.fence()), one),
            (Some(b.owner()), Some(b.fence()), two)
        ]
    );
    let c = handed_over(&backend, &a, ttl).await;
    assert!(c.fence() > b.fence());
    assert!(matches!(
        backend.release(&a).await,
        Err(Error::NotHeld { .. })
    ));
    backend.release(&c).await.unwrap();
    assert!(matches!(
        backend.release(&c).await,
        Err(Error::NotHeld { .. })
    ));
    backend.extend(&b, valid_ttl(ttl)).await.unwrap();
    backend.release(&b).await.unwrap();
    assert!(matches!(
        backend.extend(&b, valid_ttl(ttl)).await,
        Err(Error::NotHeld { .. })
    ));
    assert_eq!(permits_keys_left(&server, &node, "mix/sem").await, [""; 0]);

    let lock = grant(&backend, "mix/sem", Permits::LOCK, ttl).await;
    assert!(lock.fence() > c.fence());
    for permits in [one, Permits::read(), Permits::write()] {
        let reason = invalid_permits(attempt("mix/sem", permits).await, "permits on a lock");
        assert!(reason.contains("held as a lock"), "{reason}");
    }
    assert_eq!(permits_keys_left(&server, &node, "mix/sem").await, [""; 0]);
    backend.release(&lock).await.unwrap();
    let reader = grant(&backend, "mix/sem", Permits::read(), ttl).await;
    assert!(reader.fence() > lock.fence());
    backend.release(&reader).await.unwrap();
    assert_eq!(permits_keys_left(&server, &node, "mix/sem").await, [""; 0]);
}

/// A release of permits is announced only when an attempt was refused since the last one:
/// uncontended cycles publish nothing, while a waiter of another process (its own backend
/// and subscription), whose refusal marked the key awaited, is woken by the notice long
/// before the holders' TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_wakes_a_waiter_of_another_process() {
    let server = RedisServer::start().await;
    let a = Arc::new(backend(&server.url()).await);
    let (mine, other) = (
        Locker::with_backend(a.clone()),
        Locker::new(backend(&server.url()).await),
    );
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(20))
        .wait_for(Duration::from_secs(20))
        .permits(Permits::new(1, 2).unwrap());
    let before = calls(&server, "publish").await;
    for _ in 0..5 {
        mine.acquire("quiet", &opts)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    assert_eq!(calls(&server, "publish").await, before, "nobody waited");

    let first = mine.acquire("wake", &opts).await.unwrap();
    let second = mine.acquire("wake", &opts).await.unwrap();
    let waiter = conformance::spawn_acquire(&other, "wake", &opts);
    let permits_key = a.node().permits_key("wake");
    let mut raw = server.client().await;
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let marked: bool = redis::cmd("HEXISTS")
            .arg(&permits_key)
            .arg("awaited")
            .query_async(&mut raw)
            .await
            .unwrap();
        if marked {
            break;
        }
        assert!(Instant::now() < until, "the refusal marks the key awaited");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let released = Instant::now();
    first.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("woken by the notice, long before the 20 s TTL")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(3));
    assert_eq!(calls(&server, "publish").await, before + 1, "one notice");
    next.release().await.unwrap();
    second.release().await.unwrap();
    assert_eq!(permits_keys_left(&server, a.node(), "wake").await, [""; 0]);
}

/// Abandoned attempts at permits leave nothing behind: a granted attempt abandoned gives
/// its own permits back (the other holder keeps its own); an attempt whose request reaches
/// the server only after its abandon (held in a proxy meanwhile) grants nothing; attempts
/// cancelled at random moments through a Locker leave no key once it shut down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_permit_attempts_leave_nothing() {
    let server = RedisServer::start().await;
    let proxy = FaultProxy::start(server.addr()).await;
    let late = RedisBackend::builder(proxy.addr().to_string())
        .timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let direct = backend(&server.url()).await;
    let node = direct.node().clone();
    let ttl = Duration::from_secs(30);
    let (one, two) = (Permits::new(1, 3).unwrap(), Permits::new(2, 3).unwrap());
    let kept = grant(&direct, "abandon/sem", one, ttl).await;
    let owner = Owner::random();
    let granted = direct
        .try_acquire("abandon/sem", owner, two, valid_ttl(ttl))
        .await
        .unwrap();
    assert!(matches!(granted, Attempt::Granted { .. }), "{granted:?}");
    direct.abandon("abandon/sem", owner).await.unwrap();
    let holders = direct.inspect("abandon/sem").await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].owner, Some(kept.owner()));
    let again = grant(&direct, "abandon/sem", two, ttl).await;
    direct.release(&again).await.unwrap();

    // The permits script is loaded: the late EVALSHA runs rather than meet NOSCRIPT.
    let owner = Owner::random();
    proxy.set_mode(ProxyMode::Blackhole);
    let e = late
        .try_acquire("abandon/sem", owner, two, valid_ttl(ttl))
        .await
        .expect_err("no answer through the blackhole");
    assert!(e.is_transient(), "{e}");
    direct.abandon("abandon/sem", owner).await.unwrap();
    let before = calls(&server, "evalsha").await + calls(&server, "eval").await;
    proxy.set_mode(ProxyMode::Pass);
    let deadline = Instant::now() + Duration::from_secs(5);
    while calls(&server, "evalsha").await + calls(&server, "eval").await == before {
        assert!(Instant::now() < deadline, "the held acquire never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let holders = direct.inspect("abandon/sem").await.unwrap();
    assert_eq!(holders.len(), 1, "the late attempt granted: {holders:?}");
    direct.release(&kept).await.unwrap();
    assert_eq!(
        permits_keys_left(&server, &node, "abandon/sem").await,
        [""; 0]
    );

    let locker = Locker::new(backend(&server.url()).await);
    let opts = LockOptions::new()
        .ttl(ttl)
        .wait_for(Duration::from_secs(5))
        .permits(two);
    for i in 0..60u64 {
        let attempt = locker.acquire("abandon/churn", &opts);
        // A guard granted in time is dropped at once (released in the background).
        let _ = tokio::time::timeout(Duration::from_micros(37 * i), attempt).await;
    }
    locker.shutdown().await;
    assert!(!raw_exists(&server, &node.lock_key("abandon/churn")).await);
    assert_eq!(
        permits_keys_left(&server, &node, "abandon/churn").await,
        [""; 0]
    );
}

/// A holder of 1 of 2 permits hands them to a new owner in one script: the new grant's
/// fence is above every earlier grant's, `inspect` names the new owner and not the old,
/// the permits were never free (a third claim is still refused; nothing is announced); the
/// old lease can no longer release, extend or hand over; the request asked again after a
/// lost reply answers the same fence. A released holder, an expired one, a lease claiming
/// another number of permits, and a hand-over to an abandoned owner hand nothing over and
/// change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_are_handed_over_only_by_their_holder() {
    let server = RedisServer::start().await;
    let backend = backend(&server.url()).await;
    let node = backend.node().clone();
    let ttl = Duration::from_secs(10);
    let one = Permits::new(1, 2).unwrap();
    let a = grant(&backend, "hand/sem", one, ttl).await;
    let b = grant(&backend, "hand/sem", one, ttl).await;
    let notices = calls(&server, "publish").await;
    let c = handed_over(&backend, &a, ttl).await;
    assert!(c.fence() > b.fence() && b.fence() > a.fence());
    assert!(c.valid_until() > b.valid_until());
    assert_eq!(
        holders(&backend, "hand/sem").await,
        [(b.owner(), b.fence(), one), (c.owner(), c.fence(), one)]
    );
    let third = backend
        .try_acquire("hand/sem", Owner::random(), one, valid_ttl(ttl))
        .await
        .unwrap();
    assert!(matches!(third, Attempt::Taken { .. }), "{third:?}");
    assert_eq!(calls(&server, "publish").await, notices, "never free");
    // Asked again after a lost reply: the same grant.
    let again = HandOver::hand_over(&backend, &a, c.owner(), valid_ttl(ttl)).await;
    assert!(
        matches!(again, Ok(Attempt::Granted { fence, .. }) if fence == c.fence()),
        "{again:?}"
    );
    // `a` holds nothing any more.
    let stale = HandOver::hand_over(&backend, &a, Owner::random(), valid_ttl(ttl)).await;
    assert!(matches!(stale, Ok(Attempt::Taken { .. })), "{stale:?}");
    assert!(matches!(
        backend.extend(&a, valid_ttl(ttl)).await,
        Err(Error::NotHeld { .. })
    ));
    assert!(matches!(
        backend.release(&a).await,
        Err(Error::NotHeld { .. })
    ));
    // A lease of `b`'s owner claiming 2 of 2 is not `b`'s grant.
    let other_claim = Lease::new("hand/sem", b.owner(), b.fence(), b.valid_until())
        .with_permits(Permits::new(2, 2).unwrap());
    let wrong = HandOver::hand_over(&backend, &other_claim, Owner::random(), valid_ttl(ttl)).await;
    assert!(matches!(wrong, Ok(Attempt::Taken { .. })), "{wrong:?}");
    // A hand-over to an owner whose attempt was abandoned (its tombstone) is refused.
    let abandoned = Owner::random();
    backend.abandon("hand/sem", abandoned).await.unwrap();
    let refused = HandOver::hand_over(&backend, &b, abandoned, valid_ttl(ttl)).await;
    assert!(matches!(refused, Ok(Attempt::Taken { .. })), "{refused:?}");
    assert_eq!(
        holders(&backend, "hand/sem").await,
        [(b.owner(), b.fence(), one), (c.owner(), c.fence(), one)],
        "nothing changed"
    );
    // Released: nothing to hand over.
    backend.release(&c).await.unwrap();
    let released = HandOver::hand_over(&backend, &c, Owner::random(), valid_ttl(ttl)).await;
    assert!(
        matches!(released, Ok(Attempt::Taken { .. })),
        "{released:?}"
    );
    assert_eq!(
        holders(&backend, "hand/sem").await,
        [(b.owner(), b.fence(), one)]
    );
    // Expired: nothing to hand over, and the expired grant is gone.
    let short = grant(&backend, "hand/sem", one, Duration::from_millis(50)).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let expired = HandOver::hand_over(&backend, &short, Owner::random(), valid_ttl(ttl)).await;
    assert!(matches!(expired, Ok(Attempt::Taken { .. })), "{expired:?}");
    assert_eq!(
        holders(&backend, "hand/sem").await,
        [(b.owner(), b.fence(), one)]
    );
    let d = grant(&backend, "hand/sem", one, ttl).await;
    assert!(d.fence() > c.fence());
    backend.release(&b).await.unwrap();
    backend.release(&d).await.unwrap();
    assert_eq!(permits_keys_left(&server, &node, "hand/sem").await, [""; 0]);
}

/// Reader-writer keys: a reader hands its read to a new reader beside the other readers
/// (a writer is still refused), and a writer hands the whole key to a new writer, each
/// with a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_writers_are_handed_over() {
    let server = RedisServer::start().await;
    let backend = backend(&server.url()).await;
    let node = backend.node().clone();
    let ttl = Duration::from_secs(10);
    let read = Permits::read();
    let r1 = grant(&backend, "hand/rw", read, ttl).await;
    let r2 = grant(&backend, "hand/rw", read, ttl).await;
    let r3 = handed_over(&backend, &r1, ttl).await;
    assert!(r3.fence() > r2.fence());
    assert_eq!(
        holders(&backend, "hand/rw").await,
        [
            (r2.owner(), r2.fence(), read),
            (r3.owner(), r3.fence(), read)
        ]
    );
    let writer = backend
        .try_acquire("hand/rw", Owner::random(), Permits::write(), valid_ttl(ttl))
        .await
        .unwrap();
    assert!(matches!(writer, Attempt::Taken { .. }), "{writer:?}");
    backend.release(&r2).await.unwrap();
    backend.release(&r3).await.unwrap();

    let w1 = grant(&backend, "hand/rw", Permits::write(), ttl).await;
    let w2 = handed_over(&backend, &w1, ttl).await;
    assert!(w2.fence() > w1.fence() && w1.fence() > r3.fence());
    assert_eq!(
        holders(&backend, "hand/rw").await,
        [(w2.owner(), w2.fence(), Permits::write())]
    );
    let reader = backend
        .try_acquire("hand/rw", Owner::random(), read, valid_ttl(ttl))
        .await
        .unwrap();
    assert!(matches!(reader, Attempt::Taken { .. }), "{reader:?}");
    backend.release(&w2).await.unwrap();
    assert_eq!(permits_keys_left(&server, &node, "hand/rw").await, [""; 0]);
}

/// Through a Locker: a writer's (and a 2-of-3 holder's) release hands the claim to the
/// Locker's waiter queued behind it in one script (one script call on the server for the
/// release and the grant together), with a higher fence, `inspect` naming the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_hands_permits_to_its_waiter() {
    let server = RedisServer::start().await;
    let backend = Arc::new(backend(&server.url()).await);
    let locker = Locker::with_backend(backend.clone());
    let settle = Duration::from_millis(200);
    // Loads the hand-over script: the one call counted below is then not sent twice
    // (`EVALSHA`, then `EVAL` after `NOSCRIPT`).
    let warm = grant(
        &backend,
        "hand/warm",
        Permits::write(),
        Duration::from_secs(5),
    )
    .await;
    let warm = handed_over(&backend, &warm, Duration::from_secs(5)).await;
    backend.release(&warm).await.unwrap();
    for (key, permits) in [
        ("hand/locker-w", Permits::write()),
        ("hand/locker-sem", Permits::new(2, 3).unwrap()),
    ] {
        let wait = LockOptions::new()
            .ttl(Duration::from_secs(5))
            .wait_for(Duration::from_secs(10))
            .watchdog(false)
            .permits(permits);
        let (holder, waiter) = queued_holder_and_waiter(&locker, key, &wait, settle).await;
        let scripts = calls(&server, "evalsha").await + calls(&server, "eval").await;
        let fence = holder.fence();
        holder.release().await.unwrap();
        let next = waiter.await.unwrap().unwrap();
        assert_eq!(
            calls(&server, "evalsha").await + calls(&server, "eval").await,
            scripts + 1,
            "{permits}: one script, no release and acquire"
        );
        assert!(next.fence() > fence);
        assert_eq!(
            holders(&backend, key).await,
            [(next.lease().owner(), next.fence(), permits)]
        );
        next.release().await.unwrap();
        assert_eq!(
            permits_keys_left(&server, backend.node(), key).await,
            [""; 0]
        );
    }
}

/// A grant's permits are the server's until its expiry has passed, not at the millisecond
/// it names: the scripts read the time rounded down to the millisecond, so a grant expiring
/// at `E` still has up to a millisecond left for its holder (whose validity counts from
/// before its request) while the server's clock reads `E`. A claim of all the permits that
/// keeps asking across that millisecond is granted only once the clock is past it. Fences
/// on a fresh key are the server's clock in ms × 1000, which tells when each grant was made.
/// (The exclusion checker once saw four of three permits believed held: a grant at `E`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_are_not_granted_again_in_their_expiry_millisecond() {
    let server = RedisServer::start().await;
    let backend = backend(&server.url()).await;
    let all = Permits::new(2, 2).unwrap();
    let ttl = Duration::from_millis(100);
    for round in 0..5 {
        let key = format!("expiry-ms/{round}");
        let first = grant(&backend, &key, all, ttl).await;
        let expiry_ms = first.fence() / 1000 + ttl.as_millis() as u64;
        tokio::time::sleep(ttl - Duration::from_millis(10)).await;
        let next = Owner::random();
        let give_up = Instant::now() + Duration::from_secs(2);
        let fence = loop {
            match backend
                .try_acquire(&key, next, all, valid_ttl(ttl))
                .await
                .unwrap()
            {
                Attempt::Granted { fence, .. } => break fence,
                _ => assert!(Instant::now() < give_up, "never granted again"),
            }
        };
        assert!(
            fence / 1000 > expiry_ms,
            "round {round}: granted at {} ms, in the millisecond the first grant expires ({expiry_ms})",
            fence / 1000
        );
    }
}
