#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
// docs.rs marks each item with the Cargo features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

// Modules, each depending only on those listed after it (config excepted: the builder
// and what it builds name each other):
// - backend: `MysqlBackend`, the `Backend`, `HandOver`, `Admin` and `Baseline`;
// - batch: the group commit of acquisitions, releases and hand-overs (one script each);
// - connection: the lock connections, their sessions, reconnection, timeouts;
// - sql: the scripts' text, built from validated names and spliced-safe values;
// - error: request failures and the errors they become; config: the builder and names.
mod backend;
mod batch;
mod config;
mod connection;
mod error;
mod sql;

pub use backend::{MysqlBackend, BASELINE_CYCLE, CAPABILITIES};
pub use config::{check_identifier, MysqlBuilder, MAX_IDENTIFIER_LEN};
pub use config::{DEFAULT_PORT, DEFAULT_TABLE, DEFAULT_TIMEOUT, URL_PARAMS};
pub use error::NAME;
