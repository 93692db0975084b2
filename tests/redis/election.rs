//! Leaders' values (elections) on one Redis server: the value hash beside the lock, the
//! holder check of a publication, and the notices that wake observers in other processes.

use super::*;
use distlock::election::{Leader, LeaderValues};
use distlock::ReleaseListener;

/// A lease of `key` for a fresh owner, taken directly on `backend` (no Locker, no
/// watchdog): the raw grant an election's leadership is made of.
async fn lease(backend: &RedisBackend, key: &str, ttl: Duration) -> Lease {
    let owner = Owner::random();
    let started = Instant::now();
    match backend
        .try_acquire(key, owner, Permits::LOCK, valid_ttl(ttl))
        .await
        .unwrap()
    {
        Attempt::Granted { fence, .. } => Lease::new(key, owner, fence, started + ttl),
        other => panic!("{key} is free, yet: {other:?}"),
    }
}

fn values(backend: &RedisBackend) -> &dyn LeaderValues {
    backend
        .leader_values()
        .expect("the Redis backend publishes leaders' values")
}

/// The fields `owner`, `term`, `value` of the hash at `key` (empty when missing).
async fn raw_leader_hash(server: &RedisServer, key: &str) -> Vec<Option<String>> {
    let mut raw = server.client().await;
    redis::cmd("HMGET")
        .arg(key)
        .arg("owner")
        .arg("term")
        .arg("value")
        .query_async(&mut raw)
        .await
        .unwrap()
}

async fn raw_pttl(server: &RedisServer, key: &str) -> i64 {
    let mut raw = server.client().await;
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut raw)
        .await
        .unwrap()
}

/// The value lives in a hash at `<prefix>{name}:leader` with the publisher's owner and
/// term, without expiry (renewals never touch it); after its leader released, a later
/// holder of the lock is not answered the earlier value (nobody leads until it publishes),
/// and the earlier leader can no longer publish. A lock marked awaited (a refused attempt
/// appends `*` to its holder) is still its holder's to publish and to be read as leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_left_by_an_earlier_holder_is_not_answered_for_a_later_holder() {
    let server = RedisServer::start().await;
    let backend = backend(&format!("{}?prefix=el%3A", server.url())).await;
    let node = backend.node().clone();
    let name = "jobs/leader";
    let ttl = Duration::from_secs(30);
    assert_eq!(values(&backend).leader(name).await.unwrap(), None);

    let first = lease(&backend, name, ttl).await;
    values(&backend).publish(&first, b"first").await.unwrap();
    let seen = values(&backend).leader(name).await.unwrap().expect("leads");
    assert_eq!(
        (seen.value.as_slice(), seen.term, seen.owner),
        (&b"first"[..], first.fence(), first.owner())
    );
    assert!(seen
        .expires_in
        .is_some_and(|left| left <= ttl && left > ttl - Duration::from_secs(5)));
    let key = node.leader_key(name);
    assert_eq!(key, "el:{jobs/leader}:leader");
    assert_eq!(
        raw_leader_hash(&server, &key).await,
        [
            Some(first.owner().to_string()),
            Some(first.fence().to_string()),
            Some("first".to_owned())
        ]
    );
    assert_eq!(raw_pttl(&server, &key).await, -1, "kept without expiry");
    backend
        .extend(&first, valid_ttl(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(
        raw_pttl(&server, &key).await,
        -1,
        "a renewal does not touch it"
    );

    backend.release(&first).await.unwrap();
    assert_eq!(values(&backend).leader(name).await.unwrap(), None);
    assert!(raw_exists(&server, &key).await, "the value stays behind");

    let second = lease(&backend, name, ttl).await;
    assert!(second.fence() > first.fence());
    assert_eq!(
        values(&backend).leader(name).await.unwrap(),
        None,
        "the earlier leader's value is not the later holder's"
    );
    // A refused attempt marks the lock awaited: still the holder's.
    let refused = backend
        .try_acquire(name, Owner::random(), Permits::LOCK, valid_ttl(ttl))
        .await
        .unwrap();
    assert!(matches!(refused, Attempt::Taken { .. }), "{refused:?}");
    assert_eq!(
        raw_string(&server, &node.lock_key(name)).await,
        Some(format!("{}*", second.owner()))
    );
    values(&backend).publish(&second, b"second").await.unwrap();
    let seen = values(&backend).leader(name).await.unwrap().expect("leads");
    assert_eq!(
        (seen.value.as_slice(), seen.term, seen.owner),
        (&b"second"[..], second.fence(), second.owner())
    );
    match values(&backend).publish(&first, b"stale").await {
        Err(Error::NotHeld { key }) => assert_eq!(key, name),
        other => panic!("an earlier leader published: {other:?}"),
    }
    assert_eq!(
        values(&backend)
            .leader(name)
            .await
            .unwrap()
            .map(|l| l.value),
        Some(b"second".to_vec())
    );
    backend.release(&second).await.unwrap();
}

/// A publication by a lease whose lock is gone (a raw `DEL` behind the backend's back, or
/// its expiry) is refused with `NotHeld`, and changes nothing: the kept value, its owner
/// and term stay, and no notice is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_by_a_lease_that_lost_its_key_is_refused_and_changes_nothing() {
    let server = RedisServer::start().await;
    let backend = backend(&server.url()).await;
    let node = backend.node().clone();
    let name = "lost";
    let key = node.leader_key(name);

    let deleted = lease(&backend, name, Duration::from_secs(30)).await;
    values(&backend).publish(&deleted, b"v1").await.unwrap();
    let kept = raw_leader_hash(&server, &key).await;
    common::raw_del(&server, &node.lock_key(name)).await;
    let published = calls(&server, "publish").await;
    assert!(matches!(
        values(&backend).publish(&deleted, b"v2").await,
        Err(Error::NotHeld { .. })
    ));
    assert_eq!(
        raw_leader_hash(&server, &key).await,
        kept,
        "nothing changed"
    );
    assert_eq!(
        calls(&server, "publish").await,
        published,
        "nothing announced"
    );
    assert_eq!(values(&backend).leader(name).await.unwrap(), None);

    let ttl = Duration::from_millis(200);
    let expired = lease(&backend, name, ttl).await;
    values(&backend).publish(&expired, b"short").await.unwrap();
    let kept = raw_leader_hash(&server, &key).await;
    assert_eq!(kept[2].as_deref(), Some("short"));
    tokio::time::sleep(ttl + SLACK).await;
    let published = calls(&server, "publish").await;
    assert!(matches!(
        values(&backend).publish(&expired, b"late").await,
        Err(Error::NotHeld { .. })
    ));
    assert_eq!(
        raw_leader_hash(&server, &key).await,
        kept,
        "nothing changed"
    );
    assert_eq!(
        calls(&server, "publish").await,
        published,
        "nothing announced"
    );
    assert_eq!(values(&backend).leader(name).await.unwrap(), None);
}

