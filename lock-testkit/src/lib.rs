#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod binary;
mod child;
mod cluster;
mod container;
mod engine;
mod etcd;
mod etcd_auth;
mod etcd_tls;
mod http;
mod images;
mod mariadb;
mod mode;
mod oneshot;
mod ports;
mod postgres;
mod process;
mod proxy;
mod redis;
mod redis5;
mod sentinel;
mod tls;
mod zookeeper;

pub use crate::binary::find_binary;
pub use crate::cluster::{ClusterNode, RedisCluster, CLUSTER_NODE_TIMEOUT, CLUSTER_SLOTS};
pub use crate::etcd::{EtcdCluster, EtcdServer};
pub use crate::etcd_auth::EtcdUser;
pub use crate::etcd_tls::EtcdOptions;
pub use crate::mariadb::{MariaDbServer, MARIADB_DATABASE, MARIADB_PASSWORD};
pub use crate::mode::{launch_mode, LaunchMode};
pub use crate::ports::{closed_port, unused_port, ClosedPort};
pub use crate::postgres::{PostgresServer, POSTGRES_PASSWORD};
pub use crate::process::{ManagedProcess, StartError};
pub use crate::proxy::{FaultProxy, ProxyMode};
pub use crate::redis::{RedisNodes, RedisOptions, RedisServer};
pub use crate::redis5::{redis5_server, REDIS5_SERVER_VAR, REDIS5_VERSION};
pub use crate::sentinel::{RedisSentinels, DOWN_AFTER, FAILOVER_TIMEOUT, SENTINEL_MASTER};
pub use crate::tls::{ServerTls, TestCerts};
pub use crate::zookeeper::{ZooKeeperEnsemble, ZOOKEEPER_MAX_SESSION, ZOOKEEPER_TICK};
