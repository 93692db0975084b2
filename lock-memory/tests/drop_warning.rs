//! A Locker whose last clone is dropped with locks still held, or with background releases
//! still on their way, says so (a `tracing` warning naming how many of each); one dropped
//! with nothing outstanding says nothing.

use std::fmt::Write;
use std::sync::{Arc, Mutex};

use std::time::{Duration, Instant};

use lock_core::{
    Attempt, Backend, Capabilities, Lease, LockOptions, Locker, Owner, ReleaseListener, Result, Ttl,
};
use lock_memory::MemoryBackend;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Keeps the text of every warning (and error) event.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={value:?} ", field.name());
    }
}

impl Subscriber for Warnings {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::WARN
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut text = Text(String::new());
        event.record(&mut text);
        self.0.lock().unwrap().push(text.0);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[tokio::test]
async fn a_locker_dropped_with_locks_held_warns() {
    let warnings = Warnings::default();
    let _default = tracing::subscriber::set_default(warnings.clone());
    let opts = LockOptions::new().skip();

    let quiet = Locker::new(MemoryBackend::new());
    let guard = quiet.acquire("drop/quiet", &opts).await.unwrap();
    guard.release().await.unwrap();
    let clone = quiet.clone();
    drop(quiet);
    drop(clone);
    assert!(warnings.0.lock().unwrap().is_empty(), "{:?}", warnings.0);

    let locker = Locker::new(MemoryBackend::new());
    let one = locker.acquire("drop/one", &opts).await.unwrap();
    let two = locker.acquire("drop/two", &opts).await.unwrap();
    let clone = locker.clone();
    drop(locker);
    assert!(
        warnings.0.lock().unwrap().is_empty(),
        "a clone is left: {:?}",
        warnings.0
    );
    drop(clone);
    let seen = warnings.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].contains("held=2") && seen[0].contains("shutdown"),
        "{seen:?}"
    );
    // The guards outlive their Locker: still held, and released as usual.
    assert!(!one.is_lost());
    one.release().await.unwrap();
    two.release().await.unwrap();
}

/// A memory backend whose release answers only after `delay`, and that offers no in-process
/// answer: a dropped guard's release then runs as a background task for that long.
struct SlowRelease {
    inner: MemoryBackend,
    delay: Duration,
}

#[async_trait::async_trait]
impl Backend for SlowRelease {
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
        self.inner.try_acquire(key, owner, permits, ttl).await
    }
    async fn extend(&self, lease: &Lease, ttl: Ttl) -> Result<Instant> {
        self.inner.extend(lease, ttl).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        tokio::time::sleep(self.delay).await;
        self.inner.release(lease).await
    }
    fn listen(&self, key: &str) -> Option<ReleaseListener> {
        self.inner.listen(key)
    }
}

#[tokio::test]
async fn a_locker_dropped_with_a_background_release_warns() {
    let warnings = Warnings::default();
    let _default = tracing::subscriber::set_default(warnings.clone());
    let locker = Locker::new(SlowRelease {
        inner: MemoryBackend::new(),
        delay: Duration::from_secs(1),
    });
    let guard = locker
        .acquire("drop/background", &LockOptions::new().skip())
        .await
        .unwrap();
    // The release goes on in the background (one second), while the Locker is dropped.
    drop(guard);
    assert_eq!(locker.stats().background_tasks, 1, "{:?}", locker.stats());
    drop(locker);
    let seen = warnings.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].contains("held=0") && seen[0].contains("background=1"),
        "{seen:?}"
    );
}
