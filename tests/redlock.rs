//! The Redlock backend against real `redis-server` processes from lock-testkit: the whole
//! conformance suite (3 nodes, 1 node through `distlock::connect`, fencing off), the quorum
//! matrix over 5 nodes, presets of foreign values, nodes killed mid-run, a holder process
//! paused past its validity, clock-drift allowance and slow nodes, fencing across different
//! majorities, node restarts with and without persistence of a bare majority, and the
//! shared fault rules with every node restarted, killed, paused or cut off, and the raw
//! baseline over the quorum.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    calls, rand_u32, raw_del, raw_exists, redlock_backend as backend, redlock_url as url_of, skip,
    Proxied, SLACK,
};
use distlock::redlock::{RedlockBackend, MIN_TTL};
use distlock::{Admin, Attempt, Backend, Error, Lease, LockOptions, LockUrl, Locker, Owner, Ttl};
use lock_conformance::{self as conformance, run_all, run_faults, Faults, Target};
use lock_testkit::{FaultProxy, ManagedProcess, ProxyMode, RedisNodes, RedisOptions, RedisServer};

/// The Redis key of lock `name` under the default prefix (lock-redis's layout).
fn lock_key(name: &str) -> String {
    format!("distlock:{{{name}}}")
}

/// Writes a value that is not ours into lock `name` on `server` (no expiry when `px` is 0).
async fn preset_foreign(server: &RedisServer, name: &str, px: u64) {
    let mut raw = server.client().await;
    let mut cmd = redis::cmd("SET");
    cmd.arg(lock_key(name)).arg("someone-else");
    if px > 0 {
        cmd.arg("PX").arg(px);
    }
    let _: redis::Value = cmd.query_async(&mut raw).await.unwrap();
}

async fn attempt(b: &RedlockBackend, key: &str, ttl: Duration) -> (Owner, Result<Attempt, Error>) {
    let owner = Owner::random();
    let ttl = b.capabilities().effective_ttl(ttl).expect("a valid TTL");
    (
        owner,
        b.try_acquire(key, owner, distlock::Permits::LOCK, ttl)
            .await,
    )
}

/// `ttl` as the Locker's backend accepts it.
fn valid(locker: &Locker, ttl: Duration) -> Ttl {
    locker
        .capabilities()
        .effective_ttl(ttl)
        .expect("a valid TTL")
}

fn lease_of(key: &str, owner: Owner, attempt: &Attempt) -> Lease {
    match attempt {
        Attempt::Granted { fence, valid_until } => Lease::new(key, owner, *fence, *valid_until),
        taken => panic!("{key}: expected a grant, got {taken:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Conformance
// ---------------------------------------------------------------------------------------

/// The whole suite on 3 nodes, used directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_three_nodes() {
    let nodes = RedisNodes::start(3).await;
    let b = backend(&nodes.addrs(), "").await;
    assert!(b.capabilities().monotonic_fencing);
    common::conformance_direct(b).await;
}

/// The safety rules (hand-over, serialized operations, queue entries) on 3 nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safety_rules() {
    let nodes = RedisNodes::start(3).await;
    let b = backend(&nodes.addrs(), "").await;
    conformance::run_safety(&Target::new(Arc::new(b))).await;
}

/// The whole suite on 1 node, through the facade's `connect(url)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_one_node_through_connect() {
    let server = RedisServer::start().await;
    let url = format!("redlock://{}?prefix=one%3A", server.addr());
    common::conformance_through_connect(&url, |caps| {
        assert_eq!(caps.name, "redlock");
        assert_eq!(caps.min_ttl, MIN_TTL);
    })
    .await;
}

/// The whole suite on 3 nodes with fencing off (capabilities say the tokens are not
/// monotonic) and locks taken away by a raw `DEL` on every node, behind the backend's back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_without_fencing_and_raw_del_as_revoke() {
    let nodes = Arc::new(RedisNodes::start(3).await);
    let b = backend(&nodes.addrs(), "fencing=false").await;
    assert!(!b.capabilities().monotonic_fencing);
    let raw = nodes.clone();
    let target = Target::new(Arc::new(b)).with_revoke(move |key| {
        let raw = raw.clone();
        async move {
            for server in raw.nodes() {
                raw_del(server, &lock_key(&key)).await;
            }
        }
    });
    run_all(&target).await;
}

/// The whole suite on 3 nodes on a current-thread runtime (subscriptions, background
/// releases and the Locker share one thread).
#[tokio::test(flavor = "current_thread")]
async fn conformance_on_a_current_thread_runtime() {
    let nodes = RedisNodes::start(3).await;
    run_all(&Target::new(Arc::new(backend(&nodes.addrs(), "").await))).await;
}

