//! The ZooKeeper backend against a real three-member ensemble (lock-testkit): the whole
//! conformance suite (directly and through `distlock::connect`), bad input, grants (line
//! order, fences, cancelled waits, abandoned creates, elections) and faults (a member
//! killed, the leader paused, a client cut off past its session timeout).
//!
//! The ensemble is started once and shared by the tests of this binary (three JVMs are
//! the costly part); each test works under a root node of its own. The fault tests start
//! their own ensemble, since they kill and pause its members.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod conformance;
mod faults;
mod grants;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::rand_u32;
use distlock::zookeeper::ZooKeeperBackend;
use distlock::{Attempt, Backend, Error, LockOptions, LockUrl, Locker, Owner};
use lock_conformance::Target;
use lock_testkit::ZooKeeperEnsemble;

/// The ensemble the tests share, started on first use and killed when the binary exits.
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

/// A root node of its own for one test.
fn root(name: &str) -> String {
    format!("/t/{name}-{:08x}", rand_u32())
}

/// The shared ensemble's URL with a root of its own and `params`.
fn url(name: &str, params: &str) -> String {
    let ensemble = ensemble();
    let mut url = format!("zookeeper://{}{}", ensemble.hosts(), root(name));
    if !params.is_empty() {
        url.push('?');
        url.push_str(params);
    }
    url
}

async fn backend(url: &str) -> ZooKeeperBackend {
    ZooKeeperBackend::connect(&LockUrl::parse(url).unwrap())
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

fn key(name: &str) -> String {
    format!("{name}-{:08x}", rand_u32())
}
