//! Redis backend against its peers on one `redis-server` started by lock-testkit, in the
//! same run: rslock 0.10 (a Redlock client, here over one node) and the raw protocol limit
//! (`SET NX PX` then `DEL` with redis-rs: two round trips, no scripts, no policy).
//! Workloads: uncontended cycle, 64 tasks on distinct keys, 16 tasks on one key holding
//! 1 ms. Watchdog off on our side (rslock does not renew either). The final report prints
//! each result as a ratio to the peers.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{distinct_keys, one_key, rate, uncontended, Distlock, Subject};
use criterion::{criterion_group, criterion_main, Criterion};
use distlock::redis::RedisBackend;
use distlock::{LockUrl, Locker};
use lock_testkit::RedisServer;
use redis::aio::MultiplexedConnection;

const TTL: Duration = Duration::from_secs(10);

/// rslock's `LockManager` over the same server.
#[derive(Clone)]
struct Rslock {
    manager: rslock::LockManager,
}

impl Subject for Rslock {
    type Guard = rslock::LockGuard;
    async fn lock(&self, key: Arc<str>) -> rslock::LockGuard {
        self.manager
            .acquire(key.as_bytes(), TTL)
            .await
            .expect("rslock acquire")
    }
    async fn unlock(&self, guard: rslock::LockGuard) {
        guard.release().await;
    }
}

/// The raw protocol: `SET key token NX PX ttl`, then `DEL key` (no owner check on release,
/// no fencing, no notices): what two round trips on one multiplexed connection cost.
#[derive(Clone)]
struct RawProtocol {
    conn: MultiplexedConnection,
}

impl Subject for RawProtocol {
    type Guard = Arc<str>;
    async fn lock(&self, key: Arc<str>) -> Arc<str> {
        let mut conn = self.conn.clone();
        loop {
            let set: Option<String> = redis::cmd("SET")
                .arg(format!("raw:{key}"))
                .arg("token")
                .arg("NX")
                .arg("PX")
                .arg(TTL.as_millis() as u64)
                .query_async(&mut conn)
                .await
                .expect("raw SET");
            if set.is_some() {
                return key;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    async fn unlock(&self, key: Arc<str>) {
        let mut conn = self.conn.clone();
        let _: i64 = redis::cmd("DEL")
            .arg(format!("raw:{key}"))
            .query_async(&mut conn)
            .await
            .expect("raw DEL");
    }
}

struct Subjects {
    _server: RedisServer,
    ours: Distlock,
    rslock: Rslock,
    raw: RawProtocol,
}

async fn subjects() -> Subjects {
    let server = RedisServer::start().await;
    let url = LockUrl::parse(&server.url()).expect("test server URL");
    let backend = RedisBackend::connect(&url).await.expect("connect");
    let ours = Distlock::new(Locker::new(backend));
    let rslock = Rslock {
        manager: rslock::LockManager::new(vec![server.url()]),
    };
    let raw = RawProtocol {
        conn: server.client().await,
    };
    Subjects {
        _server: server,
        ours,
        rslock,
        raw,
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

    let mut g = c.benchmark_group("redis/uncontended");
    g.bench_function("distlock", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let ours = s.ours.clone();
            async move { uncontended(&ours, n).await }
        })
    });
    g.bench_function("rslock", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let rslock = s.rslock.clone();
            async move { uncontended(&rslock, n).await }
        })
    });
    g.bench_function("raw-set-nx-del", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let raw = s.raw.clone();
            async move { uncontended(&raw, n).await }
        })
    });
    g.finish();

    let mut g = c.benchmark_group("redis/64-tasks-distinct-keys");
    g.bench_function("distlock", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let ours = s.ours.clone();
            async move { distinct_keys(&ours, 64, n).await }
        })
    });
    g.bench_function("rslock", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let rslock = s.rslock.clone();
            async move { distinct_keys(&rslock, 64, n).await }
        })
    });
    g.bench_function("raw-set-nx-del", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let raw = s.raw.clone();
            async move { distinct_keys(&raw, 64, n).await }
        })
    });
    g.finish();

    report(&rt, &s);
}

/// Ratios against the peers, measured back to back in this run.
fn report(rt: &tokio::runtime::Runtime, s: &Subjects) {
    let run_for = Duration::from_secs(1);
    rt.block_on(async {
        let ours_1 = rate(run_for, |n| uncontended(&s.ours, n)).await;
        let rslock_1 = rate(run_for, |n| uncontended(&s.rslock, n)).await;
        let raw_1 = rate(run_for, |n| uncontended(&s.raw, n)).await;
        let ours_64 = rate(run_for, |n| distinct_keys(&s.ours, 64, n)).await;
        let rslock_64 = rate(run_for, |n| distinct_keys(&s.rslock, 64, n)).await;
        let raw_64 = rate(run_for, |n| distinct_keys(&s.raw, 64, n)).await;
        let hold = Duration::from_millis(1);
        let ours_one = one_key(&s.ours, 16, hold, Duration::from_secs(2)).await;
        let rslock_one = one_key(&s.rslock, 16, hold, Duration::from_secs(2)).await;
        eprintln!("\n== redis backend vs rslock 0.10 and raw SET NX PX + DEL (same server, same run) ==");
        eprintln!(
            "uncontended, 1 task: ours {ours_1:.0}, rslock {rslock_1:.0}, raw {raw_1:.0} cycles/s"
        );
        eprintln!(
            "  ours/rslock {:.2} (goal >= 1.3), ours/raw {:.2} (goal >= 0.8)",
            ours_1 / rslock_1,
            ours_1 / raw_1
        );
        eprintln!(
            "64 tasks, distinct keys: ours {ours_64:.0}, rslock {rslock_64:.0}, raw {raw_64:.0} cycles/s"
        );
        eprintln!(
            "  ours/rslock {:.2} (goal >= 1.2), ours/raw {:.2}",
            ours_64 / rslock_64,
            ours_64 / raw_64
        );
        eprintln!("16 tasks, one key, 1 ms hold:");
        eprintln!("  {}", ours_one.summary("distlock"));
        eprintln!("  {}", rslock_one.summary("rslock"));
        eprintln!(
            "  throughput ours/rslock {:.2} (goal >= 1.0); worst wait within 1.5 x tasks x hold: {}",
            ours_one.throughput() / rslock_one.throughput(),
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
