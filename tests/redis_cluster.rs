//! The Redis backend on a real 3-master Redis Cluster from lock-testkit (started once for
//! this binary): the conformance suite (directly and through `distlock::connect`), grouped
//! operations on keys of many slots each getting their own answer, a release on one node
//! waking a waiter connected through another, a follower of an election observing a
//! leader connected through another node, and the refusal of bad cluster URLs.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::redis_backend as backend;
use distlock::redis::{RedisBackend, RedisNode, CAPABILITIES};
use distlock::{Attempt, Error, LockOptions, Locker, Owner};
use lock_testkit::RedisCluster;
use tokio::sync::{OnceCell, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The cluster of this binary: 3 masters, no replicas (nothing here kills a node).
static CLUSTER: OnceCell<RedisCluster> = OnceCell::const_new();
/// Tests share the cluster (read); one that counts the servers' calls has it alone (write).
static QUIET: RwLock<()> = RwLock::const_new(());

/// The shared cluster, and the turn to use it alongside the other tests.
async fn cluster() -> (&'static RedisCluster, RwLockReadGuard<'static, ()>) {
    let turn = QUIET.read().await;
    (
        CLUSTER.get_or_init(|| RedisCluster::start(3, 0)).await,
        turn,
    )
}

/// The shared cluster, with no other test using it meanwhile.
async fn quiet_cluster() -> (&'static RedisCluster, RwLockWriteGuard<'static, ()>) {
    let turn = QUIET.write().await;
    (
        CLUSTER.get_or_init(|| RedisCluster::start(3, 0)).await,
        turn,
    )
}

/// The cluster URL with `prefix` (each test its own keys) and a 2 s timeout.
fn url(cluster: &RedisCluster, prefix: &str) -> String {
    format!("{}?prefix={prefix}%3A&timeout=2s", cluster.url())
}

/// Calls of `cmd` answered so far, summed over every node (`INFO commandstats`).
async fn calls(cluster: &RedisCluster, cmd: &str) -> u64 {
    let mut total = 0;
    for node in cluster.nodes() {
        let mut raw = node.client().await;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut raw)
            .await
            .unwrap();
        let prefix = format!("cmdstat_{cmd}:calls=");
        total += info
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse::<u64>().unwrap());
    }
    total
}

/// The whole conformance suite on the cluster, the backend used directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_direct() {
    let (cluster, _turn) = cluster().await;
    common::conformance_direct(backend(&url(cluster, "direct")).await).await;
}

/// The whole suite through the facade's `distlock::connect("redis+cluster://…")`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_connect() {
    let (cluster, _turn) = cluster().await;
    common::conformance_through_connect(&url(cluster, "connect"), |caps| {
        assert_eq!(caps, &CAPABILITIES)
    })
    .await;
}

/// The locks of a cluster backend really are spread over the masters, each lock's keys
/// (lock, fence counter) on the master of the lock's slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_live_on_the_master_of_their_slot() {
    let (cluster, _turn) = cluster().await;
    let node: RedisNode = backend(&url(cluster, "spread")).await.node().clone();
    let ttl = CAPABILITIES.effective_ttl(Duration::from_secs(10)).unwrap();
    let mut masters = HashMap::new();
    for i in 0..24 {
        let name = format!("spread/{i}");
        assert!(matches!(
            node.try_acquire(&name, Owner::random(), ttl).await.unwrap(),
            Attempt::Granted { .. }
        ));
        let master = cluster.master_of_key(&node.lock_key(&name)).await;
        for key in [node.lock_key(&name), node.fence_key(&name)] {
            let mut raw = cluster.node(master).client().await;
            let exists: i64 = redis::cmd("EXISTS")
                .arg(&key)
                .query_async(&mut raw)
                .await
                .unwrap();
            assert_eq!(exists, 1, "{key} on node {master}, the master of its slot");
        }
        *masters.entry(master).or_insert(0) += 1;
    }
    assert_eq!(masters.len(), 3, "24 locks on every master: {masters:?}");
}

/// `n` groups of `size` distinct lock names, the names of one group in one hash slot and
/// each group in a slot of its own.
fn names_by_slot(node: &RedisNode, n: usize, size: usize) -> Vec<Vec<String>> {
    let mut by_slot: HashMap<u16, Vec<String>> = HashMap::new();
    let mut full = Vec::new();
    for i in 0.. {
        let name = format!("slots/{i}");
        let names = by_slot
            .entry(RedisCluster::slot_of(&node.lock_key(&name)))
            .or_default();
        names.push(name);
        if names.len() == size {
            full.push(std::mem::take(names));
            if full.len() == n {
                break;
            }
        }
    }
    full
}

