//! The PostgreSQL backend against real `postgres` processes (lock-testkit): the whole
//! conformance suite (directly, through `Arc<dyn Backend>` and through
//! `distlock::connect`), the shared fault rules behind a fault proxy, fencing across a
//! restart and a `kill -9`, database time against a skewed client, and bad input.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{postgres_backend as backend, postgres_url, rand_u32, Proxied};
use distlock::postgres::PostgresBackend;
use distlock::{Attempt, Backend, Error, LockOptions, LockUrl, Locker, Owner};
use lock_conformance::{run_faults, Faults, Target};
use lock_testkit::PostgresServer;

fn key(name: &str) -> String {
    format!("{name}-{:08x}", rand_u32())
}

// ---------------------------------------------------------------------------------------
// Conformance
// ---------------------------------------------------------------------------------------

/// The whole suite on one server, with the backend built by the typed builder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_direct() {
    let server = PostgresServer::start().await;
    let backend = PostgresBackend::builder(server.addr().to_string())
        .username("postgres")
        .password(lock_testkit::POSTGRES_PASSWORD)
        .database("postgres")
        .table("conformance")
        .build()
        .await
        .unwrap();
    assert_eq!(backend.capabilities().name, "postgres");
    assert!(backend.capabilities().monotonic_fencing);
    common::conformance_direct(backend).await;
}

/// The whole suite through `Arc<dyn Backend>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_arc_dyn() {
    let server = PostgresServer::start().await;
    let backend = backend(&postgres_url(server.addr(), "table=arc_dyn")).await;
    common::conformance_through_arc_dyn(backend).await;
}

/// The whole suite through `distlock::connect("postgresql://…")`, in a schema of its own
/// that the backend creates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_connect() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "schema=locks&table=connected").replacen(
        "postgres://",
        "postgresql://",
        1,
    );
    common::conformance_through_connect(&url, |caps| {
        assert_eq!(caps.name, "postgres");
        assert!(caps.monotonic_fencing && caps.release_notices && caps.cross_process);
    })
    .await;
    let raw = server.client().await;
    let row = raw
        .query_one("SELECT to_regclass('locks.connected') IS NOT NULL", &[])
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0), "the table was made in its schema");
}

/// The safety rules (hand-over, serialized operations, queue entries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safety_rules() {
    let server = PostgresServer::start().await;
    let locker = distlock::connect(&postgres_url(server.addr(), "table=safety"))
        .await
        .unwrap();
    lock_conformance::run_safety(&Target::from_locker(&locker)).await;
}

// ---------------------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------------------

/// The shared fault rules on one server reached through a fault proxy (the peer too):
/// restarted (PostgreSQL keeps its data: the locks survive), killed, paused (SIGSTOP), or
/// cut off by a blackholed network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules() {
    let server = Proxied::new(vec![PostgresServer::start().await]).await;
    let url = postgres_url(server.addrs()[0], "table=faults&timeout=500ms");
    let faults = Faults::new(Duration::from_millis(500))
        .slack(Duration::from_millis(300))
        .peer(Arc::new(backend(&url).await));
    let faults = server.hooks(faults).await;
    let target = Target::new(Arc::new(backend(&url).await)).with_faults(faults);
    // The data survives a restart: there is no restart that loses the locks.
    run_faults(&target).await.assert_not_run(&[
        "a_restart_that_loses_the_locks_leaves_holders_not_held",
        "waiters_wake_after_a_restart_that_loses_the_locks",
    ]);
}

/// Fences strictly increase from holder to holder across a clean restart and a `kill -9`
/// (crash recovery), the lock connection reconnecting by itself each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_strictly_increase_across_a_restart_and_a_kill() {
    let mut server = PostgresServer::start().await;
    let locker =
        Locker::new(backend(&postgres_url(server.addr(), "table=fences&timeout=1s")).await);
    let k = key("fences");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait_for(Duration::from_secs(20))
        .watchdog(false);
    let mut last = 0;
    let mut take = |fence: u64, when: &str| {
        assert!(fence > last, "{when}: fence {fence} after {last}");
        last = fence;
    };
    for round in 0..3 {
        for _ in 0..5 {
            let guard = locker.acquire(&k, &opts).await.unwrap();
            take(guard.fence(), &format!("round {round}"));
            guard.release().await.unwrap();
        }
        match round {
            0 => server.restart().await,
            1 => {
                server.kill();
                server.restart().await;
            }
            _ => {}
        }
    }
    // A lock held over a crash is still held after it (recovery keeps committed rows).
    let held = locker.acquire(&k, &opts).await.unwrap();
    take(held.fence(), "before the crash");
    server.kill();
    server.restart().await;
    let other = Locker::new(backend(&postgres_url(server.addr(), "table=fences")).await);
    assert!(
        matches!(
            other.acquire(&k, &LockOptions::new().skip()).await,
            Err(Error::Locked { .. })
        ),
        "the lock survives the crash"
    );
    held.release().await.unwrap();
    let next = other.acquire(&k, &LockOptions::new().skip()).await.unwrap();
    take(next.fence(), "after the crash");
}

