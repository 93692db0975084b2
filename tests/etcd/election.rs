//! Leader election on etcd: the value key beside the lock prefix, conditioned on the lock
//! key, and the leaders' watch observers in another process wake on.

use super::*;
use distlock::election::LeaderValues;
use distlock::Lease;

/// A campaign of `ttl`, waited for up to 10 s.
fn campaign(ttl: Duration) -> LockOptions {
    LockOptions::new()
        .ttl(ttl)
        .wait_for(Duration::from_secs(10))
}

fn values(backend: &EtcdBackend) -> &dyn LeaderValues {
    backend
        .leader_values()
        .expect("etcd publishes leaders' values")
}

/// The raw value key of election `name` under the default prefix's leaders' root.
async fn raw_value(endpoint: &str, prefix: &str, name: &str) -> Option<Vec<u8>> {
    let mut client = etcd_client::Client::connect([endpoint], None)
        .await
        .unwrap();
    let root = format!("{}.leaders/v/{name}", prefix.trim_end_matches('/'));
    let answer = client.get(root, None).await.unwrap();
    answer.kvs().first().map(|kv| kv.value().to_vec())
}

/// A value left by an earlier leader stays in etcd but is never answered for a later
/// holder of the lock: one that acquired it as a plain lock after a resignation, nor one it
/// was handed over to on the same lease (the lock key never deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_left_by_an_earlier_holder_is_never_answered() {
    let server = EtcdServer::start().await;
    let backend = Arc::new(backend(&[server.endpoint()], "prefix=elect/").await);
    let (a, b) = (
        Locker::with_backend(backend.clone()),
        Locker::with_backend(backend.clone()),
    );
    let name = key("stale");
    let ttl = Duration::from_secs(10);
    let leading = a
        .election(&name)
        .unwrap()
        .campaign("a", &campaign(ttl))
        .await
        .unwrap();
    assert_eq!(
        values(&backend)
            .leader(&name)
            .await
            .unwrap()
            .map(|l| l.value),
        Some(b"a".to_vec())
    );
    leading.resign().await.unwrap();
    // A plain lock holder after it: the value is still stored, never answered.
    let plain = b.acquire(name.as_str(), &campaign(ttl)).await.unwrap();
    let raw = raw_value(&server.endpoint(), "elect/", &name).await;
    assert!(
        raw.is_some_and(|v| v.ends_with(b":a")),
        "the earlier leader's value is still in etcd"
    );
    assert_eq!(values(&backend).leader(&name).await.unwrap(), None);
    plain.release().await.unwrap();

    // A hand-over inside one Locker keeps the key and its lease: the next holder has not
    // published, so nobody leads.
    let leading = a
        .election(&name)
        .unwrap()
        .campaign("a2", &campaign(ttl))
        .await
        .unwrap();
    let term = leading.term();
    let a2 = a.clone();
    let name2 = name.clone();
    let waiter = tokio::spawn(async move { a2.acquire(name2.as_str(), &campaign(ttl)).await });
    tokio::time::sleep(SETTLE).await;
    leading.resign().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    assert!(next.fence() > term);
    assert_eq!(
        values(&backend).leader(&name).await.unwrap(),
        None,
        "the handed-over holder has published nothing"
    );
    next.release().await.unwrap();
}

