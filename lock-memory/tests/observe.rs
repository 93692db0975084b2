//! The Locker's observer hook: what a waiting, retrying and granted acquisition reports.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_core::{
    Attempt, Backend, Capabilities, Error, Event, Lease, LockOptions, Locker, Owner,
    ReleaseListener, Result, Ttl,
};
use lock_memory::MemoryBackend;

type Seen = Arc<Mutex<Vec<String>>>;
type Waits = Arc<Mutex<Vec<Duration>>>;

/// Records events as strings, and the waits of grants.
fn recorder() -> (Seen, Waits, impl Fn(&Event<'_>) + Send + Sync) {
    let seen = Seen::default();
    let waits = Waits::default();
    let (sink, wsink) = (seen.clone(), waits.clone());
    (seen, waits, move |event: &Event<'_>| {
        if let Event::Granted { waited, .. } = event {
            wsink.lock().unwrap().push(*waited);
        }
        let line = match event {
            Event::Waiting { key } => format!("waiting {key}"),
            Event::Retrying { key, error } => format!("retrying {key}: {error}"),
            Event::Granted { key, waited, .. } => format!("granted {key} after {waited:?}"),
            other => format!("{other:?}"),
        };
        sink.lock().unwrap().push(line);
    })
}

/// A waiter reports its wait once, then its grant with the time it waited; an
/// uncontended acquisition reports its grant only; a second observer is refused.
#[tokio::test]
async fn a_wait_is_reported_once_then_the_grant() {
    let locker = Locker::new(MemoryBackend::new());
    let (seen, waits, observer) = recorder();
    assert!(locker.observe(observer));
    assert!(
        !locker.observe(|_: &Event<'_>| {}),
        "the first observer stays"
    );
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(Duration::from_secs(5));
    let holder = locker.acquire("job", &opts).await.unwrap();
    let waiter = {
        let (locker, opts) = (locker.clone(), opts.clone());
        tokio::spawn(async move { locker.acquire("job", &opts).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    holder.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    next.release().await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen[0].starts_with("granted job after"), "{seen:?}");
    assert_eq!(seen[1], "waiting job");
    assert!(seen[2].starts_with("granted job after"), "{seen:?}");
    let waited = *waits.lock().unwrap().last().unwrap();
    assert!(
        waited >= Duration::from_millis(150),
        "the waiter's grant reports its wait, not {waited:?}"
    );
}

/// A backend whose first attempts fail as an unreachable server does.
struct Flaky {
    inner: MemoryBackend,
    failures_left: AtomicUsize,
}

#[async_trait::async_trait]
impl Backend for Flaky {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(
        &self,
        key: &str,
        owner: Owner,
        permits: lock_core::Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        let left = self.failures_left.load(Ordering::SeqCst);
        if left > 0 {
            self.failures_left.store(left - 1, Ordering::SeqCst);
            return Err(Error::unavailable("flaky", "server unreachable"));
        }
        self.inner.try_acquire(key, owner, permits, ttl).await
    }
    async fn extend(&self, lease: &Lease, ttl: Ttl) -> Result<Instant> {
        self.inner.extend(lease, ttl).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }
    fn listen(&self, key: &str) -> Option<ReleaseListener> {
        self.inner.listen(key)
    }
}

/// Each transient failure is reported as a retry, then the grant.
#[tokio::test]
async fn transient_failures_are_reported_as_retries() {
    let locker = Locker::new(Flaky {
        inner: MemoryBackend::new(),
        failures_left: AtomicUsize::new(2),
    });
    let (seen, _, observer) = recorder();
    assert!(locker.observe(observer));
    let opts = LockOptions::new().wait_for(Duration::from_secs(10));
    let guard = locker.acquire("job", &opts).await.unwrap();
    guard.release().await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen[0].starts_with("retrying job: "), "{seen:?}");
    assert!(seen[1].starts_with("retrying job: "), "{seen:?}");
    assert!(seen[2].starts_with("granted job after"), "{seen:?}");
}
