//! The randomized exclusion checker on a real 3-member etcd cluster: three Lockers, each
//! over its own backend instance (its own client to every member), and two fault rounds
//! after the normal one: the leader killed (SIGKILL) and restarted past the longest TTL,
//! and the leader paused (SIGSTOP) past the longest TTL.
//!
//! On an etcd release before the mitigation of etcd issue 15247 (Debian's 3.4.23 is one),
//! a leader resuming from a stall longer than a lease's TTL revokes leases the new leader
//! kept alive: a lock is freed while its holder's TTL runs, and a second holder is granted
//! it. The pause round then allows that overlap, and its view through the fence, listed in
//! the report; every other check stays. The kill round allows nothing on any release: a
//! killed leader revokes nothing, and a restarted member comes back as a follower.
//! Each mode runs on a cluster of its own: locks, semaphores (permits), reader-writer keys
//! and elections. `DISTLOCK_SOAK_SECS` runs it longer (the other modes run 12 s without
//! it), `DISTLOCK_CHECK_SEED` replays a seed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use distlock::etcd::EtcdBackend;
use distlock::{Admin, Backend, Locker};
use lock_conformance::exclusion::{
    Exclusion, ExclusionConfig, Fault, Grants, Report, ViolationKind, SOAK_ENV,
};
use lock_testkit::EtcdCluster;
use tokio::sync::Mutex;

async fn backend(endpoints: &[String]) -> EtcdBackend {
    common::etcd_backend(endpoints, "prefix=excl/").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_etcd() {
    run(ExclusionConfig::from_env()).await.assert_clean();
}

/// The checker in its permits mode: semaphores of 3 permits, claims of 1 or 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_etcd_permits() {
    run(short().grants(Grants::Permits(3))).await.assert_clean();
}

/// The checker in its reader-writer mode: readers share a key, writers hold it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_etcd_reader_writer() {
    run(short().grants(Grants::ReaderWriter))
        .await
        .assert_clean();
}

/// The checker in its election mode: candidates campaign, proclaim, resign and drop;
/// one leader per election, fenced by term; observers' terms never go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_etcd_election() {
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

/// One run of the checker as `config` says, on a new 3-member cluster, with the etcd fault
/// rounds.
async fn run(config: ExclusionConfig) -> Report {
    let cluster = Arc::new(Mutex::new(EtcdCluster::start(3).await));
    let endpoints = cluster.lock().await.endpoints();
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(Locker::new(backend(&endpoints).await));
    }
    let probe_backend = Arc::new(backend(&endpoints).await);
    // Fewer keys and more tasks than the default: whole-second TTLs make few iterations,
    // and hand-overs (with renewals overlapping them) need siblings queued on one key.
    let config = config.keys(2).tasks_per_locker(4);
    // The checker's TTLs for etcd: whole seconds from the backend's minimum, up to 3×.
    let min_ttl = probe_backend
        .capabilities()
        .effective_ttl(Duration::from_millis(100))
        .expect("a valid TTL")
        .get();
    let past_ttl = min_ttl * 3 + Duration::from_secs(1);
    let kill = {
        let cluster = cluster.clone();
        Fault::new(
            "leader killed (SIGKILL), restarted past the longest TTL",
            move || {
                let cluster = cluster.clone();
                async move {
                    let leader = cluster.lock().await.leader().await;
                    cluster.lock().await.member_mut(leader).kill();
                    tokio::time::sleep(past_ttl).await;
                    cluster.lock().await.member_mut(leader).restart().await;
                }
            },
        )
    };
    let mut pause = {
        let cluster = cluster.clone();
        Fault::new("leader paused (SIGSTOP) past the longest TTL", move || {
            let cluster = cluster.clone();
            async move {
                let leader = cluster.lock().await.leader().await;
                cluster.lock().await.member(leader).pause();
                tokio::time::sleep(past_ttl).await;
                cluster.lock().await.member(leader).resume();
            }
        })
    };
    if probe_backend.revokes_live_leases_after_a_leader_stall() {
        eprintln!(
            "exclusion [etcd]: etcd {} revokes live leases after a leader stall (etcd issue \
             15247): the pause round allows the overlap it causes",
            probe_backend.server_version()
        );
        pause = pause
            .allow(
                ViolationKind::Overlap,
                "this etcd release's resumed leader revokes leases the new leader kept alive \
                 (etcd issue 15247, a server bug)",
            )
            .allow(
                ViolationKind::StaleFence,
                "the holder of a lock the server revoked is refused by its lower fence",
            );
    }
    let report = Exclusion::new(lockers)
        .config(config)
        .fault(kill)
        .fault(pause)
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
    report
}