// ---------------------------------------------------------------------------------------
// Shared fault rules
// ---------------------------------------------------------------------------------------

/// The per-node timeout of the fault targets.
const NODE_TIMEOUT: Duration = Duration::from_millis(200);

/// A target over 3 nodes, each reached through a fault proxy (the peer too), whose hooks
/// act on every node: restarted (all their locks lost, or kept with `options.persistent`),
/// killed, paused, or cut off.
async fn fault_target(options: RedisOptions) -> Target {
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(RedisServer::start_with(options.clone()).await);
    }
    let nodes = Proxied::new(servers).await;
    let params = format!("timeout={}ms", NODE_TIMEOUT.as_millis());
    let faults = Faults::new(NODE_TIMEOUT)
        .slack(SLACK)
        .peer(Arc::new(backend(&nodes.addrs(), &params).await));
    let faults = nodes.hooks(faults).await;
    Target::new(Arc::new(backend(&nodes.addrs(), &params).await)).with_faults(faults)
}

/// The shared fault rules on 3 nodes without persistence: all restarted (empty), killed,
/// paused (SIGSTOP), or cut off by a blackholed network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules() {
    let target = fault_target(RedisOptions::default()).await;
    run_faults(&target)
        .await
        .assert_not_run(&["a_lock_survives_a_restart_that_keeps_the_locks"]);
}

/// The shared fault rules on 3 nodes with persistence (append-only file, fsync always):
/// the locks survive a restart of every node, and kill, pause and blackhole as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules_with_persistence() {
    let target = fault_target(RedisOptions {
        persistent: true,
        ..RedisOptions::default()
    })
    .await;
    run_faults(&target).await.assert_not_run(&[
        "a_restart_that_loses_the_locks_leaves_holders_not_held",
        "waiters_wake_after_a_restart_that_loses_the_locks",
    ]);
}

// ---------------------------------------------------------------------------------------
// Quorum
// ---------------------------------------------------------------------------------------

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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_nodes_mid_run() {
    let mut nodes = RedisNodes::start(3).await;
    let locker = Locker::new(backend(&nodes.addrs(), "").await);
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(2))
        .wait_for(Duration::from_secs(2));
    let done = Arc::new(AtomicUsize::new(0));
    let worker = {
        let (locker, opts, done) = (locker.clone(), opts.clone(), done.clone());
        tokio::spawn(async move {
            let mut errors = Vec::new();
            while done.load(Ordering::SeqCst) < 200 {
                match locker.acquire("kill/run", &opts).await {
                    Ok(g) => {
                        g.release().await.expect("release with a quorum");
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => errors.push(e.to_string()),
                }
            }
            errors
        })
    };
    while done.load(Ordering::SeqCst) < 50 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    nodes.node_mut(2).kill();
    let errors = tokio::time::timeout(Duration::from_secs(30), worker)
        .await
        .expect("acquisitions continue with 2 of 3 nodes")
        .unwrap();
    assert!(errors.is_empty(), "{errors:?}");

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

// ---------------------------------------------------------------------------------------
// Holder paused past its validity, in a child process
// ---------------------------------------------------------------------------------------

const CHILD_ENV: &str = "DISTLOCK_REDLOCK_CHILD_URL";
const CHILD_KEY: &str = "paused/holder";
const CHILD_TTL: Duration = Duration::from_millis(600);

/// Not a test on its own: re-executed by `paused_holder_loses_to_another_process` with
/// `DISTLOCK_REDLOCK_CHILD_URL` set, it holds the lock (watchdog on) and prints its fence,
/// then `lost` when `lost()` fires. Without the variable it returns at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_child() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let locker = distlock::connect(&url).await.expect("child connects");
    let guard = locker
        .acquire(CHILD_KEY, &LockOptions::new().ttl(CHILD_TTL).skip())
        .await
        .expect("child acquires");
    // libtest printed "test paused_holder_child ... " without a newline.
    println!("\nREDLOCK-CHILD fence={}", guard.fence());
    let lost = tokio::time::timeout(Duration::from_secs(30), guard.lost()).await;
    println!("\nREDLOCK-CHILD lost={}", lost.is_ok());
    std::process::exit(0);
}

fn child_line(log: &std::path::Path, marker: &str) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .find_map(|line| line.split(marker).nth(1).map(|v| v.trim().to_owned()))
}

