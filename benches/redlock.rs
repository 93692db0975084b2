//! Redlock backend against its peer, rslock 0.10, on the same 3 `redis-server` nodes in the
//! same run: uncontended cycle on 1 task, 64 tasks on distinct keys, 16 tasks on one key
//! holding 1 ms. Fencing off for like for like (rslock has no fencing tokens), and the cost
//! of fencing on measured beside it. Watchdog off (rslock does not renew).
//!
//! The final report prints each result as a ratio to the peer, taken over rounds that
//! alternate the two (so a change of load on a shared machine hits both alike), and the CPU
//! time per cycle of this process and of the Redis servers, which does not depend on what
//! else the machine runs.

mod common;
#[path = "common/rslock.rs"]
mod rslock_peer;

use std::net::SocketAddr;
use std::time::Duration;

use common::{
    batch_size, bench_subject, cpu_seconds, distinct_keys, median, one_key, runtime, uncontended,
    Distlock, WORKLOADS,
};
use criterion::{criterion_group, criterion_main, Criterion};
use distlock::redlock::RedlockBackend;
use distlock::{LockUrl, Locker};
use lock_testkit::RedisNodes;
use rslock_peer::Rslock;

async fn ours(addrs: &[SocketAddr], fencing: bool) -> Distlock {
    let hosts: Vec<String> = addrs.iter().map(SocketAddr::to_string).collect();
    let url = format!("redlock://{}?fencing={fencing}", hosts.join(","));
    let backend = RedlockBackend::connect(&LockUrl::parse(&url).unwrap())
        .await
        .expect("connect to the bench nodes");
    Distlock::new(Locker::new(backend))
}

fn bench(c: &mut Criterion) {
    let rt = runtime();
    let (nodes, plain, fenced, peer) = rt.block_on(async {
        let nodes = RedisNodes::start(3).await;
        let plain = ours(&nodes.addrs(), false).await;
        let fenced = ours(&nodes.addrs(), true).await;
        let peer = Rslock::new(nodes.urls());
        (nodes, plain, fenced, peer)
    });

    for w in WORKLOADS {
        let mut g = c.benchmark_group(w.group("redlock"));
        bench_subject(&mut g, &rt, "distlock", &plain, w);
        bench_subject(&mut g, &rt, "distlock-fencing", &fenced, w);
        bench_subject(&mut g, &rt, "rslock", &peer, w);
        g.finish();
    }

    let servers: Vec<u32> = nodes.nodes().iter().filter_map(|n| n.pid()).collect();
    report(&rt, &servers, &plain, &fenced, &peer);
}

/// One measurement: cycles per second, and CPU per cycle of this process (client) and of
/// the Redis servers. CPU per cycle does not depend on what else the machine runs, unlike
/// wall-clock rates on a shared machine.
#[derive(Clone, Copy)]
struct Sample {
    rate: f64,
    client_us: f64,
    server_us: f64,
}

async fn measure<F, Fut>(servers: &[u32], run_for: Duration, mut batch: F) -> Sample
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Duration>,
{
    // Calibrate as `rate` does, then measure one batch of about `run_for`.
    let n = batch_size(run_for, 64, &mut batch).await;
    let cpu = |pids: &[u32]| pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>();
    let me = [std::process::id()];
    let (c0, s0) = (cpu(&me), cpu(servers));
    let took = batch(n).await;
    let (c1, s1) = (cpu(&me), cpu(servers));
    let per_cycle = |secs: f64| secs * 1e6 / n as f64;
    Sample {
        rate: n as f64 / took.as_secs_f64(),
        client_us: per_cycle(c1 - c0),
        server_us: per_cycle(s1 - s0),
    }
}

/// `a` and `b` measured in alternating rounds (the order flips every round), so that a
/// change of load on a shared machine hits both alike; ratios are taken per round.
async fn alternating<A, B, FA, FB>(servers: &[u32], mut a: FA, mut b: FB) -> Vec<(Sample, Sample)>
where
    FA: FnMut(u64) -> A,
    FB: FnMut(u64) -> B,
    A: std::future::Future<Output = Duration>,
    B: std::future::Future<Output = Duration>,
{
    let (rounds, run_for) = (6, Duration::from_millis(700));
    let mut samples = Vec::new();
    for round in 0..rounds {
        if round % 2 == 0 {
            let x = measure(servers, run_for, &mut a).await;
            samples.push((x, measure(servers, run_for, &mut b).await));
        } else {
            let y = measure(servers, run_for, &mut b).await;
            samples.push((measure(servers, run_for, &mut a).await, y));
        }
    }
    samples
}

