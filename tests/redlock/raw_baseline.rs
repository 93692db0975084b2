//! Raw baseline

use super::*;

/// The raw baseline (SET NX PX, then DEL, on every node) is decided at a majority as the
/// lock's operations are: with one node of three down it still completes, with two down it
/// fails with `QuorumNotReached`; it never touches a held lock, and leaves no raw key on
/// the nodes that answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raw_baseline_needs_a_majority_and_leaves_locks_alone() {
    let mut nodes = RedisNodes::start(3).await;
    let backend = Arc::new(backend(&nodes.addrs(), "").await);
    let locker = Locker::with_backend(backend.clone());
    let raw = backend.baseline().expect("redlock has a raw baseline");
    assert_eq!(raw.description(), distlock::redlock::BASELINE_CYCLE);
    let ttl = valid(&locker, Duration::from_secs(5));
    let guard = locker
        .acquire("raw/held", &skip(Duration::from_secs(10)))
        .await
        .unwrap();
    let raw_key = "distlock:{raw/held}:baseline";
    let held = backend
        .inspect("raw/held")
        .await
        .unwrap()
        .pop()
        .expect("held");
    let mut lock_keys = Vec::new();
    for node in nodes.nodes() {
        lock_keys.push(raw_exists(node, &lock_key("raw/held")).await);
    }
    for _ in 0..5 {
        raw.raw_cycle("raw/held", ttl).await.unwrap();
    }
    let after = backend
        .inspect("raw/held")
        .await
        .unwrap()
        .pop()
        .expect("still held");
    assert_eq!((after.owner, after.fence), (held.owner, held.fence));
    for (node, had_lock) in nodes.nodes().iter().zip(lock_keys) {
        assert_eq!(raw_exists(node, &lock_key("raw/held")).await, had_lock);
        assert!(!raw_exists(node, raw_key).await);
    }

    nodes.node_mut(2).kill();
    raw.raw_cycle("raw/held", ttl).await.unwrap();
    nodes.node_mut(1).kill();
    match raw.raw_cycle("raw/held", ttl).await {
        Err(Error::QuorumNotReached {
            granted, needed, ..
        }) => assert!(granted <= 1 && needed == 2, "{granted} of {needed}"),
        other => panic!("expected QuorumNotReached, got {other:?}"),
    }
    // The write that reached the one live node is deleted even so, in the background.
    let failed = Instant::now();
    while raw_exists(&nodes.nodes()[0], raw_key).await {
        assert!(
            failed.elapsed() < Duration::from_secs(2),
            "raw key left behind"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(guard);
}