/// Concurrent acquires and releases on keys of many slots, grouping on (groups per slot)
/// and off (the cluster default): every caller gets its own answer (grants with their
/// fence, refusals for the held key, releases of its own locks only), nothing is refused
/// for crossing slots, and with grouping on keys of one slot go together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_operations_over_many_slots_get_their_own_answers() {
    let (cluster, _alone) = quiet_cluster().await;
    for grouping in [true, false] {
        let node = RedisBackend::cluster_builder(cluster.seeds())
            .prefix(format!("group{grouping}:"))
            .grouping(grouping)
            .build_node()
            .await
            .unwrap();
        let acquiring = concurrent_cycles(cluster, &node).await;
        if grouping {
            // 64 acquires in 8 slots, each slot's 8 at once: fewer calls than requests.
            assert!(
                acquiring < 64,
                "64 concurrent acquires in 8 slots took {acquiring} script calls: not grouped"
            );
        } else {
            assert!(
                acquiring >= 64,
                "{acquiring} calls for 64 ungrouped acquires"
            );
        }
    }
}

/// 64 concurrent acquires (one key held already) then releases on `node`, keys in 8
/// slots, each checked; the script calls the acquires took.
async fn concurrent_cycles(cluster: &RedisCluster, node: &RedisNode) -> u64 {
    let ttl = CAPABILITIES.effective_ttl(Duration::from_secs(10)).unwrap();
    let groups = names_by_slot(node, 8, 8);
    let taken = groups[3][5].clone();
    assert!(matches!(
        node.try_acquire(&taken, Owner::random(), ttl)
            .await
            .unwrap(),
        Attempt::Granted { .. }
    ));
    let names: Vec<String> = groups.iter().flatten().cloned().collect();
    let owners: Vec<Owner> = names.iter().map(|_| Owner::random()).collect();
    let before = calls(cluster, "evalsha").await;
    let attempts = futures::future::join_all(
        names
            .iter()
            .zip(&owners)
            .map(|(n, o)| node.try_acquire(n, *o, ttl)),
    )
    .await;
    let acquiring = calls(cluster, "evalsha").await - before;
    for ((name, owner), attempt) in names.iter().zip(&owners).zip(attempts) {
        match attempt.unwrap_or_else(|e| panic!("{name}: {e}")) {
            Attempt::Granted { fence, .. } => {
                assert_ne!(name, &taken, "a held key was granted in a group");
                let seen = node.inspect(name).await.unwrap().expect("held");
                assert_eq!(seen.owner, Some(*owner), "{name}");
                assert_eq!(seen.fence, Some(fence), "{name}");
            }
            Attempt::Taken { .. } => assert_eq!(name, &taken, "{name} refused"),
        }
    }
    let releases =
        futures::future::join_all(names.iter().zip(&owners).map(|(n, o)| node.release(n, *o)))
            .await;
    for (name, released) in names.iter().zip(releases) {
        assert_eq!(released.unwrap(), name != &taken, "{name}");
    }
    for name in &names {
        assert_eq!(node.inspect(name).await.unwrap().is_some(), name == &taken);
    }
    acquiring
}

