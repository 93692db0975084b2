//! Fencing

use super::*;

/// Two majorities that differ in their largest node: with the write-back the next token is
/// still greater; without it (fencing off) it is not, which is what the capability says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_holds_across_different_majorities() {
    let nodes = RedisNodes::start(3).await;
    let mut proxies = Vec::new();
    for addr in nodes.addrs() {
        proxies.push(FaultProxy::start(addr).await);
    }
    let addrs: Vec<SocketAddr> = proxies.iter().map(FaultProxy::addr).collect();
    let ttl = Duration::from_secs(5);
    let high: u64 = 1 << 52;
    for fencing in [true, false] {
        let b = backend(&addrs, &format!("fencing={fencing}")).await;
        assert_eq!(b.capabilities().monotonic_fencing, fencing);
        let key = format!("fence/{fencing}");
        // Node 2's counter is far ahead of the others (e.g. its clock ran ahead).
        let mut raw = nodes.nodes()[2].client().await;
        let _: redis::Value = redis::cmd("SET")
            .arg(format!("distlock:{{{key}}}:fence"))
            .arg(high)
            .query_async(&mut raw)
            .await
            .unwrap();
        // First majority: nodes 1 and 2.
        proxies[0].set_mode(ProxyMode::Reset);
        let (owner, result) = attempt(&b, &key, ttl).await;
        let first = lease_of(&key, owner, &result.unwrap());
        assert!(first.fence() > high, "node 2 issued the largest token");
        b.release(&first).await.unwrap();
        // Second majority: nodes 0 and 1.
        proxies[0].set_mode(ProxyMode::Pass);
        proxies[2].set_mode(ProxyMode::Reset);
        let (owner, result) = attempt(&b, &key, ttl).await;
        let second = lease_of(&key, owner, &result.unwrap());
        b.release(&second).await.unwrap();
        proxies[2].set_mode(ProxyMode::Pass);
        if fencing {
            assert!(second.fence() > first.fence(), "{second:?} after {first:?}");
        } else {
            assert!(second.fence() < first.fence(), "{second:?} after {first:?}");
        }
    }
}

/// On three real Redis 5.0 nodes (the oldest Redis accepted; see tests/redis5.rs): grants
/// of one key back to back get strictly increasing fences, and the write-back still orders
/// two majorities that differ in their largest node. (With the fence script's `SET … GET`,
/// new in 6.2, every node fell back to its bare clock: tokens repeated within a
/// millisecond, and the written-back fence was overwritten by the next grant's clock.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_strictly_increase_on_redis_5_nodes() {
    let mut servers = Vec::new();
    let mut proxies = Vec::new();
    for _ in 0..3 {
        let server = RedisServer::start_with(RedisOptions {
            binary: Some(lock_testkit::redis5_server()),
            ..RedisOptions::default()
        })
        .await;
        proxies.push(FaultProxy::start(server.addr()).await);
        servers.push(server);
    }
    let addrs: Vec<SocketAddr> = proxies.iter().map(FaultProxy::addr).collect();
    let b = backend(&addrs, "").await;
    let ttl = Duration::from_secs(5);
    let mut fences = Vec::new();
    for _ in 0..300 {
        let (owner, result) = attempt(&b, "redis5/tight", ttl).await;
        let lease = lease_of("redis5/tight", owner, &result.unwrap());
        fences.push(lease.fence());
        b.release(&lease).await.unwrap();
    }
    common::assert_strictly_increasing(&fences);

    let key = "redis5/majorities";
    let high: u64 = 1 << 52;
    let mut raw = servers[2].client().await;
    let _: redis::Value = redis::cmd("SET")
        .arg(format!("distlock:{{{key}}}:fence"))
        .arg(high)
        .query_async(&mut raw)
        .await
        .unwrap();
    // First majority: nodes 1 and 2 (node 2 issues the largest token).
    proxies[0].set_mode(ProxyMode::Reset);
    let (owner, result) = attempt(&b, key, ttl).await;
    let first = lease_of(key, owner, &result.unwrap());
    assert!(first.fence() > high, "node 2 issued the largest token");
    b.release(&first).await.unwrap();
    // Second majority: nodes 0 and 1; node 1 had the first token written back.
    proxies[0].set_mode(ProxyMode::Pass);
    proxies[2].set_mode(ProxyMode::Reset);
    let (owner, result) = attempt(&b, key, ttl).await;
    let second = lease_of(key, owner, &result.unwrap());
    b.release(&second).await.unwrap();
    assert!(second.fence() > first.fence(), "{second:?} after {first:?}");
}

