//! The whole conformance suite against the memory backend: directly, through
//! `Arc<dyn Backend>`, through `Box<dyn Backend>`, and through `distlock::connect`; and the
//! fault rules, which have no server to act on here and must say they did not run.

mod common;

use std::sync::Arc;

use distlock::{Backend, MemoryBackend};
use lock_conformance::{run_all, run_faults, run_safety, Target};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_direct() {
    common::conformance_direct(MemoryBackend::new()).await;
}

/// The safety rules (hand-over, serialized operations, queue entries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safety_rules() {
    run_safety(&Target::new(Arc::new(MemoryBackend::new()))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_arc_dyn() {
    common::conformance_through_arc_dyn(MemoryBackend::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_box_dyn() {
    let backend: Box<dyn Backend> = Box::new(MemoryBackend::new());
    run_all(&Target::new(Arc::new(backend))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_connect() {
    common::conformance_through_connect("memory://", |caps| assert_eq!(caps.name, "memory")).await;
}

#[tokio::test(flavor = "current_thread")]
async fn conformance_on_a_current_thread_runtime() {
    run_all(&Target::new(Arc::new(MemoryBackend::new()))).await;
}

/// Without fault hooks no fault rule runs, and each says so instead of passing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules_without_hooks_report_not_run() {
    let report = run_faults(&Target::new(Arc::new(MemoryBackend::new()))).await;
    assert_eq!(report.not_run().len(), 7, "{report:?}");
    for (rule, why) in report.not_run() {
        assert!(why.contains("no fault hooks"), "{rule}: {why}");
    }
}