async fn wait_child_line(log: &std::path::Path, marker: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = child_line(log, marker) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "the child did not print {marker} within {within:?}; its output:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A holder process frozen (SIGSTOP) past its validity loses the lock to another process;
/// when it resumes its `lost()` fires, and its fencing token is lower than the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_loses_to_another_process() {
    let nodes = RedisNodes::start(3).await;
    let url = url_of(&nodes.addrs(), "");
    let log = std::env::temp_dir().join(format!(
        "distlock-redlock-child-{}-{:08x}.log",
        std::process::id(),
        rand_u32()
    ));
    let exe = std::env::current_exe().unwrap();
    let child = ManagedProcess::spawn(
        "redlock holder child",
        "/usr/bin/env",
        [
            format!("{CHILD_ENV}={url}"),
            exe.display().to_string(),
            "paused_holder_child".into(),
            "--exact".into(),
            "--nocapture".into(),
            "--test-threads".into(),
            "1".into(),
        ],
        &log,
    )
    .expect("spawn the child");
    let child_fence: u64 = wait_child_line(&log, "REDLOCK-CHILD fence=", Duration::from_secs(30))
        .await
        .parse()
        .unwrap();
    child.pause();
    let paused_at = Instant::now();

    let locker = Locker::new(backend(&nodes.addrs(), "").await);
    assert!(
        matches!(
            locker.acquire(CHILD_KEY, &skip(CHILD_TTL)).await,
            Err(Error::Locked { .. })
        ),
        "the frozen holder's lock is still valid right after the pause"
    );
    let guard = locker
        .acquire(
            CHILD_KEY,
            &LockOptions::new()
                .ttl(Duration::from_secs(10))
                .wait_for(Duration::from_secs(5)),
        )
        .await
        .expect("another process gets the lock once the holder's validity passed");
    let waited = paused_at.elapsed();
    assert!(
        waited <= CHILD_TTL + Duration::from_millis(300),
        "granted {waited:?} after the pause (TTL {CHILD_TTL:?}): expiry must wake the waiter"
    );
    assert!(
        guard.fence() > child_fence,
        "fences: child {child_fence}, new holder {}",
        guard.fence()
    );
    child.resume();
    let lost = wait_child_line(&log, "REDLOCK-CHILD lost=", Duration::from_secs(5)).await;
    assert_eq!(lost, "true", "the resumed holder's lost() fired");
    assert!(!guard.is_lost(), "the new holder keeps the lock");
    guard.release().await.unwrap();
    drop(child);
    let _ = std::fs::remove_file(&log);
}

// ---------------------------------------------------------------------------------------
// Clock drift and slow nodes
// ---------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------
// Fencing
// ---------------------------------------------------------------------------------------

/// Two majorities that differ in their largest node: with the write-back the next token is
/// still greater; without it (fencing off) it is not, which is what the capability says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_holds_across_different_majorities() {
    let nodes = RedisNodes::start(3).await;
    let mut proxies = Vec::new();
    for addr in nodes.addrs() {
        proxies.push(FaultProxy::start(addr).await);
    }
    let addrs: Vec<SocketAddr> = proxies.iter().map(FaultProxy::addr).collect();
    let ttl = Duration::from_secs(5);
    let high: u64 = 1 << 52;
    for fencing in [true, false] {
        let b = backend(&addrs, &format!("fencing={fencing}")).await;
        assert_eq!(b.capabilities().monotonic_fencing, fencing);
        let key = format!("fence/{fencing}");
        // Node 2's counter is far ahead of the others (e.g. its clock ran ahead).
        let mut raw = nodes.nodes()[2].client().await;
        let _: redis::Value = redis::cmd("SET")
            .arg(format!("distlock:{{{key}}}:fence"))
            .arg(high)
            .query_async(&mut raw)
            .await
            .unwrap();
        // First majority: nodes 1 and 2.
        proxies[0].set_mode(ProxyMode::Reset);
        let (owner, result) = attempt(&b, &key, ttl).await;
        let first = lease_of(&key, owner, &result.unwrap());
        assert!(first.fence() > high, "node 2 issued the largest token");
        b.release(&first).await.unwrap();
        // Second majority: nodes 0 and 1.
        proxies[0].set_mode(ProxyMode::Pass);
        proxies[2].set_mode(ProxyMode::Reset);
        let (owner, result) = attempt(&b, &key, ttl).await;
        let second = lease_of(&key, owner, &result.unwrap());
        b.release(&second).await.unwrap();
        proxies[2].set_mode(ProxyMode::Pass);
        if fencing {
            assert!(second.fence() > first.fence(), "{second:?} after {first:?}");
        } else {
            assert!(second.fence() < first.fence(), "{second:?} after {first:?}");
        }
    }
}

