//! Hand-over inside one Locker

use super::*;

/// Counts the delete events of `full_key` from a watch of its own.
async fn count_deletes(endpoint: String, full_key: String) -> (Arc<AtomicUsize>, impl Drop) {
    use etcd_client::{EventType, WatchOptions};
    let mut client = etcd_client::Client::connect([endpoint], None)
        .await
        .unwrap();
    let mut stream = created_watch(&mut client, full_key, WatchOptions::new()).await;
    let deletes = Arc::new(AtomicUsize::new(0));
    let counted = deletes.clone();
    let task = tokio::spawn(async move {
        while let Ok(Some(response)) = stream.message().await {
            let n = response
                .events()
                .iter()
                .filter(|e| e.event_type() == EventType::Delete)
                .count();
            counted.fetch_add(n, Ordering::SeqCst);
        }
    });
    struct Abort(tokio::task::JoinHandle<()>);
    impl Drop for Abort {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    (deletes, Abort(task))
}

/// A waiter queued behind a holder of the same Locker gets the key straight from it, in
/// one write: the key is never deleted in between, the new fence is higher, and `inspect`
/// names the new holder and its fence, also after an extension that moves the key to a new
/// lease. The last release deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_waiter_is_handed_the_key_without_a_delete() {
    let server = EtcdServer::start().await;
    let backend = Arc::new(backend(&[server.endpoint()], "prefix=hand/").await);
    let locker = Locker::with_backend(backend.clone());
    let k = key("hand");
    let (deletes, _watch) = count_deletes(server.endpoint(), format!("hand/{k}")).await;
    let wait = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(Duration::from_secs(5))
        .watchdog(false);

    let (second, third) = queued_holder_and_waiter(&locker, &k, &wait, SETTLE).await;
    let deleted_before = deletes.load(Ordering::SeqCst);
    let fence = second.fence();
    // A waiter is queued: the holder's renewals still work, and nothing changes hands
    // before its release.
    second.extend(Duration::from_secs(5)).await.unwrap();
    second.extend(Duration::from_secs(5)).await.unwrap();
    assert!(!second.is_lost());
    second.release().await.unwrap();
    let third = third.await.unwrap().unwrap();
    assert!(third.fence() > fence, "{} after {fence}", third.fence());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        deletes.load(Ordering::SeqCst),
        deleted_before,
        "handed over without deleting the key"
    );
    let holder = backend.inspect(&k).await.unwrap().pop().expect("held");
    assert_eq!(holder.owner, Some(third.lease().owner()));
    assert_eq!(holder.fence, Some(third.fence()));
    // Another TTL moves the key to a new lease: the fence it reports stays the holder's.
    third.extend(Duration::from_secs(8)).await.unwrap();
    let holder = backend.inspect(&k).await.unwrap().pop().expect("held");
    assert_eq!(holder.fence, Some(third.fence()));
    third.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(deletes.load(Ordering::SeqCst), deleted_before + 1);
    assert_eq!(backend.inspect(&k).await.unwrap(), vec![]);
    assert_eq!(backend.held_leases(), 0);
}