/// Expiry is the database's: what the client would compute does not enter the statement.
/// A lease granted for 2 s expires 2 s after the database's clock at the grant (as read
/// by another session), and a holder's TTL is only ever counted from the database's now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_is_measured_on_the_database_clock() {
    let server = PostgresServer::start().await;
    let backend = backend(&postgres_url(server.addr(), "table=skew")).await;
    let raw = server.client().await;
    let k = key("skew");
    let ttl = backend
        .capabilities()
        .effective_ttl(Duration::from_secs(2))
        .unwrap();
    let before: f64 = raw
        .query_one("SELECT extract(epoch from clock_timestamp())::float8", &[])
        .await
        .unwrap()
        .get(0);
    let Attempt::Granted { .. } = backend
        .try_acquire(&k, Owner::random(), distlock::Permits::LOCK, ttl)
        .await
        .unwrap()
    else {
        panic!("a free key is granted")
    };
    let after: f64 = raw
        .query_one("SELECT extract(epoch from clock_timestamp())::float8", &[])
        .await
        .unwrap()
        .get(0);
    let expires: f64 = raw
        .query_one(
            "SELECT extract(epoch from expires_at)::float8 FROM skew WHERE key = $1",
            &[&k.as_bytes()],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        expires >= before + 2.0 && expires <= after + 2.0,
        "expiry {expires} is the database's grant time + 2 s ({before}..{after})"
    );
    // A second owner is told the holder's time left by the database.
    match backend
        .try_acquire(&k, Owner::random(), distlock::Permits::LOCK, ttl)
        .await
        .unwrap()
    {
        Attempt::Taken {
            expires_in: Some(left),
        } => assert!(
            left <= Duration::from_secs(2) && left > Duration::from_secs(1),
            "{left:?}"
        ),
        other => panic!("expected Taken with the time left, got {other:?}"),
    }
}

/// A grant's fence is drawn in the order grants on its key are made, even when the first
/// statement to draw one is held up between drawing it and writing its row: meanwhile a
/// second acquirer takes the key with a later fence and releases it, and the first, once it
/// goes on, must not be granted with its earlier, lower fence. The hold-up is a test
/// trigger that sleeps in the first insert of the key (after its `nextval`, before its row
/// is written), as a descheduled or paused backend would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_drawn_before_a_later_grant_is_never_granted_after_it() {
    let server = PostgresServer::start().await;
    let one = Arc::new(backend(&postgres_url(server.addr(), "table=ordered&timeout=10s")).await);
    let raw = server.client().await;
    let k = key("ordered");
    // Sleeps in the insert of the first acquirer's row only (its owner), taking no lock.
    let held_owner = Owner::random();
    raw.batch_execute(&format!(
        "CREATE FUNCTION hold_first_insert() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
           IF NEW.owner = '{held_owner}' THEN PERFORM pg_sleep(1); END IF; \
           RETURN NEW; \
         END $$; \
         CREATE TRIGGER hold BEFORE INSERT ON ordered \
         FOR EACH ROW EXECUTE FUNCTION hold_first_insert()"
    ))
    .await
    .unwrap();
    let ttl = one
        .capabilities()
        .effective_ttl(Duration::from_secs(30))
        .unwrap();

    // The first acquirer draws its fence and is held up in the trigger.
    let first = {
        let (one, k) = (one.clone(), k.clone());
        tokio::spawn(async move {
            one.try_acquire(&k, held_owner, distlock::Permits::LOCK, ttl)
                .await
        })
    };
    let held_up = Instant::now();
    loop {
        let sleeping: i64 = raw
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if sleeping > 0 {
            break;
        }
        assert!(
            held_up.elapsed() < Duration::from_secs(10),
            "the trigger never ran"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Meanwhile a second acquirer (its own connection: another process) is granted, if it
    // can be, and releases.
    let second = backend(&postgres_url(server.addr(), "table=ordered&timeout=10s")).await;
    let mut fences = Vec::new();
    let owner = Owner::random();
    if let Attempt::Granted { fence, valid_until } = second
        .try_acquire(&k, owner, distlock::Permits::LOCK, ttl)
        .await
        .unwrap()
    {
        fences.push(fence);
        second
            .release(&distlock::Lease::new(k.as_str(), owner, fence, valid_until))
            .await
            .unwrap();
    }
    if let Attempt::Granted { fence, .. } = first.await.unwrap().unwrap() {
        fences.push(fence);
    }
    assert!(!fences.is_empty(), "someone was granted the key");
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences in grant order must strictly increase: {fences:?}"
    );
}

