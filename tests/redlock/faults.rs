//! Shared fault rules

use super::*;

/// A target over 3 nodes, each reached through a fault proxy (the peer too), whose hooks
/// act on every node: restarted (all their locks lost, or kept with `options.persistent`),
/// killed, paused, or cut off.
async fn fault_target(options: RedisOptions) -> Target {
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(RedisServer::start_with(options.clone()).await);
    }
    let nodes = Proxied::new(servers).await;
    let params = format!("timeout={}ms", NODE_TIMEOUT.as_millis());
    let faults = Faults::new(NODE_TIMEOUT)
        .slack(SLACK)
        .peer(Arc::new(backend(&nodes.addrs(), &params).await));
    let faults = nodes.hooks(faults).await;
    Target::new(Arc::new(backend(&nodes.addrs(), &params).await)).with_faults(faults)
}

/// The shared fault rules on 3 nodes without persistence: all restarted (empty), killed,
/// paused (SIGSTOP), or cut off by a blackholed network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules() {
    let target = fault_target(RedisOptions::default()).await;
    run_faults(&target)
        .await
        .assert_not_run(&["a_lock_survives_a_restart_that_keeps_the_locks"]);
}

/// The shared fault rules on 3 nodes with persistence (append-only file, fsync always):
/// the locks survive a restart of every node, and kill, pause and blackhole as above.
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
