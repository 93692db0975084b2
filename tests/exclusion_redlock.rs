//! The randomized exclusion checker on Redlock over three real `redis-server` nodes:
//! three Lockers, each over its own backend instance (its own connections to every node),
//! and two fault rounds after the normal one: one node killed past the longest TTL (then
//! restarted empty), and one node paused (SIGSTOP) past the longest TTL.
//! `DISTLOCK_SOAK_SECS` runs it longer, `DISTLOCK_CHECK_SEED` replays a seed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{raw_exists, redlock_backend};
use distlock::Locker;
use lock_conformance::exclusion::{Exclusion, ExclusionConfig, Fault};
use lock_testkit::RedisNodes;
use tokio::sync::Mutex;

/// The longest TTL the checker draws (its default range for Redlock: 100 ms … 600 ms).
const TTL_MAX: Duration = Duration::from_millis(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_redlock() {
    let nodes = RedisNodes::start(3).await;
    let addrs = nodes.addrs();
    let nodes = Arc::new(Mutex::new(nodes));
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(Locker::new(redlock_backend(&addrs, "").await));
    }
    let probe_backend = Arc::new(redlock_backend(&addrs, "").await);
    let config = ExclusionConfig::from_env().ttl_range(Duration::from_millis(100), TTL_MAX);
    let past_ttl = TTL_MAX * 2 + Duration::from_millis(500);

    let kill = {
        let nodes = nodes.clone();
        Fault::new(
            "1 of 3 nodes killed past the longest TTL, restarted empty",
            move || {
                let nodes = nodes.clone();
                async move {
                    nodes.lock().await.node_mut(0).kill();
                    tokio::time::sleep(past_ttl).await;
                    nodes.lock().await.node_mut(0).restart().await;
                }
            },
        )
    };
    let pause = {
        let nodes = nodes.clone();
        Fault::new(
            "1 of 3 nodes paused (SIGSTOP) past the longest TTL",
            move || {
                let nodes = nodes.clone();
                async move {
                    nodes.lock().await.nodes()[1].pause();
                    tokio::time::sleep(past_ttl).await;
                    nodes.lock().await.nodes()[1].resume();
                }
            },
        )
    };
    let probe_nodes = nodes.clone();
    let report = Exclusion::new(lockers)
        .config(config)
        .fault(kill)
        .fault(pause)
        .keys_left(move |names| {
            let (nodes, backend) = (probe_nodes.clone(), probe_backend.clone());
            async move {
                let nodes = nodes.lock().await;
                let mut left = Vec::new();
                for (i, server) in nodes.nodes().iter().enumerate() {
                    let node = backend.node(i).expect("node i");
                    for name in &names {
                        let key = node.lock_key(name);
                        if raw_exists(server, &key).await {
                            left.push(format!("node {i}: {key}"));
                        }
                    }
                }
                left
            }
        })
        .run()
        .await;
    report.assert_clean();
}
