use std::time::{Duration, Instant};
use lock_core::{Backend, Lease, Owner};
#[tokio::test]
async fn sizes() {
    let nodes = lock_testkit::RedisNodes::start(3).await;
    let hosts: Vec<String> = nodes.addrs().iter().map(|a| a.to_string()).collect();
    let url = lock_core::LockUrl::parse(&format!("redlock://{}", hosts.join(","))).unwrap();
    let b = lock_redlock::RedlockBackend::connect(&url).await.unwrap();
    let f = b.try_acquire("k", Owner::random(), Duration::from_secs(1));
    println!("try_acquire future: {}", std::mem::size_of_val(&*f));
    let lease = Lease::new("k", Owner::random(), 1, Instant::now());
    let f2 = b.release(&lease);
    println!("release future: {}", std::mem::size_of_val(&*f2));
    let f3 = b.extend(&lease, Duration::from_secs(1));
    println!("extend future: {}", std::mem::size_of_val(&*f3));
    let n = b.node(0).unwrap();
    let g = n.try_acquire("k", Owner::random(), Duration::from_secs(1));
    println!("node try_acquire future: {}", std::mem::size_of_val(&g));
    let g2 = n.release("k", Owner::random());
    println!("node release future: {}", std::mem::size_of_val(&g2));
}
