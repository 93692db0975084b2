//! The randomized exclusion checker on the memory backend: Lockers over one shared
//! in-process backend (it has no server for separate instances to share), no faults; in
//! each mode: locks, semaphores (permits), reader-writer keys and elections.
//! `DISTLOCK_SOAK_SECS` runs it longer, `DISTLOCK_CHECK_SEED` replays a seed.

use std::sync::Arc;
use std::time::Duration;

use distlock::{Backend, Locker, MemoryBackend};
use lock_conformance::exclusion::{Exclusion, ExclusionConfig, Grants, SOAK_ENV};

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

/// The checker in its permits mode: semaphores of 3 permits, claims of 1 or 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_memory_permits() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let lockers: Vec<Locker> = (0..3)
        .map(|_| Locker::with_backend(backend.clone()))
        .collect();
    let report = Exclusion::new(lockers)
        .config(short().grants(Grants::Permits(3)))
        .run()
        .await;
    report.assert_clean();
}

/// The checker in its reader-writer mode: readers share a key, writers hold it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_memory_reader_writer() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let lockers: Vec<Locker> = (0..3)
        .map(|_| Locker::with_backend(backend.clone()))
        .collect();
    let report = Exclusion::new(lockers)
        .config(short().grants(Grants::ReaderWriter))
        .run()
        .await;
    report.assert_clean();
}

/// The checker in its election mode: candidates campaign, proclaim, resign and drop;
/// observers check that terms never go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_memory_election() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let lockers: Vec<Locker> = (0..3)
        .map(|_| Locker::with_backend(backend.clone()))
        .collect();
    let report = Exclusion::new(lockers)
        .config(short().grants(Grants::Election))
        .run()
        .await;
    report.assert_clean();
}

/// The configuration from the environment, 12 s long unless [`SOAK_ENV`] says otherwise
/// (the permits and reader-writer modes run beside the locks' run).
fn short() -> ExclusionConfig {
    let config = ExclusionConfig::from_env();
    if std::env::var_os(SOAK_ENV).is_some() {
        config
    } else {
        config.duration(Duration::from_secs(12))
    }
}
