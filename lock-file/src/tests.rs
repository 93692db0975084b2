use std::time::Duration;

use lock_core::{LockOptions, Locker};

use super::*;

fn ttl() -> Ttl {
    CAPABILITIES.effective_ttl(Duration::from_secs(1)).unwrap()
}

async fn grant(backend: &FileBackend, key: &str) -> Option<Lease> {
    let owner = Owner::random();
    match Backend::try_acquire(backend, key, owner, Permits::LOCK, ttl())
        .await
        .unwrap()
    {
        Attempt::Granted { fence, valid_until } => Some(Lease::new(key, owner, fence, valid_until)),
        Attempt::Taken { expires_in } => {
            assert_eq!(expires_in, None);
            None
        }
    }
}

/// Two backends over one directory exclude each other (two open file descriptions, as two
/// processes have), and fences go on from the file across backends ("restarts").
#[tokio::test]
async fn backends_over_one_directory_exclude_and_share_fences() {
    let tmp = tempfile::tempdir().unwrap();
    let a = FileBackend::open(tmp.path()).unwrap();
    let b = FileBackend::open(tmp.path()).unwrap();
    let first = grant(&a, "k/1").await.expect("free");
    assert!(first.valid_until() > Instant::now() + Duration::from_secs(3600 * 24 * 365));
    assert!(grant(&b, "k/1").await.is_none());
    assert!(grant(&a, "k/1").await.is_none(), "the same backend too");
    assert_eq!(
        a.admin().unwrap().inspect("k/1").await.unwrap()[0].fence,
        Some(first.fence())
    );
    Backend::release(&a, &first).await.unwrap();
    assert!(matches!(
        Backend::release(&a, &first).await,
        Err(Error::NotHeld { .. })
    ));
    assert!(a.admin().unwrap().inspect("k/1").await.unwrap().is_empty());
    let second = grant(&b, "k/1").await.expect("released");
    assert_eq!(second.fence(), first.fence() + 1);
    assert!(Backend::extend(&b, &second, ttl()).await.is_ok());
    assert!(matches!(
        Backend::extend(&a, &second, ttl()).await,
        Err(Error::NotHeld { .. })
    ));
    drop(b);
    let c = FileBackend::open(tmp.path()).unwrap();
    let third = grant(&c, "k/1")
        .await
        .expect("a dropped backend's grants are gone");
    assert_eq!(third.fence(), first.fence() + 2);
    assert!(tmp.path().join("k%2F1.lock").is_file());
    assert_eq!(a.held_grants(), 0);
    assert_eq!(c.held_grants(), 1);
}

/// A waiter of one backend is woken by another backend's release through its watcher,
/// not by polling (its Locker would back off up to 500 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_elsewhere_wakes_a_waiter_promptly() {
    let tmp = tempfile::tempdir().unwrap();
    let a = Locker::new(FileBackend::open(tmp.path()).unwrap());
    let b = Locker::new(FileBackend::open(tmp.path()).unwrap());
    let opts = LockOptions::new().wait_for(Duration::from_secs(10));
    for _ in 0..3 {
        let held = a.acquire("k", &opts).await.unwrap();
        let waiter = {
            let (b, opts) = (b.clone(), opts.clone());
            tokio::spawn(async move {
                let g = b.acquire("k", &opts).await.unwrap();
                (Instant::now(), g)
            })
        };
        // Long enough for the waiter's backoff to reach its 500 ms cap.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let released = Instant::now();
        held.release().await.unwrap();
        let (granted, g) = waiter.await.unwrap();
        assert!(
            granted - released < Duration::from_millis(100),
            "{:?}",
            granted - released
        );
        g.release().await.unwrap();
    }
}

/// The raw baseline never takes a lock's file.
#[tokio::test]
async fn the_raw_cycle_leaves_the_lock_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let a = FileBackend::open(tmp.path()).unwrap();
    let held = grant(&a, "k").await.unwrap();
    a.baseline().unwrap().raw_cycle("k", ttl()).await.unwrap();
    assert!(tmp.path().join("k.raw").is_file());
    assert_eq!(a.admin().unwrap().inspect("k").await.unwrap().len(), 1);
    Backend::release(&a, &held).await.unwrap();
}

/// A missing directory is re-created (a runtime directory emptied at logout).
#[tokio::test]
async fn a_removed_directory_is_created_again() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    let a = FileBackend::open(&dir).unwrap();
    std::fs::remove_dir(&dir).unwrap();
    assert!(grant(&a, "k").await.is_some());
}

/// An owner holding one key is refused a second key (grants are kept by owner: the second
/// used to replace the first, unlocking it while its lease still looked held).
#[tokio::test]
async fn an_owner_holding_a_key_is_refused_a_second_one() {
    let tmp = tempfile::tempdir().unwrap();
    let a = FileBackend::open(tmp.path()).unwrap();
    let owner = Owner::random();
    let first = Backend::try_acquire(&a, "one", owner, Permits::LOCK, ttl()).await;
    assert!(matches!(first, Ok(Attempt::Granted { .. })), "{first:?}");
    let second = Backend::try_acquire(&a, "two", owner, Permits::LOCK, ttl()).await;
    assert!(
        matches!(second, Err(Error::Unsupported { .. })),
        "{second:?}"
    );
    assert!(
        grant(&a, "one").await.is_none(),
        "the first key is still held"
    );
    assert!(
        grant(&a, "two").await.is_some(),
        "the refused key was left free"
    );
}