/// On three real Redis 5.0 nodes (the oldest Redis accepted; see tests/redis5.rs): grants
/// of one key back to back get strictly increasing fences, and the write-back still orders
/// two majorities that differ in their largest node. (With the fence script's `SET … GET`,
/// new in 6.2, every node fell back to its bare clock: tokens repeated within a
/// millisecond, and the written-back fence was overwritten by the next grant's clock.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_strictly_increase_on_redis_5_nodes() {
    let mut servers = Vec::new();
    let mut proxies = Vec::new();
    for _ in 0..3 {
        let server = RedisServer::start_with(RedisOptions {
            binary: Some(lock_testkit::redis5_server()),
            ..RedisOptions::default()
        })
        .await;
        proxies.push(FaultProxy::start(server.addr()).await);
        servers.push(server);
    }
    let addrs: Vec<SocketAddr> = proxies.iter().map(FaultProxy::addr).collect();
    let b = backend(&addrs, "").await;
    let ttl = Duration::from_secs(5);
    let mut fences = Vec::new();
    for _ in 0..300 {
        let (owner, result) = attempt(&b, "redis5/tight", ttl).await;
        let lease = lease_of("redis5/tight", owner, &result.unwrap());
        fences.push(lease.fence());
        b.release(&lease).await.unwrap();
    }
    common::assert_strictly_increasing(&fences);

    let key = "redis5/majorities";
    let high: u64 = 1 << 52;
    let mut raw = servers[2].client().await;
    let _: redis::Value = redis::cmd("SET")
        .arg(format!("distlock:{{{key}}}:fence"))
        .arg(high)
        .query_async(&mut raw)
        .await
        .unwrap();
    // First majority: nodes 1 and 2 (node 2 issues the largest token).
    proxies[0].set_mode(ProxyMode::Reset);
    let (owner, result) = attempt(&b, key, ttl).await;
    let first = lease_of(key, owner, &result.unwrap());
    assert!(first.fence() > high, "node 2 issued the largest token");
    b.release(&first).await.unwrap();
    // Second majority: nodes 0 and 1; node 1 had the first token written back.
    proxies[0].set_mode(ProxyMode::Pass);
    proxies[2].set_mode(ProxyMode::Reset);
    let (owner, result) = attempt(&b, key, ttl).await;
    let second = lease_of(key, owner, &result.unwrap());
    b.release(&second).await.unwrap();
    assert!(second.fence() > first.fence(), "{second:?} after {first:?}");
}

/// Fencing tokens keep increasing when nodes restart from STALE snapshots (RDB taken before
/// the last grants, then kill -9): grants a, b, c; SAVE on every node; grants d, e, f;
/// nodes 1 and 2 restart from their snapshots and node 0 goes down, so the next quorum is
/// made of stale nodes only. Each node's token is `max(counter + 1, TIME)`, so the next
/// grants are above f's instead of re-issuing d's and e's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_across_node_restarts_from_stale_snapshots() {
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(
            RedisServer::start_with(RedisOptions {
                rdb: true,
                ..RedisOptions::default()
            })
            .await,
        );
    }
    let addrs: Vec<SocketAddr> = servers.iter().map(RedisServer::addr).collect();
    let locker = Locker::new(backend(&addrs, "").await);
    let key = "fence/stale";
    let opts = skip(Duration::from_secs(10)).wait_for(Duration::from_secs(5));
    let mut fences = Vec::new();
    for round in 0..2 {
        for _ in 0..3 {
            let g = locker.acquire(key, &opts).await.unwrap();
            fences.push(g.fence());
            g.release().await.unwrap();
        }
        if round == 0 {
            // A grant returns at its quorum; the minority node may not have granted yet.
            // Grant again (bounded) until every node carries a counter, then snapshot.
            let counter = format!("distlock:{{{key}}}:fence");
            for _ in 0..50 {
                let mut all = true;
                for server in &servers {
                    all &= raw_exists(server, &counter).await;
                }
                if all {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                let g = locker.acquire(key, &opts).await.unwrap();
                fences.push(g.fence());
                g.release().await.unwrap();
            }
            for server in &servers {
                server.save().await;
            }
        }
    }
    servers[0].kill();
    for server in &mut servers[1..] {
        server.restart().await;
        assert!(
            raw_exists(server, &format!("distlock:{{{key}}}:fence")).await,
            "the snapshot brought the (stale) counter back"
        );
    }
    for _ in 0..3 {
        let g = locker.acquire(key, &opts).await.unwrap();
        fences.push(g.fence());
        g.release().await.unwrap();
    }
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences must strictly increase across restarts from stale snapshots: {fences:?}"
    );
}

