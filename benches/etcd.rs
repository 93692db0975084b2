//! etcd backend against its peer on one etcd started by lock-testkit, in the same run:
//! etcd's own lock RPC (etcd-client's `lock`/`unlock`, each task's locks on a lease of its
//! own, reused, as a worker with one session would). Workloads: uncontended cycle, 64 tasks
//! on distinct keys, 16 tasks on one key holding 1 ms. Watchdog off on our side (the lock
//! RPC does not renew either). The final report prints each result as a ratio to the peer.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{distinct_keys, one_key, uncontended, Distlock, Subject};
use criterion::{criterion_group, criterion_main, Criterion};
use distlock::etcd::EtcdBackend;
use distlock::Locker;
use etcd_client::{Client, LockOptions};
use lock_testkit::EtcdServer;

/// TTL of the peer's leases: longer than the whole run, so nobody needs to renew them.
const PEER_LEASE_SECS: i64 = 3600;

/// etcd's lock RPC. A waiter's lock key is named after its lease, so two waiters sharing a
/// lease would both "hold" the lock: each lock call takes a lease of its own from a free
/// list (granting one when empty) and gives it back on unlock.
#[derive(Clone)]
struct LockRpc {
    client: Client,
    leases: Arc<Mutex<Vec<i64>>>,
}

impl LockRpc {
    async fn lease(&self) -> i64 {
        let free = self.leases.lock().unwrap().pop();
        match free {
            Some(id) => id,
            None => self
                .client
                .clone()
                .lease_grant(PEER_LEASE_SECS, None)
                .await
                .expect("peer lease grant")
                .id(),
        }
    }
}

impl Subject for LockRpc {
    type Guard = (Vec<u8>, i64);
    async fn lock(&self, key: Arc<str>) -> (Vec<u8>, i64) {
        let lease = self.lease().await;
        let held = self
            .client
            .clone()
            .lock(key.as_bytes(), Some(LockOptions::new().with_lease(lease)))
            .await
            .expect("lock RPC");
        (held.key().to_vec(), lease)
    }
    async fn unlock(&self, (key, lease): (Vec<u8>, i64)) {
        self.client.clone().unlock(key).await.expect("unlock RPC");
        self.leases.lock().unwrap().push(lease);
    }
}

struct Subjects {
    _server: EtcdServer,
    ours: Distlock,
    peer: LockRpc,
}

async fn subjects() -> Subjects {
    let server = EtcdServer::start().await;
    let backend = EtcdBackend::builder([server.endpoint()])
        .build()
        .await
        .expect("connect");
    let ours = Distlock::new(Locker::new(backend));
    let peer = LockRpc {
        client: Client::connect([server.endpoint()], None)
            .await
            .expect("peer connect"),
        leases: Arc::default(),
    };
    Subjects {
        _server: server,
        ours,
        peer,
    }
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
    let s = rt.block_on(subjects());

    let mut g = c.benchmark_group("etcd/uncontended");
    g.bench_function("distlock", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let ours = s.ours.clone();
            async move { uncontended(&ours, n).await }
        })
    });
    g.bench_function("etcd-lock-rpc", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let peer = s.peer.clone();
            async move { uncontended(&peer, n).await }
        })
    });
    g.finish();

    let mut g = c.benchmark_group("etcd/64-tasks-distinct-keys");
    g.bench_function("distlock", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let ours = s.ours.clone();
            async move { distinct_keys(&ours, 64, n).await }
        })
    });
    g.bench_function("etcd-lock-rpc", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let peer = s.peer.clone();
            async move { distinct_keys(&peer, 64, n).await }
        })
    });
    g.finish();

    report(&rt, &s);
}

/// Cycles per second measured in `ROUNDS` rounds of about `ROUND` per subject, ours and the
/// peer back to back in each round (the machine may be shared), medians kept.
const ROUNDS: usize = 7;
const ROUND: Duration = Duration::from_millis(400);

async fn batch_size<F, Fut>(mut batch: F) -> u64
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Duration>,
{
    let mut n = 16u64;
    loop {
        let took = batch(n).await;
        if took >= ROUND / 4 || n > 1 << 24 {
            return ((n as f64) * ROUND.as_secs_f64() / took.as_secs_f64().max(1e-9)).max(1.0)
                as u64;
        }
        n *= 4;
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn report(rt: &tokio::runtime::Runtime, s: &Subjects) {
    rt.block_on(async {
        let mut lines = Vec::new();
        for tasks in [1usize, 64] {
            let run = |ours: bool, n: u64| {
                let (o, p) = (s.ours.clone(), s.peer.clone());
                async move {
                    match (ours, tasks) {
                        (true, 1) => uncontended(&o, n).await,
                        (false, 1) => uncontended(&p, n).await,
                        (true, t) => distinct_keys(&o, t, n).await,
                        (false, t) => distinct_keys(&p, t, n).await,
                    }
                }
            };
            let sizes = [
                batch_size(|n| run(true, n)).await,
                batch_size(|n| run(false, n)).await,
            ];
            let (mut ours, mut peer, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                let o = sizes[0] as f64 / run(true, sizes[0]).await.as_secs_f64();
                let p = sizes[1] as f64 / run(false, sizes[1]).await.as_secs_f64();
                ours.push(o);
                peer.push(p);
                ratio.push(o / p);
            }
            lines.push((tasks, median(ours), median(peer), median(ratio)));
        }
        let hold = Duration::from_millis(1);
        let ours_one = one_key(&s.ours, 16, hold, Duration::from_secs(3)).await;
        let peer_one = one_key(&s.peer, 16, hold, Duration::from_secs(3)).await;
        eprintln!("\n== etcd backend vs etcd's lock RPC (same server, same run) ==");
        eprintln!("(medians over {ROUNDS} interleaved rounds of ~{ROUND:?} per subject)");
        for (tasks, ours, peer, ratio) in lines {
            let name = if tasks == 1 {
                "uncontended, 1 task"
            } else {
                "64 tasks, distinct keys"
            };
            eprintln!("{name}: ours {ours:.0}, lock RPC {peer:.0} cycles/s");
            eprintln!("  ours/lock RPC {ratio:.2} (goal >= 1.0)");
        }
        eprintln!("16 tasks, one key, 1 ms hold:");
        eprintln!("  {}", ours_one.summary("distlock"));
        eprintln!("  {}", peer_one.summary("etcd-lock-rpc"));
        eprintln!(
            "  throughput ours/lock RPC {:.2}; worst wait within 1.5 x tasks x hold: {}",
            ours_one.throughput() / peer_one.throughput(),
            ours_one.worst_wait < ours_one.wait_bound()
        );
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