/// One report line: median rates, median per-round ratio with its range, CPU per cycle.
fn line(what: &str, names: (&str, &str), goal: &str, samples: &[(Sample, Sample)]) -> String {
    let ratios: Vec<f64> = samples.iter().map(|(a, b)| a.rate / b.rate).collect();
    let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ratios.iter().copied().fold(0.0, f64::max);
    let pick = |f: fn(&(Sample, Sample)) -> f64| median(samples.iter().map(f).collect());
    format!(
        "{what}: {a} {:.0}, {b} {:.0} cycles/s; {a}/{b} {:.2}x (median of {} alternating \
         rounds, range {min:.2}..{max:.2}){goal}\n    CPU per cycle (client + servers): \
         {a} {:.0} + {:.0} us, {b} {:.0} + {:.0} us; {b}/{a} total {:.2}x",
        pick(|s| s.0.rate),
        pick(|s| s.1.rate),
        median(ratios.clone()),
        ratios.len(),
        pick(|s| s.0.client_us),
        pick(|s| s.0.server_us),
        pick(|s| s.1.client_us),
        pick(|s| s.1.server_us),
        pick(|s| (s.1.client_us + s.1.server_us) / (s.0.client_us + s.0.server_us)),
        a = names.0,
        b = names.1,
    )
}

/// Ratios against the peer and the cost of fencing, measured in alternating rounds.
fn report(
    rt: &tokio::runtime::Runtime,
    servers: &[u32],
    plain: &Distlock,
    fenced: &Distlock,
    peer: &Rslock,
) {
    rt.block_on(async {
        let vs = ("distlock", "rslock");
        let one = alternating(servers, |n| uncontended(plain, n), |n| uncontended(peer, n)).await;
        let many = alternating(
            servers,
            |n| distinct_keys(plain, 64, n),
            |n| distinct_keys(peer, 64, n),
        )
        .await;
        let fence_one = alternating(
            servers,
            |n| uncontended(fenced, n),
            |n| uncontended(plain, n),
        )
        .await;
        let fence_many = alternating(
            servers,
            |n| distinct_keys(fenced, 64, n),
            |n| distinct_keys(plain, 64, n),
        )
        .await;
        let hold = Duration::from_millis(1);
        let run = Duration::from_secs(2);
        let mut contended = Vec::new();
        for round in 0..3 {
            if round % 2 == 0 {
                let o = one_key(plain, 16, hold, run).await;
                contended.push((o, one_key(peer, 16, hold, run).await));
            } else {
                let p = one_key(peer, 16, hold, run).await;
                contended.push((one_key(plain, 16, hold, run).await, p));
            }
        }
        let fenced_one_key = one_key(fenced, 16, hold, run).await;

        eprintln!("\n== redlock backend (3 nodes) vs rslock 0.10 on the same nodes (same run) ==");
        eprintln!(
            "{}",
            line("uncontended, 1 task", vs, " (goal >= 1.3x)", &one)
        );
        eprintln!(
            "{}",
            line("64 tasks, distinct keys", vs, " (goal >= 1.5x)", &many)
        );
        let fence = ("fencing-on", "fencing-off");
        eprintln!("{}", line("cost of fencing, 1 task", fence, "", &fence_one));
        eprintln!(
            "{}",
            line("cost of fencing, 64 tasks", fence, "", &fence_many)
        );
        eprintln!("16 tasks, one key, 1 ms hold (3 alternating runs of 2 s):");
        for (o, p) in &contended {
            eprintln!("  {}", o.summary("distlock"));
            eprintln!("  {}", p.summary("rslock  "));
            eprintln!(
                "    throughput distlock/rslock {:.2}x; worst wait under 1.5 x tasks x hold: \
                 distlock {}, rslock {}",
                o.throughput() / p.throughput(),
                o.worst_wait < o.wait_bound(),
                p.worst_wait < p.wait_bound(),
            );
        }
        eprintln!("  {}", fenced_one_key.summary("distlock with fencing"));
    });
}

criterion_group! {
    name = benches;
    config = common::criterion(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
