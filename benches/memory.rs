//! Memory backend against its peer, a `HashMap` of `tokio::sync::Mutex` per key, in the
//! same run: uncontended cycle, 64 tasks on distinct keys, 16 tasks on one key holding 1 ms.
//! The final report prints each result as a ratio to the peer.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    bench_subject, distinct_keys, rate, runtime, uncontended, Distlock, OneKey, Subject, WORKLOADS,
};
use criterion::{criterion_group, criterion_main, Criterion};
use distlock::{Locker, MemoryBackend};

type KeyedMutexes = HashMap<Arc<str>, Arc<tokio::sync::Mutex<()>>>;

/// The peer: a map of per-key tokio mutexes, entries removed when unused (like ours).
#[derive(Clone, Default)]
struct MutexMap {
    map: Arc<Mutex<KeyedMutexes>>,
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

fn ours() -> Distlock {
    Distlock::new(Locker::new(MemoryBackend::new()))
}

fn bench(c: &mut Criterion) {
    let rt = runtime();
    let (dl, peer) = (ours(), MutexMap::default());

    for w in WORKLOADS {
        let mut g = c.benchmark_group(w.group("memory"));
        bench_subject(&mut g, &rt, "distlock", &dl, w);
        bench_subject(&mut g, &rt, "tokio-mutex-map", &peer, w);
        g.finish();
    }

    report(&rt, &dl, &peer);
}

/// Ratios against the peer, measured back to back in this run.
fn report(rt: &tokio::runtime::Runtime, dl: &Distlock, peer: &MutexMap) {
    let run_for = Duration::from_secs(1);
    rt.block_on(async {
        let ours_1 = rate(run_for, |n| uncontended(dl, n)).await;
        let peer_1 = rate(run_for, |n| uncontended(peer, n)).await;
        let ours_64 = rate(run_for, |n| distinct_keys(dl, 64, n)).await;
        let peer_64 = rate(run_for, |n| distinct_keys(peer, 64, n)).await;
        let one = OneKey::run(dl, peer, Duration::from_secs(2)).await;
        eprintln!("\n== memory backend vs HashMap<tokio::sync::Mutex> (same run) ==");
        eprintln!(
            "uncontended, 1 task: {ours_1:.0} vs {peer_1:.0} cycles/s: peer/ours time ratio {:.2}x (goal: ours within 2x of the peer)",
            peer_1 / ours_1
        );
        eprintln!(
            "64 tasks, distinct keys: {ours_64:.0} vs {peer_64:.0} cycles/s: ours/peer {:.2}",
            ours_64 / peer_64
        );
        one.print("tokio-mutex-map");
        eprintln!(
            "  worst wait within goal: {}",
            one.ours.worst_wait < one.ours.wait_bound()
        );
    });
}

criterion_group! {
    name = benches;
    config = common::criterion(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
