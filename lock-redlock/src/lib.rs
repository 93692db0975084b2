#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
// docs.rs marks each item with the Cargo features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

// Modules, each depending only on those listed after it (config excepted: the builder
// and what it builds name each other):
// - baseline: the raw cycle (`Baseline`): every node's SET, then every node's DEL;
// - backend: `RedlockBackend`, the `Backend` over N nodes (capabilities, drift allowance,
//   listen, abandon, force-release);
// - acquire, extend, release, inspect: one operation's protocol each; records: the run
//   records (`RunRecords`) on a majority;
// - nodes: the nodes, their per-node timeouts, one request to all of them;
// - quorum: the majority, and `Tally`, when the answers decide an operation;
// - member: one node, reconnected in the background; fanout: the requests of one operation;
// - error: the backend name, the late-quorum error; config: the builder.
mod acquire;
mod backend;
mod baseline;
mod config;
mod error;
mod extend;
mod fanout;
mod inspect;
mod member;
mod nodes;
mod quorum;
mod records;
mod release;

pub use backend::{RedlockBackend, EXPIRY_PRECISION, MIN_TTL, PERMITS_REFUSAL};
pub use baseline::BASELINE_CYCLE;
pub use config::{RedlockBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DRIFT_FACTOR, URL_PARAMS};
// Unstable internals for the tests (feature `internals`, not semver).
#[cfg(feature = "internals")]
#[doc(hidden)]
pub use lock_redis::RedisNode;
pub use nodes::{MAX_NODE_TIMEOUT, MIN_NODE_TIMEOUT, UNTIMED_NODE_TIMEOUT};
pub use quorum::quorum;