/// Calls of EVALSHA and EVAL the server has answered so far.
async fn script_calls(server: &RedisServer) -> u64 {
    calls(server, "evalsha").await + calls(server, "eval").await
}

/// An attempt whose requests time out on every node (held in the network) and that is
/// then abandoned through another connection: when the held requests finally arrive, they
/// grant nothing on any node (a plain release, the old clean-up, found nothing and let
/// them leave orphaned keys for their TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_attempt_arriving_late_grants_nothing() {
    let nodes = RedisNodes::start(3).await;
    let mut proxies = Vec::new();
    for addr in nodes.addrs() {
        proxies.push(FaultProxy::start(addr).await);
    }
    let proxied: Vec<SocketAddr> = proxies.iter().map(FaultProxy::addr).collect();
    let late = backend(&proxied, "timeout=100ms").await;
    let direct = backend(&nodes.addrs(), "").await;
    let ttl = Duration::from_secs(30);
    // Load the scripts on every node, so that the late EVALSHAs run.
    let (warm, granted) = attempt(&late, "abandon/warm", ttl).await;
    late.release(&lease_of("abandon/warm", warm, &granted.unwrap()))
        .await
        .unwrap();
    for proxy in &proxies {
        proxy.set_mode(ProxyMode::Blackhole);
    }
    let (owner, result) = attempt(&late, "abandon/late", ttl).await;
    let e = result.expect_err("no node answers through the blackhole");
    assert!(e.is_transient(), "{e}");
    direct
        .abandon("abandon/late", owner)
        .await
        .expect("the abandon reaches every node");
    let mut before = Vec::new();
    for server in nodes.nodes() {
        before.push(script_calls(server).await);
    }
    // Long enough for the attempt's own background clean-ups to time out in the blackhole
    // too: only the abandon through the direct connections reached the nodes.
    tokio::time::sleep(distlock::redlock::UNTIMED_NODE_TIMEOUT + Duration::from_millis(200)).await;
    for proxy in &proxies {
        proxy.set_mode(ProxyMode::Pass);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for (server, before) in nodes.nodes().iter().zip(before) {
        while script_calls(server).await == before {
            assert!(Instant::now() < deadline, "a held acquire never arrived");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for (i, server) in nodes.nodes().iter().enumerate() {
        assert!(
            !raw_exists(server, &lock_key("abandon/late")).await,
            "node {i}: the late request of an abandoned attempt left an orphaned key"
        );
    }
}

/// An attempt refused by a majority while one node had not answered yet: that node's
/// clean-up is an abandon (a tombstone), not a plain release. A plain release only
/// cleans up when it runs after the attempt, which holds on one connection but not when
/// the connection was replaced in between (a timeout of another request discards it, and
/// the attempt's request then still sits in the old socket, or was re-sent): the late
/// request, arriving after the release, left a lock on that node for its whole TTL. Here
/// the node is cut off while the attempt is decided; once it is back and both the
/// attempt and its clean-up have arrived, the same request arriving once more (as a
/// late copy would) is refused, and the node holds no lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_node_of_a_refused_attempt_refuses_the_late_request() {
    let nodes = RedisNodes::start(3).await;
    let proxy = FaultProxy::start(nodes.addrs()[2]).await;
    let addrs = vec![nodes.addrs()[0], nodes.addrs()[1], proxy.addr()];
    let b = backend(&addrs, "timeout=200ms").await;
    let ttl = Duration::from_secs(30);
    // Load the scripts on every node, so that the held EVALSHAs run when they arrive.
    let (warm, granted) = attempt(&b, "unanswered/warm", ttl).await;
    b.release(&lease_of("unanswered/warm", warm, &granted.unwrap()))
        .await
        .unwrap();
    let key = "unanswered/k";
    for server in &nodes.nodes()[..2] {
        preset_foreign(server, key, 30_000).await;
    }
    let third = &nodes.nodes()[2];
    let before = script_calls(third).await;
    proxy.set_mode(ProxyMode::Blackhole);
    let (owner, result) = attempt(&b, key, ttl).await;
    assert!(
        matches!(result, Ok(Attempt::Taken { .. })),
        "a majority holds foreign values: {result:?}"
    );
    // The attempt and its clean-up are held in the blackhole; let them through.
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.set_mode(ProxyMode::Pass);
    let deadline = Instant::now() + Duration::from_secs(10);
    while script_calls(third).await < before + 2 {
        assert!(
            Instant::now() < deadline,
            "the held attempt and its clean-up never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The attempt's request once more, as a copy arriving late over another connection.
    let node = b.node(2).expect("node 2 is connected");
    let again = node
        .try_acquire(key, owner, b.capabilities().effective_ttl(ttl).unwrap())
        .await
        .expect("node 2 answers");
    assert!(
        matches!(again, Attempt::Taken { .. }),
        "the late request of the refused attempt was granted on node 2: {again:?}"
    );
    assert!(
        !raw_exists(third, &lock_key(key)).await,
        "node 2 holds an orphaned lock of the refused attempt"
    );
}

// ---------------------------------------------------------------------------------------
// Release notices, inspect, force_release
// ---------------------------------------------------------------------------------------

/// A release through one backend (process) wakes a waiter on another through the nodes'
/// release channels, long before the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notice_reaches_another_process() {
    let nodes = RedisNodes::start(3).await;
    let a = Target::new(Arc::new(backend(&nodes.addrs(), "").await));
    let b = Target::new(Arc::new(backend(&nodes.addrs(), "").await));
    conformance::release_wakes_a_waiter_on_another_instance(&a, &b).await;
}

/// `inspect` reports the majority's holder (owner, fence, time left), also with a node
/// down; `force_release` deletes everywhere; with a majority down both are QuorumNotReached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_force_release_over_the_quorum() {
    let mut nodes = RedisNodes::start(3).await;
    let locker = Locker::new(backend(&nodes.addrs(), "").await);
    let backend = locker.backend().clone();
    let b = backend.admin().expect("admin");
    assert_eq!(b.inspect("admin/x").await.unwrap(), vec![]);
    let guard = locker
        .acquire("admin/x", &skip(Duration::from_secs(10)))
        .await
        .unwrap();
    let holder = b.inspect("admin/x").await.unwrap().pop().expect("held");
    assert_eq!(holder.owner, Some(guard.lease().owner()));
    assert_eq!(holder.fence, Some(guard.fence()));
    let left = holder.expires_in.expect("the lock has a TTL");
    assert!(left <= Duration::from_secs(10) && left > Duration::from_secs(9));
    // A foreign leftover on one node of three that all answer is not a holder.
    preset_foreign(&nodes.nodes()[1], "admin/leftover", 10_000).await;
    assert_eq!(b.inspect("admin/leftover").await.unwrap(), vec![]);
    nodes.node_mut(0).kill();
    let holder = b
        .inspect("admin/x")
        .await
        .unwrap()
        .pop()
        .expect("still held");
    assert_eq!(holder.owner, Some(guard.lease().owner()));
    // Two answers may not pin the token down (one may be a late grant): known or unknown,
    // never wrong.
    assert!(
        holder.fence.is_none_or(|f| f == guard.fence()),
        "{holder:?} for fence {}",
        guard.fence()
    );
    // With a node down, the leftover may be on a majority: reported.
    let leftover = b
        .inspect("admin/leftover")
        .await
        .unwrap()
        .pop()
        .expect("may be held");
    assert_eq!(leftover.owner, None, "not an owner token of this protocol");

    assert!(b.force_release("admin/x").await.unwrap());
    assert!(!raw_exists(&nodes.nodes()[1], &lock_key("admin/x")).await);
    assert!(!raw_exists(&nodes.nodes()[2], &lock_key("admin/x")).await);
    let released = guard.release().await;
    assert!(
        matches!(released, Err(Error::NotHeld { .. })),
        "{released:?}"
    );
    assert!(!b.force_release("admin/x").await.unwrap());

    nodes.node_mut(1).kill();
    assert!(matches!(
        b.inspect("admin/x").await,
        Err(Error::QuorumNotReached { needed: 2, .. })
    ));
    assert!(matches!(
        b.force_release("admin/x").await,
        Err(Error::QuorumNotReached { needed: 2, .. })
    ));
}

// ---------------------------------------------------------------------------------------
// Restarts
// ---------------------------------------------------------------------------------------

/// Three nodes; the first holder wins nodes 0 and 1 only (node 2 holds a foreign value),
/// then node 1 restarts. Returns the servers, the first holder and a second Locker.
async fn hold_on_a_bare_majority(
    options: RedisOptions,
    key: &str,
    opts: &LockOptions,
) -> (Vec<RedisServer>, distlock::LockGuard, Locker) {
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(RedisServer::start_with(options.clone()).await);
    }
    let addrs: Vec<SocketAddr> = servers.iter().map(RedisServer::addr).collect();
    preset_foreign(&servers[2], key, 60_000).await;
    let first = Locker::new(backend(&addrs, "").await);
    let guard = first
        .acquire(key, opts)
        .await
        .expect("a bare majority grants");
    assert!(raw_exists(&servers[0], &lock_key(key)).await);
    assert!(raw_exists(&servers[1], &lock_key(key)).await);
    let second = Locker::new(backend(&addrs, "").await);
    (servers, guard, second)
}