/// How long a notice may take to reach another process: far below every TTL here.
const NOTICE: Duration = Duration::from_secs(2);

/// Listeners of `keys` on `backend` (the only subscriber on `server`) whose subscription
/// is running: once the server counts its subscriber on the release channel, and the wake-up
/// of every listener that a (re)subscription makes has passed.
async fn subscribed(
    server: &RedisServer,
    backend: &RedisBackend,
    keys: &[&str],
) -> Vec<ReleaseListener> {
    let starting: Vec<_> = keys.iter().map(|k| backend.listen(k).unwrap()).collect();
    let mut raw = server.client().await;
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(backend.node().release_channel())
            .query_async(&mut raw)
            .await
            .unwrap();
        if n == 1 {
            break;
        }
        assert!(Instant::now() < until, "the subscription starts");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(starting);
    keys.iter().map(|k| backend.listen(k).unwrap()).collect()
}

/// The next change `watch` observes, within a notice's delay.
async fn next_change(watch: &mut distlock::LeaderWatch) -> Option<Leader> {
    tokio::time::timeout(NOTICE, watch.changed())
        .await
        .expect("a change observed within a notice's delay")
        .unwrap()
}

/// Whether `listener` is woken within `within`.
async fn woken(listener: &mut ReleaseListener, within: Duration) -> bool {
    tokio::time::timeout(within, listener.released())
        .await
        .is_ok()
}