/// Acquisitions, hand-overs and releases that arrive together go as grouped statements
/// (far fewer transactions than requests), and each request gets the answer its own
/// statement would have had: a live foreign holder refuses (and is marked awaited), an
/// expired row is taken over with a new, higher fence, the holder asking again keeps its
/// fence, a free key is granted; a hand-over passes only what is still ours, with a higher
/// fence; a release of a key not held is `NotHeld` and leaves the holder's row, and a
/// grouped release announces itself by `NOTIFY` to a waiter in another process.
///
/// On one thread: the 40 calls all reach the group commit before any statement is sent
/// (on two workers a loaded machine could pause the polling thread while the other
/// worker sent and answered each call alone: 35 transactions for 40 releases, once).
#[tokio::test(flavor = "current_thread")]
async fn grouped_statements_answer_each_request_as_alone() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=grouped");
    let one = backend(&url).await;
    let raw = server.client().await;
    let ttl = one
        .capabilities()
        .effective_ttl(Duration::from_secs(30))
        .unwrap();
    let (me, other) = (Owner::random(), Owner::random());
    let keys: Vec<String> = (0..40).map(|i| key(&format!("grouped{i:02}"))).collect();
    raw.batch_execute("SELECT setval('grouped_fence', 5000)")
        .await
        .unwrap();
    // 0..5 held by another owner, 5..10 expired rows of another owner, 10..15 held by the
    // requester itself; the rest free.
    for (i, k) in keys.iter().enumerate().take(15) {
        let (owner, fence, offset) = match i {
            0..=4 => (other, 1000 + i as i64, "30 seconds"),
            5..=9 => (other, 2000 + i as i64, "-1 second"),
            _ => (me, 3000 + i as i64, "30 seconds"),
        };
        raw.execute(
            &format!(
                "INSERT INTO grouped (key, owner, fence, expires_at) \
                 VALUES ($1, $2, $3, clock_timestamp() + interval '{offset}')"
            ),
            &[&k.as_bytes(), &owner.to_string(), &fence],
        )
        .await
        .unwrap();
    }
    let xid = || async {
        raw.query_one("SELECT txid_current()", &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
    };

    let before = xid().await;
    let answers = futures::future::join_all(
        keys.iter()
            .map(|k| one.try_acquire(k, me, distlock::Permits::LOCK, ttl)),
    )
    .await;
    let writes = xid().await - before - 1;
    assert!(
        writes <= 12,
        "40 acquisitions sent together took {writes} transactions: not grouped"
    );
    let mut granted = Vec::new();
    let mut fences = vec![0; keys.len()];
    for (i, answer) in answers.into_iter().enumerate() {
        let answer = answer.unwrap();
        if let Attempt::Granted { fence, .. } = answer {
            fences[i] = fence;
        }
        match (i, answer) {
            (0..=4, Attempt::Taken { expires_in }) => {
                let left = expires_in.expect("the holder's time left");
                assert!(
                    left > Duration::from_secs(20) && left <= Duration::from_secs(30),
                    "{left:?}"
                );
            }
            (10..=14, Attempt::Granted { fence, .. }) => {
                assert_eq!(
                    fence,
                    3000 + i as u64,
                    "the holder asking again keeps its fence"
                )
            }
            (5..=9 | 15.., Attempt::Granted { fence, .. }) => {
                assert!(
                    fence > 5000,
                    "key {i}: a new fence from the sequence, got {fence}"
                );
                granted.push(fence);
            }
            (i, answer) => panic!("key {i}: {answer:?}"),
        }
    }
    granted.sort_unstable();
    granted.dedup();
    assert_eq!(granted.len(), 30, "every new grant has its own fence");
    for (i, k) in keys.iter().enumerate() {
        let row = raw
            .query_one(
                "SELECT owner, awaited FROM grouped WHERE key = $1",
                &[&k.as_bytes()],
            )
            .await
            .unwrap();
        let (owner, awaited): (String, bool) = (row.get(0), row.get(1));
        let expected = if i < 5 { other } else { me };
        assert_eq!(owner, expected.to_string(), "key {i}");
        assert_eq!(awaited, i < 5, "key {i}: only the refused rows are awaited");
    }

    // Hand-overs sent together: every key still ours passes to `next` with a higher
    // fence; the other owner's keys stay theirs.
    let next = Owner::random();
    let protocol = one.hand_over().expect("postgres hands over");
    let leases: Vec<distlock::Lease> = keys
        .iter()
        .zip(&fences)
        .map(|(k, fence)| distlock::Lease::new(k.as_str(), me, *fence, Instant::now()))
        .collect();
    let before = xid().await;
    let answers =
        futures::future::join_all(leases.iter().map(|l| protocol.hand_over(l, next, ttl))).await;
    let writes = xid().await - before - 1;
    assert!(
        writes <= 12,
        "40 hand-overs sent together took {writes} transactions: not grouped"
    );
    for (i, answer) in answers.into_iter().enumerate() {
        match (i, answer.unwrap()) {
            (0..=4, Attempt::Taken { .. }) => {}
            (5.., Attempt::Granted { fence, .. }) => assert!(
                fence > fences[i],
                "key {i}: handed over with fence {fence} after {}",
                fences[i]
            ),
            (i, answer) => panic!("hand-over of key {i}: {answer:?}"),
        }
    }
    let me = next;

    // A waiter in another process on a key released in the group.
    let watched = keys[20].clone();
    let b = Locker::new(backend(&url).await);
    let waiter = {
        let (b, k) = (b.clone(), watched.clone());
        tokio::spawn(async move {
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(5))
                .wait_for(Duration::from_secs(25));
            let guard = b.acquire(&k, &opts).await.unwrap();
            (Instant::now(), guard)
        })
    };
    let marked = Instant::now();
    loop {
        let awaited: bool = raw
            .query_one(
                "SELECT awaited FROM grouped WHERE key = $1",
                &[&watched.as_bytes()],
            )
            .await
            .unwrap()
            .get(0);
        if awaited {
            break;
        }
        assert!(
            marked.elapsed() < Duration::from_secs(10),
            "the waiter never asked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let leases: Vec<distlock::Lease> = keys
        .iter()
        .map(|k| distlock::Lease::new(k.as_str(), me, 0, Instant::now()))
        .collect();
    let before = xid().await;
    let released = Instant::now();
    let answers = futures::future::join_all(leases.iter().map(|l| one.release(l))).await;
    let writes = xid().await - before - 1;
    assert!(
        writes <= 12,
        "40 releases sent together took {writes} transactions: not grouped"
    );
    for (i, answer) in answers.into_iter().enumerate() {
        match (i, answer) {
            (0..=4, Err(Error::NotHeld { .. })) | (5.., Ok(())) => {}
            (i, answer) => panic!("release of key {i}: {answer:?}"),
        }
    }
    let left: Vec<Vec<u8>> = raw
        .query("SELECT key FROM grouped ORDER BY key", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .filter(|k: &Vec<u8>| *k != watched.as_bytes())
        .collect();
    let mut foreign: Vec<Vec<u8>> = keys[..5].iter().map(|k| k.as_bytes().to_vec()).collect();
    foreign.sort();
    assert_eq!(
        left, foreign,
        "only the other owner's rows (and the waiter's) remain"
    );
    let (granted, guard) = waiter.await.unwrap();
    let after = granted.duration_since(released);
    assert!(
        after < Duration::from_secs(3),
        "the waiter was woken {after:?} after the grouped release (its TTL fallback is 30 s)"
    );
    guard.release().await.unwrap();
}

/// The same owner asking again while it holds the key (a request re-sent after a lost
/// reply) is granted again with the same fence and a FRESH expiry, counted from the new
/// statement: the guard's validity is counted from before that request, so the row must
/// not keep an older, earlier expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asking_again_as_the_holder_renews_the_expiry() {
    let server = PostgresServer::start().await;
    let backend = backend(&postgres_url(server.addr(), "table=again")).await;
    let raw = server.client().await;
    let k = key("again");
    let owner = Owner::random();
    let ttl = backend
        .capabilities()
        .effective_ttl(Duration::from_secs(3))
        .unwrap();
    let expiry = || async {
        let row = raw
            .query_one(
                "SELECT extract(epoch from expires_at)::float8 FROM again WHERE key = $1",
                &[&k.as_bytes()],
            )
            .await
            .unwrap();
        row.get::<_, f64>(0)
    };
    let Attempt::Granted { fence, .. } = backend
        .try_acquire(&k, owner, distlock::Permits::LOCK, ttl)
        .await
        .unwrap()
    else {
        panic!("a free key is granted")
    };
    let first = expiry().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let Attempt::Granted { fence: again, .. } = backend
        .try_acquire(&k, owner, distlock::Permits::LOCK, ttl)
        .await
        .unwrap()
    else {
        panic!("the holder asking again is granted")
    };
    assert_eq!(again, fence, "the same grant, the same fence");
    let second = expiry().await;
    assert!(
        second >= first + 0.4,
        "the expiry moved with the new request: {first} -> {second}"
    );
}

// ---------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------

/// Nothing listens: the connection is refused at once, a transient `Unavailable` naming
/// the address, within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_port_is_unavailable_within_the_timeout() {
    // Nothing listens there, and no server of the test kit will be given it.
    let port = lock_testkit::unused_port();
    let url = format!("postgres://postgres:x@127.0.0.1:{port}/postgres?timeout=500ms");
    let started = Instant::now();
    let err = PostgresBackend::connect(&LockUrl::parse(&url).unwrap())
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(500) + common::SLACK);
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.is_transient());
    let text = err.report().to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(!text.contains(":x@"), "{text}");
}

