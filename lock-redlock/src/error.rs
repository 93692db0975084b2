//! The backend's own errors: the name they carry, and the quorum that came too late.

use std::time::{Duration, Instant};

use lock_core::Error;

/// The name errors carry.
pub(crate) const NAME: &str = "redlock";

/// A quorum that granted too late to leave any validity.
pub(crate) fn validity_passed(start: Instant, ttl: Duration, usable: Duration) -> Error {
    Error::unavailable(
        NAME,
        ValidityPassed {
            elapsed: start.elapsed(),
            ttl,
            usable,
        },
    )
}

/// The source of the error of an attempt whose quorum came after its validity passed.
#[derive(Debug)]
struct ValidityPassed {
    elapsed: Duration,
    ttl: Duration,
    usable: Duration,
}

impl std::fmt::Display for ValidityPassed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a quorum granted, but after {:?}: no validity left of the TTL {:?} \
             ({:?} after the clock-drift allowance); the attempt was released",
            self.elapsed, self.ttl, self.usable
        )
    }
}

impl std::error::Error for ValidityPassed {}