/// An observer on a second backend (another process: its own connection and subscription)
/// is woken by a publication and by an announcement of the key, within a notice's delay
/// of a 30 s TTL; a listener of another key is not. A follower's `LeaderWatch` there sees
/// each change in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_in_another_process_is_woken_by_publish_and_announce() {
    let server = RedisServer::start().await;
    let leader_side = backend(&server.url()).await;
    let observer_side = Arc::new(backend(&server.url()).await);
    let name = "observed";
    let ttl = Duration::from_secs(30);

    let mut listeners = subscribed(&server, &observer_side, &[name, "other"]).await;
    let (mut other_key, mut listener) = (listeners.pop().unwrap(), listeners.pop().unwrap());
    assert!(
        !woken(&mut listener, Duration::from_millis(200)).await,
        "nothing happened yet"
    );
    let lease = lease(&leader_side, name, ttl).await;
    assert!(
        !woken(&mut listener, Duration::from_millis(200)).await,
        "an uncontended grant announces nothing"
    );
    values(&leader_side).publish(&lease, b"v1").await.unwrap();
    assert!(
        woken(&mut listener, NOTICE).await,
        "a publication wakes the other process"
    );
    let seen = values(&observer_side)
        .leader(name)
        .await
        .unwrap()
        .expect("leads");
    assert_eq!(seen.value, b"v1");

    let mut listener = observer_side.listen(name).unwrap();
    values(&leader_side).announce(name).await.unwrap();
    assert!(
        woken(&mut listener, NOTICE).await,
        "an announcement wakes the other process"
    );
    assert!(
        !woken(&mut other_key, Duration::from_millis(200)).await,
        "notices of a key wake only its listeners"
    );
    leader_side.release(&lease).await.unwrap();

    // Through the Lockers: a follower in the observing process sees each change in order.
    let (leading_locker, following) = (
        Locker::new(backend(&server.url()).await),
        Locker::with_backend(observer_side.clone()),
    );
    let mut watch = following.election(name).unwrap().observe();
    assert_eq!(next_change(&mut watch).await, None);
    let opts = LockOptions::new().ttl(ttl).wait_for(Duration::from_secs(5));
    let mut leading = leading_locker
        .election(name)
        .unwrap()
        .campaign("a1", &opts)
        .await
        .unwrap();
    let seen: Option<Leader> = next_change(&mut watch).await;
    assert_eq!(
        seen.map(|l| (l.value, l.term)),
        Some((b"a1".to_vec(), leading.term()))
    );
    leading.proclaim("a2").await.unwrap();
    let seen = next_change(&mut watch).await;
    assert_eq!(
        seen.map(|l| (l.value, l.term)),
        Some((b"a2".to_vec(), leading.term()))
    );
    leading.resign().await.unwrap();
    assert_eq!(
        next_change(&mut watch).await,
        None,
        "the resignation is observed"
    );
    leading_locker.shutdown().await;
}

/// A restart from a snapshot taken while an earlier leader led brings its record back
/// (its lock had time left): an observer that was already told a later term is not told
/// the earlier one, even when it was told "nobody leads" in between. (Found by the
/// exclusion checker's election mode in the stale-snapshot phase, seed
/// 12628251590122645471: the watch compared with the last answer only, which was `None`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_is_not_told_an_earlier_term_brought_back_by_a_stale_snapshot() {
    let mut server = RedisServer::start_with(RedisOptions {
        rdb: true,
        ..RedisOptions::default()
    })
    .await;
    let name = "stale/leader";
    let (candidates, observing) = (
        Locker::new(backend(&server.url()).await),
        Locker::new(backend(&server.url()).await),
    );
    let mut watch = observing.election(name).unwrap().observe();
    assert_eq!(next_change(&mut watch).await, None);
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_for(Duration::from_secs(5));
    let election = candidates.election(name).unwrap();

    let first = election.campaign("first", &opts).await.unwrap();
    let early = first.term();
    assert_eq!(next_change(&mut watch).await.map(|l| l.term), Some(early));
    server.save().await;
    first.resign().await.unwrap();
    assert_eq!(next_change(&mut watch).await, None, "nobody leads");
    let second = election.campaign("second", &opts).await.unwrap();
    let later = second.term();
    assert!(later > early);
    assert_eq!(next_change(&mut watch).await.map(|l| l.term), Some(later));
    second.resign().await.unwrap();
    assert_eq!(next_change(&mut watch).await, None, "nobody leads");

    server.restart().await;
    let read = observing.election(name).unwrap().leader().await.unwrap();
    assert_eq!(
        read.as_ref().map(|l| l.term),
        Some(early),
        "the snapshot brought the first leader's record back"
    );
    if let Ok(told) = tokio::time::timeout(Duration::from_secs(2), watch.changed()).await {
        let told = told.unwrap();
        assert!(
            told.as_ref().is_none_or(|l| l.term > later),
            "told term {:?} after term {later}",
            told.map(|l| l.term)
        );
    }
    candidates.shutdown().await;
    observing.shutdown().await;
}
