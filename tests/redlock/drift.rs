//! Clock drift and slow nodes

use super::*;

/// The drift allowance comes off the validity: `valid_until = start + TTL − (TTL × drift +
/// 2 ms)`; a TTL the allowance eats entirely is refused before any request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_factor_shrinks_the_validity() {
    let nodes = RedisNodes::start(3).await;
    let ttl = Duration::from_secs(1);
    for (drift, usable_ms) in [(0.01, 988), (0.5, 498), (0.95, 48)] {
        let b = backend(&nodes.addrs(), &format!("drift={drift}")).await;
        let usable = ttl - b.drift_allowance(ttl);
        let expected = Duration::from_millis(usable_ms);
        assert!(
            usable.abs_diff(expected) < Duration::from_micros(10),
            "{usable:?}"
        );
        let key = format!("drift/{drift}");
        let before = Instant::now();
        let (owner, result) = attempt(&b, &key, ttl).await;
        let after = Instant::now();
        let lease = lease_of(&key, owner, &result.unwrap());
        assert!(
            lease.valid_until() >= before + usable && lease.valid_until() <= after + usable,
            "drift {drift}: validity {:?} after the start, expected {usable:?}",
            lease.valid_until() - before
        );
        b.release(&lease).await.unwrap();
    }
    let b = backend(&nodes.addrs(), "drift=0.99").await;
    let locker = Locker::new(b);
    let started = Instant::now();
    match locker.acquire("drift/none-left", &skip(MIN_TTL)).await {
        Err(Error::InvalidTtl { backend, .. }) => assert_eq!(backend, "redlock"),
        other => panic!("expected InvalidTtl, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_millis(20),
        "no I/O before the refusal"
    );
}

/// A quorum that needs a slow node (delay proxy) gets less validity, by the delay; when
/// the delay eats the whole validity the grant is refused and released everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_nodes_shrink_the_validity() {
    let nodes = RedisNodes::start(3).await;
    let mut proxies = Vec::new();
    for addr in nodes.addrs() {
        proxies.push(FaultProxy::start(addr).await);
    }
    let addrs: Vec<SocketAddr> = proxies.iter().map(FaultProxy::addr).collect();
    // Fencing off: its write-back could add a second slow round trip to the arithmetic.
    let b = backend(&addrs, "timeout=1s&fencing=false").await;
    let ttl = Duration::from_secs(1);
    let usable = ttl - b.drift_allowance(ttl);

    let (owner, fast) = attempt(&b, "slow/fast", ttl).await;
    let fast_left = lease_of("slow/fast", owner, &fast.unwrap()).remaining();
    assert!(
        fast_left > usable - Duration::from_millis(50),
        "{fast_left:?}"
    );

    let delay = Duration::from_millis(150);
    for proxy in &proxies[..2] {
        proxy.set_mode(ProxyMode::Delay {
            to_server: Duration::ZERO,
            to_client: delay,
        });
    }
    let (owner, slow) = attempt(&b, "slow/slow", ttl).await;
    let lease = lease_of("slow/slow", owner, &slow.unwrap());
    let slow_left = lease.remaining();
    assert!(
        slow_left <= usable - delay,
        "validity left {slow_left:?} with a {delay:?} node in the quorum"
    );
    assert!(slow_left >= usable - delay - SLACK, "{slow_left:?}");
    b.release(&lease).await.unwrap();

    // A quorum that cannot answer within the validity: refused, and nothing stays behind.
    for proxy in &proxies[..2] {
        proxy.set_mode(ProxyMode::Delay {
            to_server: Duration::ZERO,
            to_client: Duration::from_millis(300),
        });
    }
    let short = Duration::from_millis(250);
    let (_, result) = attempt(&b, "slow/too-slow", short).await;
    match result {
        Err(e @ Error::Unavailable { .. }) => {
            assert!(e.is_transient());
            assert!(e.report().to_string().contains("validity"), "{e}");
        }
        other => panic!("expected a refusal for lack of validity, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    for server in nodes.nodes() {
        assert!(!raw_exists(server, &lock_key("slow/too-slow")).await);
    }
}
