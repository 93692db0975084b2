//! The Redis backend against real `redis-server` processes from lock-testkit: the whole
//! conformance suite (directly, through `Arc<dyn Backend>`, through `distlock::connect`, and
//! with a raw `DEL` taking locks away), the shared fault rules (restart with and without
//! persistence, kill, pause, blackholed network), the Redis-specific faults (a restart
//! from a stale RDB snapshot, abandoned acquires arriving late), semaphores and
//! reader-writer keys beside locks, the raw baseline and the bad-input tests.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::{calls, raw_exists, redis_backend as backend, skip, Proxied, SLACK};
use distlock::claims::from_fire_millis;
use distlock::redis::{RedisBackend, RedisNode, CAPABILITIES, DEFAULT_TIMEOUT, MAX_FENCE};
use distlock::{
    Admin, Attempt, Backend, Error, HandOver, Lease, LockOptions, Locker, Owner, Permits,
};
use lock_conformance::{
    self as conformance, queued_holder, queued_holder_and_waiter, run_all, run_faults, Faults,
    Target,
};
use lock_testkit::{EtcdServer, FaultProxy, ProxyMode, RedisOptions, RedisServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A bare node of `server` whose keys start with `prefix`.
async fn node(server: &RedisServer, prefix: &str) -> RedisNode {
    RedisBackend::builder(server.addr().to_string())
        .prefix(prefix)
        .build_node()
        .await
        .expect("connect to the test server")
}

async fn connect_err(url: &str) -> Error {
    match distlock::connect(url).await {
        Ok(locker) => panic!("{url}: connected to {locker:?}"),
        Err(e) => {
            eprintln!("{url}: {e}");
            e
        }
    }
}

/// `ttl` as the Redis backend accepts it, for calls on a node.
fn valid_ttl(ttl: Duration) -> distlock::Ttl {
    CAPABILITIES.effective_ttl(ttl).expect("a valid TTL")
}

// ---------------------------------------------------------------------------------------
// Conformance
// ---------------------------------------------------------------------------------------

/// The whole suite on a backend used directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_direct() {
    let server = RedisServer::start().await;
    common::conformance_direct(backend(&server.url()).await).await;
}

/// The safety rules (hand-over, serialized operations, queue entries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safety_rules() {
    let server = RedisServer::start().await;
    conformance::run_safety(&Target::new(Arc::new(backend(&server.url()).await))).await;
}

/// The whole suite through `Arc<dyn Backend>` (the blanket impl forwards every call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_arc_dyn() {
    let server = RedisServer::start().await;
    common::conformance_through_arc_dyn(backend(&server.url()).await).await;
}

/// The whole suite through the facade's `connect(url)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_connect() {
    let server = RedisServer::start().await;
    let url = format!("{}?prefix=conformance%3A&timeout=2s", server.url());
    common::conformance_through_connect(&url, |caps| assert_eq!(caps, &CAPABILITIES)).await;
}

/// The whole suite with locks taken away by a raw `DEL` of the lock key on the server (no
/// release notice, nothing the backend knows about): only the server state matters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_with_raw_del_as_revoke() {
    let server = RedisServer::start().await;
    let backend = Arc::new(backend(&server.url()).await);
    let node = backend.node().clone();
    let raw = server.client().await;
    let target = Target::new(backend).with_revoke(move |key| {
        let mut raw = raw.clone();
        let lock_key = node.lock_key(&key);
        async move {
            let deleted: i64 = redis::cmd("DEL")
                .arg(&lock_key)
                .query_async(&mut raw)
                .await
                .expect("raw DEL");
            assert_eq!(deleted, 1, "the lock of {key} lives at {lock_key}");
        }
    });
    run_all(&target).await;
}

/// The whole suite on a current-thread runtime (the subscription task shares the thread).
#[tokio::test(flavor = "current_thread")]
async fn conformance_on_a_current_thread_runtime() {
    let server = RedisServer::start().await;
    run_all(&Target::new(Arc::new(backend(&server.url()).await))).await;
}

// ---------------------------------------------------------------------------------------
// Protocol details
// ---------------------------------------------------------------------------------------

/// A release in one process (backend) hands the lock to a waiter in another through the
/// pub/sub notice, long before the holder's TTL would have woken it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notice_reaches_another_process() {
    let server = RedisServer::start().await;
    let a = Target::new(Arc::new(backend(&server.url()).await));
    let b = Target::new(Arc::new(backend(&server.url()).await));
    conformance::release_wakes_a_waiter_on_another_instance(&a, &b).await;
}

/// A release is announced only when someone waited for it: an uncontended cycle publishes
/// nothing (so it wakes no subscriber anywhere), while a waiter of another process, whose
/// refusal marked the lock awaited, is woken by the notice long before the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_awaited_release_is_announced() {
    let server = RedisServer::start().await;
    let a = Arc::new(backend(&server.url()).await);
    let (mine, other) = (
        Locker::with_backend(a.clone()),
        Locker::new(backend(&server.url()).await),
    );
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_for(Duration::from_secs(20));
    let before = calls(&server, "publish").await;
    for _ in 0..10 {
        mine.acquire("quiet", &opts)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    assert_eq!(calls(&server, "publish").await, before, "nobody waited");

    let holder = mine.acquire("awaited", &opts).await.unwrap();
    let waiter = conformance::spawn_acquire(&other, "awaited", &opts);
    let key = a.node().lock_key("awaited");
    let marked = format!("{}*", holder.lease().owner());
    let until = Instant::now() + Duration::from_secs(5);
    while raw_string(&server, &key).await.as_deref() != Some(marked.as_str()) {
        assert!(Instant::now() < until, "the refusal marks the lock awaited");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen = a.inspect("awaited").await.unwrap().pop().expect("held");
    assert_eq!(
        seen.owner,
        Some(holder.lease().owner()),
        "inspect hides the mark"
    );
    holder
        .extend(Duration::from_secs(10))
        .await
        .expect("a marked lock is still ours");
    let released = Instant::now();
    holder.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("woken by the notice, long before the 10 s TTL")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(3));
    assert_eq!(calls(&server, "publish").await, before + 1, "one notice");
    next.release().await.unwrap();
}

/// Two backends built over ONE node (a shared connection, e.g. an application handing the
/// same `RedisNode` to two Lockers) hear each other's releases: a waiter on one is woken by
/// the other's release at once, not at the holder's 30 s TTL. (They shared the node's
/// notice origin, so each one's subscription skipped the other's notices as its own.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_sharing_a_node_hear_each_others_releases() {
    let server = RedisServer::start().await;
    let shared = node(&server, "shared:").await;
    let a = Arc::new(RedisBackend::from_node(shared.clone()));
    let b = RedisBackend::from_node(shared);
    let (holder_side, waiter_side) = (Locker::with_backend(a.clone()), Locker::new(b));
    let ttl = Duration::from_secs(30);
    let opts = LockOptions::new()
        .ttl(ttl)
        .wait_for(Duration::from_secs(25))
        .watchdog(false);
    for round in 0..3 {
        let holder = holder_side.acquire("k", &opts).await.unwrap();
        let waiter = conformance::spawn_acquire(&waiter_side, "k", &opts);
        // The waiter's refusal marks the lock awaited: from then on the release publishes.
        let key = a.node().lock_key("k");
        let marked = format!("{}*", holder.lease().owner());
        let until = Instant::now() + Duration::from_secs(10);
        while raw_string(&server, &key).await.as_deref() != Some(marked.as_str()) {
            assert!(Instant::now() < until, "the refusal marks the lock awaited");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        holder.release().await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap_or_else(|_| {
                panic!("round {round}: the waiter was not woken by the release (TTL {ttl:?})")
            })
            .unwrap()
            .unwrap();
        next.release().await.unwrap();
    }
}

