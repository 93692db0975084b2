//! A Locker whose last clone is dropped with locks still held says so (a `tracing`
//! warning naming how many); one dropped with nothing outstanding says nothing.

use std::fmt::Write;
use std::sync::{Arc, Mutex};

use lock_core::{LockOptions, Locker};
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
