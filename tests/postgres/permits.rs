//! Semaphores and reader-writer keys beside locks: the holders' table, the marker row in
//! the lease table, administration.

use super::*;

use distlock::{Admin, HandOver, Lease, Permits};

fn valid_ttl(ttl: Duration) -> distlock::Ttl {
    distlock::postgres::CAPABILITIES
        .effective_ttl(ttl)
        .expect("a valid TTL")
}

/// `permits` of `key` for `ttl`, straight on the backend: the lease of the grant.
async fn grant(backend: &PostgresBackend, key: &str, permits: Permits, ttl: Duration) -> Lease {
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

/// The reason of an `InvalidPermits` refusal (anything else fails the test).
fn invalid_permits(attempt: distlock::Result<Attempt>, what: &str) -> String {
    match attempt {
        Err(Error::InvalidPermits { reason }) => reason,
        other => panic!("{what}: {other:?}"),
    }
}

/// The rows `key` has in the lease table and in the holders' table.
async fn rows(server: &PostgresServer, backend: &PostgresBackend, key: &str) -> (i64, i64) {
    let raw = server.client().await;
    let count = |table: &str| format!("SELECT count(*) FROM {table} WHERE key = $1::bytea");
    let lease = raw
        .query_one(&count(backend.table()), &[&key.as_bytes()])
        .await
        .unwrap();
    let perms = raw
        .query_one(&count(backend.perms_table()), &[&key.as_bytes()])
        .await
        .unwrap();
    (lease.get(0), perms.get(0))
}

/// A key is held as a lock or with permits, never both: a lock is refused on a key held
/// with permits, and permits (a semaphore's, a reader's, a writer's) on a key held as a
/// lock, with `InvalidPermits` naming what holds it; a Locker's waiting lock gets the same
/// refusal rather than waiting; fences keep climbing across both kinds; a hand-over of
/// permits is unsupported; and the last release leaves no row behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_permits_on_one_key_exclude_each_other() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=mixed");
    let backend = super::backend(&url).await;
    let ttl = Duration::from_secs(20);
    let k = key("mixed");
    let attempt =
        |permits: Permits| backend.try_acquire(&k, Owner::random(), permits, valid_ttl(ttl));
    let one = Permits::new(1, 3).unwrap();
    let a = grant(&backend, &k, one, ttl).await;
    let b = grant(&backend, &k, one, ttl).await;
    assert!(b.fence() > a.fence());
    let reason = invalid_permits(attempt(Permits::LOCK).await, "a lock on permits");
    assert!(reason.contains("not as a lock"), "{reason}");
    let locker = Locker::new(super::backend(&url).await);
    let waited = locker
        .acquire(&k, &LockOptions::new().wait_for(Duration::from_secs(5)))
        .await;
    assert!(
        matches!(waited, Err(Error::InvalidPermits { .. })),
        "a waiting lock on permits: {waited:?}"
    );
    let handed = HandOver::hand_over(&backend, &a, Owner::random(), valid_ttl(ttl)).await;
    assert!(
        matches!(handed, Err(Error::Unsupported { .. })),
        "{handed:?}"
    );
    backend.release(&a).await.unwrap();
    let reason = invalid_permits(attempt(Permits::LOCK).await, "a lock beside one holder");
    assert!(reason.contains("not as a lock"), "{reason}");
    backend.release(&b).await.unwrap();
    assert_eq!(rows(&server, &backend, &k).await, (0, 0), "nothing left");

    let lock = grant(&backend, &k, Permits::LOCK, ttl).await;
    assert!(lock.fence() > b.fence());
    for permits in [one, Permits::read(), Permits::write()] {
        let reason = invalid_permits(attempt(permits).await, "permits on a lock");
        assert!(reason.contains("held as a lock"), "{reason}");
    }
    assert_eq!(rows(&server, &backend, &k).await, (1, 0));
    backend.release(&lock).await.unwrap();
    let reader = grant(&backend, &k, Permits::read(), ttl).await;
    assert!(reader.fence() > lock.fence());
    backend.release(&reader).await.unwrap();
    assert_eq!(rows(&server, &backend, &k).await, (0, 0), "nothing left");
    locker.shutdown().await;
}

