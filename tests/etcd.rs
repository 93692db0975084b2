//! The etcd backend against real etcd processes (lock-testkit): the whole conformance suite
//! on one member (directly and through `distlock::connect`) and on a 3-member cluster; the
//! shared fault rules on one member (restart, kill, pause, blackholed network) and on a
//! cluster (a majority killed); then the cluster's own faults (killed leader, hung member),
//! the Jepsen rule for waiters, fencing across holders, bad input, and the raw baseline.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{etcd_backend as backend, etcd_url, rand_u32, Proxied};
use distlock::etcd::EtcdBackend;
use distlock::{Admin, Backend, Error, LockOptions, LockUrl, Locker};
use lock_conformance::{
    queued_holder, queued_holder_and_waiter, run_all, run_faults, spawn_acquire, Faults, Target,
};
use lock_testkit::{EtcdCluster, EtcdServer, FaultProxy, ProxyMode};
use tokio::sync::Mutex;

/// Time for a waiter to queue before the holder moves.
const SETTLE: Duration = Duration::from_millis(300);

fn opts(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).skip()
}

/// A 5 s lock, waited for up to 10 s, not renewed.
fn waiting() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(Duration::from_secs(10))
        .watchdog(false)
}

fn key(name: &str) -> String {
    format!("{name}-{:08x}", rand_u32())
}

// ---------------------------------------------------------------------------------------
// Conformance
// ---------------------------------------------------------------------------------------

/// The whole suite on one etcd member, with the backend built by the typed builder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_one_member() {
    let server = EtcdServer::start().await;
    let backend = EtcdBackend::builder([server.endpoint()])
        .prefix("conformance/")
        .build()
        .await
        .unwrap();
    assert_eq!(backend.capabilities().name, "etcd");
    common::conformance_direct(backend).await;
}

/// The whole suite through `distlock::connect("etcd://…")`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_connect() {
    let server = EtcdServer::start().await;
    let url = etcd_url(&[server.endpoint()], "");
    common::conformance_through_connect(&url, |caps| assert_eq!(caps.name, "etcd")).await;
}

/// The safety rules (hand-over, serialized operations, queue entries) on a 3-member
/// cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safety_rules() {
    let cluster = EtcdCluster::start(3).await;
    let locker = distlock::connect(&etcd_url(&cluster.endpoints(), "prefix=safety/"))
        .await
        .unwrap();
    lock_conformance::run_safety(&Target::from_locker(&locker)).await;
}

/// The whole suite on a 3-member cluster, every endpoint in the URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_a_three_member_cluster() {
    let cluster = EtcdCluster::start(3).await;
    let locker = distlock::connect(&etcd_url(&cluster.endpoints(), "prefix=cluster/"))
        .await
        .unwrap();
    run_all(&Target::from_locker(&locker)).await;
}

// ---------------------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------------------

/// Slack for the fault rules' time bounds.
const FAULT_SLACK: Duration = Duration::from_millis(300);

/// The shared fault rules on one member reached through a fault proxy (the peer too):
/// restarted (etcd keeps its data: the locks survive), killed, paused (SIGSTOP), or cut off
/// by a blackholed network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules_on_one_member() {
    let member = Proxied::new(vec![EtcdServer::start().await]).await;
    let endpoints = [member.addrs()[0].to_string()];
    let params = "timeout=500ms";
    let faults = Faults::new(Duration::from_millis(500))
        .slack(FAULT_SLACK)
        .peer(Arc::new(backend(&endpoints, params).await));
    let faults = member.hooks(faults).await;
    let target = Target::new(Arc::new(backend(&endpoints, params).await)).with_faults(faults);
    // etcd keeps its data across a restart: there is no restart that loses the locks.
    run_faults(&target).await.assert_not_run(&[
        "a_restart_that_loses_the_locks_leaves_holders_not_held",
        "waiters_wake_after_a_restart_that_loses_the_locks",
    ]);
}

/// The shared rule for dead servers on a 3-member cluster that loses its majority (2
/// members killed, the third left without a quorum): every call fails within its timeout,
/// nothing hangs, and the cluster serves again once they are back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules_on_a_cluster_losing_its_majority() {
    let cluster = Arc::new(Mutex::new(EtcdCluster::start(3).await));
    let endpoints = cluster.lock().await.endpoints();
    let (c1, c2) = (cluster.clone(), cluster.clone());
    let faults = Faults::new(Duration::from_secs(1)).slack(FAULT_SLACK).kill(
        move || {
            let c = c1.clone();
            async move {
                let mut c = c.lock().await;
                c.member_mut(0).kill();
                c.member_mut(1).kill();
            }
        },
        move || {
            let c = c2.clone();
            async move {
                let mut c = c.lock().await;
                c.member_mut(0).restart().await;
                c.member_mut(1).restart().await;
            }
        },
    );
    let target = Target::new(Arc::new(backend(&endpoints, "timeout=1s").await)).with_faults(faults);
    run_faults(&target).await.assert_not_run(&[
        "a_restart_that_loses_the_locks_leaves_holders_not_held",
        "waiters_wake_after_a_restart_that_loses_the_locks",
        "a_lock_survives_a_restart_that_keeps_the_locks",
        "fences_increase_across_restarts",
        "a_paused_server_bounds_every_call_and_loses_only_the_expired_holder",
        "a_blackholed_network_bounds_every_call_and_loses_the_holder",
    ]);
}

/// Records holders of one key: panics if two are ever inside at once, and checks that the
/// fences seen in order of entry strictly increase.
#[derive(Default)]
struct Resource {
    inside: AtomicUsize,
    last_fence: AtomicU64,
    entries: AtomicUsize,
}

impl Resource {
    fn enter(&self, fence: u64) {
        assert_eq!(
            self.inside.fetch_add(1, Ordering::SeqCst),
            0,
            "two holders at once"
        );
        let last = self.last_fence.swap(fence, Ordering::SeqCst);
        assert!(fence > last, "fence {fence} after {last}: not increasing");
        self.entries.fetch_add(1, Ordering::SeqCst);
    }
    fn leave(&self) {
        assert_eq!(
            self.inside.fetch_sub(1, Ordering::SeqCst),
            1,
            "two holders at once"
        );
    }
}

