//! Semaphores and reader-writer keys beside locks: the etcd layout (a holder key per grant
//! beside the lock key), what a crashed holder leaves, and the refusals between kinds.

use super::*;
use distlock::{Attempt, HandOver, Lease, Owner, Permits, Ttl};

fn valid_ttl(backend: &EtcdBackend, ttl: Duration) -> Ttl {
    backend
        .capabilities()
        .effective_ttl(ttl)
        .expect("a valid TTL")
}

/// `permits` of `key` for `ttl`, straight on the backend: the lease of the grant.
async fn grant(backend: &EtcdBackend, key: &str, permits: Permits, ttl: Duration) -> Lease {
    let owner = Owner::random();
    match backend
        .try_acquire(key, owner, permits, valid_ttl(backend, ttl))
        .await
        .unwrap()
    {
        Attempt::Granted { fence, valid_until } => {
            Lease::new(key, owner, fence, valid_until).with_permits(permits)
        }
        taken => panic!("{permits} of {key}: {taken:?}"),
    }
}

/// The reason of an `InvalidPermits` refusal (anything else fails the test).
fn invalid_permits(attempt: distlock::Result<Attempt>, what: &str) -> String {
    match attempt {
        Err(Error::InvalidPermits { reason }) => reason,
        other => panic!("{what}: {other:?}"),
    }
}

/// Every etcd key of lock `name` under `prefix` (the lock key and its holder keys), read
/// with a client of its own.
async fn keys_of(server: &EtcdServer, prefix: &str, name: &str) -> Vec<String> {
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let key = format!("{prefix}{name}");
    let options = etcd_client::GetOptions::new()
        .with_prefix()
        .with_keys_only();
    let found = client.get(key.clone(), Some(options)).await.unwrap();
    found
        .kvs()
        .iter()
        // The prefix also covers longer names (`name2`): only the key and its holders.
        .filter(|kv| kv.key() == key.as_bytes() || kv.key().get(key.len()) == Some(&0xFF))
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// A key is held as a lock or with permits, never both, across processes: a lock is refused
/// on a key held with permits, and permits on a key held as a lock, with `InvalidPermits`
/// naming what holds it, as is another number of permits; a full semaphore answers taken
/// with its earliest holder's time left; inspect lists each holder with its permits and
/// fence; a hand-over of permits is unsupported; fences keep climbing across both kinds;
/// and the last release leaves no key behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_held_as_a_lock_or_with_permits_never_both() {
    let server = EtcdServer::start().await;
    let endpoints = [server.endpoint()];
    let (mine, other) = (
        backend(&endpoints, "prefix=mix/").await,
        backend(&endpoints, "prefix=mix/").await,
    );
    let ttl = Duration::from_secs(10);
    let attempt = |key: &'static str, permits: Permits| {
        other.try_acquire(key, Owner::random(), permits, valid_ttl(&other, ttl))
    };
    let one = Permits::new(1, 3).unwrap();
    let two = Permits::new(2, 3).unwrap();
    let a = grant(&mine, "sem", one, ttl).await;
    let b = grant(&other, "sem", two, ttl).await;
    assert!(b.fence() > a.fence());
    let reason = invalid_permits(attempt("sem", Permits::LOCK).await, "a lock");
    assert!(reason.contains("not as a lock"), "{reason}");
    let other_of = Permits::new(1, 4).unwrap();
    let reason = invalid_permits(attempt("sem", other_of).await, "1 of 4");
    assert!(reason.contains("held with 3 permits, not 4"), "{reason}");
    match attempt("sem", one).await.unwrap() {
        Attempt::Taken {
            expires_in: Some(left),
        } => assert!(
            left <= ttl + Duration::from_secs(2) && left > ttl - Duration::from_secs(5),
            "{left:?}"
        ),
        taken => panic!("a full semaphore: {taken:?}"),
    }
    for admin in [&mine, &other] {
        let mut seen = admin.inspect("sem").await.unwrap();
        seen.sort_by_key(|h| h.fence);
        let seen: Vec<_> = seen.iter().map(|h| (h.owner, h.fence, h.permits)).collect();
        assert_eq!(
            seen,
            [
                (Some(a.owner()), Some(a.fence()), one),
                (Some(b.owner()), Some(b.fence()), two)
            ]
        );
    }
    let handed = HandOver::hand_over(&mine, &a, Owner::random(), valid_ttl(&mine, ttl)).await;
    assert!(
        matches!(handed, Err(Error::Unsupported { .. })),
        "{handed:?}"
    );
    mine.release(&a).await.unwrap();
    assert!(matches!(mine.release(&a).await, Err(Error::NotHeld { .. })));
    other.extend(&b, valid_ttl(&other, ttl)).await.unwrap();
    // A new TTL moves the holder key onto a new lease; its fence stays.
    let longer = valid_ttl(&other, ttl + Duration::from_secs(5));
    other.extend(&b, longer).await.unwrap();
    let seen = other.inspect("sem").await.unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].fence, Some(b.fence()));
    other.release(&b).await.unwrap();
    assert!(matches!(
        other.extend(&b, valid_ttl(&other, ttl)).await,
        Err(Error::NotHeld { .. })
    ));
    assert_eq!(keys_of(&server, "mix/", "sem").await, [""; 0]);

    let lock = grant(&mine, "sem", Permits::LOCK, ttl).await;
    assert!(lock.fence() > b.fence());
    for permits in [one, Permits::read(), Permits::write()] {
        let reason = invalid_permits(attempt("sem", permits).await, "permits on a lock");
        assert!(reason.contains("held as a lock"), "{reason}");
    }
    assert_eq!(keys_of(&server, "mix/", "sem").await, ["mix/sem"]);
    mine.release(&lock).await.unwrap();
    let reader = grant(&other, "sem", Permits::read(), ttl).await;
    assert!(reader.fence() > lock.fence());
    other.release(&reader).await.unwrap();
    assert_eq!(keys_of(&server, "mix/", "sem").await, [""; 0]);
}