/// The known unsafety the documentation warns about: a node of a bare majority restarted
/// at once without persistence lets a second client win while the first still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_persistence_can_grant_twice_as_documented() {
    let key = "restart/unsafe";
    let opts = skip(Duration::from_secs(30));
    let (mut servers, first, second) =
        hold_on_a_bare_majority(RedisOptions::default(), key, &opts).await;
    servers[1].restart().await;
    raw_del(&servers[2], &lock_key(key)).await;
    let twice = second.acquire(key, &opts).await;
    assert!(
        twice.is_ok() && !first.is_lost(),
        "without persistence or a restart delay a second holder is granted: {twice:?}"
    );
}

/// With persistence (append-only file, fsync always) the restarted node still has the
/// lock: no second holder while the first holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_persistence_grants_no_second_holder() {
    let key = "restart/persistent";
    let opts = skip(Duration::from_secs(30));
    let persistent = RedisOptions {
        persistent: true,
        password: None,
        ..RedisOptions::default()
    };
    let (mut servers, first, second) = hold_on_a_bare_majority(persistent, key, &opts).await;
    servers[1].restart().await;
    raw_del(&servers[2], &lock_key(key)).await;
    assert!(raw_exists(&servers[1], &lock_key(key)).await, "reloaded");
    assert!(matches!(
        second.acquire(key, &opts).await,
        Err(Error::Locked { .. })
    ));
    assert!(!first.is_lost());
    first.release().await.expect("still held by a quorum");
    let after = second
        .acquire(key, &opts)
        .await
        .expect("free after release");
    after.release().await.unwrap();
}

