#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod binary;
mod child;
mod container;
mod engine;
mod etcd;
mod http;
mod images;
mod mode;
mod oneshot;
mod ports;
mod postgres;
mod process;
mod proxy;
mod redis;

pub use crate::binary::find_binary;
pub use crate::etcd::{EtcdCluster, EtcdServer};
pub use crate::mode::{launch_mode, LaunchMode};
pub use crate::postgres::{PostgresServer, POSTGRES_PASSWORD};
pub use crate::process::{ManagedProcess, StartError};
pub use crate::proxy::{FaultProxy, ProxyMode};
pub use crate::redis::{RedisNodes, RedisOptions, RedisServer};