/// Tasks of two "processes" (backends) take one key in turn on a 3-member cluster while
/// the leader is down (killed) for longer than an election: a new leader takes over,
/// acquisitions resume while it is down, go on once it is back (restarted, as a follower),
/// and no two holders are ever inside at once.
///
/// A request to the dead member fails and moves the backend to the next member; the Locker
/// retries it, and a lock whose release was lost that way expires at its 1 s TTL. A
/// *paused* leader is the exclusion checker's fault (`tests/exclusion_etcd.rs`): etcd
/// releases with issue 15247 (Debian's 3.4.23) revoke live leases when a leader resumes
/// from a stall past their TTL, which no client can prevent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_and_holders_never_overlap() {
    let mut cluster = EtcdCluster::start(3).await;
    let endpoints = cluster.endpoints();
    let resource = Arc::new(Resource::default());
    let stop = Arc::new(AtomicBool::new(false));
    let k = key("leader");
    let mut tasks = Vec::new();
    for _ in 0..2 {
        // The default operation timeout (2 s): a request to the dead member fails at once,
        // and a loaded machine (containers, other test binaries) does not fail the others.
        let locker = Locker::new(backend(&endpoints, "").await);
        for _ in 0..2 {
            let (locker, k, resource, stop) =
                (locker.clone(), k.clone(), resource.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let o = LockOptions::new()
                    .ttl(Duration::from_secs(1))
                    .wait_for(Duration::from_secs(2));
                while !stop.load(Ordering::SeqCst) {
                    let Ok(g) = locker.acquire(&k, &o).await else {
                        continue;
                    };
                    resource.enter(g.fence());
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    resource.leave();
                    let _ = g.release().await;
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        resource.entries.load(Ordering::SeqCst) > 0,
        "running before the pause"
    );

    let leader = cluster.leader().await;
    cluster.member_mut(leader).kill();
    // Election timeout is 500 ms: give the others time to elect, then count.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = resource.entries.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let during = resource.entries.load(Ordering::SeqCst) - before;
    cluster.member_mut(leader).restart().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = resource.entries.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .expect("tasks finish")
            .expect("no task panicked (no overlap, increasing fences)");
    }
    eprintln!("killed leader: {before} before, {during} while it was down, {after} after");
    assert!(
        during > 0,
        "acquisitions resume while the old leader is down"
    );
    assert!(after > before + during, "and go on after it is back");
}

/// A hung member (paused) costs one failed call: the backend then sends its requests to
/// the next member, instead of a share of every later call timing out on the hung one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_member_costs_one_failed_call() {
    let cluster = EtcdCluster::start(3).await;
    // A follower first: pausing it needs no election, so every failure is the backend's.
    let leader = cluster.leader().await;
    let order = [(leader + 1) % 3, (leader + 2) % 3, leader];
    let endpoints: Vec<String> = order
        .iter()
        .map(|&i| cluster.member(i).endpoint())
        .collect();
    let locker = Locker::new(backend(&endpoints, "timeout=500ms").await);
    let ttl = Duration::from_secs(10);
    let warm = locker.acquire(&key("warm"), &opts(ttl)).await.unwrap();
    warm.release().await.unwrap();

    cluster.member(order[0]).pause();
    let mut failures = Vec::new();
    for i in 0..10 {
        let started = Instant::now();
        match locker.acquire(&key(&format!("hung{i}")), &opts(ttl)).await {
            Ok(g) => g.release().await.unwrap(),
            Err(e) => {
                assert!(e.is_transient(), "{e}");
                failures.push(format!("call {i} after {:?}: {e}", started.elapsed()));
            }
        }
    }
    eprintln!("hung member: {} of 10 calls failed", failures.len());
    cluster.member(order[0]).resume();
    assert!(
        failures.len() <= 1,
        "{} of 10 calls failed with one member hung: {failures:#?}",
        failures.len()
    );
}