/// A wrong password is a permanent `Backend` error that says so, never showing the
/// password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused() {
    let server = PostgresServer::start().await;
    let url = format!("postgres://postgres:hunter2@{}/postgres", server.addr());
    let err = PostgresBackend::connect(&LockUrl::parse(&url).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    let text = err.report().to_string();
    assert!(text.contains("authentication refused"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(!format!("{err:?}").contains("hunter2"));
}

/// A server that does not speak PostgreSQL (it answers garbage and hangs up) is refused
/// within the timeout with an error that says what to check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_postgres_is_refused() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 512];
                let _ = socket.read(&mut buf).await;
                let _ = socket.write_all(b"-ERR unknown command\r\n").await;
            });
        }
    });
    let url = format!("postgres://postgres:x@{addr}/postgres?timeout=1s");
    let started = Instant::now();
    let err = PostgresBackend::connect(&LockUrl::parse(&url).unwrap())
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1) + common::SLACK);
    let text = err.report().to_string();
    assert!(text.contains("PostgreSQL"), "{text}");
    peer.abort();
}

/// A table or schema that is not a plain identifier is refused before anything is sent:
/// nothing listens on the port, and the error is `InvalidUrl`, not `Unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_table_names_are_refused_before_any_sql() {
    for params in [
        "table=leases;DROP%20TABLE%20x",
        "table=%22x%22",
        "table=a.b",
        "schema=pg%20catalog",
        "table=",
        "table=x--",
    ] {
        let url = format!("postgres://127.0.0.1:1/db?{params}");
        match distlock::connect(&url).await {
            Err(Error::InvalidUrl { reason, .. }) => {
                assert!(reason.contains("identifier"), "{params}: {reason}")
            }
            other => panic!("{params}: expected InvalidUrl, got {:?}", other.err()),
        }
    }
    assert!(matches!(
        PostgresBackend::builder("127.0.0.1:1")
            .table("x'y")
            .build()
            .await,
        Err(Error::InvalidUrl { .. })
    ));
}

