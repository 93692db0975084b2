//! Faults on a real Redis Cluster of 3 masters with one replica each (started once for
//! this binary; the tests take turns): the release watch survives the loss of the node it
//! subscribed through, and a master killed and failed over to its replica lets
//! acquisitions of its slots resume with fences still strictly increasing, also when the
//! promoted replica's fence counter is behind (asynchronous replication).

mod common;

use std::time::{Duration, Instant};

use distlock::redis::RedisBackend;
use distlock::{LockOptions, Locker};
use lock_testkit::RedisCluster;
use tokio::sync::{Mutex, MutexGuard, OnceCell};

/// The cluster of this binary and the turn of the test using it.
async fn cluster() -> (&'static RedisCluster, MutexGuard<'static, ()>) {
    static CLUSTER: OnceCell<RedisCluster> = OnceCell::const_new();
    static TURN: Mutex<()> = Mutex::const_new(());
    let turn = TURN.lock().await;
    (
        CLUSTER.get_or_init(|| RedisCluster::start(3, 1)).await,
        turn,
    )
}

/// A waiter whose backend subscribed through a node that then dies is still woken by the
/// next release's notice (the watch resubscribed through the next seed), long before the
/// holder's 30 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_watch_survives_the_loss_of_its_node() {
    let (cluster, _turn) = cluster().await;
    let masters = cluster.masters().await;
    let replica = (0..cluster.len())
        .find(|i| !masters.contains(i) && cluster.node(*i).is_serving())
        .expect("a serving replica");
    // The waiter's watch subscribes through its first seed: the replica.
    let mut seeds = vec![cluster.seeds()[replica].clone()];
    seeds.extend(masters.iter().map(|&m| cluster.seeds()[m].clone()));
    let waiter = RedisBackend::cluster_builder(seeds)
        .prefix("watch:")
        .build()
        .await
        .unwrap();
    let holder = common::redis_backend(&format!("{}?prefix=watch%3A", cluster.url())).await;
    let (waiter, holder) = (Locker::new(waiter), Locker::new(holder));
    let ttl = Duration::from_secs(30);
    for round in 0..4 {
        if round == 2 {
            cluster.node(replica).kill();
            // Let the watch see its connection close and resubscribe elsewhere.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let guard = holder
            .acquire("w", &LockOptions::new().ttl(ttl))
            .await
            .unwrap();
        let task = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                let opts = LockOptions::new()
                    .ttl(ttl)
                    .wait_for(Duration::from_secs(10));
                let g = waiter.acquire("w", &opts).await;
                (Instant::now(), g)
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released_at = Instant::now();
        guard.release().await.unwrap();
        let (granted_at, g) = task.await.unwrap();
        let g = g.unwrap_or_else(|e| panic!("round {round}: the waiter gets the lock: {e}"));
        let delay = granted_at - released_at;
        assert!(
            delay < Duration::from_millis(1500),
            "round {round}: the waiter was woken {delay:?} after the release"
        );
        g.release().await.unwrap();
    }
}

/// A master is killed; its replica is promoted; acquisitions of keys of its slots resume
/// (the Locker retrying the transient errors meanwhile) and every fence is above every
/// fence given before, also when the promoted replica's counter is set back (as if the
/// last increments had not been replicated): the server clock orders fences then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_resumes_acquisitions_with_increasing_fences() {
    let (cluster, _turn) = cluster().await;
    let url = format!("{}?prefix=failover%3A&timeout=500ms", cluster.url());
    let backend = common::redis_backend(&url).await;
    let node = backend.node().clone();
    let locker = Locker::new(backend);
    // A key on a master whose replica is in sync.
    let mut chosen = None;
    for i in 0..64 {
        let name = format!("f/{i}");
        let master = cluster.master_of_key(&node.lock_key(&name)).await;
        if !cluster.replicas_of(master).await.is_empty() {
            chosen = Some((name, master));
            break;
        }
    }
    let (name, master) = chosen.expect("a master with an in-sync replica");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(Duration::from_secs(20));
    let mut last = 0;
    for _ in 0..20 {
        let g = locker.acquire(&name, &opts).await.unwrap();
        assert!(g.fence() > last, "fence {} after {last}", g.fence());
        last = g.fence();
        g.release().await.unwrap();
    }
    let slot = RedisCluster::slot_of(&node.lock_key(&name));
    cluster.node(master).kill();
    let killed = Instant::now();
    let promoted = cluster.wait_failover(slot, master).await;
    eprintln!("failover to node {promoted} after {:?}", killed.elapsed());
    let g = locker.acquire(&name, &opts).await.unwrap();
    eprintln!("first grant {:?} after the kill", killed.elapsed());
    assert!(
        g.fence() > last,
        "fence {} after the failover, {last} before",
        g.fence()
    );
    last = g.fence();
    g.release().await.unwrap();
    // The promoted replica's counter behind the fences given (lost replication).
    let mut raw = cluster.node(promoted).client().await;
    let _: () = redis::cmd("SET")
        .arg(node.fence_key(&name))
        .arg(last / 2)
        .query_async(&mut raw)
        .await
        .unwrap();
    for _ in 0..5 {
        let g = locker.acquire(&name, &opts).await.unwrap();
        assert!(
            g.fence() > last,
            "fence {} after a stale counter, {last} before",
            g.fence()
        );
        last = g.fence();
        g.release().await.unwrap();
    }
}
