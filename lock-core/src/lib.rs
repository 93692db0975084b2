#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod capabilities;
pub mod claims;
mod error;
pub mod group;
mod lease;
mod locker;
pub mod metrics;
mod notices;
mod options;
pub mod records;
mod registry;
pub mod sync;
pub mod url;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use backend::{Admin, Attempt, Backend, Baseline, HandOver, Holder, Immediate};
pub use capabilities::{Capabilities, ClockDrift, Ttl};
pub use error::{find_cause, BoxError, Error, Result};
pub use lease::{Lease, LockKey, Owner};
pub use locker::{
    validate_key, Event, LockGuard, Locker, LockerStats, Observer, Outcome, MAX_KEY_LEN,
};
pub use notices::{ReleaseListener, ReleaseNotices};
pub use options::{Backoff, LockOptions, WaitStrategy};
pub use url::LockUrl;