/// Keys are parameters, never SQL: quotes, NUL, newlines, non-ASCII and the longest key
/// are locked, excluded, inspected and released like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_any_bytes_are_locked_as_given() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=keys");
    let (a, b) = (
        Locker::new(backend(&url).await),
        Locker::new(backend(&url).await),
    );
    let long = "é".repeat(distlock::MAX_KEY_LEN / 2);
    let keys = [
        "'; DROP TABLE keys; --".to_owned(),
        "nul\0byte".to_owned(),
        "line\nbreak\ttab\\".to_owned(),
        "ключ/🔒".to_owned(),
        "$1 %s ? :name".to_owned(),
        long,
    ];
    for k in &keys {
        let guard = a.acquire(k, &LockOptions::new().skip()).await.unwrap();
        assert!(
            matches!(
                b.acquire(k, &LockOptions::new().skip()).await,
                Err(Error::Locked { .. })
            ),
            "{k:?} is excluded"
        );
        let holder = a
            .backend()
            .admin()
            .unwrap()
            .inspect(k)
            .await
            .unwrap()
            .pop()
            .unwrap();
        assert_eq!(holder.fence, Some(guard.fence()));
        guard.release().await.unwrap();
        b.acquire(k, &LockOptions::new().skip())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let raw = server.client().await;
    let left: i64 = raw
        .query_one("SELECT count(*) FROM keys", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "every key released, the table intact");
}

