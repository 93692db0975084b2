//! Tombstones under sustained cancellation: tasks acquire locks through a `Locker` and give
//! up on each acquisition after a random few hundred microseconds (a caller's timeout or a
//! dropped request future), for some seconds, on a `redis-server` from lock-testkit. Half
//! of the keys are held by another owner, so cancelled attempts find them taken as well as
//! free. Each acquisition cancelled with its request in flight is abandoned
//! (`RedisNode::abandon`, a tombstone); the program prints the cancellations, then the
//! server's keys (`DBSIZE`, tombstones among them) and `used_memory`, at the end and again
//! after waiting as long as a tombstone can live (`RedisNode::abandon_retention`, capped
//! at 60 s).
//!
//! `cargo run -p lock-redis --example cancel_churn [SECONDS]` (default 20 s).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{LockOptions, Locker, Owner};
use lock_redis::{RedisBackend, CAPABILITIES};
use lock_testkit::RedisServer;

const TASKS: usize = 16;
const KEYS: usize = 32;

/// `DBSIZE`, the tombstones among the keys, and `used_memory` in bytes.
async fn census(server: &RedisServer) -> (u64, u64, u64) {
    let mut raw = server.client().await;
    let keys: u64 = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
    let mut tombstones = 0u64;
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("*:x:*")
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut raw)
            .await
            .unwrap();
        tombstones += batch.len() as u64;
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut raw)
        .await
        .unwrap();
    let used = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    (keys, tombstones, used)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let server = RedisServer::start().await;
    let backend = RedisBackend::builder(server.addr().to_string())
        .build()
        .await
        .expect("connect");
    let node = backend.node().clone();
    let locker = Locker::new(backend);
    let (_, _, baseline) = census(&server).await;
    // The held half of the keys.
    let ttl = CAPABILITIES
        .effective_ttl(Duration::from_secs(3600))
        .unwrap();
    for k in (0..KEYS).step_by(2) {
        node.try_acquire(&format!("churn/{k}"), Owner::random(), ttl)
            .await
            .unwrap();
    }
    let cancelled = Arc::new(AtomicU64::new(0));
    let granted = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (locker, cancelled, granted) = (locker.clone(), cancelled.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(10))
                .skip()
                .watchdog(false);
            let mut n = t as u64;
            while Instant::now() < until {
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let key = format!("churn/{}", (n >> 33) as usize % KEYS);
                let patience = Duration::from_micros((n >> 40) % 400);
                match tokio::time::timeout(patience, locker.acquire(&key, &opts)).await {
                    Err(_) => {
                        cancelled.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Ok(guard)) => {
                        granted.fetch_add(1, Ordering::Relaxed);
                        let _ = guard.release().await;
                    }
                    Ok(Err(_)) => {}
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    locker.shutdown().await;
    let (keys, tombstones, used) = census(&server).await;
    println!(
        "{seconds} s of churn: {} acquisitions cancelled ({:.0}/s), {} granted",
        cancelled.load(Ordering::Relaxed),
        cancelled.load(Ordering::Relaxed) as f64 / seconds as f64,
        granted.load(Ordering::Relaxed)
    );
    println!(
        "right after: {keys} keys ({tombstones} tombstones), used_memory {used} bytes \
         ({} above the empty server)",
        used.saturating_sub(baseline)
    );
    let retention = node.abandon_retention();
    let wait = (retention + Duration::from_secs(1)).min(Duration::from_secs(60));
    tokio::time::sleep(wait).await;
    let (keys, tombstones, used) = census(&server).await;
    println!(
        "{wait:?} later: {keys} keys ({tombstones} tombstones), used_memory {used} bytes \
         (retention {retention:?})"
    );
}
