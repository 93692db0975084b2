//! The etcd backend against real etcd processes (lock-testkit): the whole conformance suite
//! on one member (directly and through `distlock::connect`) and on a 3-member cluster; the
//! shared fault rules on one member (restart, kill, pause, blackholed network) and on a
//! cluster (a majority killed); then the cluster's own faults (killed leader, hung member),
//! the Jepsen rule for waiters, fencing across holders, bad input, semaphores and
//! reader-writer keys (the holder keys beside a lock key), and the raw baseline.

#[path = "../common/mod.rs"]
mod common;

mod conformance;
mod election;
mod extend;
mod faults;
mod fencing;
mod handover;
mod permits;
mod raw_baseline;
mod records;
mod settings;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{etcd_backend as backend, etcd_url, rand_u32, Proxied};
use distlock::etcd::EtcdBackend;
use distlock::{Admin, Backend, Error, LockOptions, LockUrl, Locker};
use lock_conformance::{
    queued_holder, queued_holder_and_waiter, run_all, run_faults, spawn_acquire, Faults, Target,
};
use lock_testkit::{EtcdCluster, EtcdServer, FaultProxy, ProxyMode};
use tokio::sync::Mutex;

/// Time for a waiter to queue before the holder moves.
const SETTLE: Duration = Duration::from_millis(300);

fn opts(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).skip()
}

/// A 5 s lock, waited for up to 10 s, not renewed.
fn waiting() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(Duration::from_secs(10))
        .watchdog(false)
}

fn key(name: &str) -> String {
    format!("{name}-{:08x}", rand_u32())
}

/// Records holders of one key: panics if two are ever inside at once, and checks that the
/// fences seen in order of entry strictly increase.
#[derive(Default)]
struct Resource {
    inside: AtomicUsize,
    last_fence: AtomicU64,
    entries: AtomicUsize,
}

impl Resource {
    fn enter(&self, fence: u64) {
        assert_eq!(
            self.inside.fetch_add(1, Ordering::SeqCst),
            0,
            "two holders at once"
        );
        let last = self.last_fence.swap(fence, Ordering::SeqCst);
        assert!(fence > last, "fence {fence} after {last}: not increasing");
        self.entries.fetch_add(1, Ordering::SeqCst);
    }
    fn leave(&self) {
        assert_eq!(
            self.inside.fetch_sub(1, Ordering::SeqCst),
            1,
            "two holders at once"
        );
    }
}

/// A watch of `key` that etcd has created: every event after the call returns is seen.
async fn created_watch(
    client: &mut etcd_client::Client,
    key: impl Into<Vec<u8>>,
    options: etcd_client::WatchOptions,
) -> etcd_client::WatchStream {
    let mut stream = client.watch(key, Some(options)).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("etcd answers a new watch")
        .unwrap()
        .expect("an open watch");
    assert!(
        first.created() && !first.canceled(),
        "the first answer creates the watch"
    );
    stream
}
