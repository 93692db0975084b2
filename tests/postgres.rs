//! The PostgreSQL backend against real `postgres` processes (lock-testkit): the whole
//! conformance suite (directly, through `Arc<dyn Backend>` and through
//! `distlock::connect`), the shared fault rules behind a fault proxy, fencing across a
//! restart and a `kill -9`, database time against a skewed client, and bad input.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{postgres_backend as backend, postgres_url, rand_u32, Proxied};
use distlock::conformance::{run_faults, Faults, Target};
use distlock::postgres::PostgresBackend;
use distlock::{Admin, Attempt, Backend, Error, LockOptions, LockUrl, Locker, Owner};
use lock_testkit::PostgresServer;

fn key(name: &str) -> String {
    format!("{name}-{:08x}", rand_u32())
}

// ---------------------------------------------------------------------------------------
// Conformance
// ---------------------------------------------------------------------------------------

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