/// The Jepsen rule (the etcd 3.4.3 lock bug): a waiter whose lease runs out before it learns
/// of its grant is never granted. Here every answer reaches the waiter 1.2 s late, more than
/// its 1 s TTL: etcd puts the key on the waiter's lease (still alive: leases outlive their
/// lock by a second), but the answer arrives after the lock's validity. The waiter refuses
/// each such grant (and revokes the lease), and gets the lock normally once answers are
/// prompt again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_lease_expires_before_its_grant_is_never_granted() {
    use etcd_client::{EventType, WatchOptions};

    let server = EtcdServer::start().await;
    let proxy = FaultProxy::start(server.addr()).await;
    let holder = Locker::new(backend(&[server.endpoint()], "").await);
    let waiter = Locker::new(backend(&[proxy.addr().to_string()], "timeout=5s").await);
    let ttl = waiter.capabilities().min_ttl;
    assert_eq!(
        ttl,
        Duration::from_secs(1),
        "lock-testkit's etcd grants 1 s leases"
    );
    let k = key("jepsen");
    let guard = holder
        .acquire(&k, &opts(Duration::from_secs(10)))
        .await
        .unwrap();

    // Count the grants etcd makes on the key (puts) while answers are late.
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let mut events = created_watch(
        &mut client,
        format!("{}{k}", distlock::etcd::DEFAULT_PREFIX),
        WatchOptions::new(),
    )
    .await;
    let puts = Arc::new(AtomicUsize::new(0));
    let counter = {
        let puts = puts.clone();
        tokio::spawn(async move {
            while let Ok(Some(response)) = events.message().await {
                for event in response.events() {
                    if event.event_type() == EventType::Put {
                        puts.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        })
    };

    let waiting = {
        let (waiter, k) = (waiter.clone(), k.clone());
        tokio::spawn(async move {
            waiter
                .acquire(&k, &opts(ttl).wait_for(Duration::from_secs(8)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set_mode(ProxyMode::Delay {
        to_server: Duration::ZERO,
        to_client: Duration::from_millis(1200),
    });
    guard.release().await.unwrap();
    let result = waiting.await.unwrap();
    assert!(
        result.is_err(),
        "a grant confirmed after the waiter's lease ran out was handed out: {result:?}"
    );
    assert!(
        puts.load(Ordering::SeqCst) > 0,
        "etcd granted at least one late attempt (the rule was exercised)"
    );

    proxy.set_mode(ProxyMode::Pass);
    let g = waiter
        .acquire(&k, &opts(ttl).wait_for(Duration::from_secs(10)))
        .await
        .expect("granted once answers are prompt");
    g.release().await.unwrap();
    counter.abort();
}

// ---------------------------------------------------------------------------------------
// Extensions cut off
// ---------------------------------------------------------------------------------------

/// How an `extend` to a new TTL is cut off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CutOff {
    /// By the backend's operation timeout (4 s); the watchdog then renews the guard.
    Timeout,
    /// By the caller, who drops the `extend` future after 4 s (the operation timeout being
    /// 10 s); the guard (watchdog off) is then dropped, and its release finishes the move.
    Dropped,
}

/// An `extend` to a new TTL that is cut off never strands the key for the new TTL (nothing
/// a caller cancels leaves a lock behind). Every answer from etcd reaches the holder 2.5 s
/// late and the holder gives up after 4 s: the new lease's grant is answered in time, and
/// the transaction moving the key onto it is applied, but its answer comes too late. The
/// guard must still be its key's holder with its fence: the watchdog goes on renewing it
/// and its release frees the key at once; a dropped guard frees it too. Another process
/// gets the key within 5 s, far below the new 30 s TTL.
async fn a_cut_off_extension_strands_nothing(cut: CutOff) {
    let server = EtcdServer::start().await;
    let proxy = FaultProxy::start(server.addr()).await;
    let timeout = match cut {
        CutOff::Timeout => "timeout=4s",
        CutOff::Dropped => "timeout=10s",
    };
    let backend = Arc::new(backend(&[proxy.addr().to_string()], timeout).await);
    let holder = Locker::with_backend(backend.clone());
    let other = Locker::new(common::etcd_backend(&[server.endpoint()], "").await);
    let k = key("cut-extend");
    let ttl = Duration::from_secs(10);
    let guard = holder
        .acquire(
            &k,
            &LockOptions::new()
                .ttl(ttl)
                .skip()
                .watchdog(cut == CutOff::Timeout),
        )
        .await
        .unwrap();
    let fence = guard.fence();
    let owner = guard.lease().owner();
    let granted_until = guard.valid_until();

    proxy.set_mode(ProxyMode::Delay {
        to_server: Duration::ZERO,
        to_client: Duration::from_millis(2500),
    });
    match cut {
        CutOff::Timeout => {
            let extended = guard.extend(Duration::from_secs(30)).await;
            assert!(
                matches!(extended, Err(Error::Unavailable { .. })),
                "the extension was cut off by the operation timeout: {extended:?}"
            );
        }
        CutOff::Dropped => {
            let extended = tokio::time::timeout(
                Duration::from_secs(4),
                guard.extend(Duration::from_secs(30)),
            )
            .await;
            assert!(extended.is_err(), "the extension was dropped: {extended:?}");
        }
    }
    proxy.set_mode(ProxyMode::Pass);

    // The move landed although its answer never arrived: the key's value now carries the
    // fence (the scenario was exercised).
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let full = format!("{}{k}", distlock::etcd::DEFAULT_PREFIX);
    let value = client.get(full.as_str(), None).await.unwrap().kvs()[0]
        .value_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        value,
        format!("{owner}:{fence}"),
        "the cut-off transaction moved the key to the new lease"
    );

    match cut {
        CutOff::Timeout => {
            let taken = other.acquire(&k, &LockOptions::new().ttl(ttl).skip()).await;
            assert!(
                matches!(taken, Err(Error::Locked { .. })),
                "nobody else gets the key while the guard holds it: {taken:?}"
            );
            // The watchdog's next turn (due 3.3 s after the grant) renews the guard.
            let deadline = Instant::now() + Duration::from_secs(20);
            while !guard.is_lost()
                && guard.valid_until() <= granted_until + Duration::from_secs(1)
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(
                !guard.is_lost(),
                "the watchdog lost a guard whose key is still its own"
            );
            assert!(
                guard.valid_until() > granted_until + Duration::from_secs(1),
                "the watchdog renewed the guard"
            );
            assert_eq!(guard.fence(), fence, "the grant's fence never changes");
            let seen = backend
                .inspect(&k)
                .await
                .unwrap()
                .pop()
                .expect("still held");
            assert_eq!(seen.owner, Some(owner));
            assert_eq!(seen.fence, Some(fence), "the key's fence is the grant's");
            guard
                .release()
                .await
                .expect("the guard still held its key to the end");
        }
        CutOff::Dropped => drop(guard),
    }
    let started = Instant::now();
    let next = other
        .acquire(
            &k,
            &LockOptions::new().ttl(ttl).wait_for(Duration::from_secs(5)),
        )
        .await;
    assert!(
        next.is_ok(),
        "the key is freed promptly, not at the new TTL (waited {:?}): {next:?}",
        started.elapsed()
    );
    let next = next.unwrap();
    assert!(next.fence() > fence);
    next.release().await.unwrap();
    holder.shutdown().await;
    assert_eq!(backend.held_leases(), 0);
}

/// See [`a_cut_off_extension_strands_nothing`]: cut off by the operation timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_cut_off_by_the_timeout_strands_nothing() {
    a_cut_off_extension_strands_nothing(CutOff::Timeout).await;
}

/// See [`a_cut_off_extension_strands_nothing`]: its future dropped by the caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_dropped_by_its_caller_strands_nothing() {
    a_cut_off_extension_strands_nothing(CutOff::Dropped).await;
}

// ---------------------------------------------------------------------------------------
// Fencing
// ---------------------------------------------------------------------------------------

/// Fences strictly increase over a sequence of holders in three processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_strictly_increase_across_holders_and_processes() {
    let server = EtcdServer::start().await;
    let endpoints = [server.endpoint()];
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(Locker::new(backend(&endpoints, "").await));
    }
    let k = key("fences");
    let mut fences = Vec::new();
    for i in 0..9 {
        let g = lockers[i % 3]
            .acquire(&k, &opts(Duration::from_secs(10)))
            .await
            .unwrap();
        let holder = lockers[0]
            .backend()
            .admin()
            .expect("admin")
            .inspect(&k)
            .await
            .unwrap()
            .pop()
            .unwrap();
        assert_eq!(holder.fence, Some(g.fence()));
        fences.push(g.fence());
        g.release().await.unwrap();
    }
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
}

/// A holder paused past its lease (watchdog off, never renewed) in one process: another
/// process gets the lock only after the holder's validity, once etcd expired the lease, and
/// its fence is higher; the paused holder can neither extend nor release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_lease_has_a_lower_fence_than_the_next() {
    let server = EtcdServer::start().await;
    let endpoints = [server.endpoint()];
    let (a, b) = (
        Locker::new(backend(&endpoints, "").await),
        Locker::new(backend(&endpoints, "").await),
    );
    let ttl = a.capabilities().min_ttl;
    let k = key("paused");
    let paused = a.acquire(&k, &opts(ttl).watchdog(false)).await.unwrap();
    let next = b
        .acquire(&k, &opts(ttl).wait_for(Duration::from_secs(5)))
        .await
        .expect("the next holder gets the lock once the lease expired");
    let granted_at = Instant::now();
    assert!(
        granted_at >= paused.valid_until(),
        "granted before the paused holder's validity ended"
    );
    // The lease outlives the lock by 1 s, etcd removes expired leases within ~500 ms, and
    // the watch hands the lock over at once.
    assert!(
        granted_at <= paused.valid_until() + Duration::from_millis(2000),
        "granted {:?} after the paused holder's validity",
        granted_at - paused.valid_until()
    );
    assert!(next.fence() > paused.fence());
    assert!(paused.is_lost());
    assert!(matches!(
        paused.extend(ttl).await,
        Err(Error::NotHeld { .. })
    ));
    assert!(matches!(paused.release().await, Err(Error::NotHeld { .. })));
    next.release().await.unwrap();
}

