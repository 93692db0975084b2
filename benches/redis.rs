//! Redis backend against its peers on one `redis-server` started by lock-testkit, in the
//! same run: rslock 0.10 (a Redlock client, here over one node) and the raw protocol limit
//! (`SET NX PX` then `DEL` with redis-rs: two round trips, no scripts, no policy).
//! Workloads: uncontended cycle, 64 tasks on distinct keys, 16 tasks on one key holding
//! 1 ms. Watchdog off on our side (rslock does not renew either). The final report prints
//! each result as a ratio to the peers.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{distinct_keys, one_key, uncontended, Distlock, Subject};
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

/// Cycles per second of `batch` in `ROUNDS` rounds of about `ROUND` each, after sizing the
/// batch once; the rounds of all subjects of a workload are interleaved by the caller.
const ROUNDS: usize = 7;
const ROUND: Duration = Duration::from_millis(300);

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

/// CPU seconds (user + system) used by this process so far, from `/proc/self/stat` (clock
/// ticks of 10 ms: precise enough over the whole measurement); 0 where unavailable.
fn process_cpu() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU seconds (user + system) used by redis-server so far (`INFO cpu`).
async fn server_cpu(conn: &mut MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .expect("INFO cpu");
    info.lines()
        .filter(|l| l.starts_with("used_cpu_user:") || l.starts_with("used_cpu_sys:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Ratios against the peers, measured in interleaved rounds in this run (the machine may be
/// shared, so each round compares subjects measured back to back and the median is kept).
fn report(rt: &tokio::runtime::Runtime, s: &Subjects) {
    rt.block_on(async {
        // Uncontended and 64 distinct keys: ours, rslock, raw, round after round.
        let mut lines = Vec::new();
        for tasks in [1usize, 64] {
            let run = |subject: usize, n: u64| {
                let (ours, rslock, raw) = (s.ours.clone(), s.rslock.clone(), s.raw.clone());
                async move {
                    match (subject, tasks) {
                        (0, 1) => uncontended(&ours, n).await,
                        (1, 1) => uncontended(&rslock, n).await,
                        (2, 1) => uncontended(&raw, n).await,
                        (0, t) => distinct_keys(&ours, t, n).await,
                        (1, t) => distinct_keys(&rslock, t, n).await,
                        (_, t) => distinct_keys(&raw, t, n).await,
                    }
                }
            };
            let mut sizes = [0u64; 3];
            for (i, size) in sizes.iter_mut().enumerate() {
                *size = batch_size(|n| run(i, n)).await;
            }
            let mut rates = [Vec::new(), Vec::new(), Vec::new()];
            let (mut vs_rslock, mut vs_raw) = (Vec::new(), Vec::new());
            // CPU spent per cycle by this process (client) and by redis-server, summed over
            // the rounds: unlike throughput, it does not depend on what else the machine runs.
            let mut cpu = [(0f64, 0f64, 0f64); 3];
            let mut info = s.raw.conn.clone();
            for _ in 0..ROUNDS {
                let mut r = [0f64; 3];
                for i in 0..3 {
                    let (client, server) = (process_cpu(), server_cpu(&mut info).await);
                    r[i] = sizes[i] as f64 / run(i, sizes[i]).await.as_secs_f64();
                    cpu[i].0 += sizes[i] as f64;
                    cpu[i].1 += process_cpu() - client;
                    cpu[i].2 += server_cpu(&mut info).await - server;
                    rates[i].push(r[i]);
                }
                vs_rslock.push(r[0] / r[1]);
                vs_raw.push(r[0] / r[2]);
            }
            let [ours, rslock, raw] = rates.map(median);
            let per_cycle = cpu.map(|(cycles, client, server)| {
                (client * 1e6 / cycles, server * 1e6 / cycles)
            });
            lines.push((tasks, ours, rslock, raw, median(vs_rslock), median(vs_raw), per_cycle));
        }
        let hold = Duration::from_millis(1);
        let ours_one = one_key(&s.ours, 16, hold, Duration::from_secs(2)).await;
        let rslock_one = one_key(&s.rslock, 16, hold, Duration::from_secs(2)).await;

        eprintln!("\n== redis backend vs rslock 0.10 and raw SET NX PX + DEL (same server, same run) ==");
        eprintln!("(medians over {ROUNDS} interleaved rounds of ~{ROUND:?} per subject)");
        for (tasks, ours, rslock, raw, vs_rslock, vs_raw, per_cycle) in lines {
            let (name, goal_rslock, goal_raw) = if tasks == 1 {
                ("uncontended, 1 task", " (goal >= 1.3)", " (goal >= 0.8)")
            } else {
                ("64 tasks, distinct keys", " (goal >= 1.2)", "")
            };
            eprintln!("{name}: ours {ours:.0}, rslock {rslock:.0}, raw {raw:.0} cycles/s");
            eprintln!("  ours/rslock {vs_rslock:.2}{goal_rslock}, ours/raw {vs_raw:.2}{goal_raw}");
            let [o, r, w] = per_cycle;
            eprintln!(
                "  CPU per cycle (client + server, µs): ours {:.1} + {:.1}, rslock {:.1} + {:.1}, raw {:.1} + {:.1}",
                o.0, o.1, r.0, r.1, w.0, w.1
            );
        }
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
