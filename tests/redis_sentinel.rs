//! The Redis backend through Redis Sentinel (`redis+sentinel://`), against a real
//! deployment from lock-testkit (a master, its replica, three sentinels): the conformance
//! suite and the safety rules through the sentinels, typed errors for bad URLs, unreachable
//! sentinels and an unknown master, and a real failover (the master killed with `SIGKILL`):
//! acquisitions resume on the promoted replica within the failover time, fences keep
//! increasing although the promoted replica lost the tail of the counter's increments,
//! release notices follow the master, and the old master, restarted, is demoted and never
//! used.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{redis_backend as backend, skip, SLACK};
use distlock::redis::CAPABILITIES;
use distlock::{Attempt, Backend, Error, LockOptions};
use lock_conformance::{self as conformance, Target};
use lock_testkit::{RedisSentinels, DOWN_AFTER, FAILOVER_TIMEOUT};
use tokio::net::TcpListener;

async fn connect_err(url: &str) -> Error {
    match distlock::connect(url).await {
        Ok(locker) => panic!("{url}: connected to {locker:?}"),
        Err(e) => {
            eprintln!("{url}: {e}");
            e
        }
    }
}

/// Calls of `cmd` data node `i` answered since it started (`INFO commandstats`).
async fn calls(deployment: &RedisSentinels, i: usize, cmd: &str) -> u64 {
    let mut raw = deployment.node_client(i).await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut raw)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// The whole conformance suite through `distlock::connect("redis+sentinel://…")`, the
