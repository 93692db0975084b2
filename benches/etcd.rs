//! etcd backend against its peer on one etcd started by lock-testkit, in the same run:
//! etcd's own lock RPC (etcd-client's `lock`/`unlock`, each task's locks on a lease of its
//! own, reused, as a worker with one session would). Workloads: uncontended cycle, 64 tasks
//! on distinct keys, 16 tasks on one key holding 1 ms. Watchdog off on our side (the lock
//! RPC does not renew either). The final report prints each result as a ratio to the peer.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    bench_subject, cpu_seconds, interleaved, runtime, timed, Distlock, OneKey, Subject, WORKLOADS,
};
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
    server: EtcdServer,
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
    Subjects { server, ours, peer }
}

fn bench(c: &mut Criterion) {
    let rt = runtime();
    let s = rt.block_on(subjects());

    for w in WORKLOADS {
        let mut g = c.benchmark_group(w.group("etcd"));
        bench_subject(&mut g, &rt, "distlock", &s.ours, w);
        bench_subject(&mut g, &rt, "etcd-lock-rpc", &s.peer, w);
        g.finish();
    }

    report(&rt, &s);
}

/// Length of one subject's turn in a round.
const ROUND: Duration = Duration::from_millis(400);

/// Ratios against the peer, ours and the peer back to back in each round (the machine may
/// be shared), medians kept.
fn report(rt: &tokio::runtime::Runtime, s: &Subjects) {
    rt.block_on(async {
        let mut measured = Vec::new();
        let server_pid = s.server.pid();
        for w in WORKLOADS {
            let subjects = vec![timed(&s.ours, w), timed(&s.peer, w)];
            let cpu = || {
                let client = cpu_seconds(std::process::id());
                let server = server_pid.map_or(0.0, cpu_seconds);
                std::future::ready((client, server))
            };
            measured.push((w, interleaved(ROUND, subjects, cpu).await));
        }
        let one = OneKey::run(&s.ours, &s.peer, Duration::from_secs(3)).await;
        eprintln!("\n== etcd backend vs etcd's lock RPC (same server, same run) ==");
        eprintln!("{}", measured[0].1.note());
        for (w, rounds) in &measured {
            let names = ["ours", "lock RPC"];
            eprintln!("{}", rounds.lines(*w, &names, &[" (goal >= 1.0)"]));
            eprintln!("{}", rounds.cpu_line(&names, "etcd"));
        }
        one.print("etcd-lock-rpc");
        one.print_ratio("lock RPC", "");
    });
}

criterion_group! {
    name = benches;
    config = common::criterion(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