/// `inspect` reports the holder's owner token, fence and remaining time; `None` when free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reports_the_holder() {
    let server = RedisServer::start().await;
    let locker = Locker::new(backend(&server.url()).await);
    let backend = locker.backend().clone();
    let backend = backend.admin().expect("admin");
    assert_eq!(backend.inspect("inspect/x").await.unwrap(), vec![]);
    let guard = locker
        .acquire("inspect/x", &skip(Duration::from_secs(10)))
        .await
        .unwrap();
    let holder = backend
        .inspect("inspect/x")
        .await
        .unwrap()
        .pop()
        .expect("held");
    assert_eq!(holder.owner, Some(guard.lease().owner()));
    assert_eq!(holder.fence, Some(guard.fence()));
    let left = holder.expires_in.expect("the lock has a TTL");
    assert!(left <= Duration::from_secs(10) && left > Duration::from_secs(9));
    guard.release().await.unwrap();
    assert_eq!(backend.inspect("inspect/x").await.unwrap(), vec![]);
}

/// The raw baseline (`SET NX PX` + `DEL`) never touches a lock: raw cycles on a held
/// lock's name leave the holder, its fence, its expiry and every key of the protocol as
/// they were, and leave no key behind; a cycle cut off after its `SET` leaves only the raw
/// key, expiring at the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raw_baseline_leaves_locks_alone_and_nothing_behind() {
    let server = RedisServer::start().await;
    let backend = Arc::new(backend(&server.url()).await);
    let locker = Locker::with_backend(backend.clone());
    let raw = backend.baseline().expect("redis has a raw baseline");
    assert_eq!(raw.description(), distlock::redis::BASELINE_CYCLE);
    let ttl = valid_ttl(Duration::from_secs(5));
    let guard = locker
        .acquire("raw/held", &skip(Duration::from_secs(10)))
        .await
        .unwrap();
    let mut redis = server.client().await;
    let keys = |mut redis: redis::aio::MultiplexedConnection| async move {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut redis)
            .await
            .unwrap();
        keys.sort();
        keys
    };
    let before = keys(redis.clone()).await;
    let held = backend
        .inspect("raw/held")
        .await
        .unwrap()
        .pop()
        .expect("held");
    for _ in 0..10 {
        raw.raw_cycle("raw/held", ttl).await.unwrap();
        raw.raw_cycle("raw/free", ttl).await.unwrap();
    }
    assert_eq!(keys(redis.clone()).await, before, "raw cycles left keys");
    let after = backend
        .inspect("raw/held")
        .await
        .unwrap()
        .pop()
        .expect("still held");
    assert_eq!(after.owner, held.owner);
    assert_eq!(after.fence, held.fence);
    assert!(after.expires_in <= held.expires_in);
    assert!(!guard.is_lost());

    let node = backend.node();
    let raw_key = node.baseline_key("raw/held");
    assert_eq!(raw_key, "distlock:{raw/held}:baseline");
    node.raw_set("raw/held", ttl).await.unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&raw_key)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(pttl > 0 && pttl <= 5_000, "{pttl}");
    // A second write finds it there and changes nothing; the delete removes it.
    node.raw_set("raw/held", ttl).await.unwrap();
    node.raw_del("raw/held").await.unwrap();
    assert!(!raw_exists(&server, &raw_key).await);
    guard.release().await.unwrap();
}

/// A raw cycle on a server that does not answer fails with the transient `Unavailable`
/// within the backend's timeout, as the lock's operations do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_cycle_on_a_paused_server_fails_within_the_timeout() {
    let server = RedisServer::start().await;
    let timeout = Duration::from_millis(200);
    let backend = RedisBackend::builder(server.addr().to_string())
        .timeout(timeout)
        .build()
        .await
        .unwrap();
    let ttl = valid_ttl(Duration::from_secs(5));
    server.pause();
    let started = Instant::now();
    let result = backend.baseline().unwrap().raw_cycle("raw/k", ttl).await;
    let took = started.elapsed();
    server.resume();
    assert!(
        matches!(result, Err(Error::Unavailable { .. })),
        "{result:?}"
    );
    assert!(took >= timeout && took <= timeout + SLACK, "{took:?}");
}

/// `raise_fence` lifts a key's counter (what Redlock writes back to a majority): the next
/// grant's fence is above it; raising to a lower value changes nothing; fences above 2^53
/// are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raise_fence_lifts_the_next_fence() {
    let server = RedisServer::start().await;
    let node = node(&server, "raise:").await;
    let ttl = valid_ttl(Duration::from_secs(5));
    let owner = Owner::random();
    let first = match node.try_acquire("k", owner, ttl).await.unwrap() {
        distlock::Attempt::Granted { fence, .. } => fence,
        taken => panic!("free key refused: {taken:?}"),
    };
    assert!(node.release("k", owner).await.unwrap());
    assert!(node.raise_fence("k", first + 1_000_000, ttl).await.unwrap());
    assert!(!node.raise_fence("k", first, ttl).await.unwrap());
    let owner = Owner::random();
    match node.try_acquire("k", owner, ttl).await.unwrap() {
        distlock::Attempt::Granted { fence, .. } => assert!(fence > first + 1_000_000),
        taken => panic!("free key refused: {taken:?}"),
    }
    // Asking again with the same owner is idempotent (a re-sent request after a lost reply).
    let again = node.try_acquire("k", owner, ttl).await.unwrap();
    assert!(
        matches!(again, distlock::Attempt::Granted { .. }),
        "{again:?}"
    );
    assert!(node.release("k", owner).await.unwrap());
    assert!(!node.release("k", owner).await.unwrap());
    assert!(matches!(
        node.raise_fence("k", MAX_FENCE + 1, ttl).await,
        Err(Error::Backend { .. })
    ));
    assert!(raw_exists(&server, &node.fence_key("k")).await);
    assert_eq!(node.fence_key("k"), "raise:{k}:fence");
    assert_eq!(node.lock_key("k"), "raise:{k}");
}

