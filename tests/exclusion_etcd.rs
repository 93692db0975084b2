//! The randomized exclusion checker on a real 3-member etcd cluster: three Lockers, each
//! over its own backend instance (its own client to every member), and one fault round
//! after the normal one: the leader paused (SIGSTOP) past the longest TTL.
//! `DISTLOCK_SOAK_SECS` runs it longer, `DISTLOCK_CHECK_SEED` replays a seed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use distlock::conformance::exclusion::{Exclusion, ExclusionConfig, Fault};
use distlock::etcd::EtcdBackend;
use distlock::{Admin, Backend, Locker};
use lock_testkit::EtcdCluster;

async fn backend(endpoints: &[String]) -> EtcdBackend {
    common::etcd_backend(endpoints, "prefix=excl/").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_etcd() {
    let cluster = Arc::new(EtcdCluster::start(3).await);
    let endpoints = cluster.endpoints();
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(Locker::new(backend(&endpoints).await));
    }
    let probe_backend = Arc::new(backend(&endpoints).await);
    // Fewer keys and more tasks than the default: whole-second TTLs make few iterations,
    // and hand-overs (with renewals overlapping them) need siblings queued on one key.
    let config = ExclusionConfig::from_env().keys(2).tasks_per_locker(4);
    // The checker's TTLs for etcd: whole seconds from the backend's minimum, up to 3×.
    let min_ttl = probe_backend
        .capabilities()
        .effective_ttl(Duration::from_millis(100))
        .expect("a valid TTL")
        .get();
    let past_ttl = min_ttl * 3 + Duration::from_secs(1);
    let pause = {
        let cluster = cluster.clone();
        Fault::new("leader paused (SIGSTOP) past the longest TTL", move || {
            let cluster = cluster.clone();
            async move {
                let leader = cluster.leader().await;
                cluster.member(leader).pause();
                tokio::time::sleep(past_ttl).await;
                cluster.member(leader).resume();
            }
        })
    };
    let report = Exclusion::new(lockers)
        .config(config)
        .fault(pause)
        .keys_left(move |names| {
            let backend = probe_backend.clone();
            async move {
                let mut left = Vec::new();
                for name in names {
                    match backend.inspect(&name).await {
                        Ok(None) => {}
                        Ok(Some(holder)) => left.push(format!("{name} ({holder:?})")),
                        Err(e) => left.push(format!("{name} (inspect failed: {e})")),
                    }
                }
                left
            }
        })
        .run()
        .await;
    report.assert_clean();
}
