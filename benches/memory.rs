//! Memory backend against its peer, a `HashMap` of `tokio::sync::Mutex` per key, in the
//! same run: distlock's guards ended by `release().await` and by drop, on the workloads of
//! every bench (see `common`), and once more with the watchdog off (`ours-nowd`: like for
//! like with the peer, which neither expires nor renews). Goal: an uncontended cycle within
//! 2x of the peer's.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use common::{
    named, ratio, Bench, Child, Distlock, End, Ratio, Settings, Subject, Workload, WORKLOADS,
};

type KeyedMutexes = HashMap<Arc<str>, Arc<tokio::sync::Mutex<()>>>;

/// The peer: a map of per-key tokio mutexes, entries removed when unused (like ours).
#[derive(Default)]
struct MutexMap {
    map: Mutex<KeyedMutexes>,
}

struct PeerGuard {
    key: Arc<str>,
    guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Subject for MutexMap {
    type Guard = PeerGuard;
    async fn lock(&self, key: Arc<str>) -> PeerGuard {
        let m = self
            .map
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .clone();
        PeerGuard {
            key,
            guard: m.lock_owned().await,
        }
    }
    async fn unlock(&self, g: PeerGuard) {
        let PeerGuard { key, guard } = g;
        let mut map = self.map.lock().unwrap();
        drop(guard);
        if map.get(&key).is_some_and(|m| Arc::strong_count(m) == 1) {
            map.remove(&key);
        }
    }
}

fn ratios(w: Workload) -> Vec<Ratio> {
    // The goal is a time ratio: our cycle within 2x of the peer's, so ours/peer >= 0.5.
    let goal = matches!(w, Workload::Lone).then_some(0.5);
    vec![
        ratio("ours", "mutex-map", goal),
        ratio("ours-drop", "mutex-map", goal),
        ratio("ours-drop", "ours", Some(0.95)),
        // Like for like with the peer, which neither expires nor renews.
        ratio("ours-nowd", "mutex-map", goal),
    ]
}

#[tokio::main]
async fn main() {
    let url = "memory://";
    if let Some(child) = Child::from_env() {
        match child.subject() {
            "ours" => child.run(&Distlock::connect(url, End::Release).await).await,
            "ours-drop" => child.run(&Distlock::connect(url, End::Drop).await).await,
            "ours-nowd" => {
                child
                    .run(&Distlock::without_watchdog(url, End::Release).await)
                    .await
            }
            "mutex-map" => child.run(&Arc::new(MutexMap::default())).await,
            other => panic!("no subject {other}"),
        }
        return;
    }
    let bench = Bench {
        backend: "memory",
        peers: "HashMap<Arc<str>, tokio::sync::Mutex>",
        subjects: vec![
            named("ours"),
            named("ours-drop"),
            named("ours-nowd"),
            named("mutex-map"),
        ],
        target: url.to_owned(),
        servers: Vec::new(),
        raw: None,
        settings: Settings::from_args(),
    };
    let measured = bench.run(&WORKLOADS).await;
    bench.report(&measured, ratios);
}
