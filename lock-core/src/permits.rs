//! What one grant claims of its key: [`Permits`], `take` of the key's `of` permits.
//!
//! Every kind of grant is a claim of permits, the way tokio builds `Mutex`, `RwLock` and
//! `Semaphore` on one semaphore: a lock is 1 of 1; a semaphore grant is k of N; a reader
//! of a reader-writer key takes 1 of [`RW_PERMITS`] and a writer takes all of them. The
//! rule every backend keeps is one: the permits believed held on a key never add up to
//! more than its `of`.

use std::fmt;

use crate::error::{Error, Result};

/// The most permits a key can have ([`Permits::of`]); also the size of a reader-writer key.
pub const MAX_PERMITS: u32 = 1 << 20;

/// The permits of a reader-writer key: a reader takes one, a writer takes them all, so at
/// most this many readers hold at once, and a writer only alone.
pub const RW_PERMITS: u32 = MAX_PERMITS;

/// A claim of `take` of a key's `of` permits: what one grant holds.
///
/// Every holder of a key names the same `of`; a claim naming another `of` than the
/// holders' is refused ([`Error::InvalidPermits`]). Build with [`Permits::new`], or use
/// [`Permits::LOCK`], [`Permits::read`] and [`Permits::write`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Permits {
    take: u32,
    of: u32,
}

impl Permits {
    /// A lock: the key's one permit.
    pub const LOCK: Permits = Permits { take: 1, of: 1 };

    /// `take` of `of` permits (a semaphore of `of` permits).
    ///
    /// # Errors
    /// [`Error::InvalidPermits`] when `take` is zero or above `of`, or `of` is above
    /// [`MAX_PERMITS`].
    ///
    /// # Examples
    ///
    /// ```
    /// use lock_core::Permits;
    ///
    /// let one_of_five = Permits::new(1, 5).unwrap();
    /// assert_eq!((one_of_five.take(), one_of_five.of()), (1, 5));
    /// assert!(Permits::new(0, 5).is_err());
    /// assert!(Permits::new(6, 5).is_err());
    /// ```
    pub fn new(take: u32, of: u32) -> Result<Permits> {
        let refuse = |reason: String| Error::InvalidPermits { reason };
        if take == 0 {
            return Err(refuse("a claim takes at least one permit".into()));
        }
        if of > MAX_PERMITS {
            return Err(refuse(format!(
                "a key has at most {MAX_PERMITS} permits, not {of}"
            )));
        }
        if take > of {
            return Err(refuse(format!(
                "a claim of {take} permits on a key of {of} can never be granted"
            )));
        }
        Ok(Permits { take, of })
    }

    /// A reader of a reader-writer key: one of its [`RW_PERMITS`], shared with the other
    /// readers, never with a writer.
    pub const fn read() -> Permits {
        Permits {
            take: 1,
            of: RW_PERMITS,
        }
    }

    /// A writer of a reader-writer key: all of its [`RW_PERMITS`], alone.
    pub const fn write() -> Permits {
        Permits {
            take: RW_PERMITS,
            of: RW_PERMITS,
        }
    }

    /// The permits this claim takes.
    pub const fn take(self) -> u32 {
        self.take
    }

    /// The key's permits, all holders' claims together.
    pub const fn of(self) -> u32 {
        self.of
    }

    /// Whether this claim takes the whole key (a lock, a writer): nobody else holds it
    /// meanwhile.
    pub const fn is_exclusive(self) -> bool {
        self.take == self.of
    }

    /// Whether a holder of `self` makes a claim of `other` on the same key certain to be
    /// refused: together they need more than the key's permits.
    pub const fn excludes(self, other: Permits) -> bool {
        self.take as u64 + other.take as u64 > self.of as u64
    }

    /// What kind of grant this is, for messages and metrics: `lock`, `read`, `write` or
    /// `permits`.
    pub const fn kind(self) -> &'static str {
        match (self.take, self.of) {
            (1, 1) => "lock",
            (1, RW_PERMITS) => "read",
            (RW_PERMITS, RW_PERMITS) => "write",
            _ => "permits",
        }
    }
}

impl Default for Permits {
    fn default() -> Self {
        Permits::LOCK
    }
}

impl fmt::Debug for Permits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Permits({} of {})", self.take, self.of)
    }
}

impl fmt::Display for Permits {
    /// `lock`, `read`, `write`, or `k of N permits`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind() {
            "permits" => write!(f, "{} of {} permits", self.take, self.of),
            kind => f.write_str(kind),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_and_their_rules() {
        assert!(Permits::LOCK.is_exclusive());
        assert!(Permits::write().is_exclusive());
        assert!(!Permits::read().is_exclusive());
        assert!(Permits::LOCK.excludes(Permits::LOCK));
        assert!(!Permits::read().excludes(Permits::read()));
        assert!(Permits::read().excludes(Permits::write()));
        assert!(Permits::write().excludes(Permits::read()));
        let two_of_three = Permits::new(2, 3).unwrap();
        assert!(two_of_three.excludes(Permits::new(2, 3).unwrap()));
        assert!(!two_of_three.excludes(Permits::new(1, 3).unwrap()));
        assert_eq!(Permits::new(1, 1).unwrap(), Permits::LOCK);
        assert!(matches!(
            Permits::new(1, MAX_PERMITS + 1),
            Err(Error::InvalidPermits { .. })
        ));
        assert_eq!(two_of_three.to_string(), "2 of 3 permits");
        assert_eq!(Permits::read().to_string(), "read");
        assert_eq!(Permits::LOCK.kind(), "lock");
    }
}
