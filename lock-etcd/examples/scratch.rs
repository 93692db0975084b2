use std::sync::Arc;
use std::time::{Duration, Instant};
use etcd_client::*;
use lock_core::{Attempt, Backend, Lease, Owner};

async fn cycles<F, Fut>(tasks: usize, dur: Duration, f: F) -> f64
where F: Fn(usize, u64) -> Fut + Clone + Send + 'static, Fut: std::future::Future<Output=()> + Send {
    let start = Instant::now();
    let mut hs = vec![];
    for t in 0..tasks {
        let f = f.clone();
        hs.push(tokio::spawn(async move {
            let mut n = 0u64;
            while start.elapsed() < dur { f(t, n).await; n += 1; }
            n
        }));
    }
    let mut total = 0;
    for h in hs { total += h.await.unwrap(); }
    total as f64 / start.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let server = lock_testkit::EtcdServer::start().await;
    let client = Client::connect([server.endpoint()], None).await.unwrap();
    let backend = Arc::new(lock_etcd::EtcdBackend::builder([server.endpoint()]).build().await.unwrap());
    let locker = lock_core::Locker::with_backend(backend.clone());
    let tasks: usize = std::env::var("TASKS").ok().and_then(|s| s.parse().ok()).unwrap_or(64);
    let d = Duration::from_millis(1500);
    let mut c0 = client.clone();
    let sess = c0.lease_grant(600, None).await.unwrap().id();
    let mut peer_leases = vec![];
    for _ in 0..tasks { peer_leases.push(c0.lease_grant(600, None).await.unwrap().id()); }
    let peer_leases = Arc::new(peer_leases);
    for _round in 0..3 {
        let cl = client.clone(); let pl = peer_leases.clone();
        let peer = cycles(tasks, d, move |t, _n| { let mut c = cl.clone(); let pl = pl.clone(); async move {
            let r = c.lock(format!("p/{t}"), Some(LockOptions::new().with_lease(pl[t]))).await.unwrap();
            c.unlock(r.key().to_vec()).await.unwrap();
        }}).await;
        let b = backend.clone();
        let direct = cycles(tasks, d, move |t, _n| { let b = b.clone(); async move {
            let key = format!("d/{t}");
            let owner = Owner::random();
            match b.try_acquire(&key, owner, Duration::from_secs(10)).await.unwrap() {
                Attempt::Granted { fence, valid_until } => { b.release(&Lease::new(key.as_str(), owner, fence, valid_until)).await.unwrap(); }
                _ => panic!(),
            }
        }}).await;
        let l = locker.clone();
        let via_locker = cycles(tasks, d, move |t, _n| { let l = l.clone(); async move {
            let g = l.acquire(&format!("l/{t}"), &lock_core::LockOptions::new().ttl(Duration::from_secs(10)).watchdog(false)).await.unwrap();
            g.release().await.unwrap();
        }}).await;
        let cl = client.clone();
        let s = cycles(tasks, d, move |t, _n| { let mut c = cl.clone(); async move {
            let key = format!("s/{t}");
            let r = c.txn(Txn::new().when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(key.clone(), "v", Some(PutOptions::new().with_lease(sess)))]).or_else([TxnOp::get(key.clone(), None)])).await.unwrap();
            assert!(r.succeeded());
            c.txn(Txn::new().when([Compare::value(key.clone(), CompareOp::Equal, "v")]).and_then([TxnOp::delete(key.clone(), None)])).await.unwrap();
        }}).await;
        println!("tasks {tasks}: peer {peer:.0}  backend-direct {direct:.0} ({:.2})  locker {via_locker:.0} ({:.2})  two-txns {s:.0} ({:.2})", direct/peer, via_locker/peer, s/peer);
    }
}