/// An expired lock's row is taken over by permits, and the expired marker of permits by a
/// lock: each kind's expiry frees the key for the other, with climbing fences.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_takes_over_the_other_once_expired() {
    let server = PostgresServer::start().await;
    let backend = backend(&postgres_url(server.addr(), "table=expired")).await;
    let short = Duration::from_millis(300);
    let k = key("expired");
    let lock = grant(&backend, &k, Permits::LOCK, short).await;
    // The lock's TTL on the database's clock: nothing announces an expiry.
    tokio::time::sleep(short * 2).await;
    let sem = grant(&backend, &k, Permits::new(2, 2).unwrap(), short).await;
    assert!(sem.fence() > lock.fence());
    assert!(matches!(
        backend.extend(&lock, valid_ttl(short)).await,
        Err(Error::NotHeld { .. })
    ));
    tokio::time::sleep(short * 2).await;
    let next = grant(&backend, &k, Permits::LOCK, Duration::from_secs(10)).await;
    assert!(next.fence() > sem.fence());
    assert!(matches!(
        backend.extend(&sem, valid_ttl(short)).await,
        Err(Error::NotHeld { .. })
    ));
    assert!(matches!(
        backend.release(&sem).await,
        Err(Error::NotHeld { .. })
    ));
    // The expired holder's release changed nothing of the lock.
    assert_eq!(backend.inspect(&k).await.unwrap().len(), 1);
    backend.release(&next).await.unwrap();
}

/// A claim naming another number of permits than the key's holders is refused with
/// `InvalidPermits`; a full semaphore answers taken with its first holder's time left; a
/// holder asking again (a re-sent request) keeps its fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatched_permits_are_refused() {
    let server = PostgresServer::start().await;
    let backend = backend(&postgres_url(server.addr(), "table=mismatch")).await;
    let ttl = Duration::from_secs(20);
    let k = key("mismatch");
    let two = Permits::new(2, 3).unwrap();
    let a = grant(&backend, &k, two, ttl).await;
    let other_of = backend
        .try_acquire(
            &k,
            Owner::random(),
            Permits::new(1, 4).unwrap(),
            valid_ttl(ttl),
        )
        .await;
    let reason = invalid_permits(other_of, "1 of 4");
    assert!(reason.contains("held with 3 permits, not 4"), "{reason}");
    for permits in [Permits::read(), Permits::write()] {
        let reason = invalid_permits(
            backend
                .try_acquire(&k, Owner::random(), permits, valid_ttl(ttl))
                .await,
            "reader-writer on a semaphore",
        );
        assert!(reason.contains("held with 3 permits"), "{reason}");
    }
    match backend
        .try_acquire(&k, Owner::random(), two, valid_ttl(ttl))
        .await
        .unwrap()
    {
        Attempt::Taken {
            expires_in: Some(left),
        } => assert!(left <= ttl && left > ttl / 2, "{left:?}"),
        other => panic!("a full semaphore: {other:?}"),
    }
    match backend
        .try_acquire(&k, a.owner(), two, valid_ttl(ttl))
        .await
        .unwrap()
    {
        Attempt::Granted { fence, .. } => assert_eq!(fence, a.fence(), "asked again"),
        other => panic!("the holder asking again: {other:?}"),
    }
    backend.release(&a).await.unwrap();
    // Free again: another number of permits starts it over.
    let b = grant(&backend, &k, Permits::new(1, 4).unwrap(), ttl).await;
    backend.release(&b).await.unwrap();
}

/// A holder that crashed (its process and connection gone, nothing released) keeps its
/// permits until its TTL on the database's clock, and they come back then: a waiter of
/// another process is granted after the TTL, not before, and the dead holder's row is
/// gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_permits_come_back_at_its_ttl() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=crashed");
    let ttl = Duration::from_millis(1500);
    let k = key("crashed");
    let all = Permits::new(2, 2).unwrap();
    let sent = Instant::now();
    let dead = {
        let doomed = backend(&url).await;
        let lease = grant(&doomed, &k, all, ttl).await;
        drop(doomed);
        lease
    };
    let other = backend(&url).await;
    let seen = other.inspect(&k).await.unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].owner, Some(dead.owner()));
    assert_eq!(seen[0].permits, all);
    let locker = Locker::new(other);
    let o = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_for(Duration::from_secs(30))
        .permits(Permits::new(1, 2).unwrap());
    let guard = locker.acquire(&k, &o).await.unwrap();
    let waited = sent.elapsed();
    assert!(
        waited >= ttl,
        "granted after {waited:?}, before the dead holder's TTL of {ttl:?}"
    );
    assert!(guard.fence() > dead.fence());
    let holders = locker.backend().admin().unwrap().inspect(&k).await.unwrap();
    assert_eq!(holders.len(), 1, "the dead holder is gone: {holders:?}");
    assert_eq!(holders[0].fence, Some(guard.fence()));
    guard.release().await.unwrap();
    locker.shutdown().await;
}