/// Fencing tokens keep increasing when nodes restart from STALE snapshots (RDB taken before
/// the last grants, then kill -9): grants a, b, c; SAVE on every node; grants d, e, f;
/// nodes 1 and 2 restart from their snapshots and node 0 goes down, so the next quorum is
/// made of stale nodes only. Each node's token is `max(counter + 1, TIME)`, so the next
/// grants are above f's instead of re-issuing d's and e's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_across_node_restarts_from_stale_snapshots() {
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(
            RedisServer::start_with(RedisOptions {
                rdb: true,
                ..RedisOptions::default()
            })
            .await,
        );
    }
    let addrs: Vec<SocketAddr> = servers.iter().map(RedisServer::addr).collect();
    let locker = Locker::new(backend(&addrs, "").await);
    let key = "fence/stale";
    // A short TTL: a key a slow node granted after its release went by (the release
    // timed out under load) is gone before the snapshot, not kept by it for seconds.
    let opts = skip(Duration::from_secs(2)).wait_for(Duration::from_secs(5));
    let mut fences = Vec::new();
    for round in 0..2 {
        for _ in 0..3 {
            let g = locker.acquire(key, &opts).await.unwrap();
            fences.push(g.fence());
            g.release().await.unwrap();
        }
        if round == 0 {
            // A grant returns at its quorum; the minority node may not have granted yet.
            // Grant again (bounded) until every node carries a counter, then snapshot.
            let counter = format!("distlock:{{{key}}}:fence");
            for _ in 0..50 {
                let mut all = true;
                for server in &servers {
                    all &= raw_exists(server, &counter).await;
                }
                if all {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                let g = locker.acquire(key, &opts).await.unwrap();
                fences.push(g.fence());
                g.release().await.unwrap();
            }
            // A release returns at its quorum too: the minority node's DEL may still be on
            // its way (or have timed out, leaving the key to its TTL), and a SAVE through
            // another connection can overtake it. A snapshot holding the key restarts a
            // held lock (safe, and documented: it stays taken until its TTL), which is not
            // what this test is about: snapshot quiet nodes.
            let lock = format!("distlock:{{{key}}}");
            for _ in 0..150 {
                let mut held = false;
                for server in &servers {
                    held |= raw_exists(server, &lock).await;
                }
                if !held {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            for server in &servers {
                assert!(!raw_exists(server, &lock).await, "a release did not arrive");
                server.save().await;
            }
        }
    }
    servers[0].kill();
    for server in &mut servers[1..] {
        server.restart().await;
        assert!(
            raw_exists(server, &format!("distlock:{{{key}}}:fence")).await,
            "the snapshot brought the (stale) counter back"
        );
    }
    for _ in 0..3 {
        let g = locker.acquire(key, &opts).await.unwrap();
        fences.push(g.fence());
        g.release().await.unwrap();
    }
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences must strictly increase across restarts from stale snapshots: {fences:?}"
    );
}

/// Calls of EVALSHA and EVAL the server has answered so far.
async fn script_calls(server: &RedisServer) -> u64 {
    calls(server, "evalsha").await + calls(server, "eval").await
}

/// An attempt whose requests time out on every node (held in the network) and that is
/// then abandoned through another connection: when the held requests finally arrive, they
/// grant nothing on any node (a plain release, the old clean-up, found nothing and let
/// them leave orphaned keys for their TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_attempt_arriving_late_grants_nothing() {
    let nodes = RedisNodes::start(3).await;
    let mut proxies = Vec::new();
    for addr in nodes.addrs() {
        proxies.push(FaultProxy::start(addr).await);
    }
    let proxied: Vec<SocketAddr> = proxies.iter().map(FaultProxy::addr).collect();
    let late = backend(&proxied, "timeout=100ms").await;
    let direct = backend(&nodes.addrs(), "").await;
    let ttl = Duration::from_secs(30);
    // Load the scripts on every node, so that the late EVALSHAs run.
    let (warm, granted) = attempt(&late, "abandon/warm", ttl).await;
    late.release(&lease_of("abandon/warm", warm, &granted.unwrap()))
        .await
        .unwrap();
    for proxy in &proxies {
        proxy.set_mode(ProxyMode::Blackhole);
    }
    let (owner, result) = attempt(&late, "abandon/late", ttl).await;
    let e = result.expect_err("no node answers through the blackhole");
    assert!(e.is_transient(), "{e}");
    direct
        .abandon("abandon/late", owner)
        .await
        .expect("the abandon reaches every node");
    let mut before = Vec::new();
    for server in nodes.nodes() {
        before.push(script_calls(server).await);
    }
    // Long enough for the attempt's own background clean-ups to time out in the blackhole
    // too: only the abandon through the direct connections reached the nodes.
    tokio::time::sleep(distlock::redlock::UNTIMED_NODE_TIMEOUT + Duration::from_millis(200)).await;
    for proxy in &proxies {
        proxy.set_mode(ProxyMode::Pass);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for (server, before) in nodes.nodes().iter().zip(before) {
        while script_calls(server).await == before {
            assert!(Instant::now() < deadline, "a held acquire never arrived");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for (i, server) in nodes.nodes().iter().enumerate() {
        assert!(
            !raw_exists(server, &lock_key("abandon/late")).await,
            "node {i}: the late request of an abandoned attempt left an orphaned key"
        );
    }
}

/// An attempt refused by a majority while one node had not answered yet: that node's
/// clean-up is an abandon (a tombstone), not a plain release. A plain release only
/// cleans up when it runs after the attempt, which holds on one connection but not when
/// the connection was replaced in between (a timeout of another request discards it, and
/// the attempt's request then still sits in the old socket, or was re-sent): the late
/// request, arriving after the release, left a lock on that node for its whole TTL. Here
/// the node is cut off while the attempt is decided; once it is back and both the
/// attempt and its clean-up have arrived, the same request arriving once more (as a
/// late copy would) is refused, and the node holds no lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_node_of_a_refused_attempt_refuses_the_late_request() {
    let nodes = RedisNodes::start(3).await;
    let proxy = FaultProxy::start(nodes.addrs()[2]).await;
    let addrs = vec![nodes.addrs()[0], nodes.addrs()[1], proxy.addr()];
    let b = backend(&addrs, "timeout=200ms").await;
    let ttl = Duration::from_secs(30);
    // Load the scripts on every node, so that the held EVALSHAs run when they arrive.
    let (warm, granted) = attempt(&b, "unanswered/warm", ttl).await;
    b.release(&lease_of("unanswered/warm", warm, &granted.unwrap()))
        .await
        .unwrap();
    let key = "unanswered/k";
    for server in &nodes.nodes()[..2] {
        preset_foreign(server, key, 30_000).await;
    }
    let third = &nodes.nodes()[2];
    let before = script_calls(third).await;
    proxy.set_mode(ProxyMode::Blackhole);
    let (owner, result) = attempt(&b, key, ttl).await;
    assert!(
        matches!(result, Ok(Attempt::Taken { .. })),
        "a majority holds foreign values: {result:?}"
    );
    // The attempt and its clean-up are held in the blackhole; let them through.
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.set_mode(ProxyMode::Pass);
    let deadline = Instant::now() + Duration::from_secs(10);
    while script_calls(third).await < before + 2 {
        assert!(
            Instant::now() < deadline,
            "the held attempt and its clean-up never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The attempt's request once more, as a copy arriving late over another connection.
    let node = b.node(2).expect("node 2 is connected");
    let again = node
        .try_acquire(key, owner, b.capabilities().effective_ttl(ttl).unwrap())
        .await
        .expect("node 2 answers");
    assert!(
        matches!(again, Attempt::Taken { .. }),
        "the late request of the refused attempt was granted on node 2: {again:?}"
    );
    assert!(
        !raw_exists(third, &lock_key(key)).await,
        "node 2 holds an orphaned lock of the refused attempt"
    );
}
