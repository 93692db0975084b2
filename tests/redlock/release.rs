//! Release notices, inspect, force_release

use super::*;

/// A release through one backend (process) wakes a waiter on another through the nodes'
/// release channels, long before the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notice_reaches_another_process() {
    let nodes = RedisNodes::start(3).await;
    let a = Target::new(Arc::new(backend(&nodes.addrs(), "").await));
    let b = Target::new(Arc::new(backend(&nodes.addrs(), "").await));
    conformance::release_wakes_a_waiter_on_another_instance(&a, &b).await;
}

/// `inspect` reports the majority's holder (owner, fence, time left), also with a node
/// down; `force_release` deletes everywhere; with a majority down both are QuorumNotReached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_force_release_over_the_quorum() {
    let mut nodes = RedisNodes::start(3).await;
    let locker = Locker::new(backend(&nodes.addrs(), "").await);
    let backend = locker.backend().clone();
    let b = backend.admin().expect("admin");
    assert_eq!(b.inspect("admin/x").await.unwrap(), vec![]);
    let guard = locker
        .acquire("admin/x", &skip(Duration::from_secs(10)))
        .await
        .unwrap();
    let holder = b.inspect("admin/x").await.unwrap().pop().expect("held");
    assert_eq!(holder.owner, Some(guard.lease().owner()));
    assert_eq!(holder.fence, Some(guard.fence()));
    let left = holder.expires_in.expect("the lock has a TTL");
    assert!(left <= Duration::from_secs(10) && left > Duration::from_secs(9));
    // A foreign leftover on one node of three that all answer is not a holder.
    preset_foreign(&nodes.nodes()[1], "admin/leftover", 10_000).await;
    assert_eq!(b.inspect("admin/leftover").await.unwrap(), vec![]);
    nodes.node_mut(0).kill();
    let holder = b
        .inspect("admin/x")
        .await
        .unwrap()
        .pop()
        .expect("still held");
    assert_eq!(holder.owner, Some(guard.lease().owner()));
    // Two answers may not pin the token down (one may be a late grant): known or unknown,
    // never wrong.
    assert!(
        holder.fence.is_none_or(|f| f == guard.fence()),
        "{holder:?} for fence {}",
        guard.fence()
    );
    // With a node down, the leftover may be on a majority: reported.
    let leftover = b
        .inspect("admin/leftover")
        .await
        .unwrap()
        .pop()
        .expect("may be held");
    assert_eq!(leftover.owner, None, "not an owner token of this protocol");

    assert!(b.force_release("admin/x").await.unwrap());
    assert!(!raw_exists(&nodes.nodes()[1], &lock_key("admin/x")).await);
    assert!(!raw_exists(&nodes.nodes()[2], &lock_key("admin/x")).await);
    let released = guard.release().await;
    assert!(
        matches!(released, Err(Error::NotHeld { .. })),
        "{released:?}"
    );
    assert!(!b.force_release("admin/x").await.unwrap());

    nodes.node_mut(1).kill();
    assert!(matches!(
        b.inspect("admin/x").await,
        Err(Error::QuorumNotReached { needed: 2, .. })
    ));
    assert!(matches!(
        b.force_release("admin/x").await,
        Err(Error::QuorumNotReached { needed: 2, .. })
    ));
}
