//! The whole conformance suite against the memory backend: directly, through
//! `Arc<dyn Backend>`, through `Box<dyn Backend>`, and through `distlock::connect`.

use std::sync::Arc;

use distlock::conformance::{run_all, run_safety, Target};
use distlock::{Backend, Locker, MemoryBackend};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_direct() {
    run_all(&Target::new(Arc::new(MemoryBackend::new()))).await;
}

/// The safety rules (hand-over, serialized operations, queue entries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safety_rules() {
    run_safety(&Target::new(Arc::new(MemoryBackend::new()))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_arc_dyn() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    // Wrapped once more: the blanket `impl Backend for Arc<B>` forwards every call.
    run_all(&Target::new(Arc::new(backend))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_box_dyn() {
    let backend: Box<dyn Backend> = Box::new(MemoryBackend::new());
    run_all(&Target::new(Arc::new(backend))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_connect() {
    let locker: Locker = distlock::connect("memory://").await.unwrap();
    assert_eq!(locker.capabilities().name, "memory");
    run_all(&Target::from_locker(&locker)).await;
}

#[tokio::test(flavor = "current_thread")]
async fn conformance_on_a_current_thread_runtime() {
    run_all(&Target::new(Arc::new(MemoryBackend::new()))).await;
}
