//! Quorum

use super::*;

/// 5 nodes, every subset of live nodes (the others reset like a killed server or
/// blackholed like a paused one, alternately), then real kills and pauses: a grant exactly
/// when 3 or more are live, within the per-node timeout + 50 ms; a refusal leaves no key on
/// any live node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_matrix_five_nodes() {
    let mut nodes = RedisNodes::start(5).await;
    let mut proxies = Vec::new();
    for addr in nodes.addrs() {
        proxies.push(FaultProxy::start(addr).await);
    }
    let node_timeout = Duration::from_millis(200);
    let proxy_addrs: Vec<SocketAddr> = proxies.iter().map(FaultProxy::addr).collect();
    let b = backend(&proxy_addrs, "timeout=200ms").await;
    let ttl = Duration::from_secs(5);

    for mask in 0u32..32 {
        let live: Vec<usize> = (0..5).filter(|i| mask & (1 << i) != 0).collect();
        for (i, proxy) in proxies.iter().enumerate() {
            proxy.set_mode(if live.contains(&i) {
                ProxyMode::Pass
            } else if (i + mask as usize).is_multiple_of(2) {
                ProxyMode::Reset
            } else {
                ProxyMode::Blackhole
            });
        }
        let key = format!("matrix/{mask:05b}");
        check_case(
            &b,
            &nodes,
            &key,
            ttl,
            &live,
            node_timeout,
            &format!("{mask:05b}"),
        )
        .await;
        for proxy in &proxies {
            proxy.set_mode(ProxyMode::Pass);
        }
    }

    // Real processes: killed (connections refused) and paused (SIGSTOP: silent).
    let cases: [(&[usize], &[usize]); 4] = [
        (&[0, 1], &[]),
        (&[0], &[1]),
        (&[3], &[1, 4]),
        (&[], &[0, 2, 4]),
    ];
    for (case, (killed, paused)) in cases.into_iter().enumerate() {
        for &i in killed {
            nodes.node_mut(i).kill();
        }
        for &i in paused {
            nodes.node_mut(i).pause();
        }
        let live: Vec<usize> = (0..5)
            .filter(|i| !killed.contains(i) && !paused.contains(i))
            .collect();
        let key = format!("matrix/real-{case}");
        let label = format!("killed {killed:?} paused {paused:?}");
        check_case(&b, &nodes, &key, ttl, &live, node_timeout, &label).await;
        for &i in paused {
            nodes.node_mut(i).resume();
        }
        for &i in killed {
            nodes.node_mut(i).restart().await;
        }
    }
}

