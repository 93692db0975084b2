#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
// docs.rs marks each item with the Cargo features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

// Modules, each depending only on those listed after it (config excepted: the builder
// and what it builds name each other):
// - claims: the fire-time claims of a node and of the backend (`FireClaims`);
// - leaders: the leaders' values of a node and of the backend (`LeaderValues`);
// - records: the run records of a node and of the backend (`RunRecords`);
// - baseline: the raw `SET NX PX` + `DEL` cycle of a node and of the backend (`Baseline`);
// - backend: `RedisBackend`, the `Backend` over one node, with its release notices;
// - permits: the operations of `RedisNode` on keys claimed with several permits
//   (semaphores, reader-writer keys: acquire, hand over, extend, release, inspect);
// - node: the lock operations of `RedisNode` (acquire, hand over, extend, release,
//   abandon, force-release, inspect, raise a fence), `CAPABILITIES`;
// - handle: `RedisNode` itself: its connection, group commit, key names, and how one
//   request is sent and its failure reported;
// - ops: grouped acquires and releases (`lock_core::group`);
// - connection: the shared multiplexed connection, `EVALSHA`/`EVAL`;
// - cluster: the Redis Cluster client and key slots (used by connection, handle, ops);
// - codec: keys, owner tokens, milliseconds, simple replies;
// - error: request failures and the errors they become;
// - scripts: the Lua scripts; watch: the release subscription; config: the builder;
// - sentinel: `redis+sentinel://` and the master's discovery (`Endpoint`), under
//   connection and watch.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
mod backend;
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
mod baseline;
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
mod claims;
mod cluster;
mod codec;
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
mod config;
mod connection;
mod error;
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
mod handle;
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
mod leaders;
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
mod node;
mod ops;
mod permits;
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
mod records;
mod scripts;
mod sentinel;
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
mod watch;

pub use backend::RedisBackend;
pub use config::DEFAULT_PORT;
pub use config::{RedisBuilder, DEFAULT_PREFIX, DEFAULT_TIMEOUT, URL_PARAMS};
pub use node::CAPABILITIES;
pub use sentinel::{DEFAULT_SENTINEL_PORT, SENTINEL_SCHEME, SENTINEL_URL_PARAMS};

// Unstable internals for lock-redlock and the tests (feature `internals`, not semver).
#[cfg(feature = "internals")]
#[doc(hidden)]
pub use baseline::BASELINE_CYCLE;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub use claims::CLAIM_RETENTION;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub use config::{database_path, url_database};
#[cfg(feature = "internals")]
#[doc(hidden)]
pub use handle::RedisNode;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub use node::{
    ABANDON_RETENTION, ABANDON_TIMEOUTS, FENCE_RETENTION, MAX_FENCE, MIN_ABANDON_RETENTION,
};
#[cfg(feature = "internals")]
#[doc(hidden)]
pub use watch::ReleaseWatch;

/// The Lua sources of a lock's grant and release, for the benches' raw loop that does the
/// same server work with no library around it.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub fn lock_scripts() -> (&'static str, &'static str) {
    (scripts::ACQUIRE.source, scripts::RELEASE.source)
}
