//! The randomized exclusion checker on one real MariaDB server: three Lockers, each over
//! its own backend instance connected through its own [`FaultProxy`], and three fault
//! rounds after the normal one: the server paused (SIGSTOP) past the longest TTL, killed
//! (`kill -9`) and restarted (crash recovery keeps every committed lock and the fences'
//! `AUTO_INCREMENT`), and one Locker's network blackholed past twice the longest TTL. No
//! fault is allowed any violation. Locks only (the backend keeps no permits), alone and
//! grouped. `DISTLOCK_SOAK_SECS` runs it longer, `DISTLOCK_CHECK_SEED` replays a seed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use distlock::mysql::MysqlBackend;
use distlock::{Admin, Locker};
use lock_conformance::exclusion::{Exclusion, ExclusionConfig, Fault, Report, SOAK_ENV};
use lock_testkit::{FaultProxy, MariaDbServer, ProxyMode};
use tokio::sync::Mutex;

/// The longest TTL the checker draws here.
const TTL_MAX: Duration = Duration::from_millis(600);

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

/// The configuration from the environment, 12 s long unless [`SOAK_ENV`] says otherwise.
fn short() -> ExclusionConfig {
    let config = ExclusionConfig::from_env();
    if std::env::var_os(SOAK_ENV).is_some() {
        config
    } else {
        config.duration(Duration::from_secs(12))
    }
}

/// One run of the checker as `config` says, with the MariaDB fault rounds; whatever the
/// run leaves on a key is reported.
async fn run(config: ExclusionConfig) -> Report {
    let server = Arc::new(Mutex::new(MariaDbServer::start().await));
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