/// Concurrent acquires and releases on one node go to the server in groups (one script
/// call for several locks), and each caller still gets its own answer: grants with their
/// own fences, refusals for the keys already held, releases only of its own locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_operations_are_grouped_with_their_own_answers() {
    let server = RedisServer::start().await;
    let node: RedisNode = RedisBackend::builder(server.addr().to_string())
        .build_node()
        .await
        .unwrap();
    let ttl = valid_ttl(Duration::from_secs(10));
    let holder = Owner::random();
    assert!(matches!(
        node.try_acquire("group/taken", holder, ttl).await.unwrap(),
        distlock::Attempt::Granted { .. }
    ));
    let before = calls(&server, "evalsha").await;
    let names: Vec<String> = (0..48)
        .map(|i| format!("group/{i}"))
        .chain(["group/taken".to_owned()])
        .collect();
    let owners: Vec<Owner> = names.iter().map(|_| Owner::random()).collect();
    let attempts = futures::future::join_all(
        names
            .iter()
            .zip(&owners)
            .map(|(n, o)| node.try_acquire(n, *o, ttl)),
    )
    .await;
    let acquiring = calls(&server, "evalsha").await - before;
    let mut granted = 0;
    for ((name, owner), attempt) in names.iter().zip(&owners).zip(attempts) {
        match attempt.unwrap() {
            distlock::Attempt::Granted { fence, .. } => {
                assert_ne!(name, "group/taken", "a held key was granted in a group");
                // Its own answer: the server holds this key for this caller, at this fence
                // (fences of different keys may be equal: one clock reading per group).
                let seen = node.inspect(name).await.unwrap().expect("held");
                assert_eq!(seen.owner, Some(*owner), "{name}");
                assert_eq!(seen.fence, Some(fence), "{name}");
                granted += 1;
            }
            distlock::Attempt::Taken { expires_in } => {
                assert_eq!(name, "group/taken", "{name} refused");
                assert!(expires_in.is_some_and(|e| e > Duration::from_secs(9)));
            }
        }
    }
    assert_eq!(granted, 48, "every free key granted");
    // Each caller releases its own lock, and "taken" with the wrong owner is refused.
    let before = calls(&server, "evalsha").await;
    let releases =
        futures::future::join_all(names.iter().zip(&owners).map(|(n, o)| node.release(n, *o)))
            .await;
    for (name, released) in names.iter().zip(releases) {
        assert_eq!(released.unwrap(), name != "group/taken", "{name}");
    }
    assert!(raw_exists(&server, &node.lock_key("group/taken")).await);
    assert!(!raw_exists(&server, &node.lock_key("group/0")).await);
    let used = acquiring + calls(&server, "evalsha").await - before;
    assert!(
        used < 2 * 49 / 2,
        "98 concurrent operations took {used} script calls: not grouped"
    );
}

/// The type of the value at `key` (`none` when there is none).
async fn raw_type(server: &RedisServer, key: &str) -> String {
    let mut raw = server.client().await;
    redis::cmd("TYPE")
        .arg(key)
        .query_async(&mut raw)
        .await
        .unwrap()
}

/// The string at `key`, `None` when missing or of another type.
async fn raw_string(server: &RedisServer, key: &str) -> Option<String> {
    if raw_type(server, key).await != "string" {
        return None;
    }
    let mut raw = server.client().await;
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut raw)
        .await
        .unwrap()
}

/// Stores a list (a value of the wrong type for the lock protocol) at `key`.
async fn raw_list(server: &RedisServer, key: &str) {
    let mut raw = server.client().await;
    let _: redis::Value = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: redis::Value = redis::cmd("RPUSH")
        .arg(key)
        .arg("foreign")
        .query_async(&mut raw)
        .await
        .unwrap();
}

/// Concurrent acquires grouped into one script call, one of them on a lock key holding a
/// foreign list (WRONGTYPE) and one whose holder asks again while its fence counter holds
/// a foreign list: each caller gets the answer it gets alone (the list key: its own
/// error; the holder: its grant; everyone else: a grant), and no caller that got an error
/// is left holding a lock (an error half-way through the script used to abort it after
/// the earlier grants of the group were written: orphaned locks nobody was told about).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_type_in_an_acquire_group_fails_only_its_own_caller() {
    let server = RedisServer::start().await;
    let node = node(&server, "wrongtype:").await;
    let ttl = valid_ttl(Duration::from_secs(10));
    let holder = Owner::random();
    assert!(matches!(
        node.try_acquire("wt/again", holder, ttl).await.unwrap(),
        distlock::Attempt::Granted { .. }
    ));
    raw_list(&server, &node.fence_key("wt/again")).await;
    raw_list(&server, &node.lock_key("wt/list")).await;
    let mut names: Vec<String> = (0..40).map(|i| format!("wt/{i}")).collect();
    names.insert(20, "wt/list".into());
    names.insert(30, "wt/again".into());
    let owners: Vec<Owner> = names
        .iter()
        .map(|n| {
            if n == "wt/again" {
                holder
            } else {
                Owner::random()
            }
        })
        .collect();
    let before = calls(&server, "evalsha").await;
    let attempts = futures::future::join_all(
        names
            .iter()
            .zip(&owners)
            .map(|(n, o)| node.try_acquire(n, *o, ttl)),
    )
    .await;
    let used = calls(&server, "evalsha").await - before;
    assert!(
        used < 20,
        "42 concurrent acquires took {used} calls: not grouped"
    );
    let mut failed = Vec::new();
    for ((name, owner), attempt) in names.iter().zip(&owners).zip(&attempts) {
        if attempt.is_err() {
            let left = raw_string(&server, &node.lock_key(name)).await;
            if left == Some(owner.to_string()) {
                failed.push(format!("{name} (its lock left behind)"));
            } else {
                failed.push(name.clone());
            }
        }
    }
    assert_eq!(
        failed,
        ["wt/list"],
        "only the caller on the foreign key fails: {attempts:?}"
    );
    for ((name, owner), attempt) in names.iter().zip(&owners).zip(attempts) {
        match attempt {
            Ok(distlock::Attempt::Granted { fence, .. }) => {
                assert!(fence > 0);
                assert_eq!(
                    raw_string(&server, &node.lock_key(name)).await,
                    Some(owner.to_string())
                );
            }
            Ok(taken) => panic!("{name}: {taken:?}"),
            Err(e) => {
                assert_eq!(name, "wt/list");
                assert!(matches!(e, Error::Backend { .. }), "{e:?}");
                assert!(e.report().to_string().contains("WRONGTYPE"), "{e}");
            }
        }
    }
    assert_eq!(raw_type(&server, &node.lock_key("wt/list")).await, "list");
}

