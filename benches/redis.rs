//! Redis backend against its peers on one `redis-server` started by lock-testkit, in the
//! same run: rslock 0.10 (a Redlock client, here over one node) and the raw protocol limit
//! (`SET NX PX` then `DEL` with redis-rs: two round trips, no scripts, no policy).
//! Workloads: uncontended cycle, 64 tasks on distinct keys, 16 tasks on one key holding
//! 1 ms. Watchdog off on our side (rslock does not renew either). The final report prints
//! each result as a ratio to the peers.

mod common;
#[path = "common/rslock.rs"]
mod rslock_peer;

use std::sync::Arc;
use std::time::Duration;

use common::{
    bench_subject, cpu_seconds, interleaved, runtime, timed, Distlock, OneKey, Subject, Workload,
    TTL, WORKLOADS,
};
use criterion::{criterion_group, criterion_main, Criterion};
use distlock::redis::RedisBackend;
use distlock::{LockUrl, Locker};
use lock_testkit::RedisServer;
use redis::aio::MultiplexedConnection;
use rslock_peer::Rslock;

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
    let rslock = Rslock::new(vec![server.url()]);
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

fn bench(c: &mut Criterion) {
    let rt = runtime();
    let s = rt.block_on(subjects());

    for w in WORKLOADS {
        let mut g = c.benchmark_group(w.group("redis"));
        bench_subject(&mut g, &rt, "distlock", &s.ours, w);
        bench_subject(&mut g, &rt, "rslock", &s.rslock, w);
        bench_subject(&mut g, &rt, "raw-set-nx-del", &s.raw, w);
        g.finish();
    }

    report(&rt, &s);
}

/// Length of one subject's turn in a round.
const ROUND: Duration = Duration::from_millis(300);

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

/// Ratios against the peers, measured in interleaved rounds in this run (the machine may be
/// shared, so each round compares subjects measured back to back and the median is kept).
fn report(rt: &tokio::runtime::Runtime, s: &Subjects) {
    rt.block_on(async {
        // Uncontended and 64 distinct keys: ours, rslock, raw, round after round, with the
        // CPU this process (client) and redis-server spend on them.
        let mut measured = Vec::new();
        for w in WORKLOADS {
            let subjects = vec![timed(&s.ours, w), timed(&s.rslock, w), timed(&s.raw, w)];
            let cpu = || {
                let mut info = s.raw.conn.clone();
                async move {
                    let client = cpu_seconds(std::process::id());
                    (client, server_cpu(&mut info).await)
                }
            };
            measured.push((w, interleaved(ROUND, subjects, cpu).await));
        }
        let one = OneKey::run(&s.ours, &s.rslock, Duration::from_secs(2)).await;

        eprintln!(
            "\n== redis backend vs rslock 0.10 and raw SET NX PX + DEL (same server, same run) =="
        );
        eprintln!("{}", measured[0].1.note());
        for (w, rounds) in &measured {
            let goals = match w {
                Workload::Uncontended => [" (goal >= 1.3)", " (goal >= 0.8)"],
                Workload::DistinctKeys(_) => [" (goal >= 1.2)", ""],
            };
            let names = ["ours", "rslock", "raw"];
            eprintln!("{}", rounds.lines(*w, &names, &goals));
            eprintln!("{}", rounds.cpu_line(&names, "server"));
        }
        one.print("rslock");
        one.print_ratio("rslock", " (goal >= 1.0)");
    });
}

criterion_group! {
    name = benches;
    config = common::criterion(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
