//! The recording side of [`crate::metrics`]: the series' keys, built once per Locker (and
//! once per key label), so that recording allocates nothing and builds no label.
//!
//! Each record asks the recorder in use at that moment (a thread's local recorder, else
//! the global one, else the no-op one) for the handle of a pre-built [`Key`]: handles are
//! not cached, so a recorder installed after the Locker was built receives everything
//! from then on.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{Key, Label, Level, Metadata};

use crate::error::{Error, Result};
use crate::metrics::{names, KEY_LABEL, OUTCOMES};
use crate::sync::lock;

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The keys of every series for one set of labels (a backend, and maybe a key label).
pub(crate) struct Series {
    acquire: [Key; 4],
    wait: [Key; 4],
    hold: Key,
    lost: Key,
    renewals_failed: Key,
    hand_overs: Key,
    errors: [Key; Error::KINDS.len()],
}

impl Series {
    fn new(backend: &'static str, key_label: Option<&'static str>) -> Self {
        let mut base = vec![Label::from_static_parts("backend", backend)];
        if let Some(value) = key_label {
            base.push(Label::from_static_parts(KEY_LABEL, value));
        }
        let key = |name: &'static str, extra: Option<(&'static str, &'static str)>| {
            let mut labels = base.clone();
            if let Some((k, v)) = extra {
                labels.push(Label::from_static_parts(k, v));
            }
            Key::from_parts(name, labels)
        };
        Series {
            acquire: OUTCOMES.map(|o| key(names::ACQUIRE_DURATION, Some(("outcome", o)))),
            wait: OUTCOMES.map(|o| key(names::WAIT_DURATION, Some(("outcome", o)))),
            hold: key(names::HOLD_DURATION, None),
            lost: key(names::LOST, None),
            renewals_failed: key(names::RENEWALS_FAILED, None),
            hand_overs: key(names::HAND_OVERS, None),
            errors: Error::KINDS.map(|k| key(names::ERRORS, Some(("kind", k)))),
        }
    }

    /// An acquisition's answer, `started` being when it was called and `ended` when it was
    /// answered; into the wait histogram too when it `waited`.
    pub(crate) fn acquired<T>(
        &self,
        result: &Result<T>,
        started: Instant,
        ended: Instant,
        waited: bool,
    ) {
        let outcome = match result {
            Ok(_) => 0,
            Err(Error::Locked { .. }) => 1,
            Err(Error::Timeout { .. }) => 2,
            Err(_) => 3,
        };
        let took = ended.saturating_duration_since(started);
        record(&self.acquire[outcome], took);
        if waited || outcome == 2 {
            record(&self.wait[outcome], took);
        }
    }

    /// The end of a hold granted at `granted`.
    pub(crate) fn held(&self, granted: Instant) {
        record(&self.hold, granted.elapsed());
    }

    // Off the uncontended cycle: kept out of line so that it stays small.
    #[cold]
    pub(crate) fn lost(&self) {
        count(&self.lost);
    }

    // Off the uncontended cycle: kept out of line so that it stays small.
    #[cold]
    pub(crate) fn renewal_failed(&self) {
        count(&self.renewals_failed);
    }

    // Off the uncontended cycle: kept out of line so that it stays small.
    #[cold]
    pub(crate) fn handed_over(&self) {
        count(&self.hand_overs);
    }

    // Off the uncontended cycle: kept out of line so that it stays small.
    #[cold]
    pub(crate) fn error(&self, e: &Error) {
        let kind = e.kind();
        if let Some(key) = Error::KINDS
            .iter()
            .position(|k| *k == kind)
            .map(|i| &self.errors[i])
        {
            count(key);
        }
    }
}

fn record(key: &Key, value: Duration) {
    metrics::with_recorder(|r| {
        r.register_histogram(key, &METADATA)
            .record(value.as_secs_f64())
    });
}

fn count(key: &Key) {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
}

/// The series of one Locker: those without a key label, built with the Locker, and one
/// set per key label, built at its first use.
pub(crate) struct LockerMetrics {
    backend: &'static str,
    plain: Series,
    /// Few entries (the labels are `&'static str`s of the program): a list is enough.
    labelled: Mutex<Vec<(&'static str, Arc<Series>)>>,
}

impl LockerMetrics {
    /// The series of a Locker over `backend`; describes them to the recorder in use.
    pub(crate) fn new(backend: &'static str) -> Self {
        crate::metrics::describe();
        LockerMetrics {
            backend,
            plain: Series::new(backend, None),
            labelled: Mutex::new(Vec::new()),
        }
    }

    /// Calls `f` with the series of `key_label`.
    pub(crate) fn with<R>(
        &self,
        key_label: Option<&'static str>,
        f: impl FnOnce(&Series) -> R,
    ) -> R {
        let Some(value) = key_label else {
            return f(&self.plain);
        };
        let series = {
            let mut labelled = lock(&self.labelled);
            match labelled.iter().find(|(v, _)| *v == value) {
                Some((_, series)) => series.clone(),
                None => {
                    let series = Arc::new(Series::new(self.backend, Some(value)));
                    labelled.push((value, series.clone()));
                    series
                }
            }
        };
        f(&series)
    }
}
