//! Memory backend against its peer, a `HashMap` of `tokio::sync::Mutex` per key, in the
//! same run: uncontended cycle, 64 tasks on distinct keys, 16 tasks on one key holding 1 ms.
//! The final report prints each result as a ratio to the peer.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{distinct_keys, one_key, rate, uncontended, Distlock, Subject};
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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn bench(c: &mut Criterion) {
    let rt = runtime();
    let (dl, peer) = (ours(), MutexMap::default());

    let mut g = c.benchmark_group("memory/uncontended");
    g.bench_function("distlock", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let dl = dl.clone();
            async move { uncontended(&dl, n).await }
        })
    });
    g.bench_function("tokio-mutex-map", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let peer = peer.clone();
            async move { uncontended(&peer, n).await }
        })
    });
    g.finish();

    let mut g = c.benchmark_group("memory/64-tasks-distinct-keys");
    g.bench_function("distlock", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let dl = dl.clone();
            async move { distinct_keys(&dl, 64, n).await }
        })
    });
    g.bench_function("tokio-mutex-map", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let peer = peer.clone();
            async move { distinct_keys(&peer, 64, n).await }
        })
    });
    g.finish();

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
        let hold = Duration::from_millis(1);
        let ours_one = one_key(dl, 16, hold, Duration::from_secs(2)).await;
        let peer_one = one_key(peer, 16, hold, Duration::from_secs(2)).await;
        eprintln!("\n== memory backend vs HashMap<tokio::sync::Mutex> (same run) ==");
        eprintln!(
            "uncontended, 1 task: {ours_1:.0} vs {peer_1:.0} cycles/s: peer/ours time ratio {:.2}x (goal: ours within 2x of the peer)",
            peer_1 / ours_1
        );
        eprintln!(
            "64 tasks, distinct keys: {ours_64:.0} vs {peer_64:.0} cycles/s: ours/peer {:.2}",
            ours_64 / peer_64
        );
        eprintln!("16 tasks, one key, 1 ms hold:");
        eprintln!("  {}", ours_one.summary("distlock"));
        eprintln!("  {}", peer_one.summary("tokio-mutex-map"));
        eprintln!(
            "  worst wait within goal: {}",
            ours_one.worst_wait < ours_one.wait_bound()
        );
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
