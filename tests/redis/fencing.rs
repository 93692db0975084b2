//! Tombstone retention and fences in a tight loop.

use super::*;

/// The tombstone of an abandoned attempt lives `ABANDON_TIMEOUTS` operation timeouts of
/// the abandoning handle (at least `MIN_ABANDON_RETENTION`), not a fixed ten minutes: a
/// service cancelling many attempts a second would otherwise keep hundreds of thousands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tombstone_lives_a_bounded_number_of_timeouts() {
    use distlock::redis::{ABANDON_TIMEOUTS, MIN_ABANDON_RETENTION};
    let server = RedisServer::start().await;
    let node = node(&server, "retention:").await;
    for timeout in [
        DEFAULT_TIMEOUT,
        Duration::from_millis(200),
        Duration::from_millis(10),
    ] {
        let handle = node.with_timeout(timeout);
        let owner = Owner::random();
        handle.abandon("k", owner).await.unwrap();
        let bound = (timeout * ABANDON_TIMEOUTS).max(MIN_ABANDON_RETENTION);
        assert_eq!(handle.abandon_retention(), bound);
        let mut raw = server.client().await;
        let pttl: i64 = redis::cmd("PTTL")
            .arg(handle.tombstone_key("k", owner))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(
            pttl > 0 && pttl as u128 <= bound.as_millis(),
            "timeout {timeout:?}: the tombstone's PTTL {pttl} ms is not within (0, {bound:?}]"
        );
    }
}

/// Grants of one key back to back, many within one millisecond of the server clock, get
/// strictly increasing fences on the installed Redis (tests/redis5.rs checks the same on
/// Redis 5.0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_strictly_increase_in_a_tight_loop() {
    let server = RedisServer::start().await;
    let node = node(&server, "tight:").await;
    let (fences, same_ms) = common::fences_of_a_tight_loop(&node, "k", 500).await;
    eprintln!("{same_ms} of 500 grants in the millisecond of the grant before");
    common::assert_strictly_increasing(&fences);
}