/// A force-release removes every holder of a key's permits (each holder's next renewal
/// finds its grant lost) and wakes the key's waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_removes_every_holder() {
    let server = EtcdServer::start().await;
    let endpoints = [server.endpoint()];
    let (mine, other) = (
        backend(&endpoints, "prefix=force/").await,
        backend(&endpoints, "prefix=force/").await,
    );
    let ttl = Duration::from_secs(10);
    let readers = [
        grant(&mine, "rw", Permits::read(), ttl).await,
        grant(&other, "rw", Permits::read(), ttl).await,
    ];
    assert_eq!(mine.inspect("rw").await.unwrap().len(), 2);
    assert!(mine.force_release("rw").await.unwrap());
    assert_eq!(keys_of(&server, "force/", "rw").await, [""; 0]);
    assert!(mine.inspect("rw").await.unwrap().is_empty());
    assert!(!mine.force_release("rw").await.unwrap());
    for (backend, reader) in [(&mine, &readers[0]), (&other, &readers[1])] {
        assert!(matches!(
            backend.extend(reader, valid_ttl(backend, ttl)).await,
            Err(Error::NotHeld { .. })
        ));
    }
    // Free for a writer now.
    let writer = grant(&other, "rw", Permits::write(), ttl).await;
    other.release(&writer).await.unwrap();
}

/// The permits of a holder whose process vanished (its network gone, so its leases are
/// neither renewed nor revoked) come back at its TTL, not before, and a waiter of another
/// process is granted them then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_permits_come_back_at_its_ttl() {
    let server = EtcdServer::start().await;
    let proxy = FaultProxy::start(server.addr()).await;
    let crashed = backend(&[proxy.addr().to_string()], "timeout=1s").await;
    let waiter = Locker::new(backend(&[server.endpoint()], "").await);
    let ttl = crashed.capabilities().min_ttl;
    let k = key("crashed");
    let held = grant(&crashed, &k, Permits::new(2, 2).unwrap(), ttl).await;
    proxy.set_mode(ProxyMode::Blackhole);
    // Its revocations at drop never arrive.
    drop(crashed);
    let o = opts(ttl)
        .permits(Permits::new(1, 2).unwrap())
        .wait_for(ttl * 4 + Duration::from_secs(15));
    let guard = waiter.acquire(&k, &o).await.expect("the permits come back");
    assert!(
        Instant::now() >= held.valid_until(),
        "granted before the crashed holder's TTL ran out"
    );
    assert!(guard.fence() > held.fence());
    let holders = waiter.backend().admin().unwrap().inspect(&k).await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].fence, Some(guard.fence()));
    guard.release().await.unwrap();
}

/// Claims racing on one key from several processes never hold more than its permits, and
/// every attempt answers within the operation timeout, granted, taken or with a transient
/// error (the bounded retries of a contended transaction), never hanging or failing
/// otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_claims_answer_within_the_timeout_and_stay_within_the_permits() {
    const OF: u32 = 4;
    let server = EtcdServer::start().await;
    let mut backends = Vec::new();
    for _ in 0..4 {
        backends.push(Arc::new(
            backend(&[server.endpoint()], "prefix=race/&timeout=3s").await,
        ));
    }
    let k = key("race");
    let ttl = Duration::from_secs(10);
    let held = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let (backend, k, held) = (backends[i % 4].clone(), k.clone(), held.clone());
            tokio::spawn(async move {
                let permits = Permits::new(1 + (i as u32 % 2), OF).unwrap();
                let (mut granted, mut transient) = (0, 0);
                for _ in 0..10 {
                    let started = Instant::now();
                    let owner = Owner::random();
                    let answer = backend
                        .try_acquire(&k, owner, permits, valid_ttl(&backend, ttl))
                        .await;
                    assert!(
                        started.elapsed() < backend.timeout() * 2,
                        "an attempt took {:?}",
                        started.elapsed()
                    );
                    match answer {
                        Ok(Attempt::Granted { fence, valid_until }) => {
                            let take = permits.take() as usize;
                            let now = held.fetch_add(take, Ordering::SeqCst) + take;
                            assert!(now <= OF as usize, "{now} permits held of {OF}");
                            held.fetch_sub(take, Ordering::SeqCst);
                            let lease = Lease::new(k.as_str(), owner, fence, valid_until)
                                .with_permits(permits);
                            backend.release(&lease).await.expect("release");
                            granted += 1;
                        }
                        Ok(Attempt::Taken { .. }) => {}
                        // The contended key's bounded retries, or a timeout: both the
                        // transient `Unavailable` the Locker retries.
                        Err(e @ Error::Unavailable { .. }) => {
                            assert!(e.is_transient(), "{e}");
                            backend.abandon(&k, owner).await.expect("abandon");
                            transient += 1;
                        }
                        Err(e) => panic!("{permits}: {e}"),
                    }
                }
                (granted, transient)
            })
        })
        .collect();
    let (mut granted, mut transient) = (0, 0);
    for task in tasks {
        let (g, t) = task.await.expect("a task broke the rule");
        granted += g;
        transient += t;
    }
    eprintln!("racing claims: {granted} granted, {transient} transient errors");
    assert!(granted > 0, "nothing was granted");
    let left = keys_of(&server, "race/", &k).await;
    assert_eq!(left, [""; 0], "keys left behind");
}