/// `inspect` lists every holder of a key's permits with its owner, fence, time left and
/// claim (not the marker row), `force_release` deletes them all and the marker in one
/// transaction, wakes a waiter of another Locker, and leaves the old holders not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_lists_holders_and_force_release_clears_them() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=admin");
    let backend = backend(&url).await;
    let ttl = Duration::from_secs(30);
    let k = key("admin");
    let one = Permits::new(1, 3).unwrap();
    let two = Permits::new(2, 3).unwrap();
    let a = grant(&backend, &k, one, ttl).await;
    let b = grant(&backend, &k, two, ttl).await;
    let mut seen = backend.inspect(&k).await.unwrap();
    seen.sort_by_key(|h| h.fence);
    for holder in &seen {
        let left = holder.expires_in.expect("time left");
        assert!(left <= ttl && left > ttl / 2, "{left:?}");
    }
    let seen: Vec<_> = seen.iter().map(|h| (h.owner, h.fence, h.permits)).collect();
    assert_eq!(
        seen,
        [
            (Some(a.owner()), Some(a.fence()), one),
            (Some(b.owner()), Some(b.fence()), two)
        ]
    );
    assert_eq!(
        rows(&server, &backend, &k).await,
        (1, 2),
        "a marker, two holders"
    );

    let waiter = Locker::new(super::backend(&url).await);
    let task = {
        let (waiter, k) = (waiter.clone(), k.clone());
        tokio::spawn(async move {
            let o = LockOptions::new()
                .ttl(ttl)
                .wait_for(Duration::from_secs(20))
                .permits(two);
            let got = waiter.acquire(&k, &o).await;
            (got, Instant::now())
        })
    };
    // The waiter has been refused once (the key marked awaited) when this returns.
    wait_until_awaited(&server, &backend, &k).await;
    let forced = Instant::now();
    assert!(backend.force_release(&k).await.unwrap());
    let (got, at) = task.await.unwrap();
    let got = got.expect("granted after the forced release");
    assert!(
        at.duration_since(forced) < Duration::from_secs(10),
        "woken by the notice, not at the holders' TTL"
    );
    assert!(got.fence() > b.fence());
    for lease in [&a, &b] {
        assert!(matches!(
            backend.extend(lease, valid_ttl(ttl)).await,
            Err(Error::NotHeld { .. })
        ));
        assert!(matches!(
            backend.release(lease).await,
            Err(Error::NotHeld { .. })
        ));
    }
    got.release().await.unwrap();
    assert!(!backend.force_release(&k).await.unwrap(), "nothing held");
    assert_eq!(rows(&server, &backend, &k).await, (0, 0));
    waiter.shutdown().await;
}

/// Polls the marker row until a refused attempt has marked it awaited (the waiter's
/// refusal is the event; its round trip is what is awaited).
async fn wait_until_awaited(server: &PostgresServer, backend: &PostgresBackend, key: &str) {
    let raw = server.client().await;
    let sql = format!(
        "SELECT count(*) FROM {} WHERE key = $1::bytea AND awaited",
        backend.table()
    );
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let row = raw.query_one(&sql, &[&key.as_bytes()]).await.unwrap();
        if row.get::<_, i64>(0) == 1 {
            return;
        }
        assert!(Instant::now() < until, "the waiter was never refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An abandoned attempt of permits (its answer never came) leaves nothing behind: the
/// clean-up, which does not know the claim, removes the holder and the marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandon_removes_a_granted_claim_of_permits() {
    let server = PostgresServer::start().await;
    let backend = backend(&postgres_url(server.addr(), "table=abandon")).await;
    let k = key("abandon");
    let lease = grant(&backend, &k, Permits::read(), Duration::from_secs(30)).await;
    backend.abandon(&k, lease.owner()).await.unwrap();
    assert!(backend.inspect(&k).await.unwrap().is_empty());
    assert_eq!(rows(&server, &backend, &k).await, (0, 0));
    let lock = grant(&backend, &k, Permits::LOCK, Duration::from_secs(30)).await;
    backend.abandon(&k, lock.owner()).await.unwrap();
    assert_eq!(rows(&server, &backend, &k).await, (0, 0));
}

/// A lease table made before permits existed (no `<table>_perms`) gets its holders' table
/// from the next backend that connects; permits then work on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_table_gets_its_holders_table() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=older");
    let first = backend(&url).await;
    let raw = server.client().await;
    raw.batch_execute(&format!("DROP TABLE {}", first.perms_table()))
        .await
        .unwrap();
    drop(first);
    let again = backend(&url).await;
    let k = key("older");
    let lease = grant(
        &again,
        &k,
        Permits::new(1, 2).unwrap(),
        Duration::from_secs(10),
    )
    .await;
    again.release(&lease).await.unwrap();
}
