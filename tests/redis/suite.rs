//! The conformance suite in its forms, and release notices between processes.

use super::*;

/// The whole suite on a backend used directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_direct() {
    let server = RedisServer::start().await;
    common::conformance_direct(backend(&server.url()).await).await;
}

/// The safety rules (hand-over, serialized operations, queue entries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safety_rules() {
    let server = RedisServer::start().await;
    conformance::run_safety(&Target::new(Arc::new(backend(&server.url()).await))).await;
}

/// The whole suite through `Arc<dyn Backend>` (the blanket impl forwards every call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_arc_dyn() {
    let server = RedisServer::start().await;
    common::conformance_through_arc_dyn(backend(&server.url()).await).await;
}

/// The whole suite through the facade's `connect(url)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_connect() {
    let server = RedisServer::start().await;
    let url = format!("{}?prefix=conformance%3A&timeout=2s", server.url());
    common::conformance_through_connect(&url, |caps| assert_eq!(caps, &CAPABILITIES)).await;
}

/// The whole suite with locks taken away by a raw `DEL` of the lock key on the server (no
/// release notice, nothing the backend knows about): only the server state matters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_with_raw_del_as_revoke() {
    let server = RedisServer::start().await;
    let backend = Arc::new(backend(&server.url()).await);
    let node = backend.node().clone();
    let raw = server.client().await;
    let target = Target::new(backend).with_revoke(move |key| {
        let mut raw = raw.clone();
        let lock_key = node.lock_key(&key);
        async move {
            let deleted: i64 = redis::cmd("DEL")
                .arg(&lock_key)
                .query_async(&mut raw)
                .await
                .expect("raw DEL");
            assert_eq!(deleted, 1, "the lock of {key} lives at {lock_key}");
        }
    });
    run_all(&target).await;
}

/// The whole suite on a current-thread runtime (the subscription task shares the thread).
#[tokio::test(flavor = "current_thread")]
async fn conformance_on_a_current_thread_runtime() {
    let server = RedisServer::start().await;
    run_all(&Target::new(Arc::new(backend(&server.url()).await))).await;
}

/// A release in one process (backend) hands the lock to a waiter in another through the
/// pub/sub notice, long before the holder's TTL would have woken it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notice_reaches_another_process() {
    let server = RedisServer::start().await;
    let a = Target::new(Arc::new(backend(&server.url()).await));
    let b = Target::new(Arc::new(backend(&server.url()).await));
    conformance::release_wakes_a_waiter_on_another_instance(&a, &b).await;
}

/// A release is announced only when someone waited for it: an uncontended cycle publishes
/// nothing (so it wakes no subscriber anywhere), while a waiter of another process, whose
/// refusal marked the lock awaited, is woken by the notice long before the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_awaited_release_is_announced() {
    let server = RedisServer::start().await;
    let a = Arc::new(backend(&server.url()).await);
    let (mine, other) = (
        Locker::with_backend(a.clone()),
        Locker::new(backend(&server.url()).await),
    );
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_for(Duration::from_secs(20));
    let before = calls(&server, "publish").await;
    for _ in 0..10 {
        mine.acquire("quiet", &opts)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    assert_eq!(calls(&server, "publish").await, before, "nobody waited");

    let holder = mine.acquire("awaited", &opts).await.unwrap();
    let waiter = conformance::spawn_acquire(&other, "awaited", &opts);
    let key = a.node().lock_key("awaited");
    let marked = format!("{}*", holder.lease().owner());
    let until = Instant::now() + Duration::from_secs(5);
    while raw_string(&server, &key).await.as_deref() != Some(marked.as_str()) {
        assert!(Instant::now() < until, "the refusal marks the lock awaited");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen = a.inspect("awaited").await.unwrap().pop().expect("held");
    assert_eq!(
        seen.owner,
        Some(holder.lease().owner()),
        "inspect hides the mark"
    );
    holder
        .extend(Duration::from_secs(10))
        .await
        .expect("a marked lock is still ours");
    let released = Instant::now();
    holder.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("woken by the notice, long before the 10 s TTL")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(3));
    assert_eq!(calls(&server, "publish").await, before + 1, "one notice");
    next.release().await.unwrap();
}

/// Two backends built over ONE node (a shared connection, e.g. an application handing the
/// same `RedisNode` to two Lockers) hear each other's releases: a waiter on one is woken by
/// the other's release at once, not at the holder's 30 s TTL. (They shared the node's
/// notice origin, so each one's subscription skipped the other's notices as its own.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_sharing_a_node_hear_each_others_releases() {
    let server = RedisServer::start().await;
    let shared = node(&server, "shared:").await;
    let a = Arc::new(RedisBackend::from_node(shared.clone()));
    let b = RedisBackend::from_node(shared);
    let (holder_side, waiter_side) = (Locker::with_backend(a.clone()), Locker::new(b));
    let ttl = Duration::from_secs(30);
    let opts = LockOptions::new()
        .ttl(ttl)
        .wait_for(Duration::from_secs(25))
        .watchdog(false);
    for round in 0..3 {
        let holder = holder_side.acquire("k", &opts).await.unwrap();
        let waiter = conformance::spawn_acquire(&waiter_side, "k", &opts);
        // The waiter's refusal marks the lock awaited: from then on the release publishes.
        let key = a.node().lock_key("k");
        let marked = format!("{}*", holder.lease().owner());
        let until = Instant::now() + Duration::from_secs(10);
        while raw_string(&server, &key).await.as_deref() != Some(marked.as_str()) {
            assert!(Instant::now() < until, "the refusal marks the lock awaited");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        holder.release().await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap_or_else(|_| {
                panic!("round {round}: the waiter was not woken by the release (TTL {ttl:?})")
            })
            .unwrap()
            .unwrap();
        next.release().await.unwrap();
    }
}
