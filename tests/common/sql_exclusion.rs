//! The exclusion checker's run over one real SQL server (MariaDB, PostgreSQL), shared by
//! `exclusion_mysql.rs` and `exclusion_postgres.rs`: three Lockers, each over its own
//! fault proxy to the server; the server paused (`SIGSTOP`) past the longest TTL, killed
//! (`kill -9`) and restarted, and one Locker's network blackholed past twice the longest
//! TTL; whatever the run leaves on a key is reported.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use distlock::{Admin, Backend, Locker};
use lock_conformance::exclusion::{Exclusion, ExclusionConfig, Fault, Report, SOAK_ENV};
use lock_testkit::{FaultProxy, ProxyMode};
use tokio::sync::Mutex;

use crate::common::Server;

/// The longest TTL the checker draws here.
pub const TTL_MAX: Duration = Duration::from_millis(600);

/// The configuration from the environment, 12 s long unless [`SOAK_ENV`] says otherwise.
pub fn short() -> ExclusionConfig {
    let config = ExclusionConfig::from_env();
    if std::env::var_os(SOAK_ENV).is_some() {
        config
    } else {
        config.duration(Duration::from_secs(12))
    }
}

/// One run of the checker as `config` says, on `server` (just started) with backends that
/// `backend` connects to an address, through the fault rounds above; whatever the run
/// leaves on a key (a lock, a holder of permits) is reported.
pub async fn run<S, B, F, Fut>(config: ExclusionConfig, server: S, backend: F) -> Report
where
    S: Server,
    B: Backend + Admin + 'static,
    F: Fn(SocketAddr) -> Fut,
    Fut: Future<Output = B>,
{
    let server = Arc::new(Mutex::new(server));
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