/// A waiter in another process is woken by the release watch, not by a timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_another_process_is_handed_the_lock_promptly() {
    let server = EtcdServer::start().await;
    let endpoints = [server.endpoint()];
    let (a, b) = (
        Locker::new(backend(&endpoints, "").await),
        Locker::new(backend(&endpoints, "").await),
    );
    let k = key("handoff");
    for _ in 0..3 {
        let g = a.acquire(&k, &opts(Duration::from_secs(30))).await.unwrap();
        let waiter = {
            let (b, k) = (b.clone(), k.clone());
            tokio::spawn(async move {
                let g = b
                    .acquire(
                        &k,
                        &opts(Duration::from_secs(30)).wait_for(Duration::from_secs(10)),
                    )
                    .await;
                (Instant::now(), g)
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let released_at = Instant::now();
        g.release().await.unwrap();
        let (granted_at, g) = waiter.await.unwrap();
        let delay = granted_at - released_at;
        assert!(
            delay < Duration::from_millis(250),
            "hand-off took {delay:?}"
        );
        g.unwrap().release().await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// Configuration and bad input
// ---------------------------------------------------------------------------------------

/// The capabilities follow what the server grants: a lock's lease is 1 s longer than the
/// lock, so the shortest lock is the server's shortest lease less 1 s (at least 1 s);
/// whole seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_report_the_servers_shortest_lease() {
    let server = EtcdServer::start().await;
    let b = backend(&[server.endpoint()], "").await;
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let granted = client.lease_grant(1, None).await.unwrap();
    let caps = b.capabilities();
    let shortest_lease = Duration::from_secs(granted.ttl() as u64);
    assert_eq!(
        caps.min_ttl,
        (shortest_lease - Duration::from_secs(1)).max(Duration::from_secs(1))
    );
    assert_eq!(caps.ttl_granularity, Duration::from_secs(1));
    assert!(caps.monotonic_fencing && caps.release_notices && caps.cross_process);
    assert_eq!(
        caps.effective_ttl(Duration::from_millis(1500))
            .unwrap()
            .get(),
        Duration::from_secs(2)
    );
    assert_eq!(b.prefix(), "distlock/");
    assert_eq!(b.timeout(), Duration::from_secs(2));
}

/// Idle leases are recycled, not leaked: after many cycles the backend keeps at most a
/// few, holds none, and etcd has no more leases than that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_recycled_not_leaked() {
    let server = EtcdServer::start().await;
    let b = Arc::new(backend(&[server.endpoint()], "").await);
    let locker = Locker::with_backend(b.clone());
    let k = key("recycle");
    for _ in 0..50 {
        let g = locker
            .acquire(&k, &opts(Duration::from_secs(30)))
            .await
            .unwrap();
        g.release().await.unwrap();
    }
    assert_eq!(b.held_leases(), 0);
    assert_eq!(b.idle_leases(), 1);
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let leases = client.leases().await.unwrap();
    assert_eq!(leases.leases().len(), 1, "one lease served 50 locks");
}

/// An endpoint where nothing listens, or that never answers, fails within the timeout with
/// a transient error naming the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_fails_within_the_timeout() {
    // Nothing listens there, and no server of the test kit will be given it.
    let port = lock_testkit::unused_port();
    let started = Instant::now();
    let refused = distlock::connect(&format!("etcd://127.0.0.1:{port}?timeout=500ms")).await;
    assert!(started.elapsed() <= Duration::from_millis(800));
    match refused {
        Err(e @ Error::Unavailable { .. }) => {
            assert!(
                e.report()
                    .to_string()
                    .contains(&format!("127.0.0.1:{port}")),
                "{e}"
            )
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }

    let server = EtcdServer::start().await;
    let proxy = FaultProxy::start(server.addr()).await;
    proxy.set_mode(ProxyMode::Blackhole);
    let started = Instant::now();
    let silent = distlock::connect(&format!("etcd://{}?timeout=500ms", proxy.addr())).await;
    assert!(started.elapsed() <= Duration::from_millis(800));
    assert!(
        matches!(silent, Err(Error::Unavailable { .. })),
        "{silent:?}"
    );
}

/// Malformed URLs, unknown parameters and bad settings are refused with `InvalidUrl`,
/// before any I/O and without showing the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_settings_are_refused() {
    let bad = [
        "etcd://",
        "etcd://host/path",
        "etcd://host,",
        "etcd://host:99999",
        "etcd://host?timeout=fast",
        "etcd://host?timeout=0ms",
        "etcd://host?prefix=",
        "etcd://host?colour=red",
        "etcd://host?prefix=a&ttl=3s",
        "etcd://:hunter2@host",
    ];
    for url in bad {
        let refused = distlock::connect(url).await;
        match refused {
            Err(Error::InvalidUrl { url: shown, reason }) => {
                assert!(!shown.contains("hunter2"), "{shown}");
                assert!(!reason.is_empty());
            }
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
    }
    let redis = LockUrl::parse("redis://host").unwrap();
    assert!(matches!(
        EtcdBackend::connect(&redis).await,
        Err(Error::InvalidUrl { .. })
    ));
    for builder in [
        EtcdBackend::builder(Vec::<String>::new()),
        EtcdBackend::builder(["https://host:2379"]),
        EtcdBackend::builder(["host name:2379"]),
        EtcdBackend::builder(["host:2379"]).prefix(""),
        EtcdBackend::builder(["host:2379"]).timeout(Duration::ZERO),
    ] {
        let debug = format!("{builder:?}");
        assert!(
            matches!(builder.build().await, Err(Error::InvalidUrl { .. })),
            "{debug}"
        );
    }
}

/// The typed builder and the URL give the same configuration; `Debug` hides the password.
#[test]
fn builder_and_url_agree_and_debug_hides_the_password() {
    let url = LockUrl::parse("etcd://root:hunter2@a:2379,b?prefix=app/&timeout=750ms").unwrap();
    let from_url = distlock::etcd::EtcdBuilder::from_url(&url).unwrap();
    let typed = EtcdBackend::builder(["a:2379", "b:2379"])
        .username("root")
        .password("hunter2")
        .prefix("app/")
        .timeout(Duration::from_millis(750));
    assert_eq!(from_url, typed);
    let debug = format!("{typed:?}");
    assert!(
        !debug.contains("hunter2") && debug.contains("root"),
        "{debug}"
    );
}

/// With authentication on, the URL's credentials are used; wrong ones are a non-transient
/// error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_used_and_wrong_ones_refused() {
    let server = EtcdServer::start().await;
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    client.user_add("root", "hunter2", None).await.unwrap();
    client.user_grant_role("root", "root").await.unwrap();
    client.auth_enable().await.unwrap();

    let wrong = distlock::connect(&format!("etcd://root:nope@{}", server.endpoint())).await;
    match wrong {
        Err(e @ Error::Backend { .. }) => assert!(!e.report().to_string().contains("nope"), "{e}"),
        other => panic!("expected a Backend error, got {other:?}"),
    }
    let anonymous = distlock::connect(&format!("etcd://{}", server.endpoint())).await;
    assert!(
        matches!(anonymous, Err(Error::Backend { .. })),
        "{anonymous:?}"
    );

    let locker = distlock::connect(&format!("etcd://root:hunter2@{}", server.endpoint()))
        .await
        .unwrap();
    let g = locker
        .acquire(&key("auth"), &opts(Duration::from_secs(10)))
        .await
        .unwrap();
    g.release().await.unwrap();
}

/// etcd's authentication tokens expire (here after 1 s; 5 min by default) and etcd-client
/// does not renew them: the backend asks for a new token when etcd reports an expired one,
/// and the caller's retry succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_auth_token_is_renewed() {
    let server = EtcdServer::start_with_args(&["--auth-token-ttl", "1"]).await;
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    client.user_add("root", "hunter2", None).await.unwrap();
    client.user_grant_role("root", "root").await.unwrap();
    client.auth_enable().await.unwrap();
    let locker = distlock::connect(&format!("etcd://root:hunter2@{}", server.endpoint()))
        .await
        .unwrap();
    let ttl = Duration::from_secs(10);
    let g = locker.acquire(&key("token"), &opts(ttl)).await.unwrap();
    g.release().await.unwrap();

    tokio::time::sleep(Duration::from_secs(3)).await;
    let g = locker
        .acquire(&key("token"), &opts(ttl).wait_for(Duration::from_secs(5)))
        .await
        .expect("a new token is used once the old one expired");
    g.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// Hand-over inside one Locker
// ---------------------------------------------------------------------------------------

/// A watch of `key` that etcd has created: every event after the call returns is seen.
async fn created_watch(
    client: &mut etcd_client::Client,
    key: impl Into<Vec<u8>>,
    options: etcd_client::WatchOptions,
) -> etcd_client::WatchStream {
    let mut stream = client.watch(key, Some(options)).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("etcd answers a new watch")
        .unwrap()
        .expect("an open watch");
    assert!(
        first.created() && !first.canceled(),
        "the first answer creates the watch"
    );
    stream
}

/// Counts the delete events of `full_key` from a watch of its own.
async fn count_deletes(endpoint: String, full_key: String) -> (Arc<AtomicUsize>, impl Drop) {
    use etcd_client::{EventType, WatchOptions};
    let mut client = etcd_client::Client::connect([endpoint], None)
        .await
        .unwrap();
    let mut stream = created_watch(&mut client, full_key, WatchOptions::new()).await;
    let deletes = Arc::new(AtomicUsize::new(0));
    let counted = deletes.clone();
    let task = tokio::spawn(async move {
        while let Ok(Some(response)) = stream.message().await {
            let n = response
                .events()
                .iter()
                .filter(|e| e.event_type() == EventType::Delete)
                .count();
            counted.fetch_add(n, Ordering::SeqCst);
        }
    });
    struct Abort(tokio::task::JoinHandle<()>);
    impl Drop for Abort {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    (deletes, Abort(task))
}

/// A waiter queued behind a holder of the same Locker gets the key straight from it, in
/// one write: the key is never deleted in between, the new fence is higher, and `inspect`
/// names the new holder and its fence, also after an extension that moves the key to a new
/// lease. The last release deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_waiter_is_handed_the_key_without_a_delete() {
    let server = EtcdServer::start().await;
    let backend = Arc::new(backend(&[server.endpoint()], "prefix=hand/").await);
    let locker = Locker::with_backend(backend.clone());
    let k = key("hand");
    let (deletes, _watch) = count_deletes(server.endpoint(), format!("hand/{k}")).await;
    let wait = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(Duration::from_secs(5))
        .watchdog(false);

    let (second, third) = queued_holder_and_waiter(&locker, &k, &wait, SETTLE).await;
    let deleted_before = deletes.load(Ordering::SeqCst);
    let fence = second.fence();
    // A waiter is queued: the holder's renewals still work, and nothing changes hands
    // before its release.
    second.extend(Duration::from_secs(5)).await.unwrap();
    second.extend(Duration::from_secs(5)).await.unwrap();
    assert!(!second.is_lost());
    second.release().await.unwrap();
    let third = third.await.unwrap().unwrap();
    assert!(third.fence() > fence, "{} after {fence}", third.fence());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        deletes.load(Ordering::SeqCst),
        deleted_before,
        "handed over without deleting the key"
    );
    let holder = backend.inspect(&k).await.unwrap().pop().expect("held");
    assert_eq!(holder.owner, Some(third.lease().owner()));
    assert_eq!(holder.fence, Some(third.fence()));
    // Another TTL moves the key to a new lease: the fence it reports stays the holder's.
    third.extend(Duration::from_secs(8)).await.unwrap();
    let holder = backend.inspect(&k).await.unwrap().pop().expect("held");
    assert_eq!(holder.fence, Some(third.fence()));
    third.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(deletes.load(Ordering::SeqCst), deleted_before + 1);
    assert_eq!(backend.inspect(&k).await.unwrap(), vec![]);
    assert_eq!(backend.held_leases(), 0);
}