async fn check_case(
    b: &RedlockBackend,
    nodes: &RedisNodes,
    key: &str,
    ttl: Duration,
    live: &[usize],
    node_timeout: Duration,
    label: &str,
) {
    let started = Instant::now();
    let (owner, result) = attempt(b, key, ttl).await;
    let took = started.elapsed();
    if live.len() >= 3 {
        let granted = result.unwrap_or_else(|e| panic!("{label}: expected a grant, got {e:?}"));
        let lease = lease_of(key, owner, &granted);
        assert!(
            took <= node_timeout + Duration::from_millis(50),
            "{label}: the grant took {took:?}"
        );
        let mut holding = 0;
        for &i in live {
            holding += usize::from(raw_exists(&nodes.nodes()[i], &lock_key(key)).await);
        }
        assert!(holding >= 3, "{label}: the grant is on {holding} nodes");
        b.release(&lease).await.expect("release with a quorum");
    } else {
        match result {
            Err(Error::QuorumNotReached {
                granted,
                needed,
                node_errors,
            }) => {
                assert_eq!(needed, 3, "{label}");
                assert!(granted < 3, "{label}");
                assert!(node_errors.len() >= 3, "{label}: {node_errors:?}");
                for e in &node_errors {
                    assert!(e.is_transient(), "{label}: {e}");
                }
            }
            other => panic!("{label}: expected QuorumNotReached, got {other:?}"),
        }
        assert!(
            took <= node_timeout + SLACK,
            "{label}: the refusal took {took:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    for &i in live {
        assert!(
            !raw_exists(&nodes.nodes()[i], &lock_key(key)).await,
            "{label}: a key was left on live node {i}"
        );
    }
}

/// A foreign value on 1 of 3 nodes still grants (and is left alone); on 2 of 3 the lock is
/// taken, the holder's remaining time is reported, and nothing of ours is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_and_majority_presets() {
    let nodes = RedisNodes::start(3).await;
    let b = backend(&nodes.addrs(), "").await;
    let ttl = Duration::from_secs(5);

    preset_foreign(&nodes.nodes()[0], "preset/minority", 10_000).await;
    let (owner, result) = attempt(&b, "preset/minority", ttl).await;
    let lease = lease_of("preset/minority", owner, &result.unwrap());
    b.release(&lease).await.expect("a quorum held it");
    assert!(raw_exists(&nodes.nodes()[0], &lock_key("preset/minority")).await);

    preset_foreign(&nodes.nodes()[0], "preset/majority", 10_000).await;
    preset_foreign(&nodes.nodes()[1], "preset/majority", 10_000).await;
    let (_, result) = attempt(&b, "preset/majority", ttl).await;
    assert!(
        matches!(result, Ok(Attempt::Taken { .. })),
        "2 of 3 held by another owner: {result:?}"
    );
    // A node that had not answered when the attempt was decided is released in the
    // background: allow a short settle.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!raw_exists(&nodes.nodes()[2], &lock_key("preset/majority")).await);
    let locker = Locker::new(b);
    assert!(matches!(
        locker.acquire("preset/majority", &skip(ttl)).await,
        Err(Error::Locked { .. })
    ));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!raw_exists(&nodes.nodes()[2], &lock_key("preset/majority")).await);

    // Held everywhere: the refusal says when a quorum of the holder's keys expires.
    for server in nodes.nodes() {
        preset_foreign(server, "preset/all", 10_000).await;
    }
    let result = locker
        .backend()
        .try_acquire(
            "preset/all",
            Owner::random(),
            distlock::Permits::LOCK,
            valid(&locker, ttl),
        )
        .await;
    match result.unwrap() {
        Attempt::Taken {
            expires_in: Some(left),
        } => assert!(left <= Duration::from_secs(10) && left > Duration::from_secs(8)),
        other => panic!("expected Taken with the holder's time, got {other:?}"),
    }
    // Values without expiry (not written by this protocol): taken, no time to wake at.
    for server in nodes.nodes() {
        preset_foreign(server, "preset/forever", 0).await;
    }
    let result = locker
        .backend()
        .try_acquire(
            "preset/forever",
            Owner::random(),
            distlock::Permits::LOCK,
            valid(&locker, ttl),
        )
        .await;
    assert_eq!(result.unwrap(), Attempt::Taken { expires_in: None });
}