/// Concurrent releases grouped into one script call, one of them of a lock key holding a
/// foreign list: that caller gets its own error, every other caller's lock is deleted
/// (an error half-way used to abort the script, leaving the later locks of the group in
/// place while their callers were told the release failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_type_in_a_release_group_fails_only_its_own_caller() {
    let server = RedisServer::start().await;
    let node = node(&server, "wrongtype:").await;
    let ttl = valid_ttl(Duration::from_secs(10));
    let mut names: Vec<String> = (0..40).map(|i| format!("wtr/{i}")).collect();
    let owners: Vec<Owner> = names.iter().map(|_| Owner::random()).collect();
    for (name, owner) in names.iter().zip(&owners) {
        assert!(matches!(
            node.try_acquire(name, *owner, ttl).await.unwrap(),
            distlock::Attempt::Granted { .. }
        ));
    }
    raw_list(&server, &node.lock_key("wtr/list")).await;
    names.insert(20, "wtr/list".into());
    let mut owners = owners;
    owners.insert(20, Owner::random());
    let before = calls(&server, "evalsha").await;
    let releases =
        futures::future::join_all(names.iter().zip(&owners).map(|(n, o)| node.release(n, *o)))
            .await;
    let used = calls(&server, "evalsha").await - before;
    assert!(
        used < 20,
        "41 concurrent releases took {used} calls: not grouped"
    );
    let mut left = Vec::new();
    for name in &names {
        if name != "wtr/list" && raw_exists(&server, &node.lock_key(name)).await {
            left.push(name.clone());
        }
    }
    assert!(left.is_empty(), "locks left after their release: {left:?}");
    for (name, released) in names.iter().zip(releases) {
        match released {
            Ok(true) => assert_ne!(name, "wtr/list"),
            Ok(false) => panic!("{name}: not held"),
            Err(e) => {
                assert_eq!(name, "wtr/list", "{e}");
                assert!(matches!(e, Error::Backend { .. }), "{e:?}");
                assert!(e.report().to_string().contains("WRONGTYPE"), "{e}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------------------

/// A target whose backend (and peer) reach one server through a fault proxy, with the
/// hooks of a server without persistence (a restart loses the locks) or with it (a restart
/// keeps them), and kill, pause and blackhole.
async fn fault_target(options: RedisOptions) -> Target {
    let server = Proxied::new(vec![RedisServer::start_with(options).await]).await;
    let url = format!("redis://{}", server.addrs()[0]);
    // The default request timeout (1 s) is longer than the rules' 500 ms wait: the wait's
    // deadline, not the backend timeout, bounds that acquire.
    let faults = Faults::new(DEFAULT_TIMEOUT)
        .slack(SLACK)
        .peer(Arc::new(backend(&url).await));
    let faults = server.hooks(faults).await;
    Target::new(Arc::new(backend(&url).await)).with_faults(faults)
}

/// The shared fault rules on one server without persistence: restart (empty, empty script
/// cache), kill, pause (SIGSTOP) and a blackholed network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules() {
    let target = fault_target(RedisOptions::default()).await;
    run_faults(&target)
        .await
        .assert_not_run(&["a_lock_survives_a_restart_that_keeps_the_locks"]);
}

/// The shared fault rules on one server with persistence (append-only file, fsync
/// always): the locks survive a restart, and kill, pause and blackhole as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules_with_persistence() {
    let target = fault_target(RedisOptions {
        persistent: true,
        ..RedisOptions::default()
    })
    .await;
    run_faults(&target).await.assert_not_run(&[
        "a_restart_that_loses_the_locks_leaves_holders_not_held",
        "waiters_wake_after_a_restart_that_loses_the_locks",
    ]);
}

/// An acquire that timed out and was abandoned, whose request reaches the server only AFTER
/// its clean-up (it sat in a socket buffer on the discarded connection; the clean-up went
/// on another one): the late request must not grant. Reproduced deterministically with the
/// acquire's connection behind a proxy that holds its bytes, and the clean-up on a direct
/// connection. A plain release there (the old clean-up) finds nothing, and the late
/// acquire then leaves an orphaned lock for its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_acquire_arriving_after_its_abandon_grants_nothing() {
    let server = RedisServer::start().await;
    let proxy = FaultProxy::start(server.addr()).await;
    let late = RedisBackend::builder(proxy.addr().to_string())
        .timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let direct = backend(&server.url()).await;
    let lock_key = direct.node().lock_key("abandon/late");
    // Load the acquire script, so that the late EVALSHA runs rather than meet NOSCRIPT.
    let warm = Owner::random();
    direct
        .try_acquire(
            "abandon/warm",
            warm,
            distlock::Permits::LOCK,
            valid_ttl(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let owner = Owner::random();
    proxy.set_mode(ProxyMode::Blackhole);
    let e = late
        .try_acquire(
            "abandon/late",
            owner,
            distlock::Permits::LOCK,
            valid_ttl(Duration::from_secs(30)),
        )
        .await
        .expect_err("no answer through the blackhole");
    assert!(e.is_transient(), "{e}");
    direct
        .abandon("abandon/late", owner)
        .await
        .expect("the abandon reaches the server");
    let before = calls(&server, "evalsha").await + calls(&server, "eval").await;
    proxy.set_mode(ProxyMode::Pass);
    // The held acquire is delivered now.
    let deadline = Instant::now() + Duration::from_secs(5);
    while calls(&server, "evalsha").await + calls(&server, "eval").await == before {
        assert!(Instant::now() < deadline, "the held acquire never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !raw_exists(&server, &lock_key).await,
        "the late acquire of an abandoned attempt left an orphaned lock"
    );
    // The key is free for everyone else.
    let other = Owner::random();
    assert!(matches!(
        direct
            .try_acquire(
                "abandon/late",
                other,
                distlock::Permits::LOCK,
                valid_ttl(Duration::from_secs(5))
            )
            .await
            .unwrap(),
        distlock::Attempt::Granted { .. }
    ));
}

/// The scenario of a paused server (SIGSTOP): an acquire times out with its request in the
/// server's socket buffer, the connection is discarded, and `abandon` goes on a new one;
/// after SIGCONT the key is not left held, whichever request the server reads first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_abandoned_on_a_paused_server_leaves_no_lock() {
    let server = RedisServer::start().await;
    let backend = RedisBackend::builder(server.addr().to_string())
        .timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let lock_key = backend.node().lock_key("abandon/paused");
    let patient = RedisBackend::from_node(backend.node().with_timeout(Duration::from_secs(5)));
    let warm = Owner::random();
    backend
        .try_acquire(
            "abandon/warm",
            warm,
            distlock::Permits::LOCK,
            valid_ttl(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let owner = Owner::random();
    server.pause();
    let e = backend
        .try_acquire(
            "abandon/paused",
            owner,
            distlock::Permits::LOCK,
            valid_ttl(Duration::from_secs(30)),
        )
        .await
        .expect_err("a paused server does not answer");
    assert!(e.is_transient(), "{e}");
    let abandon = tokio::spawn(async move { patient.abandon("abandon/paused", owner).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.resume();
    abandon.await.unwrap().expect("abandon after the resume");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !raw_exists(&server, &lock_key).await,
        "an abandoned acquire left its lock behind"
    );
}

/// Fencing tokens keep increasing across a restart that restores an OLDER fence counter
/// (an RDB snapshot taken before the last grants; AOF `everysec` and a promoted async
/// replica do the same): grants a, b, c; snapshot; grants d, e, f; kill -9; restart from
/// the snapshot. The counter is back at c's token, and the next grants must still be above
/// f's, not re-issue d's and e's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_across_a_restart_from_a_stale_snapshot() {
    let mut server = RedisServer::start_with(RedisOptions {
        rdb: true,
        ..RedisOptions::default()
    })
    .await;
    let backend = backend(&server.url()).await;
    let fence_key = backend.node().fence_key("stale/k");
    let locker = Locker::new(backend);
    let mut fences = Vec::new();
    let grant = |fences: &mut Vec<u64>, g: distlock::LockGuard| {
        fences.push(g.fence());
        g
    };
    for round in 0..2 {
        for _ in 0..3 {
            let g = locker
                .acquire("stale/k", &skip(Duration::from_secs(10)))
                .await
                .unwrap();
            grant(&mut fences, g).release().await.unwrap();
        }
        if round == 0 {
            server.save().await;
        }
    }
    server.restart().await;
    assert!(
        raw_exists(&server, &fence_key).await,
        "the snapshot brought the (stale) counter back"
    );
    for _ in 0..3 {
        let g = locker
            .acquire("stale/k", &skip(Duration::from_secs(10)))
            .await
            .unwrap();
        grant(&mut fences, g).release().await.unwrap();
    }
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences must strictly increase across a restart from a stale snapshot: {fences:?}"
    );
}

/// A waiter queued behind a holder of the same Locker is handed the key in one script, by
/// the holder's release: the key is never deleted or announced free in between, the new
/// fence is higher, and `inspect` names the new holder. A stale holder (its key
/// overwritten behind its back) hands nothing over and its release reports `NotHeld`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_waiter_is_handed_the_key_in_one_script() {
    let server = RedisServer::start().await;
    let backend = Arc::new(backend(&server.url()).await);
    let locker = Locker::with_backend(backend.clone());
    let wait = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(Duration::from_secs(10))
        .watchdog(false);
    let settle = Duration::from_millis(200);
    let (holder, waiter) = queued_holder_and_waiter(&locker, "hand", &wait, settle).await;
    let (deletes, notices) = (calls(&server, "del").await, calls(&server, "publish").await);
    let fence = holder.fence();
    holder.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    assert!(next.fence() > fence);
    assert_eq!(calls(&server, "del").await, deletes, "never deleted");
    assert_eq!(
        calls(&server, "publish").await,
        notices,
        "never announced free"
    );
    let seen = backend.inspect("hand").await.unwrap().pop().expect("held");
    assert_eq!(seen.owner, Some(next.lease().owner()));
    next.release().await.unwrap();
    assert_eq!(calls(&server, "del").await, deletes + 1);

    // Overwritten behind the holder's back (another client, for 500 ms) before its waiter
    // queues: the hand-over at the release finds it out, and the waiter gets the key only
    // once it is free.
    let holder = queued_holder(&locker, "stale", &wait, settle).await;
    let mut raw = server.client().await;
    let stolen = backend.node().lock_key("stale");
    let _: () = redis::cmd("SET")
        .arg(&stolen)
        .arg("someone else")
        .arg("PX")
        .arg(500)
        .query_async(&mut raw)
        .await
        .unwrap();
    let waiter = conformance::spawn_acquire(&locker, "stale", &wait);
    tokio::time::sleep(settle).await;
    let fence = holder.fence();
    assert!(matches!(holder.release().await, Err(Error::NotHeld { .. })));
    let next = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("granted once the other owner's key expired")
        .unwrap()
        .unwrap();
    assert!(next.fence() > fence);
    next.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// Permits (semaphores, reader-writer keys)
// ---------------------------------------------------------------------------------------

/// `permits` of `key` for `ttl`, straight on the backend: the lease of the grant.
async fn grant(backend: &RedisBackend, key: &str, permits: Permits, ttl: Duration) -> Lease {
    let owner = Owner::random();
    match backend
        .try_acquire(key, owner, permits, valid_ttl(ttl))
        .await
        .unwrap()
    {
        Attempt::Granted { fence, valid_until } => {
            Lease::new(key, owner, fence, valid_until).with_permits(permits)
        }
        taken => panic!("{permits} of {key}: {taken:?}"),
    }
}

/// The reason of an `InvalidPermits` refusal (anything else fails the test).
fn invalid_permits(attempt: distlock::Result<Attempt>, what: &str) -> String {
    match attempt {
        Err(Error::InvalidPermits { reason }) => reason,
        other => panic!("{what}: {other:?}"),
    }
}

/// Whether any key of `name`'s permits (its holders, its permits hash) is on the server.
async fn permits_keys_left(server: &RedisServer, node: &RedisNode, name: &str) -> Vec<String> {
    let mut left = Vec::new();
    for key in [node.holders_key(name), node.permits_key(name)] {
        if raw_exists(server, &key).await {
            left.push(key);
        }
    }
    left
}

/// A key is held as a lock or with permits, never both: the permits script refuses a key
/// held as a lock, and the lock script a key held with permits, with `InvalidPermits`
/// naming what holds it, as is another number of permits; a full semaphore answers taken
/// with its earliest holder's time left; inspect lists each holder with its permits and
/// fence; a hand-over of permits is unsupported; fences keep climbing across both kinds;
/// and the last release leaves no key of the permits behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_held_as_a_lock_or_with_permits_never_both() {
    let server = RedisServer::start().await;
    let backend = backend(&server.url()).await;
    let node = backend.node().clone();
    let ttl = Duration::from_secs(10);
    let attempt = |key: &'static str, permits: Permits| {
        backend.try_acquire(key, Owner::random(), permits, valid_ttl(ttl))
    };
    let one = Permits::new(1, 3).unwrap();
    let two = Permits::new(2, 3).unwrap();
    let a = grant(&backend, "mix/sem", one, ttl).await;
    let b = grant(&backend, "mix/sem", two, ttl).await;
    assert!(b.fence() > a.fence());
    let reason = invalid_permits(attempt("mix/sem", Permits::LOCK).await, "a lock");
    assert!(reason.contains("not as a lock"), "{reason}");
    let other_of = Permits::new(1, 4).unwrap();
    let reason = invalid_permits(attempt("mix/sem", other_of).await, "1 of 4");
    assert!(reason.contains("held with 3 permits, not 4"), "{reason}");
    match attempt("mix/sem", one).await.unwrap() {
        Attempt::Taken {
            expires_in: Some(left),
        } => assert!(
            left <= ttl && left > ttl - Duration::from_secs(3),
            "{left:?}"
        ),
        other => panic!("a full semaphore: {other:?}"),
    }
    let mut seen = backend.inspect("mix/sem").await.unwrap();
    seen.sort_by_key(|h| h.fence);
    let seen: Vec<_> = seen.iter().map(|h| (h.owner, h.fence, h.permits)).collect();
    assert_eq!(
        seen,
        [
            (Some(a.owner()), Some(a.fence()), one),
            (Some(b.owner()), Some(b.fence()), two)
        ]
    );
    let handed = HandOver::hand_over(&backend, &a, Owner::random(), valid_ttl(ttl)).await;
    assert!(
        matches!(handed, Err(Error::Unsupported { .. })),
        "{handed:?}"
    );
    backend.release(&a).await.unwrap();
    assert!(matches!(
        backend.release(&a).await,
        Err(Error::NotHeld { .. })
    ));
    backend.extend(&b, valid_ttl(ttl)).await.unwrap();
    backend.release(&b).await.unwrap();
    assert!(matches!(
        backend.extend(&b, valid_ttl(ttl)).await,
        Err(Error::NotHeld { .. })
    ));
    assert_eq!(permits_keys_left(&server, &node, "mix/sem").await, [""; 0]);

    let lock = grant(&backend, "mix/sem", Permits::LOCK, ttl).await;
    assert!(lock.fence() > b.fence());
    for permits in [one, Permits::read(), Permits::write()] {
        let reason = invalid_permits(attempt("mix/sem", permits).await, "permits on a lock");
        assert!(reason.contains("held as a lock"), "{reason}");
    }
    assert_eq!(permits_keys_left(&server, &node, "mix/sem").await, [""; 0]);
    backend.release(&lock).await.unwrap();
    let reader = grant(&backend, "mix/sem", Permits::read(), ttl).await;
    assert!(reader.fence() > lock.fence());
    backend.release(&reader).await.unwrap();
    assert_eq!(permits_keys_left(&server, &node, "mix/sem").await, [""; 0]);
}

/// A release of permits is announced only when an attempt was refused since the last one:
/// uncontended cycles publish nothing, while a waiter of another process (its own backend
/// and subscription), whose refusal marked the key awaited, is woken by the notice long
/// before the holders' TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_wakes_a_waiter_of_another_process() {
    let server = RedisServer::start().await;
    let a = Arc::new(backend(&server.url()).await);
    let (mine, other) = (
        Locker::with_backend(a.clone()),
        Locker::new(backend(&server.url()).await),
    );
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(20))
        .wait_for(Duration::from_secs(20))
        .permits(Permits::new(1, 2).unwrap());
    let before = calls(&server, "publish").await;
    for _ in 0..5 {
        mine.acquire("quiet", &opts)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    assert_eq!(calls(&server, "publish").await, before, "nobody waited");

    let first = mine.acquire("wake", &opts).await.unwrap();
    let second = mine.acquire("wake", &opts).await.unwrap();
    let waiter = conformance::spawn_acquire(&other, "wake", &opts);
    let permits_key = a.node().permits_key("wake");
    let mut raw = server.client().await;
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let marked: bool = redis::cmd("HEXISTS")
            .arg(&permits_key)
            .arg("awaited")
            .query_async(&mut raw)
            .await
            .unwrap();
        if marked {
            break;
        }
        assert!(Instant::now() < until, "the refusal marks the key awaited");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let released = Instant::now();
    first.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("woken by the notice, long before the 20 s TTL")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(3));
    assert_eq!(calls(&server, "publish").await, before + 1, "one notice");
    next.release().await.unwrap();
    second.release().await.unwrap();
    assert_eq!(permits_keys_left(&server, a.node(), "wake").await, [""; 0]);
}

