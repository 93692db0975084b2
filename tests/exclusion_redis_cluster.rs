//! The randomized exclusion checker on a real 3-master Redis Cluster: three Lockers, each
//! over its own cluster backend, and a fault round after the normal one: the master of
//! the checker's keys paused (SIGSTOP) past the longest TTL and past the cluster's node
//! timeout (the cluster marks it failed; with no replica to take over, its slots are
//! unavailable until it is back). No exception is allowed: a pause loses nothing. In each
//! mode: locks, semaphores (permits), reader-writer keys and elections.
//! `DISTLOCK_SOAK_SECS` runs it longer (the other modes run 12 s without it),
//! `DISTLOCK_CHECK_SEED` replays a seed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use distlock::Locker;
use lock_conformance::exclusion::{Exclusion, ExclusionConfig, Fault, Grants, Report, SOAK_ENV};
use lock_testkit::RedisCluster;

/// The longest TTL the checker draws (its default range for Redis: 100 ms … 600 ms).
const TTL_MAX: Duration = Duration::from_millis(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_redis_cluster() {
    run(ExclusionConfig::from_env()).await.assert_clean();
}

/// The checker in its permits mode: semaphores of 3 permits, claims of 1 or 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_redis_cluster_permits() {
    run(short().grants(Grants::Permits(3))).await.assert_clean();
}

/// The checker in its reader-writer mode: readers share a key, writers hold it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_redis_cluster_reader_writer() {
    run(short().grants(Grants::ReaderWriter))
        .await
        .assert_clean();
}

/// The checker in its election mode: candidates campaign, proclaim, resign and drop;
/// one leader per election, fenced by term; observers' terms never go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_redis_cluster_election() {
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

/// One run of the checker as `config` says, with the cluster's fault round.
async fn run(config: ExclusionConfig) -> Report {
    let cluster = Arc::new(RedisCluster::start(3, 0).await);
    let url = format!("{}?prefix=excl%3A", cluster.url());
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(Locker::new(common::redis_backend(&url).await));
    }
    let probe = common::redis_backend(&url).await.node().clone();
    let config = config.ttl_range(Duration::from_millis(100), TTL_MAX);
    // Past the longest TTL and past `cluster-node-timeout` (1 s).
    let past = TTL_MAX + Duration::from_millis(900);
    let pause = {
        let (cluster, probe) = (cluster.clone(), probe.clone());
        Fault::new(
            "a master paused (SIGSTOP) past the longest TTL and the node timeout",
            move || {
                let (cluster, probe) = (cluster.clone(), probe.clone());
                async move {
                    // Pause the master of the first key the checker contends for.
                    let first = ExclusionConfig::from_env().key_names().remove(0);
                    let master = cluster.master_of_key(&probe.lock_key(&first)).await;
                    cluster.node(master).pause();
                    tokio::time::sleep(past).await;
                    cluster.node(master).resume();
                    cluster.wait_settled().await;
                }
            },
        )
    };
    let (node, probe_cluster) = (probe.clone(), cluster.clone());
    Exclusion::new(lockers)
        .config(config)
        .fault(pause)
        .keys_left(move |names| {
            let (node, cluster) = (node.clone(), probe_cluster.clone());
            async move {
                let mut left = Vec::new();
                for name in names {
                    // A lock, or the holders and the permits of a semaphore (one slot).
                    let key = node.lock_key(&name);
                    let master = cluster.master_of_key(&key).await;
                    let mut raw = cluster.node(master).client().await;
                    for key in [key, node.holders_key(&name), node.permits_key(&name)] {
                        let exists: i64 = redis::cmd("EXISTS")
                            .arg(&key)
                            .query_async(&mut raw)
                            .await
                            .unwrap();
                        if exists == 1 {
                            left.push(key);
                        }
                    }
                }
                left
            }
        })
        .run()
        .await
}