/// Killing 1 of 3 nodes mid-run: acquisitions go on. Killing a second: every acquire fails
/// with QuorumNotReached within its deadline and nothing is granted.
///
/// One release may fail, that of the lease held across the kill: an attempt returns once
/// a quorum granted it, so that lease may be held on the killed node and one other only
/// (a slow third node's request is dropped before it is sent). Its release then hears one
/// "released" and one "not ours" beside the dead node, cannot tell whether a quorum still
/// held it, and says so (`QuorumNotReached` naming the dead node), as documented.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_nodes_mid_run() {
    let mut nodes = RedisNodes::start(3).await;
    let killed = nodes.addrs()[2].to_string();
    let locker = Locker::new(backend(&nodes.addrs(), "").await);
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(2))
        .wait_for(Duration::from_secs(2));
    let done = Arc::new(AtomicUsize::new(0));
    let worker = {
        let (locker, opts, done) = (locker.clone(), opts.clone(), done.clone());
        tokio::spawn(async move {
            let (mut errors, mut release_errors) = (Vec::new(), Vec::new());
            while done.load(Ordering::SeqCst) < 200 {
                match locker.acquire("kill/run", &opts).await {
                    Ok(g) => {
                        if let Err(e) = g.release().await {
                            release_errors.push(e);
                        }
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => errors.push(e.to_string()),
                }
            }
            (errors, release_errors)
        })
    };
    while done.load(Ordering::SeqCst) < 50 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    nodes.node_mut(2).kill();
    let (errors, release_errors) = tokio::time::timeout(Duration::from_secs(30), worker)
        .await
        .expect("acquisitions continue with 2 of 3 nodes")
        .unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    assert!(release_errors.len() <= 1, "{release_errors:?}");
    for e in &release_errors {
        assert!(
            matches!(
                e,
                Error::QuorumNotReached {
                    granted: 1,
                    needed: 2,
                    ..
                }
            ) && format!("{e:?}").contains(&killed),
            "only the lease held across the kill may fail to release: {e:?}"
        );
    }

    nodes.node_mut(1).kill();
    let wait = Duration::from_millis(300);
    for round in 0..5 {
        let started = Instant::now();
        let result = locker
            .acquire(
                "kill/run",
                &LockOptions::new()
                    .ttl(Duration::from_secs(2))
                    .wait_for(wait),
            )
            .await;
        let took = started.elapsed();
        match result {
            Err(Error::QuorumNotReached {
                granted, needed, ..
            }) => {
                assert_eq!(needed, 2);
                assert!(granted <= 1);
            }
            other => panic!("round {round}: expected QuorumNotReached, got {other:?}"),
        }
        assert!(
            took >= wait && took <= wait + SLACK,
            "round {round}: {took:?}"
        );
    }
    let started = Instant::now();
    assert!(matches!(
        locker
            .acquire("kill/run", &skip(Duration::from_secs(2)))
            .await,
        Err(Error::QuorumNotReached { .. })
    ));
    assert!(started.elapsed() <= SLACK);
    // Node 0 may not have answered when the two dead nodes made the quorum impossible: its
    // attempt is then abandoned in the background (a tombstone, then the key deleted), so
    // the key goes within a node timeout, long before its 2 s TTL.
    let left = Instant::now();
    while raw_exists(&nodes.nodes()[0], &lock_key("kill/run")).await {
        assert!(
            left.elapsed() < Duration::from_secs(1),
            "the refused attempt's key stayed on node 0"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Building succeeds with a majority up; a node down at the start joins once it is back.
/// With a majority down, building fails with QuorumNotReached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_down_at_start_joins_later() {
    let nodes = RedisNodes::start(3).await;
    let proxy = FaultProxy::start(nodes.addrs()[2]).await;
    proxy.set_mode(ProxyMode::Refuse);
    let addrs = [nodes.addrs()[0], nodes.addrs()[1], proxy.addr()];
    let b = backend(&addrs, "").await;
    assert!(b.node(2).is_none());
    let locker = Locker::new(b);
    let ttl = Duration::from_secs(5);
    let g = locker.acquire("late/x", &skip(ttl)).await.unwrap();
    g.release().await.unwrap();
    proxy.set_mode(ProxyMode::Pass);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let g = locker.acquire("late/x", &skip(ttl)).await.unwrap();
        let joined = raw_exists(&nodes.nodes()[2], &lock_key("late/x")).await;
        g.release().await.unwrap();
        if joined {
            break;
        }
        assert!(Instant::now() < deadline, "the node never joined");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    proxy.set_mode(ProxyMode::Refuse);
    let refused = FaultProxy::start(nodes.addrs()[1]).await;
    refused.set_mode(ProxyMode::Refuse);
    let url = url_of(&[nodes.addrs()[0], refused.addr(), proxy.addr()], "");
    match distlock::connect(&url).await {
        Err(Error::QuorumNotReached {
            granted: 1,
            needed: 2,
            node_errors,
        }) => assert_eq!(node_errors.len(), 2),
        other => panic!("expected QuorumNotReached, got {other:?}"),
    }
}

/// A wrong password is a clear, non-transient error at connect time; bad URLs are
/// InvalidUrl without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_is_refused() {
    let server = RedisServer::start_with(RedisOptions {
        persistent: false,
        password: Some("pa55-right".into()),
        ..RedisOptions::default()
    })
    .await;
    let url = format!("redlock://:hunter2@{}", server.addr());
    match distlock::connect(&url).await {
        Err(e @ Error::Backend { .. }) => {
            assert!(!e.is_transient());
            assert!(!format!("{e:?}").contains("hunter2"), "{e:?}");
        }
        other => panic!("expected a Backend error, got {other:?}"),
    }
    let url = LockUrl::parse(&format!("redlock://:pa55-right@{}", server.addr())).unwrap();
    let ok = RedlockBackend::connect(&url)
        .await
        .expect("the right password");
    assert!(!format!("{ok:?}").contains("pa55"), "{ok:?}");
    for bad in [
        format!("redlock://:secret@{}?bogus=1", server.addr()),
        format!("redlock://:secret@{0},{0}", server.addr()),
        format!("redlock://:secret@{}?drift=1.5", server.addr()),
    ] {
        match distlock::connect(&bad).await {
            Err(Error::InvalidUrl { url, .. }) => assert!(!url.contains("secret"), "{url}"),
            other => panic!("{bad}: expected InvalidUrl, got {other:?}"),
        }
    }
}
