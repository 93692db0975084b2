//! Grants: fences, waiters in other processes woken by the watch on their predecessor,
//! cancelled waits and abandoned creates leaving no node, and elections.

use super::*;

fn wait(ttl: Duration) -> LockOptions {
    LockOptions::new()
        .ttl(ttl)
        .wait_for(Duration::from_secs(10))
}

/// Two "processes" (two backends, two sessions) taking turns on a key: every grant's fence
/// (its node's czxid) is greater than the one before, and each waiter is woken by the
/// release (a watch on the node before its own), well before its backoff would retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_and_waiters_wake_on_the_release() {
    let url = url("turns", "");
    let (a, b) = (
        Locker::new(backend(&url).await),
        Locker::new(backend(&url).await),
    );
    let k = key("turns");
    let ttl = Duration::from_secs(5);
    let mut last = 0;
    let mut holder = a.acquire(&k, &wait(ttl)).await.unwrap();
    for round in 0..6 {
        let next = if round % 2 == 0 { &b } else { &a };
        let waiter = lock_conformance::spawn_acquire(next, &k, &wait(ttl));
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!waiter.is_finished(), "round {round}: granted while held");
        assert!(holder.fence() > last, "round {round}: fence went back");
        last = holder.fence();
        let released = Instant::now();
        holder.release().await.unwrap();
        holder = waiter.await.unwrap().unwrap();
        let woke = released.elapsed();
        assert!(
            woke < Duration::from_millis(500),
            "round {round}: the waiter took {woke:?} after the release"
        );
    }
    assert!(holder.fence() > last);
    holder.release().await.unwrap();
}

/// Waiters in three other "processes" (backends with sessions of their own) keep their
/// places in the key's line while they wait (a node each) and are granted in the order
/// they arrived, each woken by the release of the one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_in_other_processes_are_granted_in_arrival_order() {
    let url = url("line", "");
    let probe = backend(&url).await;
    let holder_side = Locker::new(backend(&url).await);
    let mut waiters = Vec::new();
    for _ in 0..3 {
        waiters.push(Locker::new(backend(&url).await));
    }
    let k = key("line");
    let ttl = Duration::from_secs(5);
    let held = holder_side.acquire(&k, &wait(ttl)).await.unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, locker) in waiters.iter().enumerate() {
        let (locker, key, order) = (locker.clone(), k.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let guard = locker.acquire(&key, &wait(ttl)).await.unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.release().await.unwrap();
        }));
        // Each waiter's first attempt is in line before the next one arrives.
        let deadline = Instant::now() + Duration::from_secs(5);
        while probe.lock_nodes(&k).await.unwrap().len() < i + 2 {
            assert!(Instant::now() < deadline, "waiter {i} has no place in line");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // Past several of the Locker's backoff retries: the places are kept, not retaken.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        probe.lock_nodes(&k).await.unwrap().len(),
        4,
        "a node per waiter"
    );
    held.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        vec![0, 1, 2],
        "granted in arrival order"
    );
    assert!(probe.lock_nodes(&k).await.unwrap().is_empty());
}

/// A wait given up (its future dropped, or its deadline passed) leaves no lock node: only
/// the holder's node is in the key's line, and none once the holder released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_leaves_no_node() {
    let url = url("cancel", "");
    let probe = backend(&url).await;
    let (a, b) = (
        Locker::new(backend(&url).await),
        Locker::new(backend(&url).await),
    );
    let k = key("cancel");
    let held = a.acquire(&k, &wait(Duration::from_secs(5))).await.unwrap();
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        b.acquire(&k, &wait(Duration::from_secs(5))),
    )
    .await;
    assert!(dropped.is_err(), "the wait was cut short");
    let deadline = b
        .acquire(
            &k,
            &LockOptions::new()
                .ttl(Duration::from_secs(5))
                .wait_for(Duration::from_millis(300)),
        )
        .await;
    assert!(
        matches!(deadline, Err(Error::Timeout { .. })),
        "{deadline:?}"
    );
    b.settle().await;
    let nodes = probe.lock_nodes(&k).await.unwrap();
    assert_eq!(nodes.len(), 1, "only the holder's node: {nodes:?}");
    assert!(nodes[0].starts_with(&held.lease().owner().to_string()));
    held.release().await.unwrap();
    assert!(probe.lock_nodes(&k).await.unwrap().is_empty());
}

