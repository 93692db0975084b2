//! The randomized exclusion checker on one real `redis-server`: three Lockers, each over
//! its own backend instance connected through its own [`FaultProxy`], and four fault
//! rounds after the normal one: the server paused past the longest TTL, a restart without
//! persistence, a restart that restores a stale snapshot, and one Locker's network
//! blackholed past the longest TTL. `DISTLOCK_SOAK_SECS` runs it longer,
//! `DISTLOCK_CHECK_SEED` replays a seed.

use std::sync::Arc;
use std::time::Duration;

use distlock::conformance::exclusion::{Exclusion, ExclusionConfig, Fault, ViolationKind};
use distlock::redis::RedisBackend;
use distlock::{LockUrl, Locker};
use lock_testkit::{FaultProxy, ProxyMode, RedisServer};
use tokio::sync::Mutex;

const PREFIX: &str = "excl:";
/// The longest TTL the checker draws (its default range for Redis: 100 ms … 600 ms).
const TTL_MAX: Duration = Duration::from_millis(600);

async fn backend(addr: std::net::SocketAddr) -> RedisBackend {
    let url = format!("redis://{addr}?prefix={}", PREFIX.replace(':', "%3A"));
    RedisBackend::connect(&LockUrl::parse(&url).expect("valid URL"))
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// Every key of the server with its remaining time to live (ms, -1 without one) and its
/// `DUMP` serialization.
async fn snapshot(server: &RedisServer) -> Vec<(String, i64, Vec<u8>)> {
    let mut raw = server.client().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{PREFIX}*"))
        .query_async(&mut raw)
        .await
        .expect("KEYS");
    let mut saved = Vec::new();
    for key in keys {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut raw)
            .await
            .unwrap();
        let dump: Option<Vec<u8>> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut raw)
            .await
            .unwrap();
        if let (Some(dump), true) = (dump, pttl != -2) {
            saved.push((key, pttl, dump));
        }
    }
    saved
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_redis() {
    let server = Arc::new(Mutex::new(RedisServer::start().await));
    let addr = server.lock().await.addr();
    let mut proxies = Vec::new();
    let mut lockers = Vec::new();
    for _ in 0..3 {
        let proxy = FaultProxy::start(addr).await;
        lockers.push(Locker::new(backend(proxy.addr()).await));
        proxies.push(Arc::new(proxy));
    }
    let probe_backend = backend(addr).await;
    let config = ExclusionConfig::from_env().ttl_range(Duration::from_millis(100), TTL_MAX);
    let past_ttl = TTL_MAX + Duration::from_millis(500);

    let pause = {
        let server = server.clone();
        Fault::new("server paused (SIGSTOP) past the longest TTL", move || {
            let server = server.clone();
            async move {
                server.lock().await.pause();
                tokio::time::sleep(past_ttl).await;
                server.lock().await.resume();
            }
        })
    };
    let restart = {
        let server = server.clone();
        Fault::new("restart without persistence", move || {
            let server = server.clone();
            async move { server.lock().await.restart().await }
        })
        // Redis without persistence forgets every lock on restart: until a holder's next
        // renewal (or its validity) tells it, a new holder may be granted the key while the
        // old one still believes. The known single-node limitation, not a library bug; the
        // fence rule stays checked (fences are max(counter + 1, server time in µs)).
        .allow(
            ViolationKind::Overlap,
            "a Redis restart without persistence forgets the locks (single-node limitation)",
        )
        // The same overlap seen through the fence: the old holder, still believing, writes
        // after the new one and the resource refuses it (fencing doing its job). Duplicate
        // fences stay checked: fences must move forward across the restart.
        .allow(
            ViolationKind::StaleFence,
            "the old holder of a forgotten lock is refused by its lower fence",
        )
    };
    let stale = {
        let (server, proxies) = (server.clone(), proxies.clone());
        Fault::new("restart restoring a stale snapshot", move || {
            let (server, proxies) = (server.clone(), proxies.clone());
            async move {
                // lock-testkit has no RDB option: the snapshot is taken with DUMP (keys, their
                // TTLs and the fence counters as they are now), the server keeps running for
                // a while, then restarts empty and the snapshot is RESTOREd, as a restart
                // from an older RDB file would load it.
                // The Lockers are cut off from the restart until the restore is done, as a
                // server loading its RDB file accepts no commands.
                let saved = snapshot(&*server.lock().await).await;
                tokio::time::sleep(TTL_MAX / 2).await;
                let mut server = server.lock().await;
                for proxy in &proxies {
                    proxy.set_mode(ProxyMode::Blackhole);
                }
                server.restart().await;
                let mut raw = server.client().await;
                for (key, pttl, dump) in saved {
                    let _: redis::RedisResult<()> = redis::cmd("RESTORE")
                        .arg(&key)
                        .arg(pttl.max(0))
                        .arg(dump)
                        .arg("REPLACE")
                        .query_async(&mut raw)
                        .await;
                }
                for proxy in &proxies {
                    proxy.set_mode(ProxyMode::Pass);
                }
            }
        })
        // As above: the restored data set lacks the grants made after the snapshot.
        .allow(
            ViolationKind::Overlap,
            "a restart from a stale snapshot forgets the locks granted after it",
        )
        .allow(
            ViolationKind::StaleFence,
            "the old holder of a forgotten lock is refused by its lower fence",
        )
    };
    let blackhole = {
        let proxy = proxies[0].clone();
        Fault::new(
            "L0's network blackholed past twice the longest TTL",
            move || {
                let proxy = proxy.clone();
                async move {
                    proxy.set_mode(ProxyMode::Blackhole);
                    tokio::time::sleep(TTL_MAX * 2 + Duration::from_millis(500)).await;
                    proxy.set_mode(ProxyMode::Pass);
                }
            },
        )
    };
    let node = probe_backend.node().clone();
    let probe_server = server.clone();
    let report = Exclusion::new(lockers)
        .config(config)
        .fault(pause)
        .fault(restart)
        .fault(stale)
        .fault(blackhole)
        .keys_left(move |names| {
            let (node, server) = (node.clone(), probe_server.clone());
            async move {
                let mut raw = server.lock().await.client().await;
                let mut left = Vec::new();
                for name in names {
                    let key = node.lock_key(&name);
                    let n: i64 = redis::cmd("EXISTS")
                        .arg(&key)
                        .query_async(&mut raw)
                        .await
                        .unwrap();
                    if n == 1 {
                        left.push(key);
                    }
                }
                left
            }
        })
        .run()
        .await;
    drop(proxies);
    report.assert_clean();
}
