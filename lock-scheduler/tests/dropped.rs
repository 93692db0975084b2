//! A dropped `Running` stops the scheduler at once, and its locks are released in the
//! background, which the Locker's `shutdown` awaits: when that returns, no lock of the
//! scheduler is left on the server, even one whose release was on its way.

use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use async_trait::async_trait;
use lock_core::{Attempt, Backend, Capabilities, Lease, Locker, Owner, Permits, Ttl};
use lock_memory::MemoryBackend;
use lock_scheduler::{BoxError, Job, ManualClock, Scheduler};
use tokio::sync::Notify;

/// The memory backend whose releases take a while (a slow network): each says when it
/// starts, then waits before it reaches the server.
struct SlowRelease {
    server: Arc<MemoryBackend>,
    releasing: Arc<Notify>,
}

#[async_trait]
impl Backend for SlowRelease {
    fn capabilities(&self) -> &Capabilities {
        self.server.capabilities()
    }
    async fn try_acquire(
        &self,
        key: &str,
        owner: Owner,
        permits: Permits,
        ttl: Ttl,
    ) -> lock_core::Result<Attempt> {
        self.server.try_acquire(key, owner, permits, ttl).await
    }
    async fn extend(&self, lease: &Lease, ttl: Ttl) -> lock_core::Result<Instant> {
        self.server.extend(lease, ttl).await
    }
    async fn release(&self, lease: &Lease) -> lock_core::Result<()> {
        self.releasing.notify_one();
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.server.release(lease).await
    }
    fn listen(&self, key: &str) -> Option<lock_core::ReleaseListener> {
        self.server.listen(key)
    }
    fn fire_claims(&self) -> Option<&dyn lock_core::claims::FireClaims> {
        self.server.fire_claims()
    }
}

/// `Running` dropped while a run's release is on its way (its future is cancelled at that
/// await), then `Locker::shutdown`: when the shutdown returns, the lock is gone from the
/// server. (Before, the shutdown found nothing held and nothing in the background, because
/// the cancelled run had not been dropped yet, and returned at once; a process exiting
/// then left the lock to its TTL.)
#[tokio::test]
async fn a_release_on_its_way_when_running_is_dropped_is_awaited_by_the_shutdown() {
    let server = Arc::new(MemoryBackend::new());
    let releasing = Arc::new(Notify::new());
    let locker = Locker::new(SlowRelease {
        server: server.clone(),
        releasing: releasing.clone(),
    });
    let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_000_005));
    let scheduler = Scheduler::builder(locker.clone())
        .replica("a")
        .clock(clock.clone())
        .build()
        .unwrap();
    scheduler
        .add(
            Job::every("slow-release", Duration::from_secs(10))
                .unwrap()
                .at_least(Duration::ZERO)
                .ttl(Duration::from_secs(60))
                .run(|_ctx| async { Ok::<_, BoxError>(()) }),
        )
        .unwrap();
    let running = scheduler.start().unwrap();
    clock.set(UNIX_EPOCH + Duration::from_secs(1_000_010));
    tokio::time::timeout(Duration::from_secs(30), releasing.notified())
        .await
        .expect("the run ended and its release started");
    drop(running);
    tokio::time::timeout(Duration::from_secs(10), locker.shutdown())
        .await
        .expect("the shutdown ends");
    let ttl = server
        .capabilities()
        .effective_ttl(Duration::from_secs(10))
        .unwrap();
    match server
        .try_acquire("slow-release", Owner::random(), Permits::LOCK, ttl)
        .await
        .unwrap()
    {
        Attempt::Granted { .. } => {}
        other => panic!("the run's lock is still held after the shutdown: {other:?}"),
    }
}
