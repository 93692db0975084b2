#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
// docs.rs marks each item with the Cargo features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

// Modules, each depending only on those listed after it (config excepted: the builder
// and what it builds name each other):
// - backend: `ZooKeeperBackend`, the `Backend`, `Admin`, `LeaderValues` and `Baseline`;
// - session: the session, its state (disconnections, expiry) and its replacement;
// - names: keys to node names, lock node names with the owner token and sequence;
// - error: request failures and the errors they become; config: the builder.
mod backend;
mod config;
mod error;
mod names;
mod session;

pub use backend::{ZooKeeperBackend, CAPABILITIES, VALIDITY_MARGIN_PER_MILLION};
pub use config::{ZooKeeperBuilder, DEFAULT_PORT, DEFAULT_ROOT, DEFAULT_SESSION_TIMEOUT};
pub use config::{DEFAULT_TIMEOUT, URL_PARAMS};
pub use error::NAME;
