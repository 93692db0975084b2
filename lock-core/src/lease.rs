//! Owner tokens and leases: what a backend grants.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::permits::Permits;

/// A random 128-bit owner token, fresh for every acquisition attempt.
///
/// Backends store it as the lock's value and only extend or release a lock whose stored
/// value equals the caller's token, so a stale holder can never touch a newer holder's lock.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner(u128);

impl Owner {
    /// Draws a new token from the thread-local CSPRNG of `rand`.
    pub fn random() -> Self {
        Owner(rand::random())
    }

    /// The token as a number.
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// Rebuilds a token from its number (for backends that read it back from a server).
    pub fn from_u128(value: u128) -> Self {
        Owner(value)
    }

    /// Parses the 32-hex-digit form written by `Display`.
    pub fn parse(s: &str) -> Option<Self> {
        if s.len() != 32 {
            return None;
        }
        u128::from_str_radix(s, 16).ok().map(Owner)
    }
}

impl fmt::Display for Owner {
    /// Always 32 lowercase hex digits, the form stored on servers.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Owner({self})")
    }
}

/// A grant as the backend knows it: key, owner token, the permits it claims (a lock: 1 of
/// 1), fencing token and validity.
///
/// `valid_until` is measured on the monotonic clock of this process and is conservative:
/// the backend computed it from the moment *before* its request was sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    key: Arc<str>,
    owner: Owner,
    permits: Permits,
    fence: u64,
    valid_until: Instant,
}

impl Lease {
    /// The [`Error::NotHeld`](crate::Error::NotHeld) a backend answers when this lease is no
    /// longer the holder of its key.
    pub fn not_held(&self) -> crate::Error {
        crate::Error::NotHeld {
            key: self.key().to_owned(),
        }
    }

    /// Builds the lease of a lock, 1 of 1 permit (used by the [`Locker`](crate::Locker) and
    /// by backend tests).
    pub fn new(key: impl Into<Arc<str>>, owner: Owner, fence: u64, valid_until: Instant) -> Self {
        Lease {
            key: key.into(),
            owner,
            permits: Permits::LOCK,
            fence,
            valid_until,
        }
    }

    /// The same lease claiming `permits` instead.
    pub fn with_permits(mut self, permits: Permits) -> Self {
        self.permits = permits;
        self
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The key as a shared string (cheap to clone).
    pub fn key_arc(&self) -> &Arc<str> {
        &self.key
    }

    /// The owner token stored on the server.
    pub fn owner(&self) -> Owner {
        self.owner
    }

    /// The permits this grant claims of its key ([`Permits::LOCK`] for a lock).
    pub fn permits(&self) -> Permits {
        self.permits
    }

    /// The fencing token: strictly greater than the token of every earlier holder of this
    /// key when the backend's capabilities say `monotonic_fencing`.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The instant until which the lock is ours unless renewed.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// Time left before `valid_until` (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// Whether `valid_until` has passed.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.valid_until
    }

    /// Replaces the validity after a successful extension.
    pub fn set_valid_until(&mut self, valid_until: Instant) {
        self.valid_until = valid_until;
    }
}

/// A lock key as [`Locker::acquire`](crate::Locker::acquire) takes it: any string. A shared
/// `Arc<str>` is kept as it is (one reference more); other forms are copied once into the
/// lease.
pub trait LockKey {
    /// The key as a string slice.
    fn as_key(&self) -> &str;

    /// The key as the shared string the lease holds.
    fn to_shared(&self) -> Arc<str> {
        Arc::from(self.as_key())
    }
}

impl LockKey for str {
    fn as_key(&self) -> &str {
        self
    }
}

impl LockKey for String {
    fn as_key(&self) -> &str {
        self
    }
}

impl LockKey for Box<str> {
    fn as_key(&self) -> &str {
        self
    }
}

impl LockKey for std::borrow::Cow<'_, str> {
    fn as_key(&self) -> &str {
        self
    }
}

impl LockKey for Arc<str> {
    fn as_key(&self) -> &str {
        self
    }

    fn to_shared(&self) -> Arc<str> {
        self.clone()
    }
}

impl<T: LockKey + ?Sized> LockKey for &T {
    fn as_key(&self) -> &str {
        (**self).as_key()
    }

    fn to_shared(&self) -> Arc<str> {
        (**self).to_shared()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_keys_are_kept_and_others_copied() {
        let shared: Arc<str> = Arc::from("jobs/a");
        assert!(Arc::ptr_eq(&shared.to_shared(), &shared));
        assert!(Arc::ptr_eq(&LockKey::to_shared(&&shared), &shared));
        assert_eq!(&*"jobs/b".to_shared(), "jobs/b");
        assert_eq!(&*String::from("jobs/c").to_shared(), "jobs/c");
        assert_eq!((&&"jobs/d").as_key(), "jobs/d");
    }

    #[test]
    fn owner_tokens_are_random_and_round_trip() {
        let a = Owner::random();
        let b = Owner::random();
        assert_ne!(a, b);
        let s = a.to_string();
        assert_eq!(s.len(), 32);
        assert_eq!(Owner::parse(&s), Some(a));
        assert_eq!(Owner::parse("xyz"), None);
        assert_eq!(Owner::parse(&"g".repeat(32)), None);
    }
}
