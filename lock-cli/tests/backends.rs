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

/// PostgreSQL: a client whose wall clock is an hour off (run under `faketime`) can neither
/// shorten nor stretch a lock, its own or another's, because every expiry is computed by
/// the database (`clock_timestamp()`), never from the client's clock.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_client_clock_skew_moves_no_expiry() {
    use common::{distlock, finish, kill, run_args, skewed, Sleeper, PROMPT};
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    let server = lock_testkit::PostgresServer::start().await;
    let url = server.url();

    // The simulation works: a command under `skewed` sees a clock an hour off.
    for (offset, expected) in [("+1h", 3600i64), ("-1h", -3600)] {
        let out = finish(
            skewed(
                offset,
                run_args(&url, "skew-probe", &["--no-wait"], "date +%s"),
            ),
            PROMPT,
        )
        .await;
        out.expect_code(0);
        let seen: i64 = out.stdout.trim().parse().expect("seconds");
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        assert!(
            (seen - now - expected).abs() < 120,
            "{offset}: the command saw {seen}, the host {now}"
        );
    }

    // Another's lock: a client an hour ahead (to whom a client-side expiry would be long
    // past) and one an hour behind are both refused while it is held.
    let holder = Sleeper::start(&url, "skew-held", &["--ttl", "3s"]).await;
    for offset in ["+1h", "-1h"] {
        let out = finish(
            skewed(offset, run_args(&url, "skew-held", &["--no-wait"], "true")),
            PROMPT,
        )
        .await;
        out.expect_code(75).expect_stderr("held by another owner");
    }
    holder.terminate().await;

    // Its own lock, stretched? A holder an hour ahead dies without releasing (SIGKILL): the
    // lock is free after its 2 s TTL, not an hour later, and not before it either.
    let ahead = Sleeper::start_with(&url, "skew-ahead", &["--ttl", "2s"], |args| {
        skewed("+1h", args)
    })
    .await;
    kill(ahead.child.id().unwrap(), libc::SIGKILL);
    // The command dies with distlock (its parent-death signal), perhaps already reaped.
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(ahead.pid, libc::SIGKILL);
    }
    let killed = Instant::now();
    let refused = finish(
        distlock(run_args(&url, "skew-ahead", &["--no-wait"], "true")),
        PROMPT,
    )
    .await;
    if killed.elapsed() < Duration::from_millis(1500) {
        refused
            .expect_code(75)
            .expect_stderr("held by another owner");
    }
    let taken = finish(
        distlock(run_args(&url, "skew-ahead", &["--wait", "20s"], "true")),
        PROMPT,
    )
    .await;
    taken.expect_code(0);
    let free_after = killed.elapsed();
    assert!(
        free_after < Duration::from_secs(12),
        "the lock of a dead holder whose clock is ahead was free only after {free_after:?}"
    );

    // Its own lock, shortened? A holder an hour behind (to whom a client-side expiry would
    // be long past when written) keeps it past several TTLs, its renewals counted by the
    // database too.
    let behind = Sleeper::start_with(&url, "skew-behind", &["--ttl", "1s"], |args| {
        skewed("-1h", args)
    })
    .await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let out = finish(
            distlock(run_args(&url, "skew-behind", &["--no-wait"], "true")),
            PROMPT,
        )
        .await;
        out.expect_code(75).expect_stderr("held by another owner");
    }
    behind.terminate().await;
}

/// MySQL/MariaDB: exclusion between two `distlock` processes, status and fences through
/// the command.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql() {
    let server = lock_testkit::MariaDbServer::start().await;
    common::cross_process_scenario(&server.url(), "mysql").await;
}

/// MySQL/MariaDB: `bench` measures the raw baseline (INSERT IGNORE + DELETE) beside the
/// lock cycle.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_bench_baseline() {
    let server = lock_testkit::MariaDbServer::start().await;
    common::bench_baseline_scenario(&server.url(), "mysql", "INSERT IGNORE + DELETE").await;
}

/// ZooKeeper: exclusion between two `distlock` processes, status and fences through the
/// command, on a three-member ensemble.
#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper() {
    let ensemble = lock_testkit::ZooKeeperEnsemble::start().await;
    common::cross_process_scenario(&ensemble.url(""), "zookeeper").await;
}
