//! The randomized exclusion checker on the memory backend: Lockers over one shared
//! in-process backend (it has no server for separate instances to share), no faults.
//! `DISTLOCK_SOAK_SECS` runs it longer, `DISTLOCK_CHECK_SEED` replays a seed.

use std::sync::Arc;

use distlock::conformance::exclusion::{Exclusion, ExclusionConfig};
use distlock::{Backend, Locker, MemoryBackend};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_memory() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let lockers: Vec<Locker> = (0..3)
        .map(|_| Locker::with_backend(backend.clone()))
        .collect();
    let report = Exclusion::new(lockers)
        .config(ExclusionConfig::from_env())
        .run()
        .await;
    report.assert_clean();
}