/// A waiter in another process is woken by the release's NOTIFY, not by polling: it gets
/// the lock well before the holder's TTL would have passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_another_process_is_woken_by_notify() {
    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=notify");
    let (a, b) = (
        Locker::new(backend(&url).await),
        Locker::new(backend(&url).await),
    );
    let k = key("notify");
    let held = a
        .acquire(&k, &LockOptions::new().ttl(Duration::from_secs(20)).skip())
        .await
        .unwrap();
    let waiter = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move {
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(5))
                .wait_for(Duration::from_secs(15));
            let guard = b.acquire(&k, &opts).await.unwrap();
            (Instant::now(), guard)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (granted, guard) = waiter.await.unwrap();
    let after = granted.duration_since(released);
    assert!(
        after < Duration::from_millis(500),
        "woken {after:?} after the release"
    );
    guard.release().await.unwrap();
}

/// Run records live in `<table>_runs`, made beside the lease table also when only it is
/// missing (an older deployment), and also for the longest table name; a foreign value in
/// it is `Error::Backend`, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_records_have_a_table_of_their_own_and_refuse_foreign_values() {
    use distlock::records::{RunOutcome, RunRecords};

    let server = PostgresServer::start().await;
    let raw = server.client().await;
    let url = postgres_url(server.addr(), "table=records");
    let first = backend(&url).await;
    assert_eq!(first.runs_table(), "\"public\".\"records_runs\"");
    drop(first);
    raw.batch_execute("DROP TABLE public.records_runs")
        .await
        .unwrap();
    let b = backend(&url).await;
    let records: &dyn RunRecords = b.run_records().expect("postgres keeps run records");
    for n in 0..4 {
        let outcome = if n == 0 {
            RunOutcome::Ok
        } else {
            RunOutcome::Failed
        };
        records
            .append(&common::run_record("job", n, outcome), 2)
            .await
            .unwrap();
    }
    let rows: i64 = raw
        .query_one("SELECT count(*) FROM public.records_runs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 3, "two records and the last success");
    let leases: i64 = raw
        .query_one("SELECT count(*) FROM public.records", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(leases, 0, "nothing in the lease table");

    // Foreign values.
    raw.execute(
        "INSERT INTO public.records_runs (job, id, record) VALUES ('\\x6f74686572', 0, 'x'), \
         ('\\x6f74686572', 7, '{\"v\":1}')",
        &[],
    )
    .await
    .unwrap();
    assert!(matches!(
        records.recent("other", 10).await,
        Err(Error::Backend { .. })
    ));
    assert!(matches!(
        records.last_success("other").await,
        Err(Error::Backend { .. })
    ));

    // The longest lease table name still has room for `_runs`.
    let long = "t".repeat(distlock::postgres::MAX_IDENTIFIER_LEN - "_fence".len());
    let b = backend(&postgres_url(server.addr(), &format!("table={long}"))).await;
    let records = b.run_records().unwrap();
    records
        .append(&common::run_record("job", 1, RunOutcome::Ok), 5)
        .await
        .unwrap();
    assert_eq!(
        records.last_success("job").await.unwrap(),
        Some(common::run_record("job", 1, RunOutcome::Ok))
    );
}

/// Fire-time claims from separate connections: 50 fire times of one job, each claimed by
/// 4 backends at once (the job's row updated under contention), and each round the first
/// claim of a new job by the same 4 (its row inserted under contention, where a refused
/// claim's kept row is out of its statement's snapshot): exactly one winner per fire time,
/// and every refused contender is answered the winner's claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_claims_race_across_connections_with_one_winner_each() {
    use distlock::claims::{from_fire_millis, ClaimAnswer};

    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=race");
    let mut backends = Vec::new();
    for _ in 0..4 {
        backends.push(Arc::new(backend(&url).await));
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
            answers.iter().all(|a| &a.claim == winner),
            "{what}: every answer carries the claim kept: {answers:?}"
        );
        winner.replica.clone()
    };
    let mut last = String::new();
    for round in 0..50u64 {
        let fire_ms = 1_800_000_000_000 + round * 60_000;
        let fresh = format!("{job}/new-{round}");
        let (kept, first) = tokio::join!(race(job.clone(), fire_ms), race(fresh, fire_ms));
        let unwrap = |v: Vec<Result<ClaimAnswer, tokio::task::JoinError>>| {
            v.into_iter().map(|a| a.unwrap()).collect::<Vec<_>>()
        };
        last = check(&format!("round {round}"), fire_ms, unwrap(kept));
        check(&format!("new job {round}"), fire_ms, unwrap(first));
    }
    let raw = server.client().await;
    let row = raw
        .query_one(
            "SELECT fire_ms, convert_from(replica, 'UTF8') FROM race_fires WHERE job = $1",
            &[&job.as_bytes()],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 1_800_000_000_000 + 49 * 60_000);
    assert_eq!(
        row.get::<_, String>(1),
        last,
        "the last round's winner is kept"
    );
    let rows: i64 = raw
        .query_one("SELECT count(*) FROM race_fires", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 51, "one row per job");
}

