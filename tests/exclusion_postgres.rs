//! The randomized exclusion checker on one real PostgreSQL server: three Lockers, each over
//! its own backend instance connected through its own [`FaultProxy`], and three fault
//! rounds after the normal one: the server paused (SIGSTOP) past the longest TTL, killed
//! (`kill -9`) and restarted (crash recovery keeps every committed lock and the fence
//! sequence), and one Locker's network blackholed past twice the longest TTL. No fault is
//! allowed any violation. In each mode: locks (alone and grouped), semaphores (permits),
//! reader-writer keys and elections. `DISTLOCK_SOAK_SECS` runs it longer (the permits and
//! reader-writer modes run 12 s without it), `DISTLOCK_CHECK_SEED` replays a seed.

mod common;
#[path = "common/sql_exclusion.rs"]
mod sql_exclusion;

use distlock::postgres::PostgresBackend;
use lock_conformance::exclusion::{ExclusionConfig, Grants, Report};
use lock_testkit::PostgresServer;
use sql_exclusion::short;

async fn backend(addr: std::net::SocketAddr) -> PostgresBackend {
    common::postgres_backend(&common::postgres_url(addr, "table=exclusion&timeout=500ms")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_postgres() {
    run(ExclusionConfig::from_env()).await.assert_clean();
}

/// Many tasks per Locker on more keys, so that acquisitions and releases queue and go as
/// grouped statements (one statement over arrays, its keys' advisory locks taken in order)
/// while other Lockers' grouped statements contend for the same rows, through the same
/// faults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_postgres_grouped() {
    let mut config = ExclusionConfig::from_env();
    config.tasks_per_locker = 16;
    config.keys = 12;
    run(config).await.assert_clean();
}

/// The checker in its permits mode: semaphores of 3 permits, claims of 1 or 2 (each a
/// script under the key's advisory lock, beside the grouped statements of the locks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_postgres_permits() {
    run(short().grants(Grants::Permits(3))).await.assert_clean();
}

/// The checker in its reader-writer mode: readers share a key, writers hold it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_postgres_reader_writer() {
    run(short().grants(Grants::ReaderWriter))
        .await
        .assert_clean();
}

/// The checker in its election mode: candidates campaign, proclaim, resign and drop;
/// one leader per election, fenced by term; observers' terms never go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_postgres_election() {
    run(short().grants(Grants::Election)).await.assert_clean();
}

/// One run of the checker as `config` says, with the fault rounds of
/// [`sql_exclusion::run`].
async fn run(config: ExclusionConfig) -> Report {
    sql_exclusion::run(config, PostgresServer::start().await, backend).await
}