/// safety rules on a backend built from the same URL, a release in one process waking a
/// waiter in another, and an unknown master name refused with a typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_sentinels() {
    let deployment = RedisSentinels::start().await;
    let url = format!("{}?prefix=conformance%3A&timeout=2s", deployment.url());
    common::conformance_through_connect(&url, |caps| assert_eq!(caps, &CAPABILITIES)).await;
    let a = Target::new(Arc::new(backend(&deployment.url()).await));
    conformance::run_safety(&a).await;
    let b = Target::new(Arc::new(backend(&deployment.url()).await));
    conformance::release_wakes_a_waiter_on_another_instance(&a, &b).await;

    // Every sentinel answers that it monitors no such master: a configuration error, not
    // retried, said at once.
    let unknown = deployment
        .url()
        .replace("/distlock-test", "/no-such-master");
    let started = Instant::now();
    match connect_err(&unknown).await {
        Error::Backend { source, .. } => {
            let text = source.to_string();
            assert!(
                text.contains("monitors no master named `no-such-master`"),
                "{text}"
            );
        }
        other => panic!("expected Backend, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(1) + SLACK);
}

/// A replica refuses the lock scripts' writes with `READONLY`: a backend that finds itself
/// on one (a master demoted under it) gets the transient `Unavailable`, never a grant or a
/// release it did not make, and never a permanent error the Locker would not retry. Then a
/// manual failover (`SENTINEL FAILOVER`) demotes the live master: the backend moves to the
/// new master and never writes to the demoted one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_or_a_demoted_master_is_never_written() {
    let deployment = RedisSentinels::start().await;
    let master = backend(&format!("redis://{}", deployment.node_addr(0))).await;
    let on_replica = backend(&format!("redis://{}", deployment.node_addr(1))).await;
    let ttl = CAPABILITIES.effective_ttl(Duration::from_secs(10)).unwrap();
    let owner = distlock::Owner::random();
    // Held on the master (and replicated), so the replica's copy names the owner.
    assert!(matches!(
        master
            .try_acquire("k", owner, distlock::Permits::LOCK, ttl)
            .await
            .unwrap(),
        Attempt::Granted { .. }
    ));
    let lock_key = master.node().lock_key("k");
    let mut raw = deployment.node_client(1).await;
    let started = Instant::now();
    while redis::cmd("EXISTS")
        .arg(&lock_key)
        .query_async::<i64>(&mut raw)
        .await
        .unwrap()
        == 0
    {
        assert!(started.elapsed() < Duration::from_secs(5), "not replicated");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for (what, result) in [
        (
            "a new lock",
            on_replica
                .try_acquire(
                    "free",
                    distlock::Owner::random(),
                    distlock::Permits::LOCK,
                    ttl,
                )
                .await
                .map(|_| ()),
        ),
        (
            "the holder asking again",
            on_replica
                .try_acquire("k", owner, distlock::Permits::LOCK, ttl)
                .await
                .map(|_| ()),
        ),
        (
            "the release",
            on_replica.node().release("k", owner).await.map(|_| ()),
        ),
    ] {
        match result {
            Err(e @ Error::Unavailable { .. }) => {
                assert!(e.is_transient());
                assert!(format!("{e:?}").contains("READONLY"), "{what}: {e:?}");
            }
            other => panic!("{what} on a replica: expected Unavailable, got {other:?}"),
        }
    }
    assert!(
        master.node().inspect("k").await.unwrap().is_some(),
        "still held"
    );

    // The manual failover.
    let locker = distlock::connect(&format!("{}?timeout=500ms", deployment.url()))
        .await
        .unwrap();
    let guard = locker.lock("moved").await.unwrap();
    let mut last = guard.fence();
    guard.release().await.unwrap();
    let old = deployment.master_index().await.unwrap();
    let mut sentinel = redis::Client::open(format!("redis://{}", deployment.sentinel_addrs()[0]))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let () = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(lock_testkit::SENTINEL_MASTER)
        .query_async(&mut sentinel)
        .await
        .unwrap();
    let bound = DOWN_AFTER + 3 * FAILOVER_TIMEOUT + Duration::from_secs(3);
    deployment
        .wait_for_new_master(deployment.node_addr(old), bound)
        .await;
    // The sentinels reconfigure a live old master when they next poll it with `INFO`,
    // which they do every 10 s (not configurable): the demotion takes up to that long
    // after the promotion.
    let demoted = bound + Duration::from_secs(12);
    deployment.wait_for_role(old, "slave", demoted).await;
    let writes_before = calls(&deployment, old, "evalsha").await;
    let wait = LockOptions::new().wait_for(bound).watchdog(false);
    for _ in 0..20 {
        let guard = locker.acquire("moved", &wait).await.unwrap();
        assert!(guard.fence() > last);
        last = guard.fence();
        guard.release().await.unwrap();
    }
    assert_eq!(calls(&deployment, old, "evalsha").await, writes_before);
    assert!(calls(&deployment, 1 - old, "evalsha").await >= 20);
}

/// Bad `redis+sentinel://` URLs are `InvalidUrl` before any I/O, with the passwords hidden.
#[tokio::test]
async fn bad_urls_are_refused() {
    for (url, needle) in [
        ("redis+sentinel://", "at least one sentinel"),
        ("redis+sentinel://127.0.0.1:1", "master name"),
        ("redis+sentinel://127.0.0.1:1/", "master name"),
        ("redis+sentinel://127.0.0.1:1/m/db", "database index `db`"),
        ("redis+sentinel://127.0.0.1:0/m", "port"),
        (
            "redis+sentinel://127.0.0.1:1/m?drift=0.1",
            "unknown parameter `drift`",
        ),
        (
            "redis+sentinel://:hunter2@127.0.0.1:1/m?sentinel_password=hunter2&timeout=0s",
            "greater than zero",
        ),
    ] {
        match connect_err(url).await {
            Error::InvalidUrl { url: shown, reason } => {
                assert!(reason.contains(needle), "{url}: {reason}");
                assert!(
                    !shown.contains("hunter2"),
                    "{url}: password shown in {shown}"
                );
            }
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
    }
}

/// Sentinels that refuse connections, or accept and never answer, give the transient
/// `Unavailable` within the operation timeout, naming every sentinel and what it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_sentinels_are_unavailable_within_the_timeout() {
    // Ports nobody listens on: bound, then closed.
    let closed: Vec<String> = (0..2)
        .map(|_| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        })
        .collect();
    // A sentinel that accepts and stays silent.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    let _accepting = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    for (hosts, timeout) in [
        (closed.join(","), Duration::from_millis(300)),
        (
            format!("{silent_addr},{}", closed[0]),
            Duration::from_millis(400),
        ),
    ] {
        let url = format!(
            "redis+sentinel://{hosts}/m?timeout={}ms",
            timeout.as_millis()
        );
        let started = Instant::now();
        let error = connect_err(&url).await;
        let took = started.elapsed();
        assert!(took < timeout + SLACK, "{url}: {took:?}");
        assert!(error.is_transient(), "{url}: {error:?}");
        let Error::Unavailable { source, .. } = &error else {
            panic!("{url}: expected Unavailable, got {error:?}");
        };
        let text = source.to_string();
        assert!(
            text.contains("no sentinel named a reachable master `m`"),
            "{text}"
        );
        for host in hosts.split(',') {
            assert!(text.contains(host), "{text} should name {host}");
        }
        if hosts.starts_with(&silent_addr) {
            assert!(text.contains("no answer within"), "{text}");
        } else {
            assert!(text.contains("connection refused"), "{text}");
        }
    }
}