/// A claim's times are the database's clock (read by another session before and after),
/// a refused claim keeps the claimed time of the one kept, job names with quotes, NUL or
/// SQL in them are stored byte for byte, the table is made beside the lease table (also
/// for the longest table name, and when only it is missing), and a foreign value in it is
/// `Error::Backend`, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_claims_answer_the_database_clock_and_keep_names_as_given() {
    use distlock::claims::from_fire_millis;
    use std::time::SystemTime;

    let server = PostgresServer::start().await;
    let raw = server.client().await;
    let url = postgres_url(server.addr(), "table=fires");
    let first = backend(&url).await;
    assert_eq!(first.fires_table(), "\"public\".\"fires_fires\"");
    drop(first);
    raw.batch_execute("DROP TABLE public.fires_fires")
        .await
        .unwrap();
    let b = backend(&url).await;
    let claims = b.fire_claims().expect("postgres keeps fire-time claims");
    let clock = || async {
        raw.query_one("SELECT clock_timestamp()", &[])
            .await
            .unwrap()
            .get::<_, SystemTime>(0)
    };
    let fire = from_fire_millis(1_800_000_000_000);
    let before = clock().await;
    let won = claims.claim("clock", fire, "a").await.unwrap();
    let after = clock().await;
    let (claimed, answered) = (won.claim.claimed_at.unwrap(), won.server_time.unwrap());
    assert!(won.won, "{won:?}");
    assert!(
        before <= claimed && claimed <= answered && answered <= after,
        "the database's clock: {before:?} <= {claimed:?} <= {answered:?} <= {after:?}"
    );
    let before = clock().await;
    let refused = claims.claim("clock", fire, "b").await.unwrap();
    let after = clock().await;
    assert!(!refused.won, "{refused:?}");
    assert_eq!(
        refused.claim, won.claim,
        "the claim kept, its time unchanged"
    );
    let answered = refused.server_time.unwrap();
    assert!(before <= answered && answered <= after, "{answered:?}");

    let jobs = [
        "'; DROP TABLE fires_fires; --",
        "\"quoted\" and 'single' \\ $1",
        "nul\0byte",
    ];
    for (i, job) in jobs.iter().enumerate() {
        let replica = format!("it's \"{i}\"");
        assert!(claims.claim(job, fire, &replica).await.unwrap().won);
        let row = raw
            .query_one(
                "SELECT replica, fire_ms FROM fires_fires WHERE job = $1",
                &[&job.as_bytes()],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, &[u8]>(0), replica.as_bytes());
        assert_eq!(row.get::<_, i64>(1), 1_800_000_000_000);
        assert_eq!(
            claims.current(job).await.unwrap().map(|c| c.replica),
            Some(replica)
        );
    }
    let leases: i64 = raw
        .query_one("SELECT count(*) FROM public.fires", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(leases, 0, "nothing in the lease table");

    // Foreign values: a negative fire time is refused by the table; a replica that is not
    // UTF-8 is an error, and the row is left as it was.
    assert!(raw
        .execute(
            "INSERT INTO fires_fires (job, fire_ms, replica, claimed_at) \
             VALUES ('\\x6e6567', -5, 'a', now())",
            &[],
        )
        .await
        .is_err());
    raw.execute(
        "INSERT INTO fires_fires (job, fire_ms, replica, claimed_at) \
         VALUES ('\\x62696e', 5, '\\xff', now())",
        &[],
    )
    .await
    .unwrap();
    assert!(matches!(
        claims.current("bin").await,
        Err(Error::Backend { .. })
    ));
    // Refused (the row's fire time is not older), answered from the foreign row.
    assert!(matches!(
        claims.claim("bin", from_fire_millis(5), "a").await,
        Err(Error::Backend { .. })
    ));
    let kept: (i64, Vec<u8>) = raw
        .query_one(
            "SELECT fire_ms, replica FROM fires_fires WHERE job = 'bin'",
            &[],
        )
        .await
        .map(|row| (row.get(0), row.get(1)))
        .unwrap();
    assert_eq!(kept, (5, vec![0xff]), "the foreign row is untouched");

    // The longest lease table name still has room for `_fires`.
    let long = "t".repeat(distlock::postgres::MAX_IDENTIFIER_LEN - "_fence".len());
    let b = backend(&postgres_url(server.addr(), &format!("table={long}"))).await;
    assert!(
        b.fire_claims()
            .unwrap()
            .claim("job", fire, "a")
            .await
            .unwrap()
            .won
    );
}

