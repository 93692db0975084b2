//! Waiters in another process woken by the release's NOTIFY.

use super::*;

/// A waiter in another process is woken by the release's NOTIFY, not by polling: it gets
/// the lock well before the holder's TTL would have passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_another_process_is_woken_by_notify() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=notify");
    let (a, b) = (
        Locker::new(backend(&url).await),
        Locker::new(backend(&url).await),
    );
    let k = key("notify");
    let held = a
        .acquire(&k, &LockOptions::new().ttl(Duration::from_secs(20)).skip())
        .await
        .unwrap();
    let waiter = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move {
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(5))
                .wait_for(Duration::from_secs(15));
            let guard = b.acquire(&k, &opts).await.unwrap();
            (Instant::now(), guard)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (granted, guard) = waiter.await.unwrap();
    let after = granted.duration_since(released);
    assert!(
        after < Duration::from_millis(500),
        "woken {after:?} after the release"
    );
    guard.release().await.unwrap();
}
