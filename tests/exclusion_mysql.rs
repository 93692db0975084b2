//! The randomized exclusion checker on one real MariaDB server: three Lockers, each over
//! its own backend instance connected through its own [`FaultProxy`], and three fault
//! rounds after the normal one: the server paused (SIGSTOP) past the longest TTL, killed
//! (`kill -9`) and restarted (crash recovery keeps every committed lock and the fences'
//! `AUTO_INCREMENT`), and one Locker's network blackholed past twice the longest TTL. No
//! fault is allowed any violation. Locks only (the backend keeps no permits), alone and
//! grouped. `DISTLOCK_SOAK_SECS` runs it longer, `DISTLOCK_CHECK_SEED` replays a seed.

mod common;
#[path = "common/sql_exclusion.rs"]
mod sql_exclusion;

use distlock::mysql::MysqlBackend;
use lock_conformance::exclusion::{ExclusionConfig, Report};
use lock_testkit::MariaDbServer;
use sql_exclusion::short;

async fn backend(addr: std::net::SocketAddr) -> MysqlBackend {
    common::mysql_backend(&common::mysql_url(addr, "table=exclusion&timeout=500ms")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_mysql() {
    run(ExclusionConfig::from_env()).await.assert_clean();
}

/// Many tasks per Locker on more keys, so that acquisitions and releases queue and go as
/// grouped scripts (one transaction, its keys' rows locked in ascending order) while other
/// Lockers' grouped scripts contend for the same rows, through the same faults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_mysql_grouped() {
    let mut config = short();
    config.tasks_per_locker = 16;
    config.keys = 12;
    run(config).await.assert_clean();
}

/// One run of the checker as `config` says, with the fault rounds of
/// [`sql_exclusion::run`].
async fn run(config: ExclusionConfig) -> Report {
    sql_exclusion::run(config, MariaDbServer::start().await, backend).await
}
