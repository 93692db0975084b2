//! Conformance

use super::*;

/// The whole suite on one server, with the backend built by the typed builder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_direct() {
    let server = MariaDbServer::start().await;
    let backend = MysqlBackend::builder(server.addr().to_string())
        .username("root")
        .password(lock_testkit::MARIADB_PASSWORD)
        .database(lock_testkit::MARIADB_DATABASE)
        .table("conformance")
        .build()
        .await
        .unwrap();
    assert_eq!(backend.capabilities().name, "mysql");
    assert!(backend.capabilities().monotonic_fencing);
    common::conformance_direct(backend).await;
}

/// The whole suite through `distlock::connect("mariadb://…")` and `Arc<dyn Backend>`, and
/// the safety rules (hand-over, serialized operations, queue entries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_connect() {
    let server = MariaDbServer::start().await;
    let url = mysql_url(server.addr(), "table=connected").replacen("mysql://", "mariadb://", 1);
    common::conformance_through_connect(&url, |caps| {
        assert_eq!(caps.name, "mysql");
        assert!(caps.monotonic_fencing && !caps.release_notices && caps.cross_process);
    })
    .await;
    let locker = distlock::connect(&url).await.unwrap();
    lock_conformance::run_safety(&Target::from_locker(&locker)).await;
}
