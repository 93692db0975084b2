//! The randomized exclusion checker on a real three-member ZooKeeper ensemble: three
//! Lockers, each over its own backend (its own session, 2 s timeout) connected through its
//! own [`FaultProxy`] in front of a member of its own, and four fault rounds after the
//! normal one: the leader paused (SIGSTOP) past the session timeout, a member killed
//! (`kill -9`) and restarted, L0's network blackholed past the session timeout, and L2's
//! ZooKeeper client frozen past the session timeout (the runtime running its session's
//! I/O, pings and watches blocked, as in a paused process: the ensemble expires the session
//! and hands its keys on). No fault is allowed any violation. Locks and elections, one
//! ensemble for both runs. `DISTLOCK_SOAK_SECS` runs it longer, `DISTLOCK_CHECK_SEED`
//! replays a seed.

mod common;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use distlock::zookeeper::ZooKeeperBackend;
use distlock::{Admin, LockUrl, Locker};
use lock_conformance::exclusion::{Exclusion, ExclusionConfig, Fault, Grants, Report, SOAK_ENV};
use lock_testkit::{FaultProxy, ProxyMode, ZooKeeperEnsemble};

/// The session timeout the Lockers ask for (the longest TTL).
const SESSION: Duration = Duration::from_secs(2);
/// The longest TTL the checker draws here.
const TTL_MAX: Duration = Duration::from_millis(1500);

/// The ensemble both runs share; the runs take turns (its members are paused and killed).
fn ensemble() -> &'static ZooKeeperEnsemble {
    static ENSEMBLE: OnceLock<ZooKeeperEnsemble> = OnceLock::new();
    ENSEMBLE.get_or_init(|| {
        std::thread::spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(ZooKeeperEnsemble::start())
        })
        .join()
        .expect("the ensemble starts")
    })
}

/// One run at a time on the shared ensemble.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn backend(hosts: &str, root: &str) -> ZooKeeperBackend {
    let url = format!(
        "zookeeper://{hosts}{root}?session_timeout={}ms&timeout=500ms",
        SESSION.as_millis()
    );
    ZooKeeperBackend::connect(&LockUrl::parse(&url).unwrap())
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_zookeeper() {
    run(short(), "/excl-locks").await.assert_clean();
}

/// The checker in its election mode: candidates campaign, proclaim, resign and drop; one
/// leader per election, fenced by term; observers' terms never go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_zookeeper_election() {
    run(short().grants(Grants::Election), "/excl-election")
        .await
        .assert_clean();
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

/// One run of the checker as `config` says, with the ZooKeeper fault rounds; whatever the
/// run leaves on a key is reported.
async fn run(config: ExclusionConfig, root: &str) -> Report {
    let ensemble = ensemble();
    let _turn = TURN.lock().await;
    let mut proxies = Vec::new();
    let mut lockers = Vec::new();
    for i in 0..2 {
        let proxy = FaultProxy::start(ensemble.addr(i)).await;
        lockers.push(Locker::new(backend(&proxy.addr().to_string(), root).await));
        proxies.push(Arc::new(proxy));
    }
    // L2's backend connects on a runtime of its own, which then runs its session's I/O.
    let frozen = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let frozen_thread = {
        let (tx, rx) = std::sync::mpsc::channel::<tokio::runtime::Handle>();
        let thread = std::thread::spawn(move || {
            tx.send(frozen.handle().clone()).unwrap();
            frozen.block_on(std::future::pending::<()>());
        });
        (rx.recv().unwrap(), thread)
    };
    let handle = frozen_thread.0.clone();
    let proxy2 = FaultProxy::start(ensemble.addr(2)).await;
    let hosts2 = proxy2.addr().to_string();
    let root2 = root.to_owned();
    let l2 = handle
        .spawn(async move { backend(&hosts2, &root2).await })
        .await
        .unwrap();
    lockers.push(Locker::new(l2));
    proxies.push(Arc::new(proxy2));
    let probe_backend = Arc::new(backend(&ensemble.hosts(), root).await);
    let config = config.ttl_range(Duration::from_millis(200), TTL_MAX);
    let past_session = SESSION + Duration::from_millis(800);

    let pause_leader = Fault::new(
        "the leader paused (SIGSTOP) past the session timeout",
        move || async move {
            if let Some(leader) = ensemble.leader().await {
                ensemble.pause(leader);
                tokio::time::sleep(past_session).await;
                ensemble.resume(leader);
            }
        },
    );
    let crash = Fault::new(
        "member 1 killed (SIGKILL) and restarted",
        move || async move {
            ensemble.kill(1);
            tokio::time::sleep(Duration::from_millis(500)).await;
            ensemble.restart(1).await;
        },
    );
    let blackhole = {
        let proxy = proxies[0].clone();
        Fault::new(
            "L0's network blackholed past the session timeout",
            move || {
                let proxy = proxy.clone();
                async move {
                    proxy.set_mode(ProxyMode::Blackhole);
                    tokio::time::sleep(past_session).await;
                    proxy.set_mode(ProxyMode::Pass);
                }
            },
        )
    };
    let freeze = {
        let handle = handle.clone();
        Fault::new(
            "L2's ZooKeeper client frozen past the session timeout",
            move || {
                let handle = handle.clone();
                async move {
                    let (started, blocked) = tokio::sync::oneshot::channel();
                    handle.spawn(async move {
                        let _ = started.send(());
                        std::thread::sleep(past_session);
                    });
                    let _ = blocked.await;
                    tokio::time::sleep(past_session).await;
                }
            },
        )
    };
    let report = Exclusion::new(lockers)
        .config(config)
        .fault(pause_leader)
        .fault(crash)
        .fault(blackhole)
        .fault(freeze)
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
