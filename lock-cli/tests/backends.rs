//! `distlock run`, `status` and `bench`'s raw baseline against every other cross-process
//! backend, on real servers (lock-testkit); Redis has its own, fuller file (redis.rs).

mod common;

/// etcd: exclusion, status and fences through the command.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd() {
    let server = lock_testkit::EtcdServer::start().await;
    let url = format!("etcd://{}", server.addr());
    common::cross_process_scenario(&url, "etcd").await;
}

/// Redlock over three Redis nodes: exclusion, status and fences through the command.
#[cfg(feature = "redlock")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock() {
    let nodes = lock_testkit::RedisNodes::start(3).await;
    let hosts: Vec<String> = nodes.addrs().iter().map(|a| a.to_string()).collect();
    let url = format!("redlock://{}", hosts.join(","));
    common::cross_process_scenario(&url, "redlock").await;
}

/// etcd: `bench` measures the raw baseline (put + delete) beside the lock cycle.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_bench_baseline() {
    let server = lock_testkit::EtcdServer::start().await;
    let url = format!("etcd://{}", server.addr());
    common::bench_baseline_scenario(&url, "etcd", "put + delete").await;
}

/// Redlock: `bench` measures the raw baseline (SET NX PX, then DEL, on every node) beside
/// the lock cycle.
#[cfg(feature = "redlock")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_bench_baseline() {
    let nodes = lock_testkit::RedisNodes::start(3).await;
    let hosts: Vec<String> = nodes.addrs().iter().map(|a| a.to_string()).collect();
    let url = format!("redlock://{}", hosts.join(","));
    common::bench_baseline_scenario(
        &url,
        "redlock",
        "SET NX PX on every node, then DEL on every node",
    )
    .await;
}

/// PostgreSQL: exclusion between two `distlock` processes, status and fences through the
/// command.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let server = lock_testkit::PostgresServer::start().await;
    common::cross_process_scenario(&server.url(), "postgres").await;
}

/// PostgreSQL: `bench` measures the raw baseline (insert + delete) beside the lock cycle.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_bench_baseline() {
    let server = lock_testkit::PostgresServer::start().await;
    common::bench_baseline_scenario(
        &server.url(),
        "postgres",
        "INSERT ON CONFLICT DO NOTHING + DELETE",
    )
    .await;
}
