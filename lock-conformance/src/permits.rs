//! The rules of grants of several permits: semaphores (k of N) and reader-writer keys. A
//! backend whose capabilities keep locks only ([`max_permits`] 1) must refuse such claims
//! before any I/O; the others keep every rule below.
//!
//! [`max_permits`]: lock_core::Capabilities::max_permits

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::target::{opts, slack, spawn_acquire, Target};
use lock_core::{Attempt, Error, LockOptions, Locker, Owner, Permits, RW_PERMITS};

/// Whether the target keeps semaphores and reader-writer keys; when it does not, checks
/// that it refuses them before any I/O, as its capabilities say.
async fn keeps_permits(t: &Target) -> bool {
    if t.caps().max_permits >= RW_PERMITS {
        return true;
    }
    let locker = t.locker();
    let key = t.key("permits-refused");
    for permits in [
        Permits::new(1, 2).unwrap(),
        Permits::read(),
        Permits::write(),
    ] {
        let o = opts(Duration::from_secs(5)).permits(permits);
        match locker.acquire(&key, &o).await {
            Err(Error::Unsupported { backend, operation }) => {
                assert_eq!(backend, t.caps().name);
                assert_eq!(operation, t.caps().permits_refusal);
            }
            other => panic!("{permits:?} on a backend of locks only: {other:?}"),
        }
    }
    // A lock is still a lock.
    let lock = locker.acquire(&key, &opts(Duration::from_secs(5))).await;
    lock.expect("a lock").release().await.unwrap();
    false
}

