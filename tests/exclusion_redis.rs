//! The randomized exclusion checker on one real `redis-server`: three Lockers, each over
//! its own backend instance connected through its own [`FaultProxy`], and four fault
//! rounds after the normal one: the server paused past the longest TTL, a restart without
//! persistence, a restart from a stale RDB snapshot, and one Locker's network
//! blackholed past the longest TTL; in each mode: locks, semaphores (permits),
//! reader-writer keys and elections. `DISTLOCK_SOAK_SECS` runs it longer (the other
//! modes run 12 s without it), `DISTLOCK_CHECK_SEED` replays a seed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::raw_exists;
use distlock::redis::RedisBackend;
use distlock::Locker;
use lock_conformance::exclusion::{
    Exclusion, ExclusionConfig, Fault, Grants, Report, ViolationKind, SOAK_ENV,
};
use lock_testkit::{FaultProxy, ProxyMode, RedisOptions, RedisServer};
use tokio::sync::Mutex;

const PREFIX: &str = "excl:";
/// The longest TTL the checker draws (its default range for Redis: 100 ms … 600 ms).
const TTL_MAX: Duration = Duration::from_millis(600);

async fn backend(addr: std::net::SocketAddr) -> RedisBackend {
    common::redis_backend(&format!(
        "redis://{addr}?prefix={}",
        PREFIX.replace(':', "%3A")
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_redis() {
    run(ExclusionConfig::from_env()).await.assert_clean();
}

/// The checker in its permits mode: semaphores of 3 permits, claims of 1 or 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_redis_permits() {
    run(short().grants(Grants::Permits(3))).await.assert_clean();
}

/// The checker in its reader-writer mode: readers share a key, writers hold it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_redis_reader_writer() {
    run(short().grants(Grants::ReaderWriter))
        .await
        .assert_clean();
}

/// The checker in its election mode: candidates campaign, proclaim, resign and drop;
/// one leader per election, fenced by term; observers' terms never go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_redis_election() {
    run(short().grants(Grants::Election)).await.assert_clean();
}

/// The configuration from the environment, 12 s long unless [`SOAK_ENV`] says otherwise.
fn short() -> ExclusionConfig {
    let config = ExclusionConfig::from_env();
    if std::env::var_os(SOAK_ENV).is_some() {
        config
    } else {
        config.duration(Duration::from_secs(12))
    }
}

/// One run of the checker as `config` says, with the Redis fault rounds.
async fn run(config: ExclusionConfig) -> Report {
    // Snapshots only when a fault round asks for one (`SAVE`), kept across restarts.
    let server = Arc::new(Mutex::new(
        RedisServer::start_with(RedisOptions {
            rdb: true,
            ..RedisOptions::default()
        })
        .await,
    ));
    let addr = server.lock().await.addr();
    let mut proxies = Vec::new();
    let mut lockers = Vec::new();
    for _ in 0..3 {
        let proxy = FaultProxy::start(addr).await;
        lockers.push(Locker::new(backend(proxy.addr()).await));
        proxies.push(Arc::new(proxy));
    }
    let probe_backend = backend(addr).await;
    let config = config.ttl_range(Duration::from_millis(100), TTL_MAX);
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
            async move {
                let mut server = server.lock().await;
                // No snapshot to come back from: the server restarts empty.
                let _ = std::fs::remove_file(server.data_dir().join("dump.rdb"));
                server.restart().await
            }
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
        let server = server.clone();
        Fault::new("restart from a stale RDB snapshot", move || {
            let server = server.clone();
            async move {
                // A snapshot now, grants go on, then kill -9 and a restart: the server loads
                // the older snapshot (its locks and fence counters as they were then) before
                // it accepts a command, as after a crash of a server snapshotting
                // periodically.
                server.lock().await.save().await;
                tokio::time::sleep(TTL_MAX / 2).await;
                server.lock().await.restart().await;
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
                let server = server.lock().await;
                let mut left = Vec::new();
                for name in names {
                    // A lock, or the holders and the permits of a semaphore.
                    for key in [
                        node.lock_key(&name),
                        node.holders_key(&name),
                        node.permits_key(&name),
                    ] {
                        if raw_exists(&server, &key).await {
                            left.push(key);
                        }
                    }
                }
                left
            }
        })
        .run()
        .await;
    drop(proxies);
    report
}
