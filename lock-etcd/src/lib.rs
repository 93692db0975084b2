#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
// docs.rs marks each item with the Cargo features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod admin;
mod backend;
mod baseline;
mod batch;
mod claims;
mod config;
mod connect;
mod detached;
mod error;
mod held;
mod leader_keys;
mod leaders;
mod leases;
mod members;
mod permits;
mod records;
mod release;
mod renew;
mod running;
mod shared;
mod txn;
mod version;
mod watch;

pub use backend::EtcdBackend;
pub use baseline::BASELINE_CYCLE;
pub use config::{EtcdBuilder, DEFAULT_PORT, DEFAULT_PREFIX, DEFAULT_TIMEOUT, URL_PARAMS};

#[doc = include_str!("design.md")]
pub mod design {}