/// Hand-overs in a row are bounded: under steady contention inside one Locker most turns
/// are hand-overs, and the key is still deleted (other processes' waiters woken) at least
/// once every 17 turns. Holders never overlap and fences strictly increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_overs_in_a_row_are_bounded() {
    let server = EtcdServer::start().await;
    let locker = Locker::new(backend(&[server.endpoint()], "prefix=row/").await);
    let k = key("row");
    let (deletes, _watch) = count_deletes(server.endpoint(), format!("row/{k}")).await;
    let resource = Arc::new(Resource::default());
    let (tasks, rounds) = (4, 20);
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (locker, k, resource) = (locker.clone(), k.clone(), resource.clone());
            tokio::spawn(async move {
                let wait = LockOptions::new()
                    .ttl(Duration::from_secs(5))
                    .wait_for(Duration::from_secs(10))
                    .watchdog(false);
                for _ in 0..rounds {
                    let g = locker.acquire(&k, &wait).await.unwrap();
                    resource.enter(g.fence());
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    resource.leave();
                    g.release().await.unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("no overlap, increasing fences");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let turns = tasks * rounds;
    let deleted = deletes.load(Ordering::SeqCst);
    eprintln!("{turns} turns, {deleted} deletes");
    assert!(
        deleted < turns / 2,
        "most turns are hand-overs: {deleted} deletes"
    );
    assert!(
        deleted >= turns / 17,
        "the key is deleted at least every 17 turns: {deleted} deletes"
    );
}

/// A hand-over never displaces another owner: when the key no longer holds the holder's
/// value (overwritten here by another client, which no watch sees as a release), the
/// hand-over at the holder's release finds that out, the release reports `NotHeld`, and the
/// waiter queued behind it is granted only once the key is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_never_displaces_another_owner() {
    let server = EtcdServer::start().await;
    let locker = Locker::new(backend(&[server.endpoint()], "prefix=steal/").await);
    let k = key("steal");
    let wait = waiting();
    let holder = queued_holder(&locker, &k, &wait, SETTLE).await;
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let full = format!("steal/{k}");
    client
        .put(full.as_str(), "someone else", None)
        .await
        .unwrap();
    let mut waiter = spawn_acquire(&locker, &k, &wait);
    tokio::time::sleep(SETTLE).await;
    let fence = holder.fence();
    assert!(
        matches!(holder.release().await, Err(Error::NotHeld { .. })),
        "the release finds the key taken"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut waiter)
            .await
            .is_err(),
        "nobody is granted while another owner holds the key"
    );
    assert_eq!(
        client.get(full.as_str(), None).await.unwrap().kvs()[0].value(),
        b"someone else"
    );
    client.delete(full.as_str(), None).await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("granted once the key is free")
        .unwrap()
        .unwrap();
    assert!(granted.fence() > fence);
    granted.release().await.unwrap();
}

