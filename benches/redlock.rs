//! Redlock backend against its peer, rslock 0.10, on the same 3 `redis-server` nodes in the
//! same run: uncontended cycle on 1 task, 64 tasks on distinct keys, 16 tasks on one key
//! holding 1 ms. Fencing off for like for like (rslock has no fencing tokens), and the cost
//! of fencing on measured beside it. Watchdog off (rslock does not renew). The final report
//! prints each result as a ratio to the peer.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::{distinct_keys, one_key, rate, uncontended, Distlock, Subject};
use criterion::{criterion_group, criterion_main, Criterion};
use distlock::redlock::RedlockBackend;
use distlock::{LockUrl, Locker};
use lock_testkit::RedisNodes;

const TTL: Duration = Duration::from_secs(10);

/// The peer: rslock's `LockManager` over the same nodes, waiting with its own retry loop.
#[derive(Clone)]
struct Rslock {
    manager: rslock::LockManager,
}

impl Subject for Rslock {
    type Guard = rslock::Lock;
    async fn lock(&self, key: Arc<str>) -> rslock::Lock {
        self.manager
            .acquire_no_guard(&*key, TTL)
            .await
            .expect("rslock acquire")
    }
    async fn unlock(&self, lock: rslock::Lock) {
        self.manager.unlock(&lock).await;
    }
}

async fn ours(addrs: &[SocketAddr], fencing: bool) -> Distlock {
    let hosts: Vec<String> = addrs.iter().map(SocketAddr::to_string).collect();
    let url = format!("redlock://{}?fencing={fencing}", hosts.join(","));
    let backend = RedlockBackend::connect(&LockUrl::parse(&url).unwrap())
        .await
        .expect("connect to the bench nodes");
    Distlock::new(Locker::new(backend))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn cpu_probe(rt: &tokio::runtime::Runtime, nodes: &RedisNodes, plain: &Distlock, fenced: &Distlock, peer: &Rslock) {
    let n = 60_000u64;
    let only = std::env::var("REDLOCK_CPU_PROBE").unwrap();
    for (name, tasks) in [("plain", 64usize), ("fenced", 64), ("rslock", 64), ("plain", 1), ("rslock", 1)] {
        if only != "all" && only != format!("{name}{tasks}") { continue; }
        let n = if tasks == 1 { n / 10 } else { n };
        let me = std::process::id();
        let pids: Vec<u32> = nodes.nodes().iter().map(|s| s.pid().unwrap()).collect();
        let c0 = cpu_ticks(me);
        let s0: u64 = pids.iter().map(|p| cpu_ticks(*p)).sum();
        let took = rt.block_on(async {
            match name {
                "plain" => distinct_keys(plain, tasks, n).await,
                "fenced" => distinct_keys(fenced, tasks, n).await,
                _ => distinct_keys(peer, tasks, n).await,
            }
        });
        let c1 = cpu_ticks(me);
        let s1: u64 = pids.iter().map(|p| cpu_ticks(*p)).sum();
        eprintln!("{name} x{tasks}: {:.1} us/cycle wall, client {:.1} us CPU/cycle, servers {:.1} us CPU/cycle",
            took.as_secs_f64() * 1e6 / n as f64,
            (c1 - c0) as f64 * 1e4 / n as f64,
            (s1 - s0) as f64 * 1e4 / n as f64);
    }
}

fn bench(c: &mut Criterion) {
    let rt = runtime();
    let (_nodes, plain, fenced, peer) = rt.block_on(async {
        let nodes = RedisNodes::start(3).await;
        let plain = ours(&nodes.addrs(), false).await;
        let fenced = ours(&nodes.addrs(), true).await;
        let peer = Rslock {
            manager: rslock::LockManager::new(nodes.urls()),
        };
        (nodes, plain, fenced, peer)
    });

    if std::env::var_os("REDLOCK_CPU_PROBE").is_some() {
        cpu_probe(&rt, &_nodes, &plain, &fenced, &peer);
        return;
    }
    let mut g = c.benchmark_group("redlock/uncontended");
    g.bench_function("distlock", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let s = plain.clone();
            async move { uncontended(&s, n).await }
        })
    });
    g.bench_function("distlock-fencing", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let s = fenced.clone();
            async move { uncontended(&s, n).await }
        })
    });
    g.bench_function("rslock", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let s = peer.clone();
            async move { uncontended(&s, n).await }
        })
    });
    g.finish();

    let mut g = c.benchmark_group("redlock/64-tasks-distinct-keys");
    g.bench_function("distlock", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let s = plain.clone();
            async move { distinct_keys(&s, 64, n).await }
        })
    });
    g.bench_function("distlock-fencing", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let s = fenced.clone();
            async move { distinct_keys(&s, 64, n).await }
        })
    });
    g.bench_function("rslock", |b| {
        b.to_async(&rt).iter_custom(|n| {
            let s = peer.clone();
            async move { distinct_keys(&s, 64, n).await }
        })
    });
    g.finish();

    if std::env::var_os("REDLOCK_BENCH_NO_REPORT").is_none() {
        report(&rt, &plain, &fenced, &peer);
    }
}

