//! Waiters in another process woken by the release's NOTIFY.

use super::*;

/// A waiter in another process is woken by the release's NOTIFY, not by polling: it gets
/// a lock, and a semaphore's permit where the backend keeps them, well before the
/// holder's TTL would have passed (the shared rule).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_another_process_is_woken_by_notify() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=notify");
    let a = Target::new(Arc::new(backend(&url).await));
    let b = Target::new(Arc::new(backend(&url).await));
    lock_conformance::release_wakes_a_waiter_on_another_instance(&a, &b).await;
}
