//! Conformance

use super::*;

/// The whole suite on 3 nodes, used directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_three_nodes() {
    let nodes = RedisNodes::start(3).await;
    let b = backend(&nodes.addrs(), "").await;
    assert!(b.capabilities().monotonic_fencing);
    common::conformance_direct(b).await;
}

/// The safety rules (hand-over, serialized operations, queue entries) on 3 nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safety_rules() {
    let nodes = RedisNodes::start(3).await;
    let b = backend(&nodes.addrs(), "").await;
    conformance::run_safety(&Target::new(Arc::new(b))).await;
}

/// The whole suite on 1 node, through the facade's `connect(url)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_one_node_through_connect() {
    let server = RedisServer::start().await;
    let url = format!("redlock://{}?prefix=one%3A", server.addr());
    common::conformance_through_connect(&url, |caps| {
        assert_eq!(caps.name, "redlock");
        assert_eq!(caps.min_ttl, MIN_TTL);
    })
    .await;
}

/// The whole suite on 3 nodes with fencing off (capabilities say the tokens are not
/// monotonic) and locks taken away by a raw `DEL` on every node, behind the backend's back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_without_fencing_and_raw_del_as_revoke() {
    let nodes = Arc::new(RedisNodes::start(3).await);
    let b = backend(&nodes.addrs(), "fencing=false").await;
    assert!(!b.capabilities().monotonic_fencing);
    let raw = nodes.clone();
    let target = Target::new(Arc::new(b)).with_revoke(move |key| {
        let raw = raw.clone();
        async move {
            for server in raw.nodes() {
                raw_del(server, &lock_key(&key)).await;
            }
        }
    });
    run_all(&target).await;
}

/// The whole suite on 3 nodes on a current-thread runtime (subscriptions, background
/// releases and the Locker share one thread).
#[tokio::test(flavor = "current_thread")]
async fn conformance_on_a_current_thread_runtime() {
    let nodes = RedisNodes::start(3).await;
    run_all(&Target::new(Arc::new(backend(&nodes.addrs(), "").await))).await;
}