/// Hand-overs in a row are bounded: under steady contention inside one Locker most turns
/// are hand-overs, and the key is still deleted (other processes' waiters woken) at least
/// once every 17 turns. Holders never overlap and fences strictly increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_overs_in_a_row_are_bounded() {
    let server = EtcdServer::start().await;
    let locker = Locker::new(backend(&[server.endpoint()], "prefix=row/").await);
    let k = key("row");
    let (deletes, _watch) = count_deletes(server.endpoint(), format!("row/{k}")).await;
    let resource = Arc::new(Resource::default());
    let (tasks, rounds) = (4, 20);
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (locker, k, resource) = (locker.clone(), k.clone(), resource.clone());
            tokio::spawn(async move {
                let wait = LockOptions::new()
                    .ttl(Duration::from_secs(5))
                    .wait_for(Duration::from_secs(10))
                    .watchdog(false);
                for _ in 0..rounds {
                    let g = locker.acquire(&k, &wait).await.unwrap();
                    resource.enter(g.fence());
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    resource.leave();
                    g.release().await.unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("no overlap, increasing fences");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let turns = tasks * rounds;
    let deleted = deletes.load(Ordering::SeqCst);
    eprintln!("{turns} turns, {deleted} deletes");
    assert!(
        deleted < turns / 2,
        "most turns are hand-overs: {deleted} deletes"
    );
    assert!(
        deleted >= turns / 17,
        "the key is deleted at least every 17 turns: {deleted} deletes"
    );
}

/// A hand-over never displaces another owner: when the key no longer holds the holder's
/// value (overwritten here by another client, which no watch sees as a release), the
/// hand-over at the holder's release finds that out, the release reports `NotHeld`, and the
/// waiter queued behind it is granted only once the key is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_never_displaces_another_owner() {
    let server = EtcdServer::start().await;
    let locker = Locker::new(backend(&[server.endpoint()], "prefix=steal/").await);
    let k = key("steal");
    let wait = waiting();
    let holder = queued_holder(&locker, &k, &wait, SETTLE).await;
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let full = format!("steal/{k}");
    client
        .put(full.as_str(), "someone else", None)
        .await
        .unwrap();
    let mut waiter = spawn_acquire(&locker, &k, &wait);
    tokio::time::sleep(SETTLE).await;
    let fence = holder.fence();
    assert!(
        matches!(holder.release().await, Err(Error::NotHeld { .. })),
        "the release finds the key taken"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut waiter)
            .await
            .is_err(),
        "nobody is granted while another owner holds the key"
    );
    assert_eq!(
        client.get(full.as_str(), None).await.unwrap().kvs()[0].value(),
        b"someone else"
    );
    client.delete(full.as_str(), None).await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("granted once the key is free")
        .unwrap()
        .unwrap();
    assert!(granted.fence() > fence);
    granted.release().await.unwrap();
}

/// A waiter that gives up before the release is not handed anything: the release deletes
/// the key, and no lease or record is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gave_up_is_not_handed_the_key() {
    let server = EtcdServer::start().await;
    let backend = Arc::new(backend(&[server.endpoint()], "prefix=gaveup/").await);
    let locker = Locker::with_backend(backend.clone());
    let k = key("gaveup");
    let wait = waiting();
    let (holder, waiter) = queued_holder_and_waiter(&locker, &k, &wait, SETTLE).await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    holder.release().await.unwrap();
    assert_eq!(
        backend.inspect(&k).await.unwrap(),
        vec![],
        "released, not handed"
    );
    assert_eq!(backend.held_leases(), 0);
    // And the next waiter behind a holder is handed the key again.
    let (holder, waiter) = queued_holder_and_waiter(&locker, &k, &wait, SETTLE).await;
    let fence = holder.fence();
    holder.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    let seen = backend.inspect(&k).await.unwrap().pop().expect("held");
    assert_eq!(
        (seen.owner, seen.fence),
        (Some(next.lease().owner()), Some(next.fence()))
    );
    assert!(next.fence() > fence);
    next.release().await.unwrap();
}

/// The release watch is open only while a waiter needs it: not for uncontended locks,
/// from a waiter's first refused attempt (whose holder's release, in another process, it
/// then announces), and not long after the last waiter is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_watch_runs_only_while_someone_waits() {
    let server = EtcdServer::start().await;
    let ours = Arc::new(backend(&[server.endpoint()], "prefix=lazy/").await);
    let theirs = Locker::new(backend(&[server.endpoint()], "prefix=lazy/").await);
    let locker = Locker::with_backend(ours.clone());
    let k = key("lazy");
    let wait = waiting();
    for _ in 0..20 {
        locker
            .acquire(&k, &wait)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    assert!(!ours.watching(), "no watch for uncontended locks");
    let held = theirs.acquire(&k, &wait).await.unwrap();
    let waiter = spawn_acquire(&locker, &k, &wait);
    tokio::time::sleep(SETTLE).await;
    assert!(ours.watching(), "a refused waiter opened the watch");
    held.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("woken by the watch, not by the holder's 5 s TTL")
        .unwrap()
        .unwrap();
    granted.release().await.unwrap();
    let closed = Instant::now();
    while ours.watching() {
        assert!(
            closed.elapsed() < Duration::from_secs(5),
            "the idle watch closes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