/// A create whose caller gave up before the answer came (the request is on its way) is
/// found by the owner token in its node's name and deleted by `abandon`; the key is free
/// for another session afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandon_removes_a_lost_create() {
    let url = url("abandon", "");
    let (backend_a, other) = (backend(&url).await, backend(&url).await);
    let k = key("abandon");
    let owner = Owner::random();
    let ttl = backend_a
        .capabilities()
        .effective_ttl(Duration::from_secs(5))
        .unwrap();
    // The key's node exists (a first attempt makes it): the create is the one request.
    let first = Owner::random();
    backend_a
        .try_acquire(&k, first, distlock::Permits::LOCK, ttl)
        .await
        .unwrap();
    backend_a.abandon(&k, first).await.unwrap();
    // Polled once: the create is sent, its answer never awaited.
    let attempt = backend_a.try_acquire(&k, owner, distlock::Permits::LOCK, ttl);
    let gave_up = futures::FutureExt::now_or_never(attempt);
    assert!(
        gave_up.is_none(),
        "the attempt was given up before its answer"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let nodes = loop {
        let nodes = other.lock_nodes(&k).await.unwrap();
        if !nodes.is_empty() || Instant::now() > deadline {
            break nodes;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(nodes.len(), 1, "the lost create made a node: {nodes:?}");
    assert!(nodes[0].starts_with(&owner.to_string()), "{nodes:?}");
    let ttl_other = other
        .capabilities()
        .effective_ttl(Duration::from_secs(5))
        .unwrap();
    let refused = Owner::random();
    assert!(matches!(
        other
            .try_acquire(&k, refused, distlock::Permits::LOCK, ttl_other)
            .await
            .unwrap(),
        Attempt::Taken { .. }
    ));
    // A refused attempt keeps its place in line until its owner tries again or abandons.
    assert_eq!(other.lock_nodes(&k).await.unwrap().len(), 2);
    other.abandon(&k, refused).await.unwrap();
    backend_a.abandon(&k, owner).await.unwrap();
    assert!(other.lock_nodes(&k).await.unwrap().is_empty());
    let next = Owner::random();
    let granted = other
        .try_acquire(&k, next, distlock::Permits::LOCK, ttl_other)
        .await
        .unwrap();
    assert!(matches!(granted, Attempt::Granted { .. }), "{granted:?}");
    assert_eq!(backend_a.held_grants(), 0);
}

/// Leader election on ZooKeeper: a leader's value is its node's data, its term the node's
/// czxid; another process's observer sees the leader, its new value, and its successor
/// after a resignation, with terms that increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_elects_one_leader_and_observers_follow_it() {
    let url = url("election", "");
    let (a, b, watcher) = (
        Locker::new(backend(&url).await),
        Locker::new(backend(&url).await),
        Locker::new(backend(&url).await),
    );
    let name = key("leader");
    let ttl = Duration::from_secs(5);
    let mut observe = watcher.election(&name).unwrap().observe();
    let mut first = a
        .election(&name)
        .unwrap()
        .campaign("a", &wait(ttl))
        .await
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Some(leader) = observe.changed().await.unwrap() {
                return leader;
            }
        }
    })
    .await
    .expect("the observer sees the first leader");
    assert_eq!(
        (seen.value.as_slice(), seen.term),
        (&b"a"[..], first.term())
    );
    let contender = {
        let b = b.clone();
        let name = name.clone();
        tokio::spawn(async move { b.election(&name).unwrap().campaign("b", &wait(ttl)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!contender.is_finished(), "one leader at a time");
    first.proclaim("a2").await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(5), observe.changed())
        .await
        .expect("the observer sees the new value")
        .unwrap()
        .expect("a leads");
    assert_eq!(seen.value, b"a2".to_vec());
    let first_term = first.term();
    first.resign().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), contender)
        .await
        .expect("the contender wins after the resignation")
        .unwrap()
        .unwrap();
    assert!(second.term() > first_term);
    let seen = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Some(leader) = observe.changed().await.unwrap() {
                if leader.term == second.term() {
                    return leader;
                }
            }
        }
    })
    .await
    .expect("the observer sees the successor");
    assert_eq!(seen.value, b"b".to_vec());
    second.resign().await.unwrap();
}