/// A publication by a lease that lost its key is refused with `NotHeld` and changes
/// nothing, even when the lease still looks valid to the caller: the server decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_by_a_lost_lease_is_refused_and_changes_nothing() {
    let server = EtcdServer::start().await;
    let backend = Arc::new(backend(&[server.endpoint()], "prefix=elect/").await);
    let (a, b) = (
        Locker::with_backend(backend.clone()),
        Locker::with_backend(backend.clone()),
    );
    let name = key("lost");
    let old = a
        .election(&name)
        .unwrap()
        .campaign("a", &campaign(Duration::from_secs(10)))
        .await
        .unwrap();
    // Force-released: the key goes to the next candidate while the old guard runs on.
    let old_lease = old.guard().lease();
    assert!(backend.force_release(&name).await.unwrap());
    let next = b
        .election(&name)
        .unwrap()
        .campaign("b", &campaign(Duration::from_secs(10)))
        .await
        .unwrap();
    let still_valid = Lease::new(
        name.as_str(),
        old_lease.owner(),
        old_lease.fence(),
        Instant::now() + Duration::from_secs(10),
    );
    match values(&backend).publish(&still_valid, b"late").await {
        Err(Error::NotHeld { key }) => assert_eq!(key, name),
        other => panic!("a lost lease published: {other:?}"),
    }
    let seen = values(&backend)
        .leader(&name)
        .await
        .unwrap()
        .expect("b leads");
    assert_eq!((seen.value, seen.term), (b"b".to_vec(), next.term()));
    // Nor can the old owner publish on a free key.
    next.resign().await.unwrap();
    assert!(matches!(
        values(&backend).publish(&still_valid, b"late").await,
        Err(Error::NotHeld { .. })
    ));
    assert_eq!(values(&backend).leader(&name).await.unwrap(), None);
    drop(old);
}

/// How long another process may take to hear of a change: far below the 30 s TTL.
const HEARD_WITHIN: Duration = Duration::from_secs(2);

/// An observer on a second backend (another process: its own connection, its own
/// watches) is woken by a publication and by an announcement, each within a bound far
/// below the TTL; and follows a leadership through `observe`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_in_another_process_is_woken_by_publish_and_announce() {
    let server = EtcdServer::start().await;
    let leader_side = Arc::new(backend(&[server.endpoint()], "prefix=elect/").await);
    let observer_side = Arc::new(backend(&[server.endpoint()], "prefix=elect/").await);
    let name = key("observed");
    let ttl = Duration::from_secs(30);

    // Raw: a listener, a read (which opens the watches), then a publication elsewhere.
    let locker = Locker::with_backend(leader_side.clone());
    let mut leading = locker
        .election(&name)
        .unwrap()
        .campaign("v1", &campaign(ttl))
        .await
        .unwrap();
    let mut listener = observer_side.listen(&name).expect("etcd listens");
    let seen = values(&observer_side).leader(&name).await.unwrap();
    assert_eq!(seen.map(|l| l.value), Some(b"v1".to_vec()));
    let sent = Instant::now();
    values(&leader_side)
        .publish(&leading.guard().lease(), b"v2")
        .await
        .unwrap();
    tokio::time::timeout(HEARD_WITHIN, listener.released())
        .await
        .expect("a publication wakes another process's listener");
    let heard = sent.elapsed();

    // An announcement alone (nothing else changes) wakes it too.
    let mut listener = observer_side.listen(&name).expect("etcd listens");
    values(&observer_side).leader(&name).await.unwrap();
    values(&leader_side).announce(&name).await.unwrap();
    tokio::time::timeout(HEARD_WITHIN, listener.released())
        .await
        .expect("an announcement wakes another process's listener");

    // Through the election API: a new value, then a resignation.
    let follower = Locker::with_backend(observer_side.clone());
    let mut watch = follower.election(&name).unwrap().observe();
    let first = watch.changed().await.unwrap().expect("a leads");
    assert_eq!(first.value, b"v2");
    leading.proclaim("v3").await.unwrap();
    let seen = tokio::time::timeout(HEARD_WITHIN, watch.changed())
        .await
        .expect("a proclamation is observed within the bound")
        .unwrap()
        .expect("a still leads");
    assert_eq!((seen.value, seen.term), (b"v3".to_vec(), leading.term()));
    leading.resign().await.unwrap();
    let seen = tokio::time::timeout(HEARD_WITHIN, watch.changed())
        .await
        .expect("a resignation is observed within the bound")
        .unwrap();
    assert_eq!(seen, None);
    println!("a publication heard by another process after {heard:?}");
}
