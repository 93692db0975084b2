//! # lock-core
//!
//! The core of distlock: one lock abstraction over many lock servers.
//!
//! - [`Backend`]: a lock server's protocol, one attempt per operation
//!   (`try_acquire`, `extend`, `release`), a release-notice hook and [`Capabilities`].
//! - [`Locker`]: the waiting policy, the same for every backend: wait strategies, jittered
//!   backoff, local FIFO queues, cancellation safety, [`Locker::run`] for scheduled jobs,
//!   [`Locker::acquire_many`] and [`Locker::shutdown`].
//! - [`LockGuard`]: a held lock with a fencing token, a renewal watchdog, a `lost()` signal
//!   and release on drop. Its renewals, `extend` and release reach the server one at a
//!   time, in order; a lost guard is never renewed again; its validity never exceeds what
//!   the server may keep, even while an extension's answer is outstanding.
//! - [`Error`]: one error type with actionable variants.
//! - [`group`]: group commit, which backends use to send requests that arrive while the
//!   server is busy as one call.
//! - [`url`]: the generic shape of lock-server URLs
//!   (`scheme://user:pass@host:port,host:port/path?query`, percent coding, password
//!   redaction, typed parameters) and the one duration grammar, shared with the CLI; each
//!   backend's builder applies its own rules to a [`LockUrl`].
//! - `conformance` (feature `conformance`): the rules every backend must pass.
#![deny(missing_docs)]

mod backend;
mod error;
pub mod group;
mod lease;
mod locker;
mod notices;
mod options;
mod registry;
pub mod sync;
pub mod url;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use backend::{
    Admin, Attempt, Backend, Capabilities, ClockDrift, HandOver, Holder, Immediate, Ttl,
};
pub use error::{BoxError, Error, Result};
pub use lease::{Lease, LockKey, Owner};
pub use locker::{
    validate_key, Event, LockGuard, Locker, LockerStats, Observer, Outcome, MAX_KEY_LEN,
};
pub use notices::{ReleaseListener, ReleaseNotices};
pub use options::{Backoff, LockOptions, WaitStrategy};
pub use url::LockUrl;