/// Abandoned attempts at permits leave nothing behind: a granted attempt abandoned gives
/// its own permits back (the other holder keeps its own); an attempt whose request reaches
/// the server only after its abandon (held in a proxy meanwhile) grants nothing; attempts
/// cancelled at random moments through a Locker leave no key once it shut down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_permit_attempts_leave_nothing() {
    let server = RedisServer::start().await;
    let proxy = FaultProxy::start(server.addr()).await;
    let late = RedisBackend::builder(proxy.addr().to_string())
        .timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let direct = backend(&server.url()).await;
    let node = direct.node().clone();
    let ttl = Duration::from_secs(30);
    let (one, two) = (Permits::new(1, 3).unwrap(), Permits::new(2, 3).unwrap());
    let kept = grant(&direct, "abandon/sem", one, ttl).await;
    let owner = Owner::random();
    let granted = direct
        .try_acquire("abandon/sem", owner, two, valid_ttl(ttl))
        .await
        .unwrap();
    assert!(matches!(granted, Attempt::Granted { .. }), "{granted:?}");
    direct.abandon("abandon/sem", owner).await.unwrap();
    let holders = direct.inspect("abandon/sem").await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].owner, Some(kept.owner()));
    let again = grant(&direct, "abandon/sem", two, ttl).await;
    direct.release(&again).await.unwrap();

    // The permits script is loaded: the late EVALSHA runs rather than meet NOSCRIPT.
    let owner = Owner::random();
    proxy.set_mode(ProxyMode::Blackhole);
    let e = late
        .try_acquire("abandon/sem", owner, two, valid_ttl(ttl))
        .await
        .expect_err("no answer through the blackhole");
    assert!(e.is_transient(), "{e}");
    direct.abandon("abandon/sem", owner).await.unwrap();
    let before = calls(&server, "evalsha").await + calls(&server, "eval").await;
    proxy.set_mode(ProxyMode::Pass);
    let deadline = Instant::now() + Duration::from_secs(5);
    while calls(&server, "evalsha").await + calls(&server, "eval").await == before {
        assert!(Instant::now() < deadline, "the held acquire never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let holders = direct.inspect("abandon/sem").await.unwrap();
    assert_eq!(holders.len(), 1, "the late attempt granted: {holders:?}");
    direct.release(&kept).await.unwrap();
    assert_eq!(
        permits_keys_left(&server, &node, "abandon/sem").await,
        [""; 0]
    );

    let locker = Locker::new(backend(&server.url()).await);
    let opts = LockOptions::new()
        .ttl(ttl)
        .wait_for(Duration::from_secs(5))
        .permits(two);
    for i in 0..60u64 {
        let attempt = locker.acquire("abandon/churn", &opts);
        // A guard granted in time is dropped at once (released in the background).
        let _ = tokio::time::timeout(Duration::from_micros(37 * i), attempt).await;
    }
    locker.shutdown().await;
    assert!(!raw_exists(&server, &node.lock_key("abandon/churn")).await);
    assert_eq!(
        permits_keys_left(&server, &node, "abandon/churn").await,
        [""; 0]
    );
}

// ---------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------

/// A port nobody listens on: `Unavailable` (transient) at once, naming the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_port_is_unavailable() {
    // Nothing listens there, and no server of the test kit will be given it.
    let port = lock_testkit::unused_port();
    let started = Instant::now();
    let e = connect_err(&format!("redis://127.0.0.1:{port}")).await;
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(e.report().to_string().contains("refused"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// A host name that does not resolve: an error within the timeout, no hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresolvable_host_fails_within_the_timeout() {
    let started = Instant::now();
    let e = connect_err("redis://no-such-host.invalid:6379?timeout=500ms").await;
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(started.elapsed() <= Duration::from_millis(500) + SLACK);
}

/// Wrong or missing password: a non-transient `Backend` error saying authentication was
/// refused, never showing the password; the right one connects, and `Debug` hides it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_a_clear_backend_error() {
    let server = RedisServer::start_with(RedisOptions {
        password: Some("s3cret-pw".into()),
        ..RedisOptions::default()
    })
    .await;
    let port = server.port();
    for url in [
        format!("redis://:not-it@127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}"),
        format!("redis://someone:s3cret-pw@127.0.0.1:{port}"),
    ] {
        let e = connect_err(&url).await;
        assert!(matches!(e, Error::Backend { .. }), "{url}: {e:?}");
        assert!(!e.is_transient());
        let text = e.report().to_string();
        assert!(text.contains("authentication"), "{url}: {text}");
        assert!(
            !text.contains("not-it") && !text.contains("s3cret"),
            "{text}"
        );
    }
    let right = backend(&server.url()).await;
    let shown = format!("{right:?} {:?}", right.node());
    assert!(
        !shown.contains("s3cret") && shown.contains(":***@"),
        "{shown}"
    );
    let locker = distlock::connect(&server.url())
        .await
        .expect("right password");
    let g = locker
        .acquire("auth/x", &skip(Duration::from_secs(1)))
        .await
        .unwrap();
    g.release().await.unwrap();
}

/// Malformed URLs and unknown parameters: `InvalidUrl`, before any I/O, password hidden.
#[tokio::test]
async fn malformed_urls_are_invalid_url() {
    for url in [
        "redis://",
        "redis://:pw-hidden@h:6379?unknown=1",
        "redis://h:6379?timeout=fast",
        "redis://h:6379?timeout=0s",
        "redis://h:6379/db",
        "redis://h:99999",
        "redis://h1:6379,h2:6379",
        "redis://h:6379#frag",
        "redis:/h:6379",
        "rediss://h:6379?prefix=a&tls=1",
    ] {
        match connect_err(url).await {
            Error::InvalidUrl { url: shown, .. } => {
                assert!(!shown.contains("pw-hidden"), "{shown}")
            }
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
    }
}

/// A server that answers with something other than RESP: a non-transient `Backend` error
/// saying so, quickly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_redis_server_is_a_clear_backend_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                    .await;
                tokio::time::sleep(Duration::from_secs(5)).await;
            });
        }
    });
    let started = Instant::now();
    let e = connect_err(&format!("redis://{addr}")).await;
    assert!(matches!(e, Error::Backend { .. }), "{e:?}");
    assert!(e.report().to_string().contains("Redis protocol"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(1));
    server.abort();
}

