//! The file backend (`file://DIR`): the conformance suite directly, through
//! `distlock::connect` and its safety rules, each over a directory of its own; a holder
//! process killed with SIGKILL frees its locks at once and fences go on after it; the
//! fault rules, which have no server to act on, say they did not run.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::file_child;
use distlock::file::FileBackend;
use distlock::{LockOptions, Locker};
use lock_conformance::{run_all, run_faults, run_safety, Target};

fn backend(dir: &tempfile::TempDir) -> FileBackend {
    FileBackend::builder(dir.path()).sync(false).open().unwrap()
}

/// The child's entry point (a holder in another process); nothing in a normal run.
#[tokio::test(flavor = "current_thread")]
async fn child_process() {
    file_child::child_main().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_direct() {
    let dir = tempfile::tempdir().unwrap();
    run_all(&Target::new(Arc::new(
        FileBackend::open(dir.path()).unwrap(),
    )))
    .await;
}

/// The safety rules (hand-over, serialized operations, queue entries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safety_rules() {
    let dir = tempfile::tempdir().unwrap();
    run_safety(&Target::new(Arc::new(backend(&dir)))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_connect() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("{}?sync=false", FileBackend::url_of(dir.path()).unwrap());
    common::conformance_through_connect(&url, |caps| {
        assert_eq!(caps.name, "file");
        assert!(caps.session_bound && caps.cross_process && caps.monotonic_fencing);
    })
    .await;
}

/// Without fault hooks no fault rule runs, and each says so instead of passing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules_without_hooks_report_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let report = run_faults(&Target::new(Arc::new(backend(&dir)))).await;
    assert_eq!(report.not_run().len(), 7, "{report:?}");
}

/// A holder process killed with SIGKILL leaves its lock free at once: a waiter here gets
/// it within moments of the kill (woken by its watcher, not by a TTL), with a fence
/// greater than the killed holder's; a new backend over the directory (a restart) goes on
/// from the fence in the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_frees_its_lock_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let keys = vec!["jobs/nightly".to_owned(), "ключ with spaces".to_owned()];
    let locker = Locker::new(FileBackend::open(dir.path()).unwrap());
    // Fences before the child: 1.
    for key in &keys {
        locker.lock(key).await.unwrap().release().await.unwrap();
    }
    let (mut child, held) = file_child::spawn("child_process", "hold", dir.path(), &keys).await;
    assert_eq!(held.len(), 2, "{held:?}");
    for (key, fence) in &held {
        assert!(*fence > 1, "{key}: the child's fence {fence} follows ours");
        assert!(
            locker.try_acquire(key).await.unwrap().is_none(),
            "{key} held by the child"
        );
        let holder = locker
            .backend()
            .admin()
            .unwrap()
            .inspect(key)
            .await
            .unwrap();
        assert_eq!(holder[0].fence, Some(*fence));
    }
    let waiters: Vec<_> = held
        .iter()
        .map(|(key, _)| {
            let (locker, key) = (locker.clone(), key.clone());
            tokio::spawn(async move {
                let opts = LockOptions::new().wait_for(Duration::from_secs(10));
                let guard = locker.acquire(&key, &opts).await.unwrap();
                (Instant::now(), guard)
            })
        })
        .collect();
    // Long enough for the waiters' backoff to pass its 500 ms cap.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let killed = Instant::now();
    file_child::kill9(&mut child).await;
    for ((key, fence), waiter) in held.iter().zip(waiters) {
        let (granted, guard) = waiter.await.unwrap();
        let after = granted.saturating_duration_since(killed);
        assert!(
            after < Duration::from_millis(200),
            "{key}: granted {after:?} after the kill"
        );
        assert!(
            guard.fence() > *fence,
            "{key}: {} after {fence}",
            guard.fence()
        );
        guard.release().await.unwrap();
    }
    drop(locker);
    let restarted = Locker::new(FileBackend::open(dir.path()).unwrap());
    for (key, fence) in &held {
        let guard = restarted.lock(key).await.unwrap();
        assert_eq!(
            guard.fence(),
            fence + 2,
            "{key}: fences go on from the file"
        );
        guard.release().await.unwrap();
    }
}

/// A process that exits normally while holding releases too (the kernel closes its
/// files); the key is free the moment the exit is reaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exiting_holder_frees_its_lock() {
    let dir = tempfile::tempdir().unwrap();
    let keys = vec!["exit".to_owned()];
    let (mut child, held) = file_child::spawn("child_process", "hold", dir.path(), &keys).await;
    assert_eq!(held[0].1, 1);
    drop(child.stdin.take());
    child.wait().await.unwrap();
    let backend = backend(&dir);
    let guard = Locker::new(backend)
        .try_acquire("exit")
        .await
        .unwrap()
        .expect("free");
    assert_eq!(guard.fence(), 2);
}

/// A guard dropped outside any runtime still releases its file lock at once (a
/// session-bound grant has no TTL that would end it otherwise).
#[test]
fn a_guard_dropped_outside_a_runtime_releases() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(backend(&dir));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = rt.block_on(locker.lock("k")).unwrap();
    drop(rt);
    drop(guard);
    let other = FileBackend::open(dir.path()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let again = rt.block_on(Locker::new(other).try_acquire("k")).unwrap();
    assert!(again.is_some(), "released by the drop");
}