/// The master is killed (`SIGKILL`) right after a run of grants, and the promoted replica
/// lost the tail of the fence counter's increments (it is rolled back there to the value of
/// 50 grants earlier, as an asynchronous replica that missed them would have it). The next
/// acquisition succeeds on the promoted replica within the failover time, with a fence
/// above every fence given before; a release wakes a waiter of another process through the
/// subscription, which followed the master; the old master, restarted, comes back as a
/// master, is demoted to a replica by the sentinels, and never receives a lock script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_to_the_replica_keeps_fences_increasing() {
    let mut deployment = RedisSentinels::start().await;
    let url = format!("{}?timeout=500ms", deployment.url());
    let a = distlock::connect(&url).await.unwrap();
    let b = distlock::connect(&url).await.unwrap();
    // B's release subscription runs before the failover.
    conformance::release_wakes_a_waiter_on_another_instance(
        &Target::from_locker(&a),
        &Target::from_locker(&b),
    )
    .await;

    let key = "fenced";
    let mut fences = Vec::new();
    for _ in 0..200 {
        let guard = a.acquire(key, &skip(Duration::from_secs(5))).await.unwrap();
        if let Some(&before) = fences.last() {
            assert!(guard.fence() > before);
        }
        fences.push(guard.fence());
        guard.release().await.unwrap();
    }
    let last = *fences.last().unwrap();
    let node = backend(&deployment.url()).await.node().clone();
    let (fence_key, lock_key) = (node.fence_key(key), node.lock_key(key));
    let old_master = deployment.current_master().await.unwrap();
    let channel = format!("{}released:0", node.prefix());
    let subscribers = numsub(
        &mut deployment
            .node_client(deployment.master_index().await.unwrap())
            .await,
        &channel,
    )
    .await;
    assert!(
        subscribers >= 1,
        "B's release subscription runs before the failover"
    );
    let killed = deployment.kill_master().await;
    let killed_at = Instant::now();
    let replica = 1 - killed;
    assert_eq!(deployment.node_addr(killed), old_master);

    // The replica loses the tail: its counter goes back 50 grants.
    let stale = fences[fences.len() - 51];
    let mut raw = deployment.node_client(replica).await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("replica-read-only")
        .arg("no")
        .query_async(&mut raw)
        .await
        .unwrap();
    let () = redis::cmd("SET")
        .arg(&fence_key)
        .arg(stale)
        .query_async(&mut raw)
        .await
        .unwrap();

    // Detection, and an election that may fail once and be retried after 2 × the
    // failover timeout, then the promotion itself; plus slack for a loaded machine.
    let bound = DOWN_AFTER + 3 * FAILOVER_TIMEOUT + Duration::from_secs(3);
    let wait = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(bound)
        .watchdog(false);
    let guard = a
        .acquire(key, &wait)
        .await
        .expect("acquisitions resume on the promoted replica");
    let resumed = killed_at.elapsed();
    eprintln!("acquisitions resumed {resumed:?} after the kill (bound {bound:?})");
    assert!(resumed < bound + SLACK, "{resumed:?}");
    assert!(
        guard.fence() > last,
        "fence {} after the failover, {last} before",
        guard.fence()
    );
    let new_master = deployment.wait_for_new_master(old_master, bound).await;
    assert_eq!(new_master, deployment.node_addr(replica));
    // The promotion closed the client connections of the replica: a new one.
    let held: i64 = redis::cmd("EXISTS")
        .arg(&lock_key)
        .query_async(&mut deployment.node_client(replica).await)
        .await
        .unwrap();
    assert_eq!(held, 1, "the lock was granted on the promoted replica");
    guard.release().await.unwrap();

    // Release notices come from the new master, once the subscriptions that ran before
    // the failover have found it: each resubscribes by itself, after a backoff of at most
    // 1 s between attempts (and wakes its waiters when it does, so none waits longer).
    let resubscribed = Instant::now();
    let mut raw = deployment.node_client(replica).await;
    while numsub(&mut raw, &channel).await < subscribers {
        assert!(
            resubscribed.elapsed() < Duration::from_secs(5),
            "the release subscriptions did not follow the master"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // B's command connection went to the old master too: one untimed cycle through B
    // finds the new one before the timed hand-off.
    b.acquire(key, &wait)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // And one untimed hand-off from A to a waiter on B, so that every path the timed one
    // takes (A's release and its notice, B's wake-up and grant) has found the new master:
    // the first timed round once took 330 ms (bound 250 ms) right after the failover.
    let held = a.acquire(key, &wait).await.unwrap();
    let waiter = {
        let (b, key, wait) = (b.clone(), key.to_owned(), wait.clone());
        tokio::spawn(async move { b.acquire(key.as_str(), &wait).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.release().await.unwrap();
    waiter
        .await
        .unwrap()
        .expect("B's waiter gets the lock")
        .release()
        .await
        .unwrap();
    conformance::release_wakes_a_waiter_on_another_instance(
        &Target::from_locker(&a),
        &Target::from_locker(&b),
    )
    .await;

    // The old master comes back as a master with no data; the sentinels name the new one,
    // and demote the old one after a few seconds. Meanwhile and after, every grant is
    // made on the new master, with increasing fences.
    deployment.restart_node(killed).await;
    let restarted = Instant::now();
    let mut last = last;
    let mut demoted = false;
    while !demoted {
        let guard = a.acquire(key, &wait).await.unwrap();
        assert!(guard.fence() > last, "{} after {last}", guard.fence());
        last = guard.fence();
        guard.release().await.unwrap();
        demoted = deployment.role(killed).await.as_deref() == Some("slave");
        assert!(
            restarted.elapsed() < Duration::from_secs(30),
            "the old master was not demoted within 30 s; {}",
            deployment.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "old master demoted {:?} after its restart",
        restarted.elapsed()
    );
    for cmd in ["evalsha", "eval"] {
        assert_eq!(
            calls(&deployment, killed, cmd).await,
            0,
            "the old master received no {cmd}"
        );
    }
    assert!(calls(&deployment, replica, "evalsha").await > 0);
}

/// How many connections of the server `conn` reaches subscribe to `channel`.
async fn numsub(conn: &mut redis::aio::MultiplexedConnection, channel: &str) -> i64 {
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(conn)
        .await
        .unwrap();
    n
}