/// An etcd client port (HTTP/2, not RESP): an error within the timeout, no hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_port_is_not_redis() {
    let etcd = EtcdServer::start().await;
    let started = Instant::now();
    let e = connect_err(&format!("redis://{}?timeout=500ms", etcd.addr())).await;
    assert!(!matches!(e, Error::InvalidUrl { .. }), "{e:?}");
    assert!(started.elapsed() <= Duration::from_millis(500) + SLACK);
}

/// A server that accepts and never answers: `Unavailable` after the timeout, no hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_server_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let started = Instant::now();
    let e = connect_err(&format!("redis://{addr}?timeout=300ms")).await;
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(e.report().to_string().contains("no answer"), "{e}");
    assert!(started.elapsed() <= Duration::from_millis(300) + SLACK);
    server.abort();
}

/// `rediss://` against a plain-text Redis: an error within the timeout, no hang, no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_against_a_plain_server_fails_cleanly() {
    let server = RedisServer::start().await;
    let started = Instant::now();
    let e = connect_err(&format!(
        "rediss://127.0.0.1:{}?timeout=500ms",
        server.port()
    ))
    .await;
    assert!(
        matches!(e, Error::Unavailable { .. } | Error::Backend { .. }),
        "{e:?}"
    );
    assert!(started.elapsed() <= Duration::from_millis(500) + SLACK);
}