/// A waiter that gives up before the release is not handed anything: the release deletes
/// the key, and no lease or record is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gave_up_is_not_handed_the_key() {
    let server = EtcdServer::start().await;
    let backend = Arc::new(backend(&[server.endpoint()], "prefix=gaveup/").await);
    let locker = Locker::with_backend(backend.clone());
    let k = key("gaveup");
    let wait = waiting();
    let (holder, waiter) = queued_holder_and_waiter(&locker, &k, &wait, SETTLE).await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    holder.release().await.unwrap();
    assert_eq!(
        backend.inspect(&k).await.unwrap(),
        vec![],
        "released, not handed"
    );
    assert_eq!(backend.held_leases(), 0);
    // And the next waiter behind a holder is handed the key again.
    let (holder, waiter) = queued_holder_and_waiter(&locker, &k, &wait, SETTLE).await;
    let fence = holder.fence();
    holder.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    let seen = backend.inspect(&k).await.unwrap().pop().expect("held");
    assert_eq!(
        (seen.owner, seen.fence),
        (Some(next.lease().owner()), Some(next.fence()))
    );
    assert!(next.fence() > fence);
    next.release().await.unwrap();
}

/// The release watch is open only while a waiter needs it: not for uncontended locks,
/// from a waiter's first refused attempt (whose holder's release, in another process, it
/// then announces), and not long after the last waiter is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_watch_runs_only_while_someone_waits() {
    let server = EtcdServer::start().await;
    let ours = Arc::new(backend(&[server.endpoint()], "prefix=lazy/").await);
    let theirs = Locker::new(backend(&[server.endpoint()], "prefix=lazy/").await);
    let locker = Locker::with_backend(ours.clone());
    let k = key("lazy");
    let wait = waiting();
    for _ in 0..20 {
        locker
            .acquire(&k, &wait)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    assert!(!ours.watching(), "no watch for uncontended locks");
    let held = theirs.acquire(&k, &wait).await.unwrap();
    let waiter = spawn_acquire(&locker, &k, &wait);
    tokio::time::sleep(SETTLE).await;
    assert!(ours.watching(), "a refused waiter opened the watch");
    held.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("woken by the watch, not by the holder's 5 s TTL")
        .unwrap()
        .unwrap();
    granted.release().await.unwrap();
    let closed = Instant::now();
    while ours.watching() {
        assert!(
            closed.elapsed() < Duration::from_secs(5),
            "the idle watch closes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------
// Raw baseline
// ---------------------------------------------------------------------------------------

/// The raw baseline (put + delete) never touches a lock: raw cycles on a held lock's name
/// write only `<prefix minus its last character>.baseline/<name>`, outside the lock prefix
/// (so the release watch never sees them), leave the holder and its fence as they were,
/// and leave no key behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raw_baseline_leaves_locks_alone_and_nothing_behind() {
    use etcd_client::{EventType, GetOptions, WatchOptions};
    let server = EtcdServer::start().await;
    let b = Arc::new(backend(&[server.endpoint()], "prefix=raw/").await);
    let locker = Locker::with_backend(b.clone());
    let raw = b.baseline().expect("etcd has a raw baseline");
    assert_eq!(raw.description(), distlock::etcd::BASELINE_CYCLE);
    let ttl = b
        .capabilities()
        .effective_ttl(Duration::from_secs(5))
        .unwrap();
    let k = key("raw");
    let guard = locker
        .acquire(&k, &opts(Duration::from_secs(10)))
        .await
        .unwrap();
    let held = b.inspect(&k).await.unwrap().pop().expect("held");

    // Every event in the store from now on.
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let mut stream = created_watch(&mut client, "", WatchOptions::new().with_all_keys()).await;
    const CYCLES: usize = 5;
    for _ in 0..CYCLES {
        raw.raw_cycle(&k, ttl).await.unwrap();
    }
    let raw_key = format!("raw.baseline/{k}");
    let mut events = Vec::new();
    while events.len() < 2 * CYCLES {
        let response = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("the raw cycles' events")
            .unwrap()
            .expect("an open watch");
        for event in response.events() {
            let key = event.kv().map(|kv| kv.key_str().unwrap().to_owned());
            events.push((event.event_type(), key.unwrap_or_default()));
        }
    }
    for (i, (kind, key)) in events.iter().enumerate() {
        let expected = if i % 2 == 0 {
            EventType::Put
        } else {
            EventType::Delete
        };
        assert_eq!(
            (*kind, key.as_str()),
            (expected, raw_key.as_str()),
            "{events:?}"
        );
    }

    let after = b.inspect(&k).await.unwrap().pop().expect("still held");
    assert_eq!(after.owner, held.owner);
    assert_eq!(after.fence, held.fence);
    assert!(!guard.is_lost());
    let keys = |mut client: etcd_client::Client| async move {
        let all = client
            .get("", Some(GetOptions::new().with_all_keys().with_keys_only()))
            .await
            .unwrap();
        let keys: Vec<String> = all
            .kvs()
            .iter()
            .map(|kv| kv.key_str().unwrap().to_owned())
            .collect();
        keys
    };
    assert_eq!(keys(client.clone()).await, [format!("raw/{k}")]);
    guard.release().await.unwrap();
    assert!(keys(client.clone()).await.is_empty());
}

// ---------------------------------------------------------------------------------------
// Run records
// ---------------------------------------------------------------------------------------

/// Run records live beside the lock prefix (`<prefix minus its last character>.runs/`,
/// the job in hex), one key per record and one for the last success; lowering `keep`
/// trims the excess at the next append; a foreign value under a record key is
/// `Error::Backend`, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_records_keep_to_their_own_keys_and_refuse_foreign_values() {
    use distlock::records::{RunOutcome, RunRecords};
    use etcd_client::GetOptions;

    let server = EtcdServer::start().await;
    let b = backend(&[server.endpoint()], "prefix=rec/").await;
    let records: &dyn RunRecords = b.run_records().expect("etcd keeps run records");
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let keys = |mut client: etcd_client::Client, from: &'static str| async move {
        let all = client
            .get(from, Some(GetOptions::new().with_prefix().with_keys_only()))
            .await
            .unwrap();
        let mut keys: Vec<String> = all
            .kvs()
            .iter()
            .map(|kv| kv.key_str().unwrap().to_owned())
            .collect();
        keys.sort();
        keys
    };

    let job = "a/b";
    for n in 0..150 {
        let outcome = if n == 1 {
            RunOutcome::Ok
        } else {
            RunOutcome::Failed
        };
        records
            .append(&common::run_record(job, n, outcome), 150)
            .await
            .unwrap();
    }
    let all = keys(client.clone(), "").await;
    assert_eq!(all.len(), 151, "150 records and the last success");
    assert!(all.contains(&"rec.runs/612f62/ok".to_owned()), "{all:?}");
    assert!(
        all.iter()
            .all(|k| k.starts_with("rec.runs/612f62/r/") || k == "rec.runs/612f62/ok"),
        "{all:?}"
    );
    assert!(
        keys(client.clone(), "rec/").await.is_empty(),
        "nothing under the lock prefix"
    );

    // Lowering `keep` trims the excess (more than one trim batch) at the next append.
    records
        .append(&common::run_record(job, 150, RunOutcome::Failed), 2)
        .await
        .unwrap();
    assert_eq!(keys(client.clone(), "rec.runs/612f62/r/").await.len(), 2);
    assert_eq!(
        records.recent(job, 10).await.unwrap(),
        [
            common::run_record(job, 150, RunOutcome::Failed),
            common::run_record(job, 149, RunOutcome::Failed)
        ]
    );
    assert_eq!(
        records.last_success(job).await.unwrap(),
        Some(common::run_record(job, 1, RunOutcome::Ok))
    );

    // Foreign values ("x" is 78 in hex).
    client
        .put("rec.runs/78/r/zz", "not a record", None)
        .await
        .unwrap();
    client.put("rec.runs/78/ok", "{}", None).await.unwrap();
    assert!(matches!(
        records.recent("x", 10).await,
        Err(Error::Backend { .. })
    ));
    assert!(matches!(
        records.last_success("x").await,
        Err(Error::Backend { .. })
    ));
}