/// Claims of several permits are refused before any I/O where the capabilities keep locks
/// only; elsewhere a claim naming another number of permits than the key's holders is
/// refused with [`Error::InvalidPermits`], and bad claims never reach the backend.
pub async fn claims_of_permits_follow_the_capabilities(t: &Target) {
    assert!(matches!(
        Permits::new(0, 3),
        Err(Error::InvalidPermits { .. })
    ));
    assert!(matches!(
        Permits::new(4, 3),
        Err(Error::InvalidPermits { .. })
    ));
    if !keeps_permits(t).await {
        return;
    }
    let (a, b) = (t.locker(), t.locker());
    let key = t.key("permits-mismatch");
    let ttl = Duration::from_secs(10);
    let held = a
        .acquire(&key, &opts(ttl).permits(Permits::new(1, 3).unwrap()))
        .await
        .unwrap();
    let other = b
        .acquire(&key, &opts(ttl).permits(Permits::new(1, 4).unwrap()))
        .await;
    assert!(
        matches!(other, Err(Error::InvalidPermits { .. })),
        "another number of permits on a held key: {other:?}"
    );
    let lock = b.acquire(&key, &opts(ttl)).await;
    assert!(
        matches!(lock, Err(Error::InvalidPermits { .. })),
        "a lock on a key held as a semaphore: {lock:?}"
    );
    held.release().await.unwrap();
    // Free again: any claim starts it over.
    b.acquire(&key, &opts(ttl))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Never more permits believed held than the key has, across Lockers and tasks claiming one
/// or two of them at once, while the key is kept busy (all its permits in use at times).
pub async fn permits_are_never_held_beyond_their_number(t: &Target) {
    if !keeps_permits(t).await {
        return;
    }
    const OF: u32 = 3;
    let key = t.key("semaphore");
    let ttl = t.short_ttl().max(Duration::from_secs(2));
    let held = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let (locker, key, held, most) = (t.locker(), key.clone(), held.clone(), most.clone());
            tokio::spawn(async move {
                let take = 1 + (i % 2);
                let o = LockOptions::new()
                    .ttl(ttl)
                    .wait_for(Duration::from_secs(30))
                    .permits(Permits::new(take, OF).unwrap());
                for _ in 0..8 {
                    let guard = locker.acquire(&key, &o).await.expect("permits");
                    let now = held.fetch_add(take, Ordering::SeqCst) + take;
                    most.fetch_max(now, Ordering::SeqCst);
                    assert!(now <= OF, "{now} permits held of {OF}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    held.fetch_sub(take, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
                locker.shutdown().await;
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a task broke the rule");
    }
    assert!(
        most.load(Ordering::SeqCst) >= 2,
        "the permits were shared: at most {} held at once",
        most.load(Ordering::SeqCst)
    );
}

/// Readers share a reader-writer key; a writer holds it alone: refused while a reader
/// holds, and readers are refused while it holds.
pub async fn readers_share_and_a_writer_holds_alone(t: &Target) {
    if !keeps_permits(t).await {
        return;
    }
    let (a, b) = (t.locker(), t.locker());
    let key = t.key("rw");
    let ttl = Duration::from_secs(10);
    let read = opts(ttl).permits(Permits::read());
    let write = opts(ttl).permits(Permits::write());
    let r1 = a.acquire(&key, &read).await.unwrap();
    let r2 = b.acquire(&key, &read).await.unwrap();
    assert_eq!(r2.permits(), Permits::read());
    assert!(matches!(
        b.acquire(&key, &write).await,
        Err(Error::Locked { .. })
    ));
    r1.release().await.unwrap();
    assert!(matches!(
        a.acquire(&key, &write).await,
        Err(Error::Locked { .. })
    ));
    r2.release().await.unwrap();
    let w = a.acquire(&key, &write).await.unwrap();
    assert!(w.permits().is_exclusive());
    assert!(matches!(
        b.acquire(&key, &read).await,
        Err(Error::Locked { .. })
    ));
    assert!(matches!(
        b.acquire(&key, &write).await,
        Err(Error::Locked { .. })
    ));
    w.release().await.unwrap();
    b.acquire(&key, &read)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Every grant of a key gets a fence greater than every earlier grant's, whatever it
/// claims: concurrent permits, readers and writers alike.
pub async fn fences_increase_across_every_grant_of_a_key(t: &Target) {
    if !keeps_permits(t).await || !t.caps().monotonic_fencing {
        return;
    }
    let ttl = Duration::from_secs(10);
    let lockers = [t.locker(), t.locker()];
    let sem = Permits::new(1, 3).unwrap();
    // Rounds of claims held together, released together before the next round.
    let rounds: [(&str, Vec<Permits>); 4] = [
        ("fence-sem", vec![sem, sem, sem]),
        ("fence-sem", vec![sem, sem]),
        ("fence-rw", vec![Permits::read(), Permits::read()]),
        ("fence-rw", vec![Permits::write()]),
    ];
    let keys: std::collections::HashMap<&str, String> = [
        ("fence-sem", t.key("fence-sem")),
        ("fence-rw", t.key("fence-rw")),
    ]
    .into();
    let mut last: std::collections::HashMap<&str, u64> = Default::default();
    for _ in 0..3 {
        for (name, claims) in &rounds {
            let key = &keys[name];
            let mut guards = Vec::new();
            for (i, claim) in claims.iter().enumerate() {
                let o = opts(ttl).permits(*claim);
                let guard = lockers[i % 2].acquire(key, &o).await.unwrap();
                let before = last.insert(name, guard.fence()).unwrap_or(0);
                assert!(
                    guard.fence() > before,
                    "{name}: {claim} granted fence {} after {before}",
                    guard.fence()
                );
                guards.push(guard);
            }
            for guard in guards {
                guard.release().await.unwrap();
            }
        }
    }
}

/// Permits whose holder vanished (never released, never renewed) come back at its TTL.
pub async fn permits_come_back_after_a_holders_ttl(t: &Target) {
    if !keeps_permits(t).await {
        return;
    }
    let key = t.key("permits-ttl");
    let ttl = t.short_ttl();
    let all = Permits::new(2, 2).unwrap();
    // A holder that dies: granted straight on the backend, then forgotten.
    let sent = Instant::now();
    let granted = t
        .backend
        .try_acquire(&key, Owner::random(), all, t.ttl(ttl))
        .await
        .unwrap();
    assert!(matches!(granted, Attempt::Granted { .. }), "{granted:?}");
    let o = opts(ttl)
        .permits(Permits::new(1, 2).unwrap())
        .wait_for(ttl * 4 + slack(t) * 4);
    let guard = t.locker().acquire(&key, &o).await.unwrap();
    let waited = sent.elapsed();
    assert!(
        waited + slack(t) >= ttl,
        "granted after {waited:?}, before the dead holder's TTL of {ttl:?}"
    );
    guard.release().await.unwrap();
}

/// A waiter for permits wakes on a release notice, not at the holders' expiry: with a long
/// TTL held, it is granted soon after one holder releases.
pub async fn a_permit_waiter_wakes_on_release(t: &Target) {
    if !keeps_permits(t).await {
        return;
    }
    let (a, b) = (t.locker(), t.locker());
    let key = t.key("permits-wake");
    let ttl = Duration::from_secs(20);
    let two = Permits::new(1, 2).unwrap();
    let g1 = a.acquire(&key, &opts(ttl).permits(two)).await.unwrap();
    let g2 = a.acquire(&key, &opts(ttl).permits(two)).await.unwrap();
    let waiter = {
        let key = key.clone();
        tokio::spawn(async move {
            let o = opts(ttl).permits(two).wait_for(Duration::from_secs(15));
            let got = b.acquire(&key, &o).await;
            (got, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    g1.release().await.unwrap();
    let (got, at) = waiter.await.unwrap();
    let got = got.expect("granted after a release");
    let after = at.saturating_duration_since(released);
    assert!(
        after < Duration::from_secs(2) + slack(t),
        "woken {after:?} after the release (the holders had {ttl:?} left)"
    );
    got.release().await.unwrap();
    g2.release().await.unwrap();
}

/// How long a grant that is due may take in
/// [`a_permit_waiter_behind_its_siblings_spends_no_refused_attempt`]: a liveness bound,
/// far below the permits' TTL, above a loaded server's round trips.
const GRANT_BOUND: Duration = Duration::from_secs(10);

/// A Locker's waiter for permits that its own guards hold between them waits for one of
/// them to end without an attempt the server is certain to refuse, and is granted when one
/// of them releases (whichever it is), without a refused attempt either.
pub async fn a_permit_waiter_behind_its_siblings_spends_no_refused_attempt(t: &Target) {
    if !keeps_permits(t).await {
        return;
    }
    let counting = Arc::new(super::safety::Counting {
        inner: t.backend.clone(),
        extends: Default::default(),
        refused: Default::default(),
    });
    let (locker, other) = (Locker::with_backend(counting.clone()), t.locker());
    let key = t.key("permits-siblings");
    let ttl = t.ttl(Duration::from_secs(20)).get();
    let two = Permits::new(1, 2).unwrap();
    let wait = opts(ttl)
        .permits(two)
        .wait_for(Duration::from_secs(20))
        .watchdog(false);
    for round in 0..3 {
        // Both permits held by another Locker, so that both siblings win theirs through the
        // queue, one after the other.
        let mut blockers = Vec::new();
        for _ in 0..2 {
            blockers.push(other.acquire(&key, &opts(ttl).permits(two)).await.unwrap());
        }
        let first = spawn_acquire(&locker, &key, &wait);
        tokio::time::sleep(slack(t)).await;
        let second = spawn_acquire(&locker, &key, &wait);
        tokio::time::sleep(slack(t)).await;
        let mut siblings = Vec::new();
        for (blocker, sibling) in blockers.into_iter().zip([first, second]) {
            blocker.release().await.unwrap();
            let sibling = tokio::time::timeout(GRANT_BOUND, sibling)
                .await
                .unwrap_or_else(|_| panic!("round {round}: a sibling is granted"))
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            siblings.push(sibling);
        }
        // The notices of the releases above may still be on their way (PostgreSQL's come
        // through its LISTEN connection, late under load): one reaching the waiter spawned
        // below would make it ask the server once, as a notice should. Let them land first:
        // the rule is about what the siblings' holding costs, not about stale notices.
        tokio::time::sleep(slack(t)).await;
        let before = counting.refused.load(Ordering::SeqCst);
        let third = spawn_acquire(&locker, &key, &wait);
        tokio::time::sleep(slack(t)).await;
        assert!(
            !third.is_finished(),
            "round {round}: granted beyond 2 permits"
        );
        assert_eq!(
            counting.refused.load(Ordering::SeqCst),
            before,
            "round {round}: an attempt refused while the Locker's own guards held both permits"
        );
        // The sibling that won its permit first: not the one the queue saw last.
        siblings.remove(0).release().await.unwrap();
        // Liveness only: how soon a release wakes a permit waiter is the rule
        // `a_permit_waiter_wakes_on_release`'s; here a loaded etcd's two transactions may
        // take longer than any bound tight enough to tell a wake-up from a backoff tick.
        let third = tokio::time::timeout(GRANT_BOUND, third)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the waiter is granted after a release"))
            .unwrap()
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(
            counting.refused.load(Ordering::SeqCst),
            before,
            "round {round}: an attempt refused between a sibling's release and the grant"
        );
        third.release().await.unwrap();
        siblings.remove(0).release().await.unwrap();
    }
    locker.settle().await;
    let stats = locker.stats();
    assert_eq!((stats.held, stats.queued_keys), (0, 0), "{stats:?}");
}

/// Within a Locker, waiters are served in order whatever they claim: a reader arriving
/// after a waiting writer is not let in beside the readers holding the key, but queues
/// behind the writer (so a stream of readers cannot starve a writer).
pub async fn reader_writer_waiters_are_served_in_order(t: &Target) {
    if !keeps_permits(t).await {
        return;
    }
    let locker = t.locker();
    let key = t.key("rw-order");
    let ttl = Duration::from_secs(10);
    let wait = |p: Permits| opts(ttl).permits(p).wait_for(Duration::from_secs(20));
    // The writer's wait is seen through the Locker's observer: it is queued by then.
    let waiting = Arc::new(AtomicU32::new(0));
    let seen = waiting.clone();
    assert!(locker.observe(move |event: &lock_core::Event<'_>| {
        if matches!(event, lock_core::Event::Waiting { .. }) {
            seen.fetch_add(1, Ordering::SeqCst);
        }
    }));
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let spawn = |name: &'static str, p: Permits| {
        let (locker, key, order) = (locker.clone(), key.clone(), order.clone());
        let o = wait(p);
        tokio::spawn(async move {
            let guard = locker.acquire(&key, &o).await.expect(name);
            order.lock().unwrap().push(name);
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.release().await.expect(name);
        })
    };
    let first = locker.acquire(&key, &wait(Permits::read())).await.unwrap();
    let writer = spawn("writer", Permits::write());
    let limit = Instant::now() + Duration::from_secs(20);
    while waiting.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < limit, "the writer never waited");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let reader = spawn("late reader", Permits::read());
    // However long the late reader takes to get going, it is never let in beside the
    // first reader while the writer waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        order.lock().unwrap().is_empty(),
        "nobody passes the waiting writer while the first reader holds: {:?}",
        order.lock().unwrap()
    );
    first.release().await.unwrap();
    for task in [writer, reader] {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["writer", "late reader"]);
    locker.settle().await;
    assert_eq!(locker.stats().queued_keys, 0, "{:?}", locker.stats());
}
