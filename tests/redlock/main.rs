//! The Redlock backend against real `redis-server` processes from lock-testkit: the whole
//! conformance suite (3 nodes, 1 node through `distlock::connect`, fencing off), the quorum
//! matrix over 5 nodes, presets of foreign values, nodes killed mid-run, a holder process
//! paused past its validity, clock-drift allowance and slow nodes, fencing across different
//! majorities, node restarts with and without persistence of a bare majority, and the
//! shared fault rules with every node restarted, killed, paused or cut off, and the raw
//! baseline over the quorum.

#[path = "../common/mod.rs"]
mod common;

mod drift;
mod faults;
mod fencing;
mod quorum;
mod raw_baseline;
mod records;
mod release;
mod restarts;
mod suite;

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

/// The per-node timeout of the fault targets.
const NODE_TIMEOUT: Duration = Duration::from_millis(200);

// ---------------------------------------------------------------------------------------
// Holder paused past its validity, in a child process
// ---------------------------------------------------------------------------------------
//
// At the crate root, not in a module: the child is re-run with the filter
// `paused_holder_child --exact`, which must stay its whole test name.

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