/// With a restart delayed by at least the TTL, the first holder (renewing) has lost the
/// lock before the empty node is back, so no second holder overlaps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_restart_grants_no_second_holder() {
    let key = "restart/delayed";
    let ttl = Duration::from_millis(600);
    let opts = LockOptions::new().ttl(ttl).skip();
    let (mut servers, first, second) =
        hold_on_a_bare_majority(RedisOptions::default(), key, &opts).await;
    servers[1].kill();
    let killed_at = Instant::now();
    tokio::time::timeout(ttl + SLACK, first.lost())
        .await
        .expect("the holder loses the lock within its validity once a quorum is gone");
    tokio::time::sleep_until((killed_at + ttl).into()).await;
    servers[1].restart().await;
    raw_del(&servers[2], &lock_key(key)).await;
    let g = second
        .acquire(key, &opts)
        .await
        .expect("granted after the delay");
    assert!(first.is_lost(), "the first holder knew it lost before");
    assert!(first.valid_until() <= Instant::now());
    g.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// Raw baseline
// ---------------------------------------------------------------------------------------

/// The raw baseline (SET NX PX, then DEL, on every node) is decided at a majority as the
/// lock's operations are: with one node of three down it still completes, with two down it
/// fails with `QuorumNotReached`; it never touches a held lock, and leaves no raw key on
/// the nodes that answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raw_baseline_needs_a_majority_and_leaves_locks_alone() {
    let mut nodes = RedisNodes::start(3).await;
    let backend = Arc::new(backend(&nodes.addrs(), "").await);
    let locker = Locker::with_backend(backend.clone());
    let raw = backend.baseline().expect("redlock has a raw baseline");
    assert_eq!(raw.description(), distlock::redlock::BASELINE_CYCLE);
    let ttl = valid(&locker, Duration::from_secs(5));
    let guard = locker
        .acquire("raw/held", &skip(Duration::from_secs(10)))
        .await
        .unwrap();
    let raw_key = "distlock:{raw/held}:baseline";
    let held = backend
        .inspect("raw/held")
        .await
        .unwrap()
        .pop()
        .expect("held");
    let mut lock_keys = Vec::new();
    for node in nodes.nodes() {
        lock_keys.push(raw_exists(node, &lock_key("raw/held")).await);
    }
    for _ in 0..5 {
        raw.raw_cycle("raw/held", ttl).await.unwrap();
    }
    let after = backend
        .inspect("raw/held")
        .await
        .unwrap()
        .pop()
        .expect("still held");
    assert_eq!((after.owner, after.fence), (held.owner, held.fence));
    for (node, had_lock) in nodes.nodes().iter().zip(lock_keys) {
        assert_eq!(raw_exists(node, &lock_key("raw/held")).await, had_lock);
        assert!(!raw_exists(node, raw_key).await);
    }

    nodes.node_mut(2).kill();
    raw.raw_cycle("raw/held", ttl).await.unwrap();
    nodes.node_mut(1).kill();
    match raw.raw_cycle("raw/held", ttl).await {
        Err(Error::QuorumNotReached {
            granted, needed, ..
        }) => assert!(granted <= 1 && needed == 2, "{granted} of {needed}"),
        other => panic!("expected QuorumNotReached, got {other:?}"),
    }
    // The write that reached the one live node is deleted even so, in the background.
    let failed = Instant::now();
    while raw_exists(&nodes.nodes()[0], raw_key).await {
        assert!(
            failed.elapsed() < Duration::from_secs(2),
            "raw key left behind"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(guard);
}

// ---------------------------------------------------------------------------------------
// Run records
// ---------------------------------------------------------------------------------------

/// Run records on a quorum: a foreign value on one node is outvoted (on two of three it is
/// that node's `Error::Backend`, never a panic); with one node of three down, appends and
/// reads go on with the majority; with two down they fail with `QuorumNotReached`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_records_need_a_majority_and_outvote_a_foreign_value() {
    use distlock::records::{RunOutcome, RunRecords};
    use RunOutcome::{Failed, Ok as Succeeded};

    let mut nodes = RedisNodes::start(3).await;
    let b = backend(&nodes.addrs(), "").await;
    let records: &dyn RunRecords = b.run_records().expect("redlock keeps run records");
    let run = |job: &str, n: u64, outcome| common::run_record(job, n, outcome);
    let set_raw = |i: usize, key: String| {
        let server = &nodes.nodes()[i];
        async move {
            let mut raw = server.client().await;
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg("not a record")
                .query_async(&mut raw)
                .await
                .unwrap();
        }
    };

    // A foreign value on one node: outvoted. On two of three: the nodes' own error.
    let odd = "records/odd";
    set_raw(0, b.node(0).unwrap().runs_key(odd)).await;
    set_raw(0, b.node(0).unwrap().last_success_key(odd)).await;
    records.append(&run(odd, 1, Succeeded), 3).await.unwrap();
    assert_eq!(
        records.recent(odd, 10).await.unwrap(),
        [run(odd, 1, Succeeded)]
    );
    assert_eq!(
        records.last_success(odd).await.unwrap(),
        Some(run(odd, 1, Succeeded))
    );
    set_raw(1, b.node(1).unwrap().runs_key(odd)).await;
    set_raw(1, b.node(1).unwrap().last_success_key(odd)).await;
    for result in [
        records.append(&run(odd, 2, Failed), 3).await.map(drop),
        records.recent(odd, 10).await.map(drop),
        records.last_success(odd).await.map(drop),
    ] {
        assert!(matches!(result, Err(Error::Backend { .. })), "{result:?}");
    }

    // One node down: a majority is enough.
    let job = "records/majority";
    records.append(&run(job, 0, Succeeded), 3).await.unwrap();
    records.append(&run(job, 1, Failed), 3).await.unwrap();
    nodes.node_mut(2).kill();
    records.append(&run(job, 2, Failed), 3).await.unwrap();
    records.append(&run(job, 3, Failed), 3).await.unwrap();
    assert_eq!(
        records.recent(job, 10).await.unwrap(),
        [
            run(job, 3, Failed),
            run(job, 2, Failed),
            run(job, 1, Failed)
        ]
    );
    assert_eq!(
        records.last_success(job).await.unwrap(),
        Some(run(job, 0, Succeeded))
    );
    records.append(&run(job, 4, Succeeded), 3).await.unwrap();
    assert_eq!(
        records.last_success(job).await.unwrap(),
        Some(run(job, 4, Succeeded))
    );

    // Two down: no majority.
    nodes.node_mut(1).kill();
    let started = Instant::now();
    for result in [
        records.append(&run(job, 5, Failed), 3).await.map(drop),
        records.recent(job, 10).await.map(drop),
        records.last_success(job).await.map(drop),
    ] {
        match result {
            Err(Error::QuorumNotReached {
                granted, needed, ..
            }) => assert!(granted <= 1 && needed == 2, "{granted} of {needed}"),
            other => panic!("expected QuorumNotReached, got {other:?}"),
        }
    }
    assert!(
        started.elapsed() < b.timeout_for(None) * 3 + SLACK,
        "each call bounded by the per-node timeout"
    );
}
