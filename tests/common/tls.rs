//! Checks shared by the TLS test binaries (`redis_tls`, `etcd_tls`).

use std::time::{Duration, Instant};

use distlock::{Error, LockOptions, Locker};

/// `distlock::connect(url)` must fail: its error, and how long it took.
pub async fn connect_err(url: &str) -> (Error, Duration) {
    let started = Instant::now();
    match distlock::connect(url).await {
        Ok(locker) => panic!("{url}: connected to {locker:?}"),
        Err(e) => {
            eprintln!("{url}: {e}");
            (e, started.elapsed())
        }
    }
}

/// Acquire, extend, a refused second acquire, release and a waiter woken by the release
/// with a higher fence, through `locker`.
pub async fn round_trip(locker: &Locker) {
    let opts = LockOptions::new().ttl(Duration::from_secs(5)).skip();
    let key = format!("tls-{}", super::rand_u32());
    let first = locker.acquire(&key, &opts).await.expect("acquire");
    first.extend(Duration::from_secs(10)).await.expect("extend");
    assert!(matches!(
        locker.acquire(&key, &opts).await,
        Err(Error::Locked { .. })
    ));
    let waiter = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move {
            let wait = LockOptions::new()
                .ttl(Duration::from_secs(5))
                .wait_for(Duration::from_secs(5));
            locker.acquire(&key, &wait).await
        })
    };
    let fence = first.fence();
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.release().await.expect("release");
    let second = waiter.await.unwrap().expect("the waiter gets the lock");
    assert!(second.fence() > fence, "fences increase");
    second.release().await.expect("release");
}