// ---------------------------------------------------------------------------------------
// Run records
// ---------------------------------------------------------------------------------------

/// Run records live at `<prefix>runs:{job}` (a list, trimmed by each append) and
/// `<prefix>runs:{job}:ok`, apart from the locks; a foreign value under either key is
/// `Error::Backend` (never a panic, never a record), and an append over a value of another
/// type fails without touching it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_records_have_keys_of_their_own_and_refuse_foreign_values() {
    use distlock::records::{RunOutcome, RunRecords};

    let server = RedisServer::start().await;
    let backend = backend(&format!("{}?prefix=rec%3A", server.url())).await;
    let node = backend.node().clone();
    let records: &dyn RunRecords = backend.run_records().expect("redis keeps run records");
    let job = "jobs/{nightly}";
    for n in 0..4 {
        let outcome = if n == 1 {
            RunOutcome::Ok
        } else {
            RunOutcome::Failed
        };
        records
            .append(&common::run_record(job, n, outcome), 2)
            .await
            .unwrap();
    }
    assert_eq!(node.runs_key(job), "rec:runs:{jobs/{nightly}}");
    assert_eq!(node.last_success_key(job), "rec:runs:{jobs/{nightly}}:ok");
    assert_eq!(raw_type(&server, &node.runs_key(job)).await, "list");
    assert_eq!(
        raw_type(&server, &node.last_success_key(job)).await,
        "string"
    );
    let mut raw = server.client().await;
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw)
        .await
        .unwrap();
    keys.sort();
    assert_eq!(
        keys,
        [node.runs_key(job), node.last_success_key(job)],
        "records write only their two keys, none a lock key would use"
    );
    let len: usize = redis::cmd("LLEN")
        .arg(node.runs_key(job))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(len, 2, "trimmed to keep on every append");
    assert_eq!(
        records.last_success(job).await.unwrap(),
        Some(common::run_record(job, 1, RunOutcome::Ok))
    );

    // Foreign values.
    let foreign = "other";
    let _: () = redis::cmd("SET")
        .arg(node.last_success_key(foreign))
        .arg("not a record")
        .query_async(&mut raw)
        .await
        .unwrap();
    raw_list(&server, &node.runs_key(foreign)).await;
    assert!(matches!(
        records.last_success(foreign).await,
        Err(Error::Backend { .. })
    ));
    assert!(matches!(
        records.recent(foreign, 10).await,
        Err(Error::Backend { .. })
    ));
    let _: () = redis::cmd("SET")
        .arg(node.runs_key(foreign))
        .arg("a string, not a list")
        .query_async(&mut raw)
        .await
        .unwrap();
    let refused = records
        .append(&common::run_record(foreign, 9, RunOutcome::Ok), 5)
        .await;
    assert!(
        matches!(refused, Err(Error::Backend { .. })),
        "WRONGTYPE: {refused:?}"
    );
    assert!(matches!(
        records.recent(foreign, 10).await,
        Err(Error::Backend { .. })
    ));
    assert_eq!(
        raw_string(&server, &node.runs_key(foreign))
            .await
            .as_deref(),
        Some("a string, not a list"),
        "the foreign value is left as it was"
    );
    assert_eq!(
        raw_string(&server, &node.last_success_key(foreign))
            .await
            .as_deref(),
        Some("not a record"),
        "a refused append writes no last success either"
    );
    assert!(records.recent(job, 0).await.unwrap().is_empty());
}

/// The server's `TIME`, in whole milliseconds, as claims read it.
async fn raw_time(server: &RedisServer) -> SystemTime {
    let mut raw = server.client().await;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
    from_fire_millis(secs * 1000 + micros / 1000)
}

