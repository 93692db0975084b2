//! The main job on the embedded default: eight "replicas" (tasks) race for one scheduled
//! job and a read-check-write section, on whatever `DISTLOCK_URL` names (`memory://` when
//! unset). Shows contention, fencing tokens, and every `run` outcome.
//!
//! Run with `cargo run -p lock-cli --no-default-features --example demo` (memory only; any
//! backend compiled into lock-cli can be named in `DISTLOCK_URL`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{LockOptions, Outcome};

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let locker = distlock::from_env().await?;
    let caps = locker.capabilities();
    println!(
        "backend: {} (monotonic fencing: {})",
        caps.name, caps.monotonic_fencing
    );

    // 1. A scheduled job on 8 replicas: Skip means only one of them runs it.
    println!("\n1. nightly job fired on 8 replicas at once (wait strategy: Skip)");
    let opts = LockOptions::new().ttl(Duration::from_secs(5)).skip();
    let runs = (0..8).map(|replica| {
        let (locker, opts) = (locker.clone(), opts.clone());
        tokio::spawn(async move {
            let outcome = locker
                .run("jobs/nightly", &opts, async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    format!("replica {replica} did the work")
                })
                .await;
            (replica, outcome)
        })
    });
    for r in futures::future::join_all(runs).await {
        let (replica, outcome) = r.expect("task");
        println!("   replica {replica}: {:?}", outcome?);
    }

    // 2. Read-check-write on a shared stock counter: 8 buyers, 5 items, no overselling.
    println!("\n2. 8 buyers race for 5 items (wait strategy: Wait(2s)); fences order the writes");
    let stock = Arc::new(AtomicU64::new(5));
    let last_fence = Arc::new(AtomicU64::new(0));
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(Duration::from_secs(2));
    let buyers = (0..8).map(|buyer| {
        let (locker, opts, stock, last_fence) = (
            locker.clone(),
            opts.clone(),
            stock.clone(),
            last_fence.clone(),
        );
        tokio::spawn(async move {
            let guard = locker.acquire("stock/item-42", &opts).await?;
            // The protected resource refuses a write whose fence is older than one it saw.
            let previous = last_fence.fetch_max(guard.fence(), Ordering::SeqCst);
            assert!(previous < guard.fence(), "fencing tokens increase");
            let left = stock.load(Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            let bought = left > 0;
            if bought {
                stock.store(left - 1, Ordering::SeqCst);
            }
            let fence = guard.fence();
            guard.release().await?;
            Ok::<_, distlock::Error>((buyer, fence, bought))
        })
    });
    for r in futures::future::join_all(buyers).await {
        let (buyer, fence, bought) = r.expect("task")?;
        println!(
            "   buyer {buyer} (fence {fence}): {}",
            if bought { "bought one" } else { "sold out" }
        );
    }
    println!("   stock left: {}", stock.load(Ordering::SeqCst));

    // 3. The other outcomes: a hard timeout and a lost lock.
    println!("\n3. a job that overruns its hard timeout, and one whose lock is taken away");
    let opts = LockOptions::new()
        .ttl(Duration::from_millis(300))
        .skip()
        .job_timeout(Duration::from_millis(200));
    let slow = locker
        .run(
            "jobs/slow",
            &opts,
            tokio::time::sleep(Duration::from_secs(5)),
        )
        .await?;
    println!("   slow job: {slow:?}");
    let backend = locker.backend().clone();
    let revoke = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        match backend.admin() {
            Some(admin) => admin.force_release("jobs/revoked").await,
            None => Ok(false),
        }
    });
    let opts = LockOptions::new().ttl(Duration::from_millis(300)).skip();
    let revoked = locker
        .run(
            "jobs/revoked",
            &opts,
            tokio::time::sleep(Duration::from_secs(5)),
        )
        .await?;
    println!("   job whose lock was taken away: {revoked:?}");
    revoke.await.expect("task")?;
    assert_eq!(slow, Outcome::TimedOut);
    assert_eq!(revoked, Outcome::LockLost);

    locker.shutdown().await;
    Ok(())
}
