//! The bench loop behind the grouping choice on a Redis Cluster (see `src/design.md`):
//! 64 tasks, each on a key of its own, acquire and release as fast as they can on a
//! 3-master cluster from lock-testkit, first with grouping on (groups per hash slot), then
//! off (every request its own call). Prints cycles per second and the script calls the
//! servers answered.
//!
//! `cargo run -p lock-redis --example cluster_grouping [SECONDS]` (default 3 s per mode).

use std::time::{Duration, Instant};

use lock_core::Owner;
use lock_redis::{RedisBackend, CAPABILITIES};
use lock_testkit::RedisCluster;

const TASKS: usize = 64;

/// Script calls answered so far, summed over the cluster's nodes.
async fn script_calls(cluster: &RedisCluster) -> u64 {
    let mut total = 0;
    for node in cluster.nodes() {
        let mut raw = node.client().await;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut raw)
            .await
            .expect("INFO commandstats");
        total += info
            .lines()
            .filter_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    total
}

#[tokio::main]
async fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let cluster = RedisCluster::start(3, 0).await;
    let ttl = CAPABILITIES
        .effective_ttl(Duration::from_secs(10))
        .expect("a valid TTL");
    for grouping in [true, false, true, false] {
        let node = RedisBackend::cluster_builder(cluster.seeds())
            .prefix(format!("bench{grouping}:"))
            .grouping(grouping)
            .build_node()
            .await
            .expect("connect to the cluster");
        let before = script_calls(&cluster).await;
        let until = Instant::now() + Duration::from_secs(seconds);
        let tasks: Vec<_> = (0..TASKS)
            .map(|i| {
                let node = node.clone();
                tokio::spawn(async move {
                    let (name, mut cycles) = (format!("bench/{i}"), 0u64);
                    while Instant::now() < until {
                        let owner = Owner::random();
                        node.try_acquire(&name, owner, ttl).await.expect("acquire");
                        node.release(&name, owner).await.expect("release");
                        cycles += 1;
                    }
                    cycles
                })
            })
            .collect();
        let mut cycles = 0;
        for task in tasks {
            cycles += task.await.expect("bench task");
        }
        let calls = script_calls(&cluster).await - before;
        println!(
            "grouping {}: {:.0} cycles/s ({cycles} cycles, {calls} script calls, {:.2} calls/op)",
            if grouping { "on (per slot)" } else { "off" },
            cycles as f64 / seconds as f64,
            calls as f64 / (2 * cycles) as f64
        );
    }
}