/// Fire-time claims from separate backends (each its own client): 50 fire times of one
/// job, each claimed by 4 backends at once (the job's key exists: the nested value
/// comparison decides), and each round the first claim of a new job by the same 4 (the
/// key is missing: the creation comparison decides): exactly one winner per fire time,
/// every refused contender is answered the winner's claim, and no answer has a clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_claims_race_across_backends_with_one_winner_each() {
    use distlock::claims::{from_fire_millis, ClaimAnswer};

    let server = EtcdServer::start().await;
    let mut backends = Vec::new();
    for _ in 0..4 {
        backends.push(Arc::new(
            backend(&[server.endpoint()], "prefix=race/").await,
        ));
    }
    let job = key("race");
    let race = |job: String, fire_ms: u64| {
        let claims = backends.iter().enumerate().map(|(i, b)| {
            let (b, job) = (b.clone(), job.clone());
            tokio::spawn(async move {
                b.fire_claims()
                    .unwrap()
                    .claim(&job, from_fire_millis(fire_ms), &format!("r{i}"))
                    .await
                    .unwrap()
            })
        });
        futures::future::join_all(claims)
    };
    let check = |what: &str, fire_ms: u64, answers: Vec<ClaimAnswer>| {
        let winners: Vec<_> = answers.iter().filter(|a| a.won).collect();
        assert_eq!(winners.len(), 1, "{what}: one winner: {answers:?}");
        let winner = &winners[0].claim;
        assert_eq!(winner.fire_time, from_fire_millis(fire_ms));
        assert!(
            answers
                .iter()
                .all(|a| &a.claim == winner && a.server_time.is_none()),
            "{what}: every answer carries the claim kept, and no clock: {answers:?}"
        );
        winner.replica.clone()
    };
    let unwrap = |v: Vec<Result<ClaimAnswer, tokio::task::JoinError>>| {
        v.into_iter().map(|a| a.unwrap()).collect::<Vec<_>>()
    };
    let mut last = String::new();
    for round in 0..50u64 {
        // Fire times across a power of ten, where a comparison of unpadded digits would err.
        let fire_ms = 9_999_999_999_975 + round;
        let fresh = format!("{job}/new-{round}");
        let (kept, first) = tokio::join!(race(job.clone(), fire_ms), race(fresh, fire_ms));
        last = check(&format!("round {round}"), fire_ms, unwrap(kept));
        check(&format!("new job {round}"), fire_ms, unwrap(first));
    }
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let kept = client
        .get(format!("race.claims/{job}"), None)
        .await
        .unwrap();
    let kv = &kept.kvs()[0];
    assert_eq!(
        kv.value_str().unwrap(),
        format!("{:020} {last}", 9_999_999_999_975u64 + 49)
    );
    assert_eq!(kv.lease(), 0, "a claim is on no lease");
    let locks = client
        .get("race/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(locks.count(), 0, "nothing under the lock prefix");
}

