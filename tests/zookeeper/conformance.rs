//! Conformance

use super::*;

/// The whole suite on the shared ensemble, with the backend built by the typed builder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_direct() {
    let backend = ZooKeeperBackend::builder(ensemble().hosts())
        .root(root("conformance"))
        .build()
        .await
        .unwrap();
    let caps = backend.capabilities().clone();
    assert_eq!(caps.name, "zookeeper");
    assert!(caps.monotonic_fencing && caps.release_notices && caps.cross_process);
    assert!(
        !caps.session_bound,
        "validity is bounded by the session timeout"
    );
    assert_eq!(
        caps.max_ttl,
        Duration::from_secs(30),
        "the granted session timeout"
    );
    common::conformance_direct(backend).await;
}

/// The whole suite through `distlock::connect("zookeeper://…")` and `Arc<dyn Backend>`,
/// and the safety rules (hand-over, serialized operations, queue entries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_connect() {
    let url = url("connected", "timeout=1s");
    common::conformance_through_connect(&url, |caps| {
        assert_eq!(caps.name, "zookeeper");
        assert!(caps.monotonic_fencing && caps.release_notices && caps.cross_process);
    })
    .await;
    let locker = distlock::connect(&url).await.unwrap();
    lock_conformance::run_safety(&Target::from_locker(&locker)).await;
}
