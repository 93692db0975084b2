//! Conformance

use super::*;

/// The whole suite on one etcd member, with the backend built by the typed builder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_one_member() {
    let server = EtcdServer::start().await;
    let backend = EtcdBackend::builder([server.endpoint()])
        .prefix("conformance/")
        .build()
        .await
        .unwrap();
    assert_eq!(backend.capabilities().name, "etcd");
    common::conformance_direct(backend).await;
}

/// The whole suite through `distlock::connect("etcd://…")`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_connect() {
    let server = EtcdServer::start().await;
    let url = etcd_url(&[server.endpoint()], "");
    common::conformance_through_connect(&url, |caps| assert_eq!(caps.name, "etcd")).await;
}

/// The safety rules (hand-over, serialized operations, queue entries) on a 3-member
/// cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safety_rules() {
    let cluster = EtcdCluster::start(3).await;
    let locker = distlock::connect(&etcd_url(&cluster.endpoints(), "prefix=safety/"))
        .await
        .unwrap();
    lock_conformance::run_safety(&Target::from_locker(&locker)).await;
}

/// The whole suite on a 3-member cluster, every endpoint in the URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_a_three_member_cluster() {
    let cluster = EtcdCluster::start(3).await;
    let locker = distlock::connect(&etcd_url(&cluster.endpoints(), "prefix=cluster/"))
        .await
        .unwrap();
    run_all(&Target::from_locker(&locker)).await;
}
