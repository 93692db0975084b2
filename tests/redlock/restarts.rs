//! Restarts

use super::*;

/// Three nodes; the first holder wins nodes 0 and 1 only (node 2 holds a foreign value),
/// then node 1 restarts. Returns the servers, the first holder and a second Locker.
async fn hold_on_a_bare_majority(
    options: RedisOptions,
    key: &str,
    opts: &LockOptions,
) -> (Vec<RedisServer>, distlock::LockGuard, Locker) {
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(RedisServer::start_with(options.clone()).await);
    }
    let addrs: Vec<SocketAddr> = servers.iter().map(RedisServer::addr).collect();
    preset_foreign(&servers[2], key, 60_000).await;
    let first = Locker::new(backend(&addrs, "").await);
    let guard = first
        .acquire(key, opts)
        .await
        .expect("a bare majority grants");
    assert!(raw_exists(&servers[0], &lock_key(key)).await);
    assert!(raw_exists(&servers[1], &lock_key(key)).await);
    let second = Locker::new(backend(&addrs, "").await);
    (servers, guard, second)
}

/// The known unsafety the documentation warns about: a node of a bare majority restarted
/// at once without persistence lets a second client win while the first still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_persistence_can_grant_twice_as_documented() {
    let key = "restart/unsafe";
    let opts = skip(Duration::from_secs(30));
    let (mut servers, first, second) =
        hold_on_a_bare_majority(RedisOptions::default(), key, &opts).await;
    servers[1].restart().await;
    raw_del(&servers[2], &lock_key(key)).await;
    let twice = second.acquire(key, &opts).await;
    assert!(
        twice.is_ok() && !first.is_lost(),
        "without persistence or a restart delay a second holder is granted: {twice:?}"
    );
}

/// With persistence (append-only file, fsync always) the restarted node still has the
/// lock: no second holder while the first holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_persistence_grants_no_second_holder() {
    let key = "restart/persistent";
    let opts = skip(Duration::from_secs(30));
    let persistent = RedisOptions {
        persistent: true,
        password: None,
        ..RedisOptions::default()
    };
    let (mut servers, first, second) = hold_on_a_bare_majority(persistent, key, &opts).await;
    servers[1].restart().await;
    raw_del(&servers[2], &lock_key(key)).await;
    assert!(raw_exists(&servers[1], &lock_key(key)).await, "reloaded");
    assert!(matches!(
        second.acquire(key, &opts).await,
        Err(Error::Locked { .. })
    ));
    assert!(!first.is_lost());
    first.release().await.expect("still held by a quorum");
    let after = second
        .acquire(key, &opts)
        .await
        .expect("free after release");
    after.release().await.unwrap();
}

/// With a restart delayed by at least the TTL, the first holder (renewing) has lost the
/// lock before the empty node is back, so no second holder overlaps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_restart_grants_no_second_holder() {
    let key = "restart/delayed";
    let ttl = Duration::from_millis(600);
    let opts = LockOptions::new().ttl(ttl).skip();
    let (mut servers, first, second) =
        hold_on_a_bare_majority(RedisOptions::default(), key, &opts).await;
    servers[1].kill();
    let killed_at = Instant::now();
    tokio::time::timeout(ttl + SLACK, first.lost())
        .await
        .expect("the holder loses the lock within its validity once a quorum is gone");
    tokio::time::sleep_until((killed_at + ttl).into()).await;
    servers[1].restart().await;
    raw_del(&servers[2], &lock_key(key)).await;
    let g = second
        .acquire(key, &opts)
        .await
        .expect("granted after the delay");
    assert!(first.is_lost(), "the first holder knew it lost before");
    assert!(first.valid_until() <= Instant::now());
    g.release().await.unwrap();
}
