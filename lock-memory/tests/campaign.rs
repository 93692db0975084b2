//! A campaign whose grant expires before its value is published (the process or the server
//! paused past the TTL): nobody was told it leads, so the campaign goes on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::election::{Leader, LeaderValues};
use lock_core::{
    Attempt, Backend, Capabilities, Error, Lease, LockOptions, Locker, Owner, Permits,
    ReleaseListener, Result, Ttl,
};
use lock_memory::MemoryBackend;

const TTL: Duration = Duration::from_millis(200);

/// The in-process backend whose first publication is delayed past the TTL, as a process
/// descheduled between its grant and its publication would be: the backend itself then
/// answers that the lease no longer holds the key.
struct LatePublication {
    inner: MemoryBackend,
    delayed: AtomicBool,
}

#[async_trait]
impl Backend for LatePublication {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(
        &self,
        key: &str,
        owner: Owner,
        permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
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
    fn leader_values(&self) -> Option<&dyn LeaderValues> {
        Some(self)
    }
}

#[async_trait]
impl LeaderValues for LatePublication {
    async fn publish(&self, lease: &Lease, value: &[u8]) -> Result<()> {
        if !self.delayed.swap(true, Ordering::SeqCst) {
            tokio::time::sleep(TTL * 2).await;
        }
        self.inner.publish(lease, value).await
    }
    async fn leader(&self, key: &str) -> Result<Option<Leader>> {
        self.inner.leader(key).await
    }
    async fn announce(&self, key: &str) -> Result<()> {
        self.inner.announce(key).await
    }
}

fn late() -> Locker {
    Locker::new(LatePublication {
        inner: MemoryBackend::new(),
        delayed: AtomicBool::new(false),
    })
}

/// With time to wait, the campaign takes the key again and leads, in a later term than
/// the grant that expired; the value read is its own.
#[tokio::test]
async fn a_grant_lost_before_its_publication_is_campaigned_for_again() {
    let locker = late();
    let election = locker.election("jobs/leader").unwrap();
    let opts = LockOptions::new()
        .ttl(TTL)
        .watchdog(false)
        .wait_for(Duration::from_secs(5));
    let started = Instant::now();
    let leading = election.campaign("me", &opts).await.unwrap();
    assert!(
        started.elapsed() >= TTL * 2,
        "the first publication was late"
    );
    assert!(
        leading.term() > 1,
        "a second grant: term {}",
        leading.term()
    );
    let leader = election.leader().await.unwrap().expect("leads");
    assert_eq!(
        (leader.value.as_slice(), leader.term),
        (&b"me"[..], leading.term())
    );
    leading.resign().await.unwrap();
    locker.shutdown().await;
}

/// With `skip`, the one attempt is over: the key is refused as taken, and nobody leads.
#[tokio::test]
async fn with_skip_a_grant_lost_before_its_publication_is_refused_as_taken() {
    let locker = late();
    let election = locker.election("jobs/leader").unwrap();
    let opts = LockOptions::new().ttl(TTL).watchdog(false).skip();
    let err = election.campaign("me", &opts).await.unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err:?}");
    assert_eq!(election.leader().await.unwrap(), None);
    locker.shutdown().await;
}
