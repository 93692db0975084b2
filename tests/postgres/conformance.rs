//! Conformance

use super::*;

/// The whole suite on one server, with the backend built by the typed builder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_direct() {
    let server = PostgresServer::start().await;
    let backend = PostgresBackend::builder(server.addr().to_string())
        .username("postgres")
        .password(lock_testkit::POSTGRES_PASSWORD)
        .database("postgres")
        .table("conformance")
        .build()
        .await
        .unwrap();
    assert_eq!(backend.capabilities().name, "postgres");
    assert!(backend.capabilities().monotonic_fencing);
    common::conformance_direct(backend).await;
}

/// The whole suite through `Arc<dyn Backend>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_arc_dyn() {
    let server = PostgresServer::start().await;
    let backend = backend(&postgres_url(server.addr(), "table=arc_dyn")).await;
    common::conformance_through_arc_dyn(backend).await;
}

/// The whole suite through `distlock::connect("postgresql://…")`, in a schema of its own
/// that the backend creates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_connect() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "schema=locks&table=connected").replacen(
        "postgres://",
        "postgresql://",
        1,
    );
    common::conformance_through_connect(&url, |caps| {
        assert_eq!(caps.name, "postgres");
        assert!(caps.monotonic_fencing && caps.release_notices && caps.cross_process);
    })
    .await;
    let raw = server.client().await;
    let row = raw
        .query_one("SELECT to_regclass('locks.connected') IS NOT NULL", &[])
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0), "the table was made in its schema");
}

/// The safety rules (hand-over, serialized operations, queue entries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safety_rules() {
    let server = PostgresServer::start().await;
    let locker = distlock::connect(&postgres_url(server.addr(), "table=safety"))
        .await
        .unwrap();
    lock_conformance::run_safety(&Target::from_locker(&locker)).await;
}
