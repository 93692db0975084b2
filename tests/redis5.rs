//! The Redis backend against a real Redis 5.0 server, the oldest version it accepts (see
//! lock-redis's README): the binary comes from [`lock_testkit::redis5_server`]
//! (`DISTLOCK_REDIS5_SERVER`, or downloaded once with pip into the user's cache; a missing
//! binary fails the tests with the install command). Fences strictly increase there too
//! (the fence script uses no command newer than 5.0), and the conformance suite passes.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{assert_strictly_increasing, fences_of_a_tight_loop, redis_backend as backend};
use distlock::redis::{RedisBackend, RedisNode, CAPABILITIES};
use distlock::{Attempt, Owner};
use lock_conformance::{run_all, Target};
use lock_testkit::{redis5_server, RedisOptions, RedisServer, REDIS5_VERSION};

/// A Redis 5.0.7 server, checked to be that version.
async fn redis5() -> RedisServer {
    let server = RedisServer::start_with(RedisOptions {
        binary: Some(redis5_server()),
        ..RedisOptions::default()
    })
    .await;
    let mut raw = server.client().await;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut raw)
        .await
        .unwrap();
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(str::trim);
    assert_eq!(version, Some(REDIS5_VERSION), "the old server's version");
    server
}

async fn node(server: &RedisServer, prefix: &str) -> RedisNode {
    RedisBackend::builder(server.addr().to_string())
        .prefix(prefix)
        .build_node()
        .await
        .expect("connect to the Redis 5 server")
}

/// Grants of one key back to back, many within one millisecond of the server clock, get
/// strictly increasing fences (a fence script relying on `SET … GET`, new in 6.2, fell
/// back to the bare clock on 5.0 and repeated tokens within a millisecond).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_strictly_increase_in_a_tight_loop() {
    let server = redis5().await;
    let node = node(&server, "tight:").await;
    let (fences, same_ms) = fences_of_a_tight_loop(&node, "k", 500).await;
    eprintln!("{same_ms} of 500 grants in the millisecond of the grant before");
    assert_strictly_increasing(&fences);
}

/// A fence counter ahead of the server clock (a Redlock write-back of another node's
/// fence, or a clock that stepped back) is honoured: the next grant's fence is above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_ahead_of_the_clock_orders_the_next_fence() {
    let server = redis5().await;
    let node = node(&server, "ahead:").await;
    let ttl = CAPABILITIES
        .effective_ttl(Duration::from_secs(5))
        .expect("a valid TTL");
    let owner = Owner::random();
    let first = match node.try_acquire("k", owner, ttl).await.unwrap() {
        Attempt::Granted { fence, .. } => fence,
        taken => panic!("free key refused: {taken:?}"),
    };
    assert!(node.release("k", owner).await.unwrap());
    // An hour ahead of the clock.
    let ahead = first + 3_600_000_000;
    assert!(node.raise_fence("k", ahead, ttl).await.unwrap());
    let owner = Owner::random();
    match node.try_acquire("k", owner, ttl).await.unwrap() {
        Attempt::Granted { fence, .. } => assert!(
            fence > ahead,
            "fence {fence} is not above the counter {ahead}"
        ),
        taken => panic!("free key refused: {taken:?}"),
    }
}

/// The whole conformance suite on Redis 5.0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_redis_5() {
    let server = redis5().await;
    run_all(&Target::new(Arc::new(backend(&server.url()).await))).await;
}
