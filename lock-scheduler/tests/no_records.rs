//! A lock server that keeps no run records: jobs run all the same, outcomes reach the
//! metrics and the log, and the history reads say the records are not kept. One that
//! keeps no fire-time claims is refused at the start.

use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use async_trait::async_trait;
use lock_core::{Attempt, Backend, Capabilities, Lease, Locker, Owner, ReleaseListener, Ttl};
use lock_memory::MemoryBackend;
use lock_scheduler::{BoxError, Error, Job, LeaderMode, ManualClock, Scheduler};

/// The memory backend without its run records (every lock operation forwarded), and
/// without its fire-time claims too when the flag is off.
struct Forgetful(MemoryBackend, bool);

#[async_trait]
impl Backend for Forgetful {
    fn capabilities(&self) -> &Capabilities {
        self.0.capabilities()
    }
    async fn try_acquire(
        &self,
        key: &str,
        owner: Owner,
        permits: lock_core::Permits,
        ttl: Ttl,
    ) -> lock_core::Result<Attempt> {
        self.0.try_acquire(key, owner, permits, ttl).await
    }
    async fn extend(&self, lease: &Lease, ttl: Ttl) -> lock_core::Result<Instant> {
        self.0.extend(lease, ttl).await
    }
    async fn release(&self, lease: &Lease) -> lock_core::Result<()> {
        self.0.release(lease).await
    }
    fn listen(&self, key: &str) -> Option<ReleaseListener> {
        self.0.listen(key)
    }
    fn fire_claims(&self) -> Option<&dyn lock_core::claims::FireClaims> {
        self.0.fire_claims().filter(|_| self.1)
    }
}

/// A lock server that cannot keep fire-time claims cannot run each fire time once: the
/// scheduler refuses to start, naming the backend.
#[test]
fn a_server_without_claims_is_refused_at_the_start() {
    let scheduler = Scheduler::builder(Locker::new(Forgetful(MemoryBackend::new(), false)))
        .replica("a")
        .build()
        .unwrap();
    scheduler
        .add(
            Job::every("plain", Duration::from_secs(10))
                .unwrap()
                .run(|_ctx| async { Ok::<_, BoxError>(()) }),
        )
        .unwrap();
    match scheduler.start() {
        Err(e @ Error::ClaimsNotKept { backend: "memory" }) => {
            assert!(e.to_string().contains("fire-time claims"), "{e}");
        }
        other => panic!("expected ClaimsNotKept, got {:?}", other.map(|_| ())),
    }
}

/// Leader mode on a lock server without elections is refused at the start, naming the
/// backend and the operation.
#[test]
fn leader_mode_without_elections_is_refused_at_the_start() {
    let scheduler = Scheduler::builder(Locker::new(Forgetful(MemoryBackend::new(), true)))
        .replica("a")
        .leader(LeaderMode::new("sched/leader"))
        .build()
        .unwrap();
    scheduler
        .add(
            Job::every("plain", Duration::from_secs(10))
                .unwrap()
                .run(|_ctx| async { Ok::<_, BoxError>(()) }),
        )
        .unwrap();
    match scheduler.start() {
        Err(Error::Lock(lock_core::Error::Unsupported { backend, operation })) => {
            assert_eq!((backend, operation), ("memory", "leader election"));
        }
        other => panic!("expected Unsupported, got {:?}", other.map(|_| ())),
    }
}

/// Runs happen; `recent` and `last_success` are `RecordsNotKept`, naming the backend.
#[tokio::test]
async fn a_server_without_records_still_runs_jobs() {
    let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_000_005));
    let scheduler = Scheduler::builder(Locker::new(Forgetful(MemoryBackend::new(), true)))
        .replica("a")
        .clock(clock.clone())
        .build()
        .unwrap();
    let ran = Arc::new(tokio::sync::Notify::new());
    let notify = ran.clone();
    scheduler
        .add(
            Job::every("plain", Duration::from_secs(10))
                .unwrap()
                .run(move |_ctx| {
                    let notify = notify.clone();
                    async move {
                        notify.notify_one();
                        Ok::<_, BoxError>(())
                    }
                }),
        )
        .unwrap();
    let running = scheduler.start().unwrap();
    clock.set(UNIX_EPOCH + Duration::from_secs(1_000_010));
    tokio::time::timeout(Duration::from_secs(30), ran.notified())
        .await
        .expect("the job ran");
    match scheduler.recent("plain", 10).await {
        Err(Error::RecordsNotKept { backend }) => assert_eq!(backend, "memory"),
        other => panic!("expected RecordsNotKept, got {other:?}"),
    }
    assert!(matches!(
        scheduler.last_success("plain").await,
        Err(Error::RecordsNotKept { .. })
    ));
    let report = running.shutdown(Duration::from_secs(10)).await;
    assert!(report.cut.is_empty());
}
