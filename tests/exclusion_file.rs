//! The randomized exclusion checker on the file backend: three Lockers, each over its own
//! backend instance on one directory (their grants are distinct open files, as those of
//! three processes are), and two fault rounds after the normal one: another process takes
//! every key and is killed with SIGKILL while holding them (the waiters here get them the
//! moment it dies), and another process locks and releases every key in turn beside the
//! checker. Fences come from the files, so they go on across all of these.
//! `DISTLOCK_SOAK_SECS` runs it longer, `DISTLOCK_CHECK_SEED` replays a seed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::file_child;
use distlock::file::FileBackend;
use distlock::Locker;
use lock_conformance::exclusion::{Exclusion, ExclusionConfig, Fault, SOAK_ENV};

/// The child's entry point (a holder in another process); nothing in a normal run.
#[tokio::test(flavor = "current_thread")]
async fn child_process() {
    file_child::child_main().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_file() {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let open = || FileBackend::builder(dir.path()).sync(false).open().unwrap();
    let lockers: Vec<Locker> = (0..3).map(|_| Locker::new(open())).collect();
    let config = ExclusionConfig::from_env();
    let config = if std::env::var_os(SOAK_ENV).is_some() {
        config
    } else {
        config.duration(Duration::from_secs(6))
    };
    let keys = config.key_names();

    let killed = {
        let (dir, keys) = (dir.clone(), keys.clone());
        Fault::new(
            "another process holding every key killed (SIGKILL)",
            move || {
                let (dir, keys) = (dir.clone(), keys.clone());
                async move {
                    let (mut child, held) =
                        file_child::spawn("child_process", "hold", dir.path(), &keys).await;
                    assert_eq!(held.len(), keys.len());
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    file_child::kill9(&mut child).await;
                }
            },
        )
    };
    let churn = {
        let (dir, keys) = (dir.clone(), keys.clone());
        Fault::new(
            "another process locking and releasing every key in turn",
            move || {
                let (dir, keys) = (dir.clone(), keys.clone());
                async move {
                    let (mut child, _) =
                        file_child::spawn("child_process", "churn", dir.path(), &keys).await;
                    let status = child.wait().await.unwrap();
                    assert!(status.success(), "the churning child: {status}");
                }
            },
        )
    };
    // The default keys-left probe: `inspect` of every key through the first backend.
    let report = Exclusion::new(lockers)
        .config(config)
        .fault(killed)
        .fault(churn)
        .run()
        .await;
    report.assert_clean();
}