/// Fire-time claims through two backends, each on its own connection, race: of 4
/// contenders for each of 50 fire times exactly one wins, and every answer names the
/// winner. The claim is one hash at `<prefix>claim:{job}` with a bounded expiry (at most
/// `CLAIM_RETENTION`, set again by each won claim), and nothing else is written; the
/// server time answered is the server's `TIME` (between two raw `TIME` calls around the
/// claim); fire times beyond 2^53 ms compare exactly; a foreign value at the claim key
/// (another type, a hash that is not a claim) is `Error::Backend` and left untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_time_claims_race_across_connections_and_refuse_foreign_values() {
    use distlock::redis::CLAIM_RETENTION;

    let server = RedisServer::start().await;
    let url = format!("{}?prefix=claims%3A", server.url());
    let (a, b) = (Arc::new(backend(&url).await), Arc::new(backend(&url).await));
    let node = a.node().clone();
    let job = "jobs/{nightly}";
    assert_eq!(node.claim_key(job), "claims:claim:{jobs/{nightly}}");
    let base = from_fire_millis(1_800_000_000_000);
    for n in 0..50u64 {
        let fire = base + Duration::from_secs(60 * n);
        let contenders = (0..4).map(|i| {
            let backend = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                let claims = backend.fire_claims().expect("redis keeps claims");
                claims.claim(job, fire, &format!("r{i}")).await
            })
        });
        let answers: Vec<_> = futures::future::join_all(contenders)
            .await
            .into_iter()
            .map(|a| a.expect("the claim task").expect("the claim"))
            .collect();
        let winners: Vec<_> = answers.iter().filter(|a| a.won).collect();
        assert_eq!(winners.len(), 1, "fire time {n}: one winner: {answers:?}");
        let winner = &winners[0].claim;
        assert!(
            answers.iter().all(|a| &a.claim == winner),
            "fire time {n}: every answer names the winner: {answers:?}"
        );
        assert_eq!(winner.fire_time, fire);
        assert_eq!(
            b.fire_claims()
                .unwrap()
                .current(job)
                .await
                .unwrap()
                .as_ref(),
            Some(winner)
        );
    }

    // The key: one hash, with a bounded expiry; nothing else written.
    let key = node.claim_key(job);
    assert_eq!(raw_type(&server, &key).await, "hash");
    let mut raw = server.client().await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut raw)
        .await
        .unwrap();
    let bound = i64::try_from(CLAIM_RETENTION.as_millis()).unwrap();
    assert!(
        pttl > bound - 60_000 && pttl <= bound,
        "the claim's PTTL {pttl} ms is not within a minute below {CLAIM_RETENTION:?}"
    );
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(keys, [key.as_str()], "claims write their key only");

    // The server's clock, not ours.
    let claims = a.fire_claims().unwrap();
    let before = raw_time(&server).await;
    let won = claims
        .claim(job, base + Duration::from_secs(3600 * 24), "clock")
        .await
        .unwrap();
    let after = raw_time(&server).await;
    let server_time = won.server_time.expect("redis has a clock");
    assert!(won.won, "{won:?}");
    assert!(
        before <= server_time && server_time <= after,
        "{before:?} <= {server_time:?} <= {after:?}: the server's TIME"
    );
    assert_eq!(won.claim.claimed_at, Some(server_time));
    let refused = claims.claim(job, base, "late").await.unwrap();
    assert!(!refused.won, "{refused:?}");
    assert_eq!(refused.claim, won.claim, "the kept claim, its server time");
    let answered = refused.server_time.unwrap();
    assert!(server_time <= answered && answered <= raw_time(&server).await);

    // Fire times past 2^53 ms (no Lua double holds them exactly) compare exactly.
    let far = from_fire_millis((1 << 60) + 1);
    assert!(claims.claim("far", far, "x").await.unwrap().won);
    let just_before = from_fire_millis(1 << 60);
    assert!(!claims.claim("far", just_before, "y").await.unwrap().won);
    let next = claims
        .claim("far", far + Duration::from_millis(1), "z")
        .await
        .unwrap();
    assert!(next.won, "{next:?}");
    assert_eq!(next.claim.fire_time, far + Duration::from_millis(1));

    // Foreign values: refused, never overwritten.
    let _: () = redis::cmd("SET")
        .arg(node.claim_key("string"))
        .arg("not a claim")
        .query_async(&mut raw)
        .await
        .unwrap();
    raw_list(&server, &node.claim_key("list")).await;
    let _: () = redis::cmd("HSET")
        .arg(node.claim_key("hash"))
        .arg("fire")
        .arg("soon")
        .query_async(&mut raw)
        .await
        .unwrap();
    for foreign in ["string", "list", "hash"] {
        let refused = claims.claim(foreign, base, "a").await;
        assert!(
            matches!(&refused, Err(Error::Backend { .. })),
            "{foreign}: {refused:?}"
        );
        let text = refused.unwrap_err().report().to_string();
        assert!(text.contains("not a fire-time claim"), "{text}");
        let read = claims.current(foreign).await;
        assert!(
            matches!(&read, Err(Error::Backend { .. })),
            "{foreign}: {read:?}"
        );
    }
    assert_eq!(
        raw_string(&server, &node.claim_key("string"))
            .await
            .as_deref(),
        Some("not a claim"),
        "the foreign string is left as it was"
    );
    assert_eq!(raw_type(&server, &node.claim_key("list")).await, "list");
    let fields: Vec<String> = redis::cmd("HGETALL")
        .arg(node.claim_key("hash"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        fields,
        ["fire", "soon"],
        "the foreign hash is left as it was"
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg(node.claim_key("hash"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(pttl, -1, "no expiry set on a foreign value");
}

/// The tombstone of an abandoned attempt lives `ABANDON_TIMEOUTS` operation timeouts of
/// the abandoning handle (at least `MIN_ABANDON_RETENTION`), not a fixed ten minutes: a
/// service cancelling many attempts a second would otherwise keep hundreds of thousands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tombstone_lives_a_bounded_number_of_timeouts() {
    use distlock::redis::{ABANDON_TIMEOUTS, MIN_ABANDON_RETENTION};
    let server = RedisServer::start().await;
    let node = node(&server, "retention:").await;
    for timeout in [
        DEFAULT_TIMEOUT,
        Duration::from_millis(200),
        Duration::from_millis(10),
    ] {
        let handle = node.with_timeout(timeout);
        let owner = Owner::random();
        handle.abandon("k", owner).await.unwrap();
        let bound = (timeout * ABANDON_TIMEOUTS).max(MIN_ABANDON_RETENTION);
        assert_eq!(handle.abandon_retention(), bound);
        let mut raw = server.client().await;
        let pttl: i64 = redis::cmd("PTTL")
            .arg(handle.tombstone_key("k", owner))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(
            pttl > 0 && pttl as u128 <= bound.as_millis(),
            "timeout {timeout:?}: the tombstone's PTTL {pttl} ms is not within (0, {bound:?}]"
        );
    }
}

/// Grants of one key back to back, many within one millisecond of the server clock, get
/// strictly increasing fences on the installed Redis (tests/redis5.rs checks the same on
/// Redis 5.0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_strictly_increase_in_a_tight_loop() {
    let server = RedisServer::start().await;
    let node = node(&server, "tight:").await;
    let (fences, same_ms) = common::fences_of_a_tight_loop(&node, "k", 500).await;
    eprintln!("{same_ms} of 500 grants in the millisecond of the grant before");
    common::assert_strictly_increasing(&fences);
}