/// A refused claim is answered the claim kept as the row is, not as its statement's
/// snapshot saw it: a claim held up (by a test trigger waiting for an advisory lock) after
/// its snapshot was taken, while another connection claims the same fire time, is refused
/// with the other's claim, both when that claim created the job's row (invisible to the
/// held-up statement's snapshot: read again right after) and when it updated it (the
/// snapshot's version is an older claim: `FOR SHARE` reads the newest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_claim_answers_the_claim_committed_after_its_snapshot() {
    use distlock::claims::from_fire_millis;

    let server = PostgresServer::start().await;
    let url = postgres_url(server.addr(), "table=held&timeout=10s");
    let (slow, fast) = (Arc::new(backend(&url).await), backend(&url).await);
    let raw = server.client().await;
    raw.batch_execute(
        "CREATE FUNCTION hold_claim() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
           IF NEW.replica = 'slow' THEN PERFORM pg_advisory_xact_lock(4242); END IF; \
           RETURN NEW; \
         END $$; \
         CREATE TRIGGER hold BEFORE INSERT ON held_fires \
         FOR EACH ROW EXECUTE FUNCTION hold_claim()",
    )
    .await
    .unwrap();
    let fire = from_fire_millis(1_800_000_000_000);
    let (new_job, old_job) = (key("created"), key("updated"));
    assert!(
        fast.fire_claims()
            .unwrap()
            .claim(&old_job, fire - Duration::from_secs(60), "earlier")
            .await
            .unwrap()
            .won
    );
    for job in [new_job, old_job] {
        raw.batch_execute("SELECT pg_advisory_lock(4242)")
            .await
            .unwrap();
        let held = {
            let (slow, job) = (slow.clone(), job.clone());
            tokio::spawn(async move { slow.fire_claims().unwrap().claim(&job, fire, "slow").await })
        };
        let since = Instant::now();
        loop {
            let waiting: i64 = raw
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if waiting > 0 {
                break;
            }
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "the trigger never ran"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let won = fast
            .fire_claims()
            .unwrap()
            .claim(&job, fire, "fast")
            .await
            .unwrap();
        assert!(won.won, "{job}: {won:?}");
        raw.batch_execute("SELECT pg_advisory_unlock(4242)")
            .await
            .unwrap();
        let refused = held.await.unwrap().unwrap();
        assert!(!refused.won, "{job}: {refused:?}");
        assert_eq!(refused.claim, won.claim, "{job}: the claim kept");
        assert!(refused.server_time.is_some());
    }
}