/// Ratios against the peer, measured back to back in this run.
fn report(rt: &tokio::runtime::Runtime, plain: &Distlock, fenced: &Distlock, peer: &Rslock) {
    let run_for = Duration::from_secs(2);
    rt.block_on(async {
        let ours_1 = rate(run_for, |n| uncontended(plain, n)).await;
        let fenced_1 = rate(run_for, |n| uncontended(fenced, n)).await;
        let peer_1 = rate(run_for, |n| uncontended(peer, n)).await;
        let ours_64 = rate(run_for, |n| distinct_keys(plain, 64, n)).await;
        let fenced_64 = rate(run_for, |n| distinct_keys(fenced, 64, n)).await;
        let peer_64 = rate(run_for, |n| distinct_keys(peer, 64, n)).await;
        let hold = Duration::from_millis(1);
        let ours_one = one_key(plain, 16, hold, Duration::from_secs(3)).await;
        let fenced_one = one_key(fenced, 16, hold, Duration::from_secs(3)).await;
        let peer_one = one_key(peer, 16, hold, Duration::from_secs(3)).await;
        eprintln!("\n== redlock backend (3 nodes) vs rslock 0.10 on the same nodes (same run) ==");
        eprintln!(
            "uncontended, 1 task: distlock {ours_1:.0}, rslock {peer_1:.0} cycles/s: \
             ours/rslock {:.2}x (goal >= 1.3x)",
            ours_1 / peer_1
        );
        eprintln!(
            "64 tasks, distinct keys: distlock {ours_64:.0}, rslock {peer_64:.0} cycles/s: \
             ours/rslock {:.2}x (goal >= 1.5x)",
            ours_64 / peer_64
        );
        eprintln!(
            "fencing on: 1 task {fenced_1:.0} cycles/s ({:.2}x the cost of fencing off), \
             64 tasks {fenced_64:.0} cycles/s ({:.2}x); vs rslock {:.2}x / {:.2}x",
            ours_1 / fenced_1,
            ours_64 / fenced_64,
            fenced_1 / peer_1,
            fenced_64 / peer_64,
        );
        eprintln!("16 tasks, one key, 1 ms hold:");
        eprintln!("  {}", ours_one.summary("distlock"));
        eprintln!("  {}", fenced_one.summary("distlock-fencing"));
        eprintln!("  {}", peer_one.summary("rslock"));
        eprintln!(
            "  throughput ours/rslock {:.2}x; worst wait within goal: {} (rslock: {})",
            ours_one.throughput() / peer_one.throughput(),
            ours_one.worst_wait < ours_one.wait_bound(),
            peer_one.worst_wait < peer_one.wait_bound(),
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
