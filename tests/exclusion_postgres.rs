//! The randomized exclusion checker on one real PostgreSQL server: three Lockers, each over
//! its own backend instance connected through its own [`FaultProxy`], and three fault
//! rounds after the normal one: the server paused (SIGSTOP) past the longest TTL, killed
//! (`kill -9`) and restarted (crash recovery keeps every committed lock and the fence
//! sequence), and one Locker's network blackholed past twice the longest TTL. No fault is
//! allowed any violation. In each mode: locks (alone and grouped), semaphores (permits),
//! reader-writer keys and elections. `DISTLOCK_SOAK_SECS` runs it longer (the permits and
//! reader-writer modes run 12 s without it), `DISTLOCK_CHECK_SEED` replays a seed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use distlock::postgres::PostgresBackend;
use distlock::{Admin, Locker};
use lock_conformance::exclusion::{Exclusion, ExclusionConfig, Fault, Grants, Report, SOAK_ENV};
use lock_testkit::{FaultProxy, PostgresServer, ProxyMode};
use tokio::sync::Mutex;

/// The longest TTL the checker draws here.
const TTL_MAX: Duration = Duration::from_millis(600);

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

/// The configuration from the environment, 12 s long unless [`SOAK_ENV`] says otherwise.
fn short() -> ExclusionConfig {
    let config = ExclusionConfig::from_env();
    if std::env::var_os(SOAK_ENV).is_some() {
        config
    } else {
        config.duration(Duration::from_secs(12))
    }
}

/// One run of the checker as `config` says, with the PostgreSQL fault rounds; whatever
/// the run leaves on a key (a lock, a holder of permits) is reported.
async fn run(config: ExclusionConfig) -> Report {
    let server = Arc::new(Mutex::new(PostgresServer::start().await));
    let addr = server.lock().await.addr();
    let mut proxies = Vec::new();
    let mut lockers = Vec::new();
    for _ in 0..3 {
        let proxy = FaultProxy::start(addr).await;
        lockers.push(Locker::new(backend(proxy.addr()).await));
        proxies.push(Arc::new(proxy));
    }
    let probe_backend = Arc::new(backend(addr).await);
    let config = config.ttl_range(Duration::from_millis(100), TTL_MAX);
    let past_ttl = TTL_MAX + Duration::from_millis(500);

    let pause = {
        let server = server.clone();
        Fault::new("server paused (SIGSTOP) past the longest TTL", move || {
            let server = server.clone();
            async move {
                server.lock().await.pause();
                tokio::time::sleep(past_ttl).await;
                server.lock().await.resume();
            }
        })
    };
    let crash = {
        let server = server.clone();
        Fault::new("server killed (SIGKILL) and restarted", move || {
            let server = server.clone();
            async move {
                let mut server = server.lock().await;
                server.kill();
                tokio::time::sleep(Duration::from_millis(200)).await;
                server.restart().await;
            }
        })
    };
    let blackhole = {
        let proxy = proxies[0].clone();
        Fault::new(
            "L0's network blackholed past twice the longest TTL",
            move || {
                let proxy = proxy.clone();
                async move {
                    proxy.set_mode(ProxyMode::Blackhole);
                    tokio::time::sleep(TTL_MAX * 2 + Duration::from_millis(500)).await;
                    proxy.set_mode(ProxyMode::Pass);
                }
            },
        )
    };
    let report = Exclusion::new(lockers)
        .config(config)
        .fault(pause)
        .fault(crash)
        .fault(blackhole)
        .keys_left(move |names| {
            let backend = probe_backend.clone();
            async move {
                let mut left = Vec::new();
                for name in names {
                    match backend.inspect(&name).await {
                        Ok(holders) if holders.is_empty() => {}
                        Ok(holders) => left.push(format!("{name} ({holders:?})")),
                        Err(e) => left.push(format!("{name} (inspect failed: {e})")),
                    }
                }
                left
            }
        })
        .run()
        .await;
    drop(proxies);
    report
}
