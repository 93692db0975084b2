#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
// docs.rs marks each item with the Cargo features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod capabilities;
pub mod claims;
pub mod election;
mod error;
mod forward;
// Group commit and the poison-free mutex helper are for the distlock backend crates, which
// depend on this crate at exactly its version: public only with the `internals` feature,
// and outside the semver promise even then.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod group;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unreachable_pub)]
mod group;
mod lease;
mod locker;
pub mod metrics;
mod notices;
mod options;
mod permits;
pub mod records;
mod registry;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod sync;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unreachable_pub)]
mod sync;
pub mod url;

pub use backend::{Admin, Attempt, Backend, Baseline, HandOver, Holder, Immediate};
pub use capabilities::{Capabilities, ClockDrift, Ttl};
pub use error::{find_cause, BoxError, Error, NodeErrors, Report, Result};
pub use lease::{Lease, LockKey, Owner};
pub use locker::election::{Election, LeaderWatch, Leadership};
pub use locker::{
    validate_key, Event, LockGuard, Locker, LockerStats, Observer, Outcome, MAX_KEY_LEN,
};
pub use notices::{ReleaseListener, ReleaseNotices};
pub use options::{Backoff, LockOptions, WaitStrategy};
pub use permits::{Permits, MAX_PERMITS, RW_PERMITS};
pub use url::LockUrl;