/// A release through a backend connected through one node wakes, through the release
/// notice, a waiter whose backend is connected through another node, while the lock lives
/// on a third: the `PUBLISH` crosses the cluster bus. Long before the 30 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_connected_through_another_node() {
    let (cluster, _turn) = cluster().await;
    let seeds = cluster.seeds();
    let via = |i: usize| {
        RedisBackend::cluster_builder([seeds[i].clone()])
            .prefix("wake:")
            .build()
    };
    let (a, b) = (via(0).await.unwrap(), via(1).await.unwrap());
    let names: Vec<String> = (0..).map(|i| format!("wake/{i}")).take(64).collect();
    let mut name = None;
    for n in &names {
        if cluster.master_of_key(&a.node().lock_key(n)).await == 2 {
            name = Some(n.clone());
            break;
        }
    }
    let name = name.expect("one of 64 names lives on node 2");
    let (a, b) = (Locker::new(a), Locker::new(b));
    let ttl = Duration::from_secs(30);
    for round in 0..3 {
        let guard = a
            .acquire(&name, &LockOptions::new().ttl(ttl))
            .await
            .unwrap();
        let waiter = {
            let (b, name) = (b.clone(), name.clone());
            tokio::spawn(async move {
                let opts = LockOptions::new()
                    .ttl(ttl)
                    .wait_for(Duration::from_secs(10));
                let g = b.acquire(&name, &opts).await;
                (Instant::now(), g)
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released_at = Instant::now();
        guard.release().await.unwrap();
        let (granted_at, g) = waiter.await.unwrap();
        let g = g.expect("the waiter through node 1 gets the lock");
        let delay = granted_at - released_at;
        assert!(
            delay < Duration::from_secs(2),
            "round {round}: hand-off across nodes took {delay:?}"
        );
        g.release().await.unwrap();
    }
}

/// An election whose lock lives on node 2: its value lives on the same master (one slot),
/// and a follower whose backend is connected through node 1 observes, through the notices
/// crossing the cluster bus, every change made by a leader connected through node 0 (a
/// campaign, a proclamation, a resignation), each within 2 s of a 30 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_connected_through_another_node_observes_the_leader() {
    let (cluster, _turn) = cluster().await;
    let seeds = cluster.seeds();
    let via = |i: usize| {
        RedisBackend::cluster_builder([seeds[i].clone()])
            .prefix("elect:")
            .build()
    };
    let (a, b) = (via(0).await.unwrap(), via(1).await.unwrap());
    let mut name = None;
    for n in (0..64).map(|i| format!("elect/{i}")) {
        if cluster.master_of_key(&a.node().lock_key(&n)).await == 2 {
            name = Some(n);
            break;
        }
    }
    let name = name.expect("one of 64 names lives on node 2");
    assert_eq!(
        cluster.master_of_key(&a.node().leader_key(&name)).await,
        2,
        "the value lives beside its lock"
    );
    let (leading, following) = (Locker::new(a), Locker::new(b));
    let mut watch = following.election(&name).unwrap().observe();
    async fn next(watch: &mut distlock::LeaderWatch) -> Option<(Vec<u8>, u64)> {
        tokio::time::timeout(Duration::from_secs(2), watch.changed())
            .await
            .expect("observed within 2 s")
            .unwrap()
            .map(|l| (l.value, l.term))
    }
    assert_eq!(next(&mut watch).await, None);
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_for(Duration::from_secs(5));
    let mut leadership = leading
        .election(&name)
        .unwrap()
        .campaign("a1", &opts)
        .await
        .unwrap();
    let term = leadership.term();
    assert_eq!(next(&mut watch).await, Some((b"a1".to_vec(), term)));
    leadership.proclaim("a2").await.unwrap();
    assert_eq!(next(&mut watch).await, Some((b"a2".to_vec(), term)));
    leadership.resign().await.unwrap();
    assert_eq!(next(&mut watch).await, None, "the resignation is observed");
    leading.shutdown().await;
}

/// Bad cluster configurations are typed `InvalidUrl` errors, before any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_cluster_urls_are_refused() {
    for (url, needle) in [
        ("redis+cluster://127.0.0.1:1/2", "only database 0"),
        (
            "redis+cluster://127.0.0.1:1,127.0.0.1:2/0",
            "only database 0",
        ),
        ("redis+cluster://127.0.0.1:1?db=2", "unknown parameter `db`"),
        ("redis+cluster://127.0.0.1:1?timeout=0s", "timeout"),
        ("redis+cluster://", "at least one seed"),
    ] {
        match distlock::connect(url).await {
            Err(Error::InvalidUrl { reason, .. }) => {
                assert!(reason.contains(needle), "{url}: {reason}")
            }
            other => panic!("{url}: expected InvalidUrl, got {:?}", other.err()),
        }
    }
    for (builder, needle) in [
        (
            RedisBackend::cluster_builder(["127.0.0.1:1"]).database(3),
            "only database 0",
        ),
        (
            RedisBackend::cluster_builder(["127.0.0.1:1"]).tls(true),
            "TLS",
        ),
        (
            RedisBackend::cluster_builder(Vec::<String>::new()),
            "at least one seed",
        ),
        (RedisBackend::cluster_builder(["h:99999"]), "port"),
    ] {
        match builder.build().await {
            Err(Error::InvalidUrl { reason, .. }) => {
                assert!(reason.contains(needle), "{reason}")
            }
            other => panic!("expected InvalidUrl, got {:?}", other.err()),
        }
    }
    // A cluster configuration round-trips through its URL, password hidden in Debug.
    let b = RedisBackend::cluster_builder(["a:7000", "b"])
        .password("pw")
        .prefix("p:");
    assert_eq!(
        b.url().unwrap(),
        "redis+cluster://:pw@a:7000,b:6379?prefix=p%3A"
    );
    assert!(!format!("{b:?}").contains("pw"), "{b:?}");
    let back = distlock::redis::RedisBuilder::from_url(
        &distlock::LockUrl::parse(&b.url().unwrap()).unwrap(),
    )
    .unwrap();
    assert_eq!(back, b);
    assert!(back.is_cluster());
}

/// One seed node is enough to find the whole cluster: locks on every master are taken
/// and released through a backend given only one node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_seed_finds_the_cluster() {
    let (cluster, _turn) = cluster().await;
    let url = format!("redis+cluster://{}?prefix=one%3A", cluster.seeds()[1]);
    let locker = Locker::new(backend(&url).await);
    let node = backend(&url).await.node().clone();
    let mut masters = std::collections::HashSet::new();
    for i in 0..24 {
        let name = format!("one/{i}");
        let guard = locker.acquire(&name, &LockOptions::new()).await.unwrap();
        masters.insert(cluster.master_of_key(&node.lock_key(&name)).await);
        guard.release().await.unwrap();
    }
    assert_eq!(masters.len(), 3, "locks on every master through one seed");
}

/// An unreachable cluster is the transient `Unavailable`, within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_is_unavailable() {
    let started = Instant::now();
    let err = RedisBackend::cluster_builder(["127.0.0.1:1"])
        .timeout(Duration::from_millis(300))
        .build()
        .await
        .expect_err("nothing listens on port 1");
    assert!(err.is_transient(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}
