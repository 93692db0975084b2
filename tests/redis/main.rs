//! The Redis backend against real `redis-server` processes from lock-testkit: the whole
//! conformance suite (directly, through `Arc<dyn Backend>`, through `distlock::connect`, and
//! with a raw `DEL` taking locks away), the shared fault rules (restart with and without
//! persistence, kill, pause, blackholed network), the Redis-specific faults (a restart
//! from a stale RDB snapshot, abandoned acquires arriving late), semaphores and
//! reader-writer keys beside locks, the raw baseline and the bad-input tests.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod baseline;
mod election;
mod faults;
mod fencing;
mod grouped;
mod permits;
mod records;
mod suite;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::{calls, raw_exists, redis_backend as backend, skip, Proxied, SLACK};
use distlock::claims::from_fire_millis;
use distlock::redis::{RedisBackend, RedisNode, CAPABILITIES, DEFAULT_TIMEOUT, MAX_FENCE};
use distlock::{
    Admin, Attempt, Backend, Error, HandOver, Lease, LockOptions, Locker, Owner, Permits,
};
use lock_conformance::{
    self as conformance, queued_holder, queued_holder_and_waiter, run_all, run_faults, Faults,
    Target,
};
use lock_testkit::{EtcdServer, FaultProxy, ProxyMode, RedisOptions, RedisServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A bare node of `server` whose keys start with `prefix`.
async fn node(server: &RedisServer, prefix: &str) -> RedisNode {
    RedisBackend::builder(server.addr().to_string())
        .prefix(prefix)
        .build_node()
        .await
        .expect("connect to the test server")
}

async fn connect_err(url: &str) -> Error {
    match distlock::connect(url).await {
        Ok(locker) => panic!("{url}: connected to {locker:?}"),
        Err(e) => {
            eprintln!("{url}: {e}");
            e
        }
    }
}

/// `ttl` as the Redis backend accepts it, for calls on a node.
fn valid_ttl(ttl: Duration) -> distlock::Ttl {
    CAPABILITIES.effective_ttl(ttl).expect("a valid TTL")
}

/// The type of the value at `key` (`none` when there is none).
async fn raw_type(server: &RedisServer, key: &str) -> String {
    let mut raw = server.client().await;
    redis::cmd("TYPE")
        .arg(key)
        .query_async(&mut raw)
        .await
        .unwrap()
}

/// The string at `key`, `None` when missing or of another type.
async fn raw_string(server: &RedisServer, key: &str) -> Option<String> {
    if raw_type(server, key).await != "string" {
        return None;
    }
    let mut raw = server.client().await;
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut raw)
        .await
        .unwrap()
}

/// Stores a list (a value of the wrong type for the lock protocol) at `key`.
async fn raw_list(server: &RedisServer, key: &str) {
    let mut raw = server.client().await;
    let _: redis::Value = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: redis::Value = redis::cmd("RPUSH")
        .arg(key)
        .arg("foreign")
        .query_async(&mut raw)
        .await
        .unwrap();
}

/// The server's `TIME`, in whole milliseconds, as claims read it.
async fn raw_time(server: &RedisServer) -> SystemTime {
    let mut raw = server.client().await;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
    from_fire_millis(secs * 1000 + micros / 1000)
}