/// A value under a claim key that is not a claim (empty, not UTF-8, JSON, unpadded digits,
/// digits without a replica, a bare number sorting above every claim) is `Error::Backend`
/// for a claim and a read, and the claim leaves it as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_claims_refuse_foreign_values_and_leave_them_untouched() {
    use distlock::claims::from_fire_millis;

    let server = EtcdServer::start().await;
    let b = backend(&[server.endpoint()], "prefix=foreign/").await;
    let claims = b.fire_claims().expect("etcd keeps fire-time claims");
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let foreign: [&[u8]; 8] = [
        b"",
        b"\xff\xfe",
        b"{\"fire\":1}",
        b"not a claim",
        b"1800000000000 a",
        b"00000000000000000000",
        b"00000000000000000000 ",
        b"99999999999999999999",
    ];
    for (i, value) in foreign.iter().enumerate() {
        let job = format!("job-{i}");
        let key = format!("foreign.claims/{job}");
        client.put(key.as_str(), *value, None).await.unwrap();
        let revision = client.get(key.as_str(), None).await.unwrap().kvs()[0].mod_revision();
        assert!(
            matches!(claims.current(&job).await, Err(Error::Backend { .. })),
            "{value:?}"
        );
        let claimed = claims
            .claim(&job, from_fire_millis(1_800_000_000_000), "a")
            .await;
        assert!(
            matches!(claimed, Err(Error::Backend { .. })),
            "{value:?}: {claimed:?}"
        );
        let after = client.get(key.as_str(), None).await.unwrap();
        assert_eq!(after.kvs()[0].value(), *value, "left as it was");
        assert_eq!(after.kvs()[0].mod_revision(), revision, "not written");
    }
    // A claim beside them is made as usual.
    assert!(
        claims
            .claim("job", from_fire_millis(1_800_000_000_000), "a")
            .await
            .unwrap()
            .won
    );
}
