use etcd_client::*;
use lock_core::{Attempt, Backend, Lease, Owner};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn metrics(port: u16, tag: &str) {
    let o = std::process::Command::new("python3").arg("-c").arg(format!("import sys,json; sys.path.insert(0,'/tmp'); import metrics; d=metrics.get({port}); print(json.dumps({{'%s|%s'%k:v for k,v in d.items()}}))")).output().unwrap();
    std::fs::write(format!("/tmp/m-{tag}.json"), o.stdout).unwrap();
}
fn self_cpu() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    u.ru_utime.tv_sec as f64
        + u.ru_utime.tv_usec as f64 * 1e-6
        + u.ru_stime.tv_sec as f64
        + u.ru_stime.tv_usec as f64 * 1e-6
}
fn proc_cpu(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}
static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
async fn cycles<F, Fut>(tasks: usize, _dur: Duration, f: F) -> String
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let per = 20000 / tasks as u64;
    let (c0, s0) = (self_cpu(), proc_cpu(*PID.get().unwrap()));
    let start = Instant::now();
    let mut hs = vec![];
    for t in 0..tasks {
        let f = f.clone();
        hs.push(tokio::spawn(async move {
            for n in 0..per {
                f(t, n).await;
            }
        }));
    }
    for h in hs {
        h.await.unwrap();
    }
    let n = (per * tasks as u64) as f64;
    let el = start.elapsed().as_secs_f64();
    format!(
        "{:.0}/s client {:.0}us server {:.0}us",
        n / el,
        (self_cpu() - c0) / n * 1e6,
        (proc_cpu(*PID.get().unwrap()) - s0) / n * 1e6
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let server = lock_testkit::EtcdServer::start().await;
    PID.set(server.pid().unwrap()).unwrap();
    let client = Client::connect([server.endpoint()], None).await.unwrap();
    let backend = Arc::new(
        lock_etcd::EtcdBackend::builder([server.endpoint()])
            .build()
            .await
            .unwrap(),
    );
    let locker = lock_core::Locker::with_backend(backend.clone());
    let tasks: usize = std::env::var("TASKS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let d = Duration::from_millis(1500);
    let mut c0 = client.clone();
    let sess = c0.lease_grant(600, None).await.unwrap().id();
    let mut peer_leases = vec![];
    for _ in 0..tasks {
        peer_leases.push(c0.lease_grant(600, None).await.unwrap().id());
    }
    let peer_leases = Arc::new(peer_leases);
    for _round in 0..1 {
        let cl = client.clone();
        let pl = peer_leases.clone();
        let peer = cycles(tasks, d, move |t, _n| {
            let mut c = cl.clone();
            let pl = pl.clone();
            async move {
                let r = c
                    .lock(format!("p/{t}"), Some(LockOptions::new().with_lease(pl[t])))
                    .await
                    .unwrap();
                c.unlock(r.key().to_vec()).await.unwrap();
            }
        })
        .await;
        metrics(server.client_port(), "d0");
        let b = backend.clone();
        let direct = cycles(tasks, d, move |t, _n| {
            let b = b.clone();
            async move {
                let key = format!("d/{t}");
                let owner = Owner::random();
                match b
                    .try_acquire(&key, owner, Duration::from_secs(10))
                    .await
                    .unwrap()
                {
                    Attempt::Granted { fence, valid_until } => {
                        b.release(&Lease::new(key.as_str(), owner, fence, valid_until))
                            .await
                            .unwrap();
                    }
                    _ => panic!(),
                }
            }
        })
        .await;
        metrics(server.client_port(), "d1");
        let l = locker.clone();
        let via_locker = cycles(tasks, d, move |t, _n| {
            let l = l.clone();
            async move {
                let g = l
                    .acquire(
                        &format!("l/{t}"),
                        &lock_core::LockOptions::new()
                            .ttl(Duration::from_secs(10))
                            .watchdog(false),
                    )
                    .await
                    .unwrap();
                g.release().await.unwrap();
            }
        })
        .await;
        metrics(server.client_port(), "t0");
        let cl = client.clone();
        let s = cycles(tasks, d, move |t, _n| {
            let mut c = cl.clone();
            async move {
                let key = format!("s/{t}");
                let r = c
                    .txn(
                        Txn::new()
                            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                            .and_then([TxnOp::put(
                                key.clone(),
                                "v",
                                Some(PutOptions::new().with_lease(sess)),
                            )])
                            .or_else([TxnOp::get(key.clone(), None)]),
                    )
                    .await
                    .unwrap();
                assert!(r.succeeded());
                c.txn(
                    Txn::new()
                        .when([Compare::value(key.clone(), CompareOp::Equal, "v")])
                        .and_then([TxnOp::delete(key.clone(), None)]),
                )
                .await
                .unwrap();
            }
        })
        .await;
        metrics(server.client_port(), "t1");
        println!("tasks {tasks}:\n  peer {peer}\n  direct {direct}\n  locker {via_locker}\n  two-txns {s}");
    }
}
